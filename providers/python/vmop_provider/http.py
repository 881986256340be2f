"""Blocking HTTP over `wasi:http/outgoing-handler`, on the raw bindings of world
`plugin-http` (wit/http-guest/).

Why not componentize-py's `poll_loop.py`: it imports the bindings' `types` module, which in
this world is named `wasi_http_types` (two imported interfaces are called `types`), so it
fails at import. Why blocking: every export runs to completion in a fresh instance, so there
is nothing else to do while a request is in flight.

Errors, as the Rust SDK's `http` module: a destination outside the ProviderConfig's
`allowedHosts` (the host answers `http-request-denied`) is `permanent`; connection failures,
timeouts and a response over `max_bytes` are `transient`. HTTP error statuses are answers,
not errors: see `errors.error_for_status`.

Resources are dropped children first (`with`), as wasi:http requires.
"""

from dataclasses import dataclass
from urllib.parse import urlsplit

from componentize_py_types import Err
from wit_world.imports import outgoing_handler
from wit_world.imports import wasi_http_types as wasi
from wit_world.imports.streams import StreamError_Closed

from .errors import permanent, transient

#: Largest response body read, like the Rust SDK's default.
MAX_RESPONSE_BYTES = 4 << 20
#: Per-request timeout (connect, first byte, between bytes); the host's call deadline caps it.
TIMEOUT_SECONDS = 30
#: wasi:io allows at most 4096 bytes per `blocking-write-and-flush`.
_WRITE_CHUNK = 4096
_READ_CHUNK = 65536

_METHODS = {
    "GET": wasi.Method_Get,
    "HEAD": wasi.Method_Head,
    "POST": wasi.Method_Post,
    "PUT": wasi.Method_Put,
    "PATCH": wasi.Method_Patch,
    "DELETE": wasi.Method_Delete,
}

_TIMEOUTS = (
    wasi.ErrorCode_ConnectionTimeout,
    wasi.ErrorCode_ConnectionReadTimeout,
    wasi.ErrorCode_ConnectionWriteTimeout,
    wasi.ErrorCode_HttpResponseTimeout,
    wasi.ErrorCode_DnsTimeout,
)


@dataclass
class Response:
    status: int
    #: Lowercase names, values decoded as latin-1 (HTTP's own encoding).
    headers: dict
    body: bytes

    def header(self, name):
        return self.headers.get(name.lower())

    def text(self):
        return self.body.decode("utf-8", errors="replace")


def request(method, url, headers=(), body=b"", max_bytes=MAX_RESPONSE_BYTES):
    """Sends one request and reads the whole response. `headers` must not contain `host`
    (the host derives it from the URL). Raises the errors described in the module docs."""
    parts = urlsplit(url)
    scheme = {"http": wasi.Scheme_Http(), "https": wasi.Scheme_Https()}.get(parts.scheme)
    if scheme is None or not parts.netloc:
        raise permanent(f"`{url}` is not an http(s) URL")
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    try:
        fields = wasi.Fields.from_list([(k.lower(), v.encode("latin-1")) for k, v in headers])
    except Err as e:
        raise permanent(f"invalid request header ({type(e.value).__name__})")
    outgoing = wasi.OutgoingRequest(fields)
    outgoing.set_method(_METHODS[method]())
    outgoing.set_scheme(scheme)
    outgoing.set_authority(parts.netloc)
    outgoing.set_path_with_query(path)
    outgoing_body = outgoing.body()
    try:
        future = outgoing_handler.handle(outgoing, _options())
    except Err as e:
        raise _transport_error(e.value, url)
    with future:
        _write_body(outgoing_body, body)
        with future.subscribe() as ready:
            ready.block()
        answer = future.get()
        if answer is None or isinstance(answer, Err):
            raise transient(f"the host returned no response for {url}")
        if isinstance(answer.value, Err):
            raise _transport_error(answer.value.value, url)
        with answer.value.value as response:
            return _read(response, max_bytes, url)


def _options():
    options = wasi.RequestOptions()
    nanos = TIMEOUT_SECONDS * 1_000_000_000
    for setter in (
        options.set_connect_timeout,
        options.set_first_byte_timeout,
        options.set_between_bytes_timeout,
    ):
        try:
            setter(nanos)
        except Err:
            pass  # this host does not support that timeout; the call deadline still applies
    return options


def _write_body(outgoing_body, body):
    """Sends the body after `handle` (the host streams it; a body larger than the pipe's
    buffer would block forever before). A refused body shows in the response instead."""
    try:
        with outgoing_body.write() as stream:
            for start in range(0, len(body), _WRITE_CHUNK):
                stream.blocking_write_and_flush(body[start : start + _WRITE_CHUNK])
        wasi.OutgoingBody.finish(outgoing_body, None)
    except Err:
        pass


def _read(response, max_bytes, url):
    status = response.status()
    with response.headers() as fields:
        headers = {k.lower(): v.decode("latin-1") for k, v in fields.entries()}
    chunks, size = [], 0
    with response.consume() as incoming, incoming.stream() as stream:
        while True:
            try:
                chunk = stream.blocking_read(_READ_CHUNK)
            except Err as e:
                if isinstance(e.value, StreamError_Closed):
                    break
                raise transient(f"reading the response of {url} failed")
            size += len(chunk)
            if size > max_bytes:
                raise transient(f"the response of {url} is larger than {max_bytes} bytes")
            chunks.append(chunk)
    return Response(status, headers, b"".join(chunks))


def _transport_error(code, url):
    if isinstance(code, wasi.ErrorCode_HttpRequestDenied):
        return permanent(
            f"the host refused the connection to {url}: "
            "the endpoint is not in the ProviderConfig's allowedHosts"
        )
    what = "timed out" if isinstance(code, _TIMEOUTS) else "failed"
    return transient(f"the request to {url} {what} ({type(code).__name__})")
