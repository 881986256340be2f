//! Test support for vmop: a real control plane (etcd + kube-apiserver + kube-controller-manager
//! built from Go modules), a real EC2 API (moto), an in-memory HTTP JSON cloud (`cloud`, the
//! testcloud), the `machines` guests' loopback backend, the guest `.wasm` files built from
//! `providers/` and `tests/fixtures/guests/`, builders for the objects tests make
//! (`fixtures`), and vmop installed in-cluster by its chart on the test node (`incluster`).

pub mod alone;
pub mod child;
pub mod cloud;
pub mod controlplane;
pub mod faults;
pub mod fixtures;
pub mod gated;
pub mod incluster;
pub mod machines;
pub mod moto;
pub mod operator;
pub mod wasm;
