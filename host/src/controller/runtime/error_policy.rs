//! What the controllers do after a failed reconcile: the per-object backoff, the provider's
//! retry-after, a progress poll, or nothing until something changes.
//!
//! The failure has already been reported (condition and Event) by the reconciler, which can
//! await API writes; this only schedules the next attempt.

use std::sync::Arc;
use std::time::Duration;

use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;

use crate::api::{ProviderConfig, VirtualMachine};
use crate::controller::context::Context;
use crate::controller::error::{Error, Retry};
use crate::controller::runtime::backoff::jitter;
use crate::telemetry::events::chain;

/// A provider's retry-after shorter than this is raised to it, so that a provider answering
/// `retry-after: 0` cannot make a hot loop.
const MIN_RETRY_AFTER: Duration = Duration::from_secs(1);

pub fn vm(vm: Arc<VirtualMachine>, error: &Error, ctx: Arc<Context>) -> Action {
    let _span = crate::controller::reconcile::vm_span(&vm).entered();
    let key = ObjectRef::from(&*vm);
    let action = action(
        error.retry(),
        &ctx,
        || ctx.vm_backoffs.next(&key),
        || ctx.vm_slow_backoffs.next(&key),
    );
    if let Retry::Due(_) = error.retry() {
        tracing::debug!(vm = %key, error = %chain(error), next = ?action, "not yet: requeued");
        return action;
    }
    tracing::warn!(
        vm = %key,
        reason = error.reason(),
        error = %chain(error),
        next = ?action,
        "reconcile failed"
    );
    action
}

pub fn provider_config(pc: Arc<ProviderConfig>, error: &Error, ctx: Arc<Context>) -> Action {
    let _span = crate::controller::reconcile::provider_config_span(&pc).entered();
    let key = ObjectRef::from(&*pc);
    let action = action(
        error.retry(),
        &ctx,
        || ctx.pc_backoffs.next(&key),
        || ctx.pc_backoffs.next(&key),
    );
    tracing::warn!(
        provider_config = %key,
        reason = error.reason(),
        error = %chain(error),
        next = ?action,
        "reconcile failed"
    );
    action
}

fn action(
    retry: Retry,
    ctx: &Context,
    backoff: impl FnOnce() -> Duration,
    slow: impl FnOnce() -> Duration,
) -> Action {
    match retry {
        Retry::Backoff => Action::requeue(backoff()),
        Retry::Slow => Action::requeue(slow()),
        Retry::Due(after) => Action::requeue(after),
        Retry::After(after) => {
            // Never earlier than the provider asked: jitter only upwards, by up to 10%.
            let after = after.max(MIN_RETRY_AFTER);
            Action::requeue(jitter(after, 0.05).saturating_add(after.mul_f64(0.05)))
        }
        Retry::Poll => Action::requeue(jitter(ctx.options.poll_interval, 0.1)),
        Retry::AwaitChange => Action::await_change(),
    }
}
