//! A token bucket for the testcloud's optional request rate: a request beyond it is answered
//! 429 with `Retry-After`, as a real cloud's API throttling would.

use std::time::{Duration, Instant};

/// `rate` requests per second on average, up to `burst` at once.
#[derive(Debug)]
pub struct Bucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl Bucket {
    /// A full bucket. `rate` is clamped to at least one request per hour, `burst` to at
    /// least one request.
    pub fn new(rate: f64, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        Bucket {
            rate: rate.max(1.0 / 3600.0),
            burst,
            tokens: burst,
            last: Instant::now(),
        }
    }

    /// Takes a token, or says how long until one is available.
    pub fn take(&mut self) -> Result<(), Duration> {
        self.take_at(Instant::now())
    }

    fn take_at(&mut self, now: Instant) -> Result<(), Duration> {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - self.tokens) / self.rate))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_beyond_the_burst_then_refills() {
        let mut bucket = Bucket::new(2.0, 3);
        let start = bucket.last;
        for _ in 0..3 {
            assert!(bucket.take_at(start).is_ok());
        }
        let wait = bucket.take_at(start).err().unwrap_or_default();
        assert!(
            wait > Duration::ZERO && wait <= Duration::from_millis(500),
            "{wait:?}"
        );
        let later = start + Duration::from_millis(500);
        assert!(bucket.take_at(later).is_ok());
        assert!(bucket.take_at(later).is_err());
    }
}
