//! Sending one checked request: connect to an address the policy permitted (never to the name),
//! TLS with the request's host name, HTTP/1.1 through hyper.
//!
//! This replaces `wasmtime_wasi_http::default_send_request`, which resolves the name itself when
//! it connects, so the address it reaches is not the one that was checked. The shape (timeouts
//! per phase, driving the connection until the response head arrives, the connection future
//! handed back to wasmtime) follows it; TLS trusts the same webpki roots.
//!
//! Redirects are never followed here: a 3xx goes back to the guest like any response, and a
//! request to its `Location` is a new request that passes every check again.

use std::future::{Future, poll_fn};
use std::net::{IpAddr, SocketAddr};
use std::pin::{Pin, pin};
use std::sync::{Arc, LazyLock};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use wasmtime_wasi_http::io::TokioIo;
use wasmtime_wasi_http::{Error as HttpError, RequestOptions, WasiBody};

use super::address::HostKind;
use super::allowlist::{Scheme, Target};

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

/// Sends `request` to the first of `addresses` that accepts a connection. `options` carries
/// the (already clamped) per-phase timeouts.
pub(crate) async fn send(
    mut request: http::Request<WasiBody>,
    target: &Target,
    addresses: &[IpAddr],
    options: RequestOptions,
) -> Result<(http::Response<WasiBody>, IoFuture), HttpError> {
    let timeout = |t: Option<Duration>| t.unwrap_or(Duration::from_secs(30));
    let connect_timeout = timeout(options.connect_timeout);
    let first_byte_timeout = timeout(options.first_byte_timeout);
    let between_bytes_timeout = timeout(options.between_bytes_timeout).max(Duration::from_nanos(1));

    let tcp = tokio::time::timeout(connect_timeout, connect_any(addresses, target.port))
        .await
        .map_err(|_| HttpError::ConnectionTimeout)??;
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
    let (mut sender, conn) = tokio::time::timeout(
        connect_timeout,
        hyper::client::conn::http1::Builder::new().handshake(TokioIo::new(stream)),
    )
    .await
    .map_err(|_| HttpError::ConnectionTimeout)??;

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

    let mut response = pin!(async {
        let response = tokio::time::timeout(first_byte_timeout, sender.send_request(request))
            .await
            .map_err(|_| HttpError::ConnectionReadTimeout)??;
        Ok::<_, HttpError>(response.map(|incoming| {
            TimedBody {
                incoming,
                idle: between_bytes_timeout,
                sleep: Box::pin(tokio::time::sleep(between_bytes_timeout)),
            }
            .boxed_unsync()
        }))
    });
    // Drive the connection until the response head arrives; then it is wasmtime's to drive.
    let mut conn = Some(conn);
    let response = poll_fn(|cx| match response.as_mut().poll(cx) {
        Poll::Ready(result) => Poll::Ready(result),
        Poll::Pending => {
            let Some(c) = conn.as_mut() else {
                return Poll::Pending;
            };
            let done = ready!(Pin::new(c).poll(cx));
            conn = None;
            match done {
                Ok(()) => response.as_mut().poll(cx),
                Err(e) => Poll::Ready(Err(HttpError::from(e))),
            }
        }
    })
    .await?;
    let io: IoFuture = Box::new(async move {
        match conn {
            Some(conn) => conn.await.map_err(|e| {
                if e.is_timeout() {
                    HttpError::HttpResponseTimeout
                } else {
                    HttpError::from(e)
                }
            }),
            None => Ok(()),
        }
    });
    Ok((response, io))
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

/// A response body that fails when no frame arrives for `idle`.
struct TimedBody {
    incoming: hyper::body::Incoming,
    idle: Duration,
    sleep: Pin<Box<tokio::time::Sleep>>,
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
            Poll::Ready(None) => Poll::Ready(None),
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
