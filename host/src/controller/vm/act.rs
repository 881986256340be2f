//! The one executor of [`decide`]'s answers: [`Run::step`] answers its questions with
//! read-only calls and [`Run::act`] carries out each [`Action`] it names, in one `match`. The
//! lifecycle actions (create, observe, delete, release) are here; the day-2 ones (adopt,
//! update, power, pause, refusals) in `day2.rs`.
//!
//! After an action the loop either decides again (`Continue`: the facts or observations
//! changed, e.g. a new machine is brought to the rest of the spec in the same reconcile) or
//! ends the reconcile (`Break` with its [`Outcome`]).

use std::ops::ControlFlow;

use kube::ResourceExt;

use super::Outcome;
use super::attempts::Attempts;
use super::decide::{Action, Facts, Observed, Step, decide, restart_pending};
use super::effects::{Effects, Severity};
use super::report::phase_events;
use super::status;
use crate::api::{
    RECONCILE_REQUESTED_AT, VM_FINALIZER, VirtualMachine, VirtualMachineStatus, VmPhase,
};
use crate::controller::error::Error;
use crate::plugin::VmStatus;

/// After an action: decide again, or end the reconcile with this outcome.
pub(super) type Flow = ControlFlow<Outcome>;

/// The write calls made in this reconcile: each is made at most once per reconcile.
#[derive(Debug, Default)]
pub(super) struct Done {
    pub(super) update: bool,
    pub(super) stop: bool,
    pub(super) start: bool,
}

/// One reconcile in progress.
pub(super) struct Run<'r, E> {
    pub(super) vm: &'r VirtualMachine,
    pub(super) uid: &'r str,
    pub(super) attempts: &'r Attempts,
    pub(super) status: &'r mut VirtualMachineStatus,
    pub(super) fx: &'r mut E,
    /// The phase in status when the reconcile began: a change is said in an Event.
    pub(super) previous_phase: Option<VmPhase>,
    pub(super) done: Done,
}

impl<'r, E: Effects> Run<'r, E> {
    pub(super) fn new(
        vm: &'r VirtualMachine,
        uid: &'r str,
        attempts: &'r Attempts,
        status: &'r mut VirtualMachineStatus,
        fx: &'r mut E,
    ) -> Self {
        let previous_phase = status.phase;
        Run {
            vm,
            uid,
            attempts,
            status,
            fx,
            previous_phase,
            done: Done::default(),
        }
    }

    pub(super) async fn step(&mut self, facts: &mut Facts) -> Result<Outcome, Error> {
        let vm = self.vm;
        let has_finalizer = vm.finalizers().iter().any(|f| f == VM_FINALIZER);
        let mut seen = Observed::default();
        if !facts.deleting && !has_finalizer {
            let location = self.fx.location().await?;
            // Before the patch: if it lands but its answer is lost, every create for this VM
            // is still ours. Not if the API server refused it: then the object changed since
            // it was read (another replica may have added the finalizer and created since),
            // and believing "never created" would skip `find` and the grace period
            // (`host/tests/simulation.rs`, fleet schedules with a lagging informer).
            self.attempts.finalizer_added(self.uid);
            let day2 = &facts.day2;
            let parameters = day2
                .external_id
                .is_none()
                .then(|| day2.desired.parameters.clone());
            if let Err(e) = self.fx.add_finalizer(&location, parameters.as_ref()).await {
                if e.refused() {
                    self.attempts.finalizer_refused(self.uid);
                }
                return Err(e);
            }
            facts.day2.create_parameters = parameters;
            facts.intended_location = Some(location.clone());
            // No create can precede the finalizer: a fresh VM is created without a `find`.
            facts.never_created = self.attempts.never_created(self.uid);
            seen.location = Some(location);
        }
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
            if let ControlFlow::Break(outcome) = self.act(action, facts, &mut seen).await? {
                return Ok(outcome);
            }
        }
    }

    /// Carries out `action`: the one place every [`Action`] is handled.
    async fn act(
        &mut self,
        action: Action,
        facts: &mut Facts,
        seen: &mut Observed,
    ) -> Result<Flow, Error> {
        match action {
            Action::Observe(machine) => self.observe(machine, facts, seen).await,
            Action::Create { location } => self.create(location, facts, seen).await,
            Action::Intend { location } => {
                let parameters = facts.day2.desired.parameters.clone();
                self.fx.intend(&location, &parameters).await?;
                facts.day2.create_parameters = Some(parameters);
                facts.intended_location = Some(location);
                Ok(Flow::Continue(()))
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
                Ok(Flow::Continue(()))
            }
            Action::Delete(id) => {
                // Marked before the call, whose answer may be lost (or its future dropped).
                let was = self.attempts.observe_first(self.uid);
                let asked = self.fx.delete(&id).await;
                if matches!(asked, Err(Error::Throttled { .. })) {
                    self.attempts.delete_held_back(self.uid, was);
                }
                asked?;
                self.status.id = Some(id.clone());
                facts.id = Some(id.clone());
                *seen = std::mem::take(seen).after_delete(id);
                Ok(Flow::Continue(()))
            }
            Action::AwaitDeletion(machine) => self.awaiting_deletion(&machine).await,
            Action::Release => {
                // A log line, not an Event: the object goes away with the finalizer, and an
                // Event about it would be one more write per VM that nobody can read with
                // `kubectl describe`.
                if let Some(id) = &self.status.id {
                    tracing::info!(id = %id, "external machine deleted; releasing the finalizer");
                }
                self.release().await
            }
            Action::Orphan => {
                let note = match &self.status.id {
                    Some(id) => {
                        format!("left external machine {id} in place (deletionPolicy: Orphan)")
                    }
                    None => {
                        "no external machine to leave in place (deletionPolicy: Orphan)".to_owned()
                    }
                };
                self.fx
                    .event(Severity::Normal, "Delete", "Orphaned", note)
                    .await;
                self.release().await
            }
            Action::AwaitAbsence { remaining } => {
                tracing::debug!(
                    ?remaining,
                    "the provider reports no machine; waiting out the creation grace period before believing it"
                );
                Ok(Flow::Break(Outcome::After(remaining)))
            }
            Action::LocationChanged { recorded, current } => {
                let message = format!(
                    "the ProviderConfig now answers location {current:?}, the machine was made at \
                     {recorded:?}: it is not recreated nor released while it cannot be seen; revert \
                     the ProviderConfig, or set spec.acceptLocation to {current:?} to leave the old \
                     machine and create one there"
                );
                status::failed(self.status, self.vm, "LocationChanged", message.clone());
                self.fx.write_status(self.status).await?;
                self.fx
                    .event(Severity::Warning, "Observe", "LocationChanged", message)
                    .await;
                Ok(Flow::Break(Outcome::Blocked))
            }
            Action::Paused => self.pause().await,
            Action::Adopt { machine, location } => self.adopt(machine, location, facts).await,
            Action::AdoptionConflict { id, owner } => self.adoption_conflict(&id, &owner).await,
            Action::Disown { id, owner } => self.disown(&id, &owner).await,
            Action::LaunchOnly(changes) => self.launch_only(&changes).await,
            Action::NotFound { id } => self.not_found(id.as_deref(), facts).await,
            Action::Update(machine) => self.update(&machine, facts).await,
            Action::Stop { machine, restart } => self.stop(&machine, restart, seen).await,
            Action::Start(machine) => self.start(&machine, seen).await,
            Action::ReplacementRequired(machine) => {
                self.replacement_required(&machine, facts).await
            }
            Action::Unsupported {
                machine,
                capability,
                what,
            } => self.unsupported(&machine, capability, what).await,
        }
    }

    /// Mirrors the machine in status (and the location found with it) and settles.
    async fn observe(
        &mut self,
        machine: VmStatus,
        facts: &Facts,
        seen: &mut Observed,
    ) -> Result<Flow, Error> {
        status::observed(self.status, self.vm, &machine);
        status::restart_required(self.status, self.vm, restart_pending(facts));
        if let Some(location) = seen.location.take() {
            self.status.location = Some(location);
        }
        self.fx.write_status(self.status).await?;
        phase_events(self.fx, self.previous_phase, &machine).await;
        Ok(Flow::Break(Outcome::Settled(machine.phase)))
    }

    /// Creates (or, idempotently, gets back) the machine and records it with its location in
    /// one write; then decides again, to bring the new machine to the rest of the spec (a VM
    /// created with powerState Stopped is stopped in this same reconcile).
    async fn create(
        &mut self,
        location: String,
        facts: &mut Facts,
        seen: &mut Observed,
    ) -> Result<Flow, Error> {
        // Recorded even if this future is dropped mid-call (a shard lost): the create may
        // have reached the cloud.
        let (attempts, uid) = (self.attempts, self.uid);
        let attempt = attempts.create_starting(uid, &location);
        let (result, reached) = self.fx.create().await;
        attempt.ended(reached);
        let machine = result?;
        self.attempts.created(self.uid, &machine.id);
        status::observed(self.status, self.vm, &machine);
        self.status.location = Some(location.clone());
        self.status.applied = Some(facts.day2.desired.clone());
        self.fx.write_status(self.status).await?;
        // A log line, not an Event: the routine path is said by `status.id` and `Ready`, and
        // an Event per create would be one write per VM more than a controller-runtime
        // operator makes (counted by `tests/tests/operator/operator_writes.rs`).
        tracing::info!(id = %machine.id, %location, phase = machine.phase.as_str(), "external machine created");
        facts.id = Some(machine.id.clone());
        facts.recorded_location = self.status.location.clone();
        facts.day2.applied = self.status.applied.clone();
        seen.get = Some(Some(machine));
        Ok(Flow::Continue(()))
    }

    async fn awaiting_deletion(&mut self, machine: &VmStatus) -> Result<Flow, Error> {
        self.status.id = Some(machine.id.clone());
        self.status.phase = Some(VmPhase::Deleting);
        self.status.addresses = machine.addresses.clone();
        status::not_ready(
            self.status,
            self.vm,
            "Deleting",
            "waiting for the provider to delete the machine",
        );
        self.fx.write_status(self.status).await?;
        Ok(Flow::Break(Outcome::Deleting))
    }

    /// Drops the finalizer and what this process knows about the VM's creates.
    pub(super) async fn release(&mut self) -> Result<Flow, Error> {
        self.fx.remove_finalizer().await?;
        self.attempts.forget(self.uid);
        Ok(Flow::Break(Outcome::Done))
    }
}
