//! The one function that decides what a VirtualMachine needs next, from its spec and status,
//! what this process knows about create attempts, and what the provider answered so far.
//!
//! [`decide`] is pure. It either asks for one more read-only observation ([`Step::Get`],
//! [`Step::Find`], [`Step::Location`], [`Step::Claimed`]) or names the [`Action`] to take.
//! The reconciler (`vm/act.rs`) answers its questions with plugin calls (and the API server, for
//! `Claimed`) and carries out the action; `vmop plan`
//! answers them the same way and prints the action; the simulation test answers them from a
//! fake cloud. None of them decides anything itself, so they cannot disagree.
//!
//! # Guarantees (each holds for every input; `tests` here, and `host/tests/simulation.rs`
//! checks them over thousands of random schedules with crashes, lag and lost responses)
//!
//! - Never creates while deleting. A VM without a recorded id is created at once only when no
//!   earlier create can have made a machine; otherwise `find` is asked first, and a new create
//!   waits until the grace period says an earlier one would show.
//! - Absence proves nothing alone: a recorded machine that `get` no longer sees counts as lost
//!   (recreate) or gone (release the finalizer) only when `find` by uid agrees, the creation
//!   grace period has passed ([`Facts::absence_wait`] is zero) and the ProviderConfig's location
//!   is the one recorded (or the move was accepted). Otherwise the answer is to wait, or
//!   [`Action::LocationChanged`].
//! - Deletion never calls `create`: a machine that may exist without an id is looked up with
//!   `find` and deleted by the id it answers. A recorded machine is observed before it is
//!   deleted, except the one [`Facts::sole_machine`] names (made for this VM by this process,
//!   so marked as its own, and never since seen as anything else) while the ProviderConfig
//!   still points where it was made: `delete` is idempotent, so it is asked at once. Either
//!   way the finalizer goes only once `get` and `find` confirm the absence as above, except
//!   after a `delete` of that sole machine asked in this decision by a plugin that declares
//!   `consistent-get` ([`Capabilities::consistent_get`]): then `get` alone confirms it, since
//!   no other machine can exist and no lag can hide this one
//!   (`tests::a_consistent_get_confirms_the_deletion_of_the_sole_machine`; the simulation's
//!   `no_schedule_leaks_duplicates_or_sticks`, whose calls by id lag past the grace period
//!   unless the plugin declares the capability, leaks a machine when the shortcut ignores it).
//! - Freshness: a drift check's [`Step::Get`] may be answered from the ProviderConfig's cloud
//!   view (`provider_config::view`: a listing begun after this process last changed the
//!   machine) instead of a call. A listing only ever answers "present", possibly stale; absence,
//!   deletion, every step after a change, `find` and `location` are always asked of the
//!   plugin, so the rules above about absence hold unchanged (the simulation answers drift
//!   checks from a stale listing in `no_schedule_leaks_duplicates_or_sticks` and the day-2
//!   schedules).
//! - Day 2 (`converge.rs`): a paused VM asks nothing and does nothing; an `ObserveOnly` VM is
//!   never created, updated, powered or deleted (its deletion leaves the machine); an export
//!   whose capability the plugin lacks is never asked for (a condition says so instead); an
//!   adopted machine that another VirtualMachine records, or whose ownership mark
//!   (`vm-status.owner`) is another VM's uid, is never taken over, updated, powered or deleted
//!   ([`Action::AdoptionConflict`], and [`Action::Disown`] at deletion); a change of a
//!   launch-only parameter after creation is refused before any call
//!   ([`Action::LaunchOnly`]), also for a machine found after its create's answer was lost
//!   (no `status.applied`): a create is only sent with the parameters recorded before it
//!   ([`Action::Intend`]), which then stand for the machine's launch-only parameters
//!   (`day2_tests::ownership::a_machine_found_without_its_create_answer_keeps_its_launch_parameters`;
//!   the day-2 schedules of the simulation, which change a launch-only parameter while answers
//!   are lost); a replacement is never made (the VM says it is needed).

mod action;
mod converge;

pub use action::{Action, Claimant};
pub use converge::{LaunchOnlyChange, restart_pending};

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::api::{AppliedSpec, DeletionPolicy, ManagementPolicy, PowerState, UpdateStrategy};
use crate::plugin::{Phase, PluginInfo, VmStatus};

/// The optional exports the plugin declared (`plugin-info.capabilities`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Capabilities {
    /// `update` works.
    pub update: bool,
    /// `start` and `stop` work.
    pub power: bool,
    /// `consistent-get`: `get` and `delete` see a machine as soon as `create` answered it (no
    /// read-after-write lag by id; `find` may still lag). With it, a deletion of
    /// [`Facts::sole_machine`] that `get` then no longer sees is complete: no other machine
    /// can exist, and this one cannot be hiding.
    pub consistent_get: bool,
}

impl Capabilities {
    pub fn of(info: &PluginInfo) -> Self {
        Capabilities {
            update: info.has("update"),
            power: info.has("power"),
            consistent_get: info.has("consistent-get"),
        }
    }
}

/// The day-2 part of [`Facts`]: what the spec asks beyond existence, and what was last applied.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Day2 {
    /// The VM's `metadata.uid`: a machine marked with another uid (`vm-status.owner`) is
    /// another VM's.
    pub uid: String,
    /// Annotation `vmop.dev/paused: "true"`.
    pub paused: bool,
    pub policy: ManagementPolicy,
    pub power: PowerState,
    pub strategy: UpdateStrategy,
    /// `spec.externalId`: adopt this machine instead of creating one.
    pub external_id: Option<String>,
    /// What the spec asks for (cpu, memory, checked parameters).
    pub desired: AppliedSpec,
    /// `status.applied`: what the machine was last made to match (`None`: not known).
    pub applied: Option<AppliedSpec>,
    /// Annotation `vmop.dev/create-parameters`: the parameters creates of this VM send
    /// (`None`: not recorded, or not readable).
    pub create_parameters: Option<BTreeMap<String, String>>,
    /// `RestartRequired=True` in status: the last `update` answered `needs-restart`.
    pub restart_required: bool,
    /// `Synced=False`, reason `ReplacementRequired`, for this generation: `update` answered
    /// that the spec's change needs a new machine. It is not asked again, nor the machine
    /// restarted for it, until the spec changes.
    pub replacement_required: bool,
    pub capabilities: Capabilities,
    /// The parameters the plugin declares launch-only (`parameter.mutable == false`): a
    /// change after creation is refused, never handed to `update`.
    pub launch_only: BTreeSet<String>,
}

/// What is known about the VM when deciding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Facts {
    /// `metadata.deletionTimestamp` is set.
    pub deleting: bool,
    pub deletion_policy: DeletionPolicy,
    /// `status.id`: the machine last recorded.
    pub id: Option<String>,
    /// `status.location`: where the recorded machine was made.
    pub recorded_location: Option<String>,
    /// Annotation `vmop.dev/create-location`: where creates of this VM go, written with the
    /// finalizer (no extra write) and before any create elsewhere. With no id recorded, a
    /// machine may exist there from an attempt whose answer was lost.
    pub intended_location: Option<String>,
    /// `spec.acceptLocation`.
    pub accept_location: Option<String>,
    /// How long until "none" may be believed (see `attempts.rs`); zero when it may now.
    pub absence_wait: Duration,
    /// No create attempt for this VM can have made a machine (see `attempts.rs`).
    pub never_created: bool,
    /// The only machine any create attempt for this VM can have made, when this process
    /// knows it and has not asked to delete it yet (see `attempts.rs`): its own, so deleted
    /// without a `get` first.
    pub sole_machine: Option<String>,
    pub day2: Day2,
}

/// The answers gathered so far in this decision; `None` means not asked yet.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observed {
    /// `get(status.id)`.
    pub get: Option<Option<VmStatus>>,
    /// `find(uid)`.
    pub find: Option<Option<VmStatus>>,
    /// `location(config)`.
    pub location: Option<String>,
    /// Which other VirtualMachine (`namespace/name`) records the machine `spec.externalId`
    /// names, if any.
    pub claimed_by: Option<Option<String>>,
    /// The machines `delete` was asked for in this decision (answers before the last delete
    /// are dropped). All of them, not the last: with two machines and a lagging `find`, one
    /// that remembered only the last would alternate `delete` between them for as long as
    /// the cloud lags (`tests::each_machine_is_asked_to_delete_once_per_decision`).
    pub deleted: BTreeSet<String>,
}

impl Observed {
    /// What remains known once `delete` of `id` is asked: the location, and every machine
    /// deleted in this decision. Every other answer predates the delete and is asked again.
    pub fn after_delete(self, id: String) -> Observed {
        let mut deleted = self.deleted;
        deleted.insert(id);
        Observed {
            location: self.location,
            deleted,
            ..Observed::default()
        }
    }
}

/// The next thing to do: ask, or act.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Observe the recorded machine.
    Get(String),
    /// Look the machine up by the VM's uid.
    Find,
    /// Ask where the ProviderConfig's machines live now.
    Location,
    /// Ask which other VirtualMachine records this machine (before adopting it).
    Claimed(String),
    Act(Action),
}

/// Decides the next step. See the module docs.
pub fn decide(facts: &Facts, seen: &Observed) -> Step {
    if facts.day2.paused {
        return Step::Act(Action::Paused);
    }
    if facts.deleting && facts.day2.policy == ManagementPolicy::ObserveOnly {
        return Step::Act(Action::Orphan);
    }
    if facts.deleting {
        decide_deletion(facts, seen)
    } else {
        decide_apply(facts, seen)
    }
}

fn decide_apply(facts: &Facts, seen: &Observed) -> Step {
    let Some(id) = &facts.id else {
        if let Some(step) = converge::without_id(facts, seen) {
            return step;
        }
        let Some(current) = &seen.location else {
            return Step::Location;
        };
        // A create whose outcome is unknown (ours, or an earlier operator's) may yet show its
        // machine: look for it, and create again only once the grace period says it would
        // show. A cloud without server-side idempotency (moto ignores EC2's ClientToken)
        // would otherwise get a second machine from a create racing one still in flight.
        let unknown = !facts.never_created;
        let here = facts
            .intended_location
            .as_ref()
            .is_none_or(|i| i == current);
        if unknown && here {
            match &seen.find {
                None => return Step::Find,
                Some(Some(machine)) => return Step::Act(Action::Observe(machine.clone())),
                Some(None) if facts.absence_wait > Duration::ZERO => {
                    return Step::Act(Action::AwaitAbsence {
                        remaining: facts.absence_wait,
                    });
                }
                Some(None) => {}
            }
        }
        // A create sends only what was recorded first: a machine it makes whose answer is lost
        // is then known to have those parameters.
        let recorded =
            facts.day2.create_parameters.as_ref() == Some(&facts.day2.desired.parameters);
        return Step::Act(match &facts.intended_location {
            Some(intended) if intended == current && recorded => Action::Create {
                location: current.clone(),
            },
            Some(intended) if intended == current => Action::Intend {
                location: current.clone(),
            },
            Some(intended) if !facts.never_created && !accepted(facts, current) => {
                Action::LocationChanged {
                    recorded: intended.clone(),
                    current: current.clone(),
                }
            }
            _ => Action::Intend {
                location: current.clone(),
            },
        });
    };
    if let Some(refused) = converge::launch_only(facts) {
        return refused;
    }
    match &seen.get {
        None => Step::Get(id.clone()),
        Some(Some(machine)) => converge::observed(facts, machine),
        Some(None) if facts.day2.policy == ManagementPolicy::ObserveOnly => {
            Step::Act(Action::NotFound {
                id: Some(id.clone()),
            })
        }
        Some(None) => absent(
            facts,
            facts.recorded_location.as_ref(),
            seen,
            |found| match found {
                Some(machine) => converge::observed(facts, machine),
                None => with_location(seen, |location| Action::Recreate {
                    lost: id.clone(),
                    location,
                }),
            },
        ),
    }
}

fn decide_deletion(facts: &Facts, seen: &Observed) -> Step {
    if facts.deletion_policy == DeletionPolicy::Orphan {
        return Step::Act(Action::Orphan);
    }
    // A machine marked as another VM's is that VM's to delete, never this one's.
    let remove = |machine: &VmStatus| {
        Step::Act(match &machine.owner {
            Some(owner) if machine.owned_by_other(&facts.day2.uid) => Action::Disown {
                id: machine.id.clone(),
                owner: owner.clone(),
            },
            // Asked once in this decision and still there: watch it go.
            _ if machine.phase == Phase::Deleting || seen.deleted.contains(&machine.id) => {
                Action::AwaitDeletion(machine.clone())
            }
            _ => Action::Delete(machine.id.clone()),
        })
    };
    match &facts.id {
        Some(id) => match &seen.get {
            // Only where it was made: after a move the id may name another machine.
            None if seen.deleted.is_empty() && facts.sole_machine.as_ref() == Some(id) => {
                match (&seen.location, &facts.recorded_location) {
                    (None, Some(_)) => Step::Location,
                    (Some(current), Some(recorded)) if current == recorded => {
                        Step::Act(Action::Delete(id.clone()))
                    }
                    _ => Step::Get(id.clone()),
                }
            }
            None => Step::Get(id.clone()),
            Some(Some(machine)) => remove(machine),
            Some(None) if sole_deleted(facts, seen, id) => {
                in_place(facts, facts.recorded_location.as_ref(), seen)
                    .unwrap_or(Step::Act(Action::Release))
            }
            Some(None) => absent(
                facts,
                facts.recorded_location.as_ref(),
                seen,
                |found| match found {
                    Some(machine) => remove(machine),
                    None => Step::Act(Action::Release),
                },
            ),
        },
        None if facts.never_created => Step::Act(Action::Release),
        None => absent(
            facts,
            facts.intended_location.as_ref(),
            seen,
            |found| match found {
                Some(machine) => remove(machine),
                None => Step::Act(Action::Release),
            },
        ),
    }
}

/// The machine is not seen: decide only once the location is `recorded` (where it would be),
/// `find` has answered and the grace period is over. `then` receives `find`'s answer.
fn absent(
    facts: &Facts,
    recorded: Option<&String>,
    seen: &Observed,
    then: impl FnOnce(Option<&VmStatus>) -> Step,
) -> Step {
    if let Some(step) = in_place(facts, recorded, seen) {
        return step;
    }
    let Some(found) = &seen.find else {
        return Step::Find;
    };
    match found {
        Some(machine) => then(Some(machine)),
        None if facts.absence_wait > Duration::ZERO => Step::Act(Action::AwaitAbsence {
            remaining: facts.absence_wait,
        }),
        None => then(None),
    }
}

/// `None` when the location is `recorded` (or the move was accepted); else the step that
/// finds out or says it moved.
fn in_place(facts: &Facts, recorded: Option<&String>, seen: &Observed) -> Option<Step> {
    let recorded = recorded?;
    let Some(current) = &seen.location else {
        return Some(Step::Location);
    };
    (recorded != current && !accepted(facts, current)).then(|| {
        Step::Act(Action::LocationChanged {
            recorded: recorded.clone(),
            current: current.clone(),
        })
    })
}

/// `id` is the sole machine, `delete` was asked for it in this decision, and the plugin's
/// `get` does not lag: its "none" now means gone (see the module docs).
fn sole_deleted(facts: &Facts, seen: &Observed, id: &String) -> bool {
    facts.day2.capabilities.consistent_get
        && facts.sole_machine.as_ref() == Some(id)
        && seen.deleted.contains(id)
}

fn accepted(facts: &Facts, current: &str) -> bool {
    facts.accept_location.as_deref() == Some(current)
}

fn with_location(seen: &Observed, act: impl FnOnce(String) -> Action) -> Step {
    match &seen.location {
        Some(location) => Step::Act(act(location.clone())),
        None => Step::Location,
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod day2_tests;

#[cfg(test)]
pub(super) mod properties;
