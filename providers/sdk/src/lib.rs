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
//!     fn info() -> PluginInfo { /* name, version, WIT version, capabilities, parameters */ }
//!     fn location(config: &Config) -> Result<String, ProviderError> { /* account + region */ }
//!     fn find(config: &Config, uid: &str) -> Result<Option<VmStatus>, ProviderError> { /* */ }
//!     fn create(config: &Config, spec: VmSpec) -> Result<VmStatus, ProviderError> { /* ... */ }
//!     fn get(config: &Config, id: &str) -> Result<Option<VmStatus>, ProviderError> { /* ... */ }
//!     fn delete(config: &Config, id: &str) -> Result<(), ProviderError> { /* ... */ }
//!     // update, start, stop and list default to "not supported"; see their capabilities.
//! }
//!
//! vmop_provider_sdk::export_provider!(MyCloud);
//! ```
//!
//! The crate is built as a `cdylib` for `wasm32-wasip2`; the result is a component the host
//! loads directly. Everything a provider returns passes through [`bounds`] on its way out, so
//! an SDK provider cannot break the contract's output bounds.
//!
//! # Contract versions
//!
//! By default the SDK speaks the repository's contract, `wit/provider.wit` ([`WIT_VERSION`]).
//! With the feature `contract-0-2` it speaks the frozen 0.2 contract
//! (`wit/compat/0.2/provider.wit`) instead, for plugins that must load in hosts older than 0.3:
//! the same [`Provider`] trait, but the component exports no `list` (the capability `list` is
//! dropped from `info()`), and [`Config::cluster`] is always empty (0.2 hosts send none), so
//! [`tags::own`] adds no cluster tag. [`ListedMachine`] and [`Page`] are then the SDK's own
//! types, so one provider source builds for both contracts.

mod adapter;
pub mod bounds;
pub mod config;
pub mod error;
pub mod http;
#[cfg(feature = "json")]
pub mod json;
pub mod log;
pub mod retry_after;
#[cfg(feature = "sigv4")]
pub mod sigv4;
pub mod status;
pub mod tags;
pub mod time;
pub mod url;
#[cfg(feature = "xml")]
pub mod xml;

/// The bindings of world `vmop:provider/plugin`, generated once here.
///
/// Provider crates use the re-exports below; the module is public for [`export_provider!`].
/// A provider crate names this SDK `vmop_provider_sdk` (the export macro's path), also when it
/// depends on the `contract-0-2` build under another package name.
#[doc(hidden)]
#[cfg(not(feature = "contract-0-2"))]
pub mod bindings {
    wit_bindgen::generate!({
        path: "../../wit",
        world: "plugin",
        pub_export_macro: true,
        export_macro_name: "export",
        default_bindings_module: "::vmop_provider_sdk::bindings",
    });
}

/// The bindings of world `vmop:provider/plugin@0.2.0` (the frozen contract; see the crate docs).
#[doc(hidden)]
#[cfg(feature = "contract-0-2")]
pub mod bindings {
    wit_bindgen::generate!({
        path: "../../wit/compat/0.2",
        world: "plugin",
        pub_export_macro: true,
        export_macro_name: "export",
        default_bindings_module: "::vmop_provider_sdk::bindings",
    });
}

#[doc(hidden)]
pub use adapter::Adapter;
#[cfg(not(feature = "contract-0-2"))]
pub use bindings::vmop::provider::types::{ListedMachine, Page};
pub use bindings::vmop::provider::types::{
    Parameter, ParameterKind, Phase, PluginInfo, ProviderConfig, ProviderError, RateLimit,
    UpdateOutcome, VmSpec, VmStatus,
};
#[cfg(feature = "contract-0-2")]
pub use compat::{ListedMachine, Page};
pub use config::Config;

/// The version of the contract this SDK was generated from; `info()` reports it.
#[cfg(not(feature = "contract-0-2"))]
pub const WIT_VERSION: &str = "0.3.0";
/// The version of the contract this SDK was generated from; `info()` reports it.
#[cfg(feature = "contract-0-2")]
pub const WIT_VERSION: &str = "0.2.0";

/// The capability of `list`; a `contract-0-2` build drops it from `info()`.
pub const CAPABILITY_LIST: &str = "list";

/// `listed-machine` and `page` for a `contract-0-2` build, whose contract has neither: a
/// provider's `list` still compiles, and nothing calls it.
#[cfg(feature = "contract-0-2")]
mod compat {
    use crate::VmStatus;

    /// One machine of a `list` page.
    #[derive(Debug, Clone)]
    pub struct ListedMachine {
        pub status: VmStatus,
        pub cluster: Option<String>,
        pub created_at_ms: Option<u64>,
    }

    /// One page of `list`.
    #[derive(Debug, Clone)]
    pub struct Page {
        pub machines: Vec<ListedMachine>,
        pub next: Option<String>,
    }
}

/// One cloud's implementation of the plugin contract.
///
/// Every call gets a fresh instance in the host: keep no state between calls. The optional
/// operations (`update`, `start`, `stop`, `list`) are called only when [`Provider::info`] lists
/// their capability; their defaults answer `permanent` for a host that calls them anyway.
pub trait Provider {
    /// Name, version, capabilities and parameters; the host checks `wit_version` against its
    /// own.
    fn info() -> PluginInfo;

    /// A stable name for where this config's machines live (account, region, endpoint), at
    /// most 512 bytes. Read-only. The host compares it with the one recorded at creation
    /// before it takes a missing machine as gone.
    fn location(config: &Config) -> Result<String, ProviderError>;

    /// The live machine created for `uid`, if any. Read-only: never creates.
    fn find(config: &Config, uid: &str) -> Result<Option<VmStatus>, ProviderError>;

    /// Creates the machine, or returns the one already created for `spec.uid`. Calling it twice
    /// with the same uid must not make a second machine.
    fn create(config: &Config, spec: VmSpec) -> Result<VmStatus, ProviderError>;

    /// Observes a machine; `None` when the cloud has no live machine with this id.
    fn get(config: &Config, id: &str) -> Result<Option<VmStatus>, ProviderError>;

    /// Makes the machine match a changed spec (capability `update`).
    fn update(_config: &Config, _id: &str, _spec: VmSpec) -> Result<UpdateOutcome, ProviderError> {
        Err(unsupported("update"))
    }

    /// Starts a stopped machine; starting a running one succeeds (capability `power`).
    fn start(_config: &Config, _id: &str) -> Result<(), ProviderError> {
        Err(unsupported("start"))
    }

    /// Stops a running machine; stopping a stopped one succeeds (capability `power`).
    fn stop(_config: &Config, _id: &str) -> Result<(), ProviderError> {
        Err(unsupported("stop"))
    }

    /// Deletes a machine; deleting one that is already gone succeeds.
    fn delete(config: &Config, id: &str) -> Result<(), ProviderError>;

    /// One page of the live machines that carry [`Config::cluster`]'s mark (capability
    /// `list`; [`tags::TAG_CLUSTER`] where the cloud keeps tags). `cursor` is `None` for the
    /// first page, then a previous page's `next`. Each machine's `status` is what
    /// [`Provider::get`] answers for its id. Read-only.
    ///
    /// A provider never answers another cluster's machines: with an empty [`Config::cluster`]
    /// it refuses (`permanent`) rather than list every cluster's. The page is bounded on its
    /// way out ([`bounds::page`]): ask the cloud for at most [`bounds::MAX_PAGE_MACHINES`].
    fn list(_config: &Config, _cursor: Option<String>) -> Result<Page, ProviderError> {
        Err(unsupported("list"))
    }
}

/// The answer of an optional operation the provider does not implement: `permanent`, since
/// retrying cannot make the provider grow the feature.
fn unsupported(operation: &str) -> ProviderError {
    ProviderError::Permanent(format!("{operation} is not supported by this provider"))
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
