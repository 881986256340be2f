//! Constructors for the `provider-error` variant that read well at call sites.

use std::time::Duration;

use crate::{ProviderError, RateLimit};

/// The wait suggested to the host when a cloud throttles without saying for how long.
pub const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(5);

/// `rate-limited`, with the delay rounded to whole milliseconds (saturating).
pub fn rate_limited(retry_after: Duration, message: impl Into<String>) -> ProviderError {
    ProviderError::RateLimited(RateLimit {
        retry_after_ms: u64::try_from(retry_after.as_millis()).unwrap_or(u64::MAX),
        message: message.into(),
    })
}

pub fn transient(message: impl Into<String>) -> ProviderError {
    ProviderError::Transient(message.into())
}

pub fn permanent(message: impl Into<String>) -> ProviderError {
    ProviderError::Permanent(message.into())
}

pub fn invalid_spec(message: impl Into<String>) -> ProviderError {
    ProviderError::InvalidSpec(message.into())
}

pub fn unauthorized(message: impl Into<String>) -> ProviderError {
    ProviderError::Unauthorized(message.into())
}
