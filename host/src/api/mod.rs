//! The `vmop.dev/v1alpha1` resources: `VirtualMachine` and `ProviderConfig`.

pub mod conditions;
pub mod parameters;
pub mod provider_config;
pub mod quantity;
pub mod slim;
pub mod virtual_machine;

pub use provider_config::*;
pub use slim::SlimVirtualMachine;
pub use virtual_machine::*;

/// Finalizer on every VirtualMachine whose external machine may exist.
pub const VM_FINALIZER: &str = "vmop.dev/cleanup";
/// Annotation on a VirtualMachine: the location its creates go to (see `controller::decide`).
pub const CREATE_LOCATION: &str = "vmop.dev/create-location";

/// Annotation on a VirtualMachine: `"true"` pauses it (no plugin call at all, `Synced=False`
/// reason `ReconcilePaused`); removing it resumes. Deletion waits too: the finalizer stays
/// until the VM is resumed (no silent orphan).
pub const PAUSED: &str = "vmop.dev/paused";
/// Annotation on a VirtualMachine: a new value reconciles it at once; the value handled is
/// echoed in `status.lastHandledReconcileAt`.
pub const RECONCILE_REQUESTED_AT: &str = "vmop.dev/reconcile-requested-at";
/// Annotation on a VirtualMachine: how often a settled machine is re-checked (a duration such
/// as `30s`, `5m` or `1h`, or a number of seconds), instead of `--resync-period`; never less
/// than `--min-poll-interval`.
pub const POLL_INTERVAL: &str = "vmop.dev/poll-interval";

/// Field manager of every write the operator makes.
pub const MANAGER: &str = "vmop";

/// Declares a `u32` field as `format: int32`: schemars says `uint32`, which Kubernetes does not
/// know and warns about. Every such field is bounded well below `i32::MAX`.
pub(crate) fn int32(schema: &mut schemars::Schema) {
    schema.insert("format".into(), "int32".into());
}

/// Declares a `u64` field as `format: int64` (schemars says `uint64`, unknown to Kubernetes).
pub(crate) fn int64(schema: &mut schemars::Schema) {
    schema.insert("format".into(), "int64".into());
}

/// A duration as annotation [`POLL_INTERVAL`] spells it: a number of seconds, or a number
/// followed by `s`, `m` or `h` (`90`, `30s`, `5m`, `1h`). `None` for anything else (the
/// annotation is then ignored).
pub fn parse_duration(text: &str) -> Option<std::time::Duration> {
    let text = text.trim();
    let (number, unit) = match text.char_indices().last()? {
        (i, 's') => (text.get(..i)?, 1),
        (i, 'm') => (text.get(..i)?, 60),
        (i, 'h') => (text.get(..i)?, 3600),
        _ => (text, 1),
    };
    let n: u64 = number.parse().ok()?;
    Some(std::time::Duration::from_secs(n.checked_mul(unit)?))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    #[test]
    fn poll_intervals_parse() {
        assert_eq!(super::parse_duration("90"), Some(Duration::from_secs(90)));
        assert_eq!(super::parse_duration("30s"), Some(Duration::from_secs(30)));
        assert_eq!(super::parse_duration("5m"), Some(Duration::from_secs(300)));
        assert_eq!(super::parse_duration("1h"), Some(Duration::from_secs(3600)));
        for bad in ["", "s", "1.5m", "-3s", "10d", "ten"] {
            assert_eq!(super::parse_duration(bad), None, "{bad}");
        }
    }
}
