//! Per-object exponential backoff: kube-runtime retries a failed reconcile only when told to,
//! so the delay of each object's next attempt is kept here.
//!
//! # Guarantees
//!
//! - The n-th consecutive failure of an object waits `base * 2^(n-1)`, capped at `cap`, with
//!   up to 10% jitter either way (never beyond `cap`).
//! - A success ([`Backoffs::reset`]) starts the object's sequence over.
//! - Objects are independent: one failing VM never delays another.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, RandomState};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackoffConfig {
    pub base: Duration,
    pub cap: Duration,
}

impl Default for BackoffConfig {
    fn default() -> Self {
        BackoffConfig {
            base: Duration::from_secs(1),
            cap: Duration::from_secs(300),
        }
    }
}

impl BackoffConfig {
    /// Two minutes doubling to an hour: for errors that only a change can fix, which may be made
    /// outside Kubernetes.
    pub const SLOW: BackoffConfig = BackoffConfig {
        base: Duration::from_secs(120),
        cap: Duration::from_secs(3600),
    };

    /// The un-jittered delay after `failures` consecutive failures (`failures >= 1`).
    pub fn delay(&self, failures: u32) -> Duration {
        let exp = failures.saturating_sub(1).min(31);
        self.base.saturating_mul(1u32 << exp).min(self.cap)
    }
}

/// Consecutive-failure counts keyed by object.
#[derive(Debug)]
pub struct Backoffs<K> {
    config: BackoffConfig,
    failures: Mutex<HashMap<K, u32>>,
}

impl<K: Hash + Eq + Clone> Backoffs<K> {
    pub fn new(config: BackoffConfig) -> Self {
        Backoffs {
            config,
            failures: Mutex::new(HashMap::new()),
        }
    }

    /// Records a failure of `key` and returns how long to wait before retrying it.
    pub fn next(&self, key: &K) -> Duration {
        let failures = {
            let mut map = self.failures.lock().unwrap_or_else(PoisonError::into_inner);
            let n = map.entry(key.clone()).or_insert(0);
            *n = n.saturating_add(1);
            *n
        };
        jitter(self.config.delay(failures), 0.1).min(self.config.cap)
    }

    /// Records a success of `key`.
    pub fn reset(&self, key: &K) {
        self.failures
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(key);
    }

    /// Consecutive failures of `key` so far.
    pub fn failures(&self, key: &K) -> u32 {
        let map = self.failures.lock().unwrap_or_else(PoisonError::into_inner);
        map.get(key).copied().unwrap_or(0)
    }
}

/// `d` scaled by a random factor in `[1 - fraction, 1 + fraction]`, so that objects that failed
/// (or were resynced) together do not retry together.
pub fn jitter(d: Duration, fraction: f64) -> Duration {
    // A fresh RandomState is randomly keyed: enough randomness for spreading retries, without a
    // dependency on an RNG crate.
    let r = RandomState::new().hash_one(0u8) as f64 / u64::MAX as f64;
    let factor = (1.0 - fraction + 2.0 * fraction * r).max(0.0);
    // Saturating: no duration, however long, panics here.
    Duration::try_from_secs_f64(d.as_secs_f64() * factor).unwrap_or(Duration::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_never_panics_on_a_long_duration() {
        assert!(jitter(Duration::MAX, 0.1) > Duration::from_secs(u64::MAX / 2));
        let d = jitter(Duration::from_secs(100), 0.1);
        assert!(
            d >= Duration::from_secs(90) && d <= Duration::from_secs(110),
            "{d:?}"
        );
    }

    const CFG: BackoffConfig = BackoffConfig {
        base: Duration::from_secs(1),
        cap: Duration::from_secs(60),
    };

    #[test]
    fn delay_doubles_up_to_the_cap() {
        let delays: Vec<u64> = (1..=8).map(|n| CFG.delay(n).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 32, 60, 60]);
        assert_eq!(CFG.delay(u32::MAX), Duration::from_secs(60));
    }

    #[test]
    fn next_grows_per_object_and_reset_starts_over() {
        let b = Backoffs::new(CFG);
        let within = |d: Duration, nominal: u64| {
            let n = nominal as f64;
            d.as_secs_f64() >= n * 0.9 && d.as_secs_f64() <= n * 1.1
        };
        assert!(within(b.next(&"a"), 1));
        assert!(within(b.next(&"a"), 2));
        assert!(within(b.next(&"a"), 4));
        assert!(within(b.next(&"b"), 1), "objects must not share a sequence");
        assert_eq!(b.failures(&"a"), 3);
        b.reset(&"a");
        assert_eq!(b.failures(&"a"), 0);
        assert!(within(b.next(&"a"), 1));
    }

    #[test]
    fn jittered_delay_never_exceeds_the_cap() {
        let b = Backoffs::new(CFG);
        for _ in 0..50 {
            assert!(b.next(&"x") <= CFG.cap);
        }
    }

    #[test]
    fn jitter_stays_in_bounds_and_varies() {
        let d = Duration::from_secs(100);
        let samples: Vec<Duration> = (0..100).map(|_| jitter(d, 0.1)).collect();
        assert!(
            samples
                .iter()
                .all(|s| *s >= Duration::from_secs(90) && *s <= Duration::from_secs(110))
        );
        assert!(
            samples.iter().any(|s| *s != samples[0]),
            "jitter never varied"
        );
    }
}
