//! The one function that decides what a VirtualMachine needs next, from its spec and status,
//! what this process knows about create attempts, and what the provider answered so far.
//!
//! [`decide`] is pure. It either asks for one more read-only observation ([`Step::Get`],
//! [`Step::Find`], [`Step::Location`]) or names the [`Action`] to take. The reconciler
//! (`vm.rs`) answers its questions with plugin calls and carries out the action; `vmop plan`
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
//!   `find` and deleted by the id it answers.

use std::time::Duration;

use crate::api::DeletionPolicy;
use crate::plugin::{Phase, VmStatus};

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
    Act(Action),
}

/// What the VM needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// The machine is there (possibly found under an id not recorded yet): mirror it.
    Observe(VmStatus),
    /// No machine has been recorded: create it (idempotent on the uid) at `location`.
    Create { location: String },
    /// Before creating at `location`, record that creates go there (no create can have made a
    /// machine elsewhere).
    Intend { location: String },
    /// The recorded machine is confirmed lost: create a new one at `location`.
    Recreate { lost: String, location: String },
    /// Deleting: ask the provider to delete this machine.
    Delete(VmStatus),
    /// Deleting: the provider is deleting it; watch it go.
    AwaitDeletion(VmStatus),
    /// Deleting: no machine exists; drop the finalizer.
    Release,
    /// Deleting with `deletionPolicy: Orphan`: drop the finalizer, leave the machine.
    Orphan,
    /// The provider says "none", but that cannot be believed for `remaining` more.
    AwaitAbsence { remaining: Duration },
    /// The provider says "none" from another location than the recorded one.
    LocationChanged { recorded: String, current: String },
}

impl Action {
    /// One word for tables, logs and metrics.
    pub fn verb(&self) -> &'static str {
        match self {
            Action::Observe(_) => "observe",
            Action::Create { .. } => "create",
            Action::Intend { .. } => "intend",
            Action::Recreate { .. } => "recreate",
            Action::Delete(_) => "delete",
            Action::AwaitDeletion(_) => "await-deletion",
            Action::Release => "release",
            Action::Orphan => "orphan",
            Action::AwaitAbsence { .. } => "await-absence",
            Action::LocationChanged { .. } => "location-changed",
        }
    }
}

/// Decides the next step. See the module docs.
pub fn decide(facts: &Facts, seen: &Observed) -> Step {
    if facts.deleting {
        decide_deletion(facts, seen)
    } else {
        decide_apply(facts, seen)
    }
}

fn decide_apply(facts: &Facts, seen: &Observed) -> Step {
    let Some(id) = &facts.id else {
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
        return Step::Act(match &facts.intended_location {
            Some(intended) if intended == current => Action::Create {
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
    match &seen.get {
        None => Step::Get(id.clone()),
        Some(Some(machine)) => Step::Act(Action::Observe(machine.clone())),
        Some(None) => absent(
            facts,
            facts.recorded_location.as_ref(),
            seen,
            |found| match found {
                Some(machine) => Step::Act(Action::Observe(machine.clone())),
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
    let remove = |machine: &VmStatus| {
        Step::Act(if machine.phase == Phase::Deleting {
            Action::AwaitDeletion(machine.clone())
        } else {
            Action::Delete(machine.clone())
        })
    };
    match &facts.id {
        Some(id) => match &seen.get {
            None => Step::Get(id.clone()),
            Some(Some(machine)) => remove(machine),
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
    if let Some(recorded) = recorded {
        let Some(current) = &seen.location else {
            return Step::Location;
        };
        if recorded != current && !accepted(facts, current) {
            return Step::Act(Action::LocationChanged {
                recorded: recorded.clone(),
                current: current.clone(),
            });
        }
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
mod tests {
    use super::*;

    const HERE: &str = "aws:1:us-east-1";

    fn facts() -> Facts {
        Facts {
            deleting: false,
            deletion_policy: DeletionPolicy::Delete,
            id: Some("i-1".into()),
            recorded_location: Some(HERE.into()),
            intended_location: Some(HERE.into()),
            accept_location: None,
            absence_wait: Duration::ZERO,
            never_created: false,
        }
    }

    fn machine(id: &str, phase: Phase) -> VmStatus {
        VmStatus {
            id: id.into(),
            phase,
            addresses: Vec::new(),
            message: None,
        }
    }

    /// Runs the decision loop against fixed answers, as the reconciler does against calls.
    fn run(
        facts: &Facts,
        get: Option<VmStatus>,
        find: Option<VmStatus>,
        location: &str,
    ) -> (Action, Vec<&'static str>) {
        let mut seen = Observed::default();
        let mut asked = Vec::new();
        loop {
            match decide(facts, &seen) {
                Step::Get(_) => {
                    asked.push("get");
                    seen.get = Some(get.clone());
                }
                Step::Find => {
                    asked.push("find");
                    seen.find = Some(find.clone());
                }
                Step::Location => {
                    asked.push("location");
                    seen.location = Some(location.into());
                }
                Step::Act(action) => return (action, asked),
            }
            assert!(asked.len() <= 3, "asked the same thing twice: {asked:?}");
        }
    }

    #[test]
    fn a_new_vm_is_created_where_the_config_points() {
        let f = Facts {
            id: None,
            recorded_location: None,
            never_created: true,
            ..facts()
        };
        let (action, asked) = run(&f, None, None, HERE);
        assert_eq!(
            action,
            Action::Create {
                location: HERE.into()
            }
        );
        assert_eq!(asked, ["location"], "create is idempotent: no find needed");
    }

    #[test]
    fn a_create_of_unknown_outcome_is_looked_for_and_not_raced() {
        let unknown = Facts {
            id: None,
            recorded_location: None,
            absence_wait: Duration::from_secs(20),
            ..facts()
        };
        let found = machine("i-7", Phase::Running);
        let (action, asked) = run(&unknown, None, Some(found.clone()), HERE);
        assert_eq!(
            action,
            Action::Observe(found),
            "the machine it made is adopted"
        );
        assert_eq!(asked, ["location", "find"]);
        assert!(
            matches!(
                run(&unknown, None, None, HERE).0,
                Action::AwaitAbsence { .. }
            ),
            "no second create while the first may still land"
        );
        let later = Facts {
            absence_wait: Duration::ZERO,
            ..unknown
        };
        assert!(matches!(
            run(&later, None, None, HERE).0,
            Action::Create { .. }
        ));
    }

    #[test]
    fn creates_go_where_the_vm_said_they_would() {
        let fresh = Facts {
            id: None,
            recorded_location: None,
            intended_location: None,
            never_created: true,
            ..facts()
        };
        assert_eq!(
            run(&fresh, None, None, HERE).0,
            Action::Intend {
                location: HERE.into()
            }
        );
        // An attempt may have made a machine at the old place: never create at the new one.
        let moved = Facts {
            id: None,
            recorded_location: None,
            ..facts()
        };
        assert!(matches!(
            run(&moved, None, None, "aws:2:eu-west-1").0,
            Action::LocationChanged { .. }
        ));
        // ... unless no attempt can have, or the user accepted the move.
        let never = Facts {
            never_created: true,
            ..moved.clone()
        };
        assert!(matches!(
            run(&never, None, None, "aws:2:eu-west-1").0,
            Action::Intend { .. }
        ));
        let accepted = Facts {
            accept_location: Some("aws:2:eu-west-1".into()),
            ..moved
        };
        assert!(matches!(
            run(&accepted, None, None, "aws:2:eu-west-1").0,
            Action::Intend { .. }
        ));
    }

    #[test]
    fn a_seen_machine_is_observed() {
        let m = machine("i-1", Phase::Running);
        let (action, asked) = run(&facts(), Some(m.clone()), None, HERE);
        assert_eq!(action, Action::Observe(m));
        assert_eq!(asked, ["get"]);
    }

    #[test]
    fn absence_alone_never_recreates() {
        // find still sees it (the id changed, or get lags): observe that one.
        let other = machine("i-2", Phase::Running);
        let (action, _) = run(&facts(), None, Some(other.clone()), HERE);
        assert_eq!(action, Action::Observe(other));
        // within the grace period: wait.
        let young = Facts {
            absence_wait: Duration::from_secs(12),
            ..facts()
        };
        let (action, _) = run(&young, None, None, HERE);
        assert_eq!(
            action,
            Action::AwaitAbsence {
                remaining: Duration::from_secs(12)
            }
        );
        // moved: never recreate.
        let (action, asked) = run(&facts(), None, None, "aws:2:eu-west-1");
        assert_eq!(
            action,
            Action::LocationChanged {
                recorded: HERE.into(),
                current: "aws:2:eu-west-1".into()
            }
        );
        assert_eq!(asked, ["get", "location"], "no find at the wrong place");
        // only all three together mean lost.
        let (action, asked) = run(&facts(), None, None, HERE);
        assert_eq!(
            action,
            Action::Recreate {
                lost: "i-1".into(),
                location: HERE.into()
            }
        );
        assert_eq!(asked, ["get", "location", "find"]);
    }

    #[test]
    fn an_accepted_move_recreates_at_the_new_location() {
        let moved = Facts {
            accept_location: Some("aws:2:eu-west-1".into()),
            ..facts()
        };
        let (action, _) = run(&moved, None, None, "aws:2:eu-west-1");
        assert_eq!(
            action,
            Action::Recreate {
                lost: "i-1".into(),
                location: "aws:2:eu-west-1".into()
            }
        );
        let (action, _) = run(&moved, None, None, "aws:3:ap-south-1");
        assert!(matches!(action, Action::LocationChanged { .. }));
    }

    #[test]
    fn deletion_deletes_what_it_sees_and_releases_only_confirmed_absence() {
        let deleting = Facts {
            deleting: true,
            ..facts()
        };
        let m = machine("i-1", Phase::Running);
        assert_eq!(
            run(&deleting, Some(m.clone()), None, HERE).0,
            Action::Delete(m)
        );
        let going = machine("i-1", Phase::Deleting);
        assert_eq!(
            run(&deleting, Some(going.clone()), None, HERE).0,
            Action::AwaitDeletion(going)
        );
        let (action, asked) = run(&deleting, None, None, HERE);
        assert_eq!(action, Action::Release);
        assert_eq!(asked, ["get", "location", "find"]);
        let young = Facts {
            absence_wait: Duration::from_secs(3),
            ..deleting.clone()
        };
        assert!(matches!(
            run(&young, None, None, HERE).0,
            Action::AwaitAbsence { .. }
        ));
        assert!(matches!(
            run(&deleting, None, None, "elsewhere").0,
            Action::LocationChanged { .. }
        ));
    }

    #[test]
    fn deletion_without_an_id_finds_and_never_creates() {
        let deleting = Facts {
            deleting: true,
            id: None,
            recorded_location: None,
            ..facts()
        };
        let found = machine("i-9", Phase::Running);
        let (action, asked) = run(&deleting, None, Some(found.clone()), HERE);
        assert_eq!(action, Action::Delete(found));
        assert_eq!(asked, ["location", "find"]);
        assert!(
            matches!(
                run(&deleting, None, None, "elsewhere").0,
                Action::LocationChanged { .. }
            ),
            "a lost create may have made a machine at the intended place"
        );
        assert_eq!(run(&deleting, None, None, HERE).0, Action::Release);
        let never = Facts {
            never_created: true,
            ..deleting
        };
        let (action, asked) = run(&never, None, None, HERE);
        assert_eq!(action, Action::Release);
        assert!(asked.is_empty(), "nothing to ask when nothing was sent");
    }

    #[test]
    fn orphan_asks_nothing() {
        let orphan = Facts {
            deleting: true,
            deletion_policy: DeletionPolicy::Orphan,
            ..facts()
        };
        let (action, asked) = run(&orphan, None, None, HERE);
        assert_eq!(action, Action::Orphan);
        assert!(asked.is_empty());
    }
}
