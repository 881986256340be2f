"""AWS Signature Version 4 for header-signed requests (the AWS IAM user guide, "Create a signed
AWS API request"), for `credentials: passthrough` only.

By default (`credentials: aws-sigv4`) the host holds the keys and signs every allowed request
itself: send the request unsigned, with `hints(service, region)` when the endpoint's name does
not say them (moto, LocalStack). Under `passthrough` the Secret's keys are in the config
(`access_key_id`, `secret_access_key`, optional `session_token`) and `sign` adds the
signature. The Rust SDK's `sigv4` module is the same algorithm, checked against the same AWS
test vectors (providers/python/tests/test_sigv4.py).
"""

import hashlib
import hmac
import time
from urllib.parse import quote, unquote_plus, urlsplit

ALGORITHM = "AWS4-HMAC-SHA256"
#: Request headers naming the scope the host signs for; the host removes them before sending.
SERVICE_HINT = "x-vmop-signing-service"
REGION_HINT = "x-vmop-signing-region"


def hints(service, region):
    """The headers that tell the signing host which service and region a request is for."""
    return [(SERVICE_HINT, service), (REGION_HINT, region)]


def encode(text):
    """RFC 3986 encoding as AWS defines it: unreserved characters as is, every other byte `%XX`."""
    return quote(text, safe="-_.~")


def sign(method, url, headers, body, *, region, service, key_id, secret, token=None, now=None):
    """The headers to add to the request: `x-amz-date`, `x-amz-security-token` with a session
    token, and `authorization`. Every header of `headers` (name, value pairs) is signed, and
    the URL's host; `now` is seconds since the epoch (default: the clock)."""
    amz_date = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))
    added = [("x-amz-date", amz_date)]
    if token:
        added.append(("x-amz-security-token", token))
    parts = urlsplit(url)
    signed = sorted([(name.lower(), " ".join(value.split())) for name, value in [*headers, *added]]
                    + [("host", parts.netloc)])
    canonical_headers = ""
    for i, (name, value) in enumerate(signed):
        if i and signed[i - 1][0] == name:  # a repeated header: values joined with commas
            canonical_headers = canonical_headers[:-1] + "," + value + "\n"
        else:
            canonical_headers += f"{name}:{value}\n"
    names = ";".join(dict.fromkeys(name for name, _ in signed))
    canonical = "\n".join([
        method,
        "/".join(encode(segment) for segment in (parts.path or "/").split("/")) or "/",
        _canonical_query(parts.query),
        canonical_headers,
        names,
        hashlib.sha256(body).hexdigest(),
    ])
    scope = f"{amz_date[:8]}/{region}/{service}/aws4_request"
    to_sign = "\n".join([ALGORITHM, amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = signing_key(secret, amz_date[:8], region, service)
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    added.append(("authorization",
                  f"{ALGORITHM} Credential={key_id}/{scope}, SignedHeaders={names}, Signature={signature}"))
    return added


def signing_key(secret, date, region, service):
    key = ("AWS4" + secret).encode()
    for part in (date, region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key


def _canonical_query(query):
    """Parameters decoded, re-encoded the AWS way and sorted by name, then value."""
    pairs = []
    for pair in filter(None, query.split("&")):
        name, _, value = pair.partition("=")
        pairs.append((encode(unquote_plus(name)), encode(unquote_plus(value))))
    return "&".join(f"{n}={v}" for n, v in sorted(pairs))
