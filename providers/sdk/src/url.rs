//! The part of URL parsing a provider needs: `http(s)://authority/path?query` from a setting.
//!
//! Default ports are dropped from the authority, so that the `Host` header the host sends and
//! the one a signature covers are the same string.

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    Http,
    Https,
}

impl Scheme {
    pub fn as_str(self) -> &'static str {
        match self {
            Scheme::Http => "http",
            Scheme::Https => "https",
        }
    }

    fn default_port(self) -> &'static str {
        match self {
            Scheme::Http => "80",
            Scheme::Https => "443",
        }
    }
}

/// An absolute `http`/`https` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Url {
    scheme: Scheme,
    authority: String,
    path_and_query: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    #[error("URL `{0}` does not start with http:// or https://")]
    Scheme(String),
    #[error("URL `{0}` has no host")]
    NoHost(String),
    #[error("URL `{0}` contains user info, a fragment, whitespace or control characters")]
    Unsupported(String),
}

impl Url {
    pub fn parse(input: &str) -> Result<Url, UrlError> {
        let (scheme, rest) = if let Some(rest) = input.strip_prefix("https://") {
            (Scheme::Https, rest)
        } else if let Some(rest) = input.strip_prefix("http://") {
            (Scheme::Http, rest)
        } else {
            return Err(UrlError::Scheme(input.to_owned()));
        };
        if rest.contains(['@', '#']) || rest.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(UrlError::Unsupported(input.to_owned()));
        }
        let split = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(split);
        if authority.is_empty() || authority.starts_with(':') {
            return Err(UrlError::NoHost(input.to_owned()));
        }
        let authority = match authority.rsplit_once(':') {
            Some((host, port))
                if port == scheme.default_port()
                    && (!host.contains(':') || host.ends_with(']')) =>
            {
                host
            }
            _ => authority,
        };
        let path_and_query = match tail {
            "" => "/".to_owned(),
            t if t.starts_with('?') => format!("/{t}"),
            t => t.to_owned(),
        };
        Ok(Url {
            scheme,
            authority: authority.to_ascii_lowercase(),
            path_and_query,
        })
    }

    pub fn scheme(&self) -> Scheme {
        self.scheme
    }

    /// `host[:port]`, lowercase, without the scheme's default port.
    pub fn authority(&self) -> &str {
        &self.authority
    }

    /// Always starts with `/`.
    pub fn path_and_query(&self) -> &str {
        &self.path_and_query
    }

    /// The path without the query.
    pub fn path(&self) -> &str {
        self.path_and_query.split('?').next().unwrap_or("/")
    }

    /// This URL with `path` (and query, `/v1/machines?uid=..`) appended to its path: a base
    /// endpoint `http://host/api/` or `http://host/api` joined with `/v1/x` gives
    /// `http://host/api/v1/x`. The base's own query is dropped. `path` is used as given:
    /// escape values with [`encode_component`].
    pub fn join(&self, path: &str) -> Url {
        let base = self.path().trim_end_matches('/');
        let path = path.trim_start_matches('/');
        Url {
            scheme: self.scheme,
            authority: self.authority.clone(),
            path_and_query: format!("{base}/{path}"),
        }
    }
}

/// `text` with every byte outside RFC 3986's unreserved set (`A-Z a-z 0-9 - . _ ~`)
/// percent-encoded: safe as one path segment or one query value.
pub fn encode_component(text: &str) -> String {
    let mut encoded = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            encoded.push(char::from(byte));
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}

impl fmt::Display for Url {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}://{}{}",
            self.scheme.as_str(),
            self.authority,
            self.path_and_query
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_endpoints() {
        let u = Url::parse("https://ec2.us-east-1.amazonaws.com").unwrap();
        assert_eq!(u.scheme(), Scheme::Https);
        assert_eq!(u.authority(), "ec2.us-east-1.amazonaws.com");
        assert_eq!(u.path_and_query(), "/");

        let u = Url::parse("http://127.0.0.1:5000/a/b?x=1").unwrap();
        assert_eq!(u.authority(), "127.0.0.1:5000");
        assert_eq!(u.path(), "/a/b");
        assert_eq!(u.path_and_query(), "/a/b?x=1");
        assert_eq!(u.to_string(), "http://127.0.0.1:5000/a/b?x=1");
    }

    #[test]
    fn joins_paths_and_encodes_components() {
        let base = Url::parse("http://127.0.0.1:8080/api/?x=1").unwrap();
        assert_eq!(
            base.join("/v1/machines?uid=a").to_string(),
            "http://127.0.0.1:8080/api/v1/machines?uid=a"
        );
        let root = Url::parse("https://cloud.example").unwrap();
        assert_eq!(root.join("v1").path_and_query(), "/v1");
        assert_eq!(encode_component("a b/ü~-_."), "a%20b%2F%C3%BC~-_.");
    }

    #[test]
    fn drops_default_ports_only() {
        assert_eq!(
            Url::parse("https://Example.com:443/").unwrap().authority(),
            "example.com"
        );
        assert_eq!(
            Url::parse("http://example.com:443/").unwrap().authority(),
            "example.com:443"
        );
        assert_eq!(Url::parse("http://[::1]:80").unwrap().authority(), "[::1]");
        assert_eq!(Url::parse("http://[::1]").unwrap().authority(), "[::1]");
    }

    #[test]
    fn rejects_what_it_cannot_represent() {
        assert!(matches!(Url::parse("ftp://x"), Err(UrlError::Scheme(_))));
        assert!(matches!(
            Url::parse("ec2.amazonaws.com"),
            Err(UrlError::Scheme(_))
        ));
        assert!(matches!(Url::parse("https://"), Err(UrlError::NoHost(_))));
        assert!(matches!(
            Url::parse("https://:80/"),
            Err(UrlError::NoHost(_))
        ));
        assert!(matches!(
            Url::parse("https://u:p@host/"),
            Err(UrlError::Unsupported(_))
        ));
        assert!(matches!(
            Url::parse("https://host/a b"),
            Err(UrlError::Unsupported(_))
        ));
    }
}
