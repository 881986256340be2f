//! Which shard a VM belongs to: one of `count` equal ranges of the 64-bit FNV-1a hash of its
//! uid, the hash and ranges the API server's sharded list and watch filter by (KEP-5866), so a
//! replica can ask it for the VMs of its shards alone.
//!
//! # Guarantees
//!
//! - The shard of a VM depends on its uid and `count` only, stable across builds and replicas
//!   (`shard_is_stable`).
//! - The selector of a shard names exactly the hashes [`shard_of`] maps to it
//!   (`ranges_are_exactly_the_shards`), in the form the API server parses
//!   (`the_selector_names_the_ranges_as_the_api_server_reads_them`).

use std::collections::BTreeSet;

/// FNV-1a, 64 bits: stable, unlike `std`'s hasher.
pub(super) fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for byte in *part {
            hash ^= u64::from(*byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    }
    hash
}

/// The shard of the VM with this uid, of `count` (at least 1): which of `count` equal ranges
/// of the 64-bit FNV-1a hash of the uid holds it ([`shard_range`]). The hash and the ranges
/// are those of the API server's sharded list and watch (KEP-5866), so a replica can ask it
/// for the VMs of its shards alone ([`shard_selector`]).
pub fn shard_of(uid: &str, count: u32) -> u32 {
    let n = u128::from(count.max(1));
    u32::try_from((u128::from(fnv1a(&[uid.as_bytes()])) * n) >> 64).unwrap_or(0)
}

/// The hashes of shard `shard` of `count`: `[start, end)`, `end` at most 2^64, exactly the
/// hashes [`shard_of`] maps to `shard` (`ranges_are_exactly_the_shards`).
fn shard_range(shard: u32, count: u32) -> (u128, u128) {
    let n = u128::from(count.max(1));
    // ceil(k * 2^64 / n): the least hash h with floor(h * n / 2^64) = k.
    let bound = |k: u128| (k << 64).div_ceil(n);
    (bound(u128::from(shard)), bound(u128::from(shard) + 1))
}

/// A KEP-5866 shard selector (the `shardSelector` of a list or watch) for the VMs of
/// `shards` of `count`; an empty `shards` selects only the uids hashing to 0 (a selector
/// cannot be empty), which is as good as none.
pub fn shard_selector(shards: &BTreeSet<u32>, count: u32) -> String {
    let range = |(start, end): (u128, u128)| {
        format!("shardRange(object.metadata.uid,'0x{start:016x}','0x{end:016x}')")
    };
    if shards.is_empty() {
        return range((0, 1));
    }
    shards
        .iter()
        .map(|shard| range(shard_range(*shard, count)))
        .collect::<Vec<_>>()
        .join("||")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_is_stable() {
        // Fixed values: a change here means replicas of two builds disagree on VM ownership
        // (changed once, before any release had sharding, from `hash % count` to the ranges
        // the API server filters by).
        assert_eq!(fnv1a(&[b"a"]), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(shard_of("0b4c5e1e-7c1a-4d1e-9f0a-3f1e2d3c4b5a", 1), 0);
        // 0xaf63dc4c8601ec8c * 3 / 2^64 = 2.06…
        assert_eq!(shard_of("a", 3), 2);
        // Kubernetes uids are random (version 4) UUIDs; FNV-1a's high bits, which pick the
        // range, spread those evenly (not strings differing in their last bytes alone).
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let mut random = move || {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let z = (state ^ (state >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            let z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        let uids: Vec<String> = (0..1000)
            .map(|_| {
                let (a, b) = (random(), random());
                format!(
                    "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
                    a >> 32,
                    (a >> 16) & 0xffff,
                    a & 0xfff,
                    0x8000 | (b >> 48 & 0x3fff),
                    b & 0xffff_ffff_ffff
                )
            })
            .collect();
        let mut per_shard = [0u32; 4];
        for uid in &uids {
            if let Some(n) = per_shard.get_mut(shard_of(uid, 4) as usize) {
                *n += 1;
            }
        }
        assert!(
            per_shard.iter().all(|n| (150..350).contains(n)),
            "{per_shard:?}"
        );
    }

    #[test]
    fn ranges_are_exactly_the_shards() {
        for count in [1u32, 2, 3, 5, 7, 16] {
            let mut next = 0u128;
            for shard in 0..count {
                let (start, end) = shard_range(shard, count);
                assert_eq!(
                    start, next,
                    "shard {shard} of {count} starts where the last ended"
                );
                assert!(start < end);
                for h in [start, start + 1, end - 2, end - 1] {
                    let h = u64::try_from(h).unwrap_or(u64::MAX);
                    let n = u128::from(count);
                    let of = u32::try_from((u128::from(h) * n) >> 64).unwrap_or(u32::MAX);
                    assert_eq!(of, shard, "hash {h:#x} of {count}");
                }
                next = end;
            }
            assert_eq!(next, 1u128 << 64, "the ranges of {count} cover every hash");
        }
    }

    #[test]
    fn the_selector_names_the_ranges_as_the_api_server_reads_them() {
        // The forms of KEP-5866's own examples: 16 hex digits, 2^64 as 17.
        let of = |shards: &[u32], count| shard_selector(&shards.iter().copied().collect(), count);
        assert_eq!(
            of(&[0], 2),
            "shardRange(object.metadata.uid,'0x0000000000000000','0x8000000000000000')"
        );
        assert_eq!(
            of(&[1, 3], 4),
            "shardRange(object.metadata.uid,'0x4000000000000000','0x8000000000000000')||\
             shardRange(object.metadata.uid,'0xc000000000000000','0x10000000000000000')"
        );
        assert_eq!(
            of(&[], 3),
            "shardRange(object.metadata.uid,'0x0000000000000000','0x0000000000000001')"
        );
    }
}
