//! Properties of [`decide`] over every input a user, the API server or a plugin controls:
//! arbitrary facts (any ids, locations, durations, policies, capabilities, day-2 state) and
//! arbitrary answers to its questions. It never panics, it stops asking within a handful of
//! questions, and deleting never leads to a create.

use proptest::prelude::*;

use super::*;
use crate::api::{AppliedSpec, DeletionPolicy, ManagementPolicy, PowerState, UpdateStrategy};

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just("i-1".to_owned()),
        Just("uid-us".to_owned()),
        "[a-z0-9:/.-]{0,12}",
        ".{0,40}",
    ]
}

/// Any phase a plugin may answer (also used by the status properties).
pub(in crate::controller::vm) fn phase() -> impl Strategy<Value = Phase> {
    prop_oneof![
        Just(Phase::Pending),
        Just(Phase::Provisioning),
        Just(Phase::Running),
        Just(Phase::Stopped),
        Just(Phase::Failed),
        Just(Phase::Deleting),
        Just(Phase::Unknown),
    ]
}

fn machine() -> impl Strategy<Value = VmStatus> {
    (
        text(),
        phase(),
        proptest::collection::vec(text(), 0..3),
        proptest::option::of(text()),
        proptest::option::of(text()),
    )
        .prop_map(|(id, phase, addresses, message, owner)| VmStatus {
            id,
            phase,
            addresses,
            message,
            owner,
        })
}

fn applied() -> impl Strategy<Value = AppliedSpec> {
    (
        0u32..4,
        0u64..4096,
        proptest::collection::btree_map("[a-z]{1,3}", text(), 0..3),
        any::<bool>(),
    )
        .prop_map(|(cpu, memory_mib, parameters, pending)| AppliedSpec {
            cpu,
            memory_mib,
            parameters,
            pending,
        })
}

fn duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        Just(Duration::ZERO),
        Just(Duration::MAX),
        (0u64..100_000).prop_map(Duration::from_millis),
    ]
}

prop_compose! {
    fn day2()(
        uid in text(),
        paused in any::<bool>(),
        observe_only in any::<bool>(),
        stopped in any::<bool>(),
        restart in any::<bool>(),
        external_id in proptest::option::of(text()),
        desired in applied(),
        applied in proptest::option::of(applied()),
        create_parameters in proptest::option::of(
            proptest::collection::btree_map("[a-z]{1,3}", "[a-z]{0,3}", 0..3),
        ),
        restart_required in any::<bool>(),
        replacement_required in any::<bool>(),
        capabilities in (any::<bool>(), any::<bool>(), any::<bool>()),
        launch_only in proptest::collection::btree_set("[a-z]{1,3}", 0..3),
    ) -> Day2 {
        Day2 {
            uid,
            paused,
            policy: if observe_only { ManagementPolicy::ObserveOnly } else { ManagementPolicy::Full },
            power: if stopped { PowerState::Stopped } else { PowerState::Running },
            strategy: if restart { UpdateStrategy::Restart } else { UpdateStrategy::Manual },
            external_id,
            desired,
            applied,
            create_parameters,
            restart_required,
            replacement_required,
            capabilities: Capabilities {
                update: capabilities.0,
                power: capabilities.1,
                consistent_get: capabilities.2,
            },
            launch_only,
        }
    }
}

prop_compose! {
    fn facts()(
        deleting in any::<bool>(),
        orphan in any::<bool>(),
        id in proptest::option::of(text()),
        recorded_location in proptest::option::of(text()),
        intended_location in proptest::option::of(text()),
        accept_location in proptest::option::of(text()),
        absence_wait in duration(),
        never_created in any::<bool>(),
        sole_machine in proptest::option::of(text()),
        day2 in day2(),
    ) -> Facts {
        Facts {
            deleting,
            deletion_policy: if orphan { DeletionPolicy::Orphan } else { DeletionPolicy::Delete },
            id,
            recorded_location,
            intended_location,
            accept_location,
            absence_wait,
            never_created,
            sole_machine,
            day2,
        }
    }
}

/// Answers to every question `decide` may ask, drawn up front.
#[derive(Debug, Clone)]
struct Answers {
    get: Option<VmStatus>,
    find: Option<VmStatus>,
    location: String,
    claimed_by: Option<String>,
}

fn answers() -> impl Strategy<Value = Answers> {
    (
        proptest::option::of(machine()),
        proptest::option::of(machine()),
        text(),
        proptest::option::of(text()),
    )
        .prop_map(|(get, find, location, claimed_by)| Answers {
            get,
            find,
            location,
            claimed_by,
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4096, ..ProptestConfig::default() })]

    #[test]
    fn decide_always_ends_in_an_action_and_never_creates_while_deleting(
        facts in facts(),
        answers in answers(),
    ) {
        let mut seen = Observed::default();
        let mut asked = 0;
        let action = loop {
            match decide(&facts, &seen) {
                Step::Get(_) => seen.get = Some(answers.get.clone()),
                Step::Find => seen.find = Some(answers.find.clone()),
                Step::Location => seen.location = Some(answers.location.clone()),
                Step::Claimed(_) => seen.claimed_by = Some(answers.claimed_by.clone()),
                Step::Act(action) => break action,
            }
            asked += 1;
            prop_assert!(asked <= 4, "still asking after {asked} answers: {seen:?}");
        };
        if facts.deleting {
            prop_assert!(
                !matches!(action, Action::Create { .. } | Action::Intend { .. } | Action::Recreate { .. }),
                "deleting, yet {action:?}"
            );
        }
        if facts.day2.paused {
            prop_assert_eq!(action, Action::Paused);
        }
    }
}
