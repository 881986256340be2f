//! What a reconcile holds while it runs in a shard ([`Holding`]), and the gate a voluntary
//! hand-over closes to wait until every such reconcile has ended ([`Gates::drain`]) before the
//! shard's Lease is released: the replica that takes the shard over never starts while this
//! one still has a reconcile of it in flight.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{OwnedRwLockReadGuard, RwLock, watch};

/// One gate per shard: reconciles pass it shared, a hand-over closes it exclusively.
#[derive(Debug, Default)]
pub(super) struct Gates {
    gates: Mutex<BTreeMap<u32, Arc<RwLock<()>>>>,
}

impl Gates {
    fn gate(&self, shard: u32) -> Arc<RwLock<()>> {
        let mut gates = self.gates.lock().unwrap_or_else(PoisonError::into_inner);
        gates.entry(shard).or_default().clone()
    }

    /// Passes the gate of `shard`, unless a hand-over is closing it.
    pub(super) fn enter(&self, shard: u32) -> Option<OwnedRwLockReadGuard<()>> {
        self.gate(shard).try_read_owned().ok()
    }

    /// Waits until no reconcile holds the gate of `shard` (new ones are refused meanwhile), at
    /// most `within`; whether they all ended in time.
    pub(super) async fn drain(&self, shard: u32, within: Duration) -> bool {
        let gate = self.gate(shard);
        tokio::time::timeout(within, gate.write()).await.is_ok()
    }
}

/// A reconcile's hold on its shard: while it lives, a hand-over of the shard waits.
#[derive(Debug)]
pub struct Holding {
    pub(super) shard: u32,
    /// The shard's elector: `false` once the Lease is lost.
    pub(super) lease: watch::Receiver<bool>,
    /// The shards held: without this one once it is being handed over.
    pub(super) held: watch::Receiver<BTreeSet<u32>>,
    pub(super) _gate: OwnedRwLockReadGuard<()>,
}

impl Holding {
    /// Resolves when the reconcile must stop: the Lease is lost, or the shard is being handed
    /// over (and waits for this hold to be dropped).
    pub async fn lost(&mut self) {
        let shard = self.shard;
        tokio::select! {
            _ = self.lease.wait_for(|holding| !*holding) => {}
            _ = self.held.wait_for(|held| !held.contains(&shard)) => {}
        }
    }
}
