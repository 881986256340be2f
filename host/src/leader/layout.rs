//! The layout in force for a group of replicas: leader election or `count` shards, and the
//! generation fence that keeps two layouts from reconciling at once.
//!
//! A rolling upgrade that changes `--shards`, or switches between `--leader-elect` and
//! `--shards`, runs replicas of two layouts side by side. Their Leases cannot exclude each
//! other by name: shard 0 of 2 and shard 1 of 3 hold overlapping VMs under different Leases.
//! So one layout is *in force* at a time, recorded with its generation in the group's layout
//! Lease (`<group>-layout`, annotations [`LAYOUT_ANNOTATION`] and
//! [`fence::GENERATION_ANNOTATION`]). A replica campaigns only while its own layout is in force,
//! under [`Fence::Open`] at that generation.
//!
//! A replica whose layout is not in force switches the group over once every Lease of the
//! layout in force is free (released, missing, or unchanged for its lease duration as this
//! process observed it, as an election judges expiry): it stamps each of those Leases with the
//! next generation by a conditional write, then writes the layout Lease naming its layout at
//! that generation, also conditionally. Any conflict (a Lease taken meanwhile, another replica
//! switching) abandons the attempt until the next retry period.
//!
//! # Guarantees
//!
//! - Replicas of two layouts never reconcile at once: a Lease of the outgoing layout is either
//!   acquired before the switch stamps it (the stamp's conditional write fails and the switch
//!   waits) or after (the acquisition reads the newer stamp and stands down), and the new
//!   layout's replicas campaign only once every outgoing Lease is stamped
//!   (`tests/tests/controlplane/layout.rs`; the real operators in
//!   `tests/tests/operator/operator_layout.rs`). The only clock involved is the Lease expiry
//!   the elector already relies on.
//! - A rollout that changes the layout hands over once the last replica of the old layout has
//!   released its Leases (a graceful stop) or they expired (a crash): the old layout serves
//!   until then, so there is no gap beyond one retry period after a graceful stop.
//! - A switch abandoned midway strands no Lease: the Leases it stamped carry a generation never
//!   published, and a replica of the layout in force republishes it at that generation
//!   (`adopt_stranded_stamps`; `tests/tests/controlplane/layout.rs`
//!   `a_switch_abandoned_midway_strands_no_lease`, and the simulation's
//!   `fleet_rollouts_that_change_the_layout_never_overlap`, which requires every VM served
//!   again after the faults: 7 of 1,000 of its seeds stranded a shard without it).
//!
//! # Caveats
//!
//! - Do not delete the layout Lease of a running group: it is recreated at the generation after
//!   the newest stamp on this replica's own Leases, which keeps this layout's holders admitted
//!   but cannot see the stamps of another layout's Leases.
//! - Replicas of a version without the fence do not read it: upgrade from one with a layout
//!   change by stopping the old replicas first (the `Recreate` strategy).

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ObjectMeta, PostParams};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::LeaseConfig;
use super::fence::{self, Fence};
use super::record::{self, Decision, Observed};

/// Annotation of the layout Lease: the layout in force (`leader`, or `shards=<count>`).
pub const LAYOUT_ANNOTATION: &str = "vmop.dev/layout";

/// How a group of replicas splits the VMs between them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// One Lease, named after the group: its holder reconciles every VM.
    Leader,
    /// `count` Leases `<group>-shard-<n>`, one per range of VM uids.
    Shards(u32),
}

impl Layout {
    /// The Leases whose holders reconcile under this layout.
    pub fn lease_names(self, group: &str) -> Vec<String> {
        match self {
            Layout::Leader => vec![group.to_owned()],
            Layout::Shards(count) => (0..count).map(|n| shard_lease(group, n)).collect(),
        }
    }

    fn parse(text: &str) -> Option<Layout> {
        match text.strip_prefix("shards=") {
            Some(count) => count.parse().ok().filter(|c| *c > 0).map(Layout::Shards),
            None => (text == "leader").then_some(Layout::Leader),
        }
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Layout::Leader => f.write_str("leader"),
            Layout::Shards(count) => write!(f, "shards={count}"),
        }
    }
}

/// The name of shard `n`'s Lease in `group`.
pub fn shard_lease(group: &str, n: u32) -> String {
    format!("{group}-shard-{n}")
}

/// The task keeping a replica's fence current; aborted when dropped.
#[derive(Debug)]
pub struct Fencing {
    fence: watch::Receiver<Fence>,
    task: JoinHandle<()>,
}

impl Fencing {
    /// The fence to give this replica's electors ([`super::LeaderElector::with_fence`]).
    pub fn fence(&self) -> watch::Receiver<Fence> {
        self.fence.clone()
    }
}

impl Drop for Fencing {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Starts following (and, when it is not in force, switching to) `layout` for the group
/// `config.name`, every `config.retry_period`. The fence starts [`Fence::Closed`].
pub fn start(client: kube::Client, config: LeaseConfig, layout: Layout) -> Fencing {
    let (tx, fence) = watch::channel(Fence::Closed);
    let task = tokio::spawn(run(client, config, layout, tx));
    Fencing { fence, task }
}

async fn run(client: kube::Client, config: LeaseConfig, layout: Layout, tx: watch::Sender<Fence>) {
    let api: Api<Lease> = Api::namespaced(client, &config.namespace);
    let mut follower = Follower {
        api,
        config,
        layout,
        observed: BTreeMap::new(),
    };
    let mut ticks = tokio::time::interval(follower.config.retry_period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        ticks.tick().await;
        match follower.step().await {
            Ok(fence) => {
                if *tx.borrow() != fence {
                    tracing::info!(layout = %follower.layout, ?fence, "layout fence changed");
                }
                tx.send_replace(fence);
            }
            // Keep the last fence: safety rests on the stamps, not on this read being fresh.
            Err(e) => tracing::warn!(error = %e, "failed to read or switch the layout"),
        }
    }
}

/// One replica's view of its group's layout.
struct Follower {
    api: Api<Lease>,
    config: LeaseConfig,
    layout: Layout,
    /// Per Lease of the layout in force: the version last seen and since when.
    observed: BTreeMap<String, Observed>,
}

/// The outgoing layout's Leases: all free (with their records as read), or one still held.
enum Outgoing {
    Free(Vec<(String, Option<Lease>)>),
    Held,
}

impl Follower {
    fn layout_lease(&self) -> String {
        format!("{}-layout", self.config.name)
    }

    /// Reads the layout in force; switches to ours when it is another and all its Leases are
    /// free. Returns this replica's fence.
    async fn step(&mut self) -> kube::Result<Fence> {
        let name = self.layout_lease();
        let Some(current) = self.api.get_opt(&name).await? else {
            return self.create().await;
        };
        let generation = fence::stamped(&current);
        let in_force = current
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(LAYOUT_ANNOTATION))
            .and_then(|text| Layout::parse(text));
        match in_force {
            Some(layout) if layout == self.layout => {
                self.observed.clear();
                self.adopt_stranded_stamps(current, generation).await
            }
            Some(old) => self.switch(current, old, generation).await,
            None => {
                tracing::warn!(lease = %name, "the layout Lease names no layout this version knows; not campaigning");
                Ok(Fence::Closed)
            }
        }
    }

    /// Our layout is in force at `generation`. A switch away from it that conflicted midway
    /// left some of its Leases stamped with a generation never published, which this
    /// generation may not take: their VMs would never be reconciled again. Publishing our
    /// layout at the newest such stamp (conditionally, like a switch) admits them again; it is
    /// safe because a stamp is only ever written to a free Lease, and no replica campaigns under
    /// an unpublished generation (a switcher still under way finds the layout Lease changed and
    /// abandons). Test: `tests/tests/controlplane/layout.rs`
    /// `a_switch_abandoned_midway_strands_no_lease`.
    async fn adopt_stranded_stamps(
        &mut self,
        mut current: Lease,
        generation: u64,
    ) -> kube::Result<Fence> {
        let mut newest = generation;
        for name in self.layout.lease_names(&self.config.name) {
            if let Some(lease) = self.api.get_opt(&name).await? {
                newest = newest.max(fence::stamped(&lease));
            }
        }
        if newest == generation {
            return Ok(Fence::Open(generation));
        }
        let fence = self.publish(&mut current, newest).await?;
        if fence == Fence::Open(newest) {
            tracing::warn!(layout = %self.layout, from = generation, to = newest, "a switch abandoned midway stamped this layout's Leases; republished the layout at their generation");
        }
        Ok(fence)
    }

    /// Writes `current` (the layout Lease as read) naming our layout at `generation`,
    /// conditionally on the version read: [`Fence::Open`] at it, or [`Fence::Closed`] when
    /// another replica wrote the layout Lease meanwhile.
    async fn publish(&self, current: &mut Lease, generation: u64) -> kube::Result<Fence> {
        self.record(current, generation);
        let name = self.layout_lease();
        match self
            .api
            .replace(&name, &PostParams::default(), current)
            .await
        {
            Ok(_) => Ok(Fence::Open(generation)),
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(Fence::Closed),
            Err(e) => Err(e),
        }
    }

    /// The first replica of the group records its layout.
    async fn create(&mut self) -> kube::Result<Fence> {
        let mut newest = 0;
        for name in self.layout.lease_names(&self.config.name) {
            if let Some(lease) = self.api.get_opt(&name).await? {
                newest = newest.max(fence::stamped(&lease));
            }
        }
        let generation = newest.saturating_add(1);
        let mut lease = Lease {
            metadata: ObjectMeta {
                name: Some(self.layout_lease()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(self.config.identity.clone()),
                ..LeaseSpec::default()
            }),
        };
        self.record(&mut lease, generation);
        match self.api.create(&PostParams::default(), &lease).await {
            Ok(_) => Ok(Fence::Open(generation)),
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(Fence::Closed),
            Err(e) => Err(e),
        }
    }

    fn record(&self, lease: &mut Lease, generation: u64) {
        fence::stamp(lease, generation);
        lease
            .metadata
            .annotations
            .get_or_insert_default()
            .insert(LAYOUT_ANNOTATION.to_owned(), self.layout.to_string());
    }

    /// Switches from `old` (in force at `generation`) to ours if every Lease of `old` is free.
    async fn switch(
        &mut self,
        mut current: Lease,
        old: Layout,
        generation: u64,
    ) -> kube::Result<Fence> {
        let Outgoing::Free(leases) = self.outgoing(old).await? else {
            return Ok(Fence::Closed);
        };
        let next = generation.saturating_add(1);
        for (name, lease) in leases {
            let stamped = match lease {
                Some(lease) => {
                    let mut lease = record::released(lease, Timestamp::now());
                    fence::stamp(&mut lease, next);
                    self.api
                        .replace(&name, &PostParams::default(), &lease)
                        .await
                }
                None => {
                    let mut lease = Lease {
                        metadata: ObjectMeta {
                            name: Some(name.clone()),
                            ..ObjectMeta::default()
                        },
                        spec: Some(LeaseSpec::default()),
                    };
                    fence::stamp(&mut lease, next);
                    self.api.create(&PostParams::default(), &lease).await
                }
            };
            match stamped {
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.code == 409 => return Ok(Fence::Closed),
                Err(e) => return Err(e),
            }
        }
        current.spec.get_or_insert_default().holder_identity = Some(self.config.identity.clone());
        let fence = self.publish(&mut current, next).await?;
        if fence == Fence::Open(next) {
            tracing::info!(from = %old, to = %self.layout, generation = next, "switched the layout");
            self.observed.clear();
        }
        Ok(fence)
    }

    /// The Leases of `old` with their current records, if every one of them is free.
    async fn outgoing(&mut self, old: Layout) -> kube::Result<Outgoing> {
        let now = Instant::now();
        let mut leases = Vec::new();
        for name in old.lease_names(&self.config.name) {
            let lease = self.api.get_opt(&name).await?;
            let mut seen = self.observed.remove(&name);
            let decision = record::decide(
                lease.as_ref(),
                &self.config.identity,
                &mut seen,
                now,
                self.config.lease_duration,
            );
            if let Some(seen) = seen {
                self.observed.insert(name.clone(), seen);
            }
            match decision {
                Decision::Create | Decision::Take => leases.push((name, lease)),
                Decision::Wait { .. } | Decision::Renew => return Ok(Outgoing::Held),
            }
        }
        Ok(Outgoing::Free(leases))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_read_back_what_they_write() {
        for layout in [Layout::Leader, Layout::Shards(1), Layout::Shards(7)] {
            assert_eq!(Layout::parse(&layout.to_string()), Some(layout));
        }
        for bad in ["", "shards=", "shards=0", "shards=x", "Leader", "shards=-1"] {
            assert_eq!(Layout::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn each_layout_names_its_leases() {
        assert_eq!(Layout::Leader.lease_names("vmop"), ["vmop"]);
        assert_eq!(
            Layout::Shards(2).lease_names("vmop"),
            ["vmop-shard-0", "vmop-shard-1"]
        );
    }
}
