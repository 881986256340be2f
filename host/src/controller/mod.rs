//! The two reconcilers and the wiring they share.
//!
//! - [`vm`]: the VirtualMachine reconciler. Start at [`vm::reconcile`]: it builds the VM's
//!   facts, asks the pure `vm::decide` what the VM needs and carries it out in `vm/act.rs`,
//!   through [`vm::Effects`] (plugin calls and API writes; the simulation's fake in tests).
//! - [`provider_config`]: the ProviderConfig reconciler (plugin, Secret, `vmCount` in status)
//!   and the resolver that turns a ProviderConfig into something that can make plugin calls.
//! - [`runtime`]: what both run on: the watches and their relists, the cross-resource
//!   triggers and the index behind them, the per-ProviderConfig limiter, backoff and the error
//!   policy, and the sharding hooks.
//! - `run.rs`: [`run`] wires them: caches, watches, both controllers, sharding;
//!   `reconcile.rs` wraps each reconcile (span, metrics, shard hold, a panic caught);
//!   `context.rs` and `error.rs` are what every reconcile shares.

mod context;
mod error;
pub mod provider_config;
mod reconcile;
mod run;
pub(crate) mod runtime;
pub mod vm;

pub use context::{Context, Options};
pub use error::{Error, Retry};
pub use run::{Config, RunError, run};
