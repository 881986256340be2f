//! AWS Signature Version 4 for header-signed requests, as specified in the AWS IAM user guide
//! ("Create a signed AWS API request"): canonical request → string to sign → derived key →
//! `Authorization` header. Feature `sigv4`.
//!
//! Only for `credentials: passthrough`. By default (`aws-sigv4`) the host holds the keys and
//! signs every allowed request itself: the plugin sends it unsigned, with the hints
//! [`SIGNING_SERVICE_HINT`] and [`SIGNING_REGION_HINT`] when the endpoint's name does not say
//! the scope (moto, LocalStack). Under `passthrough` the keys are in `config.secrets`
//! ([`Credentials::from_secrets`]) and the plugin signs with [`sign`].
//!
//! [`SIGNING_SERVICE_HINT`]: crate::http::SIGNING_SERVICE_HINT
//! [`SIGNING_REGION_HINT`]: crate::http::SIGNING_REGION_HINT
//!
//! Hand-written rather than the AWS SDK's `aws-sigv4` crate, which the host uses: that crate
//! builds for `wasm32-wasip2` and passes the same test vectors, but brings the smithy runtime
//! with it and made the ec2 component half as large again (300,715 → 449,770 bytes) for a mode
//! that is opt-in.

use std::fmt;

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use crate::ProviderError;
use crate::config::Secrets;
use crate::url::{Url, encode_component};

const ALGORITHM: &str = "AWS4-HMAC-SHA256";

/// Access key, secret key and optional session token. `Debug` shows only the key id.
#[derive(Clone)]
pub struct Credentials {
    pub access_key_id: String,
    pub secret_access_key: String,
    pub session_token: Option<String>,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("access_key_id", &self.access_key_id)
            .field(
                "session_token",
                &self.session_token.as_ref().map(|_| "<redacted>"),
            )
            .finish_non_exhaustive()
    }
}

impl Credentials {
    /// The AWS keys the host hands over under `credentials: passthrough`: `access_key_id`,
    /// `secret_access_key` (required with it) and optional `session_token`. `None` when there
    /// is no `access_key_id`: the host signs (`aws-sigv4`) and the plugin holds no key.
    pub fn from_secrets(secrets: &Secrets) -> Result<Option<Credentials>, ProviderError> {
        let Some(access_key_id) = secrets.get("access_key_id") else {
            return Ok(None);
        };
        Ok(Some(Credentials {
            access_key_id: access_key_id.to_owned(),
            secret_access_key: secrets.require("secret_access_key")?.to_owned(),
            session_token: secrets.get("session_token").map(str::to_owned),
        }))
    }
}

/// What one signature covers besides the request itself.
#[derive(Debug, Clone, Copy)]
pub struct Scope<'a> {
    pub region: &'a str,
    pub service: &'a str,
    /// Seconds since the Unix epoch, UTC.
    pub time: u64,
}

/// The request as it will be sent. `headers` must not contain `host`, `x-amz-date`,
/// `x-amz-security-token` or `authorization`: [`sign`] derives those.
#[derive(Debug, Clone, Copy)]
pub struct Unsigned<'a> {
    pub method: &'a str,
    pub url: &'a Url,
    pub headers: &'a [(String, String)],
    pub payload: &'a [u8],
}

/// The headers to add to the request: `x-amz-date`, `x-amz-security-token` when there is a
/// session token, and `authorization`. Every other header of `request` is signed too.
pub fn sign(
    credentials: &Credentials,
    scope: Scope<'_>,
    request: Unsigned<'_>,
) -> Vec<(String, String)> {
    let amz_date = amz_date(scope.time);
    let date = amz_date.get(..8).unwrap_or_default();
    let mut added = vec![("x-amz-date".to_owned(), amz_date.clone())];
    if let Some(token) = &credentials.session_token {
        added.push(("x-amz-security-token".to_owned(), token.clone()));
    }

    let mut signed: Vec<(String, String)> = request
        .headers
        .iter()
        .chain(&added)
        .map(|(name, value)| (name.to_ascii_lowercase(), normalize_value(value)))
        .chain([("host".to_owned(), request.url.authority().to_owned())])
        .collect();
    signed.sort();
    let canonical = canonical_request(request, &signed);

    let credential_scope = format!("{date}/{}/{}/aws4_request", scope.region, scope.service);
    let string_to_sign = format!(
        "{ALGORITHM}\n{amz_date}\n{credential_scope}\n{}",
        sha256_hex(canonical.as_bytes())
    );
    let key = signing_key(
        &credentials.secret_access_key,
        date,
        scope.region,
        scope.service,
    );
    let signature = hex::encode(hmac(&key, string_to_sign.as_bytes()));

    let signed_names = signed_header_names(&signed);
    added.push((
        "authorization".to_owned(),
        format!(
            "{ALGORITHM} Credential={}/{credential_scope}, SignedHeaders={signed_names}, \
             Signature={signature}",
            credentials.access_key_id
        ),
    ));
    added
}

fn canonical_request(request: Unsigned<'_>, sorted_headers: &[(String, String)]) -> String {
    let url = request.url;
    let query = url
        .path_and_query()
        .split_once('?')
        .map(|(_, q)| q)
        .unwrap_or_default();
    let mut headers = String::new();
    let mut previous: Option<&str> = None;
    for (name, value) in sorted_headers {
        if previous == Some(name.as_str()) {
            // Repeated header: values joined with commas on one line, in order.
            headers.pop();
            headers.push(',');
        } else {
            headers.push_str(name);
            headers.push(':');
        }
        headers.push_str(value);
        headers.push('\n');
        previous = Some(name);
    }
    format!(
        "{}\n{}\n{}\n{}\n{}\n{}",
        request.method,
        canonical_uri(url.path()),
        canonical_query(query),
        headers,
        signed_header_names(sorted_headers),
        sha256_hex(request.payload)
    )
}

fn signed_header_names(sorted_headers: &[(String, String)]) -> String {
    let mut names: Vec<&str> = sorted_headers.iter().map(|(n, _)| n.as_str()).collect();
    names.dedup();
    names.join(";")
}

/// Each path segment URI-encoded (again: the path on the wire is already encoded once).
fn canonical_uri(path: &str) -> String {
    let encoded: Vec<String> = path.split('/').map(encode_component).collect();
    let joined = encoded.join("/");
    if joined.is_empty() {
        "/".to_owned()
    } else {
        joined
    }
}

/// Parameters decoded, re-encoded the AWS way and sorted by name, then value.
fn canonical_query(query: &str) -> String {
    let mut pairs: Vec<(String, String)> = query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            (
                encode_component(&percent_decode(name)),
                encode_component(&percent_decode(value)),
            )
        })
        .collect();
    pairs.sort();
    pairs
        .iter()
        .map(|(n, v)| format!("{n}={v}"))
        .collect::<Vec<_>>()
        .join("&")
}

fn percent_decode(input: &str) -> String {
    let bytes = input.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok());
        match (b, hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(decoded)) => {
                out.push(decoded);
                i += 3;
            }
            (b'+', _) => {
                out.push(b' ');
                i += 1;
            }
            _ => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Trimmed, inner runs of spaces collapsed to one.
fn normalize_value(value: &str) -> String {
    value.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn signing_key(secret: &str, date: &str, region: &str, service: &str) -> Vec<u8> {
    let k_date = hmac(format!("AWS4{secret}").as_bytes(), date.as_bytes());
    let k_region = hmac(&k_date, region.as_bytes());
    let k_service = hmac(&k_region, service.as_bytes());
    hmac(&k_service, b"aws4_request")
}

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    // HMAC accepts keys of any length; `new_from_slice` cannot fail for it.
    match Hmac::<Sha256>::new_from_slice(key) {
        Ok(mut mac) => {
            mac.update(data);
            mac.finalize().into_bytes().to_vec()
        }
        Err(_) => Vec::new(),
    }
}

fn sha256_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

/// `YYYYMMDDTHHMMSSZ` for `unix_secs` (UTC).
fn amz_date(unix_secs: u64) -> String {
    let days = unix_secs / 86_400;
    let secs = unix_secs % 86_400;
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}{month:02}{day:02}T{:02}{:02}{:02}Z",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

/// Gregorian date of a day count since 1970-01-01 (H. Hinnant's `civil_from_days`).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2015-08-30T12:36:00Z, the time of the AWS SigV4 test suite.
    const SUITE_TIME: u64 = 1_440_938_160;

    fn suite_credentials() -> Credentials {
        Credentials {
            access_key_id: "AKIDEXAMPLE".into(),
            secret_access_key: "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY".into(),
            session_token: None,
        }
    }

    fn suite_sign(method: &str, url: &str, headers: &[(String, String)]) -> String {
        let url = Url::parse(url).unwrap();
        let scope = Scope {
            region: "us-east-1",
            service: "service",
            time: SUITE_TIME,
        };
        let request = Unsigned {
            method,
            url: &url,
            headers,
            payload: b"",
        };
        let added = sign(&suite_credentials(), scope, request);
        added
            .into_iter()
            .find(|(n, _)| n == "authorization")
            .map(|(_, v)| v)
            .unwrap()
    }

    fn suite_authorization(signed_headers: &str, signature: &str) -> String {
        format!(
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, \
             SignedHeaders={signed_headers}, Signature={signature}"
        )
    }

    #[test]
    fn aws_test_suite_get_vanilla() {
        assert_eq!(
            suite_sign("GET", "https://example.amazonaws.com/", &[]),
            suite_authorization(
                "host;x-amz-date",
                "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"
            )
        );
    }

    #[test]
    fn aws_test_suite_post_vanilla() {
        assert_eq!(
            suite_sign("POST", "https://example.amazonaws.com/", &[]),
            suite_authorization(
                "host;x-amz-date",
                "5da7c1a2acd57cee7505fc6676e4e544621c30862966e37dddb68e92efbe5d6b"
            )
        );
    }

    #[test]
    fn aws_test_suite_get_vanilla_query_order_key_case() {
        assert_eq!(
            suite_sign(
                "GET",
                "https://example.amazonaws.com/?Param2=value2&Param1=value1",
                &[]
            ),
            suite_authorization(
                "host;x-amz-date",
                "b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500"
            )
        );
    }

    #[test]
    fn derives_the_documented_signing_key() {
        // The key-derivation example of the AWS General Reference (IAM, 2012-02-15).
        let key = signing_key(
            "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
            "20120215",
            "us-east-1",
            "iam",
        );
        assert_eq!(
            hex::encode(key),
            "f4780e2d9f65fa895f9c67b32ce1baf0b0d8a43505a000a1a9e090d414db404d"
        );
    }

    #[test]
    fn session_token_is_signed_and_sent() {
        let mut credentials = suite_credentials();
        credentials.session_token = Some("token-value".into());
        let url = Url::parse("http://127.0.0.1:5000/").unwrap();
        let scope = Scope {
            region: "us-east-1",
            service: "ec2",
            time: SUITE_TIME,
        };
        let headers = [(
            "Content-Type".to_owned(),
            "application/x-www-form-urlencoded".to_owned(),
        )];
        let request = Unsigned {
            method: "POST",
            url: &url,
            headers: &headers,
            payload: b"A=1",
        };
        let added = sign(&credentials, scope, request);
        let names: Vec<&str> = added.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            ["x-amz-date", "x-amz-security-token", "authorization"]
        );
        let auth = &added.last().unwrap().1;
        assert!(
            auth.contains("SignedHeaders=content-type;host;x-amz-date;x-amz-security-token,"),
            "{auth}"
        );
        assert!(!auth.contains("wJalr"), "{auth}");
    }

    #[test]
    fn passthrough_keys_or_none() {
        let secrets = |keys: &[(&str, &str)]| keys.iter().copied().collect::<Secrets>();
        assert!(matches!(Credentials::from_secrets(&secrets(&[])), Ok(None)));
        let full = Credentials::from_secrets(&secrets(&[
            ("access_key_id", "AKID"),
            ("secret_access_key", "s"),
            ("session_token", "t"),
        ]));
        assert!(matches!(
            &full,
            Ok(Some(Credentials { session_token: Some(t), .. })) if t == "t"
        ));
        match Credentials::from_secrets(&secrets(&[("access_key_id", "AKID")])) {
            Err(ProviderError::Permanent(m)) => assert!(m.contains("secret_access_key"), "{m}"),
            other => panic!("expected a permanent error, got {other:?}"),
        }
        let debug = format!("{full:?}");
        assert!(
            debug.contains("AKID") && !debug.contains("\"t\""),
            "{debug}"
        );
    }

    #[test]
    fn formats_amz_dates() {
        assert_eq!(amz_date(SUITE_TIME), "20150830T123600Z");
        assert_eq!(amz_date(0), "19700101T000000Z");
        assert_eq!(amz_date(951_782_400), "20000229T000000Z");
        assert_eq!(amz_date(1_798_761_599), "20261231T235959Z");
    }

    #[test]
    fn encodes_the_aws_way() {
        assert_eq!(encode_component("a b/c~d_e.f-g*"), "a%20b%2Fc~d_e.f-g%2A");
        assert_eq!(encode_component("tag:vmop.dev/uid"), "tag%3Avmop.dev%2Fuid");
        assert_eq!(canonical_query("b=2&a=%41&a=1"), "a=1&a=A&b=2");
        assert_eq!(canonical_uri("/"), "/");
        assert_eq!(canonical_uri(""), "/");
        assert_eq!(normalize_value("  a   b  "), "a b");
    }
}
