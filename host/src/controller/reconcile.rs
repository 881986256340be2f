//! Each reconcile as the controllers run it: in a span naming its object, timed into the
//! metrics, only while this replica holds the object's shard, and with a panic caught at its
//! boundary ([`vm`], [`provider_config`]; their error policies are in `runtime/error_policy.rs`).

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::FutureExt;
use kube::ResourceExt;
use kube::runtime::controller::Action;
use tracing::Instrument;

use super::context::Context;
use super::error::{Error, Retry};
use super::runtime::sharding;
use crate::api::{ProviderConfig, VirtualMachine};
use crate::telemetry::metrics::{ControllerKind, ReconcileResult};
use crate::telemetry::spans::reconcile_span;

pub(super) async fn vm(vm: Arc<VirtualMachine>, ctx: Arc<Context>) -> Result<Action, Error> {
    let guard = ctx
        .metrics
        .reconcile_started(ControllerKind::VirtualMachine);
    let span = vm_span(&vm);
    let result = sharding::while_holding(
        ctx.shards.as_deref(),
        sharding::vm_shard(&vm),
        unwinding(super::vm::reconcile(vm.clone(), ctx.clone())),
    )
    .instrument(span)
    .await;
    guard.finish(ReconcileResult::of(&result), is_terminal(&result));
    result
}

pub(super) async fn provider_config(
    pc: Arc<ProviderConfig>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let guard = ctx
        .metrics
        .reconcile_started(ControllerKind::ProviderConfig);
    let span = provider_config_span(&pc);
    let result = sharding::while_holding(
        ctx.shards.as_deref(),
        |_| sharding::PROVIDER_CONFIG_SHARD,
        unwinding(super::provider_config::reconcile(pc, ctx.clone())),
    )
    .instrument(span)
    .await;
    guard.finish(ReconcileResult::of(&result), is_terminal(&result));
    result
}

/// `reconcile`, with a panic in it turned into [`Error::Panicked`]: it ends that reconcile,
/// which the error policy retries with backoff, and the operator goes on serving every other
/// object (`tests::a_panicking_reconcile_is_an_error_not_the_end`).
async fn unwinding(
    reconcile: impl Future<Output = Result<Action, Error>>,
) -> Result<Action, Error> {
    match AssertUnwindSafe(reconcile).catch_unwind().await {
        Ok(result) => result,
        Err(panic) => {
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a non-text payload".to_owned());
            tracing::error!(panic = %message, "a reconcile panicked; it is retried with backoff");
            Err(Error::Panicked(message))
        }
    }
}

/// The span of a VirtualMachine's reconcile (and of its error policy).
pub(super) fn vm_span(vm: &VirtualMachine) -> tracing::Span {
    reconcile_span(
        ControllerKind::VirtualMachine,
        vm.metadata.namespace.as_deref(),
        &vm.name_any(),
        Some(&vm.spec.provider_config_ref.name),
    )
}

/// The span of a ProviderConfig's reconcile (and of its error policy); cluster-scoped, so no
/// namespace, and the object is the provider config itself.
pub(super) fn provider_config_span(pc: &ProviderConfig) -> tracing::Span {
    let name = pc.name_any();
    reconcile_span(ControllerKind::ProviderConfig, None, &name, Some(&name))
}

/// An error that is not retried until something changes (controller-runtime's terminal error).
fn is_terminal(result: &Result<Action, Error>) -> bool {
    matches!(result, Err(e) if e.retry() == Retry::AwaitChange)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panicking_reconcile_is_an_error_not_the_end() {
        let panicking = async {
            if std::hint::black_box(true) {
                panic!("index out of bounds");
            }
            Ok(Action::await_change())
        };
        let result = unwinding(panicking).await;
        assert!(
            matches!(&result, Err(Error::Panicked(m)) if m == "index out of bounds"),
            "{result:?}"
        );
        assert!(
            unwinding(async { Ok(Action::await_change()) })
                .await
                .is_ok()
        );
    }
}
