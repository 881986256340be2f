//! The `vmop.dev/v1alpha1` resources: `VirtualMachine` and `ProviderConfig`.

pub mod conditions;
pub mod provider_config;
pub mod quantity;
pub mod virtual_machine;

pub use provider_config::*;
pub use virtual_machine::*;

/// Finalizer on every VirtualMachine whose external machine may exist.
pub const VM_FINALIZER: &str = "vmop.dev/cleanup";
/// Annotation on a VirtualMachine: the location its creates go to (see `controller::decide`).
pub const CREATE_LOCATION: &str = "vmop.dev/create-location";

/// Field manager of every write the operator makes.
pub const MANAGER: &str = "vmop";

/// Declares a `u32` field as `format: int32`: schemars says `uint32`, which Kubernetes does not
/// know and warns about. Every such field is bounded well below `i32::MAX`.
pub(crate) fn int32(schema: &mut schemars::Schema) {
    schema.insert("format".into(), "int32".into());
}
