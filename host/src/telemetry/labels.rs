//! Label values of the metrics: closed sets, each mapped from the operator's own types, so
//! that no object name, id or error message can become a label and series stay bounded.

use std::time::Duration;

use kube::runtime::controller::Action;
use prometheus_client::encoding::{EncodeLabelValue, LabelValueEncoder};

use vmop_runtime::{CallError, LoadError, Operation, ProviderError};

macro_rules! label_value {
    ($ty:ty) => {
        impl EncodeLabelValue for $ty {
            fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
                std::fmt::Write::write_str(encoder, self.as_str())
            }
        }
    };
}

/// Which controller a reconcile belongs to (controller-runtime's lower-case kind).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ControllerKind {
    VirtualMachine,
    ProviderConfig,
}

impl ControllerKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ControllerKind::VirtualMachine => "virtualmachine",
            ControllerKind::ProviderConfig => "providerconfig",
        }
    }
}

/// The `result` label of `controller_runtime_reconcile_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReconcileResult {
    Success,
    Error,
    Requeue,
    RequeueAfter,
}

impl ReconcileResult {
    pub fn as_str(self) -> &'static str {
        match self {
            ReconcileResult::Success => "success",
            ReconcileResult::Error => "error",
            ReconcileResult::Requeue => "requeue",
            ReconcileResult::RequeueAfter => "requeue_after",
        }
    }

    /// What controller-runtime would report for this reconciler outcome: an error, a requeue
    /// with a delay, an immediate requeue (a zero delay) or success (wait for a change).
    pub fn of<E>(result: &Result<Action, E>) -> ReconcileResult {
        match result {
            Err(_) => ReconcileResult::Error,
            Ok(action) if *action == Action::await_change() => ReconcileResult::Success,
            Ok(action) if *action == Action::requeue(Duration::ZERO) => ReconcileResult::Requeue,
            Ok(_) => ReconcileResult::RequeueAfter,
        }
    }
}

/// How a provider call ended: the `outcome` label of `vmop_provider_call*`. It tells a cloud
/// answer (`transient` ... `unauthorized`) from a misbehaving plugin (`plugin_fault`,
/// `timeout`) from a host failure (`host_error`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CallOutcome {
    Ok,
    Transient,
    RateLimited,
    Permanent,
    InvalidSpec,
    Unauthorized,
    /// The guest trapped or hit its memory cap.
    PluginFault,
    /// The call ran past its time limit.
    Timeout,
    /// The host could not set up the call.
    HostError,
}

impl CallOutcome {
    pub const ALL: [CallOutcome; 9] = [
        CallOutcome::Ok,
        CallOutcome::Transient,
        CallOutcome::RateLimited,
        CallOutcome::Permanent,
        CallOutcome::InvalidSpec,
        CallOutcome::Unauthorized,
        CallOutcome::PluginFault,
        CallOutcome::Timeout,
        CallOutcome::HostError,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            CallOutcome::Ok => "ok",
            CallOutcome::Transient => "transient",
            CallOutcome::RateLimited => "rate_limited",
            CallOutcome::Permanent => "permanent",
            CallOutcome::InvalidSpec => "invalid_spec",
            CallOutcome::Unauthorized => "unauthorized",
            CallOutcome::PluginFault => "plugin_fault",
            CallOutcome::Timeout => "timeout",
            CallOutcome::HostError => "host_error",
        }
    }

    pub fn of<T>(result: &Result<T, CallError>) -> CallOutcome {
        match result {
            Ok(_) => CallOutcome::Ok,
            Err(CallError::Provider(e)) => match e {
                ProviderError::Transient(_) => CallOutcome::Transient,
                ProviderError::RateLimited { .. } => CallOutcome::RateLimited,
                ProviderError::Permanent(_) => CallOutcome::Permanent,
                ProviderError::InvalidSpec(_) => CallOutcome::InvalidSpec,
                ProviderError::Unauthorized(_) => CallOutcome::Unauthorized,
            },
            Err(
                CallError::Trap { .. }
                | CallError::MemoryLimit { .. }
                | CallError::ContractViolation { .. },
            ) => CallOutcome::PluginFault,
            Err(CallError::Timeout { .. }) => CallOutcome::Timeout,
            Err(CallError::Instantiate { .. }) => CallOutcome::HostError,
        }
    }
}

/// How a plugin load (read, verify, compile or map from cache, `info()`) ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LoadOutcome {
    Ok,
    /// The file does not match the ProviderConfig's sha256 pin.
    DigestMismatch,
    /// The file is not a usable plugin (not a component, wrong imports or WIT, failed `info()`).
    InvalidPlugin,
    /// Anything else (bad path or pin, unreadable file, compile task lost).
    Error,
}

impl LoadOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            LoadOutcome::Ok => "ok",
            LoadOutcome::DigestMismatch => "digest_mismatch",
            LoadOutcome::InvalidPlugin => "invalid_plugin",
            LoadOutcome::Error => "error",
        }
    }

    pub fn of(result: Result<(), &LoadError>) -> LoadOutcome {
        match result {
            Ok(()) => LoadOutcome::Ok,
            Err(e) if e.is_digest_mismatch() => LoadOutcome::DigestMismatch,
            Err(e) if e.is_invalid_plugin() => LoadOutcome::InvalidPlugin,
            Err(_) => LoadOutcome::Error,
        }
    }
}

label_value!(ControllerKind);
label_value!(ReconcileResult);
label_value!(CallOutcome);
label_value!(LoadOutcome);

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct OperationLabel(pub(super) Operation);

impl EncodeLabelValue for OperationLabel {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        std::fmt::Write::write_str(encoder, self.0.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reconcile_results_follow_controller_runtime() {
        let ok = |action| ReconcileResult::of::<()>(&Ok(action));
        assert_eq!(ok(Action::await_change()), ReconcileResult::Success);
        assert_eq!(
            ok(Action::requeue(Duration::ZERO)),
            ReconcileResult::Requeue
        );
        let later = ok(Action::requeue(Duration::from_secs(5)));
        assert_eq!(later, ReconcileResult::RequeueAfter);
        assert_eq!(
            ReconcileResult::of(&Err::<Action, _>(())),
            ReconcileResult::Error
        );
        assert_eq!(later.as_str(), "requeue_after");
    }

    #[test]
    fn call_outcomes_tell_the_cloud_from_the_plugin_from_the_host() {
        let provider = |e| CallOutcome::of::<()>(&Err(CallError::Provider(e)));
        assert_eq!(
            provider(ProviderError::Transient("x".into())),
            CallOutcome::Transient
        );
        let limited = provider(ProviderError::RateLimited {
            retry_after: Duration::from_secs(1),
            message: "slow down".into(),
        });
        assert_eq!(limited, CallOutcome::RateLimited);
        assert_eq!(
            provider(ProviderError::Permanent("x".into())),
            CallOutcome::Permanent
        );
        assert_eq!(
            provider(ProviderError::InvalidSpec("x".into())),
            CallOutcome::InvalidSpec
        );
        assert_eq!(
            provider(ProviderError::Unauthorized("x".into())),
            CallOutcome::Unauthorized
        );
        let memory = CallError::MemoryLimit { op: "get", cap: 1 };
        assert_eq!(
            CallOutcome::of::<()>(&Err(memory)),
            CallOutcome::PluginFault
        );
        let timeout = CallError::Timeout {
            op: "get",
            timeout: Duration::from_secs(1),
        };
        assert_eq!(CallOutcome::of::<()>(&Err(timeout)), CallOutcome::Timeout);
        let setup = CallError::Instantiate {
            op: "get",
            source: "no slot".into(),
        };
        assert_eq!(CallOutcome::of::<()>(&Err(setup)), CallOutcome::HostError);
        assert_eq!(CallOutcome::of(&Ok(())), CallOutcome::Ok);
        let names: Vec<_> = CallOutcome::ALL.iter().map(|o| o.as_str()).collect();
        let mut unique = names.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), names.len(), "{names:?}");
    }

    #[test]
    fn load_outcomes() {
        let mismatch = LoadError::DigestMismatch {
            expected: "a".into(),
            actual: "b".into(),
        };
        assert_eq!(LoadOutcome::of(Err(&mismatch)), LoadOutcome::DigestMismatch);
        let pin = LoadError::InvalidPin { pin: "x".into() };
        assert_eq!(LoadOutcome::of(Err(&pin)), LoadOutcome::Error);
        assert_eq!(LoadOutcome::of(Ok(())), LoadOutcome::Ok);
    }
}
