//! Which replica campaigns for which shard: every replica computes the same assignment from
//! the same live members, so membership needs no coordination beyond the member Leases.
//! Safety never rests on it (see `shards.rs`): a wrong view costs balance, not correctness.

use std::collections::BTreeMap;
#[cfg(test)]
use std::collections::BTreeSet;
use std::time::Duration;

use super::partition::fnv1a;

/// The members in the order they rank `shard` (rendezvous hashing); ties by name.
fn ranking<'a>(shard: u32, members: impl Iterator<Item = &'a String>) -> Vec<&'a str> {
    let key = shard.to_be_bytes();
    let mut ranked: Vec<&str> = members.map(String::as_str).collect();
    ranked.sort_by_key(|m| (std::cmp::Reverse(fnv1a(&[&key, m.as_bytes()])), *m));
    ranked
}

/// The primary of every shard: each shard goes to the member ranking it highest that holds
/// fewer than its fair share (`count / members`, plus one for the first `count % members` to
/// reach it), so loads differ by at most one.
/// Every replica computes the same from the same members.
pub(super) fn assign<'a>(members: &[&'a String], count: u32) -> Vec<&'a str> {
    let n = u32::try_from(members.len()).unwrap_or(u32::MAX).max(1);
    let (low, extra) = (count / n, count % n);
    let mut load: BTreeMap<&str, u32> = BTreeMap::new();
    let mut above_low = 0;
    (0..count)
        .filter_map(|shard| {
            let chosen = ranking(shard, members.iter().copied())
                .into_iter()
                .find(|m| {
                    let l = load.get(m).copied().unwrap_or(0);
                    l < low || (l == low && above_low < extra)
                })?;
            let l = load.entry(chosen).or_default();
            if *l == low {
                above_low += 1;
            }
            *l += 1;
            Some(chosen)
        })
        .collect()
}

/// The shards `me` should hold, given the live members (which include `me`).
#[cfg(test)]
fn preferred(me: &str, members: &BTreeSet<String>, count: u32) -> BTreeSet<u32> {
    let all: Vec<&String> = members.iter().collect();
    let assigned = assign(&all, count);
    (0..count)
        .filter(|s| assigned.get(*s as usize) == Some(&me))
        .collect()
}

/// What this replica does about one shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Role {
    /// Ranked first: campaign and hold.
    Primary,
    /// Ranked second: watch the Lease, and take it over only if the primary looks gone.
    Standby { primary_alive: bool },
    /// Neither.
    None,
}

impl Role {
    /// Whether this replica may take (or keep) the shard's Lease.
    pub(super) fn may_take(self) -> bool {
        matches!(
            self,
            Role::Primary
                | Role::Standby {
                    primary_alive: false
                }
        )
    }
}

/// This replica's role for each of `count` shards: primary where [`assign`] gives it the
/// shard, standby where the assignment without that primary would.
pub(super) fn roles(
    me: &str,
    count: u32,
    members: &BTreeMap<String, Duration>,
    alive: Duration,
) -> Vec<Role> {
    let all: Vec<&String> = members.keys().collect();
    let primaries = assign(&all, count);
    let mut without: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    primaries
        .iter()
        .enumerate()
        .map(|(shard, primary)| {
            if *primary == me {
                return Role::Primary;
            }
            let standbys = without.entry(primary).or_insert_with(|| {
                let rest: Vec<&String> = all.iter().copied().filter(|m| m != primary).collect();
                assign(&rest, count)
            });
            if standbys.get(shard).copied() == Some(me) {
                Role::Standby {
                    primary_alive: members.get(*primary).is_some_and(|age| *age < alive),
                }
            } else {
                Role::None
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_standby_takes_over_only_from_a_silent_primary() {
        let alive = Duration::from_secs(6);
        let members = |a: u64, b: u64| -> BTreeMap<String, Duration> {
            [
                ("a".to_owned(), Duration::from_secs(a)),
                ("b".to_owned(), Duration::from_secs(b)),
            ]
            .into()
        };
        let count = 8;
        let fresh = members(0, 0);
        let of_a = roles("a", count, &fresh, alive);
        let of_b = roles("b", count, &fresh, alive);
        for (shard, pair) in of_a.iter().zip(&of_b).enumerate() {
            let primary = match pair {
                (
                    Role::Primary,
                    Role::Standby {
                        primary_alive: true,
                    },
                ) => "a",
                (
                    Role::Standby {
                        primary_alive: true,
                    },
                    Role::Primary,
                ) => "b",
                other => panic!("shard {shard}: {other:?}"),
            };
            let (standby, silent) = if primary == "a" {
                ("b", members(10, 0))
            } else {
                ("a", members(0, 10))
            };
            assert_eq!(
                roles(standby, count, &silent, alive).get(shard),
                Some(&Role::Standby {
                    primary_alive: false
                })
            );
        }
    }

    #[test]
    fn every_shard_has_exactly_one_primary_and_loads_differ_by_at_most_one() {
        for n in 1..=5usize {
            let members: BTreeSet<String> = (0..n).map(|i| format!("replica-{i}")).collect();
            for count in [1u32, 6, 12, 64] {
                let mut seen = BTreeSet::new();
                let mut loads = Vec::new();
                for m in &members {
                    let mine = preferred(m, &members, count);
                    loads.push(mine.len());
                    for s in mine {
                        assert!(seen.insert(s), "shard {s} preferred twice");
                    }
                }
                assert_eq!(seen.len(), count as usize, "{n} members, {count} shards");
                let (min, max) = (loads.iter().min(), loads.iter().max());
                if let (Some(min), Some(max)) = (min, max) {
                    assert!(
                        max - min <= 1,
                        "{n} members, {count} shards: loads {loads:?}"
                    );
                }
            }
        }
    }
}
