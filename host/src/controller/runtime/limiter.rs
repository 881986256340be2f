//! Per-ProviderConfig throttling of plugin calls: a token bucket (`requestsPerSecond`, `burst`,
//! its rate halved by the cloud's throttle answers and climbing back: `bucket.rs`) and a cap on
//! calls in flight (`maxConcurrentCalls`).
//!
//! # Guarantees
//!
//! - At most `max_concurrent` calls hold a [`Permit`] at once.
//! - Over any window of `t` seconds, at most `burst + rate * t` permits are handed out.
//! - Nobody waits here: [`Limiter::try_acquire`] answers at once, with a permit or with how long
//!   until one is due, so a throttled ProviderConfig holds no reconcile worker and never delays
//!   another's VMs (tests: `try_acquire_never_waits_and_spaces_callers`, and
//!   `tests/tests/operator/operator_throttle.rs`).
//! - A caller told to come back is holding a reservation: the token is set aside for it (the
//!   bucket goes into debt), so callers turned away together come back spaced at the rate
//!   instead of all at once.
//! - When `mutatingRequestsPerSecond` is set, calls that change machines
//!   ([`Limiter::try_acquire_write`]) take a token of the mutating bucket *instead of* the
//!   shared one, as EC2 accounts them: over any window of `t` seconds at most
//!   `mutatingBurst + mutatingRate * t` of them, the bound above then counts the other calls
//!   only, and a throttle answer to a write halves the writes' rate, not the reads'
//!   (`writes_are_paced_by_their_own_bucket`). A write turned away holds the mutating
//!   bucket's next free token, as above.
//! - Routine calls (the drift check of a settled VM, [`Limiter::try_acquire_routine`]) yield:
//!   they get a token only while nobody holds a reservation, and never reserve one, so VMs
//!   with work to do are not queued behind the periodic checks of healthy ones
//!   (`routine_calls_yield_to_waiting_callers`). A reservation not claimed within
//!   [`STALE_RESERVATION`] of its due time (its VM was deleted, or went elsewhere) no longer
//!   holds them back.
//!
//! # Caveats
//!
//! A limiter belongs to one set of limits; when a ProviderConfig's limits change, the
//! [`Limiters`] table hands out a new one and calls still holding permits of the old one finish
//! under the old bounds.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use super::bucket::TokenBucket;
use crate::api::Limits;

/// Tokens set aside for one caller: usable from `due`, `left` of them.
#[derive(Debug, Clone, Copy)]
struct Reservation {
    due: Instant,
    left: u32,
}

/// Tokens set aside, by caller key.
type Reservations = HashMap<String, Reservation>;

/// How long a caller turned away by the concurrency cap waits before trying again.
pub const BUSY_RETRY: Duration = Duration::from_millis(200);

/// How long past its due time a reservation still makes routine calls wait.
pub const STALE_RESERVATION: Duration = Duration::from_secs(10);

/// Spread of the returns of routine calls turned away together.
const ROUTINE_SPREAD: Duration = Duration::from_secs(1);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Counts one call of `caller` against its reservation, forgotten once used up; whether it
/// held one.
fn use_one(reservations: &mut Reservations, caller: &str) -> bool {
    let Some(reserved) = reservations.get_mut(caller) else {
        return false;
    };
    reserved.left = reserved.left.saturating_sub(1);
    if reserved.left == 0 {
        reservations.remove(caller);
    }
    true
}

/// The mutating bucket and the callers holding one of its tokens: when it is due, by caller.
#[derive(Debug)]
struct Writes {
    bucket: TokenBucket,
    reserved: HashMap<String, Instant>,
}

/// Throttle of one ProviderConfig.
#[derive(Debug)]
pub struct Limiter {
    limits: Limits,
    bucket: Mutex<TokenBucket>,
    /// `mutatingRequestsPerSecond`'s bucket, when set.
    writes: Option<Mutex<Writes>>,
    /// Tokens set aside for callers, by caller key.
    reservations: Mutex<Reservations>,
    in_flight: Arc<Semaphore>,
}

/// Held for the duration of one plugin call.
#[derive(Debug)]
pub struct Permit {
    _slot: OwnedSemaphorePermit,
}

impl Limiter {
    pub fn new(limits: &Limits) -> Self {
        Limiter {
            limits: limits.clone(),
            bucket: Mutex::new(TokenBucket::new(
                limits.requests_per_second,
                limits.burst,
                Instant::now(),
            )),
            writes: limits.mutating_requests_per_second.map(|rate| {
                let burst = limits.mutating_burst.unwrap_or(rate);
                Mutex::new(Writes {
                    bucket: TokenBucket::new(rate, burst, Instant::now()),
                    reserved: HashMap::new(),
                })
            }),
            reservations: Mutex::new(HashMap::new()),
            in_flight: Arc::new(Semaphore::new(limits.max_concurrent_calls.max(1) as usize)),
        }
    }

    /// A permit now, or how long `caller` should wait before asking again. `taken` is how many
    /// permits the caller already got in the attempt being throttled: the reservation then sets
    /// aside `taken + 1` tokens, so that the next attempt can make all of its calls (a
    /// reconcile repeats its reads before the call that was throttled; reserving one token
    /// would have it spend that token on the first read every time and never reach the write:
    /// `try_acquire_reserves_for_the_whole_attempt`). Never waits.
    pub fn try_acquire(&self, caller: &str, taken: u32) -> Result<Permit, Duration> {
        let now = Instant::now();
        let (slot, mut reservations) = self.slot()?;
        if let Some(reserved) = reservations.get_mut(caller) {
            if reserved.due > now {
                return Err(reserved.due - now);
            }
            use_one(&mut reservations, caller);
            return Ok(Permit { _slot: slot });
        }
        let mut bucket = lock(&self.bucket);
        if bucket.try_take(now).is_ok() {
            return Ok(Permit { _slot: slot });
        }
        let need = taken.saturating_add(1);
        let mut due = now;
        for _ in 0..need {
            if let Some(at) = bucket.reserve(now) {
                due = due.max(at);
            }
        }
        reservations.insert(caller.to_owned(), Reservation { due, left: need });
        Err(due - now)
    }

    /// [`Limiter::try_acquire`] for a call that changes a machine. With a mutating bucket the
    /// call takes a token of that bucket and none of the shared one, as EC2 charges a
    /// mutating action to its own bucket only; refused, the caller holds the next free token
    /// of that bucket, so that writers turned away together come back spaced at its rate,
    /// each once, instead of all retrying (and re-reading) whenever a token frees
    /// (`refused_writes_come_back_spaced_at_the_mutating_rate`). A caller holding a
    /// reservation of shared tokens waits for it like any of its calls, and a due one counts
    /// this call as one of those it was set aside for: that token goes back to the shared
    /// bucket instead of holding routine calls back until it is stale. Never waits.
    pub fn try_acquire_write(&self, caller: &str, taken: u32) -> Result<Permit, Duration> {
        let Some(writes) = &self.writes else {
            return self.try_acquire(caller, taken);
        };
        let now = Instant::now();
        let (slot, mut reservations) = self.slot()?;
        if let Some(reserved) = reservations.get(caller)
            && reserved.due > now
        {
            return Err(reserved.due - now);
        }
        {
            let mut writes = lock(writes);
            match writes.reserved.get(caller).copied() {
                Some(due) if due > now => return Err(due - now),
                Some(_) => {
                    writes.reserved.remove(caller);
                }
                None => {
                    if let Some(due) = writes.bucket.reserve(now) {
                        // Callers that never came back (deleted VMs) are forgotten.
                        writes.reserved.retain(|_, d| *d + STALE_RESERVATION > now);
                        writes.reserved.insert(caller.to_owned(), due);
                        return Err(due - now);
                    }
                }
            }
        }
        if use_one(&mut reservations, caller) {
            lock(&self.bucket).give_back();
        }
        Ok(Permit { _slot: slot })
    }

    /// The cloud throttled a call that changes a machine: the mutating bucket's rate is halved
    /// when there is one, else the shared one's. Returns the shared rate and the mutating rate.
    pub fn write_throttled(&self) -> (f64, Option<f64>) {
        match &self.writes {
            Some(writes) => {
                let now = Instant::now();
                let mut writes = lock(writes);
                writes.bucket.throttled(now);
                (self.budget(), Some(writes.bucket.rate(now)))
            }
            None => (self.throttled(), None),
        }
    }

    /// Calls that change machines allowed per second now, when they have their own bucket.
    pub fn write_budget(&self) -> Option<f64> {
        let mut writes = lock(self.writes.as_ref()?);
        Some(writes.bucket.rate(Instant::now()))
    }

    /// A permit for a routine call, or how long to wait: refused while any caller holds a
    /// reservation (until the last is due, plus a spread), and never reserving. Never waits.
    pub fn try_acquire_routine(&self) -> Result<Permit, Duration> {
        let now = Instant::now();
        let (slot, mut reservations) = self.slot()?;
        reservations.retain(|_, r| r.due + STALE_RESERVATION > now);
        let spread = || crate::controller::runtime::backoff::jitter(ROUTINE_SPREAD, 0.5);
        if let Some(last) = reservations.values().map(|r| r.due).max() {
            return Err(last.saturating_duration_since(now) + spread());
        }
        let mut bucket = lock(&self.bucket);
        match bucket.try_take(now) {
            Ok(()) => Ok(Permit { _slot: slot }),
            Err(wait) => Err(wait + spread()),
        }
    }

    /// A place under the concurrency cap (or [`BUSY_RETRY`]), and the reservations, locked.
    fn slot(&self) -> Result<(OwnedSemaphorePermit, MutexGuard<'_, Reservations>), Duration> {
        let slot = self
            .in_flight
            .clone()
            .try_acquire_owned()
            .map_err(|_| BUSY_RETRY)?;
        let reservations = lock(&self.reservations);
        Ok((slot, reservations))
    }

    /// The cloud answered a call "throttled": the bucket's rate is halved (`bucket.rs`).
    /// Returns the rate now, calls per second.
    pub fn throttled(&self) -> f64 {
        let now = Instant::now();
        let mut bucket = lock(&self.bucket);
        bucket.throttled(now);
        bucket.rate(now)
    }

    /// Calls per second allowed now.
    pub fn budget(&self) -> f64 {
        let mut bucket = lock(&self.bucket);
        bucket.rate(Instant::now())
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }
}

/// One [`Limiter`] per ProviderConfig name.
#[derive(Debug, Default)]
pub struct Limiters {
    by_name: Mutex<HashMap<String, Arc<Limiter>>>,
}

impl Limiters {
    /// The limiter of `name`, replaced when `limits` differ from the ones it was built with.
    pub fn get(&self, name: &str, limits: &Limits) -> Arc<Limiter> {
        let mut map = lock(&self.by_name);
        match map.get(name) {
            Some(l) if l.limits() == limits => l.clone(),
            _ => {
                let l = Arc::new(Limiter::new(limits));
                map.insert(name.to_owned(), l.clone());
                l
            }
        }
    }

    /// Forgets a deleted ProviderConfig.
    pub fn remove(&self, name: &str) {
        lock(&self.by_name).remove(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(rps: u32, burst: u32, concurrent: u32) -> Limits {
        Limits {
            requests_per_second: rps,
            burst,
            max_concurrent_calls: concurrent,
            ..Limits::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn writes_are_paced_by_their_own_bucket() {
        let limiter = Limiter::new(&Limits {
            mutating_requests_per_second: Some(2),
            mutating_burst: Some(2),
            ..limits(100, 100, 200)
        });
        let mut held = Vec::new();
        for i in 0..2 {
            held.push(limiter.try_acquire_write(&format!("w{i}"), 0).unwrap());
        }
        let wait = limiter.try_acquire_write("w2", 0).unwrap_err();
        assert_eq!(
            wait,
            Duration::from_millis(500),
            "the mutating bucket is empty"
        );
        // Reads still flow: the writes, made or refused, spent none of their tokens.
        for i in 0..100 {
            held.push(limiter.try_acquire(&format!("r{i}"), 0).unwrap());
        }
        assert!(
            limiter.try_acquire("r100", 0).is_err(),
            "the shared bucket held 100"
        );
        tokio::time::advance(Duration::from_millis(500)).await;
        // A throttle answer to a write halves the writes' rate, not the reads'.
        let (shared, writes) = limiter.write_throttled();
        assert_eq!(writes, Some(1.0));
        assert!(shared > 99.0, "{shared}");
        let unpaced = Limiter::new(&limits(100, 100, 100));
        assert_eq!(unpaced.write_throttled().1, None);
        assert_eq!(
            unpaced.budget(),
            50.0,
            "without a mutating bucket a write's throttle halves the shared one"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn refused_writes_come_back_spaced_at_the_mutating_rate() {
        let limiter = Limiter::new(&Limits {
            mutating_requests_per_second: Some(10),
            mutating_burst: Some(1),
            ..limits(1000, 1000, 100)
        });
        assert!(
            limiter.try_acquire_write("a", 0).is_ok(),
            "the burst is free"
        );
        let b = limiter.try_acquire_write("b", 0).unwrap_err();
        let c = limiter.try_acquire_write("c", 0).unwrap_err();
        assert_eq!(b, Duration::from_millis(100));
        assert_eq!(c, Duration::from_millis(200), "queued at the rate");
        assert_eq!(
            limiter.try_acquire_write("b", 0).unwrap_err(),
            b,
            "asking again early keeps the same token"
        );
        tokio::time::advance(b).await;
        assert!(
            limiter.try_acquire_write("b", 0).is_ok(),
            "its token is due"
        );
        assert!(limiter.try_acquire_write("c", 0).is_err(), "not yet due");
        assert_eq!(
            limiter.try_acquire_write("d", 0).unwrap_err(),
            Duration::from_millis(200),
            "a newcomer queues behind c"
        );
        tokio::time::advance(Duration::from_millis(100)).await;
        assert!(limiter.try_acquire_write("c", 0).is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_uses_up_the_reservation_of_its_attempt() {
        let limiter = Limiter::new(&Limits {
            mutating_requests_per_second: Some(10),
            ..limits(1, 1, 100)
        });
        assert!(limiter.try_acquire("vm", 0).is_ok());
        // The attempt's second call is throttled: two shared tokens are set aside for the next.
        let due = limiter.try_acquire("vm", 1).unwrap_err();
        assert!(
            limiter.try_acquire_write("vm", 0).is_err(),
            "a write waits for its caller's reservation like a read"
        );
        tokio::time::advance(due).await;
        assert!(limiter.try_acquire("vm", 0).is_ok());
        assert!(
            limiter.try_acquire_routine().is_err(),
            "one token still set aside"
        );
        // The next call is a write, from its own bucket: the token set aside for it returns.
        assert!(limiter.try_acquire_write("vm", 1).is_ok());
        assert!(
            limiter.try_acquire_routine().is_ok(),
            "a reservation no call will claim held routine calls back"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn routine_calls_yield_to_waiting_callers() {
        let limiter = Limiter::new(&limits(1, 1, 100));
        let first = limiter.try_acquire("busy", 0);
        assert!(first.is_ok());
        drop(first);
        // `busy` is turned away and holds a reservation: routine calls wait for it.
        let due = limiter.try_acquire("busy", 0).unwrap_err();
        let routine = limiter.try_acquire_routine().unwrap_err();
        assert!(routine >= due, "{routine:?} < {due:?}");
        tokio::time::advance(due).await;
        // Still: `busy` has not claimed its token yet.
        assert!(limiter.try_acquire_routine().is_err());
        assert!(limiter.try_acquire("busy", 0).is_ok());
        // The reservation is used and the bucket refilled: routine calls go again, and take
        // no reservation when turned away.
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(limiter.try_acquire_routine().is_ok());
        assert!(limiter.try_acquire_routine().is_err());
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(
            limiter.try_acquire("other", 0).is_ok(),
            "a routine refusal reserved"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_unclaimed_reservation_stops_holding_routine_calls_back() {
        let limiter = Limiter::new(&limits(1, 1, 100));
        drop(limiter.try_acquire("gone", 0));
        let due = limiter.try_acquire("gone", 0).unwrap_err();
        tokio::time::advance(due + STALE_RESERVATION).await;
        assert!(limiter.try_acquire_routine().is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn try_acquire_never_waits_and_spaces_callers() {
        let limiter = Limiter::new(&limits(2, 1, 100));
        assert!(limiter.try_acquire("a", 0).is_ok(), "the burst is free");
        let b = limiter.try_acquire("b", 0).unwrap_err();
        let c = limiter.try_acquire("c", 0).unwrap_err();
        assert_eq!(b, Duration::from_millis(500));
        assert_eq!(
            c,
            Duration::from_millis(1000),
            "reservations queue at the rate"
        );
        assert_eq!(
            limiter.try_acquire("b", 0).unwrap_err(),
            b,
            "asking again early keeps the same reservation"
        );
        tokio::time::advance(b).await;
        assert!(
            limiter.try_acquire("b", 0).is_ok(),
            "a due reservation is honoured"
        );
        assert!(limiter.try_acquire("c", 0).is_err());
        tokio::time::advance(Duration::from_millis(500)).await;
        assert!(limiter.try_acquire("c", 0).is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn try_acquire_is_refused_at_the_concurrency_cap() {
        let limiter = Limiter::new(&limits(1000, 1000, 1));
        let held = limiter.try_acquire("a", 0).unwrap();
        assert_eq!(limiter.try_acquire("b", 0).unwrap_err(), BUSY_RETRY);
        drop(held);
        assert!(limiter.try_acquire("b", 0).is_ok());
    }

    #[test]
    fn table_rebuilds_on_new_limits_only() {
        let table = Limiters::default();
        let a = table.get("aws", &limits(1, 1, 1));
        let b = table.get("aws", &limits(1, 1, 1));
        assert!(Arc::ptr_eq(&a, &b));
        let c = table.get("aws", &limits(2, 1, 1));
        assert!(!Arc::ptr_eq(&a, &c));
        let other = table.get("gcp", &limits(2, 1, 1));
        assert!(!Arc::ptr_eq(&c, &other));
    }
}
