//! The `vmop.dev/v1alpha1` resources: `VirtualMachine` and `ProviderConfig`.

pub mod conditions;
pub mod provider_config;
pub mod quantity;
pub mod virtual_machine;

pub use provider_config::*;
pub use virtual_machine::*;

/// Finalizer on every VirtualMachine whose external machine may exist.
pub const VM_FINALIZER: &str = "vmop.dev/cleanup";

/// Field manager of every write the operator makes.
pub const MANAGER: &str = "vmop";
