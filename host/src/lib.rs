//! vmop: a Kubernetes operator that manages virtual machines on external clouds through
//! WebAssembly provider plugins. The plugin contract is the crate `vmop_contract`, the wasmtime
//! sandbox and plugin registry the crate `vmop_runtime`; this crate is the operator on top.
//!
//! - [`api`]: the `VirtualMachine` and `ProviderConfig` resources and their conditions.
//! - [`controller`]: the reconcilers, error policy and backoff.
//! - [`leader`]: leader election and shard Leases.
//! - [`conformance`]: the conformance kit a provider is checked with (`vmop plugin conformance`).
//! - [`telemetry`]: logs, metrics, events, health.
//! - [`cli`]: the `vmop` command line (parsed in `main.rs`, implemented here).

pub mod api;
pub mod cli;
pub mod conformance;
pub mod controller;
pub mod leader;
pub mod telemetry;

/// The plugin runtime under its former path, while the integration tests move to
/// `vmop_runtime`.
pub use vmop_runtime as plugin;
