//! The day-2 half of [`decide`](super::decide): adopting or observing a machine the operator did
//! not create, and bringing an observed machine to the spec (power state, size, parameters).
//!
//! # Guarantees (tests: `super::tests`, `host/tests/simulation.rs`, `tests/tests/operator_day2*.rs`)
//!
//! - `ObserveOnly` only observes: no [`Action::Update`], [`Action::Stop`], [`Action::Start`],
//!   create or delete is ever returned for it.
//! - A missing capability is never asked for: [`Action::Unsupported`] instead.
//! - An update that needs a restart restarts the machine only under `updateStrategy: Restart`;
//!   otherwise the machine keeps running (`RestartRequired=True`) until it is stopped.
//! - A machine another VirtualMachine records is never adopted, nor one whose ownership mark
//!   (`vm-status.owner`) is another uid, even when no VirtualMachine with that uid is left in
//!   the cluster (`day2_tests::ownership::a_machine_marked_by_another_uid_is_never_adopted`,
//!   `tests/tests/operator/operator_day2_adopt.rs`).
//! - Under `managementPolicy: Full`, an observed machine whose mark turns out to be another
//!   uid's (two VMs adopted it at once and the other claimed it last) is
//!   [`Action::AdoptionConflict`]: observed no more, never updated, powered or deleted
//!   (`day2_tests::ownership::a_machine_claimed_by_another_uid_is_left_alone`; under faults,
//!   the claim schedules of `host/tests/simulation/day2.rs`).
//! - A change of a launch-only parameter after creation is [`Action::LaunchOnly`], decided
//!   before any call: nothing is asked of the plugin, `status.applied` keeps the value the
//!   machine was made with, and reverting the spec ends it
//!   (`day2_tests::ownership::a_launch_only_parameter_change_is_refused_before_any_call`). A
//!   machine found after its create's answer was lost has no `status.applied`; the parameters
//!   recorded before its create stand for it
//!   (`day2_tests::ownership::a_machine_found_without_its_create_answer_keeps_its_launch_parameters`).

use super::{Action, Claimant, Facts, Observed, Step};
use crate::api::{ManagementPolicy, PowerState, UpdateStrategy};
use crate::plugin::{Phase, VmStatus};

/// The steps of a VM with no recorded machine that adopts one (`spec.externalId`) or only
/// observes; `None` when it is created the usual way.
pub(super) fn without_id(facts: &Facts, seen: &Observed) -> Option<Step> {
    let day2 = &facts.day2;
    if let Some(id) = &day2.external_id {
        let machine = match &seen.get {
            None => return Some(Step::Get(id.clone())),
            Some(None) => {
                return Some(Step::Act(Action::NotFound {
                    id: Some(id.clone()),
                }));
            }
            Some(Some(machine)) => machine,
        };
        // A VirtualMachine in the cluster that records it is named; else the cloud's mark,
        // which outlives the VirtualMachine that set it, says whose it is.
        return Some(match (&seen.claimed_by, &machine.owner) {
            (None, _) => Step::Claimed(id.clone()),
            (Some(Some(owner)), _) => Step::Act(Action::AdoptionConflict {
                id: id.clone(),
                owner: Claimant::VirtualMachine(owner.clone()),
            }),
            (Some(None), Some(owner)) if machine.owned_by_other(&day2.uid) => {
                Step::Act(Action::AdoptionConflict {
                    id: id.clone(),
                    owner: Claimant::Uid(owner.clone()),
                })
            }
            (Some(None), _) => match &seen.location {
                None => Step::Location,
                Some(location) => Step::Act(Action::Adopt {
                    machine: machine.clone(),
                    location: location.clone(),
                }),
            },
        });
    }
    if day2.policy == ManagementPolicy::ObserveOnly {
        return Some(match (&seen.find, &seen.location) {
            (None, _) => Step::Find,
            // Recorded with where it is, like any machine, so that a moved ProviderConfig is
            // never read as the machine gone.
            (Some(Some(_)), None) => Step::Location,
            (Some(Some(machine)), Some(_)) => Step::Act(Action::Observe(machine.clone())),
            (Some(None), _) => Step::Act(Action::NotFound { id: None }),
        });
    }
    None
}

/// Whether the machine was last made to match something other than the spec asks (an unknown
/// `applied` counts only when the plugin can `update`: one call tells; a pending one always
/// counts).
pub fn stale(facts: &Facts) -> bool {
    let day2 = &facts.day2;
    match &day2.applied {
        Some(applied) => applied != &day2.desired,
        None => day2.capabilities.update,
    }
}

/// One launch-only parameter whose spec value differs from the one the machine was made with
/// (`None`: not set).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchOnlyChange {
    pub name: String,
    pub applied: Option<String>,
    pub desired: Option<String>,
}

impl std::fmt::Display for LaunchOnlyChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shown = |v: &Option<String>| {
            v.as_deref()
                .map_or("unset".to_owned(), |v| format!("{v:?}"))
        };
        write!(
            f,
            "spec.parameters.{} ({} at creation, {} now)",
            self.name,
            shown(&self.applied),
            shown(&self.desired)
        )
    }
}

/// The launch-only parameters whose value differs from what the machine was made with; empty
/// when none does, or when that is not known. Made with: `status.applied`, else the parameters
/// recorded before its creates (a machine found after a create's answer was lost); unknown
/// for an adopted machine.
fn launch_only_changes(facts: &Facts) -> Vec<LaunchOnlyChange> {
    let day2 = &facts.day2;
    let made_with = match (&day2.applied, &day2.create_parameters) {
        (Some(applied), _) => &applied.parameters,
        (None, Some(recorded)) if day2.external_id.is_none() => recorded,
        _ => return Vec::new(),
    };
    day2.launch_only
        .iter()
        .filter_map(|name| {
            let was = made_with.get(name);
            let now = day2.desired.parameters.get(name);
            (was != now).then(|| LaunchOnlyChange {
                name: name.clone(),
                applied: was.cloned(),
                desired: now.cloned(),
            })
        })
        .collect()
}

/// [`Action::LaunchOnly`] for a recorded machine under `Full` whose spec changed a launch-only
/// parameter; `None` otherwise. Decided before any call.
pub(super) fn launch_only(facts: &Facts) -> Option<Step> {
    if facts.day2.policy != ManagementPolicy::Full {
        return None;
    }
    let changes = launch_only_changes(facts);
    (!changes.is_empty()).then_some(Step::Act(Action::LaunchOnly(changes)))
}

/// Whether a change waits for the machine to be restarted (`RestartRequired=True`).
pub fn restart_pending(facts: &Facts) -> bool {
    facts.day2.restart_required && stale(facts)
}

/// What an observed machine needs.
pub(super) fn observed(facts: &Facts, machine: &VmStatus) -> Step {
    Step::Act(converge(facts, machine))
}

fn converge(facts: &Facts, machine: &VmStatus) -> Action {
    let day2 = &facts.day2;
    let observe = || Action::Observe(machine.clone());
    let settled = matches!(machine.phase, Phase::Running | Phase::Stopped);
    if day2.policy == ManagementPolicy::ObserveOnly {
        return observe();
    }
    if let Some(owner) = machine
        .owner
        .as_ref()
        .filter(|_| machine.owned_by_other(&day2.uid))
    {
        return Action::AdoptionConflict {
            id: machine.id.clone(),
            owner: Claimant::Uid(owner.clone()),
        };
    }
    if !settled {
        return observe();
    }
    let running = machine.phase == Phase::Running;
    if day2.power == PowerState::Stopped && running {
        return power(facts, machine, false);
    }
    let stale = stale(facts);
    if stale && day2.capabilities.update && !day2.replacement_required {
        if !running || !day2.restart_required {
            return Action::Update(machine.clone());
        }
        return match day2.strategy {
            UpdateStrategy::Restart => power(facts, machine, true),
            UpdateStrategy::Manual => observe(),
        };
    }
    if day2.power == PowerState::Running && !running {
        // Neither can be done: say the replacement, which the VM remembers only through its
        // `Synced` reason. Saying `PowerNotSupported` would forget it, ask `update` again,
        // and alternate the two conditions on every reconcile (the day-2 simulation, seed 39
        // of its schedules with a listing answering drift checks).
        if !day2.capabilities.power && stale && day2.replacement_required {
            return Action::ReplacementRequired(machine.clone());
        }
        return power(facts, machine, false);
    }
    if stale && day2.replacement_required {
        return Action::ReplacementRequired(machine.clone());
    }
    if stale {
        return Action::Unsupported {
            machine: machine.clone(),
            capability: "update",
            what: "a change of cpu, memory or parameters",
        };
    }
    observe()
}

/// Start or stop (`restart`: stop for an update), if the plugin can.
fn power(facts: &Facts, machine: &VmStatus, restart: bool) -> Action {
    if !facts.day2.capabilities.power {
        return Action::Unsupported {
            machine: machine.clone(),
            capability: "power",
            what: if restart {
                "a restart to apply an update"
            } else {
                "spec.powerState"
            },
        };
    }
    let machine = machine.clone();
    match machine.phase {
        Phase::Running => Action::Stop { machine, restart },
        _ => Action::Start(machine),
    }
}
