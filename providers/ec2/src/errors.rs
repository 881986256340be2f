//! EC2 error codes (the `<Code>` of an error response) mapped to what the host should do.
//! See the EC2 API reference, "Error codes for the Amazon EC2 API".

use std::time::Duration;

use vmop_provider_sdk::ProviderError;
use vmop_provider_sdk::error::{self, DEFAULT_RETRY_AFTER};
use vmop_provider_sdk::status::error_for_status;

/// The error for an EC2 (or STS) error response.
///
/// A 429 or 503 that carries `Retry-After` is `rate-limited` with that delay whatever its code:
/// the server said when it will answer again, and the host's transient backoff would either
/// hammer it or wait too long. Throttling codes are `rate-limited` at any status (with the
/// default delay when there is no header). Codes the table does not know fall back to the HTTP
/// status (5xx transient, 401/403 unauthorized, other 4xx by the SDK's status mapping).
pub fn error_for_code(
    code: &str,
    status: u16,
    retry_after: Option<Duration>,
    message: String,
) -> ProviderError {
    if let (429 | 503, Some(delay)) = (status, retry_after) {
        return error::rate_limited(delay, message);
    }
    match code {
        "AuthFailure"
        | "UnauthorizedOperation"
        | "InvalidClientTokenId"
        | "SignatureDoesNotMatch"
        | "AccessDenied"
        | "MissingAuthenticationToken"
        | "IncompleteSignature"
        | "ExpiredToken"
        | "RequestExpired"
        | "Blocked" => error::unauthorized(message),
        "RequestLimitExceeded" | "Throttling" | "ThrottlingException" => {
            error::rate_limited(retry_after.unwrap_or(DEFAULT_RETRY_AFTER), message)
        }
        "InternalError"
        | "InternalFailure"
        | "Unavailable"
        | "ServiceUnavailable"
        | "InsufficientInstanceCapacity"
        | "InsufficientCapacity"
        // A start, stop or modify during a transition (stopping, pending): passes when the
        // transition ends. A terminated instance never gets here: `get` answers `None` for
        // it, and the host does not power a machine it has seen gone.
        | "IncorrectInstanceState" => error::transient(message),
        "InvalidParameterValue"
        | "InvalidParameterCombination"
        | "InvalidParameter"
        | "InvalidInstanceType"
        | "InvalidUserData.Malformed"
        | "Unsupported"
        | "UnsupportedOperation" => error::invalid_spec(message),
        code if code.starts_with("InvalidAMIID.") => error::invalid_spec(message),
        "InstanceLimitExceeded" | "VcpuLimitExceeded" | "OptInRequired" | "PendingVerification" => {
            error::permanent(message)
        }
        _ => match error_for_status(status, None, message.clone()) {
            Some(ProviderError::InvalidSpec(m)) => error::permanent(m),
            Some(err) => err,
            // An error body with a success status: the cloud is not behaving.
            None => error::transient(message),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(code: &str, status: u16) -> &'static str {
        match error_for_code(code, status, None, format!("{code}: msg")) {
            ProviderError::Transient(_) => "transient",
            ProviderError::RateLimited(_) => "rate-limited",
            ProviderError::Permanent(_) => "permanent",
            ProviderError::InvalidSpec(_) => "invalid-spec",
            ProviderError::Unauthorized(_) => "unauthorized",
        }
    }

    #[test]
    fn maps_documented_codes() {
        for code in [
            "AuthFailure",
            "UnauthorizedOperation",
            "InvalidClientTokenId",
            "SignatureDoesNotMatch",
        ] {
            assert_eq!(class(code, 401), "unauthorized", "{code}");
        }
        assert_eq!(class("RequestLimitExceeded", 503), "rate-limited");
        assert_eq!(class("Throttling", 400), "rate-limited");
        for code in [
            "InvalidAMIID.NotFound",
            "InvalidAMIID.Malformed",
            "InvalidAMIID.Unavailable",
        ] {
            assert_eq!(class(code, 400), "invalid-spec", "{code}");
        }
        assert_eq!(class("InternalError", 500), "transient");
        assert_eq!(class("Unavailable", 503), "transient");
        assert_eq!(class("InstanceLimitExceeded", 400), "permanent");
        assert_eq!(class("IncorrectInstanceState", 400), "transient");
    }

    #[test]
    fn unknown_codes_fall_back_to_the_status() {
        assert_eq!(class("SomethingNew", 503), "transient");
        assert_eq!(class("SomethingNew", 403), "unauthorized");
        assert_eq!(class("SomethingNew", 400), "permanent");
        assert_eq!(class("SomethingNew", 200), "transient");
    }

    #[test]
    fn throttling_uses_the_given_delay() {
        let err = error_for_code(
            "RequestLimitExceeded",
            503,
            Some(Duration::from_secs(2)),
            "m".into(),
        );
        assert!(matches!(err, ProviderError::RateLimited(r) if r.retry_after_ms == 2000));
        let err = error_for_code("Throttling", 400, None, "m".into());
        assert!(matches!(err, ProviderError::RateLimited(r) if r.retry_after_ms == 5000));
    }

    #[test]
    fn unavailable_with_retry_after_waits_as_told() {
        let delay = Some(Duration::from_secs(30));
        for (code, status) in [("Unavailable", 503), ("SomethingNew", 503), ("Foo", 429)] {
            let err = error_for_code(code, status, delay, "m".into());
            assert!(
                matches!(err, ProviderError::RateLimited(ref r) if r.retry_after_ms == 30_000),
                "{code} {status}: {err:?}"
            );
        }
        assert_eq!(class("ServiceUnavailable", 503), "transient", "no header");
        let other = error_for_code("InternalError", 500, delay, "m".into());
        assert!(matches!(other, ProviderError::Transient(_)), "only 429/503");
    }
}
