//! [`EgressHooks`]: the `wasi:http` send hook of one call. It refuses requests the
//! [`EgressPolicy`] does not allow, clamps every timeout to what is left of the call, and
//! bounds the response body.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use wasmtime_wasi_http::{Error as HttpError, RequestOptions, WasiBody, WasiHttpHooks};

use super::EgressPolicy;

/// The `wasi:http` hooks of one call: the allowlist, the call's deadline and a response size
/// bound. Denied requests fail with `HttpRequestDenied`, which the guest sees when it reads the
/// response.
pub(crate) struct EgressHooks {
    pub policy: EgressPolicy,
    pub deadline: Instant,
    pub max_response_bytes: u64,
    /// For the log lines of denied requests.
    pub label: String,
}

impl fmt::Debug for EgressHooks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EgressHooks")
            .field("policy", &self.policy)
            .field("max_response_bytes", &self.max_response_bytes)
            .finish_non_exhaustive()
    }
}

type IoFuture = Box<dyn Future<Output = Result<(), HttpError>> + Send>;

impl WasiHttpHooks for EgressHooks {
    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        _fut: IoFuture,
    ) -> Box<dyn Future<Output = Result<(http::Response<WasiBody>, IoFuture), HttpError>> + Send>
    {
        let uri = request.uri();
        if !self.policy.allows(uri) {
            // Only scheme and authority: paths and queries may carry credentials.
            tracing::warn!(
                provider = %self.label,
                scheme = uri.scheme_str().unwrap_or(""),
                authority = uri.authority().map(|a| a.as_str()).unwrap_or(""),
                "plugin HTTP request denied: host not in allowedHosts"
            );
            return Box::new(async { Err(HttpError::HttpRequestDenied) });
        }
        let remaining = self.deadline.saturating_duration_since(Instant::now());
        let options = clamp_options(options, remaining);
        let limit = self.max_response_bytes;
        Box::new(async move {
            let (response, io) =
                wasmtime_wasi_http::default_send_request(request, Some(options)).await?;
            let response =
                response.map(|body| BoundedBody::new(body.boxed_unsync(), limit).boxed_unsync());
            Ok((response, Box::new(io) as IoFuture))
        })
    }
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
}
