//! Who a machine belongs to (`vm-status.owner`) and launch-only parameters, against fixed
//! answers.

use super::*;

fn owned(phase: Phase, owner: &str) -> VmStatus {
    VmStatus {
        owner: Some(owner.into()),
        ..machine(phase)
    }
}

#[test]
fn a_machine_marked_by_another_uid_is_never_adopted() {
    for policy in [ManagementPolicy::Full, ManagementPolicy::ObserveOnly] {
        let adopt = Facts {
            id: None,
            recorded_location: None,
            ..with(|d| {
                d.external_id = Some("i-1".into());
                d.policy = policy;
            })
        };
        // Refused on the cloud's word alone: no VirtualMachine in the cluster records it.
        let (action, asked) = act(&adopt, Some(owned(Phase::Running, THEM)), None);
        assert_eq!(
            action,
            Action::AdoptionConflict {
                id: "i-1".into(),
                owner: Claimant::Uid(THEM.into())
            },
            "{policy:?}"
        );
        assert_eq!(asked, ["get", "claimed"]);
        // One that does is named instead.
        let seen = Observed {
            get: Some(Some(owned(Phase::Running, THEM))),
            claimed_by: Some(Some("ns/them".into())),
            ..Observed::default()
        };
        assert_eq!(
            decide(&adopt, &seen),
            Step::Act(Action::AdoptionConflict {
                id: "i-1".into(),
                owner: Claimant::VirtualMachine("ns/them".into())
            })
        );
        // Our own mark (a claim whose status write was lost) or none: adopted as before.
        for mark in [Some(US), None] {
            let found = VmStatus {
                owner: mark.map(Into::into),
                ..machine(Phase::Running)
            };
            assert!(matches!(
                act(&adopt, Some(found), None).0,
                Action::Adopt { .. }
            ));
        }
    }
}

#[test]
fn a_machine_claimed_by_another_uid_is_left_alone() {
    // Adopted at the same time by another VM that claimed it last: whatever the spec asks
    // (stop, resize), nothing is done to it.
    let busy = with(|d| {
        d.power = PowerState::Stopped;
        d.desired = size(2048);
        d.applied = None;
    });
    for phase in [Phase::Running, Phase::Stopped, Phase::Provisioning] {
        assert_eq!(
            act(&busy, Some(owned(phase, THEM)), None).0,
            Action::AdoptionConflict {
                id: "i-1".into(),
                owner: Claimant::Uid(THEM.into())
            },
            "{phase:?}"
        );
    }
    assert!(matches!(
        act(&busy, Some(owned(Phase::Running, US)), None).0,
        Action::Stop { .. }
    ));
    // ObserveOnly only mirrors, whoever manages the machine.
    let observe = with(|d| d.policy = ManagementPolicy::ObserveOnly);
    assert_eq!(
        act(&observe, Some(owned(Phase::Running, THEM)), None).0,
        Action::Observe(owned(Phase::Running, THEM))
    );
}

#[test]
fn deleting_a_vm_never_deletes_a_machine_marked_by_another_uid() {
    let deleting = Facts {
        deleting: true,
        ..facts()
    };
    let (action, asked) = act(&deleting, Some(owned(Phase::Running, THEM)), None);
    assert_eq!(
        action,
        Action::Disown {
            id: "i-1".into(),
            owner: THEM.into()
        }
    );
    assert_eq!(asked, ["get"]);
    assert_eq!(
        act(&deleting, Some(owned(Phase::Running, US)), None).0,
        Action::Delete(owned(Phase::Running, US).id),
        "our own machine is deleted"
    );
    assert_eq!(
        act(&deleting, Some(machine(Phase::Running)), None).0,
        Action::Delete(machine(Phase::Running).id),
        "an unmarked machine this VM recorded is deleted"
    );
    // A refused adoption recorded no id: deletion looks up by uid only, never at the machine.
    let refused = Facts {
        deleting: true,
        id: None,
        recorded_location: None,
        ..with(|d| d.external_id = Some("i-1".into()))
    };
    let (action, asked) = act(&refused, Some(owned(Phase::Running, THEM)), None);
    assert_eq!(action, Action::Release);
    assert!(!asked.contains(&"get"), "{asked:?}");
}

fn with_subnet(subnet: Option<&str>) -> AppliedSpec {
    AppliedSpec {
        parameters: subnet
            .map(|s| ("subnetId".to_owned(), s.to_owned()))
            .into_iter()
            .collect(),
        ..size(512)
    }
}

/// `facts` (a running machine made with `subnetId: subnet-a`, a spec asking `subnet-b`) are
/// refused before any call.
fn refused_from_a_to_b(facts: &Facts) {
    let (action, asked) = act(facts, Some(machine(Phase::Running)), None);
    assert_eq!(
        action,
        Action::LaunchOnly(vec![LaunchOnlyChange {
            name: "subnetId".into(),
            applied: Some("subnet-a".into()),
            desired: Some("subnet-b".into()),
        }])
    );
    assert!(asked.is_empty(), "asked {asked:?}");
}

#[test]
fn a_launch_only_parameter_change_is_refused_before_any_call() {
    let moved = with(|d| {
        d.launch_only = ["subnetId".to_owned()].into();
        d.applied = Some(with_subnet(Some("subnet-a")));
        d.desired = with_subnet(Some("subnet-b"));
    });
    refused_from_a_to_b(&moved);
    // Set or removed after creation is a change too.
    for (was, now) in [(None, Some("subnet-b")), (Some("subnet-a"), None)] {
        let changed = with(|d| {
            d.launch_only = ["subnetId".to_owned()].into();
            d.applied = Some(with_subnet(was));
            d.desired = with_subnet(now);
        });
        assert!(matches!(
            act(&changed, Some(machine(Phase::Running)), None).0,
            Action::LaunchOnly(_)
        ));
    }
    // While an update waits (its outcome not recorded, or a restart under Manual), the record
    // of what the machine was launched with still guards.
    let waiting = with(|d| {
        d.launch_only = ["subnetId".to_owned()].into();
        d.applied = Some(AppliedSpec {
            pending: true,
            ..with_subnet(Some("subnet-a"))
        });
        d.desired = AppliedSpec {
            memory_mib: 1024,
            ..with_subnet(Some("subnet-b"))
        };
        d.restart_required = true;
    });
    assert!(
        matches!(
            act(&waiting, Some(machine(Phase::Running)), None).0,
            Action::LaunchOnly(_)
        ),
        "a pending update does not open the guard"
    );
    // Reverted: nothing to refuse, nothing to update.
    let reverted = with(|d| {
        d.launch_only = ["subnetId".to_owned()].into();
        d.applied = Some(with_subnet(Some("subnet-a")));
        d.desired = with_subnet(Some("subnet-a"));
    });
    assert_eq!(
        act(&reverted, Some(machine(Phase::Running)), None).0,
        Action::Observe(machine(Phase::Running))
    );
    // A mutable parameter is an update, as before.
    let mutable = with(|d| {
        d.applied = Some(with_subnet(Some("subnet-a")));
        d.desired = with_subnet(Some("subnet-b"));
    });
    assert_eq!(
        act(&mutable, Some(machine(Phase::Running)), None).0,
        Action::Update(machine(Phase::Running))
    );
    // Not known what the machine was made with (made by an operator that did not record its
    // creates' parameters): not refused.
    let unknown = with(|d| {
        d.launch_only = ["subnetId".to_owned()].into();
        d.applied = None;
        d.create_parameters = None;
        d.desired = with_subnet(Some("subnet-b"));
    });
    assert_eq!(
        act(&unknown, Some(machine(Phase::Running)), None).0,
        Action::Update(machine(Phase::Running))
    );
    // Neither at creation (no machine yet) nor under ObserveOnly, nor when deleting.
    let mut fresh = Facts {
        id: None,
        never_created: true,
        ..moved.clone()
    };
    fresh.day2.create_parameters = Some(fresh.day2.desired.parameters.clone());
    assert!(matches!(act(&fresh, None, None).0, Action::Create { .. }));
    let observe = with(|d| {
        d.policy = ManagementPolicy::ObserveOnly;
        d.launch_only = ["subnetId".to_owned()].into();
        d.applied = Some(with_subnet(Some("subnet-a")));
        d.desired = with_subnet(Some("subnet-b"));
    });
    assert!(matches!(
        act(&observe, Some(machine(Phase::Running)), None).0,
        Action::Observe(_)
    ));
    let deleting = Facts {
        deleting: true,
        ..moved
    };
    assert!(matches!(
        act(&deleting, Some(machine(Phase::Running)), None).0,
        Action::Delete(_)
    ));
}

#[test]
fn a_machine_found_without_its_create_answer_keeps_its_launch_parameters() {
    let made_with = with_subnet(Some("subnet-a"));
    // A create was sent with subnet-a, its answer lost, the spec then changed to subnet-b.
    let lost = Facts {
        id: None,
        recorded_location: None,
        never_created: false,
        ..with(|d| {
            d.launch_only = ["subnetId".to_owned()].into();
            d.applied = None;
            d.create_parameters = Some(made_with.parameters.clone());
            d.desired = with_subnet(Some("subnet-b"));
        })
    };
    // No create is sent with parameters other than those recorded: they are recorded first.
    assert!(matches!(act(&lost, None, None).0, Action::Intend { .. }));
    // The machine found is recorded as is; once it is, the change is refused, not updated.
    let found = machine(Phase::Running);
    assert_eq!(
        act(&lost, None, Some(found.clone())).0,
        Action::Observe(found)
    );
    let recorded = Facts {
        id: Some("i-1".into()),
        recorded_location: lost.intended_location.clone(),
        ..lost.clone()
    };
    refused_from_a_to_b(&recorded);
    // An adopted machine was not made with them: unknown, not refused.
    let adopted = Facts {
        day2: Day2 {
            external_id: Some("i-1".into()),
            ..recorded.day2.clone()
        },
        ..recorded
    };
    assert!(!matches!(
        act(&adopted, Some(machine(Phase::Running)), None).0,
        Action::LaunchOnly(_)
    ));
}
