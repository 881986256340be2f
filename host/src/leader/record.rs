//! The Lease record and the decision a candidate takes on it, free of I/O.
//!
//! Expiry is judged like client-go does: not from `renewTime` (another node's clock) but from
//! when *this* process last saw the record change (its `resourceVersion`), plus the record's
//! `leaseDurationSeconds`. Clock skew between nodes therefore cannot shorten a lease.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::ObjectMeta;
use tokio::time::Instant;

/// The last version of the Lease this process saw, and when it first saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Observed {
    resource_version: Option<String>,
    at: Instant,
}

/// What to do with the Lease as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Decision {
    /// There is no Lease: create it, holding it.
    Create,
    /// Nobody holds it, or the holder's lease ran out: take it over.
    Take,
    /// We hold it: renew.
    Renew,
    /// Someone else holds a lease that is still valid.
    Wait { holder: String },
}

/// Decides what `identity` may do with `lease`, updating what it observed. `default_duration`
/// applies when the record names none.
pub(super) fn decide(
    lease: Option<&Lease>,
    identity: &str,
    observed: &mut Option<Observed>,
    now: Instant,
    default_duration: Duration,
) -> Decision {
    let Some(lease) = lease else {
        *observed = None;
        return Decision::Create;
    };
    let resource_version = lease.metadata.resource_version.clone();
    let first_seen = match observed.take() {
        Some(seen) if seen.resource_version == resource_version => seen.at,
        _ => now,
    };
    *observed = Some(Observed {
        resource_version,
        at: first_seen,
    });
    let spec = lease.spec.as_ref();
    let holder = spec
        .and_then(|s| s.holder_identity.as_deref())
        .filter(|h| !h.is_empty());
    match holder {
        None => Decision::Take,
        Some(h) if h == identity => Decision::Renew,
        Some(h) => {
            let duration = spec
                .and_then(|s| s.lease_duration_seconds)
                .and_then(|secs| u64::try_from(secs).ok())
                .filter(|secs| *secs > 0)
                .map_or(default_duration, Duration::from_secs);
            if now >= first_seen + duration {
                Decision::Take
            } else {
                Decision::Wait {
                    holder: h.to_owned(),
                }
            }
        }
    }
}

/// A new Lease held by `identity`.
pub(super) fn created(name: &str, identity: &str, duration: Duration, now: Timestamp) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(identity.to_owned()),
            lease_duration_seconds: Some(whole_seconds(duration)),
            acquire_time: Some(MicroTime(now)),
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(0),
            ..LeaseSpec::default()
        }),
    }
}

/// `lease` (as read, keeping its `resourceVersion` for optimistic concurrency) held by
/// `identity`: renewed if it already held it, taken over otherwise.
pub(super) fn held(mut lease: Lease, identity: &str, duration: Duration, now: Timestamp) -> Lease {
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    let ours = spec.holder_identity.as_deref() == Some(identity);
    if !ours {
        let had_holder = spec
            .holder_identity
            .as_deref()
            .is_some_and(|h| !h.is_empty());
        spec.holder_identity = Some(identity.to_owned());
        spec.acquire_time = Some(MicroTime(now));
        let transitions = spec.lease_transitions.unwrap_or(0);
        spec.lease_transitions = Some(if had_holder {
            transitions.saturating_add(1)
        } else {
            transitions
        });
    }
    spec.renew_time = Some(MicroTime(now));
    spec.lease_duration_seconds = Some(whole_seconds(duration));
    lease
}

/// `lease` given up: no holder, so that a candidate takes it at its next attempt instead of
/// waiting for it to expire. The 1 s duration mirrors client-go, for candidates that only
/// look at the duration.
pub(super) fn released(mut lease: Lease, now: Timestamp) -> Lease {
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    spec.holder_identity = None;
    spec.lease_duration_seconds = Some(1);
    spec.renew_time = Some(MicroTime(now));
    lease
}

/// The holder named in `lease`, if any.
pub(super) fn holder(lease: &Lease) -> Option<&str> {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref())
        .filter(|h| !h.is_empty())
}

/// `leaseDurationSeconds` is whole seconds; round up so a lease never claims less than asked.
fn whole_seconds(duration: Duration) -> i32 {
    let secs = duration.as_secs() + u64::from(duration.subsec_nanos() > 0);
    i32::try_from(secs).unwrap_or(i32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DURATION: Duration = Duration::from_secs(15);

    fn lease(holder: Option<&str>, version: &str, duration_secs: Option<i32>) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some("vmop".into()),
                resource_version: Some(version.into()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: holder.map(Into::into),
                lease_duration_seconds: duration_secs,
                lease_transitions: Some(3),
                ..LeaseSpec::default()
            }),
        }
    }

    #[test]
    fn a_missing_lease_is_created_and_a_free_one_taken() {
        let now = Instant::now();
        let mut seen = None;
        assert_eq!(
            decide(None, "a", &mut seen, now, DURATION),
            Decision::Create
        );
        let free = lease(None, "1", Some(15));
        assert_eq!(
            decide(Some(&free), "a", &mut seen, now, DURATION),
            Decision::Take
        );
        let empty = lease(Some(""), "2", Some(15));
        assert_eq!(
            decide(Some(&empty), "a", &mut seen, now, DURATION),
            Decision::Take
        );
    }

    #[test]
    fn our_own_lease_is_renewed() {
        let mut seen = None;
        let ours = lease(Some("a"), "1", Some(15));
        let decision = decide(Some(&ours), "a", &mut seen, Instant::now(), DURATION);
        assert_eq!(decision, Decision::Renew);
    }

    #[test]
    fn another_holder_expires_a_lease_duration_after_its_record_last_changed() {
        let start = Instant::now();
        let mut seen = None;
        let theirs = lease(Some("b"), "1", Some(10));
        let wait = Decision::Wait { holder: "b".into() };
        assert_eq!(decide(Some(&theirs), "a", &mut seen, start, DURATION), wait);
        let later = start + Duration::from_secs(9);
        assert_eq!(decide(Some(&theirs), "a", &mut seen, later, DURATION), wait);
        // A renewal (new resourceVersion) restarts the clock.
        let renewed = lease(Some("b"), "2", Some(10));
        assert_eq!(
            decide(Some(&renewed), "a", &mut seen, later, DURATION),
            wait
        );
        let expired_for_old_record = start + Duration::from_secs(10);
        assert_eq!(
            decide(
                Some(&renewed),
                "a",
                &mut seen,
                expired_for_old_record,
                DURATION
            ),
            wait
        );
        let expired = later + Duration::from_secs(10);
        assert_eq!(
            decide(Some(&renewed), "a", &mut seen, expired, DURATION),
            Decision::Take
        );
    }

    #[test]
    fn a_record_without_a_duration_uses_ours() {
        let start = Instant::now();
        let mut seen = None;
        let theirs = lease(Some("b"), "1", None);
        decide(Some(&theirs), "a", &mut seen, start, DURATION);
        let before = start + DURATION - Duration::from_millis(1);
        assert!(matches!(
            decide(Some(&theirs), "a", &mut seen, before, DURATION),
            Decision::Wait { .. }
        ));
        assert_eq!(
            decide(Some(&theirs), "a", &mut seen, start + DURATION, DURATION),
            Decision::Take
        );
    }

    #[test]
    fn taking_over_counts_a_transition_and_renewing_does_not() {
        let now = Timestamp::now();
        let taken = held(lease(Some("b"), "7", Some(10)), "a", DURATION, now);
        assert_eq!(taken.metadata.resource_version.as_deref(), Some("7"));
        let spec = taken.spec.clone().unwrap_or_default();
        assert_eq!(spec.holder_identity.as_deref(), Some("a"));
        assert_eq!(spec.lease_transitions, Some(4));
        assert_eq!(spec.lease_duration_seconds, Some(15));
        assert_eq!(spec.acquire_time, Some(MicroTime(now)));

        let later = Timestamp::now();
        let renewed = held(taken, "a", DURATION, later);
        let spec = renewed.spec.unwrap_or_default();
        assert_eq!(spec.lease_transitions, Some(4));
        assert_eq!(spec.acquire_time, Some(MicroTime(now)));
        assert_eq!(spec.renew_time, Some(MicroTime(later)));
    }

    #[test]
    fn a_released_lease_has_no_holder() {
        let released = released(lease(Some("a"), "3", Some(15)), Timestamp::now());
        assert_eq!(holder(&released), None);
        assert_eq!(released.metadata.resource_version.as_deref(), Some("3"));
        let mut seen = None;
        assert_eq!(
            decide(Some(&released), "b", &mut seen, Instant::now(), DURATION),
            Decision::Take
        );
    }

    #[test]
    fn durations_round_up_to_whole_seconds() {
        assert_eq!(whole_seconds(Duration::from_millis(1500)), 2);
        assert_eq!(whole_seconds(Duration::from_secs(2)), 2);
    }
}
