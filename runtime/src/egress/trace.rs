//! [`NetTrace`]: whether any outgoing request of one call may have reached a server.
//!
//! A request counts as possibly delivered from the moment the host starts sending it, unless
//! it then fails in a way that proves nothing was sent: refused by the policy, name
//! resolution failed, the connection was refused or timed out, TLS failed. A request whose
//! call was cut short mid-flight counts as delivered. So "not reached" is a proof, "reached"
//! only a possibility: what the reconciler needs to know that a failed `create` made nothing,
//! so that a VM whose creates all failed against a dead endpoint can still be deleted.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use wasmtime_wasi_http::Error as HttpError;

/// Shared between a call's hooks and the sandbox that reads it afterwards.
#[derive(Debug, Clone, Default)]
pub(crate) struct NetTrace {
    counts: Arc<Counts>,
}

#[derive(Debug, Default)]
struct Counts {
    started: AtomicU32,
    proven_unsent: AtomicU32,
}

impl NetTrace {
    /// A request is about to be sent.
    pub fn started(&self) {
        self.counts.started.fetch_add(1, Ordering::SeqCst);
    }

    /// A started request failed with `error`: counts it as unsent when the error proves it.
    pub fn failed(&self, error: &HttpError) {
        if never_sent(error) {
            self.counts.proven_unsent.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Whether some request of the call may have been delivered.
    pub fn reached(&self) -> bool {
        self.counts.started.load(Ordering::SeqCst)
            > self.counts.proven_unsent.load(Ordering::SeqCst)
    }
}

/// Errors that happen before the first byte of a request leaves the host.
fn never_sent(error: &HttpError) -> bool {
    matches!(
        error,
        HttpError::Connect(_)
            | HttpError::Tls(_)
            | HttpError::DnsTimeout
            | HttpError::DnsError { .. }
            | HttpError::DestinationNotFound
            | HttpError::DestinationUnavailable
            | HttpError::DestinationIpProhibited
            | HttpError::DestinationIpUnroutable
            | HttpError::ConnectionRefused
            | HttpError::ConnectionTimeout
            | HttpError::ConnectionLimitReached
            | HttpError::TlsProtocolError
            | HttpError::TlsCertificateError
            | HttpError::TlsAlertReceived { .. }
            | HttpError::HttpRequestDenied
            | HttpError::HttpRequestUriInvalid
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_proven_failures_count_as_unsent() {
        let t = NetTrace::default();
        assert!(!t.reached(), "no request, nothing reached");
        t.started();
        assert!(t.reached(), "a request in flight may arrive");
        t.failed(&HttpError::ConnectionRefused);
        assert!(!t.reached());
        t.started();
        t.failed(&HttpError::HttpResponseTimeout);
        assert!(
            t.reached(),
            "a request whose answer timed out may have been acted on"
        );
    }
}
