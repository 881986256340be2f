//! [`EgressPolicy`]: the `allowedHosts` allowlist, parsed once and matched against each
//! outbound request's URI.
//!
//! # Allowlist entries
//!
//! An entry is `[scheme://]host[:port]`, where `host` is a DNS name, an IPv4 address, a
//! bracketed IPv6 address, or `*.suffix`:
//! - the scheme defaults to `https`, the port to the scheme's default (80 or 443), so
//!   `*.amazonaws.com` allows exactly `https://<anything>.amazonaws.com:443`;
//! - `*.suffix` matches any name that ends in `.suffix` (one or more labels), not `suffix`
//!   itself; a `*` anywhere else, or alone, is an error;
//! - names compare case-insensitively, a trailing dot is ignored;
//! - paths, queries, user info and unknown schemes are errors: an entry that does not parse is
//!   refused as a whole rather than guessed at.
//!
//! An empty list allows nothing (fail closed).
//!
//! # Caveats
//!
//! The check is on the request's host name, not on the address it resolves to: an allowed name
//! that resolves to loopback or a link-local address is reached. The allowlist is the
//! administrator's statement of trust in those names.

use http::Uri;

/// A parsed `allowedHosts` list. The default allows nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EgressPolicy {
    rules: Vec<Rule>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Rule {
    scheme: Scheme,
    host: HostPattern,
    port: u16,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scheme {
    Http,
    Https,
}

impl Scheme {
    /// `http` or `https`, in any case.
    fn parse(s: &str) -> Option<Scheme> {
        if s.eq_ignore_ascii_case("http") {
            Some(Scheme::Http)
        } else if s.eq_ignore_ascii_case("https") {
            Some(Scheme::Https)
        } else {
            None
        }
    }

    fn default_port(self) -> u16 {
        match self {
            Scheme::Http => 80,
            Scheme::Https => 443,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum HostPattern {
    Exact(String),
    /// Stored with its leading dot: `.example.com`.
    Suffix(String),
}

/// An `allowedHosts` entry that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid allowed host {entry:?}: {reason}")]
pub struct EgressParseError {
    pub entry: String,
    pub reason: &'static str,
}

impl EgressPolicy {
    /// A policy that allows nothing.
    pub fn deny_all() -> Self {
        Self::default()
    }

    /// Parses every entry; one bad entry fails the whole list.
    pub fn parse<I, S>(entries: I) -> Result<Self, EgressParseError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let rules = entries
            .into_iter()
            .map(|e| parse_rule(e.as_ref()))
            .collect::<Result<_, _>>()?;
        Ok(EgressPolicy { rules })
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Whether a request to `uri` may leave the sandbox. A URI without a host, or with a scheme
    /// other than http/https, is never allowed.
    pub fn allows(&self, uri: &Uri) -> bool {
        let Some(scheme) = uri.scheme_str().and_then(Scheme::parse) else {
            return false;
        };
        let Some(host) = uri.host() else {
            return false;
        };
        let host = normalize_host(host);
        let port = uri.port_u16().unwrap_or(scheme.default_port());
        self.rules.iter().any(|rule| {
            rule.scheme == scheme
                && rule.port == port
                && match &rule.host {
                    HostPattern::Exact(h) => *h == host,
                    HostPattern::Suffix(s) => host.len() > s.len() && host.ends_with(s.as_str()),
                }
        })
    }
}

fn normalize_host(host: &str) -> String {
    host.trim_end_matches('.').to_ascii_lowercase()
}

fn parse_rule(entry: &str) -> Result<Rule, EgressParseError> {
    let err = |reason| EgressParseError {
        entry: entry.to_string(),
        reason,
    };
    let trimmed = entry.trim();
    let (scheme, rest) = match trimmed.split_once("://") {
        Some((s, rest)) => (
            Scheme::parse(s).ok_or_else(|| err("scheme must be http or https"))?,
            rest,
        ),
        None => (Scheme::Https, trimmed),
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.is_empty() {
        return Err(err("missing host"));
    }
    if rest.contains(['/', '?', '#', '@']) || rest.chars().any(char::is_whitespace) {
        return Err(err("only scheme, host and port are allowed"));
    }
    let (host, port) = split_port(rest).ok_or_else(|| err("invalid port"))?;
    let port = port.unwrap_or(scheme.default_port());
    let host = if let Some(suffix) = host.strip_prefix("*.") {
        let suffix = normalize_host(suffix);
        if suffix.is_empty() || !is_dns_name(&suffix) {
            return Err(err("invalid wildcard suffix"));
        }
        HostPattern::Suffix(format!(".{suffix}"))
    } else {
        let host = normalize_host(host);
        let is_ipv6 = host.starts_with('[') && host.ends_with(']');
        if !(is_ipv6 || is_dns_name(&host)) {
            return Err(err("invalid host name (a wildcard must be a leading `*.`)"));
        }
        HostPattern::Exact(host)
    };
    Ok(Rule { scheme, host, port })
}

/// Splits `host[:port]`, keeping IPv6 brackets on the host. `None` for a malformed port.
fn split_port(s: &str) -> Option<(&str, Option<u16>)> {
    let (host, port) = if s.starts_with('[') {
        let end = s.find(']')?;
        let (host, after) = s.split_at(end + 1);
        match after {
            "" => (host, None),
            p => (host, Some(p.strip_prefix(':')?)),
        }
    } else {
        match s.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (s, None),
        }
    };
    let port = match port {
        None => None,
        Some(p) => Some(p.parse::<u16>().ok().filter(|p| *p != 0)?),
    };
    Some((host, port))
}

fn is_dns_name(s: &str) -> bool {
    !s.is_empty()
        && s.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(entries: &[&str]) -> EgressPolicy {
        match EgressPolicy::parse(entries) {
            Ok(p) => p,
            Err(e) => panic!("{e}"),
        }
    }

    fn allows(p: &EgressPolicy, uri: &str) -> bool {
        match uri.parse::<Uri>() {
            Ok(u) => p.allows(&u),
            Err(e) => panic!("{uri}: {e}"),
        }
    }

    #[test]
    fn empty_allows_nothing() {
        let p = EgressPolicy::deny_all();
        assert!(p.is_empty());
        assert!(!allows(&p, "https://example.com/"));
        assert!(!allows(&p, "http://127.0.0.1:80/"));
    }

    #[test]
    fn exact_entry_matches_scheme_host_and_port() {
        let p = policy(&["http://127.0.0.1:5000"]);
        assert!(allows(&p, "http://127.0.0.1:5000/x?y=z"));
        assert!(!allows(&p, "http://127.0.0.1:5001/"));
        assert!(!allows(&p, "https://127.0.0.1:5000/"));
        assert!(!allows(&p, "http://127.0.0.2:5000/"));
    }

    #[test]
    fn defaults_are_https_and_the_scheme_port() {
        let p = policy(&["ec2.us-east-1.amazonaws.com", "http://plain.example"]);
        assert!(allows(&p, "https://ec2.us-east-1.amazonaws.com/"));
        assert!(allows(&p, "https://ec2.us-east-1.amazonaws.com:443/"));
        assert!(!allows(&p, "http://ec2.us-east-1.amazonaws.com/"));
        assert!(!allows(&p, "https://ec2.us-east-1.amazonaws.com:8443/"));
        assert!(allows(&p, "http://plain.example:80/"));
        assert!(!allows(&p, "https://plain.example/"));
    }

    #[test]
    fn wildcard_matches_subdomains_only() {
        let p = policy(&["*.amazonaws.com"]);
        assert!(allows(&p, "https://ec2.us-east-1.amazonaws.com/"));
        assert!(allows(&p, "https://EC2.AmazonAWS.com./"));
        assert!(!allows(&p, "https://amazonaws.com/"));
        assert!(!allows(&p, "https://evilamazonaws.com/"));
        assert!(!allows(&p, "https://amazonaws.com.evil.net/"));
        assert!(!allows(&p, "http://ec2.amazonaws.com/"));
        let p = policy(&["http://*.local.test:8080"]);
        assert!(allows(&p, "http://a.local.test:8080/"));
        assert!(!allows(&p, "http://a.local.test/"));
    }

    #[test]
    fn ipv6_literals() {
        let p = policy(&["http://[::1]:9000"]);
        assert!(allows(&p, "http://[::1]:9000/"));
        assert!(!allows(&p, "http://[::2]:9000/"));
    }

    #[test]
    fn invalid_entries_fail_the_whole_list() {
        for bad in [
            "",
            "*",
            "*.",
            "ftp://example.com",
            "https://example.com/path",
            "https://user@example.com",
            "https://example.com:0",
            "https://example.com:99999",
            "https://ex*mple.com",
            "https://a.*.example.com",
            "https://exa mple.com",
            "https://[::1",
        ] {
            assert!(
                EgressPolicy::parse(["example.org", bad]).is_err(),
                "{bad:?} should not parse"
            );
        }
    }

    #[test]
    fn uris_without_host_or_known_scheme_are_denied() {
        let p = policy(&["*.example.com"]);
        assert!(!allows(&p, "/relative"));
        assert!(!allows(&p, "ftp://a.example.com/"));
    }
}
