//! Mapping of HTTP responses to the `provider-error` variant, for clouds whose REST APIs speak
//! mostly through status codes. Providers with richer error codes (EC2's `<Code>`) check those
//! first and fall back to this.

use crate::ProviderError;
use crate::error::{self, DEFAULT_RETRY_AFTER};
use crate::http::Response;
pub use crate::retry_after::parse as parse_retry_after;

/// How much of an error body [`error_for_response`] quotes: enough for a cloud's error code
/// and sentence, well inside the contract's 1024-byte message bound.
const QUOTED_BODY_CHARS: usize = 512;

/// The error a response with `status` stands for, or `None` for success (1xx–3xx).
///
/// - 429 → `rate-limited`, delay from `Retry-After` or [`DEFAULT_RETRY_AFTER`]
/// - 503 with a valid `Retry-After` → `rate-limited` with that delay: the server said when it
///   will have capacity again, and a blind backoff would either hammer it or wait too long
/// - 401, 403 → `unauthorized`
/// - 400, 404, 405, 409, 410, 413, 414, 415, 422 → `invalid-spec` (the request as asked cannot
///   succeed)
/// - 408 and every 5xx → `transient`
/// - any other 4xx → `permanent`
pub fn error_for_status(
    status: u16,
    retry_after: Option<&str>,
    message: impl Into<String>,
) -> Option<ProviderError> {
    let message = message.into();
    let error = match status {
        100..=399 => return None,
        429 => {
            let delay = retry_after
                .and_then(parse_retry_after)
                .unwrap_or(DEFAULT_RETRY_AFTER);
            error::rate_limited(delay, message)
        }
        503 => match retry_after.and_then(parse_retry_after) {
            Some(delay) => error::rate_limited(delay, message),
            None => error::transient(message),
        },
        401 | 403 => error::unauthorized(message),
        408 | 500..=599 => error::transient(message),
        400 | 404 | 405 | 409 | 410 | 413 | 414 | 415 | 422 => error::invalid_spec(message),
        _ => error::permanent(message),
    };
    Some(error)
}

/// [`error_for_status`] for a whole response: its `Retry-After` header, and a message
/// `HTTP <status>: <start of the body>`.
pub fn error_for_response(response: &Response) -> Option<ProviderError> {
    let body: String = response.text().chars().take(QUOTED_BODY_CHARS).collect();
    let message = format!("HTTP {}: {}", response.status, body.trim());
    error_for_status(response.status, response.header("retry-after"), message)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(status: u16) -> &'static str {
        match error_for_status(status, None, "m") {
            None => "ok",
            Some(ProviderError::Transient(_)) => "transient",
            Some(ProviderError::RateLimited(_)) => "rate-limited",
            Some(ProviderError::Permanent(_)) => "permanent",
            Some(ProviderError::InvalidSpec(_)) => "invalid-spec",
            Some(ProviderError::Unauthorized(_)) => "unauthorized",
        }
    }

    #[test]
    fn maps_status_classes() {
        assert_eq!(class(200), "ok");
        assert_eq!(class(204), "ok");
        assert_eq!(class(302), "ok");
        assert_eq!(class(429), "rate-limited");
        assert_eq!(class(401), "unauthorized");
        assert_eq!(class(403), "unauthorized");
        assert_eq!(class(500), "transient");
        assert_eq!(class(502), "transient");
        assert_eq!(class(503), "transient");
        assert_eq!(class(408), "transient");
        assert_eq!(class(400), "invalid-spec");
        assert_eq!(class(404), "invalid-spec");
        assert_eq!(class(422), "invalid-spec");
        assert_eq!(class(402), "permanent");
        assert_eq!(class(451), "permanent");
    }

    #[test]
    fn rate_limit_uses_retry_after_or_default() {
        let delay = |header| match error_for_status(429, header, "slow down") {
            Some(ProviderError::RateLimited(r)) => {
                assert_eq!(r.message, "slow down");
                r.retry_after_ms
            }
            other => panic!("expected rate-limited, got {other:?}"),
        };
        assert_eq!(delay(Some("7")), 7000);
        assert_eq!(delay(Some(" 0 ")), 0);
        assert_eq!(delay(None), 5000);
        assert_eq!(
            delay(Some("Wed, 21 Oct 2015 07:28:00 GMT")),
            0,
            "a past date"
        );
        assert_eq!(delay(Some("Wednesday, 21-Oct-15 07:28:00 GMT")), 5000);
        assert_eq!(delay(Some("-3")), 5000);
        assert_eq!(delay(Some("99999999999999999999999")), 3_600_000);
    }

    #[test]
    fn unavailable_with_retry_after_is_rate_limited() {
        match error_for_status(503, Some("12"), "busy") {
            Some(ProviderError::RateLimited(r)) => assert_eq!(r.retry_after_ms, 12_000),
            other => panic!("expected rate-limited, got {other:?}"),
        }
        assert!(matches!(
            error_for_status(503, Some("later"), "busy"),
            Some(ProviderError::Transient(_))
        ));
    }

    #[test]
    fn whole_responses_quote_the_body_and_use_the_header() {
        let response = Response {
            status: 503,
            headers: vec![("Retry-After".into(), b"3".to_vec())],
            body: format!("  overloaded {}", "x".repeat(5000)).into_bytes(),
        };
        match error_for_response(&response) {
            Some(ProviderError::RateLimited(r)) => {
                assert_eq!(r.retry_after_ms, 3000);
                assert!(
                    r.message.starts_with("HTTP 503: overloaded x"),
                    "{}",
                    r.message
                );
                assert!(r.message.len() < 1024);
            }
            other => panic!("expected rate-limited, got {other:?}"),
        }
        let ok = Response {
            status: 200,
            headers: Vec::new(),
            body: Vec::new(),
        };
        assert!(error_for_response(&ok).is_none());
    }
}
