//! The plugin runtime: one wasmtime engine, a registry of compiled provider components, and a
//! sandbox that runs every call in a fresh, bounded Store.

pub mod types;

pub use types::*;
