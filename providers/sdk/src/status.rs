//! Mapping of HTTP responses to the `provider-error` variant, for clouds whose REST APIs speak
//! mostly through status codes. Providers with richer error codes (EC2's `<Code>`) check those
//! first and fall back to this.

use std::time::Duration;

use crate::ProviderError;
use crate::error::{self, DEFAULT_RETRY_AFTER};

/// The error a response with `status` stands for, or `None` for success (1xx–3xx).
///
/// - 429 → `rate-limited`, delay from `Retry-After` (delta-seconds) or [`DEFAULT_RETRY_AFTER`]
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
        401 | 403 => error::unauthorized(message),
        408 | 500..=599 => error::transient(message),
        400 | 404 | 405 | 409 | 410 | 413 | 414 | 415 | 422 => error::invalid_spec(message),
        _ => error::permanent(message),
    };
    Some(error)
}

/// `Retry-After` as delta-seconds. An HTTP-date (or anything else) gives `None`, and callers
/// fall back to a default: a plugin's clock and the cloud's need not agree.
pub fn parse_retry_after(value: &str) -> Option<Duration> {
    let value = value.trim();
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // Capped so a hostile or buggy server cannot park a VM for years.
    let secs = value.parse::<u64>().unwrap_or(u64::MAX).min(3600);
    Some(Duration::from_secs(secs))
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
        assert_eq!(delay(Some("Wed, 21 Oct 2015 07:28:00 GMT")), 5000);
        assert_eq!(delay(Some("-3")), 5000);
        assert_eq!(delay(Some("99999999999999999999999")), 3_600_000);
    }
}
