//! An EC2 instance as the provider sees it, and its translation into the contract's `vm-status`.

use vmop_provider_sdk::time::rfc3339_ms;
use vmop_provider_sdk::{ListedMachine, Phase, VmStatus};

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Instance {
    pub id: String,
    /// `instanceState/name`: pending, running, shutting-down, terminated, stopping, stopped.
    pub state: String,
    /// `instanceType`, e.g. `t3.micro`: what `update` compares with the spec.
    pub instance_type: String,
    pub public_ip: Option<String>,
    pub private_ip: Option<String>,
    pub public_dns: Option<String>,
    pub private_dns: Option<String>,
    /// `stateReason/message`, e.g. why an instance stopped.
    pub state_reason: Option<String>,
    /// ISO 8601, compares as a string.
    pub launch_time: String,
    /// The `vmop.dev/uid` tag: the VM the instance belongs to (`vm-status.owner`).
    pub owner: Option<String>,
    /// The `vmop.dev/cluster` tag: the cluster that made (or claimed) the instance.
    pub cluster: Option<String>,
}

impl Instance {
    /// Gone, or on its way out: `get` reports it as absent.
    pub fn is_gone(&self) -> bool {
        matches!(self.state.as_str(), "terminated" | "shutting-down")
    }

    pub fn phase(&self) -> Phase {
        match self.state.as_str() {
            "pending" => Phase::Provisioning,
            "running" => Phase::Running,
            "stopping" | "stopped" => Phase::Stopped,
            "shutting-down" | "terminated" => Phase::Deleting,
            _ => Phase::Unknown,
        }
    }

    /// Public address first: it is what a workload outside the VPC can reach.
    pub fn to_status(&self) -> VmStatus {
        let addresses = [
            &self.public_ip,
            &self.private_ip,
            &self.public_dns,
            &self.private_dns,
        ]
        .into_iter()
        .flatten()
        .filter(|a| !a.is_empty())
        .cloned()
        .collect();
        VmStatus {
            id: self.id.clone(),
            phase: self.phase(),
            addresses,
            message: self.state_reason.clone().filter(|m| !m.is_empty()),
            owner: self.owner.clone().filter(|o| !o.is_empty()),
        }
    }

    /// The instance as `list` answers it: the status `get` answers, the cluster tag, and the
    /// launch time (`None` when EC2 wrote none this provider can read).
    pub fn to_listed(&self) -> ListedMachine {
        ListedMachine {
            status: self.to_status(),
            cluster: self.cluster.clone().filter(|c| !c.is_empty()),
            created_at_ms: rfc3339_ms(&self.launch_time),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_lists_addresses_most_useful_first() {
        let instance = Instance {
            id: "i-1".into(),
            state: "running".into(),
            public_ip: Some("54.0.0.1".into()),
            private_ip: Some("10.0.0.1".into()),
            public_dns: Some(String::new()),
            private_dns: Some("ip-10-0-0-1.ec2.internal".into()),
            ..Instance::default()
        };
        let status = instance.to_status();
        assert_eq!(status.id, "i-1");
        assert!(matches!(status.phase, Phase::Running));
        assert_eq!(
            status.addresses,
            ["54.0.0.1", "10.0.0.1", "ip-10-0-0-1.ec2.internal"]
        );
        assert_eq!(status.message, None);
        assert_eq!(status.owner, None, "an untagged instance is nobody's");
        let tagged = Instance {
            owner: Some("u-1".into()),
            ..instance
        };
        assert_eq!(tagged.to_status().owner.as_deref(), Some("u-1"));
    }

    #[test]
    fn listed_as_get_sees_it_with_cluster_and_launch_time() {
        let instance = Instance {
            id: "i-1".into(),
            state: "stopped".into(),
            private_ip: Some("10.0.0.1".into()),
            launch_time: "2026-11-29T21:00:00.000Z".into(),
            owner: Some("u-1".into()),
            cluster: Some("c-1".into()),
            ..Instance::default()
        };
        let listed = instance.to_listed();
        assert_eq!(
            format!("{:?}", listed.status),
            format!("{:?}", instance.to_status())
        );
        assert_eq!(listed.cluster.as_deref(), Some("c-1"));
        assert_eq!(listed.created_at_ms, Some(1_795_986_000_000));
        let bare = Instance {
            cluster: Some(String::new()),
            launch_time: "yesterday".into(),
            ..instance
        }
        .to_listed();
        assert_eq!((bare.cluster, bare.created_at_ms), (None, None));
    }

    #[test]
    fn maps_states() {
        let phase = |state: &str| {
            Instance {
                state: state.into(),
                ..Instance::default()
            }
            .phase()
        };
        assert!(matches!(phase("pending"), Phase::Provisioning));
        assert!(matches!(phase("stopped"), Phase::Stopped));
        assert!(matches!(phase("shutting-down"), Phase::Deleting));
        assert!(matches!(phase("weird"), Phase::Unknown));
        let gone = |state: &str| {
            Instance {
                state: state.into(),
                ..Instance::default()
            }
            .is_gone()
        };
        assert!(gone("terminated") && gone("shutting-down") && !gone("stopped"));
    }
}
