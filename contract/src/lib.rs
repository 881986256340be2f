//! The plugin contract (`wit/provider.wit`, `vmop:provider`) as plain Rust, independent of
//! wasmtime, kube and wit-bindgen, so that the host and the guests' SDK share one definition.
//!
//! - [`types`]: what crosses the boundary (spec, status, plugin info, errors, operations).
//! - [`bounds`]: the output bounds of the contract, one table for both sides.
//! - [`text`]: cutting text to a bound, on a character boundary.

pub mod bounds;
pub mod text;
pub mod types;

pub use types::*;
