//! The fault matrix on the real parts (control plane, moto, the ec2 plugin, the operator as a
//! process, a fault proxy between plugin and moto), in a binary of its own: it runs for
//! minutes, restarts the API server of its isolated control plane (`ControlPlane::isolated`),
//! and compares recovery times against a floor measured in the same run, which other tests'
//! load would skew. `VMOP_FAULTS_CASES`, `VMOP_FAULTS_SEED` and `VMOP_FAULTS_VERBOSE` select,
//! replay and explain cases.

use std::path::Path;

mod operator_faults;

/// The operator binary the tests start.
fn operator_bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_vmop-operator"))
}
