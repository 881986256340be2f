//! Errors of the reconcilers, and what each one means for the next attempt.

use std::time::Duration;

use crate::api::duration::DurationError;
use crate::api::parameters::ParameterError;
use crate::api::quantity::QuantityError;
use crate::plugin::{CallError, ErrorClass, Operation};

use crate::controller::provider_config::ResolveError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot use ProviderConfig {name}")]
    Resolve {
        name: String,
        #[source]
        source: Box<ResolveError>,
    },
    #[error("spec.memory is invalid")]
    Memory(#[source] QuantityError),
    #[error("spec.parameters are invalid")]
    Parameters(#[source] ParameterError),
    #[error("provider call {} failed", op.as_str())]
    Call {
        op: Operation,
        #[source]
        source: CallError,
    },
    #[error("failed to {action}")]
    Kube {
        action: &'static str,
        #[source]
        source: kube::Error,
    },
    #[error("external machine {id} is not gone yet")]
    DeletionPending { id: String },
    /// The ProviderConfig's rate or concurrency limit has no room now: not a failure, the VM is
    /// requeued for when its token is due.
    #[error("provider call {} throttled by the ProviderConfig's limits for {retry_after:?}", op.as_str())]
    Throttled {
        op: Operation,
        retry_after: Duration,
    },
    #[error("ConfigMap {name} exists and is not controlled by this VirtualMachine")]
    ConfigMapConflict { name: String },
    #[error("object has no metadata.{0}")]
    Metadata(&'static str),
    /// A bug of the operator's own, caught at the reconcile's boundary so that it ends that
    /// reconcile only, never the process.
    #[error("the reconcile panicked: {0}")]
    Panicked(String),
    #[error("annotation {key} is invalid")]
    Annotation {
        key: &'static str,
        #[source]
        source: DurationError,
    },
}

/// How soon a write refused for a stale view is tried again.
pub const CONFLICT_RETRY: Duration = Duration::from_millis(300);

/// When to try again after an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// Per-object exponential backoff.
    Backoff,
    /// After the given delay (the provider said so).
    After(Duration),
    /// After the poll interval: waiting for progress, not failing.
    Poll,
    /// Exactly when something the operator itself scheduled is due (a reserved token, the end
    /// of a grace period): not a failure, no backoff.
    Due(Duration),
    /// On a slow per-object schedule (minutes, doubling to an hour), and whenever the VM, its
    /// ProviderConfig or its Secret changes: the cause may be fixed outside Kubernetes (a quota
    /// raised, an account opted in), which no watch would see.
    Slow,
    /// Only when the VM, its ProviderConfig or its Secret changes.
    AwaitChange,
}

impl Error {
    pub fn kube(action: &'static str) -> impl FnOnce(kube::Error) -> Error {
        move |source| Error::Kube { action, source }
    }

    /// The `Synced` condition reason for this error.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Resolve { source, .. } => source.reason(),
            Error::Memory(_) | Error::Parameters(_) | Error::Annotation { .. } => {
                ErrorClass::InvalidSpec.reason()
            }
            Error::Call { source, .. } => source.reason(),
            Error::Throttled { .. } => "Throttled",
            Error::Kube { .. } | Error::Metadata(_) => "KubernetesError",
            Error::DeletionPending { .. } => "Deleting",
            Error::Panicked(_) => "InternalError",
            Error::ConfigMapConflict { .. } => "ConfigMapConflict",
        }
    }

    /// The API server answered the write with a client error (409 Conflict, 422, 403, ...):
    /// it certainly did not land. A server error or a lost answer may have.
    pub fn refused(&self) -> bool {
        matches!(self, Error::Kube { source: kube::Error::Api(status), .. } if (400..500).contains(&status.code))
    }

    pub fn retry(&self) -> Retry {
        match self {
            Error::Resolve { source, .. } if source.awaits_change() => Retry::AwaitChange,
            Error::Resolve { .. } => Retry::Backoff,
            Error::Memory(_) | Error::Parameters(_) | Error::Annotation { .. } => {
                Retry::AwaitChange
            }
            Error::Call { source, .. } => match source.class() {
                ErrorClass::Transient => Retry::Backoff,
                ErrorClass::RateLimited(after) => Retry::After(after),
                ErrorClass::Permanent | ErrorClass::InvalidSpec | ErrorClass::Unauthorized => {
                    Retry::Slow
                }
            },
            Error::Throttled { retry_after, .. } => Retry::Due(*retry_after),
            // A guarded write refused because the object changed since it was read: the view
            // was stale (typically right after a relist), not a failure; read again soon
            // rather than back off (after an API server restart, every VM hits this once).
            Error::Kube {
                source: kube::Error::Api(status),
                ..
            } if status.code == 409 => Retry::Due(CONFLICT_RETRY),
            Error::DeletionPending { .. } => Retry::Poll,
            Error::Kube { .. }
            | Error::Metadata(_)
            | Error::ConfigMapConflict { .. }
            | Error::Panicked(_) => Retry::Backoff,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugin::ProviderError;

    fn call(e: ProviderError) -> Error {
        Error::Call {
            op: Operation::Create,
            source: CallError::Provider(e),
        }
    }

    #[test]
    fn provider_errors_map_to_reasons_and_retries() {
        let cases = [
            (
                call(ProviderError::Transient("x".into())),
                "TransientError",
                Retry::Backoff,
            ),
            (
                call(ProviderError::RateLimited {
                    retry_after: Duration::from_secs(7),
                    message: "slow down".into(),
                }),
                "RateLimited",
                Retry::After(Duration::from_secs(7)),
            ),
            (
                call(ProviderError::Permanent("x".into())),
                "PermanentError",
                Retry::Slow,
            ),
            (
                call(ProviderError::InvalidSpec("x".into())),
                "InvalidSpec",
                Retry::Slow,
            ),
            (
                call(ProviderError::Unauthorized("x".into())),
                "Unauthorized",
                Retry::Slow,
            ),
            (
                Error::Call {
                    op: Operation::Get,
                    source: CallError::Timeout {
                        op: "get",
                        timeout: Duration::from_secs(1),
                    },
                },
                "TransientError",
                Retry::Backoff,
            ),
        ];
        for (error, reason, retry) in cases {
            assert_eq!(error.reason(), reason, "{error:?}");
            assert_eq!(error.retry(), retry, "{error:?}");
        }
    }

    #[test]
    fn a_conflict_is_retried_soon_without_backoff() {
        let conflict = Error::Kube {
            action: "write the VirtualMachine status",
            source: kube::Error::Api(
                kube::core::Status::failure("conflict", "Conflict")
                    .with_code(409)
                    .boxed(),
            ),
        };
        assert_eq!(conflict.retry(), Retry::Due(CONFLICT_RETRY));
        let other = Error::Kube {
            action: "write the VirtualMachine status",
            source: kube::Error::Api(
                kube::core::Status::failure("boom", "InternalError")
                    .with_code(500)
                    .boxed(),
            ),
        };
        assert_eq!(other.retry(), Retry::Backoff);
    }

    #[test]
    fn configuration_problems_wait_for_a_change() {
        let missing = Error::Resolve {
            name: "aws".into(),
            source: Box::new(ResolveError::NotFound { name: "aws".into() }),
        };
        assert_eq!(missing.reason(), "ProviderConfigNotFound");
        assert_eq!(missing.retry(), Retry::AwaitChange);
        let memory = Error::Memory(QuantityError::Negative("-1".into()));
        assert_eq!(memory.reason(), "InvalidSpec");
        assert_eq!(memory.retry(), Retry::AwaitChange);
    }
}
