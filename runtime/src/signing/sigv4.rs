//! AWS Signature Version 4 on the host, with the `aws-sigv4` crate (the AWS SDK's own signer).
//!
//! # Scope
//!
//! The service and region a request is signed for, first match wins:
//! 1. the request headers [`SERVICE_HINT`] and [`REGION_HINT`], which the plugin may set and the
//!    host removes before signing (so the ec2 plugin can sign its STS calls to an endpoint that
//!    serves both, like moto). They give the plugin no power it lacks: it already chooses the
//!    whole request to an allowed host, and a wrong scope only gets the request refused;
//! 2. for an AWS endpoint `<service>.<region>.amazonaws.com` (or `<service>.amazonaws.com`),
//!    that service and region;
//! 3. the settings `region` and `signingService` (default `ec2`).
//!
//! The crate computes the signature; this module only feeds it the request as the guest built
//! it and adds the headers it returns (`authorization`, `x-amz-date`, `x-amz-security-token`).
//! Header values are inserted through `HeaderValue::try_from` rather than the crate's
//! `apply_to_request_http1x`, which panics on a value that is not a valid header (a session
//! token with a line break would otherwise take the operator down).

use std::collections::BTreeMap;
use std::fmt;
use std::time::SystemTime;

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
use aws_sigv4::sign::v4;
use aws_smithy_runtime_api::client::identity::Identity;
use http::{HeaderName, HeaderValue};

use super::{DEFAULT_SIGNING_SERVICE, REGION_SETTING, SIGNING_SERVICE_SETTING, SignerError};

/// Headers the SigV4 signer sets: a guest's copies are removed before signing.
pub(super) const OWNED_HEADERS: [&str; 4] = [
    "authorization",
    "x-amz-date",
    "x-amz-security-token",
    "x-amz-content-sha256",
];
/// Request header naming the SigV4 service of this request (removed before sending).
pub const SERVICE_HINT: &str = "x-vmop-signing-service";
/// Request header naming the SigV4 region of this request (removed before sending).
pub const REGION_HINT: &str = "x-vmop-signing-region";

const ACCESS_KEY_ID: &str = "access_key_id";
const SECRET_ACCESS_KEY: &str = "secret_access_key";
const SESSION_TOKEN: &str = "session_token";

/// Why one request could not be signed.
#[derive(Debug, thiserror::Error)]
pub enum SignError {
    #[error("header {name} is not visible ASCII, so it cannot be signed")]
    HeaderNotText { name: HeaderName },
    #[error("the SigV4 signer refused the request")]
    Signer(#[source] aws_sigv4::http_request::SigningError),
    #[error("the SigV4 signing parameters are incomplete")]
    Params(#[source] v4::signing_params::BuildError),
    #[error("header {name} must name a service or region (lowercase letters, digits, `-`)")]
    BadHint { name: &'static str },
    #[error("the signer produced header {name}, which is not a valid header")]
    Produced { name: &'static str },
}

/// Credentials, region and service of one ProviderConfig. `Debug` shows region, service and
/// the access key id (not secret: AWS prints it in every error).
#[derive(Clone)]
pub(super) struct AwsSigner {
    identity: Identity,
    access_key_id: String,
    region: String,
    service: String,
}

impl fmt::Debug for AwsSigner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AwsSigV4")
            .field("access_key_id", &self.access_key_id)
            .field("region", &self.region)
            .field("service", &self.service)
            .finish_non_exhaustive()
    }
}

impl AwsSigner {
    pub(super) fn new(
        settings: &BTreeMap<String, String>,
        secret: &BTreeMap<String, String>,
    ) -> Result<Self, SignerError> {
        const MODE: &str = "aws-sigv4";
        let region = settings
            .get(REGION_SETTING)
            .filter(|r| !r.is_empty())
            .ok_or(SignerError::MissingSetting {
                setting: REGION_SETTING,
                mode: MODE,
            })?;
        let service = settings
            .get(SIGNING_SERVICE_SETTING)
            .filter(|s| !s.is_empty())
            .map_or(DEFAULT_SIGNING_SERVICE, String::as_str);
        let access_key_id = super::required(secret, ACCESS_KEY_ID, MODE)?;
        let secret_access_key = super::required(secret, SECRET_ACCESS_KEY, MODE)?;
        let session_token = secret.get(SESSION_TOKEN).filter(|t| !t.is_empty());
        if session_token.is_some_and(|t| HeaderValue::try_from(t.as_str()).is_err()) {
            return Err(SignerError::InvalidValue { key: SESSION_TOKEN });
        }
        let credentials = Credentials::new(
            access_key_id,
            secret_access_key,
            session_token.cloned(),
            None,
            "vmop-credentials-secret",
        );
        Ok(AwsSigner {
            identity: credentials.into(),
            access_key_id: access_key_id.to_owned(),
            region: region.clone(),
            service: service.to_owned(),
        })
    }

    /// Region and service to sign a request to `host` for (see the module docs).
    fn scope_for<'a>(&'a self, host: &'a str) -> (&'a str, &'a str) {
        let aws = host
            .strip_suffix(".amazonaws.com")
            .or_else(|| host.strip_suffix(".amazonaws.com.cn"));
        let Some(prefix) = aws else {
            return (&self.region, &self.service);
        };
        let mut labels = prefix.split('.');
        let service = labels.next().filter(|s| !s.is_empty());
        let region = labels
            .next()
            .filter(|r| r.contains('-') && r.chars().any(|c| c.is_ascii_digit()));
        match (service, region) {
            (Some(service), Some(region)) => (region, service),
            (Some(service), None) => (&self.region, service),
            _ => (&self.region, &self.service),
        }
    }

    pub(super) fn sign(
        &self,
        parts: &mut http::request::Parts,
        body: &[u8],
    ) -> Result<(), SignError> {
        self.sign_at(parts, body, SystemTime::now())
    }

    fn sign_at(
        &self,
        parts: &mut http::request::Parts,
        body: &[u8],
        time: SystemTime,
    ) -> Result<(), SignError> {
        let service_hint = take_hint(&mut parts.headers, SERVICE_HINT)?;
        let region_hint = take_hint(&mut parts.headers, REGION_HINT)?;
        let (region, service) = self.scope_for(parts.uri.host().unwrap_or_default());
        let region = region_hint.as_deref().unwrap_or(region);
        let service = service_hint.as_deref().unwrap_or(service);
        let uri = parts.uri.to_string();
        let headers = parts
            .headers
            .iter()
            .map(|(name, value)| {
                value
                    .to_str()
                    .map(|v| (name.as_str(), v))
                    .map_err(|_| SignError::HeaderNotText { name: name.clone() })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let request = SignableRequest::new(
            parts.method.as_str(),
            uri.as_str(),
            headers.into_iter(),
            SignableBody::Bytes(body),
        )
        .map_err(SignError::Signer)?;
        let params = v4::SigningParams::builder()
            .identity(&self.identity)
            .region(region)
            .name(service)
            .time(time)
            .settings(SigningSettings::default())
            .build()
            .map_err(SignError::Params)?
            .into();
        let (instructions, _signature) = sign(request, &params)
            .map_err(SignError::Signer)?
            .into_parts();
        let (new_headers, _query) = instructions.into_parts();
        for header in new_headers {
            let name = header.name();
            let mut value =
                HeaderValue::try_from(header.value()).map_err(|_| SignError::Produced { name })?;
            // The crate marks only the token; the signature is a credential for 15 minutes too.
            value.set_sensitive(header.sensitive() || name == "authorization");
            let name = HeaderName::try_from(name).map_err(|_| SignError::Produced { name })?;
            parts.headers.insert(name, value);
        }
        Ok(())
    }
}

/// Removes every `name` header; the last one's value if it is a plausible service or region
/// name (lowercase letters, digits, `-`, at most 64 bytes).
fn take_hint(
    headers: &mut http::HeaderMap,
    name: &'static str,
) -> Result<Option<String>, SignError> {
    let mut value = None;
    while let Some(v) = headers.remove(name) {
        value = Some(v);
    }
    let Some(value) = value else {
        return Ok(None);
    };
    let text = value.to_str().unwrap_or_default();
    let valid = !text.is_empty()
        && text.len() <= 64
        && text
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if valid {
        Ok(Some(text.to_owned()))
    } else {
        Err(SignError::BadHint { name })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    /// 2015-08-30T12:36:00Z, the time of the AWS SigV4 test suite.
    const SUITE_TIME: u64 = 1_440_938_160;

    fn suite_signer(token: Option<&str>) -> AwsSigner {
        let settings: BTreeMap<String, String> = [
            (REGION_SETTING.to_owned(), "us-east-1".to_owned()),
            (SIGNING_SERVICE_SETTING.to_owned(), "service".to_owned()),
        ]
        .into();
        let mut secret: BTreeMap<String, String> = [
            (ACCESS_KEY_ID.to_owned(), "AKIDEXAMPLE".to_owned()),
            (
                SECRET_ACCESS_KEY.to_owned(),
                "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY".to_owned(),
            ),
        ]
        .into();
        if let Some(t) = token {
            secret.insert(SESSION_TOKEN.to_owned(), t.to_owned());
        }
        AwsSigner::new(&settings, &secret).unwrap_or_else(|e| panic!("{e}"))
    }

    fn signed(method: &str, uri: &str, token: Option<&str>) -> http::request::Parts {
        let request = http::Request::builder()
            .method(method)
            .uri(uri)
            .header("host", "example.amazonaws.com")
            // The suite's service is `service`, not the host's first label.
            .header(SERVICE_HINT, "service")
            .body(())
            .unwrap_or_else(|e| panic!("{e}"));
        let (mut parts, ()) = request.into_parts();
        suite_signer(token)
            .sign_at(
                &mut parts,
                b"",
                UNIX_EPOCH + Duration::from_secs(SUITE_TIME),
            )
            .unwrap_or_else(|e| panic!("{e}"));
        parts
    }

    fn header<'a>(parts: &'a http::request::Parts, name: &str) -> &'a str {
        parts
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
    }

    fn suite_authorization(signed_headers: &str, signature: &str) -> String {
        format!(
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, \
             SignedHeaders={signed_headers}, Signature={signature}"
        )
    }

    #[test]
    fn aws_test_suite_get_and_post_vanilla() {
        let get = signed("GET", "https://example.amazonaws.com/", None);
        assert_eq!(header(&get, "x-amz-date"), "20150830T123600Z");
        assert_eq!(
            header(&get, "authorization"),
            suite_authorization(
                "host;x-amz-date",
                "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"
            )
        );
        let post = signed("POST", "https://example.amazonaws.com/", None);
        assert_eq!(
            header(&post, "authorization"),
            suite_authorization(
                "host;x-amz-date",
                "5da7c1a2acd57cee7505fc6676e4e544621c30862966e37dddb68e92efbe5d6b"
            )
        );
        assert!(
            get.headers
                .get("authorization")
                .is_some_and(HeaderValue::is_sensitive)
        );
    }

    #[test]
    fn session_token_is_sent_and_signed() {
        let parts = signed("GET", "https://example.amazonaws.com/", Some("TOKEN"));
        assert_eq!(header(&parts, "x-amz-security-token"), "TOKEN");
        assert!(
            header(&parts, "authorization")
                .contains("SignedHeaders=host;x-amz-date;x-amz-security-token,"),
            "{}",
            header(&parts, "authorization")
        );
    }

    #[test]
    fn hints_choose_the_scope_and_are_not_sent() {
        let request = http::Request::builder()
            .method("POST")
            .uri("http://127.0.0.1:5000/")
            .header("host", "127.0.0.1:5000")
            .header(SERVICE_HINT, "sts")
            .header(REGION_HINT, "eu-west-1")
            .body(())
            .unwrap_or_else(|e| panic!("{e}"));
        let (mut parts, ()) = request.into_parts();
        suite_signer(None)
            .sign_at(
                &mut parts,
                b"",
                UNIX_EPOCH + Duration::from_secs(SUITE_TIME),
            )
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            header(&parts, "authorization").contains("/20150830/eu-west-1/sts/aws4_request"),
            "{}",
            header(&parts, "authorization")
        );
        assert!(
            parts.headers.get(SERVICE_HINT).is_none() && parts.headers.get(REGION_HINT).is_none()
        );

        let (mut bad, ()) = http::Request::builder()
            .uri("http://127.0.0.1/")
            .header(SERVICE_HINT, "STS")
            .body(())
            .unwrap_or_else(|e| panic!("{e}"))
            .into_parts();
        assert!(matches!(
            suite_signer(None).sign(&mut bad, b""),
            Err(SignError::BadHint { .. })
        ));
    }

    #[test]
    fn aws_hosts_name_their_service_and_region() {
        let s = suite_signer(None);
        assert_eq!(
            s.scope_for("sts.eu-west-1.amazonaws.com"),
            ("eu-west-1", "sts")
        );
        assert_eq!(
            s.scope_for("ec2.us-east-1.amazonaws.com"),
            ("us-east-1", "ec2")
        );
        assert_eq!(s.scope_for("sts.amazonaws.com"), ("us-east-1", "sts"));
        assert_eq!(s.scope_for("127.0.0.1"), ("us-east-1", "service"));
        assert_eq!(s.scope_for("api.example.com"), ("us-east-1", "service"));
    }

    #[test]
    fn region_and_keys_are_required_and_debug_hides_the_secret() {
        let settings = BTreeMap::new();
        assert!(matches!(
            AwsSigner::new(&settings, &BTreeMap::new()),
            Err(SignerError::MissingSetting { .. })
        ));
        let debug = format!("{:?}", suite_signer(Some("TOKEN")));
        assert!(debug.contains("AKIDEXAMPLE"), "{debug}");
        assert!(
            !debug.contains("wJalrXUtnFEMI") && !debug.contains("TOKEN"),
            "{debug}"
        );
    }
}
