//! The token bucket of one ProviderConfig's calls, whose rate adapts to the cloud's throttling
//! (additive increase, multiplicative decrease).
//!
//! Clouds throttle per account, not per client: EC2's buckets are shared by every tool of an
//! account and region, so the configured `requestsPerSecond` can be more than the cloud grants
//! vmop at a given moment. Retrying into a throttle answer only deepens it. Instead each throttle
//! answer halves the rate (at most once per [`CUT_SPACING`], so that the calls in flight when
//! the cloud started refusing count once), and every second without one gives back
//! [`RECOVERY_SECONDS`]-th of the configured rate, up to it. The configured rate stays the
//! ceiling: the budget never exceeds what the user allowed.
//!
//! # Guarantees (tests below)
//!
//! - Over any window of `t` seconds, at most `burst + rate * t` tokens are taken, with `rate` the
//!   highest rate in force during the window, never above the configured one.
//! - A throttle answer halves the rate and drops the tokens saved up, so the next calls are
//!   spaced at the new rate at once; the rate never falls below [`floor`].
//! - Without throttle answers the rate climbs back to the configured one within
//!   [`RECOVERY_SECONDS`].

use std::time::Duration;

use tokio::time::Instant;

/// Throttle answers closer together than this cut the rate once.
pub const CUT_SPACING: Duration = Duration::from_secs(1);

/// Seconds without a throttle answer for the rate to climb from its floor to the configured one.
pub const RECOVERY_SECONDS: f64 = 60.0;

/// The lowest rate throttling can bring a bucket to: 1/64 of the configured one, and at least
/// one call every 20 s, so that a VM is never starved outright.
pub fn floor(ceiling: f64) -> f64 {
    (ceiling / 64.0).max(0.05)
}

/// The bucket's arithmetic, separate from time and locking so it can be reasoned about alone.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    rate: f64,
    /// The configured rate.
    ceiling: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
    last_cut: Option<Instant>,
}

impl TokenBucket {
    /// A full bucket: `burst` calls may go at once.
    pub fn new(rate_per_second: u32, burst: u32, now: Instant) -> Self {
        let burst = f64::from(burst.max(1));
        let rate = f64::from(rate_per_second.max(1));
        TokenBucket {
            rate,
            ceiling: rate,
            burst,
            tokens: burst,
            last: now,
            last_cut: None,
        }
    }

    /// Calls per second allowed now.
    pub fn rate(&mut self, now: Instant) -> f64 {
        self.refill(now);
        self.rate
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        self.rate = (self.rate + elapsed * self.ceiling / RECOVERY_SECONDS).min(self.ceiling);
        self.last = now;
    }

    /// The cloud answered a call with "throttled": halve the rate (once per [`CUT_SPACING`])
    /// and spend what was saved up. Whether the rate was cut.
    pub fn throttled(&mut self, now: Instant) -> bool {
        self.refill(now);
        if self
            .last_cut
            .is_some_and(|at| now.saturating_duration_since(at) < CUT_SPACING)
        {
            return false;
        }
        self.last_cut = Some(now);
        self.rate = (self.rate / 2.0).max(floor(self.ceiling));
        self.tokens = self.tokens.min(0.0);
        true
    }

    /// Takes one token, or says how long until one is available.
    pub fn try_take(&mut self, now: Instant) -> Result<(), Duration> {
        self.refill(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - self.tokens) / self.rate))
        }
    }

    /// Puts back a token taken for a call that was not made after all.
    pub fn give_back(&mut self) {
        self.tokens = (self.tokens + 1.0).min(self.burst);
    }

    /// Takes one token now, or sets the next free one aside and says when it is due.
    pub fn reserve(&mut self, now: Instant) -> Option<Instant> {
        self.refill(now);
        self.tokens -= 1.0;
        if self.tokens >= 0.0 {
            None
        } else {
            Some(now + Duration::from_secs_f64(-self.tokens / self.rate))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn bucket_allows_burst_then_the_rate() {
        let start = Instant::now();
        let mut b = TokenBucket::new(2, 3, start);
        for _ in 0..3 {
            assert_eq!(b.try_take(start), Ok(()));
        }
        assert_eq!(b.try_take(start), Err(Duration::from_millis(500)));
        assert!(b.try_take(start + Duration::from_millis(499)).is_err());
        assert_eq!(b.try_take(start + Duration::from_millis(500)), Ok(()));
        // A long idle period refills only up to the burst.
        let later = start + Duration::from_secs(60);
        for _ in 0..3 {
            assert_eq!(b.try_take(later), Ok(()));
        }
        assert!(b.try_take(later).is_err());
    }

    /// Tokens taken from `from` for `seconds`, trying every 10 ms.
    fn taken(b: &mut TokenBucket, from: Instant, seconds: u64) -> u64 {
        (0..seconds * 100)
            .filter(|i| b.try_take(from + Duration::from_millis(i * 10)).is_ok())
            .count() as u64
    }

    #[tokio::test(start_paused = true)]
    async fn a_throttle_answer_halves_the_rate_at_once_and_once_per_burst_of_answers() {
        let start = Instant::now();
        let mut b = TokenBucket::new(20, 100, start);
        assert!(b.throttled(start));
        // No burst saved up: the next second sees about the new rate, not 100 at once.
        let second = taken(&mut b, start, 1);
        assert!(
            (9..=11).contains(&second),
            "{second} calls in the second after the cut"
        );

        let mut b = TokenBucket::new(20, 100, start);
        assert!(b.throttled(start));
        // The calls in flight that were throttled together cut it once.
        let half = start + Duration::from_millis(500);
        assert!(!b.throttled(half));
        assert_eq!(b.rate(half), 10.0 + 0.5 * 20.0 / RECOVERY_SECONDS);
        // Throttled again after the spacing: halved again.
        assert!(b.throttled(start + CUT_SPACING));
        assert!(b.rate(start + CUT_SPACING) < 5.5);
    }

    #[tokio::test(start_paused = true)]
    async fn the_rate_never_falls_below_its_floor_and_climbs_back_to_the_configured_one() {
        let start = Instant::now();
        let mut b = TokenBucket::new(64, 64, start);
        let mut now = start;
        for _ in 0..20 {
            b.throttled(now);
            assert!(b.rate(now) >= floor(64.0));
            now += CUT_SPACING;
        }
        // Cut every second, it hovers just above the floor (1/s) with what a second gives back.
        assert!(b.rate(now) < 3.0, "{}", b.rate(now));
        assert_eq!(floor(64.0), 1.0);
        assert_eq!(floor(1.0), 0.05);
        let recovered = now + Duration::from_secs_f64(RECOVERY_SECONDS);
        assert_eq!(b.rate(recovered), 64.0);
        // And never above it, however long it stays quiet.
        let quiet = recovered + Duration::from_secs(3600);
        assert_eq!(b.rate(quiet), 64.0);
        let calls = taken(&mut b, quiet, 2);
        assert!(calls <= 64 + 2 * 64, "{calls}");
    }
}
