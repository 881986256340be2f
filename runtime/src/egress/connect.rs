//! Sending one checked request: connect to an address the policy permitted (never to the name),
//! TLS with the request's host name, HTTP/1.1 through hyper; or reuse an idle connection to
//! that same address ([`super::pool`]).
//!
//! This replaces `wasmtime_wasi_http::default_send_request`, which resolves the name itself when
//! it connects, so the address it reaches is not the one that was checked, and opens a
//! connection per request. The timeouts per phase follow it; TLS trusts the same webpki roots.
//!
//! Redirects are never followed here: a 3xx goes back to the guest like any response, and a
//! request to its `Location` is a new request that passes every check again.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, LazyLock};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use hyper::client::conn::http1::SendRequest;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use wasmtime_wasi_http::io::TokioIo;
use wasmtime_wasi_http::{Error as HttpError, RequestOptions, WasiBody};

use super::address::HostKind;
use super::allowlist::{Scheme, Target};
use super::pool::{Checkin, Connections, Key};

pub(crate) type IoFuture = Box<dyn Future<Output = Result<(), HttpError>> + Send>;

trait Stream: AsyncRead + AsyncWrite + Send + Sync + Unpin + 'static {}
impl<T> Stream for T where T: AsyncRead + AsyncWrite + Send + Sync + Unpin + 'static {}

/// The TLS client configuration: webpki roots, ring, safe default versions. `None` only if ring
/// offered no safe protocol version, which cannot happen with a released rustls.
static TLS: LazyLock<Option<Arc<rustls::ClientConfig>>> = LazyLock::new(|| {
    let roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.into(),
    };
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .ok()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Some(Arc::new(config))
});

/// Whose idle connections a request may use and return (see [`super::pool`]).
pub(crate) struct Reuse<'a> {
    pub pool: &'a Connections,
    pub provider: &'a str,
}

/// How long a pooled connection may take to become ready for the next request (it may still
/// be finishing the response it was returned after) before a fresh one is opened instead.
const READY_WAIT: Duration = Duration::from_secs(1);

/// Sends `request` over an idle connection of `reuse` to one of `addresses`, else over a new
/// one to the first of `addresses` that accepts; `options` carries the (already clamped)
/// per-phase timeouts. A request that a pooled connection could not take (it closed while
/// idle) is sent over a new connection; one it took and lost fails like any other.
pub(crate) async fn send(
    mut request: http::Request<WasiBody>,
    target: &Target,
    addresses: &[IpAddr],
    options: RequestOptions,
    reuse: &Reuse<'_>,
) -> Result<(http::Response<WasiBody>, IoFuture), HttpError> {
    let timeout = |t: Option<Duration>| t.unwrap_or(Duration::from_secs(30));
    let connect_timeout = timeout(options.connect_timeout);
    let first_byte_timeout = timeout(options.first_byte_timeout);
    let between_bytes_timeout = timeout(options.between_bytes_timeout).max(Duration::from_nanos(1));

    // Origin form on the wire: scheme and authority went into the connection and `host`.
    let path = request
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    *request.uri_mut() = http::Uri::builder()
        .path_and_query(path)
        .build()
        .map_err(|_| HttpError::HttpRequestUriInvalid)?;

    let deadline = tokio::time::Instant::now() + first_byte_timeout;
    let mut message = request;
    let mut opened = false;
    let (response, key, sender) = loop {
        let pooled = if opened {
            None
        } else {
            reuse.pool.checkout(reuse.provider, target, addresses)
        };
        let (key, mut sender) = match pooled {
            Some((key, mut sender)) => {
                match tokio::time::timeout(READY_WAIT, sender.ready()).await {
                    Ok(Ok(())) => (key, sender),
                    _ => continue,
                }
            }
            // A new connection that cannot take the request either: the server hung up.
            None if opened => return Err(HttpError::ConnectionTerminated),
            None => {
                opened = true;
                open(target, addresses, connect_timeout, reuse).await?
            }
        };
        match tokio::time::timeout_at(deadline, sender.try_send_request(message)).await {
            Err(_) => return Err(HttpError::ConnectionReadTimeout),
            Ok(Ok(response)) => break (response, key, sender),
            Ok(Err(mut refused)) => match refused.take_message() {
                // Never written: the connection had closed; another one takes it.
                Some(back) => message = back,
                None => return Err(HttpError::from(refused.into_error())),
            },
        }
    };
    let checkin = Checkin {
        pool: reuse.pool.clone(),
        key,
        sender,
    };
    let response = response.map(|incoming| {
        TimedBody {
            incoming,
            idle: between_bytes_timeout,
            sleep: Box::pin(tokio::time::sleep(between_bytes_timeout)),
            checkin: Some(checkin),
        }
        .boxed_unsync()
    });
    // The connection is driven by its own task (it outlives this response when reused).
    let io: IoFuture = Box::new(async { Ok(()) });
    Ok((response, io))
}

/// A new connection (TCP, TLS for `https`, the HTTP/1.1 handshake), driven by its own task.
async fn open(
    target: &Target,
    addresses: &[IpAddr],
    connect_timeout: Duration,
    reuse: &Reuse<'_>,
) -> Result<(Key, SendRequest<WasiBody>), HttpError> {
    let tcp = tokio::time::timeout(connect_timeout, connect_any(addresses, target.port))
        .await
        .map_err(|_| HttpError::ConnectionTimeout)??;
    let ip = tcp.peer_addr().map_err(HttpError::Connect)?.ip();
    // Small requests on a kept connection must not wait for the previous segment's ACK.
    tcp.set_nodelay(true).map_err(HttpError::Connect)?;
    let stream: Box<dyn Stream> = match target.scheme {
        Scheme::Http => Box::new(tcp),
        Scheme::Https => {
            let config = TLS
                .clone()
                .ok_or_else(|| HttpError::InternalError(Some("no TLS configuration".into())))?;
            let name = match &target.host {
                HostKind::Ip(ip) => ServerName::from(*ip),
                HostKind::Name(n) => ServerName::try_from(n.clone())?,
                HostKind::AmbiguousNumeric => return Err(HttpError::HttpRequestUriInvalid),
            };
            let tls = tokio::time::timeout(
                connect_timeout,
                tokio_rustls::TlsConnector::from(config).connect(name, tcp),
            )
            .await
            .map_err(|_| HttpError::ConnectionTimeout)?
            .map_err(HttpError::Tls)?;
            Box::new(tls)
        }
    };
    let (sender, conn) = tokio::time::timeout(
        connect_timeout,
        hyper::client::conn::http1::Builder::new().handshake(TokioIo::new(stream)),
    )
    .await
    .map_err(|_| HttpError::ConnectionTimeout)??;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "plugin HTTP connection ended with an error");
        }
    });
    Ok((Key::new(reuse.provider, target, ip), sender))
}

/// The first of `addresses` that accepts a TCP connection on `port`.
async fn connect_any(addresses: &[IpAddr], port: u16) -> Result<TcpStream, HttpError> {
    let mut last = None;
    for ip in addresses {
        match TcpStream::connect(SocketAddr::new(*ip, port)).await {
            Ok(stream) => return Ok(stream),
            Err(e) => last = Some(e),
        }
    }
    Err(match last {
        Some(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            HttpError::ConnectionRefused
        }
        Some(e) => HttpError::Connect(e),
        None => HttpError::DestinationNotFound,
    })
}

/// A response body that fails when no frame arrives for `idle`, and gives its connection back
/// once read to the end.
struct TimedBody {
    incoming: hyper::body::Incoming,
    idle: Duration,
    sleep: Pin<Box<tokio::time::Sleep>>,
    checkin: Option<Checkin>,
}

impl TimedBody {
    fn ended(&mut self) {
        if let Some(checkin) = self.checkin.take() {
            checkin.finish();
        }
    }
}

impl Drop for TimedBody {
    fn drop(&mut self) {
        // A body with nothing (left) to read is done even if nobody polled its end.
        if self.incoming.is_end_stream() {
            self.ended();
        }
    }
}

impl Body for TimedBody {
    type Data = Bytes;
    type Error = HttpError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, HttpError>>> {
        let this = &mut *self;
        match Pin::new(&mut this.incoming).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                let next = tokio::time::Instant::now() + this.idle;
                this.sleep.as_mut().reset(next);
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) if e.is_timeout() => {
                Poll::Ready(Some(Err(HttpError::HttpResponseTimeout)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(HttpError::from(e)))),
            Poll::Ready(None) => {
                this.ended();
                Poll::Ready(None)
            }
            Poll::Pending => {
                ready!(this.sleep.as_mut().poll(cx));
                Poll::Ready(Some(Err(HttpError::ConnectionReadTimeout)))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.incoming.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.incoming.size_hint()
    }
}
