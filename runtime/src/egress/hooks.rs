//! [`EgressHooks`]: the `wasi:http` send hook of one call. In order, for every request:
//!
//! 1. the [`EgressPolicy`] allowlist (user info in the URI is refused outright);
//! 2. resolution and the address check ([`EgressPolicy`] docs);
//! 3. with a [`RequestSigner`](crate::signing::RequestSigner): the guest's own
//!    credential headers are removed and the host's are added (SigV4 over the whole body, at
//!    most [`MAX_SIGNED_BODY_BYTES`], buffered for one request of the call at a time: the
//!    memory budget counts one such body per instance, however many requests a plugin starts
//!    at once; `tests::one_body_is_buffered_for_signing_per_call_at_a_time`);
//! 4. the request is sent to a checked address ([`super::connect`]) with every timeout clamped
//!    to what is left of the call, and the response body is bounded.
//!
//! A refused request fails with `HttpRequestDenied` (the guest sees it when it reads the
//! response) and one warning naming scheme, host, port and the reason — never the path, query or
//! user info, which may carry credentials.

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Full, Limited};
use tokio::sync::Semaphore;
use wasmtime_wasi_http::{Error as HttpError, RequestOptions, WasiBody, WasiHttpHooks};

use super::EgressPolicy;
use super::connect::{self, IoFuture};
use super::policy::Denial;
use super::trace::NetTrace;

/// The largest request body the host buffers to sign (SigV4 hashes the body). Cloud control
/// APIs send kilobytes; a larger body is refused with `HttpRequestBodySize`.
pub const MAX_SIGNED_BODY_BYTES: usize = 8 << 20;

/// The `wasi:http` hooks of one call: the policy, the call's deadline and a response size
/// bound.
pub(crate) struct EgressHooks {
    pub policy: EgressPolicy,
    pub deadline: Instant,
    pub max_response_bytes: u64,
    /// For the log lines of denied requests.
    pub label: String,
    /// Whether a request may have reached a server (read by the sandbox after the call).
    pub trace: NetTrace,
    /// One permit: held from buffering a request body for signing until that request is sent.
    pub signing: Arc<Semaphore>,
}

impl EgressHooks {
    /// The hooks of one call (one request body buffered for signing at a time).
    pub(crate) fn new(
        policy: EgressPolicy,
        deadline: Instant,
        max_response_bytes: u64,
        label: String,
        trace: NetTrace,
    ) -> Self {
        EgressHooks {
            policy,
            deadline,
            max_response_bytes,
            label,
            trace,
            signing: Arc::new(Semaphore::new(1)),
        }
    }
}

impl fmt::Debug for EgressHooks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EgressHooks")
            .field("policy", &self.policy)
            .field("max_response_bytes", &self.max_response_bytes)
            .finish_non_exhaustive()
    }
}

impl WasiHttpHooks for EgressHooks {
    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        _fut: IoFuture,
    ) -> Box<dyn Future<Output = Result<(http::Response<WasiBody>, IoFuture), HttpError>> + Send>
    {
        let policy = self.policy.clone();
        let label = self.label.clone();
        let remaining = self.deadline.saturating_duration_since(Instant::now());
        let options = clamp_options(options, remaining);
        let limit = self.max_response_bytes;
        let trace = self.trace.clone();
        let signing = self.signing.clone();
        Box::new(async move {
            let uri = request.uri().clone();
            let deny = |reason: &Denial| {
                tracing::warn!(
                    provider = %label,
                    scheme = uri.scheme_str().unwrap_or(""),
                    host = uri.host().unwrap_or(""),
                    port = uri.port_u16(),
                    reason = %reason,
                    "plugin HTTP request denied"
                );
                HttpError::HttpRequestDenied
            };
            let target = policy.check(&uri).map_err(|d| deny(&d))?;
            let addresses = policy.destinations(&target).await.map_err(|d| deny(&d))?;
            // Held until the request is sent, when its buffered body is dropped.
            let mut buffering = None;
            let request = match policy.signer() {
                None => request,
                Some(signer) => {
                    let (mut parts, body) = request.into_parts();
                    let replaced = signer.strip(&mut parts.headers);
                    if replaced > 0 {
                        tracing::debug!(provider = %label, replaced, "plugin-set credential headers replaced by the host's");
                    }
                    let (bytes, body) = if signer.needs_body() {
                        buffering = Some(signing.acquire_owned().await.map_err(|_| {
                            HttpError::InternalError(Some("the call is ending".into()))
                        })?);
                        let bytes = collect_body(body, remaining).await?;
                        (bytes.clone(), full(bytes))
                    } else {
                        (Bytes::new(), body)
                    };
                    signer.sign(&mut parts, &bytes).map_err(|e| {
                        tracing::warn!(provider = %label, error = %crate::report::chain(&e), "plugin HTTP request could not be signed");
                        HttpError::InternalError(Some("the host could not sign the request".into()))
                    })?;
                    http::Request::from_parts(parts, body)
                }
            };
            trace.started();
            let reuse = connect::Reuse {
                pool: policy.connections(),
                provider: &label,
            };
            let sent = send_bounded(request, &target, &addresses, options, limit, &reuse).await;
            drop(buffering);
            if let Err(e) = &sent {
                trace.failed(e);
            }
            sent
        })
    }
}

/// Sends to a checked address and bounds the response body.
async fn send_bounded(
    request: http::Request<WasiBody>,
    target: &super::allowlist::Target,
    addresses: &[std::net::IpAddr],
    options: RequestOptions,
    limit: u64,
    reuse: &connect::Reuse<'_>,
) -> Result<(http::Response<WasiBody>, IoFuture), HttpError> {
    let (response, io) = connect::send(request, target, addresses, options, reuse).await?;
    let response = response.map(|body| BoundedBody::new(body, limit).boxed_unsync());
    Ok((response, io))
}

/// The whole request body, at most [`MAX_SIGNED_BODY_BYTES`], within `remaining`.
async fn collect_body(body: WasiBody, remaining: Duration) -> Result<Bytes, HttpError> {
    let collected = tokio::time::timeout(
        remaining,
        Limited::new(body, MAX_SIGNED_BODY_BYTES).collect(),
    )
    .await
    .map_err(|_| HttpError::ConnectionWriteTimeout)?;
    match collected {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) => match e.downcast::<HttpError>() {
            Ok(e) => Err(*e),
            Err(_) => Err(HttpError::HttpRequestBodySize(None)),
        },
    }
}

fn full(bytes: Bytes) -> WasiBody {
    Full::new(bytes)
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// Every phase's timeout is at most what is left of the call (an unset one becomes exactly that).
fn clamp_options(options: Option<RequestOptions>, remaining: Duration) -> RequestOptions {
    let options = options.unwrap_or_default();
    let clamp = |t: Option<Duration>| Some(t.map_or(remaining, |t| t.min(remaining)));
    RequestOptions {
        connect_timeout: clamp(options.connect_timeout),
        first_byte_timeout: clamp(options.first_byte_timeout),
        between_bytes_timeout: clamp(options.between_bytes_timeout),
    }
}

/// A response body that fails with `HttpResponseBodySize` past `limit` bytes.
struct BoundedBody {
    inner: WasiBody,
    limit: u64,
    seen: u64,
}

impl BoundedBody {
    fn new(inner: WasiBody, limit: u64) -> Self {
        BoundedBody {
            inner,
            limit,
            seen: 0,
        }
    }
}

impl Body for BoundedBody {
    type Data = Bytes;
    type Error = HttpError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, HttpError>>> {
        let this = &mut *self;
        let frame = ready!(Pin::new(&mut this.inner).poll_frame(cx));
        if let Some(Ok(frame)) = &frame
            && let Some(data) = frame.data_ref()
        {
            this.seen = this
                .seen
                .saturating_add(u64::try_from(data.len()).unwrap_or(u64::MAX));
            if this.seen > this.limit {
                return Poll::Ready(Some(Err(HttpError::HttpResponseBodySize(Some(this.seen)))));
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_are_clamped_to_the_remaining_call() {
        let left = Duration::from_secs(2);
        let o = clamp_options(
            Some(RequestOptions {
                connect_timeout: Some(Duration::from_secs(600)),
                first_byte_timeout: Some(Duration::from_millis(10)),
                between_bytes_timeout: None,
            }),
            left,
        );
        assert_eq!(o.connect_timeout, Some(left));
        assert_eq!(o.first_byte_timeout, Some(Duration::from_millis(10)));
        assert_eq!(o.between_bytes_timeout, Some(left));
    }

    /// A body that never ends, and says whether it was read.
    struct Endless(Arc<std::sync::atomic::AtomicBool>);

    impl Body for Endless {
        type Data = Bytes;
        type Error = HttpError;

        fn poll_frame(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, HttpError>>> {
            self.0.store(true, std::sync::atomic::Ordering::SeqCst);
            Poll::Pending
        }
    }

    #[tokio::test]
    async fn one_body_is_buffered_for_signing_per_call_at_a_time() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let secrets = [
            ("access_key_id", "AKIDEXAMPLE"),
            ("secret_access_key", "secret"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let settings = [("region".to_owned(), "us-east-1".to_owned())].into();
        let signer = crate::signing::RequestSigner::new(
            crate::signing::SigningMode::AwsSigV4,
            &settings,
            &secrets,
        )
        .unwrap();
        let policy = EgressPolicy::parse(["http://127.0.0.1:9"])
            .unwrap()
            .allow_private_networks(true)
            .with_signer(signer);
        let mut hooks = EgressHooks::new(
            policy,
            Instant::now() + Duration::from_secs(60),
            1 << 20,
            "test".into(),
            NetTrace::default(),
        );
        let read = [
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(false)),
        ];
        let mut sends = Vec::new();
        for flag in &read {
            let body = Endless(flag.clone()).boxed_unsync();
            let request = http::Request::post("http://127.0.0.1:9/")
                .body(body)
                .unwrap();
            let io: IoFuture = Box::new(async { Ok(()) });
            sends.push(Box::into_pin(hooks.send_request(request, None, io)));
        }
        // Drive both as far as they go: the first buffers its (endless) body, the second waits
        // for it and never reads its own.
        let mut cx = Context::from_waker(std::task::Waker::noop());
        for send in &mut sends {
            assert!(send.as_mut().poll(&mut cx).is_pending());
        }
        assert!(read[0].load(Ordering::SeqCst));
        assert!(
            !read[1].load(Ordering::SeqCst),
            "a second body buffered at once"
        );
        drop(sends.remove(0));
        assert!(sends[0].as_mut().poll(&mut cx).is_pending());
        assert!(
            read[1].load(Ordering::SeqCst),
            "the next body is buffered once the first is done"
        );
    }
}
