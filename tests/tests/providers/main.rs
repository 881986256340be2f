//! The provider plugins in this process against live cloud APIs on loopback (no control plane):
//! the EC2 provider against moto (`moto_server`, from `scripts/prepare.sh`), with and without
//! host-side SigV4, the conformance suite over the Rust and Python providers, the
//! testcloud and the `machines` fixture guests, and `list` of the providers that declare it.

#[path = "../support/mod.rs"]
mod support;

mod conformance;
mod ec2;
mod ec2_signing;
mod list;
