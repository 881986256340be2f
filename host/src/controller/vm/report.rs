//! Recording failures and phase changes: `Synced`, Events.

use kube::api::Api;
use kube::{Resource, ResourceExt};

use super::effects::{Effects, Severity};
use super::status;
use crate::api::{SlimVirtualMachine, VirtualMachine, VirtualMachineStatus, VmPhase};
use crate::controller::context::Context;
use crate::controller::error::Error;
use crate::plugin::{Phase, VmStatus};
use crate::telemetry::events::chain;

/// Records a failure in `Synced` and an Event. Best effort: a failure to write is logged, the
/// original error is what the error policy acts on.
pub(super) async fn report<E: Effects>(
    vm: &VirtualMachine,
    status: &mut VirtualMachineStatus,
    fx: &mut E,
    error: &Error,
    deleting: bool,
) {
    let prefix = if deleting {
        "cannot delete the external machine: "
    } else {
        ""
    };
    let message = format!("{prefix}{}", chain(error));
    status::failed(status, vm, error.reason(), message.clone());
    if let Err(e) = fx.write_status(status).await {
        tracing::warn!(vm = %vm.name_any(), error = %chain(&e), "failed to record a failure in status");
    }
    fx.event(Severity::Warning, "Reconcile", error.reason(), message)
        .await;
}

/// A failure before any provider could be resolved (missing ProviderConfig or Secret, bad
/// plugin): recorded the same way, with a plain guarded status write.
pub(super) async fn report_unresolved(
    vm: &VirtualMachine,
    api: &Api<SlimVirtualMachine>,
    ctx: &Context,
    error: &Error,
) {
    let mut status = status::current(vm);
    let deleting = vm.meta().deletion_timestamp.is_some();
    let prefix = if deleting {
        "cannot delete the external machine: "
    } else {
        ""
    };
    let message = format!("{prefix}{}", chain(error));
    status::failed(&mut status, vm, error.reason(), message.clone());
    if let Err(e) = status::write(api, vm, &status).await {
        tracing::warn!(vm = %vm.name_any(), error = %chain(&e), "failed to record a failure in status");
    }
    ctx.events
        .warning(vm, "Reconcile", error.reason(), message)
        .await;
}

pub(super) async fn phase_events<E: Effects>(
    fx: &mut E,
    previous: Option<VmPhase>,
    seen: &VmStatus,
) {
    let now = VmPhase::from(seen.phase);
    let Some(previous) = previous.filter(|p| *p != now) else {
        return;
    };
    // A new machine coming up is the routine path: `Ready` turning True says it, and an Event
    // per VM for it would double the Events of every lifecycle.
    if now == VmPhase::Running && matches!(previous, VmPhase::Pending | VmPhase::Provisioning) {
        return;
    }
    let note = format!(
        "external machine {} is {} (was {})",
        seen.id,
        now.as_str(),
        previous.as_str()
    );
    if seen.phase == Phase::Failed {
        let note = match &seen.message {
            Some(m) => format!("{note}: {m}"),
            None => note,
        };
        fx.event(Severity::Warning, "Observe", "ExternalVMFailed", note)
            .await;
    } else {
        fx.event(Severity::Normal, "Observe", "PhaseChanged", note)
            .await;
    }
}
