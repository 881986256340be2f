//! The plugin runtime in this process, with nothing outside it but loopback servers the tests
//! start themselves (no control plane, no cloud): the sandbox against hostile guests, the
//! contract's bounds, loading and its limits, egress, credentials and redaction, the `vmop
//! plugin` command line, the operator's telemetry endpoints, and the memory budget of the
//! shipped manifests.
//!
//! Process-wide state: `redaction` installs this binary's global tracing subscriber (every log
//! line of every test here is captured in memory, and none may carry its secret), and
//! `loading_limits` measures its peak resident set in a process of its own.

#[path = "../support/mod.rs"]
mod support;

mod contract;
mod egress;
mod exfiltrate;
mod loading;
mod loading_limits;
mod memory_budget;
mod plugin_cli;
mod plugin_load_metrics;
mod redaction;
mod sandbox;
mod telemetry;
