"""Timestamps as clouds write them, as milliseconds since the Unix epoch (what
`listed-machine.created-at-ms` carries; the Rust SDK's `time::rfc3339_ms`).

Only the standard library: `python3 -m unittest discover -s providers/python/tests` tests it.
"""

from datetime import datetime, timedelta, timezone

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MILLISECOND = timedelta(milliseconds=1)


def rfc3339_ms(value):
    """Milliseconds since the Unix epoch of an RFC 3339 timestamp with a zone
    (`2026-11-29T21:00:00.000Z`, `...+01:00`); `None` for anything else, a time without a zone,
    and times before 1970."""
    if not isinstance(value, str):
        return None
    try:
        moment = datetime.fromisoformat(value.strip())
    except ValueError:
        return None
    if moment.tzinfo is None or moment < _EPOCH:
        return None
    return (moment - _EPOCH) // _MILLISECOND
