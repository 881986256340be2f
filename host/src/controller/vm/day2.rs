//! The day-2 half of the executor (`act.rs`): adopt, update, stop, start, pause, and the
//! refusals (conflicts, launch-only changes, missing capabilities), each a method of [`Run`]
//! that [`Run::act`](super::act) calls for its [`Action`].
//!
//! [`Action`]: super::decide::Action
//!
//! # Guarantees
//!
//! - Each write call (`update`, `stop`, `start`) is made at most once per reconcile; when the
//!   machine has not caught up, the VM is looked at again after the poll interval instead of
//!   being asked again at once (`host/tests/simulation.rs` checks that no more than one of each
//!   is made per reconcile).
//! - `update` answering `needs-replacement` is never acted on: `Synced=False`, reason
//!   `ReplacementRequired`, and an Event (`tests` in `decide`, the simulation).
//! - A paused VM is reconciled without resolving its ProviderConfig: no plugin call at all
//!   (`tests/tests/operator/operator_day2_pause.rs`).
//! - A deleted VM whose recorded machine carries another VM's ownership mark drops its
//!   finalizer and leaves the machine (Event `OwnedElsewhere`): it never calls `delete` on it
//!   (`decide::day2_tests`, `tests/tests/operator/operator_day2_adopt.rs`).
//! - A changed launch-only parameter is `Synced=False`, reason `InvalidSpec`, with an Event and
//!   a log line naming it, and no call (`tests/tests/operator/operator_day2_params.rs`).

use std::ops::ControlFlow;

use kube::api::Api;
use kube::{Resource, ResourceExt};

use super::Outcome;
use super::act::{Flow, Run};
use super::decide::{Claimant, Facts, LaunchOnlyChange, Observed};
use super::effects::{Effects, Severity};
use super::report::phase_events;
use super::status;
use crate::api::conditions::{self, REPLACEMENT_REQUIRED, SYNCED, Status};
use crate::api::{
    ManagementPolicy, PAUSED, RECONCILE_REQUESTED_AT, SlimVirtualMachine, VirtualMachine,
    VirtualMachineStatus, VmPhase,
};
use crate::controller::error::Error;
use crate::plugin::{Phase, UpdateOutcome, VmStatus};

/// Records a paused VM: `Synced=False`, reason `ReconcilePaused`, with the reconcile request
/// handled. One guarded status write, none when it says that already.
pub(super) async fn record_paused(
    vm: &VirtualMachine,
    api: &Api<SlimVirtualMachine>,
) -> Result<(), Error> {
    let mut current = status::current(vm);
    current.last_handled_reconcile_at = vm.annotations().get(RECONCILE_REQUESTED_AT).cloned();
    paused_status(&mut current, vm);
    status::write(api, vm, &current).await
}

fn paused_status(status: &mut VirtualMachineStatus, vm: &VirtualMachine) {
    conditions::set(
        &mut status.conditions,
        conditions::new(
            SYNCED,
            Status::False,
            "ReconcilePaused",
            format!(
                "annotation {PAUSED} is \"true\": no provider call is made until it is removed"
            ),
            vm.meta().generation,
        ),
    );
}

impl<E: Effects> Run<'_, E> {
    pub(super) async fn pause(&mut self) -> Result<Flow, Error> {
        paused_status(self.status, self.vm);
        self.fx.write_status(self.status).await?;
        Ok(Flow::Break(Outcome::Paused))
    }

    /// Records the machine `spec.externalId` names as this VM's, then decides again to bring
    /// it to the spec in this same reconcile.
    pub(super) async fn adopt(
        &mut self,
        machine: VmStatus,
        location: String,
        facts: &mut Facts,
    ) -> Result<Flow, Error> {
        status::observed(self.status, self.vm, &machine);
        self.status.location = Some(location);
        self.status.applied = None;
        self.fx.write_status(self.status).await?;
        let note = format!(
            "adopted external machine {} ({}) named by spec.externalId",
            machine.id,
            machine.phase.as_str()
        );
        self.fx
            .event(Severity::Normal, "Adopt", "Adopted", note)
            .await;
        facts.id = Some(machine.id.clone());
        facts.recorded_location = self.status.location.clone();
        facts.day2.applied = None;
        Ok(Flow::Continue(()))
    }

    pub(super) async fn adoption_conflict(
        &mut self,
        id: &str,
        owner: &Claimant,
    ) -> Result<Flow, Error> {
        let advice = match owner {
            Claimant::VirtualMachine(name) => {
                format!("remove spec.externalId or delete {name} with deletionPolicy: Orphan first")
            }
            Claimant::Uid(_) => "remove spec.externalId (or, if that VirtualMachine is gone for \
                                 good, the machine's ownership mark)"
                .to_owned(),
        };
        let message = format!(
            "external machine {id} is already managed by {owner}: it is not taken over, nor \
             updated, powered or deleted by this VirtualMachine; {advice}"
        );
        self.blocked("AdoptionConflict", message).await
    }

    /// Another VM's machine (a conflicting adoption): never deleted from here.
    pub(super) async fn disown(&mut self, id: &str, owner: &str) -> Result<Flow, Error> {
        let note = format!(
            "left external machine {id} in place: it carries the ownership mark of the \
             VirtualMachine with uid {owner}, not this one's"
        );
        tracing::info!(id = %id, owner = %owner, "{note}");
        self.fx
            .event(Severity::Warning, "Delete", "OwnedElsewhere", note)
            .await;
        self.release().await
    }

    pub(super) async fn launch_only(
        &mut self,
        changes: &[LaunchOnlyChange],
    ) -> Result<Flow, Error> {
        let changed: Vec<String> = changes.iter().map(ToString::to_string).collect();
        let message = format!(
            "the plugin applies {} at creation only: the change is not made to the existing \
             machine, which keeps the value it was made with; revert it, or create a new \
             VirtualMachine",
            changed.join(", ")
        );
        tracing::warn!(%message, "refused a change of a launch-only parameter");
        self.blocked("InvalidSpec", message).await
    }

    pub(super) async fn not_found(
        &mut self,
        id: Option<&str>,
        facts: &Facts,
    ) -> Result<Flow, Error> {
        let message = match (id, facts.day2.policy) {
            (Some(id), ManagementPolicy::ObserveOnly) => format!(
                "external machine {id} does not exist; managementPolicy ObserveOnly never creates one"
            ),
            (Some(id), ManagementPolicy::Full) => format!(
                "external machine {id} named by spec.externalId does not exist; remove \
                 spec.externalId to create a new machine"
            ),
            (None, _) => "no external machine exists for this VirtualMachine; managementPolicy \
                          ObserveOnly never creates one (set spec.externalId)"
                .to_owned(),
        };
        self.blocked("ExternalVMNotFound", message).await
    }

    pub(super) async fn unsupported(
        &mut self,
        machine: &VmStatus,
        capability: &str,
        what: &str,
    ) -> Result<Flow, Error> {
        status::observed(self.status, self.vm, machine);
        let reason = match capability {
            "power" => "PowerNotSupported",
            _ => "UpdateNotSupported",
        };
        let message = format!(
            "the plugin does not declare capability {capability:?}, needed for {what}: it is not asked"
        );
        self.blocked(reason, message).await
    }

    pub(super) async fn update(
        &mut self,
        machine: &VmStatus,
        facts: &mut Facts,
    ) -> Result<Flow, Error> {
        if std::mem::replace(&mut self.done.update, true) {
            return self.settling(machine).await;
        }
        // Mark what was applied as pending before asking: if the answer or the next write is
        // lost, the next reconcile does not trust a size the machine may no longer have, and
        // asks again (`update` is idempotent). Found by the simulation: an update whose record
        // was lost, then the spec reverted, left the machine at the size asked in between. The
        // record is kept, not dropped: its launch-only parameters still guard against a change
        // of one while the update waits (a restart, under `Manual`).
        if let Some(applied) = self.status.applied.as_mut().filter(|a| !a.pending) {
            applied.pending = true;
            facts.day2.applied = Some(applied.clone());
            self.fx.write_status(self.status).await?;
        }
        match self.fx.update(&machine.id).await? {
            UpdateOutcome::Applied => {
                self.status.applied = Some(facts.day2.desired.clone());
                facts.day2.applied = Some(facts.day2.desired.clone());
                facts.day2.restart_required = false;
                status::restart_required(self.status, self.vm, false);
                let note = format!("external machine {} updated to the spec", machine.id);
                self.fx
                    .event(Severity::Normal, "Update", "Updated", note)
                    .await;
            }
            UpdateOutcome::NeedsRestart => {
                if !facts.day2.restart_required {
                    let note = format!(
                        "external machine {} must be stopped to apply the change (updateStrategy {:?})",
                        machine.id, self.vm.spec.update_strategy
                    );
                    self.fx
                        .event(Severity::Normal, "Update", "RestartRequired", note)
                        .await;
                }
                facts.day2.restart_required = true;
                status::restart_required(self.status, self.vm, true);
            }
            UpdateOutcome::NeedsReplacement => {
                return self.replacement_required(machine, facts).await;
            }
        }
        Ok(Flow::Continue(()))
    }

    /// `update` answered (now or for this generation before) that the change needs a new
    /// machine: never made; a restart would not help either, so none is pending.
    pub(super) async fn replacement_required(
        &mut self,
        machine: &VmStatus,
        facts: &mut Facts,
    ) -> Result<Flow, Error> {
        status::observed(self.status, self.vm, machine);
        facts.day2.restart_required = false;
        status::restart_required(self.status, self.vm, false);
        let message = format!(
            "the provider can only apply this change to a new machine: {} is not replaced \
             automatically; revert the change, or create a new VirtualMachine",
            machine.id
        );
        self.blocked(REPLACEMENT_REQUIRED, message).await
    }

    pub(super) async fn stop(
        &mut self,
        machine: &VmStatus,
        restart: bool,
        seen: &mut Observed,
    ) -> Result<Flow, Error> {
        if std::mem::replace(&mut self.done.stop, true) {
            return self.settling(machine).await;
        }
        self.fx.stop(&machine.id).await?;
        let why = if restart {
            "to apply an update (updateStrategy: Restart)"
        } else {
            "(spec.powerState: Stopped)"
        };
        let note = format!("stopping external machine {} {why}", machine.id);
        self.fx
            .event(Severity::Normal, "Power", "Stopping", note)
            .await;
        seen.get = None;
        Ok(Flow::Continue(()))
    }

    pub(super) async fn start(
        &mut self,
        machine: &VmStatus,
        seen: &mut Observed,
    ) -> Result<Flow, Error> {
        if std::mem::replace(&mut self.done.start, true) {
            return self.settling(machine).await;
        }
        // Stopped outside the operator: say so (status, Event) before correcting it.
        let previous = self.status.phase;
        if previous != Some(VmPhase::from(machine.phase)) {
            status::observed(self.status, self.vm, machine);
            self.fx.write_status(self.status).await?;
            phase_events(self.fx, previous, machine).await;
        }
        self.fx.start(&machine.id).await?;
        let note = format!(
            "starting external machine {} (spec.powerState: Running)",
            machine.id
        );
        self.fx
            .event(Severity::Normal, "Power", "Starting", note)
            .await;
        seen.get = None;
        Ok(Flow::Continue(()))
    }

    /// A write was made in this reconcile and the machine has not caught up: mirror it and look
    /// again after the poll interval.
    async fn settling(&mut self, machine: &VmStatus) -> Result<Flow, Error> {
        status::observed(self.status, self.vm, machine);
        self.fx.write_status(self.status).await?;
        Ok(ControlFlow::Break(match machine.phase {
            Phase::Running | Phase::Stopped => Outcome::Transition,
            phase => Outcome::Settled(phase),
        }))
    }

    /// `Synced=False` with `reason`, an Event when the reason is new, and a slow look again.
    async fn blocked(&mut self, reason: &str, message: String) -> Result<Flow, Error> {
        let new =
            conditions::find(&self.status.conditions, SYNCED).is_none_or(|c| c.reason != reason);
        status::failed(self.status, self.vm, reason, message.clone());
        self.fx.write_status(self.status).await?;
        if new {
            self.fx
                .event(Severity::Warning, "Reconcile", reason, message)
                .await;
        }
        Ok(ControlFlow::Break(Outcome::Blocked))
    }
}
