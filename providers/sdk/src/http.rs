//! A small blocking HTTP client over `wasi:http/outgoing-handler` (the `wasip2` crate's
//! bindings, WASI 0.2.12 like the host).
//!
//! Blocking is right here: every export runs to completion in its own fresh instance, so there is
//! nothing else for the guest to do while a request is in flight. The host enforces the egress
//! allowlist, clamps timeouts to the call deadline and bounds response sizes; this client adds
//! per-request timeouts and its own response-size bound so a provider fails with a clear error
//! rather than at the host's limit.

use std::io::{self, Read, Write};
use std::time::Duration;

use wasip2::http::outgoing_handler;
use wasip2::http::types::{
    ErrorCode, Fields, HeaderError, IncomingBody, IncomingResponse, Method as WasiMethod,
    OutgoingBody, OutgoingRequest, RequestOptions, Scheme as WasiScheme,
};

use crate::ProviderError;
use crate::url::{Scheme, Url};

/// The request header naming the AWS SigV4 service the host signs a request for under
/// `credentials: aws-sigv4` (the default), when the endpoint's name does not say it (moto,
/// LocalStack, an STS call to an EC2 endpoint). The host removes it before sending.
pub const SIGNING_SERVICE_HINT: &str = "x-vmop-signing-service";
/// The request header naming the region the host signs for; see [`SIGNING_SERVICE_HINT`].
pub const SIGNING_REGION_HINT: &str = "x-vmop-signing-region";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Get,
    Head,
    Post,
    Put,
    Patch,
    Delete,
}

impl Method {
    /// The method's name on the wire, `GET`, `POST`, ...
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Head => "HEAD",
            Method::Post => "POST",
            Method::Put => "PUT",
            Method::Patch => "PATCH",
            Method::Delete => "DELETE",
        }
    }

    fn to_wasi(self) -> WasiMethod {
        match self {
            Method::Get => WasiMethod::Get,
            Method::Head => WasiMethod::Head,
            Method::Post => WasiMethod::Post,
            Method::Put => WasiMethod::Put,
            Method::Patch => WasiMethod::Patch,
            Method::Delete => WasiMethod::Delete,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Request {
    pub method: Method,
    pub url: Url,
    /// Sent as given; `host` is derived from the URL by the host and must not be set.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Request {
    pub fn new(method: Method, url: Url) -> Self {
        Request {
            method,
            url,
            headers: Vec::new(),
            body: Vec::new(),
        }
    }

    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Self {
        self.body = body.into();
        self
    }
}

#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, Vec<u8>)>,
    pub body: Vec<u8>,
}

impl Response {
    /// The first value of header `name` (case-insensitive), if it is UTF-8.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .and_then(|(_, v)| std::str::from_utf8(v).ok())
    }

    /// The body as text, with invalid UTF-8 replaced.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("invalid request header `{name}`")]
    Header {
        name: String,
        #[source]
        source: HeaderError,
    },
    #[error("the host rejected the request's {0}")]
    Rejected(&'static str),
    #[error(
        "the host refused the connection: the endpoint is not in the ProviderConfig's allowedHosts"
    )]
    Denied,
    #[error("the request timed out")]
    Timeout(#[source] ErrorCode),
    #[error("the request failed")]
    Transport(#[source] ErrorCode),
    #[error("sending the request body failed")]
    SendBody(#[source] io::Error),
    #[error("reading the response body failed")]
    ReadBody(#[source] io::Error),
    #[error("the response body is larger than {limit} bytes")]
    TooLarge { limit: usize },
    #[error("the host returned no response")]
    NoResponse,
}

impl From<ErrorCode> for HttpError {
    fn from(code: ErrorCode) -> Self {
        match code {
            ErrorCode::HttpRequestDenied => HttpError::Denied,
            ErrorCode::ConnectionTimeout
            | ErrorCode::ConnectionReadTimeout
            | ErrorCode::ConnectionWriteTimeout
            | ErrorCode::HttpResponseTimeout
            | ErrorCode::DnsTimeout => HttpError::Timeout(code),
            code => HttpError::Transport(code),
        }
    }
}

impl From<HttpError> for ProviderError {
    /// A refused destination or a request the host cannot represent needs a configuration change
    /// (`permanent`); everything on the wire may pass (`transient`).
    fn from(err: HttpError) -> Self {
        let message = error_chain(&err);
        match err {
            HttpError::Header { .. } | HttpError::Rejected(_) | HttpError::Denied => {
                ProviderError::Permanent(message)
            }
            HttpError::Timeout(_)
            | HttpError::Transport(_)
            | HttpError::SendBody(_)
            | HttpError::ReadBody(_)
            | HttpError::TooLarge { .. }
            | HttpError::NoResponse => ProviderError::Transient(message),
        }
    }
}

/// `err: cause: cause`, for messages that cross into the host as plain strings.
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut message = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}

/// Per-request settings. The defaults suit a control-plane API: 30 s per phase, 4 MiB bodies.
#[derive(Debug, Clone)]
pub struct Client {
    timeout: Duration,
    max_response_bytes: usize,
}

impl Default for Client {
    fn default() -> Self {
        Client {
            timeout: Duration::from_secs(30),
            max_response_bytes: 4 << 20,
        }
    }
}

impl Client {
    pub fn new() -> Self {
        Self::default()
    }

    /// Applied to connect, first byte and between bytes (the host clamps it to the call deadline).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    pub fn with_max_response_bytes(mut self, limit: usize) -> Self {
        self.max_response_bytes = limit;
        self
    }

    /// Sends `request` and reads the whole response. Any status is a response, not an error:
    /// see [`crate::status::error_for_status`].
    pub fn send(&self, request: &Request) -> Result<Response, HttpError> {
        let outgoing = self.outgoing_request(request)?;
        let body = outgoing.body().map_err(|()| HttpError::Rejected("body"))?;
        let future = outgoing_handler::handle(outgoing, Some(self.options()))?;
        let sent = write_body(body, &request.body);

        // Waited for even when sending failed: a refused or broken connection fails the body
        // stream too, and the response says why.
        future.subscribe().block();
        let response = match future.get() {
            Some(Ok(result)) => result?,
            Some(Err(())) | None => return Err(HttpError::NoResponse),
        };
        sent?;
        self.read_response(response)
    }

    fn outgoing_request(&self, request: &Request) -> Result<OutgoingRequest, HttpError> {
        let entries = request
            .headers
            .iter()
            .map(|(name, value)| (name.to_ascii_lowercase(), value.as_bytes().to_vec()))
            .collect::<Vec<_>>();
        let headers = Fields::from_list(&entries).map_err(|source| {
            let name = first_invalid_header(&entries).unwrap_or_default();
            HttpError::Header { name, source }
        })?;
        let outgoing = OutgoingRequest::new(headers);
        outgoing
            .set_method(&request.method.to_wasi())
            .map_err(|()| HttpError::Rejected("method"))?;
        let scheme = match request.url.scheme() {
            Scheme::Http => WasiScheme::Http,
            Scheme::Https => WasiScheme::Https,
        };
        outgoing
            .set_scheme(Some(&scheme))
            .map_err(|()| HttpError::Rejected("scheme"))?;
        outgoing
            .set_authority(Some(request.url.authority()))
            .map_err(|()| HttpError::Rejected("authority"))?;
        outgoing
            .set_path_with_query(Some(request.url.path_and_query()))
            .map_err(|()| HttpError::Rejected("path"))?;
        Ok(outgoing)
    }

    fn options(&self) -> RequestOptions {
        let nanos = Some(u64::try_from(self.timeout.as_nanos()).unwrap_or(u64::MAX));
        let options = RequestOptions::new();
        // An `Err` means the host does not support that timeout; its own deadline still applies.
        let _ = options.set_connect_timeout(nanos);
        let _ = options.set_first_byte_timeout(nanos);
        let _ = options.set_between_bytes_timeout(nanos);
        options
    }

    fn read_response(&self, response: IncomingResponse) -> Result<Response, HttpError> {
        let status = response.status();
        let headers = response.headers().entries();
        let body = response.consume().map_err(|()| HttpError::NoResponse)?;
        let bytes = read_body(&body, self.max_response_bytes)?;
        drop(body);
        Ok(Response {
            status,
            headers,
            body: bytes,
        })
    }
}

/// Writes and finishes the body. An empty body is only finished: the host may send a
/// body-less request (a GET) at once and close the stream when the answer is in, so a flush
/// of nothing could fail a request the server has already answered.
fn write_body(body: OutgoingBody, bytes: &[u8]) -> Result<(), HttpError> {
    if !bytes.is_empty() {
        let mut stream = body
            .write()
            .map_err(|()| HttpError::Rejected("body stream"))?;
        stream.write_all(bytes).map_err(HttpError::SendBody)?;
        Write::flush(&mut stream).map_err(HttpError::SendBody)?;
    }
    OutgoingBody::finish(body, None)?;
    Ok(())
}

/// Reads at most `limit` bytes; the stream (a child of `body`) is dropped before returning.
fn read_body(body: &IncomingBody, limit: usize) -> Result<Vec<u8>, HttpError> {
    let stream = body.stream().map_err(|()| HttpError::NoResponse)?;
    let mut bytes = Vec::new();
    let cap = u64::try_from(limit).unwrap_or(u64::MAX).saturating_add(1);
    stream
        .take(cap)
        .read_to_end(&mut bytes)
        .map_err(HttpError::ReadBody)?;
    if bytes.len() > limit {
        return Err(HttpError::TooLarge { limit });
    }
    Ok(bytes)
}

/// The header the host is most likely to have refused, for the error message.
fn first_invalid_header(entries: &[(String, Vec<u8>)]) -> Option<String> {
    const FORBIDDEN: [&str; 7] = [
        "host",
        "connection",
        "keep-alive",
        "proxy-connection",
        "transfer-encoding",
        "upgrade",
        "te",
    ];
    entries
        .iter()
        .find(|(name, value)| {
            FORBIDDEN.contains(&name.as_str())
                || name.is_empty()
                || value.iter().any(|b| *b == b'\r' || *b == b'\n' || *b == 0)
        })
        .or(entries.first())
        .map(|(name, _)| name.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_failures_are_transient_and_config_failures_permanent() {
        let transient = ProviderError::from(HttpError::from(ErrorCode::ConnectionRefused));
        assert!(
            matches!(transient, ProviderError::Transient(ref m) if m.contains("ConnectionRefused"))
        );
        let timeout = ProviderError::from(HttpError::from(ErrorCode::ConnectionReadTimeout));
        assert!(matches!(timeout, ProviderError::Transient(ref m) if m.contains("timed out")));
        let denied = ProviderError::from(HttpError::from(ErrorCode::HttpRequestDenied));
        assert!(matches!(denied, ProviderError::Permanent(ref m) if m.contains("allowedHosts")));
        let large = ProviderError::from(HttpError::TooLarge { limit: 10 });
        assert!(matches!(large, ProviderError::Transient(_)));
    }

    #[test]
    fn response_headers_are_case_insensitive() {
        let response = Response {
            status: 429,
            headers: vec![("retry-after".into(), b"3".to_vec())],
            body: Vec::new(),
        };
        assert_eq!(response.header("Retry-After"), Some("3"));
        assert_eq!(response.header("x-missing"), None);
    }

    #[test]
    fn names_the_forbidden_header() {
        let entries = vec![
            ("x-ok".to_owned(), b"1".to_vec()),
            ("host".to_owned(), b"h".to_vec()),
        ];
        assert_eq!(first_invalid_header(&entries).as_deref(), Some("host"));
    }
}
