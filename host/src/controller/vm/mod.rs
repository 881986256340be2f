//! The VirtualMachine reconciler: [`reconcile`] resolves the VM's ProviderConfig, builds its
//! [`Facts`] once, and [`drive`]s the loop in which [`decide`] names what the VM needs and
//! `act.rs` answers it, through [`Effects`]; [`requeue`] says when to look again.
//!
//! The files: `facts.rs` (what a reconcile starts from: the watch predicate, the facts, the
//! spec handed to the plugin), `decide/` (the pure decision), `act.rs` (the one executor of
//! every [`Action`]; its day-2 half in `day2.rs`), `attempts.rs` (what this process knows
//! about creates), `effects.rs` and `calls.rs` (the world, behind a trait, and the limited,
//! metered plugin calls under it), `status.rs` and `report.rs` (status, conditions, Events),
//! `connection.rs` (the connection ConfigMap), `plan.rs` (`vmop plan`: the same decision,
//! read-only).
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
//! - Day 2 (`day2.rs`): `spec.parameters` are checked against the plugin's declared
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
use std::sync::atomic::Ordering;
use std::time::Duration;

use kube::runtime::controller::Action as Requeue;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource, ResourceExt};

use crate::api::{SlimVirtualMachine, VM_FINALIZER, VirtualMachine, VirtualMachineStatus};
use crate::controller::context::{Context, Options};
use crate::controller::error::{Error, Retry};
use crate::controller::provider_config::Provider;
use crate::controller::provider_config::view::STEADY_CHECKS_APART;
use crate::controller::runtime::backoff::jitter;
use crate::controller::runtime::drift_slots;
use crate::plugin::Phase;
use act::Run;
use calls::Calls;
use decide::{Action, Observed, Step, decide};
use effects::Live;
use report::{report, report_unresolved};

mod act;
mod attempts;
pub(crate) mod calls;
mod connection;
mod day2;
pub(crate) mod decide;
mod effects;
mod facts;
pub(crate) mod plan;
mod report;
pub(crate) mod status;

pub use attempts::Attempts;
pub use calls::is_drift_check;
pub use connection::selector as connection_selector;
pub use decide::Facts;
pub use effects::{Effects, Severity};
pub use facts::{facts, trigger_key, vm_spec};

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

/// Reconciles one VirtualMachine: the facts are built once; a paused VM is decided before its
/// ProviderConfig is resolved, so it costs no plugin load and no call.
pub async fn reconcile(vm: Arc<VirtualMachine>, ctx: Arc<Context>) -> Result<Requeue, Error> {
    let namespace = vm.namespace().ok_or(Error::Metadata("namespace"))?;
    let api: Api<SlimVirtualMachine> = Api::namespaced(ctx.client.clone(), &namespace);
    let key = ObjectRef::from(&*vm);
    let deleting = vm.meta().deletion_timestamp.is_some();
    if deleting && !vm.finalizers().iter().any(|f| f == VM_FINALIZER) {
        return Ok(Requeue::await_change());
    }
    let facts = facts::unresolved(&vm, &ctx.attempts);
    if decide(&facts, &Observed::default()) == Step::Act(Action::Paused) {
        day2::record_paused(&vm, &api).await?;
        return Ok(Requeue::await_change());
    }
    // A drift check holds one of the workers kept for them, or makes way for work that
    // changes something (runtime::drift_slots).
    let routine = is_drift_check(&vm);
    let _slot = match routine.then(|| ctx.drift_slots.try_take()) {
        Some(None) => {
            tracing::debug!("every drift-check worker is busy: looking again shortly");
            return Ok(Requeue::requeue(jitter(drift_slots::BUSY_RETRY, 0.5)));
        }
        Some(Some(slot)) => Some(slot),
        None => None,
    };
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
    let facts = facts.resolved(&ctx.attempts, provider.grace, provider.plugin.info(), &spec);
    let calls = Calls {
        ctx: &ctx,
        provider: &provider,
        vm: format!("{namespace}/{}", vm.name_any()),
        taken: Default::default(),
        routine,
    };
    let mut effects = Live::new(calls, &api, &ctx.events, spec, (*vm).clone());
    effects.view_freshness = facts::poll_interval(&vm, &ctx.options).saturating_mul(2);
    let mut status = status::current(&vm);
    let outcome = drive(&vm, facts, &ctx.attempts, &mut status, &mut effects).await?;
    if outcome != Outcome::Done && !deleting {
        connection::ensure(&ctx.client, &effects.vm, &status).await?;
    }
    ctx.vm_backoffs.reset(&key);
    ctx.vm_slow_backoffs.reset(&key);
    let steady = listings_suffice(
        effects.viewed && effects.calls.taken.load(Ordering::Relaxed) == 0,
        facts::poll_interval(&vm, &ctx.options),
        ctx.options.resync_period,
        || ctx.views.steady(&provider.name),
    );
    Ok(requeue(&outcome, &ctx.options, &vm, steady))
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
    let mut run = Run::new(vm, &uid, attempts, status, fx);
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

/// Whether the cloud view's listings stand in for a VM's own drift checks, so that the next
/// can wait [`STEADY_CHECKS_APART`] poll intervals: this check was `viewed` (answered by the
/// view, no call made), the listings are `steady`, and they come at least as often as the VM
/// asks to be checked (`poll`; a VM asking for less than the `resync` period keeps its own).
fn listings_suffice(
    viewed: bool,
    poll: Duration,
    resync: Duration,
    steady: impl FnOnce() -> bool,
) -> bool {
    viewed && poll >= resync && steady()
}

/// When to look again: soon while the machine is on its way, after the poll interval (drift
/// detection) once it has settled, or [`STEADY_CHECKS_APART`] of them when a steady cloud view
/// answered without a call (`steady`: its listings report changes meanwhile).
fn requeue(outcome: &Outcome, options: &Options, vm: &VirtualMachine, steady: bool) -> Requeue {
    match outcome {
        Outcome::Settled(Phase::Running | Phase::Stopped | Phase::Failed) => {
            let every = facts::poll_interval(vm, options);
            let every = if steady {
                every.saturating_mul(STEADY_CHECKS_APART)
            } else {
                every
            };
            Requeue::requeue(jitter(every, 0.1))
        }
        Outcome::Settled(_) | Outcome::Deleting | Outcome::Transition => {
            Requeue::requeue(jitter(options.poll_interval, 0.1))
        }
        Outcome::Paused | Outcome::Done => Requeue::await_change(),
        // Never earlier than due: jitter upwards only.
        Outcome::After(after) => Requeue::requeue(after.saturating_add(after.mul_f64(0.05))),
        Outcome::Blocked => Requeue::requeue(jitter(options.slow_backoff.base, 0.1)),
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

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::api::{POLL_INTERVAL, VirtualMachineSpec};

    #[test]
    fn listings_stand_in_only_for_checks_no_more_frequent_than_theirs() {
        let minute = Duration::from_secs(60);
        let steady = || true;
        assert!(listings_suffice(true, minute, minute, steady));
        assert!(
            !listings_suffice(true, Duration::from_secs(10), minute, steady),
            "a VM polled every 10 s keeps its checks under a 60 s listing"
        );
        assert!(!listings_suffice(false, minute, minute, steady), "a get");
        assert!(
            !listings_suffice(true, minute, minute, || false),
            "a listing failed"
        );
    }

    proptest! {
        /// Whatever the outcome's delay or the VM's poll interval, the next look is scheduled
        /// without a panic (no duration arithmetic overflows).
        #[test]
        fn every_outcome_is_requeued(
            after in prop_oneof![Just(Duration::MAX), any::<u64>().prop_map(Duration::from_nanos)],
            poll in ".{0,30}",
            which in 0u8..7,
            steady in any::<bool>(),
        ) {
            let mut vm = VirtualMachine::new("web", VirtualMachineSpec::new("pc", "img", 1, "1Gi"));
            vm.metadata.annotations = Some([(POLL_INTERVAL.to_owned(), poll)].into());
            let outcome = match which {
                0 => Outcome::Settled(Phase::Running),
                1 => Outcome::Settled(Phase::Pending),
                2 => Outcome::Deleting,
                3 => Outcome::Done,
                4 => Outcome::After(after),
                5 => Outcome::Blocked,
                _ => Outcome::Transition,
            };
            let _ = requeue(&outcome, &Options::new("ops"), &vm, steady);
        }
    }
}
