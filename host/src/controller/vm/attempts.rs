//! What this process knows about `create` attempts, per VM uid: the facts behind "absence
//! proves nothing alone".
//!
//! A cloud with read-after-write lag may not show a machine for a while after `create`
//! returned (EC2 answers `InvalidInstanceID.NotFound` for a fresh id, and tag filters lag), and
//! a `create` whose answer was lost may still have made one. So `get`/`find` answering "none"
//! counts only once the creation grace period has passed since the last attempt that could
//! have made a machine. Attempts of an earlier process (before a crash or a leader change) are
//! not known here: they all ended before this process started reconciling, so the grace
//! period is also counted from the start of this process's epoch. Sharded, a shard this
//! process acquires starts an epoch of its own ([`Attempts::acquired`]): another replica held
//! it meanwhile and may have made creates this one does not know of.
//!
//! # Guarantees
//!
//! - [`Attempts::absence_wait`] is zero only when the grace period has passed since the start
//!   of this epoch, since this process last acquired the uid's shard, and since the end of
//!   every create attempt for the uid made in it (tests: `attempts::tests`, and the simulation
//!   `tests/simulation.rs`, which crashes the operator between every two steps and lags every
//!   read). An attempt whose future is dropped before it answers (a shard lost mid-call)
//!   counts as one that may have reached the cloud, ending when dropped ([`CreateAttempt`];
//!   `attempts::tests::a_dropped_attempt_may_have_reached_the_cloud`).
//! - Acquiring a shard forgets what this process knew of its VMs: knowledge from before a
//!   hand-over (another replica may have created or deleted meanwhile) is never trusted after
//!   it (`attempts::tests::an_acquired_shard_starts_a_new_epoch`).
//! - [`Attempts::never_created`] is true only when this process added the VM's finalizer (so
//!   every create attempt for it was made here: none can precede the finalizer) and no attempt
//!   could have reached the cloud. Deleting such a VM needs no cloud call, which is what lets
//!   a VM whose creates all failed against a dead endpoint be deleted.
//! - [`Attempts::sole_machine`] names a machine only when this process added the VM's
//!   finalizer, every create attempt that could have reached the cloud answered, all with
//!   that one machine, and since then no `delete` of it was asked (one that the call budget
//!   held back before sending it was not) and no `get` showed it as
//!   anything but this VM's own machine ([`Attempts::observe_first`]): the machine is this
//!   VM's own (its create marked it so), so deletion asks `delete` without a `get` first
//!   (`attempts::tests::sole_machine_needs_our_finalizer_and_every_attempt_answered`; the
//!   simulation, which loses answers and crashes between steps; and its
//!   `a_machine_seen_under_another_mark_is_observed_before_any_delete`, for the `get`).
//!   It says nothing about absence: `get` and `find` still confirm it. Lag can hide the very
//!   machine made from `get` for longer than the grace period while `find`'s other query
//!   already shows it (EC2: `InvalidInstanceID.NotFound` for a fresh id, its tag filter
//!   current); without `find` the fault matrix's row "NotFound for ids < 20 s old" leaks a
//!   machine (`tests/tests/faults/operator_faults.rs`, `fault_matrix`).

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::leader::shards::shard_of;

#[derive(Debug, Default, Clone)]
struct Known {
    /// This process added the finalizer: it made every create attempt there was.
    finalizer_added: bool,
    /// Some attempt may have reached the cloud.
    reached: bool,
    /// End of the last attempt that may have reached the cloud.
    last_end: Option<Instant>,
    /// Where that attempt went.
    last_location: Option<String>,
    /// The attempt that ended last may have reached the cloud and its answer is not recorded
    /// (yet: [`Attempts::created`] follows an answer).
    answer_pending: bool,
    /// An attempt that may have reached the cloud never answered: it may have made a machine.
    answer_lost: bool,
    /// The machine the attempts answered with.
    answered: Option<String>,
    /// Two attempts answered different machines.
    several: bool,
    /// A `delete` of the machine was asked, or a `get` did not show it as the VM's own.
    observed_first: bool,
}

/// Create attempts of this process (one epoch), by VM uid.
#[derive(Debug)]
pub struct Attempts {
    epoch: Instant,
    by_uid: Mutex<HashMap<String, Known>>,
    /// When this process last acquired each shard, by shard count and shard.
    acquired: Mutex<HashMap<(u32, u32), Instant>>,
}

/// A create attempt in flight: [`CreateAttempt::ended`] records how it ended; dropped without
/// it (the reconcile was cancelled mid-call), it is recorded as one that may have reached the
/// cloud and ended then.
#[derive(Debug)]
#[must_use = "record how the attempt ended"]
pub struct CreateAttempt<'a> {
    attempts: &'a Attempts,
    uid: &'a str,
    location: &'a str,
    open: bool,
}

impl CreateAttempt<'_> {
    /// The attempt answered (or failed); `reached` says whether it may have reached the cloud.
    pub fn ended(mut self, reached: bool) {
        self.open = false;
        self.attempts.create_ended(self.uid, self.location, reached);
    }
}

impl Drop for CreateAttempt<'_> {
    fn drop(&mut self) {
        if self.open {
            self.attempts.create_ended(self.uid, self.location, true);
        }
    }
}

impl Attempts {
    /// A new epoch starting now (a process start, or a new lease).
    pub fn new() -> Self {
        Attempts {
            epoch: Instant::now(),
            by_uid: Mutex::new(HashMap::new()),
            acquired: Mutex::new(HashMap::new()),
        }
    }

    /// An epoch that began long ago and knows of no attempt: what an operator that has been
    /// running for a while believes (`vmop plan`).
    pub fn settled() -> Self {
        let now = Instant::now();
        Attempts {
            epoch: now.checked_sub(Duration::from_secs(86_400)).unwrap_or(now),
            by_uid: Mutex::new(HashMap::new()),
            acquired: Mutex::new(HashMap::new()),
        }
    }

    /// This process now holds `shard` of `count`: its VMs start a new epoch, and what was
    /// known of them is forgotten.
    pub fn acquired(&self, shard: u32, count: u32) {
        self.acquired
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert((count, shard), Instant::now());
        self.by_uid
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|uid, _| shard_of(uid, count) != shard);
    }

    /// The start of `uid`'s epoch: this process's, or the last acquisition of its shard. What
    /// the cloud showed before it may predate changes another replica made.
    pub fn epoch_of(&self, uid: &str) -> Instant {
        let acquired = self.acquired.lock().unwrap_or_else(PoisonError::into_inner);
        acquired
            .iter()
            .filter(|((count, shard), _)| shard_of(uid, *count) == *shard)
            .map(|(_, at)| *at)
            .fold(self.epoch, Instant::max)
    }

    /// A create attempt for `uid` at `location` is starting.
    pub fn create_starting<'a>(&'a self, uid: &'a str, location: &'a str) -> CreateAttempt<'a> {
        CreateAttempt {
            attempts: self,
            uid,
            location,
            open: true,
        }
    }

    fn with<T>(&self, uid: &str, f: impl FnOnce(&mut Known) -> T) -> T {
        let mut map = self.by_uid.lock().unwrap_or_else(PoisonError::into_inner);
        f(map.entry(uid.to_owned()).or_default())
    }

    /// This process is adding the VM's finalizer (before any create for it).
    pub fn finalizer_added(&self, uid: &str) {
        self.with(uid, |k| k.finalizer_added = true);
    }

    /// The API server refused the finalizer patch: it did not land, so what
    /// [`Attempts::finalizer_added`] assumed does not hold.
    pub fn finalizer_refused(&self, uid: &str) {
        self.with(uid, |k| k.finalizer_added = false);
    }

    /// A create attempt for `uid` at `location` ended; `reached` says whether it may have
    /// reached the cloud.
    fn create_ended(&self, uid: &str, location: &str, reached: bool) {
        let now = Instant::now();
        self.with(uid, |k| {
            k.answer_lost |= k.answer_pending;
            k.answer_pending = reached;
            if reached {
                k.reached = true;
                k.last_end = Some(now);
                k.last_location = Some(location.to_owned());
            }
        });
    }

    /// The create attempt for `uid` that [`Attempts::create_ended`] just recorded answered with
    /// machine `id`.
    pub fn created(&self, uid: &str, id: &str) {
        self.with(uid, |k| {
            k.answer_pending = false;
            match &k.answered {
                Some(known) if known != id => k.several = true,
                Some(_) => {}
                None => k.answered = Some(id.to_owned()),
            }
        });
    }

    /// The only machine that can exist for `uid`, when this process knows it and has not
    /// asked to delete it yet: see the module docs.
    pub fn sole_machine(&self, uid: &str) -> Option<String> {
        self.with(uid, |k| {
            let every_answered = !k.answer_pending && !k.answer_lost && !k.several;
            (k.finalizer_added && every_answered && !k.observed_first)
                .then(|| k.answered.clone())
                .flatten()
        })
    }

    /// A `delete` for `uid`'s machine is being asked, or a `get` did not show it as the VM's
    /// own: from now on it is observed before it is deleted. Returns whether it already was.
    pub fn observe_first(&self, uid: &str) -> bool {
        self.with(uid, |k| std::mem::replace(&mut k.observed_first, true))
    }

    /// The `delete` that [`Attempts::observe_first`] marked (answering `was`) was held back
    /// before it was sent, by the ProviderConfig's call budget: nothing reached the cloud, so
    /// what held before holds again, and a paced deletion costs no `get` per wait for a token
    /// (`attempts::tests::a_delete_held_back_leaves_the_sole_machine`; on the real parts,
    /// `operator_budget::creates_paced_to_the_clouds_mutating_bucket_are_never_throttled`, whose
    /// VMs are read before their delete without it).
    pub fn delete_held_back(&self, uid: &str, was: bool) {
        self.with(uid, |k| k.observed_first = was);
    }

    /// Where the last create attempt for `uid` that may have made a machine went. This
    /// process's own knowledge, so it holds even while the informer still shows an object
    /// older than this process's writes.
    pub fn reached_location(&self, uid: &str) -> Option<String> {
        self.with(uid, |k| k.last_location.clone())
    }

    /// How long until "none" from the cloud may be believed for `uid`; zero when it may now.
    pub fn absence_wait(&self, uid: &str, grace: Duration) -> Duration {
        let now = Instant::now();
        let last = self.with(uid, |k| k.last_end);
        let epoch = self.epoch_of(uid);
        let since = last.map_or(epoch, |end| end.max(epoch));
        // A grace period too long to add to an instant never ends.
        since
            .checked_add(grace)
            .map_or(Duration::MAX, |end| end.saturating_duration_since(now))
    }

    /// Whether no machine can exist for `uid`: see the module docs.
    pub fn never_created(&self, uid: &str) -> bool {
        self.with(uid, |k| k.finalizer_added && !k.reached)
    }

    /// The VM is gone: nothing more to remember.
    pub fn forget(&self, uid: &str) {
        self.by_uid
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(uid);
    }
}

impl Default for Attempts {
    fn default() -> Self {
        Attempts::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRACE: Duration = Duration::from_secs(30);

    #[tokio::test(start_paused = true)]
    async fn absence_waits_for_the_epoch_and_the_last_attempt() {
        let a = Attempts::new();
        assert_eq!(a.absence_wait("u", GRACE), GRACE, "a new epoch waits");
        tokio::time::advance(Duration::from_secs(40)).await;
        assert_eq!(a.absence_wait("u", GRACE), Duration::ZERO);
        a.create_starting("u", "here").ended(true);
        assert_eq!(a.absence_wait("u", GRACE), GRACE);
        assert_eq!(a.reached_location("u").as_deref(), Some("here"));
        assert_eq!(a.absence_wait("other", GRACE), Duration::ZERO);
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(a.absence_wait("u", GRACE), Duration::from_secs(20));
        a.create_starting("u", "there").ended(false);
        assert_eq!(a.reached_location("u").as_deref(), Some("here"));
        assert_eq!(
            a.absence_wait("u", GRACE),
            Duration::from_secs(20),
            "an attempt that reached nothing does not extend the wait"
        );
    }

    #[test]
    fn never_created_needs_our_finalizer_and_no_reaching_attempt() {
        let a = Attempts::new();
        assert!(
            !a.never_created("u"),
            "an earlier process may have created it"
        );
        a.finalizer_added("u");
        assert!(a.never_created("u"));
        a.create_starting("u", "here").ended(false);
        assert!(a.never_created("u"));
        a.create_starting("u", "here").ended(true);
        assert!(!a.never_created("u"));
        a.forget("u");
        assert!(!a.never_created("u"));
    }

    #[test]
    fn sole_machine_needs_our_finalizer_and_every_attempt_answered() {
        let a = Attempts::new();
        a.create_starting("u", "here").ended(true);
        a.created("u", "i-1");
        assert_eq!(
            a.sole_machine("u"),
            None,
            "an earlier process may have made another"
        );

        a.finalizer_added("v");
        assert_eq!(a.sole_machine("v"), None, "no attempt yet");
        a.create_starting("v", "here").ended(false);
        assert_eq!(a.sole_machine("v"), None, "nothing reached the cloud");
        a.create_starting("v", "here").ended(true);
        assert_eq!(a.sole_machine("v"), None, "no answer yet");
        a.created("v", "i-1");
        assert_eq!(a.sole_machine("v").as_deref(), Some("i-1"));
        a.create_starting("v", "here").ended(true);
        a.created("v", "i-1");
        assert_eq!(
            a.sole_machine("v").as_deref(),
            Some("i-1"),
            "an idempotent repeat"
        );
        a.create_starting("v", "here").ended(true);
        assert_eq!(
            a.sole_machine("v"),
            None,
            "an answer was lost: it may have made another"
        );

        a.finalizer_added("w");
        a.create_starting("w", "here").ended(true);
        a.created("w", "i-1");
        a.create_starting("w", "here").ended(true);
        a.created("w", "i-2");
        assert_eq!(a.sole_machine("w"), None, "two machines were answered");

        // A plugin that needs no network answers without reaching anything: still its machine.
        a.finalizer_added("x");
        a.create_starting("x", "here").ended(false);
        a.created("x", "vm-x");
        assert_eq!(a.sole_machine("x").as_deref(), Some("vm-x"));
        a.observe_first("x");
        assert_eq!(
            a.sole_machine("x"),
            None,
            "deleted once: observed from now on"
        );
    }

    #[test]
    fn a_delete_held_back_leaves_the_sole_machine() {
        let a = Attempts::new();
        a.finalizer_added("u");
        a.create_starting("u", "here").ended(true);
        a.created("u", "i-1");
        let was = a.observe_first("u");
        a.delete_held_back("u", was);
        assert_eq!(a.sole_machine("u").as_deref(), Some("i-1"), "never sent");
        assert!(!a.observe_first("u"));
        assert_eq!(a.sole_machine("u"), None, "sent: observed from now on");

        let was = a.observe_first("u");
        a.delete_held_back("u", was);
        assert_eq!(
            a.sole_machine("u"),
            None,
            "held back after one was sent: still observed first"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_attempt_may_have_reached_the_cloud() {
        let a = Attempts::new();
        a.finalizer_added("u");
        tokio::time::advance(Duration::from_secs(40)).await;
        drop(a.create_starting("u", "here"));
        assert!(!a.never_created("u"), "it may have made a machine");
        assert_eq!(a.sole_machine("u"), None, "its answer is lost");
        assert_eq!(a.absence_wait("u", GRACE), GRACE, "counted from the drop");
        assert_eq!(a.reached_location("u").as_deref(), Some("here"));
    }

    #[tokio::test(start_paused = true)]
    async fn an_acquired_shard_starts_a_new_epoch() {
        let a = Attempts::new();
        let (mine, other) = ("uid-in-0", "uid-in-1");
        let count = 2;
        let shard = shard_of(mine, count);
        let other = if shard_of(other, count) == shard {
            (0..)
                .map(|i| format!("uid-{i}"))
                .find(|u| shard_of(u, count) != shard)
                .unwrap_or_default()
        } else {
            other.to_owned()
        };
        for uid in [mine, other.as_str()] {
            a.finalizer_added(uid);
        }
        tokio::time::advance(Duration::from_secs(40)).await;
        assert_eq!(a.absence_wait(mine, GRACE), Duration::ZERO);
        assert!(a.never_created(mine));

        a.acquired(shard, count);
        assert_eq!(
            a.absence_wait(mine, GRACE),
            GRACE,
            "another replica may have created"
        );
        assert!(
            !a.never_created(mine),
            "nothing known from before the hand-over"
        );
        assert_eq!(
            a.absence_wait(&other, GRACE),
            Duration::ZERO,
            "other shards keep theirs"
        );
        assert!(a.never_created(&other));
        tokio::time::advance(GRACE).await;
        assert_eq!(a.absence_wait(mine, GRACE), Duration::ZERO);
    }
}
