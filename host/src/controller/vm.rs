//! The VirtualMachine reconciler.
//!
//! # Guarantees
//!
//! - The finalizer is on the object before the first `create` (kube's [`finalizer`] helper adds
//!   it and waits for the next event before applying).
//! - `status.createPending` is written before every `create`, and `status.id` right after a
//!   successful one, in the same write as the rest of the observed status.
//! - `create` is idempotent on the VM's uid (plugin contract), so a crash between `create` and
//!   the status write never duplicates a machine: the next reconcile gets the same one back.
//! - A machine that vanished behind the operator's back is recreated (Event `ExternalVMLost`);
//!   one the provider reports failed is shown in `Ready`, not replaced.
//! - The finalizer is removed only once the provider confirms the machine is gone, or when
//!   `deletionPolicy: Orphan` says to leave it; a machine that may exist without an id
//!   (`createPending`) is looked up through `create` first. A missing ProviderConfig or Secret
//!   keeps the finalizer, with the reason in `Synced` and an Event.
//! - Every failure sets `Synced=False` with its reason and publishes an Event; the error
//!   policy decides when to try again.
//!
//! # Caveats
//!
//! - Looking up a possibly-created machine at deletion calls `create`: if the earlier attempt
//!   never reached the cloud, this makes a machine only to delete it right after.

use std::sync::Arc;

use kube::runtime::controller::Action;
use kube::runtime::finalizer::{Event as FinalizerEvent, finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource, ResourceExt};

use super::backoff::jitter;
use super::calls::Calls;
use super::connection;
use super::context::Context;
use super::error::Error;
use super::provider::Provider;
use super::vm_status::{self, Writer};
use crate::api::quantity::to_mib;
use crate::api::{DeletionPolicy, VM_FINALIZER, VirtualMachine, VirtualMachineStatus, VmPhase};
use crate::plugin::{CallError, ErrorClass, Phase, VmSpec, VmStatus};
use crate::telemetry::events::chain;

pub async fn reconcile(vm: Arc<VirtualMachine>, ctx: Arc<Context>) -> Result<Action, Error> {
    let namespace = vm.namespace().ok_or(Error::Metadata("namespace"))?;
    let api: Api<VirtualMachine> = Api::namespaced(ctx.client.clone(), &namespace);
    let key = ObjectRef::from(&*vm);
    let action = finalizer(&api, VM_FINALIZER, vm, |event| async {
        match event {
            FinalizerEvent::Apply(vm) => apply(&vm, &api, &ctx).await,
            FinalizerEvent::Cleanup(vm) => cleanup(&vm, &api, &ctx).await,
        }
    })
    .await
    .map_err(Error::from_finalizer)?;
    ctx.vm_backoffs.reset(&key);
    Ok(action)
}

async fn apply(
    vm: &VirtualMachine,
    api: &Api<VirtualMachine>,
    ctx: &Context,
) -> Result<Action, Error> {
    let mut status = vm_status::current(vm);
    let mut writer = Writer::new(api, vm);
    match converge(vm, &mut writer, ctx, &mut status).await {
        Ok(action) => Ok(action),
        Err(error) => {
            report(vm, &mut writer, ctx, &mut status, &error, "").await;
            Err(error)
        }
    }
}

/// Makes the external machine match the VM, and the status match the machine.
async fn converge(
    vm: &VirtualMachine,
    writer: &mut Writer<'_>,
    ctx: &Context,
    status: &mut VirtualMachineStatus,
) -> Result<Action, Error> {
    let provider = resolve(vm, ctx).await?;
    let calls = calls(vm, ctx, &provider);
    let spec = vm_spec(vm)?;
    let previous_phase = status.phase;
    let seen = match status.id.clone() {
        None => create(vm, writer, &calls, &spec, status).await?,
        Some(id) => match calls.get(&id).await? {
            Some(seen) => seen,
            None => {
                ctx.events
                    .warning(
                        vm,
                        "Observe",
                        "ExternalVMLost",
                        format!("external machine {id} no longer exists; creating a new one"),
                    )
                    .await;
                status.id = None;
                create(vm, writer, &calls, &spec, status).await?
            }
        },
    };
    vm_status::observed(status, vm, &seen);
    writer.write(status).await?;
    phase_events(vm, ctx, previous_phase, &seen).await;
    connection::ensure(&ctx.client, vm, status).await?;
    Ok(next_check(seen.phase, ctx))
}

/// Creates (or, idempotently, finds) the machine and records it in the status at once.
async fn create(
    vm: &VirtualMachine,
    writer: &mut Writer<'_>,
    calls: &Calls<'_>,
    spec: &VmSpec,
    status: &mut VirtualMachineStatus,
) -> Result<VmStatus, Error> {
    let ctx = calls.ctx;
    if !status.create_pending {
        status.create_pending = true;
        vm_status::not_ready(status, vm, "Creating", "creating the external machine");
        writer.write(status).await?;
    }
    let seen = match calls.create(spec).await {
        Ok(seen) => seen,
        Err(error) => {
            if let Error::Call { source, .. } = &error
                && !may_have_created(source)
            {
                status.create_pending = false;
            }
            return Err(error);
        }
    };
    if ctx.options.exit_after_create {
        tracing::warn!(id = %seen.id, "exiting after create, before the status write (test hook)");
        std::process::exit(EXIT_AFTER_CREATE_CODE);
    }
    vm_status::observed(status, vm, &seen);
    writer.write(status).await?;
    ctx.events
        .normal(
            vm,
            "Create",
            "Created",
            format!(
                "external machine {} created through ProviderConfig {} ({})",
                seen.id,
                calls.provider.name,
                seen.phase.as_str()
            ),
        )
        .await;
    Ok(seen)
}

/// The exit code of the `exit_after_create` test hook.
pub const EXIT_AFTER_CREATE_CODE: i32 = 86;

/// Only a call that may have reached the cloud and failed on the way back can have created a
/// machine; a refused one (unauthorized, invalid, permanent, throttled) did not.
fn may_have_created(error: &CallError) -> bool {
    matches!(error.class(), ErrorClass::Transient)
}

async fn cleanup(
    vm: &VirtualMachine,
    api: &Api<VirtualMachine>,
    ctx: &Context,
) -> Result<Action, Error> {
    let mut status = vm_status::current(vm);
    let mut writer = Writer::new(api, vm);
    match remove_external(vm, &mut writer, ctx, &mut status).await {
        Ok(action) => Ok(action),
        Err(error @ Error::DeletionPending { .. }) => Err(error),
        Err(error) => {
            report(
                vm,
                &mut writer,
                ctx,
                &mut status,
                &error,
                "cannot delete the external machine: ",
            )
            .await;
            Err(error)
        }
    }
}

/// Deletes the external machine (unless orphaned) and confirms it is gone.
async fn remove_external(
    vm: &VirtualMachine,
    writer: &mut Writer<'_>,
    ctx: &Context,
    status: &mut VirtualMachineStatus,
) -> Result<Action, Error> {
    if vm.spec.deletion_policy == DeletionPolicy::Orphan {
        let note = match &status.id {
            Some(id) => format!("left external machine {id} in place (deletionPolicy: Orphan)"),
            None => "no external machine to leave in place (deletionPolicy: Orphan)".to_owned(),
        };
        ctx.events.normal(vm, "Delete", "Orphaned", note).await;
        return Ok(Action::await_change());
    }
    if status.id.is_none() && !status.create_pending {
        // No create ever succeeded or may have: nothing exists.
        return Ok(Action::await_change());
    }
    let provider = resolve(vm, ctx).await?;
    let calls = calls(vm, ctx, &provider);
    let id = match status.id.clone() {
        Some(id) => id,
        None => calls.create(&vm_spec(vm)?).await?.id,
    };
    // Once the provider accepted the deletion (phase Deleting), only watch it go.
    if status.phase != Some(VmPhase::Deleting) {
        calls.delete(&id).await?;
    }
    match calls.get(&id).await? {
        None => {
            ctx.events
                .normal(
                    vm,
                    "Delete",
                    "Deleted",
                    format!("external machine {id} deleted"),
                )
                .await;
            Ok(Action::await_change())
        }
        Some(seen) => {
            status.id = Some(id.clone());
            status.phase = Some(VmPhase::Deleting);
            status.addresses = seen.addresses;
            vm_status::not_ready(
                status,
                vm,
                "Deleting",
                "waiting for the provider to delete the machine",
            );
            writer.write(status).await?;
            Err(Error::DeletionPending { id })
        }
    }
}

/// Records a failure in `Synced` and an Event. Best effort: a failure to write is logged, the
/// original error is what the error policy acts on.
async fn report(
    vm: &VirtualMachine,
    writer: &mut Writer<'_>,
    ctx: &Context,
    status: &mut VirtualMachineStatus,
    error: &Error,
    prefix: &str,
) {
    let message = format!("{prefix}{}", chain(error));
    vm_status::failed(status, vm, error.reason(), message.clone());
    if let Err(e) = writer.write(status).await {
        tracing::warn!(vm = %vm.name_any(), error = %chain(&e), "failed to record a failure in status");
    }
    ctx.events
        .warning(vm, "Reconcile", error.reason(), message)
        .await;
}

async fn phase_events(
    vm: &VirtualMachine,
    ctx: &Context,
    previous: Option<VmPhase>,
    seen: &VmStatus,
) {
    let now = VmPhase::from(seen.phase);
    let Some(previous) = previous.filter(|p| *p != now) else {
        return;
    };
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
        ctx.events
            .warning(vm, "Observe", "ExternalVMFailed", note)
            .await;
    } else {
        ctx.events.normal(vm, "Observe", "PhaseChanged", note).await;
    }
}

/// When to look again: soon while the machine is on its way, after the resync period (drift
/// detection) once it has settled.
fn next_check(phase: Phase, ctx: &Context) -> Action {
    match phase {
        Phase::Running | Phase::Stopped | Phase::Failed => {
            Action::requeue(jitter(ctx.options.resync_period, 0.1))
        }
        Phase::Pending | Phase::Provisioning | Phase::Deleting | Phase::Unknown => {
            Action::requeue(jitter(ctx.options.poll_interval, 0.1))
        }
    }
}

async fn resolve(vm: &VirtualMachine, ctx: &Context) -> Result<Provider, Error> {
    let name = &vm.spec.provider_config_ref.name;
    ctx.resolver
        .resolve_name(name)
        .await
        .map_err(|source| Error::Resolve {
            name: name.clone(),
            source,
        })
}

fn vm_spec(vm: &VirtualMachine) -> Result<VmSpec, Error> {
    Ok(VmSpec {
        name: vm.name_any(),
        namespace: vm.namespace().unwrap_or_default(),
        uid: vm.meta().uid.clone().ok_or(Error::Metadata("uid"))?,
        image: vm.spec.image.clone(),
        cpu: vm.spec.cpu,
        memory_mib: to_mib(&vm.spec.memory).map_err(Error::Memory)?,
        user_data: vm.spec.user_data.clone(),
        labels: vm.labels().clone(),
    })
}

fn calls<'a>(vm: &VirtualMachine, ctx: &'a Context, provider: &'a Provider) -> Calls<'a> {
    Calls {
        ctx,
        provider,
        vm: format!("{}/{}", vm.namespace().unwrap_or_default(), vm.name_any()),
    }
}
