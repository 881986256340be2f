//! The ProviderConfig reconciler's part of the cloud view (see [`super::view`]): when the last
//! listing is older than the resync period, list the cloud again, judge its orphans, report
//! them, and delete them under `orphanPolicy: Delete`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use kube::ResourceExt;

use super::Provider;
use super::view::{self, Listing, ListingError};
use crate::api::{OrphanPolicy, ProviderConfig};
use crate::controller::context::Context;
use crate::controller::error::Retry;
use crate::controller::vm::calls::Calls;
use crate::leader::shards::shard_of;
use crate::telemetry::events::chain;

/// What a refresh found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refreshed {
    /// Orphans judged (`None`: not judged, e.g. before the VM cache has listed).
    pub orphans: Option<u32>,
    /// When to list again.
    pub again_in: Duration,
}

/// Lists `pc`'s cloud if due, and acts on its orphans. `None` when the ProviderConfig keeps no
/// view (`--cloud-view off`, or a plugin without `list`).
pub async fn refresh(ctx: &Context, pc: &ProviderConfig, provider: &Provider) -> Option<Refreshed> {
    let name = pc.name_any();
    if !ctx.options.cloud_view || !provider.plugin.info().has("list") {
        ctx.views.forget(&name);
        return None;
    }
    let period = ctx.options.resync_period;
    let last = ctx.views.listing(&name);
    if let Some(last) = last.as_ref().filter(|l| l.identity == provider.identity) {
        let age = last.started.elapsed();
        if age < period {
            return Some(Refreshed {
                orphans: u32::try_from(last.orphans.len()).ok(),
                again_in: period - age,
            });
        }
    }
    // Not routine: a listing is every VM's drift check at once, so it takes its turn at the
    // budget like a change does instead of yielding to every waiting caller, which a long
    // create storm would keep it doing.
    let calls = Calls {
        ctx,
        provider,
        vm: format!("providerconfig/{name}"),
        taken: Default::default(),
        routine: false,
    };
    let listed = view::list_all(provider.identity, |cursor| calls.list(cursor)).await;
    let mut listing = match listed {
        Ok(listing) => listing,
        Err(error) => {
            if error.waits_for_budget() {
                tracing::debug!(provider_config = %name, error = %chain(&error), "listing the cloud waits for the call budget");
            } else {
                tracing::warn!(provider_config = %name, error = %chain(&error), "listing the cloud failed; keeping the previous listing");
            }
            if !error.waits_for_budget() && ctx.views.failed(&name) {
                // The VMs it answered for no longer hear of changes: each checks for itself.
                for id in last.iter().flat_map(|l| l.machines.keys()) {
                    trigger(ctx, id);
                }
            }
            let orphans = last.and_then(|l| u32::try_from(l.orphans.len()).ok());
            return Some(Refreshed {
                orphans,
                again_in: retry_listing(&error, ctx.options.poll_interval, period),
            });
        }
    };
    let orphans = judge(ctx, pc, provider, &mut listing, last.as_deref()).await;
    let changed = last
        .as_deref()
        .filter(|l| l.identity == listing.identity)
        .map(|last| view::changed(last, &listing))
        .unwrap_or_default();
    ctx.metrics
        .set_cloud_view(&name, listing.machines.len(), listing.orphans.len());
    tracing::debug!(provider_config = %name, machines = listing.machines.len(), orphans = listing.orphans.len(), elapsed_ms = listing.started.elapsed().as_millis() as u64, "listed the cloud");
    // In place before the triggered VMs read it, or they would read the last listing's word.
    ctx.views.set(&name, listing);
    for id in &changed {
        trigger(ctx, id);
    }
    Some(Refreshed {
        orphans,
        again_in: period,
    })
}

/// Reconciles the VM whose machine is `id`, if this process knows it.
fn trigger(ctx: &Context, id: &str) {
    if let Some(vm) = ctx.index.vm_of_machine(id) {
        // A closed queue means the VM controller stopped: nothing left to trigger.
        let _ = ctx.vm_queue.unbounded_send(vm);
    }
}

/// When to list again after `error`: when the token or the cloud's delay is due, after the poll
/// interval for a failure that may pass, and only at the next period for one that waits for a
/// change (refused credentials, a permanent error: a change of the ProviderConfig or its Secret
/// reconciles it at once anyway), so a refused listing is not retried into the cloud.
fn retry_listing(error: &ListingError, poll: Duration, period: Duration) -> Duration {
    match error {
        ListingError::Page { source, .. } => match source.retry() {
            Retry::Due(after) | Retry::After(after) => after.max(Duration::from_secs(1)),
            Retry::Backoff | Retry::Poll => poll.max(Duration::from_secs(1)),
            Retry::Slow | Retry::AwaitChange => period,
        },
        ListingError::RepeatedCursor { .. } | ListingError::TooManyPages => period,
    }
}

/// Finds `listing`'s orphans among the machines whose owner this replica may judge (all, or
/// under sharding those of the shards it holds), deletes those the policy allows, and records
/// them in the listing. `None` before the VM cache has listed.
async fn judge(
    ctx: &Context,
    pc: &ProviderConfig,
    provider: &Provider,
    listing: &mut Listing,
    last: Option<&Listing>,
) -> Option<u32> {
    let uids = ctx.index.uids()?;
    let mine = |owner: &str| {
        ctx.shards
            .as_ref()
            .is_none_or(|s| s.holding(shard_of(owner, s.count())).is_some())
    };
    let judged = listing
        .machines
        .iter()
        .filter(|(_, m)| m.status.owner.as_deref().is_some_and(mine));
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let found = view::orphans(
        judged,
        last.map(|l| &l.orphans),
        &ctx.options.cluster_id,
        &uids,
        provider.grace,
        now_ms,
    );
    let count = u32::try_from(found.all.len()).unwrap_or(u32::MAX);
    let before = last.map_or(0, |l| l.orphans.len());
    if found.all.len() > before {
        let note = format!(
            "{count} machine(s) with this cluster's mark belong to no VirtualMachine (orphanPolicy {:?})",
            pc.spec.orphan_policy
        );
        ctx.events.warning(pc, "List", "OrphansFound", note).await;
    }
    if pc.spec.orphan_policy == OrphanPolicy::Delete {
        let calls = Calls {
            ctx,
            provider,
            vm: format!("providerconfig/{}", pc.name_any()),
            taken: Default::default(),
            routine: false,
        };
        for id in &found.deletable {
            match calls.delete(id).await {
                Ok(()) => {
                    let note = format!("deleted orphan machine {id} (orphanPolicy Delete)");
                    ctx.events.normal(pc, "Delete", "OrphanDeleted", note).await;
                }
                Err(error) => {
                    tracing::warn!(provider_config = %pc.name_any(), machine = %id, error = %chain(&error), "deleting an orphan failed");
                }
            }
        }
    }
    listing.orphans = found.all;
    Some(count)
}
