//! The day-2 rules of `decide` (`converge.rs`), against fixed answers.

use super::*;
use crate::api::{AppliedSpec, ManagementPolicy, PowerState, UpdateStrategy};

const HERE: &str = "aws:1:us-east-1";
/// This VM's uid, and another VM's.
const US: &str = "uid-us";
const THEM: &str = "uid-them";

fn size(memory_mib: u64) -> AppliedSpec {
    AppliedSpec {
        cpu: 1,
        memory_mib,
        ..AppliedSpec::default()
    }
}

fn facts() -> Facts {
    Facts {
        day2: Day2 {
            uid: US.into(),
            desired: size(512),
            applied: Some(size(512)),
            create_parameters: Some(BTreeMap::new()),
            capabilities: Capabilities {
                update: true,
                power: true,
                consistent_get: false,
            },
            ..Day2::default()
        },
        ..tests::facts()
    }
}

fn machine(phase: Phase) -> VmStatus {
    VmStatus {
        id: "i-1".into(),
        phase,
        addresses: Vec::new(),
        message: None,
        owner: None,
    }
}

/// The action for `facts` when `get` answers `seen` (and `find`, `location`, `claimed` answer
/// `found`, HERE and nobody), with what was asked.
fn act(
    facts: &Facts,
    seen: Option<VmStatus>,
    found: Option<VmStatus>,
) -> (Action, Vec<&'static str>) {
    tests::run_from(Observed::default(), facts, seen, found, HERE)
}

fn with(f: impl FnOnce(&mut Day2)) -> Facts {
    let mut facts = facts();
    f(&mut facts.day2);
    facts
}

#[test]
fn a_paused_vm_asks_nothing_even_when_deleting() {
    for deleting in [false, true] {
        let mut paused = with(|d| d.paused = true);
        paused.deleting = deleting;
        let (action, asked) = act(&paused, None, None);
        assert_eq!(action, Action::Paused);
        assert!(asked.is_empty());
    }
}

#[test]
fn power_state_is_followed_and_needs_the_power_capability() {
    let stop = with(|d| d.power = PowerState::Stopped);
    assert!(matches!(
        act(&stop, Some(machine(Phase::Running)), None).0,
        Action::Stop { restart: false, .. }
    ));
    assert_eq!(
        act(&stop, Some(machine(Phase::Stopped)), None).0,
        Action::Observe(machine(Phase::Stopped)),
        "a stopped VM that should be stopped is fine"
    );
    assert_eq!(
        act(&facts(), Some(machine(Phase::Stopped)), None).0,
        Action::Start(machine(Phase::Stopped))
    );
    assert_eq!(
        act(&facts(), Some(machine(Phase::Provisioning)), None).0,
        Action::Observe(machine(Phase::Provisioning)),
        "a machine on its way is left to arrive"
    );
    let powerless = with(|d| {
        d.power = PowerState::Stopped;
        d.capabilities.power = false;
    });
    assert!(matches!(
        act(&powerless, Some(machine(Phase::Running)), None).0,
        Action::Unsupported {
            capability: "power",
            ..
        }
    ));
}

#[test]
fn a_resize_is_an_update_then_waits_or_restarts_by_strategy() {
    let grow = with(|d| d.desired = size(1024));
    assert_eq!(
        act(&grow, Some(machine(Phase::Running)), None).0,
        Action::Update(machine(Phase::Running))
    );
    let waiting = with(|d| {
        d.desired = size(1024);
        d.restart_required = true;
    });
    assert_eq!(
        act(&waiting, Some(machine(Phase::Running)), None).0,
        Action::Observe(machine(Phase::Running)),
        "Manual: no stop, RestartRequired stays"
    );
    assert!(restart_pending(&waiting));
    let restart = with(|d| {
        d.desired = size(1024);
        d.restart_required = true;
        d.strategy = UpdateStrategy::Restart;
    });
    assert!(matches!(
        act(&restart, Some(machine(Phase::Running)), None).0,
        Action::Stop { restart: true, .. }
    ));
    // Stopped (by the restart, or by the user): update before starting it again.
    assert_eq!(
        act(&restart, Some(machine(Phase::Stopped)), None).0,
        Action::Update(machine(Phase::Stopped))
    );
    // Asked to stop while a restart waits: the stop comes first.
    let stop_too = with(|d| {
        d.desired = size(1024);
        d.restart_required = true;
        d.power = PowerState::Stopped;
    });
    assert!(matches!(
        act(&stop_too, Some(machine(Phase::Running)), None).0,
        Action::Stop { restart: false, .. }
    ));
    // Reverted: nothing pending any more.
    let reverted = with(|d| d.restart_required = true);
    assert!(!restart_pending(&reverted));
    assert_eq!(
        act(&reverted, Some(machine(Phase::Running)), None).0,
        Action::Observe(machine(Phase::Running))
    );
}

#[test]
fn a_change_that_needs_a_new_machine_is_not_asked_again_and_the_power_state_is_kept() {
    // `update` answered needs-replacement for this generation (after a restart stopped the
    // machine): no second update, no restart for it; the machine is started again.
    let replaced = with(|d| {
        d.desired = size(1024);
        d.strategy = UpdateStrategy::Restart;
        d.replacement_required = true;
    });
    assert_eq!(
        act(&replaced, Some(machine(Phase::Stopped)), None).0,
        Action::Start(machine(Phase::Stopped))
    );
    assert_eq!(
        act(&replaced, Some(machine(Phase::Running)), None).0,
        Action::ReplacementRequired(machine(Phase::Running))
    );
    let stopped = with(|d| {
        d.desired = size(1024);
        d.power = PowerState::Stopped;
        d.replacement_required = true;
    });
    assert_eq!(
        act(&stopped, Some(machine(Phase::Stopped)), None).0,
        Action::ReplacementRequired(machine(Phase::Stopped))
    );
    // Reverted: nothing is stale, the condition is cleared by observing.
    let reverted = with(|d| d.replacement_required = true);
    assert_eq!(
        act(&reverted, Some(machine(Phase::Running)), None).0,
        Action::Observe(machine(Phase::Running))
    );
}

#[test]
fn without_the_update_capability_a_resize_is_refused_not_called() {
    let grow = with(|d| {
        d.desired = size(1024);
        d.capabilities.update = false;
    });
    assert!(matches!(
        act(&grow, Some(machine(Phase::Running)), None).0,
        Action::Unsupported {
            capability: "update",
            ..
        }
    ));
    // An unknown `applied` asks nothing of a plugin that cannot update.
    let unknown = with(|d| {
        d.applied = None;
        d.capabilities.update = false;
    });
    assert_eq!(
        act(&unknown, Some(machine(Phase::Running)), None).0,
        Action::Observe(machine(Phase::Running))
    );
    // ... and one `update` of one that can.
    let unknown = with(|d| d.applied = None);
    assert_eq!(
        act(&unknown, Some(machine(Phase::Running)), None).0,
        Action::Update(machine(Phase::Running))
    );
}

#[test]
fn observe_only_never_writes_and_leaves_the_machine_at_deletion() {
    let observe = with(|d| {
        d.policy = ManagementPolicy::ObserveOnly;
        d.power = PowerState::Stopped;
        d.desired = size(2048);
    });
    assert_eq!(
        act(&observe, Some(machine(Phase::Running)), None).0,
        Action::Observe(machine(Phase::Running))
    );
    assert_eq!(
        act(&observe, None, None).0,
        Action::NotFound {
            id: Some("i-1".into())
        },
        "a vanished machine is never recreated"
    );
    let fresh = Facts {
        id: None,
        ..observe.clone()
    };
    let (action, asked) = act(&fresh, None, None);
    assert_eq!(action, Action::NotFound { id: None });
    assert_eq!(asked, ["find"], "never created");
    // Found by its uid: observed with where it is, so that the location is recorded.
    let (action, asked) = act(&fresh, None, Some(machine(Phase::Running)));
    assert_eq!(action, Action::Observe(machine(Phase::Running)));
    assert_eq!(asked, ["find", "location"]);
    let deleting = Facts {
        deleting: true,
        ..observe
    };
    let (action, asked) = act(&deleting, Some(machine(Phase::Running)), None);
    assert_eq!(action, Action::Orphan);
    assert!(asked.is_empty());
}

#[test]
fn adoption_checks_existence_and_ownership_first() {
    let adopt = Facts {
        id: None,
        recorded_location: None,
        ..with(|d| d.external_id = Some("i-9".into()))
    };
    let found = VmStatus {
        id: "i-9".into(),
        ..machine(Phase::Running)
    };
    let (action, asked) = act(&adopt, Some(found.clone()), None);
    assert_eq!(
        action,
        Action::Adopt {
            machine: found.clone(),
            location: HERE.into()
        }
    );
    assert_eq!(asked, ["get", "claimed", "location"]);
    assert_eq!(
        act(&adopt, None, None).0,
        Action::NotFound {
            id: Some("i-9".into())
        }
    );
    let mut seen = Observed {
        get: Some(Some(found)),
        claimed_by: Some(Some("ns/owner".into())),
        ..Observed::default()
    };
    assert_eq!(
        decide(&adopt, &seen),
        Step::Act(Action::AdoptionConflict {
            id: "i-9".into(),
            owner: Claimant::VirtualMachine("ns/owner".into())
        })
    );
    seen.claimed_by = None;
    assert_eq!(decide(&adopt, &seen), Step::Claimed("i-9".into()));
}

mod ownership;
