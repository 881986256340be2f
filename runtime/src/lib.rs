//! vmop's plugin runtime: one wasmtime engine, a registry of compiled provider components, and a
//! sandbox that runs every call in a fresh, bounded Store.
//!
//! - [`engine`]: the engine, linker, epoch ticker and instance slots.
//! - [`registry`]: loading from the plugin directory (pin, cache, reload).
//! - [`Plugin`]: one compiled component; [`Plugin::call`] runs any of its [`exports`] through
//!   the sandbox.
//! - [`exports`]: the contract's exports, one type each.
//! - [`sandbox`]: per-call limits and the typed [`CallError`].
//! - [`egress`]: outbound HTTP: allowlist, resolved-address checks, the send hook.
//! - [`signing`]: host-side request signing (the plugin never holds the credential).
//! - [`redact`]: Secret values replaced in everything a plugin says.
//! - [`cache`]: authenticated precompiled artifacts on disk.
//! - [`precompile`]: compiling in this process or in a `vmop precompile` child.

mod bindings;
pub mod cache;
mod component;
pub mod egress;
pub mod engine;
pub mod exports;
mod output;
pub mod precompile;
pub mod redact;
pub mod registry;
mod report;
pub mod sandbox;
pub mod signing;
mod state;

pub use bindings::{Contract, WIT_VERSION};
pub use component::Plugin;
pub use egress::{Connections, EgressParseError, EgressPolicy, Resolve, StaticResolver};
pub use engine::{EngineConfig, EngineError, PluginEngine};
pub use redact::Redactor;
pub use registry::{
    DEFAULT_MAX_PLUGIN_BYTES, LoadError, PluginEvent, PluginRegistry, RegistryConfig,
    RegistryStats, SingleFileError,
};
pub use report::{LoadObserver, chain};
pub use sandbox::{CallContext, CallError, CallLimits};
pub use signing::{RequestSigner, SignerError, SigningMode};
pub use vmop_contract::types::*;
pub use vmop_contract::{bounds, types};
