//! The contract suite: does a plugin keep `wit/provider.wit` against a live backend? Run by
//! `vmop plugin conformance` and called directly by tests.
//!
//! Every call goes through exactly the production path: a [`PluginRegistry`] loads the file
//! (digest, WIT check, `info()`), and the checks call the loaded [`Plugin`] in the sandbox with
//! the given [`CallContext`] (settings, secrets, egress allowlist, limits).
//!
//! # Checks
//!
//! In order ([`CHECKS`] names them; a report has one row per name):
//!
//! | check | passes when |
//! |---|---|
//! | `info` | the file loads: a component for this host's WIT major.minor, `info()` in bounds |
//! | `location` | `location` answers, twice the same |
//! | `find-before-create` | `find` of a fresh uid answers none |
//! | `get-unknown` | `get` of an id the cloud cannot know answers none |
//! | `create` | `create` answers a machine |
//! | `create-idempotent` | a second `create` with the same uid answers the same id |
//! | `find-after-create` | `find` by the uid answers that id (polled within the grace period) |
//! | `get-after-create` | `get` of the id answers it (polled within the grace period; on the first call when the plugin declares `consistent-get`) |
//! | `list-after-create` | (capability `list`) paging ends without a repeated cursor; the machine is listed once (polled within the grace period), as `get` sees it, with the config's cluster mark; no machine is listed twice, though a second one is created between the first two pages; no machine of another cluster is listed |
//! | `delete` | `delete` of the machine succeeds |
//! | `delete-again` | `delete` of the deleted machine succeeds |
//! | `delete-unknown` | `delete` of an id the cloud cannot know succeeds |
//! | `gone-after-delete` | `get` and `find` answer none (polled within the grace period) |
//! | `list-after-delete` | (capability `list`) the deleted machine is no longer listed (polled within the grace period) |
//! | `refused-credential` | with every secret value falsified, `find` fails `unauthorized`; skipped when there are no secrets or the backend accepts anything |
//! | `impossible-spec` | `create` with an image no cloud has fails `invalid-spec` |
//! | `output-bounds` | no call of the run answered outside the WIT bounds (the host's [`CallError::ContractViolation`]) |
//! | `call-time` | no call of the run hit its time limit |
//! | `cleanup` | every machine the run made is deleted |
//!
//! # Guarantees
//!
//! - A failing check fails the report ([`Report::passed`]) with a reason that names what was
//!   observed; later checks still run when they do not depend on it (tests:
//!   `tests/tests/providers/conformance.rs`, one per broken fixture guest).
//! - What the run created is deleted before [`run`] returns, whatever failed: every id a
//!   `create` answered and every machine `find` still reports for the run's uids
//!   (`conformance.rs` `broken_guests_fail_the_named_check` counts the backend's machines
//!   afterwards).
//! - A run uses fresh uids, so it never touches machines it did not make.

mod calls;
mod classes;
mod cleanup;
mod lifecycle;
mod listing;
mod report;
mod suite;

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::path::Path;
use std::time::{Duration, SystemTime};

pub use report::{CheckResult, Outcome, Report};

use vmop_runtime::registry::{PluginRegistry, SingleFileError};
use vmop_runtime::sandbox::{CallContext, CallError};

/// The checks, in the order they run.
pub const CHECKS: [&str; 19] = [
    "info",
    "location",
    "find-before-create",
    "get-unknown",
    "create",
    "create-idempotent",
    "find-after-create",
    "get-after-create",
    "list-after-create",
    "delete",
    "delete-again",
    "delete-unknown",
    "gone-after-delete",
    "list-after-delete",
    "refused-credential",
    "impossible-spec",
    "output-bounds",
    "call-time",
    "cleanup",
];

/// What to run the suite with.
#[derive(Debug, Clone)]
pub struct Options {
    /// Settings, secrets, egress allowlist and limits of every call: what a ProviderConfig
    /// would give.
    pub ctx: CallContext,
    /// An image the backend can boot (`spec.image` of the machine the suite creates).
    pub image: String,
    pub cpu: u32,
    pub memory_mib: u64,
    /// An image no backend has, for `impossible-spec`.
    pub impossible_image: String,
    /// How long a machine may take to show up after `create`, or to vanish after `delete`:
    /// the ProviderConfig's creation grace period (default 30 s).
    pub grace: Duration,
    /// Pause between two polls within the grace period.
    pub poll_interval: Duration,
}

impl Options {
    /// Defaults: 1 CPU, 512 MiB, 30 s grace polled every 250 ms.
    pub fn new(ctx: CallContext, image: impl Into<String>) -> Self {
        Options {
            ctx,
            image: image.into(),
            cpu: 1,
            memory_mib: 512,
            impossible_image: "vmop-conformance-no-such-image".to_owned(),
            grace: Duration::from_secs(30),
            poll_interval: Duration::from_millis(250),
        }
    }
}

/// Runs the suite on `path` (relative to the registry's plugin directory).
pub async fn run(registry: &PluginRegistry, path: &Path, options: &Options) -> Report {
    suite::Suite::new(options, nonce())
        .run(registry, path)
        .await
}

/// Runs the suite on `file` through a registry over its directory, with the host's default
/// engine (pooling allocator) sized for a few instances: what `vmop plugin conformance` does.
pub async fn run_file(file: &Path, options: &Options) -> Result<Report, SingleFileError> {
    let (registry, name) = PluginRegistry::over_file(file, options.ctx.limits)?;
    Ok(run(&registry, &name, options).await)
}

/// A fresh UUID-shaped string (version 4 layout): the run's uid, so it matches nothing that
/// exists and looks like the Kubernetes UIDs plugins are given.
fn nonce() -> String {
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let a = RandomState::new().hash_one(now);
    let b = RandomState::new().hash_one((now, a));
    format!(
        "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xfff,
        b >> 52,
        b & 0xffff_ffff_ffff
    )
}

/// Whether `error` is the provider's `unauthorized`.
fn is_unauthorized(error: &CallError) -> bool {
    matches!(
        error,
        CallError::Provider(vmop_runtime::types::ProviderError::Unauthorized(_))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nonces_are_fresh_and_uuid_shaped() {
        let a = nonce();
        assert_eq!(a.len(), 36, "{a}");
        assert_eq!(a.matches('-').count(), 4, "{a}");
        assert_ne!(a, nonce());
    }
}
