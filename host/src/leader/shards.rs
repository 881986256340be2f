//! Active-active sharding: `count` shards, one Lease each, spread over the live replicas.
//!
//! A VM belongs to shard [`shard_of`]: one of `count` ranges of the FNV-1a hash of its uid
//! (`partition.rs`, the ranges the API server's sharded watch filters by). Each replica keeps a
//! *member* Lease
//! (`<group>-member-<hash of identity>`, label [`GROUP_LABEL`]) renewed every retry period.
//! From the live members every replica computes the same assignment (`assignment.rs`: rendezvous
//! ranking of shard and identity, bounded so that loads differ by at most one) and campaigns,
//! with a [`LeaderElector`] per shard, for the shards it is primary of; it also stands by
//! (observing the Lease, gated) for those it would get were their primary gone. A replica
//! that joins takes its share (the others release what is no longer theirs); the shards of
//! one that dies are taken by their standbys once its shard Leases expire, about one lease
//! duration after its last renewal (measured 17.4 s with 15 s Leases).
//!
//! # Guarantees
//!
//! - Two replicas never reconcile one VM at once: a VM is reconciled only while its shard's
//!   elector says this process holds that shard's Lease, with the elector's guarantee (see
//!   [`crate::leader`]); a reconcile in flight is dropped as soon as it says otherwise
//!   (`tests/tests/operator/operator_sharding.rs`, an overlap detector on the plugin call log).
//!   Replicas with another shard count, or leader-elected ones, are kept out by the layout
//!   fence (`layout.rs`): only one layout's Leases are held at a time.
//! - The shard of a VM depends on its uid and `count` only (FNV-1a, stable across builds and
//!   replicas): every replica agrees on it (`partition::tests::shard_is_stable`).
//! - Membership only decides who *campaigns*; safety never rests on it, so a wrong view of
//!   the members (clock skew on `renewTime`, a lagging list) costs balance, not correctness.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams};
use tokio::sync::watch;

use super::assignment::{Role, roles};
pub use super::held::{Shards, shards};
use super::layout::{self, LAYOUT_ANNOTATION, Layout, shard_lease};
use super::partition::fnv1a;
pub use super::partition::{shard_of, shard_selector};
use super::{LeaderElector, Leadership, LeaseConfig};
use crate::telemetry::metrics::Metrics;

/// Label of the member Leases of one shard group (its value: the group name).
pub const GROUP_LABEL: &str = "vmop.dev/shard-group";

/// Which shard group, as whom, and how fast (each shard's Lease uses `lease`'s timings).
#[derive(Debug, Clone)]
pub struct ShardConfig {
    /// Lease names start with it: `<group>-shard-<n>`, `<group>-member-<hash>`, and the
    /// group's `<group>-layout` (`layout.rs`), shared with `--leader-elect` replicas whose
    /// leader Lease is `<group>`.
    pub group: String,
    pub count: u32,
    /// Namespace, identity and timings; its name is ignored.
    pub lease: LeaseConfig,
}

/// Called with a shard's number when this replica starts holding it.
pub type OnAcquired = Arc<dyn Fn(u32) + Send + Sync>;

/// The VMs per ProviderConfig this replica knows of in the given shards.
pub type CountHeld = Arc<dyn Fn(&BTreeSet<u32>) -> BTreeMap<String, u32> + Send + Sync>;

/// Called with the ProviderConfigs whose total over the live members changed.
pub type OnTotals = Arc<dyn Fn(Vec<String>) + Send + Sync>;

/// What [`run`] tells the controllers, and asks them.
#[derive(Clone)]
pub struct Hooks {
    /// Before the shard is marked held: nothing of it is reconciled until this returned.
    pub on_acquiring: OnAcquired,
    /// Once the shard is marked held.
    pub on_acquired: OnAcquired,
    /// Published on the member Lease each retry period ([`COUNTS_ANNOTATION`]).
    pub count_held: CountHeld,
    pub on_totals: OnTotals,
}

impl std::fmt::Debug for Hooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hooks").finish_non_exhaustive()
    }
}

/// Annotation of a member Lease: its replica's VMs per ProviderConfig in the shards it holds
/// (JSON object of counts). Summed over the live members, that is every VM once, without any
/// replica watching all of them ([`Shards::total`]).
pub const COUNTS_ANNOTATION: &str = "vmop.dev/vm-counts";

/// A member renewed within this many retry periods is taken to be alive: its standbys do not
/// take its shards over.
const ALIVE_RETRIES: u32 = 3;

/// One shard's elector, its gate, and the task announcing its acquisitions.
struct Campaign {
    leadership: Leadership,
    gate: watch::Sender<bool>,
    announcer: tokio::task::JoinHandle<()>,
}

impl Campaign {
    async fn end(self, shard: u32, shards: &Shards, within: Duration) {
        self.announcer.abort();
        shards.hand_over(shard, within).await;
        if let Err(e) = self.leadership.release().await {
            tracing::warn!(shard, error = %e, "failed to release a shard Lease");
        }
        shards.mark(shard, false);
    }
}

/// Membership and the shard electors, until `stop` resolves; then every shard Lease is
/// released and the member Lease deleted, so the others take over within a retry period.
///
/// Each retry period: renew the member Lease, list the members, and for each shard campaign
/// as its primary, stand by as its second-ranked member (observing its Lease, gated until
/// the primary stops renewing its member Lease), or hand it over (release) when a live
/// member ranks first. A standby that took a shard over keeps it once the dead primary's
/// member Lease expires and it ranks first.
pub async fn run(
    client: kube::Client,
    config: ShardConfig,
    metrics: Metrics,
    shards: Arc<Shards>,
    hooks: Hooks,
    stop: impl Future<Output = ()>,
) {
    let api: Api<Lease> = Api::namespaced(client.clone(), &config.lease.namespace);
    let me = config.lease.identity.clone();
    let member = format!("{}-member-{:016x}", config.group, fnv1a(&[me.as_bytes()]));
    let alive = config.lease.retry_period * ALIVE_RETRIES;
    let fencing = layout::start(
        client.clone(),
        LeaseConfig {
            name: config.group.clone(),
            ..config.lease.clone()
        },
        Layout::Shards(config.count),
    );
    let mut campaigns: BTreeMap<u32, Campaign> = BTreeMap::new();
    let mut ticks = tokio::time::interval(config.lease.retry_period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    tokio::pin!(stop);
    loop {
        tokio::select! {
            () = &mut stop => break,
            _ = ticks.tick() => {}
        }
        let held = shards.announced();
        let counts = (hooks.count_held)(&held);
        if let Err(e) = renew_member(&api, &member, &config, &counts).await {
            tracing::warn!(error = %e, "failed to renew the shard member Lease");
            continue;
        }
        let (members, totals) = match live_members(&api, &config).await {
            Ok(live) => live,
            Err(e) => {
                tracing::warn!(error = %e, "failed to list the shard members");
                continue;
            }
        };
        let changed = shards.set_totals(totals);
        if !changed.is_empty() {
            (hooks.on_totals)(changed);
        }
        let roles = roles(&me, config.count, &members, alive);
        for (shard, role) in (0..config.count).zip(roles) {
            let holding = shards.holds(shard);
            let open = role.may_take();
            // Held but no longer ours (a live member ranks first): release it for that one.
            if role == Role::None || (holding && !open) {
                if let Some(campaign) = campaigns.remove(&shard) {
                    if holding {
                        tracing::info!(shard, "handing shard over to the replica that ranks first");
                    }
                    campaign
                        .end(shard, &shards, config.lease.renew_deadline)
                        .await;
                }
                continue;
            }
            if let Some(campaign) = campaigns.get(&shard) {
                campaign.gate.send_replace(open);
                continue;
            }
            let mut lease = config.lease.clone();
            lease.name = shard_lease(&config.group, shard);
            let (gate, gated) = watch::channel(open);
            let elector = match LeaderElector::new(client.clone(), lease) {
                Ok(elector) => elector
                    .with_metrics(metrics.clone())
                    .with_gate(gated)
                    .with_fence(fencing.fence()),
                Err(e) => {
                    tracing::error!(error = %e, "invalid shard Lease settings");
                    return;
                }
            };
            let leadership = elector.start();
            let rx = leadership.subscribe();
            shards
                .held
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(shard, leadership.validity());
            let announcer = tokio::spawn(announce(shard, rx, shards.clone(), hooks.clone()));
            campaigns.insert(
                shard,
                Campaign {
                    leadership,
                    gate,
                    announcer,
                },
            );
        }
        metrics.set_shard_members(members.len());
    }
    for (shard, campaign) in campaigns {
        campaign
            .end(shard, &shards, config.lease.renew_deadline)
            .await;
    }
    if let Err(e) = api.delete(&member, &DeleteParams::default()).await {
        tracing::warn!(error = %e, "failed to delete the shard member Lease");
    }
}

/// Logs each acquisition and loss of `shard`, marks it in `shards`' held set, and calls
/// `on_acquiring` before and `on_acquired` after the mark on each acquisition.
async fn announce(shard: u32, mut rx: watch::Receiver<bool>, shards: Arc<Shards>, hooks: Hooks) {
    loop {
        if rx.wait_for(|l| *l).await.is_err() {
            return;
        }
        tracing::info!(shard, "holding shard");
        // Before the mark: no reconcile of the shard starts until `acquiring` has run.
        (hooks.on_acquiring)(shard);
        shards.mark(shard, true);
        (hooks.on_acquired)(shard);
        if rx.wait_for(|l| !*l).await.is_err() {
            shards.mark(shard, false);
            return;
        }
        tracing::info!(shard, "no longer holding shard");
        shards.mark(shard, false);
    }
}

async fn renew_member(
    api: &Api<Lease>,
    name: &str,
    config: &ShardConfig,
    counts: &BTreeMap<String, u32>,
) -> kube::Result<()> {
    let counts = serde_json::to_string(counts).unwrap_or_default();
    let layout = Layout::Shards(config.count).to_string();
    let now = MicroTime(Timestamp::now());
    let seconds = i32::try_from(config.lease.lease_duration.as_secs()).unwrap_or(i32::MAX);
    let spec = LeaseSpec {
        holder_identity: Some(config.lease.identity.clone()),
        lease_duration_seconds: Some(seconds),
        renew_time: Some(now),
        ..LeaseSpec::default()
    };
    match api.get_opt(name).await? {
        Some(mut lease) => {
            lease.spec = Some(spec);
            let annotations = lease.metadata.annotations.get_or_insert_default();
            annotations.insert(COUNTS_ANNOTATION.to_owned(), counts);
            annotations.insert(LAYOUT_ANNOTATION.to_owned(), layout);
            api.replace(name, &PostParams::default(), &lease).await?;
        }
        None => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(name.to_owned()),
                    labels: Some([(GROUP_LABEL.to_owned(), config.group.clone())].into()),
                    annotations: Some(
                        [
                            (COUNTS_ANNOTATION.to_owned(), counts),
                            (LAYOUT_ANNOTATION.to_owned(), layout),
                        ]
                        .into(),
                    ),
                    ..ObjectMeta::default()
                },
                spec: Some(spec),
            };
            api.create(&PostParams::default(), &lease).await?;
        }
    }
    Ok(())
}

/// The members of this replica's layout whose Lease was renewed within its duration, with how
/// long ago (by the wall clock: membership decides balance only), and the sum of their
/// [`COUNTS_ANNOTATION`]s. Members of another shard count (a rollout) are left out: shards are
/// assigned among those that can hold them.
async fn live_members(
    api: &Api<Lease>,
    config: &ShardConfig,
) -> kube::Result<(BTreeMap<String, Duration>, BTreeMap<String, u32>)> {
    let selector = format!("{GROUP_LABEL}={}", config.group);
    let list = api.list(&ListParams::default().labels(&selector)).await?;
    let now = Timestamp::now();
    let layout = Layout::Shards(config.count).to_string();
    let mut totals = BTreeMap::new();
    let mut members: BTreeMap<String, Duration> = list
        .items
        .into_iter()
        .filter(|lease| {
            let annotations = lease.metadata.annotations.as_ref();
            annotations.and_then(|a| a.get(LAYOUT_ANNOTATION)) == Some(&layout)
        })
        .filter_map(|lease| {
            let spec = lease.spec?;
            let renewed = spec.renew_time?.0;
            let duration = Duration::from_secs(
                u64::try_from(spec.lease_duration_seconds.unwrap_or(0)).unwrap_or(0),
            );
            let age = Duration::try_from(now.duration_since(renewed)).unwrap_or(Duration::ZERO);
            if age >= duration {
                return None;
            }
            add_counts(&mut totals, lease.metadata.annotations.as_ref());
            Some((spec.holder_identity?, age))
        })
        .collect();
    members.insert(config.lease.identity.clone(), Duration::ZERO);
    Ok((members, totals))
}

/// Adds a member Lease's [`COUNTS_ANNOTATION`] to `totals`; one that does not parse (another
/// version's, or none) adds nothing.
fn add_counts(totals: &mut BTreeMap<String, u32>, annotations: Option<&BTreeMap<String, String>>) {
    let counts = annotations
        .and_then(|a| a.get(COUNTS_ANNOTATION))
        .and_then(|json| serde_json::from_str::<BTreeMap<String, u32>>(json).ok())
        .unwrap_or_default();
    for (name, n) in counts {
        let total = totals.entry(name).or_insert(0);
        *total = total.saturating_add(n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_sum_the_members_counts_and_name_what_changed() {
        let lease = |json: &str| Some([(COUNTS_ANNOTATION.to_owned(), json.to_owned())].into());
        let mut totals = BTreeMap::new();
        add_counts(&mut totals, lease(r#"{"a":2,"b":1}"#).as_ref());
        add_counts(&mut totals, lease(r#"{"a":3}"#).as_ref());
        add_counts(&mut totals, lease("not json").as_ref());
        add_counts(&mut totals, None);
        assert_eq!(
            totals,
            BTreeMap::from([("a".to_owned(), 5), ("b".to_owned(), 1)])
        );
        let shards = shards(3);
        assert_eq!(shards.set_totals(totals.clone()), ["a", "b"]);
        assert_eq!(shards.total("a"), 5);
        totals.remove("b");
        assert_eq!(
            shards.set_totals(totals),
            ["b"],
            "a name that is gone changed to 0"
        );
        assert_eq!(shards.total("b"), 0);
    }
}
