//! What a reconcile holds while it runs in a shard ([`Holding`]), and the gate a voluntary
//! hand-over closes to wait until every such reconcile has ended ([`Gates::drain`]) before the
//! shard's Lease is released: the replica that takes the shard over never starts while this
//! one still has a reconcile of it in flight.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{OwnedRwLockReadGuard, RwLock, watch};

use super::validity::Validity;

/// This replica's view of which shards it holds.
pub struct Shards {
    count: u32,
    pub(super) held: Mutex<BTreeMap<u32, Validity>>,
    /// The shards held, announced on every acquisition and loss.
    held_set: watch::Sender<BTreeSet<u32>>,
    /// The live members' [`COUNTS_ANNOTATION`]s, summed at the last retry period.
    totals: Mutex<BTreeMap<String, u32>>,
    /// The reconciles in flight per shard, which a hand-over waits for.
    gates: Gates,
}

impl std::fmt::Debug for Shards {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shards")
            .field("count", &self.count)
            .field("held", &self.held_now())
            .finish()
    }
}

impl Shards {
    pub fn count(&self) -> u32 {
        self.count
    }

    /// A hold on `shard` for one reconcile, if this replica holds it now and the acquisition
    /// has been announced (the `on_acquiring` hook ran: nothing is reconciled in the shard
    /// before the controllers learnt it changed hands) and no hand-over is under way.
    pub fn holding(&self, shard: u32) -> Option<Holding> {
        if !self.held_set.borrow().contains(&shard) {
            return None;
        }
        let lease = {
            let held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
            held.get(&shard).filter(|v| v.is_valid()).cloned()?
        };
        Some(Holding {
            shard,
            lease,
            held: self.held_set.subscribe(),
            _gate: self.gates.enter(shard)?,
        })
    }

    /// Whether this replica holds `shard` (its Lease, announced).
    pub(super) fn holds(&self, shard: u32) -> bool {
        self.held_set.borrow().contains(&shard)
            && self
                .held
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get(&shard)
                .is_some_and(Validity::is_valid)
    }

    /// Stops reconciling `shard` and waits, at most `within`, until every reconcile of it in
    /// flight has ended: then its Lease may be released without another replica starting
    /// beside one of them (`tests::a_hand_over_waits_for_the_reconciles_in_flight`).
    pub(super) async fn hand_over(&self, shard: u32, within: Duration) {
        self.mark(shard, false);
        if !self.gates.drain(shard, within).await {
            tracing::warn!(
                shard,
                ?within,
                "reconciles of the shard still running at its hand-over"
            );
        }
    }

    /// The shards held, changing as they are acquired and lost (a loss shows no sooner than
    /// [`Shards::holding`] says it).
    pub fn subscribe(&self) -> watch::Receiver<BTreeSet<u32>> {
        self.held_set.subscribe()
    }

    /// The shards held and announced now.
    pub(super) fn announced(&self) -> BTreeSet<u32> {
        self.held_set.borrow().clone()
    }

    pub(super) fn mark(&self, shard: u32, holding: bool) {
        self.held_set.send_if_modified(|held| {
            if holding {
                held.insert(shard)
            } else {
                held.remove(&shard)
            }
        });
    }

    /// The VMs of ProviderConfig `name` counted by all live replicas, each counting the shards
    /// it holds: as of their last renewals, so a shard changing hands may be counted twice or
    /// not at all for a retry period or two, and a dead replica's count stays until its member
    /// Lease expires (one lease duration; `operator_sharding.rs` waits for the right sums).
    pub fn total(&self, name: &str) -> u32 {
        let totals = self.totals.lock().unwrap_or_else(PoisonError::into_inner);
        totals.get(name).copied().unwrap_or(0)
    }

    /// Replaces the totals; returns the names whose total changed.
    pub(super) fn set_totals(&self, new: BTreeMap<String, u32>) -> Vec<String> {
        let mut totals = self.totals.lock().unwrap_or_else(PoisonError::into_inner);
        let changed = totals
            .keys()
            .chain(new.keys())
            .filter(|name| totals.get(*name) != new.get(*name))
            .cloned()
            .collect::<BTreeSet<String>>()
            .into_iter()
            .collect();
        *totals = new;
        changed
    }

    /// The shards held right now.
    pub fn held_now(&self) -> Vec<u32> {
        let held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        held.iter()
            .filter(|(_, v)| v.is_valid())
            .map(|(s, _)| *s)
            .collect()
    }
}

/// An empty view of `count` shards, filled by [`run`].
pub fn shards(count: u32) -> Arc<Shards> {
    Arc::new(Shards {
        count: count.max(1),
        held: Mutex::new(BTreeMap::new()),
        held_set: watch::Sender::new(BTreeSet::new()),
        totals: Mutex::new(BTreeMap::new()),
        gates: Gates::default(),
    })
}

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
    /// The shard's Lease: invalid once lost, or once its renew deadline passed.
    pub(super) lease: Validity,
    /// The shards held: without this one once it is being handed over.
    pub(super) held: watch::Receiver<BTreeSet<u32>>,
    pub(super) _gate: OwnedRwLockReadGuard<()>,
}

impl Holding {
    /// Resolves when the reconcile must stop: the Lease is lost or past its renew deadline
    /// (checked first, so that a process resuming from a freeze stops before it acts), or the
    /// shard is being handed over (and waits for this hold to be dropped).
    pub async fn lost(&mut self) {
        let shard = self.shard;
        tokio::select! {
            biased;
            () = self.lease.lost() => {}
            _ = self.held.wait_for(|held| !held.contains(&shard)) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_hand_over_waits_for_the_reconciles_in_flight() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let shards = shards(2);
        let (_lease, leading) = watch::channel(true);
        let until = tokio::time::Instant::now() + Duration::from_secs(3600);
        let (_until, until) = watch::channel(Some(until));
        shards
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(1, Validity { leading, until });
        shards.mark(1, true);
        let mut holding = shards.holding(1).expect("held and announced");
        let ended = Arc::new(AtomicBool::new(false));
        let reconcile = tokio::spawn({
            let ended = ended.clone();
            async move {
                holding.lost().await;
                // Still winding down after it was told: the hand-over must wait for this.
                for _ in 0..10 {
                    tokio::task::yield_now().await;
                }
                ended.store(true, Ordering::SeqCst);
                drop(holding);
            }
        });
        shards.hand_over(1, Duration::from_secs(30)).await;
        assert!(
            ended.load(Ordering::SeqCst),
            "released while a reconcile ran"
        );
        assert!(
            shards.holding(1).is_none(),
            "no reconcile starts once handed over"
        );
        reconcile.await.expect("the reconcile task");
    }
}
