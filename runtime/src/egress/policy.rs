//! [`EgressPolicy`]: everything the host decides about one ProviderConfig's outbound traffic —
//! which URIs (the `allowedHosts` [`Allowlist`]), which resolved addresses, how requests are
//! authenticated (the [`RequestSigner`]) — and the Secret values that must never come back out
//! of the plugin (the [`Redactor`]). One value per ProviderConfig, handed to every call.
//!
//! # Guarantees
//!
//! - Fail closed: the default policy allows nothing, and an `allowedHosts` entry that does not
//!   parse fails the whole list.
//! - A request goes only to an address that is public (see [`super::address`]), unless the
//!   allowlist names that IP literally (same scheme and port) or `allowPrivateNetworks` is set
//!   (`policy::tests::non_public_addresses_need_an_explicit_permission`). A name is resolved
//!   once, through the [`Resolve`] seam; only the permitted addresses of the answer are
//!   connected to, and a name with none is refused
//!   (`egress::allowed_name_resolving_to_loopback_or_metadata_is_refused` in
//!   tests/tests/sandbox/egress.rs).

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use http::Uri;

use super::address::{HostKind, is_non_public};
use super::allowlist::{Allowlist, EgressParseError, Target};
use super::pool::Connections;
use super::resolve::{Resolve, SystemResolver};
use crate::redact::Redactor;
use crate::signing::RequestSigner;

/// The outbound policy of one ProviderConfig. The default allows nothing.
#[derive(Clone)]
pub struct EgressPolicy {
    allowlist: Allowlist,
    allow_private_networks: bool,
    resolver: Arc<dyn Resolve>,
    signer: Option<Arc<RequestSigner>>,
    redactor: Redactor,
    connections: Connections,
}

impl Default for EgressPolicy {
    fn default() -> Self {
        EgressPolicy {
            allowlist: Allowlist::default(),
            allow_private_networks: false,
            resolver: Arc::new(SystemResolver),
            signer: None,
            redactor: Redactor::default(),
            connections: Connections::default(),
        }
    }
}

impl fmt::Debug for EgressPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EgressPolicy")
            .field("allowlist", &self.allowlist)
            .field("allow_private_networks", &self.allow_private_networks)
            .field("resolver", &self.resolver)
            .field("signer", &self.signer)
            .field("redactor", &self.redactor)
            .field("connections", &self.connections)
            .finish()
    }
}

/// Why a request was not sent. Messages name scheme, host and port at most: never a path, a
/// query or user info, which may carry credentials.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Denial {
    #[error("the URI carries user info")]
    UserInfo,
    #[error("the destination is not in allowedHosts")]
    NotAllowed,
    #[error(
        "{ip} is not a public address, and neither allowedHosts names it nor is allowPrivateNetworks set"
    )]
    NonPublic { ip: IpAddr },
    #[error("the name did not resolve: {reason}")]
    Resolve { reason: String },
    #[error("the name resolved to no address")]
    NoAddress,
}

impl EgressPolicy {
    /// A policy that allows nothing.
    pub fn deny_all() -> Self {
        Self::default()
    }

    /// A policy allowing `allowedHosts` `entries` (syntax in [`super::allowlist`]), public
    /// addresses only, no signing, nothing to redact.
    pub fn parse<I, S>(entries: I) -> Result<Self, EgressParseError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Ok(EgressPolicy {
            allowlist: Allowlist::parse(entries)?,
            ..Self::default()
        })
    }

    /// `allowPrivateNetworks`: allowed names may resolve to non-public addresses.
    pub fn allow_private_networks(mut self, allow: bool) -> Self {
        self.allow_private_networks = allow;
        self
    }

    /// Resolves names with `resolver` instead of the operating system.
    pub fn with_resolver(mut self, resolver: Arc<dyn Resolve>) -> Self {
        self.resolver = resolver;
        self
    }

    /// Signs every allowed request with `signer`.
    pub fn with_signer(mut self, signer: RequestSigner) -> Self {
        self.signer = Some(Arc::new(signer));
        self
    }

    /// Keeps idle connections in `connections` (shared with other policies, e.g. every
    /// resolve of one operator) instead of a pool of this policy's own.
    pub fn with_connections(mut self, connections: Connections) -> Self {
        self.connections = connections;
        self
    }

    /// Where idle connections are kept.
    pub(crate) fn connections(&self) -> &Connections {
        &self.connections
    }

    /// Redacts these Secret values from everything the plugin says.
    pub fn with_redactor(mut self, redactor: Redactor) -> Self {
        self.redactor = redactor;
        self
    }

    /// Whether nothing at all is allowed.
    pub fn is_empty(&self) -> bool {
        self.allowlist.is_empty()
    }

    /// Whether `uri` passes the allowlist (addresses are checked when a request is sent).
    pub fn allows(&self, uri: &Uri) -> bool {
        self.allowlist.check(uri).is_some()
    }

    /// Whether the host signs requests (the plugin holds no credential).
    pub fn signs(&self) -> bool {
        self.signer.is_some()
    }

    /// The Secret values to redact from what the plugin says.
    pub fn redactor(&self) -> &Redactor {
        &self.redactor
    }

    pub(crate) fn signer(&self) -> Option<&RequestSigner> {
        self.signer.as_deref()
    }

    /// The allowlist's verdict on `uri`.
    pub(crate) fn check(&self, uri: &Uri) -> Result<Target, Denial> {
        if uri.authority().is_some_and(|a| a.as_str().contains('@')) {
            return Err(Denial::UserInfo);
        }
        self.allowlist.check(uri).ok_or(Denial::NotAllowed)
    }

    /// The addresses `target` may be reached at, in the resolver's order.
    pub(crate) async fn destinations(&self, target: &Target) -> Result<Vec<IpAddr>, Denial> {
        let candidates = match &target.host {
            HostKind::Ip(ip) => vec![*ip],
            HostKind::Name(name) => {
                self.resolver
                    .resolve(name)
                    .await
                    .map_err(|e| Denial::Resolve {
                        reason: e.to_string(),
                    })?
            }
            HostKind::AmbiguousNumeric => return Err(Denial::NotAllowed),
        };
        let first = *candidates.first().ok_or(Denial::NoAddress)?;
        let permitted: Vec<IpAddr> = candidates
            .into_iter()
            .filter(|ip| self.permits(target, *ip))
            .collect();
        if permitted.is_empty() {
            return Err(Denial::NonPublic { ip: first });
        }
        Ok(permitted)
    }

    fn permits(&self, target: &Target, ip: IpAddr) -> bool {
        !is_non_public(ip)
            || self.allow_private_networks
            || self.allowlist.names_ip(target.scheme, ip, target.port)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::egress::resolve::StaticResolver;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    async fn destinations(policy: &EgressPolicy, uri: &str) -> Result<Vec<IpAddr>, Denial> {
        let uri: Uri = uri.parse().unwrap_or_else(|e| panic!("{uri}: {e}"));
        let target = policy.check(&uri)?;
        policy.destinations(&target).await
    }

    fn policy(entries: &[&str]) -> EgressPolicy {
        let resolver = StaticResolver::new()
            .with("public.test", [ip("52.94.0.1")])
            .with("loopback.test", [ip("127.0.0.1")])
            .with("metadata.test", [ip("169.254.169.254")])
            .with("mapped.test", [ip("::ffff:169.254.169.254")])
            .with("mixed.test", [ip("127.0.0.1"), ip("52.94.0.2")]);
        EgressPolicy::parse(entries)
            .unwrap_or_else(|e| panic!("{e}"))
            .with_resolver(Arc::new(resolver))
    }

    #[tokio::test]
    async fn non_public_addresses_need_an_explicit_permission() {
        let p = policy(&["http://*.test:80", "http://127.0.0.1:8080"]);
        assert_eq!(
            destinations(&p, "http://public.test/").await,
            Ok(vec![ip("52.94.0.1")])
        );
        for uri in [
            "http://loopback.test/",
            "http://metadata.test/",
            "http://mapped.test/",
        ] {
            assert!(
                matches!(destinations(&p, uri).await, Err(Denial::NonPublic { .. })),
                "{uri}"
            );
        }
        // Only the permitted part of a mixed answer is used.
        assert_eq!(
            destinations(&p, "http://mixed.test/").await,
            Ok(vec![ip("52.94.0.2")])
        );
        // Literal entries permit exactly their address, scheme and port.
        assert_eq!(
            destinations(&p, "http://127.0.0.1:8080/").await,
            Ok(vec![ip("127.0.0.1")])
        );
        assert!(matches!(
            destinations(&p, "http://127.0.0.1:8081/").await,
            Err(Denial::NotAllowed)
        ));
        // A literal entry also permits a name answering that address (the administrator named
        // it); without one the same name is refused (above).
        let literal = policy(&["http://*.test:80", "http://169.254.169.254:80"]);
        assert_eq!(
            destinations(&literal, "http://metadata.test/").await,
            Ok(vec![ip("169.254.169.254")])
        );
        // allowPrivateNetworks opens non-public answers of allowed names.
        let open = p.clone().allow_private_networks(true);
        assert_eq!(
            destinations(&open, "http://loopback.test/").await,
            Ok(vec![ip("127.0.0.1")])
        );
    }

    #[tokio::test]
    async fn user_info_unknown_names_and_numeric_spellings_are_refused() {
        let p = policy(&["http://*.test:80", "http://127.0.0.1:80"]);
        assert_eq!(
            destinations(&p, "http://user:pw@public.test/").await,
            Err(Denial::UserInfo)
        );
        assert!(matches!(
            destinations(&p, "http://unknown.test/").await,
            Err(Denial::Resolve { .. })
        ));
        for uri in ["http://2130706433/", "http://0177.0.0.1/", "http://127.1/"] {
            assert_eq!(
                destinations(&p, uri).await,
                Err(Denial::NotAllowed),
                "{uri}"
            );
        }
        let debug = format!("{p:?}");
        assert!(debug.contains("EgressPolicy"), "{debug}");
    }
}
