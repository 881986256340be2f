//! The reconciler's day-2 actions (adopt, update, stop, start, pause, capability checks): what
//! `vm.rs` does with an [`Action`] that [`decide`](super::decide) returns for them.
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
//!   (`tests/tests/operator_day2_pause.rs`).
//! - A deleted VM whose recorded machine carries another VM's ownership mark drops its
//!   finalizer and leaves the machine (Event `OwnedElsewhere`): it never calls `delete` on it
//!   (`decide::day2_tests`, `tests/tests/operator_day2_adopt.rs`).
//! - A changed launch-only parameter is `Synced=False`, reason `InvalidSpec`, with an Event and
//!   a log line naming it, and no call (`tests/tests/operator_day2_params.rs`).

use std::time::Duration;

use kube::{Api, Resource, ResourceExt};

use super::{Outcome, Run};
use crate::api::conditions::{self, SYNCED, Status};
use crate::api::{
    AppliedSpec, ManagementPolicy, PAUSED, POLL_INTERVAL, RECONCILE_REQUESTED_AT,
    SlimVirtualMachine, VirtualMachine, VmPhase,
};
use crate::controller::context::Options;
use crate::controller::decide::{Action, Capabilities, Claimant, Day2, Facts, Observed};
use crate::controller::effects::{Effects, Severity};
use crate::controller::error::Error;
use crate::controller::vm_status;
use crate::plugin::{Phase, PluginInfo, UpdateOutcome, VmSpec};

/// What to do after a day-2 action.
pub(super) enum Next {
    /// Ask [`decide`](super::decide) again (the facts or observations changed).
    Decide,
    Return(Outcome),
    /// Not a day-2 action: `vm.rs` carries it out.
    Act(Action),
}

/// The write calls made in this reconcile.
#[derive(Debug, Default)]
pub(super) struct Done {
    update: bool,
    stop: bool,
    start: bool,
}

/// The day-2 facts of `vm`.
pub(super) fn facts(vm: &VirtualMachine, plugin: Option<(&PluginInfo, &VmSpec)>) -> Day2 {
    let spec = &vm.spec;
    let status = vm.status.as_ref();
    Day2 {
        uid: vm.meta().uid.clone().unwrap_or_default(),
        paused: vm.annotations().get(PAUSED).is_some_and(|v| v == "true"),
        policy: spec.management_policy,
        power: spec.power_state,
        strategy: spec.update_strategy,
        external_id: spec.external_id.clone(),
        desired: plugin
            .map(|(_, spec)| AppliedSpec {
                cpu: spec.cpu,
                memory_mib: spec.memory_mib,
                parameters: spec.parameters.clone(),
            })
            .unwrap_or_default(),
        applied: status.and_then(|s| s.applied.clone()),
        restart_required: status
            .is_some_and(|s| conditions::is_true(&s.conditions, conditions::RESTART_REQUIRED)),
        capabilities: plugin
            .map(|(info, _)| Capabilities::of(info))
            .unwrap_or_default(),
        launch_only: plugin
            .map(|(info, _)| {
                info.parameters
                    .iter()
                    .filter(|p| !p.mutable)
                    .map(|p| p.name.clone())
                    .collect()
            })
            .unwrap_or_default(),
    }
}

/// Records a paused VM: `Synced=False`, reason `ReconcilePaused`, with the reconcile request
/// handled. One guarded status write, none when it says that already.
pub(super) async fn record_paused(
    vm: &VirtualMachine,
    api: &Api<SlimVirtualMachine>,
) -> Result<(), Error> {
    let mut status = vm_status::current(vm);
    status.last_handled_reconcile_at = vm.annotations().get(RECONCILE_REQUESTED_AT).cloned();
    paused_status(&mut status, vm);
    vm_status::write(api, vm, &status).await
}

fn paused_status(status: &mut crate::api::VirtualMachineStatus, vm: &VirtualMachine) {
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

/// How often a settled `vm` is re-checked: annotation `vmop.dev/poll-interval`, never below
/// `options.min_poll_interval`; else the resync period.
pub(super) fn poll_interval(vm: &VirtualMachine, options: &Options) -> Duration {
    vm.annotations()
        .get(POLL_INTERVAL)
        .and_then(|v| crate::api::parse_duration(v))
        .map(|d| d.max(options.min_poll_interval))
        .unwrap_or(options.resync_period)
}

impl<E: Effects> Run<'_, E> {
    /// Carries out a day-2 action, or hands any other back.
    pub(super) async fn day2(
        &mut self,
        action: Action,
        facts: &mut Facts,
        seen: &mut Observed,
        done: &mut Done,
    ) -> Result<Next, Error> {
        let vm = self.vm;
        match action {
            Action::Paused => {
                paused_status(self.status, vm);
                self.fx.write_status(self.status).await?;
                Ok(Next::Return(Outcome::Paused))
            }
            Action::Adopt { machine, location } => {
                vm_status::observed(self.status, vm, &machine);
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
                // Ours now: bring it to the spec in this same reconcile.
                facts.id = Some(machine.id.clone());
                facts.recorded_location = self.status.location.clone();
                facts.day2.applied = None;
                Ok(Next::Decide)
            }
            Action::AdoptionConflict { id, owner } => {
                let advice = match &owner {
                    Claimant::VirtualMachine(name) => format!(
                        "remove spec.externalId or delete {name} with deletionPolicy: Orphan first"
                    ),
                    Claimant::Uid(_) => "remove spec.externalId (or, if that VirtualMachine is \
                                         gone for good, the machine's ownership mark)"
                        .to_owned(),
                };
                let message = format!(
                    "external machine {id} is already managed by {owner}: it is not taken over, \
                     nor updated, powered or deleted by this VirtualMachine; {advice}"
                );
                self.blocked("AdoptionConflict", message).await
            }
            Action::Disown { id, owner } => {
                // Another VM's machine (a conflicting adoption): never deleted from here.
                let note = format!(
                    "left external machine {id} in place: it carries the ownership mark of the \
                     VirtualMachine with uid {owner}, not this one's"
                );
                tracing::info!(id = %id, owner = %owner, "{note}");
                self.fx
                    .event(Severity::Warning, "Delete", "OwnedElsewhere", note)
                    .await;
                self.fx.remove_finalizer().await?;
                self.attempts.forget(self.uid);
                Ok(Next::Return(Outcome::Done))
            }
            Action::LaunchOnly(changes) => {
                let changed: Vec<String> = changes.iter().map(ToString::to_string).collect();
                let message = format!(
                    "the plugin applies {} at creation only: the change is not made to the \
                     existing machine, whose value stays in status.applied; revert it, or create \
                     a new VirtualMachine",
                    changed.join(", ")
                );
                tracing::warn!(%message, "refused a change of a launch-only parameter");
                self.blocked("InvalidSpec", message).await
            }
            Action::NotFound { id } => {
                let message = match (&id, facts.day2.policy) {
                    (Some(id), ManagementPolicy::ObserveOnly) => format!(
                        "external machine {id} does not exist; managementPolicy ObserveOnly never creates one"
                    ),
                    (Some(id), ManagementPolicy::Full) => format!(
                        "external machine {id} named by spec.externalId does not exist; remove \
                         spec.externalId to create a new machine"
                    ),
                    (None, _) => "no external machine exists for this VirtualMachine; \
                                  managementPolicy ObserveOnly never creates one (set spec.externalId)"
                        .to_owned(),
                };
                self.blocked("ExternalVMNotFound", message).await
            }
            Action::Unsupported {
                machine,
                capability,
                what,
            } => {
                vm_status::observed(self.status, vm, &machine);
                let reason = match capability {
                    "power" => "PowerNotSupported",
                    _ => "UpdateNotSupported",
                };
                let message = format!(
                    "the plugin does not declare capability {capability:?}, needed for {what}: it is not asked"
                );
                self.blocked(reason, message).await
            }
            Action::Update(machine) => {
                if std::mem::replace(&mut done.update, true) {
                    return self.settling(&machine).await;
                }
                // Forget what was applied before asking: if the answer or the next write is
                // lost, the next reconcile does not trust a size the machine may no longer
                // have, and asks again (`update` is idempotent). Found by the simulation: an
                // update whose record was lost, then the spec reverted, left the machine at
                // the size asked in between.
                if self.status.applied.is_some() {
                    self.status.applied = None;
                    self.fx.write_status(self.status).await?;
                }
                match self.fx.update(&machine.id).await? {
                    UpdateOutcome::Applied => {
                        self.status.applied = Some(facts.day2.desired.clone());
                        facts.day2.applied = Some(facts.day2.desired.clone());
                        facts.day2.restart_required = false;
                        vm_status::restart_required(self.status, vm, false);
                        let note = format!("external machine {} updated to the spec", machine.id);
                        self.fx
                            .event(Severity::Normal, "Update", "Updated", note)
                            .await;
                    }
                    UpdateOutcome::NeedsRestart => {
                        if !facts.day2.restart_required {
                            let note = format!(
                                "external machine {} must be stopped to apply the change (updateStrategy {:?})",
                                machine.id, vm.spec.update_strategy
                            );
                            self.fx
                                .event(Severity::Normal, "Update", "RestartRequired", note)
                                .await;
                        }
                        facts.day2.restart_required = true;
                        vm_status::restart_required(self.status, vm, true);
                    }
                    UpdateOutcome::NeedsReplacement => {
                        vm_status::observed(self.status, vm, &machine);
                        let message = format!(
                            "the provider can only apply this change to a new machine: {} is not \
                             replaced automatically; revert the change, or create a new VirtualMachine",
                            machine.id
                        );
                        return self.blocked("ReplacementRequired", message).await;
                    }
                }
                Ok(Next::Decide)
            }
            Action::Stop { machine, restart } => {
                if std::mem::replace(&mut done.stop, true) {
                    return self.settling(&machine).await;
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
                Ok(Next::Decide)
            }
            Action::Start(machine) => {
                if std::mem::replace(&mut done.start, true) {
                    return self.settling(&machine).await;
                }
                // Stopped outside the operator: say so (status, Event) before correcting it.
                let previous = self.status.phase;
                if previous != Some(VmPhase::from(machine.phase)) {
                    vm_status::observed(self.status, vm, &machine);
                    self.fx.write_status(self.status).await?;
                    super::phase_events(self.fx, previous, &machine).await;
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
                Ok(Next::Decide)
            }
            other => Ok(Next::Act(other)),
        }
    }

    /// A write was made in this reconcile and the machine has not caught up: mirror it and look
    /// again after the poll interval.
    async fn settling(&mut self, machine: &crate::plugin::VmStatus) -> Result<Next, Error> {
        vm_status::observed(self.status, self.vm, machine);
        self.fx.write_status(self.status).await?;
        Ok(Next::Return(match machine.phase {
            Phase::Running | Phase::Stopped => Outcome::Transition,
            phase => Outcome::Settled(phase),
        }))
    }

    /// `Synced=False` with `reason`, an Event when the reason is new, and a slow look again.
    async fn blocked(&mut self, reason: &str, message: String) -> Result<Next, Error> {
        let vm = self.vm;
        let new =
            conditions::find(&self.status.conditions, SYNCED).is_none_or(|c| c.reason != reason);
        vm_status::failed(self.status, vm, reason, message.clone());
        self.fx.write_status(self.status).await?;
        if new {
            self.fx
                .event(Severity::Warning, "Reconcile", reason, message)
                .await;
        }
        Ok(Next::Return(Outcome::Blocked))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vm(annotations: &[(&str, &str)]) -> VirtualMachine {
        let mut vm = VirtualMachine::new("web", Default::default());
        vm.metadata.annotations = Some(
            annotations
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        );
        vm
    }

    #[test]
    fn poll_interval_is_the_annotation_clamped_to_the_minimum() {
        let mut options = Options::new("ops");
        options.resync_period = Duration::from_secs(300);
        options.min_poll_interval = Duration::from_secs(10);
        assert_eq!(poll_interval(&vm(&[]), &options), Duration::from_secs(300));
        assert_eq!(
            poll_interval(&vm(&[(POLL_INTERVAL, "1m")]), &options),
            Duration::from_secs(60)
        );
        assert_eq!(
            poll_interval(&vm(&[(POLL_INTERVAL, "1s")]), &options),
            Duration::from_secs(10),
            "clamped"
        );
        assert_eq!(
            poll_interval(&vm(&[(POLL_INTERVAL, "soon")]), &options),
            Duration::from_secs(300),
            "unparsable: ignored"
        );
    }

    #[test]
    fn only_the_value_true_pauses() {
        assert!(facts(&vm(&[(PAUSED, "true")]), None).paused);
        assert!(!facts(&vm(&[(PAUSED, "false")]), None).paused);
        assert!(!facts(&vm(&[]), None).paused);
    }
}
