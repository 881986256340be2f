//! Outbound HTTP of plugins: which destinations, which addresses, how requests are signed, and
//! the `wasi:http` send hook that does it all.
//!
//! - [`policy`]: [`EgressPolicy`], one ProviderConfig's decisions (guarantees there).
//! - [`allowlist`]: the `allowedHosts` syntax and matching.
//! - [`address`]: which IP addresses are public, which host spellings are IP addresses.
//! - [`resolve`]: the [`Resolve`] seam (system resolver; a static table for tests).
//! - [`connect`]: sending a request to a checked address (TLS, HTTP/1.1).
//! - [`pool`]: [`Connections`], idle connections kept per ProviderConfig and destination.
//! - [`hooks`]: `EgressHooks`, the per-call hook applying all of the above, the call's deadline
//!   and the response size bound.
//! - [`trace`]: `NetTrace`, whether a call's requests may have reached a server.

mod address;
mod allowlist;
mod connect;
mod hooks;
mod policy;
mod pool;
mod resolve;
mod trace;

pub use allowlist::EgressParseError;
pub(crate) use hooks::EgressHooks;
pub use hooks::MAX_SIGNED_BODY_BYTES;
pub use policy::EgressPolicy;
pub use pool::Connections;
pub use resolve::{Resolve, ResolveFuture, StaticResolver, SystemResolver};
pub(crate) use trace::NetTrace;
