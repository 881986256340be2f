//! vmop: a Kubernetes operator that manages virtual machines on external clouds through
//! WebAssembly provider plugins.
//!
//! - [`api`]: the `VirtualMachine` and `ProviderConfig` resources and their conditions.
//! - [`controller`]: the reconcilers, error policy and backoff.
//! - [`leader`]: leader election on a Lease.
//! - [`plugin`]: the wasmtime sandbox and the plugin registry.
//! - [`telemetry`]: logs, metrics, events, health.
//! - [`cli`]: the `vmop` command line (parsed in `main.rs`, implemented here).

pub mod api;
pub mod cli;
pub mod controller;
pub mod leader;
pub mod plugin;
pub mod telemetry;
