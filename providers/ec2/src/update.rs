//! `update`: bringing an instance to the type its VM's cpu, memory and `instanceType` ask for.
//!
//! Only the instance type is reconciled. Everything else `launch.rs` applies (image, subnet,
//! security groups, key, root volume, user data, tags) takes effect at launch only; the
//! provider does not declare the `replace` capability, so the host never expects a
//! `needs-replacement` for those.

use vmop_provider_sdk::error::{permanent, transient};
use vmop_provider_sdk::{ProviderError, UpdateOutcome, info};

use crate::instance::Instance;
use crate::lookup;
use crate::query::{Api, Params};

/// What to do about one instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// It already has the desired type.
    Nothing,
    /// It is stopped: `ModifyInstanceAttribute` now.
    Modify,
    /// EC2 changes the type of a stopped instance only: the host stops it, calls again, starts.
    Restart,
}

pub fn plan(instance: &Instance, desired_type: &str) -> Result<Plan, ProviderError> {
    if instance.is_gone() {
        return Err(permanent(format!(
            "instance {} is {} and cannot be updated",
            instance.id, instance.state
        )));
    }
    Ok(if instance.instance_type == desired_type {
        Plan::Nothing
    } else if instance.state == "stopped" {
        Plan::Modify
    } else {
        Plan::Restart
    })
}

/// Plans against the live instance and carries the plan out.
///
/// An instance EC2 does not show is `transient`: the host calls `update` only for a machine it
/// has seen, so this is read-after-write lag or a deletion the next `get` will report.
pub fn apply(ec2: &Api, id: &str, desired_type: &str) -> Result<UpdateOutcome, ProviderError> {
    let instance = lookup::by_id(ec2, id)?
        .ok_or_else(|| transient(format!("instance {id} is not visible to DescribeInstances")))?;
    match plan(&instance, desired_type)? {
        Plan::Nothing => Ok(UpdateOutcome::Applied),
        Plan::Restart => Ok(UpdateOutcome::NeedsRestart),
        Plan::Modify => {
            let mut params = Params::new();
            params
                .push("InstanceId", id)
                .push("InstanceType.Value", desired_type);
            ec2.call("ModifyInstanceAttribute", &params)?;
            info!(
                "changed instance {id} from {} to {desired_type}",
                instance.instance_type
            );
            Ok(UpdateOutcome::Applied)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn instance(state: &str, instance_type: &str) -> Instance {
        Instance {
            id: "i-1".into(),
            state: state.into(),
            instance_type: instance_type.into(),
            ..Instance::default()
        }
    }

    #[test]
    fn same_type_needs_nothing_in_any_live_state() {
        for state in ["pending", "running", "stopping", "stopped"] {
            assert_eq!(
                plan(&instance(state, "t3.small"), "t3.small").ok(),
                Some(Plan::Nothing),
                "{state}"
            );
        }
    }

    #[test]
    fn another_type_is_modified_only_when_stopped() {
        assert_eq!(
            plan(&instance("stopped", "t3.small"), "t3.large").ok(),
            Some(Plan::Modify)
        );
        for state in ["pending", "running", "stopping"] {
            assert_eq!(
                plan(&instance(state, "t3.small"), "t3.large").ok(),
                Some(Plan::Restart),
                "{state}"
            );
        }
    }

    #[test]
    fn a_terminated_instance_cannot_be_updated() {
        for state in ["shutting-down", "terminated"] {
            assert!(matches!(
                plan(&instance(state, "t3.small"), "t3.small"),
                Err(ProviderError::Permanent(_))
            ));
        }
    }
}
