//! Outbound HTTP policy: the `allowedHosts` allowlist and the `wasi:http` send hook that
//! enforces it.
//!
//! - [`policy`]: [`EgressPolicy`], parsing and matching allowlist entries (syntax and caveats
//!   there).
//! - [`hooks`]: `EgressHooks`, the per-call hook that applies the policy, the call's deadline
//!   and the response size bound.

mod hooks;
mod policy;

pub(crate) use hooks::EgressHooks;
pub use policy::{EgressParseError, EgressPolicy};
