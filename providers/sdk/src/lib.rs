//! The guest side of the vmop plugin contract (`wit/provider.wit`), so that a provider crate is
//! only its cloud logic.
//!
//! A provider implements [`Provider`] and exports it with [`export_provider!`]:
//!
//! ```ignore
//! use vmop_provider_sdk::{Config, PluginInfo, Provider, ProviderError, VmSpec, VmStatus};
//!
//! struct MyCloud;
//!
//! impl Provider for MyCloud {
//!     fn info() -> PluginInfo { /* name, version, WIT version */ }
//!     fn create(config: &Config, spec: VmSpec) -> Result<VmStatus, ProviderError> { /* ... */ }
//!     fn get(config: &Config, id: &str) -> Result<Option<VmStatus>, ProviderError> { /* ... */ }
//!     fn delete(config: &Config, id: &str) -> Result<(), ProviderError> { /* ... */ }
//! }
//!
//! vmop_provider_sdk::export_provider!(MyCloud);
//! ```
//!
//! The crate is built as a `cdylib` for `wasm32-wasip2`; the result is a component the host
//! loads directly.

pub mod config;
pub mod error;
pub mod http;
pub mod log;
pub mod status;
pub mod url;

/// The bindings of world `vmop:provider/plugin`, generated once here.
///
/// Provider crates use the re-exports below; the module is public for [`export_provider!`].
#[doc(hidden)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "../../wit",
        world: "plugin",
        pub_export_macro: true,
        export_macro_name: "export",
        default_bindings_module: "::vmop_provider_sdk::bindings",
    });
}

use std::marker::PhantomData;

pub use bindings::vmop::provider::types::{
    Phase, PluginInfo, ProviderConfig, ProviderError, RateLimit, VmSpec, VmStatus,
};
pub use config::Config;

/// The version of `wit/provider.wit` this SDK was generated from; `info()` reports it.
pub const WIT_VERSION: &str = "0.1.0";

/// One cloud's implementation of the plugin contract.
///
/// Every call gets a fresh instance in the host: keep no state between calls.
pub trait Provider {
    /// Name, version and capabilities; the host checks `wit_version` against its own.
    fn info() -> PluginInfo;

    /// Creates the machine, or returns the one already created for `spec.uid`. Calling it twice
    /// with the same uid must not make a second machine.
    fn create(config: &Config, spec: VmSpec) -> Result<VmStatus, ProviderError>;

    /// Observes a machine; `None` when the cloud has no live machine with this id.
    fn get(config: &Config, id: &str) -> Result<Option<VmStatus>, ProviderError>;

    /// Deletes a machine; deleting one that is already gone succeeds.
    fn delete(config: &Config, id: &str) -> Result<(), ProviderError>;
}

/// Connects a [`Provider`] to the generated export trait. Used through [`export_provider!`].
#[doc(hidden)]
#[derive(Debug)]
pub struct Adapter<P>(PhantomData<P>);

impl<P: Provider> bindings::exports::vmop::provider::provider::Guest for Adapter<P> {
    fn info() -> PluginInfo {
        P::info()
    }

    fn create(config: ProviderConfig, spec: VmSpec) -> Result<VmStatus, ProviderError> {
        P::create(&Config::from(config), spec)
    }

    fn get(config: ProviderConfig, id: String) -> Result<Option<VmStatus>, ProviderError> {
        P::get(&Config::from(config), &id)
    }

    fn delete(config: ProviderConfig, id: String) -> Result<(), ProviderError> {
        P::delete(&Config::from(config), &id)
    }
}

/// Exports a type implementing [`Provider`] as the component's `vmop:provider/provider`.
/// Use it once, in the provider crate's `lib.rs`.
#[macro_export]
macro_rules! export_provider {
    ($provider:ty) => {
        type VmopProviderExport = $crate::Adapter<$provider>;
        $crate::bindings::export!(VmopProviderExport with_types_in $crate::bindings);
    };
}
