//! Leader election on a `coordination.k8s.io/v1` Lease, so that of several replicas exactly one
//! reconciles.
//!
//! No maintained crate fit when this was written: `kube-runtime` 5 has no elector,
//! `kube-leader-election` targets kube 4, and `kube-lease-manager` (kube 5) keeps reporting
//! leadership while its renewals fail, which breaks the first guarantee below. This follows
//! client-go's `leaderelection` package.
//!
//! ```no_run
//! # async fn example(client: kube::Client) -> Result<(), vmop::leader::LeaderError> {
//! use vmop::leader::{LeaderElector, LeaseConfig};
//! let config = LeaseConfig::new("vmop", "vmop-system", vmop::leader::default_identity());
//! let leadership = LeaderElector::new(client, config)?.start();
//! let mut leading = leadership.subscribe();
//! if leading.wait_for(|l| *l).await.is_ok() {
//!     tokio::select! {
//!         _ = async { /* run the controllers */ } => {}
//!         // Lost: the controllers' future is dropped here, cancelling every reconcile.
//!         _ = leading.wait_for(|l| !*l) => {}
//!     }
//! }
//! leadership.release().await
//! # }
//! ```
//!
//! # Guarantees
//!
//! - The leadership channel says `true` only while this process holds the Lease: it turns
//!   `false` as soon as a renewal finds another holder, and at the latest `renew_deadline` after
//!   the start of the last successful renewal, whatever blocks the renewals (errors, a partition,
//!   a hung API call). Other candidates take over no earlier than `lease_duration` after they
//!   last saw the Lease change, which is after that renewal started; so as long as
//!   `renew_deadline < lease_duration` and clocks run at the same *rate*, two processes never
//!   lead at once.
//! - Of two candidates writing the same version of the Lease, the API server accepts one: every
//!   write carries the `resourceVersion` it read (or is a create).
//! - [`Leadership::release`] publishes `false` and then clears the holder, so a standby takes
//!   over at its next attempt (within `retry_period`) rather than after `lease_duration`.
//! - A leader that stepped down campaigns again.
//!
//! # Assumptions
//!
//! - Identities are unique per process ([`default_identity`] adds a random suffix to the pod
//!   name): two processes with one identity would both consider themselves the holder.
//! - The caller stops reconciling as soon as the channel turns `false`, without waiting for
//!   reconciles in flight to finish (they are idempotent and may be cut at any await point).
//!
//! # Caveats
//!
//! - Expiry is judged on this process's monotonic clock from when it last saw the record
//!   change, never from `renewTime`, so wall-clock skew between nodes is harmless. A process
//!   frozen (SIGSTOP, a VM pause) past its Lease checks [`Validity`] (the last renewal's
//!   deadline, by its own monotonic clock) before it acts again, so it stops before the
//!   election task has even run (`tests/tests/operator/operator_freeze.rs`); only a call
//!   already in flight when it froze can reach the cloud after another holder started, as with
//!   every lease-based election.
//! - A missing Lease is free: if someone deletes it while a leader holds it, a candidate may
//!   create it at once, and the old leader steps down at its next renewal (within
//!   `retry_period`). Do not delete the Lease of a running operator.

mod assignment;
mod elector;
pub mod fence;
mod held;
pub mod layout;
mod partition;
mod record;
pub mod shards;
mod validity;

use std::time::Duration;

pub use elector::{LeaderElector, Leadership};
pub use fence::Fence;
pub use held::Holding;
pub use validity::Validity;

/// Which Lease to campaign for, as whom, and how fast.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseConfig {
    pub name: String,
    pub namespace: String,
    /// Unique per process; written to `spec.holderIdentity`.
    pub identity: String,
    /// How long a holder's lease is valid after its last renewal, for the others.
    pub lease_duration: Duration,
    /// How long the leader keeps leading without a successful renewal.
    pub renew_deadline: Duration,
    /// Interval of renewals while leading, and of attempts while waiting.
    pub retry_period: Duration,
}

impl LeaseConfig {
    /// client-go's and controller-runtime's defaults: 15 s lease, 10 s renew deadline, 2 s retry.
    pub fn new(
        name: impl Into<String>,
        namespace: impl Into<String>,
        identity: impl Into<String>,
    ) -> Self {
        LeaseConfig {
            name: name.into(),
            namespace: namespace.into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }

    /// `0 < retry_period < renew_deadline < lease_duration`, and names present.
    pub fn validate(&self) -> Result<(), LeaderError> {
        let invalid = |reason| Err(LeaderError::InvalidConfig { reason });
        if self.name.is_empty() || self.namespace.is_empty() {
            return invalid("the lease name and namespace must not be empty");
        }
        if self.identity.is_empty() {
            return invalid("the identity must not be empty");
        }
        if self.retry_period.is_zero() {
            return invalid("the retry period must be positive");
        }
        if self.retry_period >= self.renew_deadline {
            return invalid("the retry period must be shorter than the renew deadline");
        }
        if self.renew_deadline >= self.lease_duration {
            return invalid("the renew deadline must be shorter than the lease duration");
        }
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    #[error("invalid leader election settings: {reason}")]
    InvalidConfig { reason: &'static str },
    #[error("failed to release the lease")]
    Release(#[source] kube::Error),
    #[error("releasing the lease took longer than {0:?}")]
    ReleaseTimeout(Duration),
    #[error("the leader election task ended abnormally")]
    Task(#[source] tokio::task::JoinError),
}

/// `<pod name or host name>_<random hex>`: unique even when a restarted pod keeps its name
/// while its predecessor's lease is still valid.
pub fn default_identity() -> String {
    use std::hash::{BuildHasher, Hasher};
    let host = std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
        })
        .unwrap_or_else(|| "vmop".to_owned());
    // RandomState is seeded randomly per process; mix in the pid and time for good measure.
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    if let Ok(since_epoch) = std::time::UNIX_EPOCH.elapsed() {
        hasher.write_u128(since_epoch.as_nanos());
    }
    format!("{host}_{:016x}", hasher.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bad_timings_are_refused() {
        let config = LeaseConfig::new("vmop", "vmop-system", "a");
        assert!(config.validate().is_ok());
        let cases = [
            LeaseConfig {
                renew_deadline: config.lease_duration,
                ..config.clone()
            },
            LeaseConfig {
                retry_period: config.renew_deadline,
                ..config.clone()
            },
            LeaseConfig {
                retry_period: Duration::ZERO,
                ..config.clone()
            },
            LeaseConfig {
                identity: String::new(),
                ..config.clone()
            },
        ];
        for case in cases {
            assert!(
                matches!(case.validate(), Err(LeaderError::InvalidConfig { .. })),
                "{case:?}"
            );
        }
    }

    #[test]
    fn identities_differ_between_calls() {
        let a = default_identity();
        let b = default_identity();
        assert_ne!(a, b);
        assert!(a.contains('_'));
    }
}
