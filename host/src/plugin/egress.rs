//! Outbound HTTP policy: the `allowedHosts` allowlist and the `wasi:http` send hook that
//! enforces it.
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

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Uri;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use wasmtime_wasi_http::{Error as HttpError, RequestOptions, WasiBody, WasiHttpHooks};

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
        let scheme = match uri.scheme_str() {
            Some(s) if s.eq_ignore_ascii_case("http") => Scheme::Http,
            Some(s) if s.eq_ignore_ascii_case("https") => Scheme::Https,
            _ => return false,
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
        Some((s, rest)) if s.eq_ignore_ascii_case("http") => (Scheme::Http, rest),
        Some((s, rest)) if s.eq_ignore_ascii_case("https") => (Scheme::Https, rest),
        Some(_) => return Err(err("scheme must be http or https")),
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

/// The `wasi:http` hooks of one call: the allowlist, the call's deadline and a response size
/// bound. Denied requests fail with `HttpRequestDenied`, which the guest sees when it reads the
/// response.
pub(crate) struct EgressHooks {
    pub policy: EgressPolicy,
    pub deadline: Instant,
    pub max_response_bytes: u64,
    /// For the log lines of denied requests.
    pub label: String,
}

impl fmt::Debug for EgressHooks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EgressHooks")
            .field("policy", &self.policy)
            .field("max_response_bytes", &self.max_response_bytes)
            .finish_non_exhaustive()
    }
}

type IoFuture = Box<dyn Future<Output = Result<(), HttpError>> + Send>;

impl WasiHttpHooks for EgressHooks {
    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        _fut: IoFuture,
    ) -> Box<dyn Future<Output = Result<(http::Response<WasiBody>, IoFuture), HttpError>> + Send>
    {
        let uri = request.uri();
        if !self.policy.allows(uri) {
            // Only scheme and authority: paths and queries may carry credentials.
            tracing::warn!(
                provider = %self.label,
                scheme = uri.scheme_str().unwrap_or(""),
                authority = uri.authority().map(|a| a.as_str()).unwrap_or(""),
                "plugin HTTP request denied: host not in allowedHosts"
            );
            return Box::new(async { Err(HttpError::HttpRequestDenied) });
        }
        let remaining = self.deadline.saturating_duration_since(Instant::now());
        let options = clamp_options(options, remaining);
        let limit = self.max_response_bytes;
        Box::new(async move {
            let (response, io) =
                wasmtime_wasi_http::default_send_request(request, Some(options)).await?;
            let response =
                response.map(|body| BoundedBody::new(body.boxed_unsync(), limit).boxed_unsync());
            Ok((response, Box::new(io) as IoFuture))
        })
    }
}

/// Every phase's timeout is at most what is left of the call (an unset one becomes exactly that).
fn clamp_options(options: Option<RequestOptions>, remaining: Duration) -> RequestOptions {
    let options = options.unwrap_or_default();
    let clamp = |t: Option<Duration>| Some(t.map_or(remaining, |t| t.min(remaining)));
    RequestOptions {
        connect_timeout: clamp(options.connect_timeout),
        first_byte_timeout: clamp(options.first_byte_timeout),
        between_bytes_timeout: clamp(options.between_bytes_timeout),
    }
}

/// A response body that fails with `HttpResponseBodySize` past `limit` bytes.
struct BoundedBody {
    inner: WasiBody,
    limit: u64,
    seen: u64,
}

impl BoundedBody {
    fn new(inner: WasiBody, limit: u64) -> Self {
        BoundedBody {
            inner,
            limit,
            seen: 0,
        }
    }
}

impl Body for BoundedBody {
    type Data = Bytes;
    type Error = HttpError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, HttpError>>> {
        let this = &mut *self;
        let frame = ready!(Pin::new(&mut this.inner).poll_frame(cx));
        if let Some(Ok(frame)) = &frame
            && let Some(data) = frame.data_ref()
        {
            this.seen = this
                .seen
                .saturating_add(u64::try_from(data.len()).unwrap_or(u64::MAX));
            if this.seen > this.limit {
                return Poll::Ready(Some(Err(HttpError::HttpResponseBodySize(Some(this.seen)))));
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
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

    #[test]
    fn timeouts_are_clamped_to_the_remaining_call() {
        let left = Duration::from_secs(2);
        let o = clamp_options(
            Some(RequestOptions {
                connect_timeout: Some(Duration::from_secs(600)),
                first_byte_timeout: Some(Duration::from_millis(10)),
                between_bytes_timeout: None,
            }),
            left,
        );
        assert_eq!(o.connect_timeout, Some(left));
        assert_eq!(o.first_byte_timeout, Some(Duration::from_millis(10)));
        assert_eq!(o.between_bytes_timeout, Some(left));
    }
}
