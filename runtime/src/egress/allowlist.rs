//! [`Allowlist`]: the `allowedHosts` list, parsed once and matched against each outbound
//! request's URI.
//!
//! # Entries
//!
//! An entry is `[scheme://]host[:port]`, where `host` is a DNS name, a canonical IPv4 address
//! (dotted decimal), a bracketed IPv6 address, or `*.suffix`:
//! - the scheme defaults to `https`, the port to the scheme's default (80 or 443), so
//!   `*.amazonaws.com` allows exactly `https://<anything>.amazonaws.com:443`;
//! - `*.suffix` matches any name that ends in `.suffix` (one or more labels), not `suffix`
//!   itself; a `*` anywhere else, or alone, is an error;
//! - names compare case-insensitively, a trailing dot is ignored; IP addresses compare as
//!   addresses (`[::FFFF:7f00:1]` is `[::ffff:127.0.0.1]`);
//! - paths, queries, user info, unknown schemes and non-canonical IP spellings (`2130706433`,
//!   `0177.0.0.1`, `127.1`) are errors: an entry that does not parse is refused as a whole
//!   rather than guessed at.
//!
//! An empty list allows nothing (fail closed). Which *addresses* an allowed name may reach is
//! decided after resolution, by [`super::EgressPolicy`].

use std::net::IpAddr;

use http::Uri;

use super::address::HostKind;

/// A parsed `allowedHosts` list. The default allows nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Allowlist {
    rules: Vec<Rule>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Rule {
    scheme: Scheme,
    host: HostPattern,
    port: u16,
}

/// `http` or `https`: the only schemes a plugin may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scheme {
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
    /// An IP literal: matches requests that name exactly this address.
    Ip(IpAddr),
    /// Stored with its leading dot: `.example.com`.
    Suffix(String),
}

/// A request the allowlist lets through: where it goes, as the check saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Target {
    pub scheme: Scheme,
    /// Never [`HostKind::AmbiguousNumeric`]: such hosts are not allowed.
    pub host: HostKind,
    pub port: u16,
}

/// An `allowedHosts` entry that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid allowed host {entry:?}: {reason}")]
pub struct EgressParseError {
    pub entry: String,
    pub reason: &'static str,
}

impl Allowlist {
    /// Parses every entry; one bad entry fails the whole list.
    pub(crate) fn parse<I, S>(entries: I) -> Result<Self, EgressParseError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let rules = entries
            .into_iter()
            .map(|e| parse_rule(e.as_ref()))
            .collect::<Result<_, _>>()?;
        Ok(Allowlist { rules })
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Where a request to `uri` goes, if it may leave the sandbox. A URI without a host, with a
    /// scheme other than http/https, or with an ambiguous numeric host is never allowed.
    pub(crate) fn check(&self, uri: &Uri) -> Option<Target> {
        let scheme = uri.scheme_str().and_then(Scheme::parse)?;
        let host = HostKind::of(uri.host()?);
        let port = uri.port_u16().unwrap_or(scheme.default_port());
        let allowed = self.rules.iter().any(|rule| {
            rule.scheme == scheme
                && rule.port == port
                && match (&rule.host, &host) {
                    (HostPattern::Exact(h), HostKind::Name(name)) => h == name,
                    (HostPattern::Suffix(s), HostKind::Name(name)) => {
                        name.len() > s.len() && name.ends_with(s.as_str())
                    }
                    (HostPattern::Ip(a), HostKind::Ip(b)) => a == b,
                    _ => false,
                }
        });
        allowed.then_some(Target { scheme, host, port })
    }

    /// Whether an entry names `ip` literally for this scheme and port: the administrator's
    /// explicit permission to reach that address even when it is not public.
    pub(crate) fn names_ip(&self, scheme: Scheme, ip: IpAddr, port: u16) -> bool {
        self.rules.iter().any(|rule| {
            rule.scheme == scheme && rule.port == port && rule.host == HostPattern::Ip(ip)
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
        match HostKind::of(host) {
            HostKind::Ip(ip) => HostPattern::Ip(ip),
            HostKind::Name(name) if is_dns_name(&name) => HostPattern::Exact(name),
            HostKind::Name(_) => {
                return Err(err("invalid host name (a wildcard must be a leading `*.`)"));
            }
            HostKind::AmbiguousNumeric => {
                return Err(err(
                    "not a DNS name nor a canonical IP address (write IPv4 as four decimal octets)",
                ));
            }
        }
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

    fn policy(entries: &[&str]) -> Allowlist {
        match Allowlist::parse(entries) {
            Ok(p) => p,
            Err(e) => panic!("{e}"),
        }
    }

    fn allows(p: &Allowlist, uri: &str) -> bool {
        match uri.parse::<Uri>() {
            Ok(u) => p.check(&u).is_some(),
            Err(e) => panic!("{uri}: {e}"),
        }
    }

    #[test]
    fn empty_allows_nothing() {
        let p = Allowlist::default();
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
    fn ip_literals_compare_as_addresses() {
        let p = policy(&["http://[::1]:9000", "http://127.0.0.1:5000"]);
        assert!(allows(&p, "http://[::1]:9000/"));
        assert!(allows(&p, "http://[0:0::1]:9000/"));
        assert!(!allows(&p, "http://[::2]:9000/"));
        assert!(p.names_ip(
            Scheme::Http,
            "127.0.0.1".parse().unwrap_or(IpAddr::from([0; 4])),
            5000
        ));
        assert!(!p.names_ip(
            Scheme::Http,
            "127.0.0.1".parse().unwrap_or(IpAddr::from([0; 4])),
            5001
        ));
    }

    #[test]
    fn numeric_spellings_never_match_an_ip_entry() {
        let p = policy(&["http://127.0.0.1:80", "http://*.example.com:80"]);
        for uri in [
            "http://2130706433/",
            "http://0x7f000001/",
            "http://0177.0.0.1/",
            "http://127.1/",
            "http://1.2.3.4.example.com.0/",
        ] {
            assert!(!allows(&p, uri), "{uri}");
        }
        assert!(allows(&p, "http://127.0.0.1/"));
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
            "https://[zz]",
            "http://2130706433",
            "http://0177.0.0.1",
            "http://127.1:8080",
        ] {
            assert!(
                Allowlist::parse(["example.org", bad]).is_err(),
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
