//! Host-side request signing: the credentials Secret stays in the host, which authenticates each
//! allowed outbound request of a plugin itself.
//!
//! # Modes
//!
//! - [`SigningMode::AwsSigV4`]: AWS Signature Version 4 with the Secret's `access_key_id`,
//!   `secret_access_key` and optional `session_token`. Scope: the plugin's [`SERVICE_HINT`] /
//!   [`REGION_HINT`] request headers (removed before sending), else `<service>.<region>` of an
//!   `*.amazonaws.com` host, else the settings `region` and `signingService` (default `ec2`).
//!   Signed by the maintained `aws-sigv4` crate ([`sigv4`]).
//! - [`SigningMode::Bearer`]: `Authorization: Bearer <token>` from the Secret's `token`.
//! - [`SigningMode::Header`]: the header named by the setting `credentialsHeader`, value from the
//!   Secret's `token`.
//!
//! # Guarantees
//!
//! - Only requests that passed the egress checks are signed: a denied request never carries a
//!   credential (`egress::hooks` signs after the allowlist and address checks).
//! - The host's credential wins: before signing, every header the mode owns is removed from the
//!   guest's request (`authorization`, `x-amz-date`, `x-amz-security-token`,
//!   `x-amz-content-sha256` for SigV4; `authorization` for bearer; the named header for
//!   `header`), so a guest can neither replace nor duplicate it
//!   (`signing::tests::guest_headers_are_replaced`, and the recorder test
//!   `signing::guest_authorization_is_replaced_by_the_hosts` in tests/tests/sandbox/exfiltrate.rs).
//!   Other `x-amz-*` headers (`x-amz-target` of JSON APIs) are the guest's and are signed as
//!   sent.
//! - A SigV4 signature covers method, host, path, query, the signed headers, the body and the
//!   time, so one sent to another allowed host (a `*.amazonaws.com` bucket of someone else) cannot
//!   be replayed against the real endpoint. A bearer or header token can: with those modes the
//!   allowlist is what keeps the token from other hosts, so keep it to the API's own host.
//! - `Debug` never prints a credential.

mod sigv4;

use std::collections::BTreeMap;
use std::fmt;

use http::{HeaderMap, HeaderName, HeaderValue};

use sigv4::AwsSigner;
pub use sigv4::{REGION_HINT, SERVICE_HINT};

/// The setting naming the SigV4 service.
pub const SIGNING_SERVICE_SETTING: &str = "signingService";
/// The SigV4 service when [`SIGNING_SERVICE_SETTING`] is absent.
pub const DEFAULT_SIGNING_SERVICE: &str = "ec2";
/// The setting naming the SigV4 region.
pub const REGION_SETTING: &str = "region";
/// The setting naming the header of [`SigningMode::Header`].
pub const HEADER_SETTING: &str = "credentialsHeader";
/// The Secret key holding the token of bearer and header modes.
pub const TOKEN_KEY: &str = "token";

/// How the host authenticates a plugin's requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SigningMode {
    AwsSigV4,
    Bearer,
    Header,
}

/// Why a Secret and settings do not make a signer. Names keys and settings, never values.
#[derive(Debug, thiserror::Error)]
pub enum SignerError {
    #[error("the credentials Secret has no key {key:?}, which {mode} signing needs")]
    MissingKey {
        key: &'static str,
        mode: &'static str,
    },
    #[error("the setting {setting:?} is required for {mode} signing")]
    MissingSetting {
        setting: &'static str,
        mode: &'static str,
    },
    #[error("the setting {HEADER_SETTING:?} is not a valid header name")]
    InvalidHeaderName,
    #[error("the credentials Secret's key {key:?} is not a valid HTTP header value")]
    InvalidValue { key: &'static str },
    #[error("the request cannot be signed")]
    Sign(#[source] sigv4::SignError),
}

/// Authenticates requests with one ProviderConfig's credentials.
#[derive(Clone)]
pub struct RequestSigner {
    kind: Kind,
}

#[derive(Clone)]
enum Kind {
    Aws(AwsSigner),
    Header {
        name: HeaderName,
        value: HeaderValue,
    },
}

impl fmt::Debug for RequestSigner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Aws(s) => f.debug_tuple("RequestSigner").field(s).finish(),
            Kind::Header { name, .. } => f
                .debug_struct("RequestSigner")
                .field("header", name)
                .finish_non_exhaustive(),
        }
    }
}

impl RequestSigner {
    /// The signer of `mode`, reading `settings` (`spec.config`) and `secret` (the Secret's keys).
    pub fn new(
        mode: SigningMode,
        settings: &BTreeMap<String, String>,
        secret: &BTreeMap<String, String>,
    ) -> Result<Self, SignerError> {
        let kind = match mode {
            SigningMode::AwsSigV4 => Kind::Aws(AwsSigner::new(settings, secret)?),
            SigningMode::Bearer => {
                let token = required(secret, TOKEN_KEY, "bearer")?;
                Kind::Header {
                    name: http::header::AUTHORIZATION,
                    value: sensitive(&format!("Bearer {token}"), TOKEN_KEY)?,
                }
            }
            SigningMode::Header => {
                let name = settings
                    .get(HEADER_SETTING)
                    .filter(|n| !n.is_empty())
                    .ok_or(SignerError::MissingSetting {
                        setting: HEADER_SETTING,
                        mode: "header",
                    })?;
                let name = HeaderName::try_from(name.as_str())
                    .map_err(|_| SignerError::InvalidHeaderName)?;
                let token = required(secret, TOKEN_KEY, "header")?;
                Kind::Header {
                    name,
                    value: sensitive(token, TOKEN_KEY)?,
                }
            }
        };
        Ok(RequestSigner { kind })
    }

    /// Whether signing needs the whole request body (SigV4 hashes it).
    pub(crate) fn needs_body(&self) -> bool {
        matches!(self.kind, Kind::Aws(_))
    }

    /// Removes every header this signer sets; returns how many the guest had set.
    pub(crate) fn strip(&self, headers: &mut HeaderMap) -> usize {
        let owned: Vec<HeaderName> = match &self.kind {
            Kind::Aws(_) => sigv4::OWNED_HEADERS
                .iter()
                .filter_map(|h| HeaderName::try_from(*h).ok())
                .collect(),
            Kind::Header { name, .. } => vec![name.clone()],
        };
        owned
            .iter()
            .map(|name| {
                // `remove` drops every value of the name.
                let n = headers.get_all(name).iter().count();
                headers.remove(name);
                n
            })
            .sum()
    }

    /// Adds the credential to a request whose guest-set credential headers were
    /// [stripped](Self::strip). `body` is the whole body when [`Self::needs_body`].
    pub(crate) fn sign(
        &self,
        parts: &mut http::request::Parts,
        body: &[u8],
    ) -> Result<(), SignerError> {
        match &self.kind {
            Kind::Aws(signer) => signer.sign(parts, body).map_err(SignerError::Sign),
            Kind::Header { name, value } => {
                parts.headers.insert(name.clone(), value.clone());
                Ok(())
            }
        }
    }
}

fn required<'a>(
    secret: &'a BTreeMap<String, String>,
    key: &'static str,
    mode: &'static str,
) -> Result<&'a str, SignerError> {
    secret
        .get(key)
        .map(String::as_str)
        .filter(|v| !v.is_empty())
        .ok_or(SignerError::MissingKey { key, mode })
}

fn sensitive(value: &str, key: &'static str) -> Result<HeaderValue, SignerError> {
    let mut value = HeaderValue::try_from(value).map_err(|_| SignerError::InvalidValue { key })?;
    value.set_sensitive(true);
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn request(headers: &[(&str, &str)]) -> http::request::Parts {
        let mut builder = http::Request::builder()
            .method("POST")
            .uri("https://api.example.com/v1/x");
        for (k, v) in headers {
            builder = builder.header(*k, *v);
        }
        match builder.body(()) {
            Ok(r) => r.into_parts().0,
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn guest_headers_are_replaced() {
        let signer = RequestSigner::new(
            SigningMode::Header,
            &map(&[(HEADER_SETTING, "X-Api-Key")]),
            &map(&[(TOKEN_KEY, "host-token")]),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let mut parts = request(&[("x-api-key", "guest-1"), ("X-API-KEY", "guest-2")]);
        assert_eq!(signer.strip(&mut parts.headers), 2);
        signer
            .sign(&mut parts, b"")
            .unwrap_or_else(|e| panic!("{e}"));
        let values: Vec<_> = parts.headers.get_all("x-api-key").iter().collect();
        assert_eq!(values, vec!["host-token"]);
        assert!(values.iter().all(|v| v.is_sensitive()));

        let bearer = RequestSigner::new(
            SigningMode::Bearer,
            &map(&[]),
            &map(&[(TOKEN_KEY, "t0k3n")]),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let mut parts = request(&[("authorization", "Bearer guest")]);
        bearer.strip(&mut parts.headers);
        bearer
            .sign(&mut parts, b"")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            parts
                .headers
                .get_all("authorization")
                .iter()
                .collect::<Vec<_>>(),
            vec!["Bearer t0k3n"]
        );
        assert!(!format!("{bearer:?}").contains("t0k3n"));
    }

    #[test]
    fn missing_keys_and_settings_are_named_without_values() {
        let err =
            RequestSigner::new(SigningMode::Bearer, &map(&[]), &map(&[("other", "v4lue")])).err();
        assert!(matches!(
            err,
            Some(SignerError::MissingKey {
                key: TOKEN_KEY,
                mode: "bearer"
            })
        ));
        let err =
            RequestSigner::new(SigningMode::Header, &map(&[]), &map(&[(TOKEN_KEY, "x")])).err();
        assert!(matches!(err, Some(SignerError::MissingSetting { .. })));
        let err = RequestSigner::new(
            SigningMode::Header,
            &map(&[(HEADER_SETTING, "bad header")]),
            &map(&[(TOKEN_KEY, "x")]),
        )
        .err();
        assert!(matches!(err, Some(SignerError::InvalidHeaderName)));
        let err = RequestSigner::new(
            SigningMode::Bearer,
            &map(&[]),
            &map(&[(TOKEN_KEY, "line\nbreak")]),
        )
        .err();
        assert!(matches!(
            err,
            Some(SignerError::InvalidValue { key: TOKEN_KEY })
        ));
    }
}
