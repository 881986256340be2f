use super::*;

const HERE: &str = "aws:1:us-east-1";

/// A VM with a machine recorded at [`HERE`], settled: nothing pending, nothing day-2.
pub(super) fn facts() -> Facts {
    Facts {
        deleting: false,
        deletion_policy: DeletionPolicy::Delete,
        id: Some("i-1".into()),
        recorded_location: Some(HERE.into()),
        intended_location: Some(HERE.into()),
        accept_location: None,
        absence_wait: Duration::ZERO,
        never_created: false,
        sole_machine: None,
        // Recorded with the finalizer, as the spec's (no parameters).
        day2: Day2 {
            create_parameters: Some(BTreeMap::new()),
            ..Day2::default()
        },
    }
}

fn machine(id: &str, phase: Phase) -> VmStatus {
    VmStatus {
        id: id.into(),
        phase,
        addresses: Vec::new(),
        message: None,
        owner: None,
    }
}

/// Runs the decision loop against fixed answers, as the reconciler does against calls.
fn run(
    facts: &Facts,
    get: Option<VmStatus>,
    find: Option<VmStatus>,
    location: &str,
) -> (Action, Vec<&'static str>) {
    run_from(Observed::default(), facts, get, find, location)
}

/// [`run`], from what the decision has already `seen`.
pub(super) fn run_from(
    mut seen: Observed,
    facts: &Facts,
    get: Option<VmStatus>,
    find: Option<VmStatus>,
    location: &str,
) -> (Action, Vec<&'static str>) {
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
            Step::Claimed(_) => {
                asked.push("claimed");
                seen.claimed_by = Some(None);
            }
            Step::Act(action) => return (action, asked),
        }
        let (last, before) = asked.split_last().unwrap_or((&"", &[]));
        assert!(
            !before.contains(last),
            "asked the same thing twice: {asked:?}"
        );
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
        Action::Delete(m.id)
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
fn the_sole_machine_is_deleted_at_once_and_its_absence_confirmed_like_any() {
    let ours = Facts {
        deleting: true,
        sole_machine: Some("i-1".into()),
        ..facts()
    };
    let m = machine("i-1", Phase::Running);
    let (action, asked) = run(&ours, Some(m.clone()), None, HERE);
    assert_eq!(action, Action::Delete("i-1".into()));
    assert_eq!(
        asked,
        ["location"],
        "only where it was made (a cached answer)"
    );
    let (action, asked) = run(&ours, Some(m.clone()), None, "elsewhere");
    assert_eq!(
        asked,
        ["location", "get"],
        "moved: the id may name another machine"
    );
    assert_eq!(action, Action::Delete("i-1".into()));

    let after = || Observed {
        deleted: BTreeSet::from(["i-1".to_owned()]),
        ..Observed::default()
    };
    let (action, asked) = run_from(after(), &ours, None, None, HERE);
    assert_eq!(action, Action::Release);
    assert_eq!(asked, ["get", "location", "find"], "get and find confirm");
    assert_eq!(
        run_from(after(), &ours, Some(m.clone()), None, HERE).0,
        Action::AwaitDeletion(m),
        "still there after the delete: watch it go"
    );
    let other = machine("i-2", Phase::Running);
    assert_eq!(
        run_from(after(), &ours, None, Some(other), HERE).0,
        Action::Delete("i-2".into()),
        "find shows another machine: deleted too"
    );
    let young = Facts {
        absence_wait: Duration::from_secs(3),
        ..ours.clone()
    };
    assert!(matches!(
        run_from(after(), &young, None, None, HERE).0,
        Action::AwaitAbsence { .. }
    ));

    // A recorded machine this process did not make (or not alone) is observed first.
    let unknown = Facts {
        sole_machine: Some("i-0".into()),
        ..ours.clone()
    };
    let (_, asked) = run(&unknown, Some(machine("i-1", Phase::Running)), None, HERE);
    assert_eq!(asked, ["get"]);
}

#[test]
fn a_consistent_get_confirms_the_deletion_of_the_sole_machine() {
    let consistent = Day2 {
        capabilities: Capabilities {
            consistent_get: true,
            ..Capabilities::default()
        },
        ..Day2::default()
    };
    let ours = Facts {
        deleting: true,
        sole_machine: Some("i-1".into()),
        absence_wait: Duration::from_secs(3),
        day2: consistent,
        ..facts()
    };
    let after = || Observed {
        deleted: BTreeSet::from(["i-1".to_owned()]),
        ..Observed::default()
    };
    let (action, asked) = run_from(after(), &ours, None, None, HERE);
    assert_eq!(action, Action::Release, "no grace wait either");
    assert_eq!(asked, ["get", "location"], "no find");
    assert!(
        matches!(
            run_from(after(), &ours, None, None, "elsewhere").0,
            Action::LocationChanged { .. }
        ),
        "only where it was made"
    );
    let m = machine("i-1", Phase::Deleting);
    assert_eq!(
        run_from(after(), &ours, Some(m.clone()), None, HERE).0,
        Action::AwaitDeletion(m)
    );

    // Each condition alone is not enough: find is still asked.
    let lagging = Facts {
        day2: Day2::default(),
        ..ours.clone()
    };
    let not_sole = Facts {
        sole_machine: None,
        ..ours.clone()
    };
    for facts in [&lagging, &not_sole] {
        let (_, asked) = run_from(after(), facts, None, None, HERE);
        assert_eq!(asked, ["get", "location", "find"], "{facts:?}");
    }
    let (_, asked) = run_from(Observed::default(), &not_sole, None, None, HERE);
    assert_eq!(
        asked,
        ["get", "location", "find"],
        "not deleted in this decision"
    );
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
    assert_eq!(action, Action::Delete(found.id));
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

/// Two machines for one VM (a lost create made the second) and a cloud whose reads lag: each
/// read shows the machine not just deleted. Driven as the reconciler drives one decision
/// (`Action::Delete` records the id, then [`Observed::after_delete`]), every machine is asked
/// to delete once, and the decision then watches them go.
#[test]
fn each_machine_is_asked_to_delete_once_per_decision() {
    let mut facts = Facts {
        deleting: true,
        id: Some("i-a".into()),
        ..facts()
    };
    let mut seen = Observed::default();
    let mut deletes = Vec::new();
    let other = |id: &str| if id == "i-a" { "i-b" } else { "i-a" };
    let action = loop {
        let id = facts.id.clone().unwrap_or_default();
        match decide(&facts, &seen) {
            Step::Get(asked) => {
                let first = deletes.is_empty();
                seen.get = Some(first.then(|| machine(&asked, Phase::Running)));
            }
            Step::Find => seen.find = Some(Some(machine(other(&id), Phase::Running))),
            Step::Location => seen.location = Some(HERE.into()),
            Step::Act(Action::Delete(deleted)) => {
                assert!(
                    !deletes.contains(&deleted),
                    "{deleted} asked to delete twice: {deletes:?}"
                );
                deletes.push(deleted.clone());
                facts.id = Some(deleted.clone());
                seen = std::mem::take(&mut seen).after_delete(deleted);
            }
            Step::Act(action) => break action,
            Step::Claimed(_) => unreachable!("not adopting"),
        }
    };
    assert_eq!(deletes, ["i-a", "i-b"]);
    assert_eq!(
        action,
        Action::AwaitDeletion(machine("i-a", Phase::Running))
    );
}
