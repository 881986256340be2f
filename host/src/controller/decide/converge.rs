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
//! - A machine another VirtualMachine records is never adopted.

use super::{Action, Facts, Observed, Step};
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
        return Some(match &seen.claimed_by {
            None => Step::Claimed(id.clone()),
            Some(Some(owner)) => Step::Act(Action::AdoptionConflict {
                id: id.clone(),
                owner: owner.clone(),
            }),
            Some(None) => match &seen.location {
                None => Step::Location,
                Some(location) => Step::Act(Action::Adopt {
                    machine: machine.clone(),
                    location: location.clone(),
                }),
            },
        });
    }
    if day2.policy == ManagementPolicy::ObserveOnly {
        return Some(match &seen.find {
            None => Step::Find,
            Some(Some(machine)) => Step::Act(Action::Observe(machine.clone())),
            Some(None) => Step::Act(Action::NotFound { id: None }),
        });
    }
    None
}

/// Whether the machine was last made to match something other than the spec asks (an unknown
/// `applied` counts only when the plugin can `update`: one call tells).
pub fn stale(facts: &Facts) -> bool {
    let day2 = &facts.day2;
    match &day2.applied {
        Some(applied) => applied != &day2.desired,
        None => day2.capabilities.update,
    }
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
    if day2.policy == ManagementPolicy::ObserveOnly || !settled {
        return observe();
    }
    let running = machine.phase == Phase::Running;
    if day2.power == PowerState::Stopped && running {
        return power(facts, machine, false);
    }
    let stale = stale(facts);
    if stale && day2.capabilities.update {
        if !running || !day2.restart_required {
            return Action::Update(machine.clone());
        }
        return match day2.strategy {
            UpdateStrategy::Restart => power(facts, machine, true),
            UpdateStrategy::Manual => observe(),
        };
    }
    if day2.power == PowerState::Running && !running {
        return power(facts, machine, false);
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
