//! The controllers' side of [`crate::leader::shards`]: reconcile a VM only while holding its
//! shard (ProviderConfigs: shard 0), drop the reconcile the moment the shard is lost, and
//! reconcile a shard's objects as soon as it is acquired (they were skipped meanwhile).

use std::future::Future;
use std::sync::Arc;

use futures::channel::mpsc::UnboundedSender;
use kube::ResourceExt;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};

use super::error::Error;
use crate::api::{ProviderConfig, VirtualMachine};
use crate::leader::shards::{OnAcquired, Shards, shard_of};

/// The shard that reconciles ProviderConfigs (their status is one object for all VMs).
pub const PROVIDER_CONFIG_SHARD: u32 = 0;

/// Runs `reconcile` if this replica holds `shard`, and for as long as it does. Not holding it
/// (or losing it midway) answers "await change": the shard's holder reconciles the object,
/// and [`on_acquired`] requeues it here should this replica take the shard over.
pub async fn while_holding(
    shards: Option<&Shards>,
    shard: impl FnOnce(&Shards) -> u32,
    reconcile: impl Future<Output = Result<Action, Error>>,
) -> Result<Action, Error> {
    let Some(shards) = shards else {
        return reconcile.await;
    };
    let Some(mut held) = shards.holding(shard(shards)) else {
        return Ok(Action::await_change());
    };
    tokio::select! {
        result = reconcile => result,
        _ = held.wait_for(|holding| !*holding) => Ok(Action::await_change()),
    }
}

/// The shard of a VM.
pub fn vm_shard(vm: &VirtualMachine) -> impl FnOnce(&Shards) -> u32 + '_ {
    move |shards| shard_of(vm.uid().as_deref().unwrap_or_default(), shards.count())
}

/// Requeues the VMs of an acquired shard (and every ProviderConfig with shard 0).
pub fn on_acquired(
    vms: Store<VirtualMachine>,
    configs: Store<ProviderConfig>,
    vm_tx: UnboundedSender<ObjectRef<VirtualMachine>>,
    pc_tx: UnboundedSender<ObjectRef<ProviderConfig>>,
    count: u32,
) -> OnAcquired {
    Arc::new(move |shard| {
        for vm in vms.state() {
            if shard_of(vm.uid().as_deref().unwrap_or_default(), count) == shard {
                // A closed channel means the controller stopped: nothing left to requeue.
                let _ = vm_tx.unbounded_send(ObjectRef::from(&*vm));
            }
        }
        if shard == PROVIDER_CONFIG_SHARD {
            for pc in configs.state() {
                let _ = pc_tx.unbounded_send(ObjectRef::from(&*pc));
            }
        }
    })
}
