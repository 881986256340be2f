"""The contract's error classes (`provider-error` in wit/provider.wit), as exceptions to raise.

componentize-py turns `raise Err(<variant>)` in an export into the WIT `err(...)`; every
other exception escaping an export traps the call (the host reports a plugin fault). So a
provider raises one of these for anything the cloud or the user did, and lets bugs trap:

    raise invalid_spec(f"image {image} does not exist")

Each helper cuts its message to the contract's bound (`bounds.MAX_MESSAGE` bytes, on a
character boundary) and clamps the delay to `bounds.MAX_RETRY_AFTER_MS`, so a long cloud error
never turns into a contract violation.
"""

from componentize_py_types import Err
from wit_world.imports.vmop_provider_types import (
    ProviderError_InvalidSpec,
    ProviderError_Permanent,
    ProviderError_RateLimited,
    ProviderError_Transient,
    ProviderError_Unauthorized,
    RateLimit,
)

from .bounds import MAX_MESSAGE, MAX_RETRY_AFTER_MS

#: The delay of a 429 without `Retry-After` (the Rust SDK's default too).
DEFAULT_RETRY_AFTER_MS = 5_000


def bounded(text: str, limit: int = MAX_MESSAGE) -> str:
    """`text` cut to at most `limit` bytes of UTF-8, never inside a character."""
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    return data[:limit].decode("utf-8", errors="ignore")


def transient(message: str) -> Err:
    """May pass by itself (network, 5xx): the host retries with backoff."""
    return Err(ProviderError_Transient(bounded(message)))


def permanent(message: str) -> Err:
    """Retrying will not help until the config, Secret or VM changes."""
    return Err(ProviderError_Permanent(bounded(message)))


def invalid_spec(message: str) -> Err:
    """The VM's spec cannot be satisfied: the user must fix it."""
    return Err(ProviderError_InvalidSpec(bounded(message)))


def unauthorized(message: str) -> Err:
    """The credentials were refused or lack a permission."""
    return Err(ProviderError_Unauthorized(bounded(message)))


def rate_limited(retry_after_ms: int, message: str) -> Err:
    """The cloud throttled us: the host waits `retry_after_ms` (clamped to
    0..=MAX_RETRY_AFTER_MS)."""
    delay = min(max(int(retry_after_ms), 0), MAX_RETRY_AFTER_MS)
    return Err(ProviderError_RateLimited(RateLimit(delay, bounded(message))))


def retry_after_ms(header):
    """`Retry-After` as delta-seconds, in milliseconds; `None` when absent or not a number.
    (HTTP dates are rare from APIs; they fall back to the default delay.)"""
    if header is None or not header.strip().isdigit():
        return None
    return int(header.strip()) * 1000


def error_for_status(status: int, retry_after, message: str):
    """The error an HTTP status stands for, or `None` for 1xx-3xx. The same table as the Rust
    SDK's `status::error_for_status`: 429 and 503-with-Retry-After rate-limited, 401/403
    unauthorized, 408/5xx transient, 400/404/405/409/410/413/414/415/422 invalid-spec, other
    4xx permanent."""
    delay = retry_after_ms(retry_after)
    if status < 400:
        return None
    if status == 429:
        return rate_limited(DEFAULT_RETRY_AFTER_MS if delay is None else delay, message)
    if status == 503 and delay is not None:
        return rate_limited(delay, message)
    if status in (401, 403):
        return unauthorized(message)
    if status == 408 or status >= 500:
        return transient(message)
    if status in (400, 404, 405, 409, 410, 413, 414, 415, 422):
        return invalid_spec(message)
    return permanent(message)
