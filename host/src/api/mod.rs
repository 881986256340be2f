//! The `vmop.dev/v1alpha1` resources: `VirtualMachine` and `ProviderConfig`.

pub mod conditions;
pub mod duration;
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
/// Annotation on a VirtualMachine: the location its creates go to (see `controller::vm::decide`).
pub const CREATE_LOCATION: &str = "vmop.dev/create-location";
/// Annotation on a VirtualMachine: the `spec.parameters` its creates send (a JSON object of
/// strings), written with [`CREATE_LOCATION`] before any create. A machine found after a
/// create whose answer was lost was made with these: its launch-only parameters are known even
/// though `status.applied` is not.
pub const CREATE_PARAMETERS: &str = "vmop.dev/create-parameters";

/// The value of [`CREATE_PARAMETERS`] recording `parameters`.
pub fn create_parameters_value(parameters: &std::collections::BTreeMap<String, String>) -> String {
    serde_json::to_string(parameters).unwrap_or_default()
}

/// Annotation on a VirtualMachine: `"true"` pauses it (no plugin call at all, `Synced=False`
/// reason `ReconcilePaused`); removing it resumes. Deletion waits too: the finalizer stays
/// until the VM is resumed (no silent orphan).
pub const PAUSED: &str = "vmop.dev/paused";
/// Annotation on a VirtualMachine: a new value reconciles it at once; the value handled is
/// echoed in `status.lastHandledReconcileAt`.
pub const RECONCILE_REQUESTED_AT: &str = "vmop.dev/reconcile-requested-at";
/// Annotation on a VirtualMachine: how often a settled machine is re-checked, in the
/// [`duration`] grammar of the flags (`500ms`, `30s`, `5m`, `1h`, or a number of seconds),
/// instead of `--resync-period`; never less than `--min-poll-interval`. A value outside the
/// grammar is refused before any call: `Synced=False`, reason `InvalidSpec`.
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
