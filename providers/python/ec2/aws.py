"""The AWS Query API (EC2 2016-11-15, STS 2011-06-15) signed with Signature Version 4, and
its error codes mapped to the contract's classes (the Rust ec2 provider's `errors.rs` table).

The host signs by default (`credentials: aws-sigv4`). Under `credentials: passthrough` the
ProviderConfig's Secret hands the keys over (`access_key_id`, `secret_access_key`, optional
`session_token`) and `vmop_provider.sigv4` signs here.
"""

import xml.etree.ElementTree as ET

from vmop_provider import errors, request, sigv4

_VERSIONS = {"ec2": "2016-11-15", "sts": "2011-06-15"}
_CONTENT_TYPE = "application/x-www-form-urlencoded; charset=utf-8"

_UNAUTHORIZED = {
    "AuthFailure", "UnauthorizedOperation", "InvalidClientTokenId", "SignatureDoesNotMatch",
    "AccessDenied", "MissingAuthenticationToken", "IncompleteSignature", "ExpiredToken",
    "RequestExpired", "Blocked",
}
_THROTTLED = {"RequestLimitExceeded", "Throttling", "ThrottlingException"}
_TRANSIENT = {
    "InternalError", "InternalFailure", "Unavailable", "ServiceUnavailable",
    "InsufficientInstanceCapacity", "InsufficientCapacity", "IncorrectInstanceState",
}
_INVALID_SPEC = {
    "InvalidParameterValue", "InvalidParameterCombination", "InvalidParameter",
    "InvalidInstanceType", "InvalidUserData.Malformed", "Unsupported", "UnsupportedOperation",
}
_PERMANENT = {"InstanceLimitExceeded", "VcpuLimitExceeded", "OptInRequired", "PendingVerification"}


class CallError(Exception):
    """An error response, kept with its code so callers can treat some codes as answers
    (`InvalidInstanceID.NotFound` means "no such machine"). `error()` is what to raise."""

    def __init__(self, code, status, retry_after, message):
        super().__init__(message)
        self.code, self.status, self.retry_after, self.message = code, status, retry_after, message

    def error(self):
        code, message = self.code, self.message
        if self.status in (429, 503) and errors.retry_after_ms(self.retry_after) is not None:
            return errors.rate_limited(errors.retry_after_ms(self.retry_after), message)
        if code in _UNAUTHORIZED:
            return errors.unauthorized(message)
        if code in _THROTTLED:
            delay = errors.retry_after_ms(self.retry_after)
            return errors.rate_limited(delay or errors.DEFAULT_RETRY_AFTER_MS, message)
        if code in _TRANSIENT:
            return errors.transient(message)
        if code in _INVALID_SPEC or code.startswith("InvalidAMIID."):
            return errors.invalid_spec(message)
        if code in _PERMANENT:
            return errors.permanent(message)
        by_status = errors.error_for_status(self.status, self.retry_after, message)
        if by_status is None:
            return errors.transient(message)
        # An unknown 4xx code is not known to be the spec's fault.
        if isinstance(by_status.value, errors.ProviderError_InvalidSpec):
            return errors.permanent(message)
        return by_status


class Api:
    """One AWS service at one endpoint, with the config's region and credentials."""

    def __init__(self, config, service, endpoint):
        self.service, self.endpoint = service, endpoint.rstrip("/")
        self.region = config.require("region")
        # Under host-side signing (`credentials: aws-sigv4`, the default) the plugin holds no
        # key: the request goes out unsigned with the service and region as hints for the host.
        self.key_id = config.secret("access_key_id")
        self.secret = config.require_secret("secret_access_key") if self.key_id else None
        self.token = config.secret("session_token")

    def call(self, action, params=()):
        """The XML root of a 2xx answer; raises `CallError` for an error answer."""
        pairs = [("Action", action), ("Version", _VERSIONS[self.service]), *params]
        body = "&".join(f"{sigv4.encode(k)}={sigv4.encode(str(v))}" for k, v in pairs).encode()
        response = request("POST", self.endpoint + "/", self._headers(body), body)
        if 200 <= response.status < 300:
            try:
                return ET.fromstring(response.body)
            except ET.ParseError:
                raise errors.transient(f"{action} answered with malformed XML")
        code, message = _error_of(response.body)
        text = f"{action}: {code}: {message}" if code else f"{action}: HTTP {response.status}"
        raise CallError(code or "", response.status, response.header("retry-after"), text)

    def _headers(self, body):
        """Content type, and the signature (passthrough) or the host's signing hints."""
        headers = [("content-type", _CONTENT_TYPE)]
        if not self.key_id:
            return headers + sigv4.hints(self.service, self.region)
        return headers + sigv4.sign("POST", self.endpoint + "/", headers, body, region=self.region,
                                    service=self.service, key_id=self.key_id, secret=self.secret,
                                    token=self.token)


def local(element):
    """An element's tag without its XML namespace."""
    return element.tag.rsplit("}", 1)[-1]


def child_text(element, name):
    for child in element:
        if local(child) == name:
            return (child.text or "").strip()
    return None


def _error_of(body):
    """`(code, message)` of `<Errors><Error>` (EC2) or `<ErrorResponse><Error>` (STS)."""
    try:
        root = ET.fromstring(body)
    except ET.ParseError:
        return None, None
    for element in root.iter():
        if local(element) == "Error":
            return child_text(element, "Code"), child_text(element, "Message") or ""
    return None, None
