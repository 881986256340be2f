//! The layout fence against the real API server: replicas of two layouts (different shard
//! counts, or leader election and shards) never hold their Leases at once. The new layout
//! waits for every Lease of the old one, takes over once they are released, and a candidate
//! of the old generation can no longer take a Lease the switch stamped.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, ensure};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use vmop::leader::layout::{self, Fencing, Layout};
use vmop::leader::{Fence, LeaderElector, Leadership, LeaseConfig};
use vmop_tests::controlplane::ControlPlane;

const DEADLINE: Duration = Duration::from_secs(60);
const GROUP: &str = "vmop";

/// Leases never expire within a test: every hand-over comes from a release, and a busy machine
/// does not make a holder step down.
fn config(namespace: &str, identity: &str, name: &str) -> LeaseConfig {
    LeaseConfig {
        lease_duration: Duration::from_secs(120),
        renew_deadline: Duration::from_secs(90),
        retry_period: Duration::from_millis(250),
        ..LeaseConfig::new(name, namespace, identity)
    }
}

/// A replica of one layout: its fence and an elector per Lease of the layout.
struct Replica {
    fencing: Fencing,
    electors: Vec<Leadership>,
}

impl Replica {
    fn start(client: &kube::Client, namespace: &str, identity: &str, layout: Layout) -> Replica {
        let fencing = layout::start(client.clone(), config(namespace, identity, GROUP), layout);
        let electors = layout
            .lease_names(GROUP)
            .into_iter()
            .filter_map(|name| {
                LeaderElector::new(client.clone(), config(namespace, identity, &name))
                    .ok()
                    .map(|e| e.with_fence(fencing.fence()).start())
            })
            .collect();
        Replica { fencing, electors }
    }

    fn leading(&self) -> Vec<watch::Receiver<bool>> {
        self.electors.iter().map(Leadership::subscribe).collect()
    }

    async fn wait_all_leading(&self) -> anyhow::Result<()> {
        for mut rx in self.leading() {
            tokio::time::timeout(DEADLINE, rx.wait_for(|l| *l))
                .await
                .context("a Lease of this layout was not acquired in time")??;
        }
        Ok(())
    }

    async fn wait_fence(&self, want: Fence) -> anyhow::Result<()> {
        let mut fence = self.fencing.fence();
        tokio::time::timeout(DEADLINE, fence.wait_for(|f| *f == want))
            .await
            .with_context(|| format!("the fence did not become {want:?} in time"))??;
        Ok(())
    }

    fn any_leading(&self) -> bool {
        self.electors.iter().any(Leadership::is_leading)
    }

    async fn release(self) -> anyhow::Result<()> {
        for elector in self.electors {
            elector.release().await?;
        }
        Ok(())
    }
}

/// Fails the test if any Lease of `a` and any of `b` were ever held at once, sampled on every
/// change of any of them.
struct Exclusion {
    both: Arc<Mutex<bool>>,
    task: JoinHandle<()>,
}

impl Exclusion {
    fn watch(a: Vec<watch::Receiver<bool>>, b: Vec<watch::Receiver<bool>>) -> Exclusion {
        let both = Arc::new(Mutex::new(false));
        let record = both.clone();
        let task = tokio::spawn(async move {
            let count = a.len();
            let mut all: Vec<_> = a.into_iter().chain(b).collect();
            loop {
                let held: Vec<bool> = all.iter_mut().map(|rx| *rx.borrow_and_update()).collect();
                let (a_held, b_held) = held.split_at(count.min(held.len()));
                if a_held.iter().any(|h| *h)
                    && b_held.iter().any(|h| *h)
                    && let Ok(mut both) = record.lock()
                {
                    *both = true;
                }
                let changes = all.iter_mut().map(|rx| Box::pin(rx.changed()));
                if futures::future::select_all(changes).await.0.is_err() {
                    return;
                }
            }
        });
        Exclusion { both, task }
    }

    fn check(self) -> anyhow::Result<()> {
        self.task.abort();
        let both = *self.both.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
        ensure!(!both, "Leases of two layouts were held at once");
        Ok(())
    }
}

/// Waits until `lease` was written `times` more times (its holder renewing it): time passes
/// in retry periods, enough for the other layout to have tried to switch many times.
async fn renewals(api: &Api<Lease>, lease: &str, times: usize) -> anyhow::Result<()> {
    let mut seen = api.get(lease).await?.metadata.resource_version;
    let mut count = 0;
    tokio::time::timeout(DEADLINE, async {
        while count < times {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let version = api.get(lease).await?.metadata.resource_version;
            if version != seen {
                count += 1;
                seen = version;
            }
        }
        anyhow::Ok(())
    })
    .await
    .context("the holder stopped renewing")?
}

#[tokio::test]
async fn a_new_shard_count_waits_for_every_old_shard_and_fences_the_old_generation_out()
-> anyhow::Result<()> {
    let (client, namespace) = ControlPlane::shared()
        .await?
        .test_namespace("layout")
        .await?;
    let leases: Api<Lease> = Api::namespaced(client.clone(), &namespace);
    let old = Replica::start(&client, &namespace, "old", Layout::Shards(2));
    old.wait_all_leading().await?;
    old.wait_fence(Fence::Open(1)).await?;

    let new = Replica::start(&client, &namespace, "new", Layout::Shards(3));
    let exclusion = Exclusion::watch(old.leading(), new.leading());
    // Shard 0 of 3 and shard 1 of 2 share VMs: while the old replica holds either, nothing of
    // the new layout is held.
    renewals(&leases, "vmop-shard-1", 8).await?;
    ensure!(*new.fencing.fence().borrow() == Fence::Closed);
    ensure!(!new.any_leading());

    let Replica {
        fencing: old_fencing,
        electors: mut old_electors,
    } = old;
    let shard_1 = old_electors.pop().context("two electors")?;
    shard_1.release().await?;
    // One old shard still held: still no switch.
    renewals(&leases, "vmop-shard-0", 8).await?;
    ensure!(!new.any_leading(), "switched while shard 0 of 2 was held");
    let shard_0 = old_electors.pop().context("two electors")?;
    shard_0.release().await?;

    new.wait_fence(Fence::Open(2)).await?;
    new.wait_all_leading().await?;
    let mut old_fence = old_fencing.fence();
    tokio::time::timeout(DEADLINE, old_fence.wait_for(|f| *f == Fence::Closed)).await??;
    // Gone, as the old replica is at the end of a rollout (it would switch back otherwise).
    drop(old_fencing);

    // A candidate that still believes the old generation is in force (it read the layout
    // before the switch) cannot take a stamped Lease, even one the new layout does not hold.
    let (_stale_tx, stale) = watch::channel(Fence::Open(1));
    let ghost = LeaderElector::new(client.clone(), config(&namespace, "ghost", "vmop-shard-1"))?
        .with_fence(stale.clone())
        .start();
    new.release().await?;
    let mut ghost_leading = ghost.subscribe();
    let took = tokio::time::timeout(Duration::from_secs(3), ghost_leading.wait_for(|l| *l)).await;
    ensure!(took.is_err(), "a stale generation took a stamped Lease");
    ghost.release().await?;
    exclusion.check()
}

#[tokio::test]
async fn leader_election_and_shards_hand_over_to_each_other_without_overlap() -> anyhow::Result<()>
{
    let (client, namespace) = ControlPlane::shared()
        .await?
        .test_namespace("layout")
        .await?;
    let leases: Api<Lease> = Api::namespaced(client.clone(), &namespace);
    let leader = Replica::start(&client, &namespace, "leader", Layout::Leader);
    leader.wait_all_leading().await?;
    let sharded = Replica::start(&client, &namespace, "sharded", Layout::Shards(2));
    let exclusion = Exclusion::watch(leader.leading(), sharded.leading());
    renewals(&leases, GROUP, 8).await?;
    ensure!(!sharded.any_leading(), "shards held beside the leader");

    // The leader stops (a rollout to --shards): the shards take over.
    leader.release().await?;
    sharded.wait_fence(Fence::Open(2)).await?;
    sharded.wait_all_leading().await?;

    // And back: a leader-elected replica waits for both shards, then leads at generation 3.
    let again = Replica::start(&client, &namespace, "leader-again", Layout::Leader);
    let back = Exclusion::watch(sharded.leading(), again.leading());
    renewals(&leases, "vmop-shard-0", 8).await?;
    ensure!(!again.any_leading(), "the leader led beside the shards");
    sharded.release().await?;
    again.wait_fence(Fence::Open(3)).await?;
    again.wait_all_leading().await?;
    again.release().await?;
    exclusion.check()?;
    back.check()
}

/// A switch away from a layout that conflicted midway leaves some of its Leases stamped with a
/// generation that was never published. A replica of the layout still in force republishes it
/// at that generation, so the stamped Lease is held again instead of stranding its VMs.
#[tokio::test]
async fn a_switch_abandoned_midway_strands_no_lease() -> anyhow::Result<()> {
    let (client, namespace) = ControlPlane::shared()
        .await?
        .test_namespace("stranded")
        .await?;
    let leases: Api<Lease> = Api::namespaced(client.clone(), &namespace);
    let first = Replica::start(&client, &namespace, "first", Layout::Shards(2));
    first.wait_all_leading().await?;
    first.wait_fence(Fence::Open(1)).await?;
    first.release().await?;

    // What a switcher to another layout leaves when its stamp of shard 1 conflicts: shard 0,
    // free, stamped with generation 2, and the layout Lease still at generation 1.
    let mut shard_0 = leases.get("vmop-shard-0").await?;
    vmop::leader::fence::stamp(&mut shard_0, 2);
    leases
        .replace("vmop-shard-0", &Default::default(), &shard_0)
        .await?;

    let second = Replica::start(&client, &namespace, "second", Layout::Shards(2));
    second.wait_fence(Fence::Open(2)).await?;
    second.wait_all_leading().await?;
    let layout = leases.get("vmop-layout").await?;
    ensure!(
        vmop::leader::fence::stamped(&layout) == 2,
        "the layout was not republished at the stranded generation"
    );
    second.release().await
}
