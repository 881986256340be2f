//! Building `VirtualMachine.status`, and the guarded status write.
//!
//! Status is written whole (`PUT .../status`) with the resourceVersion of the object read, the
//! write a controller-runtime operator makes: the API server rejects it when the object changed
//! since (a stale view never overwrites newer state), a field the operator stops sending is
//! removed, and a write that would change nothing is not sent at all (`effects.rs`).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::PostParams;
use kube::{Api, Resource, ResourceExt};

use crate::api::conditions::{self, READY, RESTART_REQUIRED, SYNCED, Status};
use crate::api::{
    SlimVirtualMachine, UpdateStrategy, VirtualMachine, VirtualMachineStatus, VmPhase,
};
use crate::controller::error::Error;
use crate::plugin::{Phase, VmStatus};

/// The status as last written, or an empty one.
pub fn current(vm: &VirtualMachine) -> VirtualMachineStatus {
    vm.status.clone().unwrap_or_default()
}

/// Mirrors what the provider reported and marks the reconcile successful.
pub fn observed(status: &mut VirtualMachineStatus, vm: &VirtualMachine, seen: &VmStatus) {
    let generation = vm.meta().generation;
    status.id = Some(seen.id.clone());
    status.phase = Some(VmPhase::from(seen.phase));
    status.addresses = seen.addresses.clone();
    status.last_error = None;
    status.observed_generation = generation;
    conditions::set(&mut status.conditions, ready(seen, generation));
    conditions::set(
        &mut status.conditions,
        conditions::new(SYNCED, Status::True, "ReconcileSucceeded", "", generation),
    );
}

/// The `Ready` condition for an observed machine.
fn ready(seen: &VmStatus, generation: Option<i64>) -> Condition {
    let (status, reason, default_message) = match seen.phase {
        Phase::Running => (Status::True, "Running", "the external machine is running"),
        Phase::Failed => (
            Status::False,
            "ProviderReportedFailure",
            "the provider reports that the machine failed",
        ),
        Phase::Pending => (Status::False, "Pending", "the external machine is pending"),
        Phase::Provisioning => (
            Status::False,
            "Provisioning",
            "the external machine is being provisioned",
        ),
        Phase::Stopped => (Status::False, "Stopped", "the external machine is stopped"),
        Phase::Deleting => (
            Status::False,
            "Deleting",
            "the external machine is being deleted",
        ),
        Phase::Unknown => (
            Status::Unknown,
            "Unknown",
            "the provider reports an unknown state",
        ),
    };
    let message = seen
        .message
        .clone()
        .unwrap_or_else(|| default_message.to_owned());
    conditions::new(READY, status, reason, message, generation)
}

/// Marks the reconcile failed with `reason` (an error class or configuration problem).
/// `Ready` keeps what was last observed; before any observation it becomes `False` too.
pub fn failed(
    status: &mut VirtualMachineStatus,
    vm: &VirtualMachine,
    reason: &str,
    message: String,
) {
    let generation = vm.meta().generation;
    status.last_error = Some(reason.to_owned());
    status.observed_generation = generation;
    if conditions::find(&status.conditions, READY).is_none() {
        conditions::set(
            &mut status.conditions,
            conditions::new(READY, Status::False, reason, message.clone(), generation),
        );
    }
    conditions::set(
        &mut status.conditions,
        conditions::new(SYNCED, Status::False, reason, message, generation),
    );
}

/// Sets `Ready=False` with the given reason without touching the rest.
pub fn not_ready(
    status: &mut VirtualMachineStatus,
    vm: &VirtualMachine,
    reason: &str,
    message: &str,
) {
    let generation = vm.meta().generation;
    conditions::set(
        &mut status.conditions,
        conditions::new(READY, Status::False, reason, message, generation),
    );
}

/// Sets `RestartRequired`: `True` while a change waits for a restart; once it no longer
/// waits, `False` if the condition was there (never added just to say `False`).
pub fn restart_required(status: &mut VirtualMachineStatus, vm: &VirtualMachine, pending: bool) {
    let generation = vm.meta().generation;
    let condition = if pending {
        let message = match vm.spec.update_strategy {
            UpdateStrategy::Restart => "the change is applied with stop, update, start",
            UpdateStrategy::Manual => {
                "the change can only be applied to a stopped machine: set spec.powerState to \
                 Stopped (then Running), or spec.updateStrategy to Restart"
            }
        };
        conditions::new(
            RESTART_REQUIRED,
            Status::True,
            "UpdateNeedsRestart",
            message,
            generation,
        )
    } else if conditions::find(&status.conditions, RESTART_REQUIRED).is_some() {
        conditions::new(
            RESTART_REQUIRED,
            Status::False,
            "NoRestartPending",
            "no change waits for a restart",
            generation,
        )
    } else {
        return;
    };
    conditions::set(&mut status.conditions, condition);
}

/// Writes `status` onto `vm` as read, guarded by its resourceVersion, unless it says what
/// `vm` already holds.
pub async fn write(
    api: &Api<SlimVirtualMachine>,
    vm: &VirtualMachine,
    status: &VirtualMachineStatus,
) -> Result<(), Error> {
    if vm
        .status
        .as_ref()
        .is_some_and(|old| conditions::same(old, status))
    {
        return Ok(());
    }
    let mut object = vm.clone();
    object.status = Some(status.clone());
    api.replace_status(
        &vm.name_any(),
        &PostParams::default(),
        &SlimVirtualMachine(object),
    )
    .await
    .map_err(Error::kube("write the VirtualMachine status"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::VirtualMachineSpec;

    fn vm(generation: i64) -> VirtualMachine {
        let mut vm = VirtualMachine::new("web", VirtualMachineSpec::new("aws", "ami-1", 1, "1Gi"));
        vm.metadata.generation = Some(generation);
        vm
    }

    fn seen(phase: Phase) -> VmStatus {
        VmStatus {
            id: "i-1".into(),
            phase,
            addresses: vec!["10.0.0.1".into()],
            message: None,
            owner: None,
        }
    }

    #[test]
    fn observed_running_is_ready_and_synced() {
        let mut s = VirtualMachineStatus {
            last_error: Some("TransientError".into()),
            ..Default::default()
        };
        observed(&mut s, &vm(3), &seen(Phase::Running));
        assert_eq!(s.id.as_deref(), Some("i-1"));
        assert_eq!(s.phase, Some(VmPhase::Running));
        assert_eq!(s.last_error, None);
        assert_eq!(s.observed_generation, Some(3));
        assert!(conditions::is_true(&s.conditions, READY));
        assert!(conditions::is_true(&s.conditions, SYNCED));
    }

    #[test]
    fn failure_keeps_ready_and_flips_synced() {
        let mut s = VirtualMachineStatus::default();
        observed(&mut s, &vm(1), &seen(Phase::Running));
        failed(&mut s, &vm(1), "Unauthorized", "no".into());
        assert!(conditions::is_true(&s.conditions, READY));
        let synced = conditions::find(&s.conditions, SYNCED).unwrap();
        assert_eq!(
            (synced.status.as_str(), synced.reason.as_str()),
            ("False", "Unauthorized")
        );
        assert_eq!(s.last_error.as_deref(), Some("Unauthorized"));
    }

    #[test]
    fn failure_before_any_observation_is_not_ready() {
        let mut s = VirtualMachineStatus::default();
        failed(&mut s, &vm(1), "ProviderConfigNotFound", "missing".into());
        assert!(!conditions::is_true(&s.conditions, READY));
        assert_eq!(
            conditions::find(&s.conditions, READY).unwrap().reason,
            "ProviderConfigNotFound"
        );
    }

    #[test]
    fn provider_failure_is_shown() {
        let mut s = VirtualMachineStatus::default();
        let mut failed_vm = seen(Phase::Failed);
        failed_vm.message = Some("host hardware failure".into());
        observed(&mut s, &vm(1), &failed_vm);
        let ready = conditions::find(&s.conditions, READY).unwrap();
        assert_eq!(ready.reason, "ProviderReportedFailure");
        assert_eq!(ready.message, "host hardware failure");
    }

    #[test]
    fn same_ignores_transition_times_only() {
        let mut a = VirtualMachineStatus::default();
        observed(&mut a, &vm(1), &seen(Phase::Running));
        let mut b = a.clone();
        b.conditions[0].last_transition_time = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::from_second(5).unwrap(),
        );
        assert!(conditions::same(&a, &b));
        b.addresses.push("10.0.0.2".into());
        assert!(!conditions::same(&a, &b));
    }

    mod properties {
        use proptest::prelude::*;

        use super::*;
        use crate::api::VirtualMachineStatus;
        use crate::controller::vm::decide::properties::phase;

        proptest! {
            #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

            /// Whatever a plugin answers (any id, addresses, message, owner, phase), and
            /// whatever the error text: status is built without a panic, and twice the same
            /// answer changes nothing the second time.
            #[test]
            fn no_plugin_answer_panics_status_building(
                id in ".{0,300}",
                phase in phase(),
                addresses in proptest::collection::vec(".{0,80}", 0..20),
                message in proptest::option::of(".{0,2000}"),
                owner in proptest::option::of(".{0,80}"),
                reason in "[A-Za-z]{0,20}",
                error in ".{0,2000}",
                generation in any::<i64>(),
                pending in any::<bool>(),
            ) {
                let seen = VmStatus { id, phase, addresses, message, owner };
                let vm = vm(generation);
                let mut status = VirtualMachineStatus::default();
                observed(&mut status, &vm, &seen);
                restart_required(&mut status, &vm, pending);
                let once = status.clone();
                observed(&mut status, &vm, &seen);
                restart_required(&mut status, &vm, pending);
                prop_assert!(conditions::same(&once, &status));
                failed(&mut status, &vm, &reason, error);
                not_ready(&mut status, &vm, &reason, "x");
            }
        }
    }
}
