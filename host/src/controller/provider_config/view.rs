//! The cloud-side view of each ProviderConfig: every machine its plugin lists (`list`, contract
//! 0.3), refreshed by the ProviderConfig reconciler once per resync period and shared by all its
//! VMs, the way an informer shares one list of the API server. It turns a drift check per VM
//! per period into a page per 1,000 machines per period, and it is what finds orphans.
//!
//! # Guarantees
//!
//! - A VM's drift check (a settled, Ready VM at its current generation, nothing requested)
//!   takes its machine from the view instead of calling `get` only when the view holds that id,
//!   was listed with the same provider identity (settings, credentials, plugin), began within
//!   twice the VM's poll interval (listings run once per resync period, so while they succeed
//!   a drift check at the resync period always finds one; a machine's change shows within
//!   three periods), began after this process last asked the cloud to change that machine
//!   ([`CloudViews::touch`]), and began after this process took the VM on (its start, or the
//!   acquisition of the VM's shard: the replica that held it before may have changed the
//!   machine after the listing began; test:
//!   `a_listing_begun_before_the_vm_was_taken_on_does_not_answer`). Anything else calls
//!   `get`. Absence from the view is never read as absence: the check calls `get`, so `decide`'s rules about absence (find, grace
//!   period, location) hold exactly as without a view (test: `a_view_answers_only_what_it_may`).
//! - A machine that a new listing shows otherwise than the last one, or no longer shows, has its
//!   VM reconciled at once ([`changed`]), after the new listing is in place so that the
//!   reconcile reads it; drift shows within one listing period.
//! - So while listings succeed ([`CloudViews::steady`]) a VM's own drift check is a backstop: one
//!   the view answered without any call is followed by the next only [`STEADY_CHECKS_APART`]
//!   poll intervals later (`vm::requeue`), which is what keeps a settled fleet's operator idle;
//!   not for a VM whose poll interval is shorter than the resync period (the listings' own),
//!   which keeps checking at its interval
//!   (`vm::tests::listings_stand_in_only_for_checks_no_more_frequent_than_theirs`).
//!   The first listing that fails after a complete one reconciles every VM that listing holds
//!   ([`CloudViews::failed`]), and until a listing succeeds again their checks come at their
//!   poll interval and call `get` once the listing is too old to answer (test:
//!   `operator_cloud_view::checks_are_spaced_while_listings_succeed_and_resume_when_they_fail`).
//! - A listing is complete or it is not used: a failed or throttled page keeps the previous
//!   listing, and a plugin that pages forever (more than [`MAX_PAGES`], or a cursor it already
//!   gave) fails the listing (`a_listing_follows_cursors_to_the_end_and_refuses_a_loop`).
//! - Orphans ([`orphans`]) are machines carrying this cluster's mark and an owner uid that no
//!   VirtualMachine of this cluster has. They are reported always; under `orphanPolicy: Delete`
//!   one is deleted only when it was an orphan in the previous listing too, the cloud says when
//!   it was made, and that is longer ago than the creation grace period; never a machine of
//!   another cluster or without a mark (test: `orphans_are_only_this_clusters_and_old_enough`).

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::Provider;
use crate::controller::error::Error;
use crate::plugin::{ListedMachine, Page, VmStatus};

/// Pages one listing may take: 1,000,000 machines at the contract's largest page.
pub const MAX_PAGES: usize = 1000;

/// Poll intervals between a VM's drift checks while the view answers them and its listings
/// succeed (see the module docs).
pub const STEADY_CHECKS_APART: u32 = 10;

/// One complete listing of a ProviderConfig's machines.
#[derive(Debug, Clone)]
pub struct Listing {
    /// When its first page was asked: a machine that changed after this may show either way.
    pub started: Instant,
    /// [`Provider::identity`] it was listed with.
    pub identity: u64,
    /// By machine id.
    pub machines: HashMap<String, ListedMachine>,
    /// The ids that were orphans in this listing (for the next one's Delete policy).
    pub orphans: HashSet<String>,
}

/// Why a listing could not be completed.
#[derive(Debug, thiserror::Error)]
pub enum ListingError {
    #[error("list page {page} failed")]
    Page {
        page: usize,
        #[source]
        source: Box<Error>,
    },
    #[error("the plugin answered the cursor of page {page} again: a listing that never ends")]
    RepeatedCursor { page: usize },
    #[error("the listing did not end within {MAX_PAGES} pages")]
    TooManyPages,
}

impl ListingError {
    /// Whether the listing only waits for a token of the ProviderConfig's own call budget (no
    /// call was refused by the cloud).
    pub fn waits_for_budget(&self) -> bool {
        matches!(self, ListingError::Page { source, .. } if matches!(**source, Error::Throttled { .. }))
    }
}

/// Every ProviderConfig's last complete listing, and when this process last asked the cloud to
/// change each machine.
#[derive(Debug, Default)]
pub struct CloudViews {
    listings: Mutex<HashMap<String, Arc<Listing>>>,
    touched: Mutex<HashMap<String, Instant>>,
    /// ProviderConfigs whose last listing attempt failed (their listing is kept, not steady).
    failing: Mutex<HashSet<String>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl CloudViews {
    /// The last complete listing of the ProviderConfig `name`.
    pub fn listing(&self, name: &str) -> Option<Arc<Listing>> {
        lock(&self.listings).get(name).cloned()
    }

    /// Replaces the ProviderConfig's listing, and forgets changes that every listing now began
    /// after.
    pub fn set(&self, name: &str, listing: Listing) {
        let oldest = {
            let mut listings = lock(&self.listings);
            listings.insert(name.to_owned(), Arc::new(listing));
            listings.values().map(|l| l.started).min()
        };
        if let Some(oldest) = oldest {
            lock(&self.touched).retain(|_, at| *at >= oldest);
        }
        lock(&self.failing).remove(name);
    }

    /// Forgets the ProviderConfig's listing (deleted, or no longer listable).
    pub fn forget(&self, name: &str) {
        lock(&self.listings).remove(name);
        lock(&self.failing).remove(name);
    }

    /// A listing of the ProviderConfig failed: whether it is the first failure since its last
    /// complete listing (then the VMs that listing answered for must check for themselves).
    pub fn failed(&self, name: &str) -> bool {
        lock(&self.listings).contains_key(name) && lock(&self.failing).insert(name.to_owned())
    }

    /// Whether the ProviderConfig's last listing attempt succeeded: its listings are running,
    /// so a machine that changes shows in the next one ([`changed`]).
    pub fn steady(&self, name: &str) -> bool {
        lock(&self.listings).contains_key(name) && !lock(&self.failing).contains(name)
    }

    /// This process is about to ask the cloud to change machine `id` (create answered it,
    /// update, start, stop, delete): a listing that began before now no longer speaks for it.
    pub fn touch(&self, id: &str, at: Instant) {
        lock(&self.touched).insert(id.to_owned(), at);
    }

    /// Machine `id` as `provider`'s view has it, if the view may answer for it (see the module
    /// docs): listed with the same identity, begun within `freshness`, after the last change
    /// asked for it and after `epoch` (when this process began to reconcile the machine's VM:
    /// its start, or its acquisition of the VM's shard, before which another replica may have
    /// changed the machine). `None` means "ask `get`", never "gone".
    pub fn machine(
        &self,
        provider: &Provider,
        id: &str,
        freshness: Duration,
        epoch: Instant,
    ) -> Option<VmStatus> {
        self.answer_for(&provider.name, provider.identity, id, freshness, epoch)
    }

    fn answer_for(
        &self,
        name: &str,
        identity: u64,
        id: &str,
        freshness: Duration,
        epoch: Instant,
    ) -> Option<VmStatus> {
        let listing = self.listing(name)?;
        let changed = lock(&self.touched).get(id).copied().max(Some(epoch));
        answer(&listing, identity, id, freshness, changed, Instant::now())
    }
}

/// The view's answer for machine `id` at `now` (see [`CloudViews::machine`]).
fn answer(
    listing: &Listing,
    identity: u64,
    id: &str,
    freshness: Duration,
    touched: Option<Instant>,
    now: Instant,
) -> Option<VmStatus> {
    let fresh = listing.identity == identity
        && now.saturating_duration_since(listing.started) <= freshness
        && touched.is_none_or(|at| at < listing.started);
    fresh
        .then(|| listing.machines.get(id))
        .flatten()
        .map(|m| m.status.clone())
}

/// Lists every page through `page` (the cursor in, one page out), for the provider of
/// `identity`: complete, or an error and nothing (see the module docs).
pub async fn list_all<F, Fut>(identity: u64, mut page: F) -> Result<Listing, ListingError>
where
    F: FnMut(Option<String>) -> Fut,
    Fut: Future<Output = Result<Page, Error>>,
{
    let started = Instant::now();
    let mut machines = HashMap::new();
    let mut cursors = HashSet::new();
    let mut cursor = None;
    for number in 1..=MAX_PAGES {
        let answer = page(cursor.take())
            .await
            .map_err(|source| ListingError::Page {
                page: number,
                source: Box::new(source),
            })?;
        for machine in answer.machines {
            machines.insert(machine.status.id.clone(), machine);
        }
        match answer.next {
            None => {
                return Ok(Listing {
                    started,
                    identity,
                    machines,
                    orphans: HashSet::new(),
                });
            }
            Some(next) if !cursors.insert(next.clone()) => {
                return Err(ListingError::RepeatedCursor { page: number });
            }
            Some(next) => cursor = Some(next),
        }
    }
    Err(ListingError::TooManyPages)
}

/// The machines of `old` that `new` shows otherwise (another status) or not at all: their VMs
/// are reconciled at once rather than at their next drift check, the way an informer's change
/// triggers a reconcile.
pub fn changed(old: &Listing, new: &Listing) -> Vec<String> {
    let mut ids: Vec<String> = old
        .machines
        .iter()
        .filter(|(id, m)| new.machines.get(*id).map(|n| &n.status) != Some(&m.status))
        .map(|(id, _)| id.clone())
        .collect();
    ids.sort();
    ids
}

/// What to do about a listing's orphans.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Orphans {
    /// Every orphan's id.
    pub all: HashSet<String>,
    /// Those the Delete policy may delete now.
    pub deletable: Vec<String>,
}

/// The orphans of `listing`: machines marked with `cluster` whose owner uid is not in `uids`
/// (every VirtualMachine of this cluster). `deletable` are those that were orphans in
/// `previous` too and were made, by the cloud's word, more than `grace` before `now_ms`
/// (milliseconds since the Unix epoch).
pub fn orphans<'a>(
    listing: impl IntoIterator<Item = (&'a String, &'a ListedMachine)>,
    previous: Option<&HashSet<String>>,
    cluster: &str,
    uids: &HashSet<String>,
    grace: Duration,
    now_ms: u64,
) -> Orphans {
    let grace_ms = u64::try_from(grace.as_millis()).unwrap_or(u64::MAX);
    let mut found = Orphans::default();
    for (id, machine) in listing {
        let ours = !cluster.is_empty() && machine.cluster.as_deref() == Some(cluster);
        let Some(owner) = machine.status.owner.as_deref() else {
            continue;
        };
        if !ours || uids.contains(owner) {
            continue;
        }
        found.all.insert(id.clone());
        let old_enough = machine
            .created_at_ms
            .is_some_and(|made| now_ms.saturating_sub(made) > grace_ms);
        if old_enough && previous.is_some_and(|p| p.contains(id)) {
            found.deletable.push(id.clone());
        }
    }
    found.deletable.sort();
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugin::Phase;

    fn machine(
        id: &str,
        owner: Option<&str>,
        cluster: Option<&str>,
        made: Option<u64>,
    ) -> ListedMachine {
        ListedMachine {
            status: VmStatus {
                id: id.into(),
                phase: Phase::Running,
                addresses: vec![],
                message: None,
                owner: owner.map(Into::into),
            },
            cluster: cluster.map(Into::into),
            created_at_ms: made,
        }
    }

    fn by_id(machines: Vec<ListedMachine>) -> HashMap<String, ListedMachine> {
        machines
            .into_iter()
            .map(|m| (m.status.id.clone(), m))
            .collect()
    }

    #[test]
    fn orphans_are_only_this_clusters_and_old_enough() {
        let hour = 3_600_000;
        let now = 100 * hour;
        let listing = by_id(vec![
            machine("i-live", Some("u-live"), Some("c1"), Some(0)),
            machine("i-orphan", Some("u-gone"), Some("c1"), Some(0)),
            machine("i-young", Some("u-gone2"), Some("c1"), Some(now - 1000)),
            machine("i-undated", Some("u-gone3"), Some("c1"), None),
            machine("i-other", Some("u-gone4"), Some("c2"), Some(0)),
            machine("i-unmarked", Some("u-gone5"), None, Some(0)),
            machine("i-nobody", None, Some("c1"), Some(0)),
        ]);
        let uids: HashSet<String> = ["u-live".to_owned()].into();
        let grace = Duration::from_secs(600);
        let first = orphans(&listing, None, "c1", &uids, grace, now);
        let all: HashSet<String> = ["i-orphan", "i-young", "i-undated"]
            .map(String::from)
            .into();
        assert_eq!(first.all, all);
        assert!(first.deletable.is_empty(), "never on the first sight");
        let second = orphans(&listing, Some(&first.all), "c1", &uids, grace, now);
        assert_eq!(second.deletable, vec!["i-orphan".to_owned()]);
        let no_cluster = orphans(&listing, Some(&first.all), "", &uids, grace, now);
        assert!(
            no_cluster.all.is_empty(),
            "no cluster identity: nothing is ours"
        );
    }

    fn page(ids: &[&str], next: Option<&str>) -> Page {
        Page {
            machines: ids
                .iter()
                .map(|id| machine(id, Some("u"), Some("c"), None))
                .collect(),
            next: next.map(Into::into),
        }
    }

    #[tokio::test]
    async fn a_listing_follows_cursors_to_the_end_and_refuses_a_loop() {
        let pages = [
            page(&["a", "b"], Some("2")),
            page(&["c"], Some("3")),
            page(&[], None),
        ];
        let mut asked = Vec::new();
        let listing = list_all(1, |cursor| {
            asked.push(cursor.clone());
            let n = cursor.map_or(0, |c| c.parse::<usize>().unwrap_or(0) - 1);
            let answer = pages.get(n).cloned().unwrap_or_default();
            async move { Ok(answer) }
        })
        .await
        .unwrap();
        assert_eq!(asked, [None, Some("2".into()), Some("3".into())]);
        assert_eq!(listing.machines.len(), 3);

        let endless = list_all(1, |_| async { Ok(page(&["x"], Some("again"))) }).await;
        assert!(
            matches!(endless, Err(ListingError::RepeatedCursor { page: 2 })),
            "{endless:?}"
        );
        let mut n = 0u64;
        let growing = list_all(1, |_| {
            n += 1;
            let next = n.to_string();
            async move { Ok(page(&[], Some(&next))) }
        })
        .await;
        assert!(
            matches!(growing, Err(ListingError::TooManyPages)),
            "{growing:?}"
        );
    }

    #[test]
    fn changed_machines_are_those_shown_otherwise_or_gone() {
        let listing = |machines: Vec<ListedMachine>| Listing {
            started: Instant::now(),
            identity: 1,
            machines: by_id(machines),
            orphans: HashSet::new(),
        };
        let old = listing(vec![
            machine("same", Some("u1"), Some("c"), None),
            machine("stopped", Some("u2"), Some("c"), None),
            machine("gone", Some("u3"), Some("c"), None),
        ]);
        let mut stopped = machine("stopped", Some("u2"), Some("c"), None);
        stopped.status.phase = Phase::Stopped;
        let new = listing(vec![
            machine("same", Some("u1"), Some("c"), None),
            stopped,
            machine("new", Some("u4"), Some("c"), None),
        ]);
        assert_eq!(changed(&old, &new), ["gone", "stopped"]);
    }

    #[test]
    fn a_listing_begun_before_the_vm_was_taken_on_does_not_answer() {
        let views = CloudViews::default();
        let started = Instant::now();
        views.set(
            "pc",
            Listing {
                started,
                identity: 7,
                machines: by_id(vec![machine("i-1", Some("u"), Some("c"), None)]),
                orphans: HashSet::new(),
            },
        );
        let hour = Duration::from_secs(3600);
        let before = started
            .checked_sub(Duration::from_secs(1))
            .unwrap_or(started);
        assert!(
            views.answer_for("pc", 7, "i-1", hour, before).is_some(),
            "held since before the listing"
        );
        let acquired = started + Duration::from_millis(1);
        assert!(
            views.answer_for("pc", 7, "i-1", hour, acquired).is_none(),
            "a shard acquired after the listing began"
        );
    }

    #[test]
    fn a_view_answers_only_what_it_may() {
        let started = Instant::now();
        let listing = Listing {
            started,
            identity: 7,
            machines: by_id(vec![machine("i-1", Some("u"), Some("c"), None)]),
            orphans: HashSet::new(),
        };
        let minute = Duration::from_secs(60);
        let now = started + Duration::from_secs(30);
        assert!(answer(&listing, 7, "i-1", minute, None, now).is_some());
        assert!(
            answer(&listing, 7, "i-2", minute, None, now).is_none(),
            "absent: ask get"
        );
        assert!(
            answer(&listing, 8, "i-1", minute, None, now).is_none(),
            "other identity"
        );
        assert!(
            answer(&listing, 7, "i-1", Duration::from_secs(10), None, now).is_none(),
            "older than the poll interval"
        );
        let after = Some(started + Duration::from_secs(1));
        assert!(
            answer(&listing, 7, "i-1", minute, after, now).is_none(),
            "changed since"
        );
        let before = started.checked_sub(Duration::from_secs(1));
        assert!(answer(&listing, 7, "i-1", minute, before, now).is_some());
    }
}
