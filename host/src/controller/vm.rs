//! The VirtualMachine reconciler: asks [`decide`] what the VM needs, answers its questions
//! with read-only plugin calls and carries out the action it names, through [`Effects`].
//!
//! # Guarantees
//!
//! - The finalizer is on the object before the first `create` (added and written first, with a
//!   resourceVersion guard).
//! - `status.id` and `status.location` are written right after a successful `create`, in the
//!   same write as the rest of the observed status; nothing is written before it. A crash in
//!   between never duplicates a machine: `create` is idempotent on the uid, and a VM without an
//!   id is looked up with `find` wherever absence matters (deletion).
//! - Absence proves nothing alone (see [`decide`]): a machine is recreated (Event
//!   `ExternalVMLost`) or its finalizer released only when `get` and `find` agree, the grace
//!   period has passed and the location is the recorded one; a moved ProviderConfig shows
//!   `Synced=False`, reason `LocationChanged`.
//! - Deletion never calls `create`. The finalizer is removed only once the provider confirms
//!   the machine is gone, or `deletionPolicy: Orphan` says to leave it. A missing
//!   ProviderConfig or Secret keeps the finalizer, with the reason in `Synced` and an Event.
//! - Status and finalizer writes are guarded by the resourceVersion read, so a reconcile on a
//!   stale view fails and is retried instead of overwriting newer state.
//! - Every failure sets `Synced=False` with its reason and publishes an Event, except waits
//!   that are not failures (a throttle of our own, the grace period); the error policy decides
//!   when to try again.
//! - Day 2 (`vm/day2.rs`): `spec.parameters` are checked against the plugin's declared
//!   parameters before any call (`operator_day2.rs`); a paused VM is reconciled without
//!   resolving its ProviderConfig, so without any plugin call (`operator_day2_pause.rs`);
//!   `update`, `start` and `stop` are made at most once per reconcile and only when the plugin
//!   declares them (`simulation.rs`, day-2 schedules); adoption never takes a machine another
//!   VirtualMachine records or whose cloud mark names another uid, and a VM never deletes such
//!   a machine (`operator_day2_adopt.rs`, `decide::day2_tests::ownership`).
//! - A routine create or delete writes no Event (a log line says it): the steady path costs
//!   the writes of a controller-runtime operator (`operator_writes.rs`).
//!
//! Tests: `host/tests/simulation.rs` (the invariants over random schedules with crashes, lag,
//! lost responses, throttling and moves), and the operator tests in `tests/tests/`.

use std::sync::Arc;
use std::time::Duration;

use kube::runtime::controller::Action as Requeue;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource, ResourceExt};

use super::attempts::Attempts;
use super::backoff::jitter;
use super::calls::Calls;
use super::connection;
use super::context::Context;
use super::decide::{Action, Facts, Observed, Step, decide, restart_pending};
use super::effects::{Effects, Live, Severity};
use super::error::{Error, Retry};
use super::provider::Provider;
use super::vm_status;
use crate::api::{
    RECONCILE_REQUESTED_AT, SlimVirtualMachine, VM_FINALIZER, VirtualMachine, VirtualMachineStatus,
    VmPhase,
};
use crate::plugin::{Phase, VmStatus};

mod day2;
mod inputs;
mod report;

pub use inputs::{facts, trigger_key, vm_spec};
use report::{phase_events, report, report_unresolved};

/// How a reconcile ended, in terms the caller turns into a requeue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The machine is in this phase; look again after the poll or resync period.
    Settled(Phase),
    /// The provider is deleting it; look again after the poll interval.
    Deleting,
    /// Nothing is left to do for this object (finalizer released).
    Done,
    /// Look again after exactly this long (the grace period is not over).
    After(Duration),
    /// The ProviderConfig moved, or the spec asks for what cannot be done; look again when
    /// something changes, or slowly.
    Blocked,
    /// The machine is changing state (stopping, starting) at the operator's request; look
    /// again after the poll interval.
    Transition,
    /// Annotation `vmop.dev/paused`: look again when it changes.
    Paused,
}

pub async fn reconcile(vm: Arc<VirtualMachine>, ctx: Arc<Context>) -> Result<Requeue, Error> {
    let namespace = vm.namespace().ok_or(Error::Metadata("namespace"))?;
    let api: Api<SlimVirtualMachine> = Api::namespaced(ctx.client.clone(), &namespace);
    let key = ObjectRef::from(&*vm);
    let deleting = vm.meta().deletion_timestamp.is_some();
    if deleting && !vm.finalizers().iter().any(|f| f == VM_FINALIZER) {
        return Ok(Requeue::await_change());
    }
    // Paused: decided before anything is resolved, so not even the plugin is loaded.
    let unresolved = facts(&vm, &ctx.attempts, Duration::ZERO, None);
    if decide(&unresolved, &Observed::default()) == Step::Act(Action::Paused) {
        day2::record_paused(&vm, &api).await?;
        return Ok(Requeue::await_change());
    }
    let prepared = match resolve(&vm, &ctx).await {
        Ok(provider) => vm_spec(&vm, provider.plugin.info()).map(|spec| (spec, provider)),
        Err(error) => Err(error),
    };
    let (spec, provider) = match prepared {
        Ok(prepared) => prepared,
        Err(error) => {
            report_unresolved(&vm, &api, &ctx, &error).await;
            return Err(error);
        }
    };
    let calls = Calls {
        ctx: &ctx,
        provider: &provider,
        vm: format!("{namespace}/{}", vm.name_any()),
        taken: Default::default(),
        routine: super::calls::is_drift_check(&vm),
    };
    let facts = facts(
        &vm,
        &ctx.attempts,
        provider.grace,
        Some((provider.plugin.info(), &spec)),
    );
    let mut effects = Live::new(calls, &api, &ctx.events, spec, (*vm).clone());
    let mut status = vm_status::current(&vm);
    let outcome = drive(&vm, facts, &ctx.attempts, &mut status, &mut effects).await?;
    if outcome != Outcome::Done && !deleting {
        connection::ensure(&ctx.client, &effects.vm, &status).await?;
    }
    ctx.vm_backoffs.reset(&key);
    ctx.vm_slow_backoffs.reset(&key);
    Ok(requeue(&outcome, &ctx, &vm))
}

/// Runs the decision loop for one VM and carries out its action through `fx`, updating
/// `status` and `attempts` as it goes. On error, the failure has been recorded in `Synced` and
/// an Event. This is the whole reconcile apart from resolving the ProviderConfig: the
/// simulation calls it with fake effects.
pub async fn drive<E: Effects>(
    vm: &VirtualMachine,
    mut facts: Facts,
    attempts: &Attempts,
    status: &mut VirtualMachineStatus,
    fx: &mut E,
) -> Result<Outcome, Error> {
    let has_finalizer = vm.finalizers().iter().any(|f| f == VM_FINALIZER);
    if facts.deleting && !has_finalizer {
        return Ok(Outcome::Done);
    }
    let uid = vm.meta().uid.clone().ok_or(Error::Metadata("uid"))?;
    let mut run = Run {
        vm,
        uid: &uid,
        attempts,
        status,
        fx,
    };
    match run.step(&mut facts).await {
        Ok(outcome) => Ok(outcome),
        Err(error) => {
            // Waits of our own (a reserved token, a stale view to re-read) are not failures
            // to record: writing them would only fail again or add noise.
            if !matches!(error.retry(), Retry::Due(_)) {
                report(vm, run.status, run.fx, &error, facts.deleting).await;
            }
            Err(error)
        }
    }
}

/// One reconcile in progress.
struct Run<'r, E> {
    vm: &'r VirtualMachine,
    uid: &'r str,
    attempts: &'r Attempts,
    status: &'r mut VirtualMachineStatus,
    fx: &'r mut E,
}

impl<E: Effects> Run<'_, E> {
    async fn step(&mut self, facts: &mut Facts) -> Result<Outcome, Error> {
        let vm = self.vm;
        let has_finalizer = vm.finalizers().iter().any(|f| f == VM_FINALIZER);
        let previous_phase = self.status.phase;
        let mut seen = Observed::default();
        if !facts.deleting && !has_finalizer {
            let location = self.fx.location().await?;
            // Before the patch: if it lands but its answer is lost, every create for this VM
            // is still ours.
            self.attempts.finalizer_added(self.uid);
            self.fx.add_finalizer(&location).await?;
            facts.intended_location = Some(location.clone());
            // No create can precede the finalizer: a fresh VM is created without a `find`.
            facts.never_created = self.attempts.never_created(self.uid);
            seen.location = Some(location);
        }
        let mut done = day2::Done::default();
        self.status.last_handled_reconcile_at =
            vm.annotations().get(RECONCILE_REQUESTED_AT).cloned();
        loop {
            let action = match decide(facts, &seen) {
                Step::Get(id) => {
                    let machine = self.fx.get(&id).await?;
                    // Not seen as this VM's own (gone, lagging, or marked as another's, as a
                    // cloud that reuses ids may show): from now on it is observed before it
                    // is deleted.
                    if machine.as_ref().is_none_or(|m| m.owned_by_other(self.uid)) {
                        self.attempts.observe_first(self.uid);
                    }
                    seen.get = Some(machine);
                    continue;
                }
                Step::Find => {
                    seen.find = Some(self.fx.find().await?);
                    continue;
                }
                Step::Location => {
                    seen.location = Some(self.fx.location().await?);
                    continue;
                }
                Step::Claimed(id) => {
                    seen.claimed_by = Some(self.fx.claimed_by(&id).await?);
                    continue;
                }
                Step::Act(action) => action,
            };
            let action = match self.day2(action, facts, &mut seen, &mut done).await? {
                day2::Next::Decide => continue,
                day2::Next::Return(outcome) => return Ok(outcome),
                day2::Next::Act(action) => action,
            };
            match action {
                Action::Observe(machine) => {
                    vm_status::observed(self.status, vm, &machine);
                    vm_status::restart_required(self.status, vm, restart_pending(facts));
                    if let Some(location) = seen.location.take() {
                        self.status.location = Some(location);
                    }
                    self.fx.write_status(self.status).await?;
                    phase_events(self.fx, previous_phase, &machine).await;
                    return Ok(Outcome::Settled(machine.phase));
                }
                Action::Create { location } => {
                    // Recorded; now bring the new machine to the rest of the spec (a VM
                    // created with powerState Stopped is stopped in this same reconcile).
                    let machine = self.create(location, facts).await?;
                    facts.id = Some(machine.id.clone());
                    facts.recorded_location = self.status.location.clone();
                    facts.day2.applied = self.status.applied.clone();
                    seen.get = Some(Some(machine));
                }
                Action::Intend { location } => {
                    self.fx.intend(&location).await?;
                    facts.intended_location = Some(location);
                }
                Action::Recreate { lost, location } => {
                    let note = format!(
                        "external machine {lost} no longer exists at {location}; creating a new one"
                    );
                    self.fx
                        .event(Severity::Warning, "Observe", "ExternalVMLost", note)
                        .await;
                    self.status.id = None;
                    facts.id = None;
                    facts.recorded_location = None;
                }
                Action::Delete(id) => {
                    self.attempts.observe_first(self.uid);
                    self.fx.delete(&id).await?;
                    self.status.id = Some(id.clone());
                    facts.id = Some(id.clone());
                    seen = seen.after_delete(id);
                }
                Action::AwaitDeletion(machine) => return self.awaiting_deletion(&machine).await,
                Action::Release => {
                    // A log line, not an Event: the object goes away with the finalizer, and
                    // an Event about it would be one more write per VM that nobody can read
                    // with `kubectl describe`.
                    if let Some(id) = &self.status.id {
                        tracing::info!(id = %id, "external machine deleted; releasing the finalizer");
                    }
                    self.fx.remove_finalizer().await?;
                    self.attempts.forget(self.uid);
                    return Ok(Outcome::Done);
                }
                Action::Orphan => {
                    let note = match &self.status.id {
                        Some(id) => {
                            format!("left external machine {id} in place (deletionPolicy: Orphan)")
                        }
                        None => "no external machine to leave in place (deletionPolicy: Orphan)"
                            .to_owned(),
                    };
                    self.fx
                        .event(Severity::Normal, "Delete", "Orphaned", note)
                        .await;
                    self.fx.remove_finalizer().await?;
                    self.attempts.forget(self.uid);
                    return Ok(Outcome::Done);
                }
                Action::AwaitAbsence { remaining } => {
                    tracing::debug!(
                        ?remaining,
                        "the provider reports no machine; waiting out the creation grace period before believing it"
                    );
                    return Ok(Outcome::After(remaining));
                }
                Action::LocationChanged { recorded, current } => {
                    let message = format!(
                        "the ProviderConfig now answers location {current:?}, the machine was made at \
                         {recorded:?}: it is not recreated nor released while it cannot be seen; revert \
                         the ProviderConfig, or set spec.acceptLocation to {current:?} to leave the old \
                         machine and create one there"
                    );
                    vm_status::failed(self.status, vm, "LocationChanged", message.clone());
                    self.fx.write_status(self.status).await?;
                    self.fx
                        .event(Severity::Warning, "Observe", "LocationChanged", message)
                        .await;
                    return Ok(Outcome::Blocked);
                }
                // Handled by `day2` above.
                Action::Paused
                | Action::Adopt { .. }
                | Action::AdoptionConflict { .. }
                | Action::Disown { .. }
                | Action::LaunchOnly(_)
                | Action::NotFound { .. }
                | Action::Update(_)
                | Action::Stop { .. }
                | Action::Start(_)
                | Action::Unsupported { .. } => return Ok(Outcome::Blocked),
            }
        }
    }

    /// Creates (or, idempotently, gets back) the machine and records it with its location in
    /// one write.
    async fn create(&mut self, location: String, facts: &Facts) -> Result<VmStatus, Error> {
        let (result, reached) = self.fx.create().await;
        self.attempts.create_ended(self.uid, &location, reached);
        let machine = result?;
        self.attempts.created(self.uid, &machine.id);
        vm_status::observed(self.status, self.vm, &machine);
        self.status.location = Some(location.clone());
        self.status.applied = Some(facts.day2.desired.clone());
        self.fx.write_status(self.status).await?;
        // A log line, not an Event: the routine path is said by `status.id` and `Ready`, and
        // an Event per create would be one write per VM more than a controller-runtime
        // operator makes (issue 12; count: `tests/tests/operator_writes.rs`).
        tracing::info!(id = %machine.id, %location, phase = machine.phase.as_str(), "external machine created");
        Ok(machine)
    }

    async fn awaiting_deletion(&mut self, machine: &VmStatus) -> Result<Outcome, Error> {
        self.status.id = Some(machine.id.clone());
        self.status.phase = Some(VmPhase::Deleting);
        self.status.addresses = machine.addresses.clone();
        vm_status::not_ready(
            self.status,
            self.vm,
            "Deleting",
            "waiting for the provider to delete the machine",
        );
        self.fx.write_status(self.status).await?;
        Ok(Outcome::Deleting)
    }
}

/// When to look again: soon while the machine is on its way, after the resync period (drift
/// detection) once it has settled.
fn requeue(outcome: &Outcome, ctx: &Context, vm: &VirtualMachine) -> Requeue {
    match outcome {
        Outcome::Settled(Phase::Running | Phase::Stopped | Phase::Failed) => {
            let period = day2::poll_interval(vm, &ctx.options);
            Requeue::requeue(jitter(period, 0.1))
        }
        Outcome::Settled(_) | Outcome::Deleting | Outcome::Transition => {
            Requeue::requeue(jitter(ctx.options.poll_interval, 0.1))
        }
        Outcome::Paused => Requeue::await_change(),
        Outcome::Done => Requeue::await_change(),
        // Never earlier than due: jitter upwards only.
        Outcome::After(after) => Requeue::requeue(*after + after.mul_f64(0.05)),
        Outcome::Blocked => Requeue::requeue(jitter(ctx.options.slow_backoff.base, 0.1)),
    }
}

async fn resolve(vm: &VirtualMachine, ctx: &Context) -> Result<Provider, Error> {
    let name = &vm.spec.provider_config_ref.name;
    ctx.resolver
        .resolve_name(name)
        .await
        .map_err(|source| Error::Resolve {
            name: name.clone(),
            source: Box::new(source),
        })
}
