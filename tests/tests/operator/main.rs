//! The operator as a child process (`vmop run`) on the real control plane, with the real EC2
//! plugin against moto (or the testcloud, or fixture guests): lifecycle, errors, deletion,
//! drift, day 2, adoption, plans, RBAC, leader election and sharding, throttling, redaction,
//! the precompiled cache, the write count, the README's demo, and the convergence benchmark
//! (`operator_bench`, ignored by default).
//!
//! Each test has its own namespace, moto and operator (`vmop_tests::operator::Env`), restricted
//! to that namespace and its own ProviderConfigs, so tests run side by side on the shared
//! control plane. The tests that count the API server's writes (`operator_writes`,
//! `operator_bench`) run on a control plane of their own (`ControlPlane::dedicated`).

use std::path::Path;

mod cache_restart;
mod day2;
mod demo;
mod operator_bench;
mod operator_budget;
mod operator_cloud_view;
mod operator_cross_resource;
mod operator_day2;
mod operator_day2_adopt;
mod operator_day2_capabilities;
mod operator_day2_params;
mod operator_day2_pause;
mod operator_deletion;
mod operator_drift;
mod operator_errors;
mod operator_freeze;
mod operator_idempotency;
mod operator_layout;
mod operator_leader;
mod operator_lifecycle;
mod operator_location;
mod operator_plugins;
mod operator_python;
mod operator_rbac;
mod operator_redaction;
mod operator_sharding;
mod operator_throttle;
mod operator_workers;
mod operator_writes;
mod plan;

/// The operator binary the tests start.
fn operator_bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_vmop-operator"))
}
