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
//! is never re-tagged. The call's cluster is tagged (`vmop.dev/cluster`, what `list` finds
//! instances by) on a claimed instance and on one of the VM's own that carries no cluster yet;
//! another cluster's mark is never replaced.

use vmop_provider_sdk::error::{permanent, transient};
use vmop_provider_sdk::tags::{TAG_CLUSTER, own};
use vmop_provider_sdk::{ProviderError, UpdateOutcome, VmSpec, info};

use crate::instance::Instance;
use crate::lookup;
use crate::query::{Api, Params};

/// The `CreateTags` parameters that mark `instance` as `spec`'s VM's, made by `cluster`, or
/// `None` when it is already. The cluster tag is added only to an instance that has none. An
/// instance marked with another uid is `transient`: the host asks only for a machine it saw
/// unmarked or its own, so another VM claimed it meanwhile, which the host's next `get` shows
/// (`AdoptionConflict`).
pub fn claim(
    instance: &Instance,
    spec: &VmSpec,
    cluster: &str,
) -> Result<Option<Params>, ProviderError> {
    let unmarked_cluster = instance.cluster.as_deref().is_none_or(str::is_empty);
    let mut tags = match instance.owner.as_deref().filter(|o| !o.is_empty()) {
        Some(owner) if owner == spec.uid => Vec::new(),
        Some(owner) => {
            return Err(transient(format!(
                "instance {} was claimed meanwhile by the VirtualMachine with uid {owner}; it is \
                 not re-tagged",
                instance.id
            )));
        }
        None => own(spec, ""),
    };
    if unmarked_cluster && !cluster.is_empty() {
        tags.push((TAG_CLUSTER, cluster));
    }
    if tags.is_empty() {
        return Ok(None);
    }
    let mut params = Params::new();
    params.push("ResourceId.1", instance.id.as_str());
    for (i, (key, value)) in tags.into_iter().enumerate() {
        params
            .push(format!("Tag.{}.Key", i + 1), key)
            .push(format!("Tag.{}.Value", i + 1), value);
    }
    Ok(Some(params))
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
    cluster: &str,
    desired_type: &str,
) -> Result<UpdateOutcome, ProviderError> {
    let instance = lookup::by_id(ec2, id)?
        .ok_or_else(|| transient(format!("instance {id} is not visible to DescribeInstances")))?;
    let plan = plan(&instance, desired_type)?;
    if let Some(params) = claim(&instance, spec, cluster)? {
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

    fn claimed(i: &Instance, cluster: &str) -> Option<Vec<(String, String)>> {
        claim(i, &spec(), cluster)
            .ok()
            .flatten()
            .map(|p| p.iter().cloned().collect())
    }

    fn pair(key: &str, value: &str) -> (String, String) {
        (key.to_owned(), value.to_owned())
    }

    #[test]
    fn an_unmarked_instance_is_tagged_ours_never_one_of_another_vm() {
        let mut i = instance("running", "t3.small");
        let params = claimed(&i, "c-1").unwrap_or_default();
        assert!(params.contains(&pair("ResourceId.1", "i-1")));
        assert!(params.contains(&pair("Tag.3.Key", "vmop.dev/uid")));
        assert!(params.contains(&pair("Tag.3.Value", "u-1")));
        assert!(params.contains(&pair("Tag.4.Key", "vmop.dev/cluster")));
        assert!(params.contains(&pair("Tag.4.Value", "c-1")));
        assert!(
            !params.iter().any(|(_, v)| v == "Name"),
            "the Name tag is the user's"
        );
        let no_cluster = claimed(&i, "").unwrap_or_default();
        assert_eq!(no_cluster.len(), 7, "{no_cluster:?}");
        i.owner = Some("u-1".into());
        i.cluster = Some("c-1".into());
        assert!(matches!(claim(&i, &spec(), "c-1"), Ok(None)));
        i.owner = Some("u-2".into());
        assert!(matches!(
            claim(&i, &spec(), "c-1"),
            Err(ProviderError::Transient(_))
        ));
    }

    #[test]
    fn the_cluster_is_added_where_missing_and_never_replaced() {
        let mut ours = instance("running", "t3.small");
        ours.owner = Some("u-1".into());
        assert_eq!(
            claimed(&ours, "c-1"),
            Some(vec![
                pair("ResourceId.1", "i-1"),
                pair("Tag.1.Key", "vmop.dev/cluster"),
                pair("Tag.1.Value", "c-1"),
            ])
        );
        assert!(matches!(claim(&ours, &spec(), ""), Ok(None)));
        let mut foreign = instance("running", "t3.small");
        foreign.cluster = Some("c-2".into());
        let params = claimed(&foreign, "c-1").unwrap_or_default();
        assert!(params.contains(&pair("Tag.3.Value", "u-1")));
        assert!(
            !params.iter().any(|(_, v)| v == "vmop.dev/cluster"),
            "{params:?}"
        );
        foreign.owner = Some("u-1".into());
        assert!(matches!(claim(&foreign, &spec(), "c-1"), Ok(None)));
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
