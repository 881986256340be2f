//! Token buckets for the testcloud's optional throttling: a request beyond them is answered 429
//! with `Retry-After`, as a real cloud's API throttling would. One [`Bucket`] for the plain
//! request rate ([`super::Config::rate_limit`]); [`Ec2Buckets`] for the EC2-like mode
//! ([`super::Config::ec2`]).

use std::time::{Duration, Instant};

use super::{Ec2Limits, RateLimit};

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
        Bucket::full_at(rate, burst, Instant::now())
    }

    fn full_at(rate: f64, burst: u32, now: Instant) -> Self {
        let burst = f64::from(burst.max(1));
        Bucket {
            rate: rate.max(1.0 / 3600.0),
            burst,
            tokens: burst,
            last: now,
        }
    }

    fn of(limit: RateLimit, now: Instant) -> Self {
        Bucket::full_at(limit.per_second, limit.burst, now)
    }

    /// Takes a token, or says how long until one is available.
    pub fn take(&mut self) -> Result<(), Duration> {
        self.take_at(Instant::now())
    }

    /// Fills the bucket to its burst.
    pub fn refill(&mut self) {
        self.tokens = self.burst;
        self.last = Instant::now();
    }

    fn take_at(&mut self, now: Instant) -> Result<(), Duration> {
        self.wait_at(now)?;
        self.tokens -= 1.0;
        Ok(())
    }

    /// Adds what refilled since the last look; `Err`: how long until a whole token is there.
    fn wait_at(&mut self, now: Instant) -> Result<(), Duration> {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = self.last.max(now);
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        if self.tokens >= 1.0 {
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - self.tokens) / self.rate))
        }
    }
}

/// What a request is, for the EC2-like buckets and the per-class counts of [`super::Stats`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// `GET` of the cloud's API: EC2's non-mutating (`Describe*`) actions.
    Read,
    /// Any other method of the cloud's API: EC2's mutating actions.
    Mutate,
    /// The harness's own routes (`/v1/stats`, `/v1/limits`, `/v1/limits/refill`): neither
    /// throttled by the EC2-like buckets nor counted as reads or mutations.
    Harness,
}

/// The resource bucket a mutating request also takes a token from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resource {
    /// `POST /v1/machines`: EC2's `RunInstances` (one instance per request).
    Run,
    /// `DELETE /v1/machines/{id}`: EC2's `TerminateInstances` (one instance per request).
    Terminate,
}

/// Why a request was refused, and when to come back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refused {
    pub wait: Duration,
    /// The request bucket had a token: the resource bucket refused.
    pub by_resource: bool,
}

/// EC2's request throttling as the testcloud models it: one request bucket per [`Class`]
/// (read, mutate) and a resource bucket per [`Resource`]. A request takes a token from its
/// class's bucket and, for a create or a delete, one from the resource bucket, both or
/// neither: a refused request costs no token.
#[derive(Debug)]
pub struct Ec2Buckets {
    read: Bucket,
    mutate: Bucket,
    run: Bucket,
    terminate: Bucket,
}

impl Ec2Buckets {
    /// Full buckets.
    pub fn new(limits: &Ec2Limits) -> Self {
        Ec2Buckets::full_at(limits, Instant::now())
    }

    fn full_at(limits: &Ec2Limits, now: Instant) -> Self {
        Ec2Buckets {
            read: Bucket::of(limits.read, now),
            mutate: Bucket::of(limits.mutate, now),
            run: Bucket::of(limits.run, now),
            terminate: Bucket::of(limits.terminate, now),
        }
    }

    /// Fills every bucket to its burst.
    pub fn refill(&mut self) {
        for bucket in [
            &mut self.read,
            &mut self.mutate,
            &mut self.run,
            &mut self.terminate,
        ] {
            bucket.refill();
        }
    }

    /// Takes the tokens a request of `class` (and `resource`) needs, or says how long until
    /// all of them are there. [`Class::Harness`] needs none.
    pub fn take(&mut self, class: Class, resource: Option<Resource>) -> Result<(), Refused> {
        self.take_at(class, resource, Instant::now())
    }

    fn take_at(
        &mut self,
        class: Class,
        resource: Option<Resource>,
        now: Instant,
    ) -> Result<(), Refused> {
        let request = match class {
            Class::Read => &mut self.read,
            Class::Mutate => &mut self.mutate,
            Class::Harness => return Ok(()),
        };
        let request_wait = request.wait_at(now).err();
        let mut resource = match resource {
            Some(Resource::Run) => Some(&mut self.run),
            Some(Resource::Terminate) => Some(&mut self.terminate),
            None => None,
        };
        let resource_wait = match &mut resource {
            Some(bucket) => bucket.wait_at(now).err(),
            None => None,
        };
        if request_wait.is_none() && resource_wait.is_none() {
            request.tokens -= 1.0;
            if let Some(bucket) = resource {
                bucket.tokens -= 1.0;
            }
            return Ok(());
        }
        Err(Refused {
            wait: request_wait.max(resource_wait).unwrap_or_default(),
            by_resource: request_wait.is_none(),
        })
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
        bucket.refill();
        let now = bucket.last;
        for _ in 0..3 {
            assert!(bucket.take_at(now).is_ok());
        }
    }

    fn limits() -> Ec2Limits {
        let limit = |burst, per_second| RateLimit { per_second, burst };
        Ec2Limits {
            read: limit(3, 1.0),
            mutate: limit(4, 2.0),
            run: limit(2, 1.0),
            terminate: limit(5, 5.0),
        }
    }

    #[test]
    fn each_class_has_its_own_bucket() {
        let start = Instant::now();
        let mut buckets = Ec2Buckets::full_at(&limits(), start);
        for _ in 0..3 {
            assert_eq!(buckets.take_at(Class::Read, None, start), Ok(()));
        }
        let refused = buckets.take_at(Class::Read, None, start);
        assert_eq!(
            refused,
            Err(Refused {
                wait: Duration::from_secs(1),
                by_resource: false
            })
        );
        // Reads are out; mutations and the harness are not.
        for _ in 0..4 {
            assert_eq!(buckets.take_at(Class::Mutate, None, start), Ok(()));
        }
        assert!(buckets.take_at(Class::Mutate, None, start).is_err());
        for _ in 0..100 {
            assert_eq!(buckets.take_at(Class::Harness, None, start), Ok(()));
        }
        let later = start + Duration::from_secs(1);
        assert_eq!(buckets.take_at(Class::Read, None, later), Ok(()));
        assert!(buckets.take_at(Class::Read, None, later).is_err());
    }

    #[test]
    fn a_create_needs_a_request_and_a_resource_token_or_takes_neither() {
        let start = Instant::now();
        let mut buckets = Ec2Buckets::full_at(&limits(), start);
        let run = Some(Resource::Run);
        assert_eq!(buckets.take_at(Class::Mutate, run, start), Ok(()));
        assert_eq!(buckets.take_at(Class::Mutate, run, start), Ok(()));
        // The run bucket (2) is empty, the mutate bucket (4) is not: refused by the resource,
        // and the mutate token is kept.
        let refused = buckets.take_at(Class::Mutate, run, start);
        assert_eq!(
            refused,
            Err(Refused {
                wait: Duration::from_secs(1),
                by_resource: true
            })
        );
        assert_eq!(buckets.take_at(Class::Mutate, None, start), Ok(()));
        assert_eq!(buckets.take_at(Class::Mutate, None, start), Ok(()));
        // Now the mutate bucket is empty too: the wait is the longer of the two.
        let terminate = Some(Resource::Terminate);
        let refused = buckets.take_at(Class::Mutate, terminate, start);
        assert_eq!(
            refused,
            Err(Refused {
                wait: Duration::from_millis(500),
                by_resource: false
            })
        );
        // The terminate bucket lost nothing to the refusal.
        let later = start + Duration::from_secs(3);
        for _ in 0..4 {
            assert_eq!(buckets.take_at(Class::Mutate, terminate, later), Ok(()));
        }
        buckets.refill();
        let now = buckets.read.last;
        assert_eq!(buckets.take_at(Class::Mutate, run, now), Ok(()));
    }
}
