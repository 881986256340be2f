//! Name resolution for plugin requests, behind a seam.
//!
//! The egress hooks resolve a request's host once, check every address (see
//! [`super::address`]) and connect to a checked address, never to the name again: a name that
//! answers a public address to the check and 127.0.0.1 to the connect (DNS rebinding) cannot slip
//! through. [`SystemResolver`] asks the operating system; [`StaticResolver`] answers from a fixed
//! table, so tests can make an allowed name resolve to 127.0.0.1 or 169.254.169.254 inside the
//! test process without touching the machine's `/etc/hosts`.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;

/// A boxed resolution in flight.
pub type ResolveFuture = Pin<Box<dyn Future<Output = io::Result<Vec<IpAddr>>> + Send>>;

/// Turns a DNS name into addresses. Implementations must not fall back to anything that
/// connects; the caller checks and connects.
pub trait Resolve: Send + Sync + fmt::Debug {
    /// The addresses of `name` (lowercase, no trailing dot). An empty list means "no address".
    fn resolve(&self, name: &str) -> ResolveFuture;
}

/// The operating system's resolver (`getaddrinfo` through tokio).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemResolver;

impl Resolve for SystemResolver {
    fn resolve(&self, name: &str) -> ResolveFuture {
        // The port is required by the API and ignored: only addresses are returned.
        let query = format!("{name}:0");
        Box::pin(async move {
            Ok(tokio::net::lookup_host(query)
                .await?
                .map(|a| a.ip())
                .collect())
        })
    }
}

/// A fixed table of names and their addresses; unknown names fail like an NXDOMAIN.
#[derive(Debug, Clone, Default)]
pub struct StaticResolver {
    table: BTreeMap<String, Vec<IpAddr>>,
}

impl StaticResolver {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `name` (compared case-insensitively) answering `addresses`.
    pub fn with(mut self, name: &str, addresses: impl IntoIterator<Item = IpAddr>) -> Self {
        self.table.insert(
            name.trim_end_matches('.').to_ascii_lowercase(),
            addresses.into_iter().collect(),
        );
        self
    }
}

impl Resolve for StaticResolver {
    fn resolve(&self, name: &str) -> ResolveFuture {
        let answer =
            self.table.get(name).cloned().ok_or_else(|| {
                io::Error::new(io::ErrorKind::NotFound, "name not in the static table")
            });
        Box::pin(async move { answer })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    #[tokio::test]
    async fn static_table_answers_known_names_only() {
        let r = StaticResolver::new().with("Metadata.Test.", [IpAddr::V4(Ipv4Addr::LOCALHOST)]);
        assert_eq!(
            r.resolve("metadata.test").await.ok(),
            Some(vec![IpAddr::V4(Ipv4Addr::LOCALHOST)])
        );
        assert!(r.resolve("other.test").await.is_err());
    }
}
