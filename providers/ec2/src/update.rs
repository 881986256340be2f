//! `update`: bringing an instance to the type its VM's cpu, memory and `instanceType` ask for,
//! and claiming it for the VM.
//!
//! Only the instance type is reconciled. Everything else `launch.rs` applies (image, subnet,
//! security groups, key, root volume, user data, tags) takes effect at launch only: those
//! parameters are declared launch-only (`mutable: false`, `parameters.rs`), so the host refuses
//! a change of them instead of calling `update`; the provider does not declare the `replace`
//! capability, so the host never expects a `needs-replacement`.
//!
//! An instance without vmop's `vmop.dev/uid` tag (one made outside vmop and adopted) is tagged
//! with the VM's namespace, name and uid first (`CreateTags`), so that `get` reports it as the
//! VM's (`vm-status.owner`) and a second VM naming it is refused. One tagged with another uid
//! is never re-tagged.

use vmop_provider_sdk::error::{permanent, transient};
use vmop_provider_sdk::tags::own;
use vmop_provider_sdk::{ProviderError, UpdateOutcome, VmSpec, info};

use crate::instance::Instance;
use crate::lookup;
use crate::query::{Api, Params};

/// The `CreateTags` parameters that mark `instance` as `spec`'s VM's, or `None` when it is
/// already. An instance marked with another uid is `transient`: the host asks only for a
/// machine it saw unmarked or its own, so another VM claimed it meanwhile, which the host's
/// next `get` shows (`AdoptionConflict`).
pub fn claim(instance: &Instance, spec: &VmSpec) -> Result<Option<Params>, ProviderError> {
    match instance.owner.as_deref().filter(|o| !o.is_empty()) {
        Some(owner) if owner == spec.uid => Ok(None),
        Some(owner) => Err(transient(format!(
            "instance {} was claimed meanwhile by the VirtualMachine with uid {owner}; it is not \
             re-tagged",
            instance.id
        ))),
        None => {
            let mut params = Params::new();
            params.push("ResourceId.1", instance.id.as_str());
            for (i, (key, value)) in own(spec).into_iter().enumerate() {
                params
                    .push(format!("Tag.{}.Key", i + 1), key)
                    .push(format!("Tag.{}.Value", i + 1), value);
            }
            Ok(Some(params))
        }
    }
}

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
pub fn apply(
    ec2: &Api,
    id: &str,
    spec: &VmSpec,
    desired_type: &str,
) -> Result<UpdateOutcome, ProviderError> {
    let instance = lookup::by_id(ec2, id)?
        .ok_or_else(|| transient(format!("instance {id} is not visible to DescribeInstances")))?;
    let plan = plan(&instance, desired_type)?;
    if let Some(params) = claim(&instance, spec)? {
        ec2.call("CreateTags", &params)?;
        info!("tagged instance {id} as {}/{}'s", spec.namespace, spec.name);
    }
    match plan {
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

    fn spec() -> VmSpec {
        VmSpec {
            name: "web".into(),
            namespace: "team-a".into(),
            uid: "u-1".into(),
            image: "ami-1".into(),
            cpu: 1,
            memory_mib: 512,
            user_data: None,
            labels: Vec::new(),
            parameters: Vec::new(),
        }
    }

    #[test]
    fn an_unmarked_instance_is_tagged_ours_never_one_of_another_vm() {
        let mut i = instance("running", "t3.small");
        let params = claim(&i, &spec())
            .ok()
            .flatten()
            .map(|p| p.iter().cloned().collect::<Vec<_>>());
        let params = params.unwrap_or_default();
        assert!(params.contains(&("ResourceId.1".into(), "i-1".into())));
        assert!(params.contains(&("Tag.3.Key".into(), "vmop.dev/uid".into())));
        assert!(params.contains(&("Tag.3.Value".into(), "u-1".into())));
        assert!(
            !params.iter().any(|(_, v)| v == "Name"),
            "the Name tag is the user's"
        );
        i.owner = Some("u-1".into());
        assert!(matches!(claim(&i, &spec()), Ok(None)));
        i.owner = Some("u-2".into());
        assert!(matches!(
            claim(&i, &spec()),
            Err(ProviderError::Transient(_))
        ));
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
