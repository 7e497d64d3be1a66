//! Key groups: how keyed state is partitioned, as Flink partitions it.
//!
//! Every key belongs to one of a fixed number of key groups (`pipeline.max-parallelism`, Flink's
//! option and default rule) and every key group to one worker, a contiguous range of key groups
//! per worker. The key group comes from the key hash Tally computes once per row
//! ([`tally_kernels::hash::hash_columns`]): `key_group = partition_of(hash, key_groups)`; its
//! worker is Flink's `keyGroup * parallelism / maxParallelism`
//! (`KeyGroupRangeAssignment.computeOperatorIndexForKeyGroup`). Because the key group of a key
//! never depends on the parallelism, state moves between parallelisms as whole key groups: the
//! contract with a host that distributes key groups (Flink itself) and with checkpoints
//! restored at another parallelism.

use std::ops::Range;

use tally_kernels::hash::partition_of;

use crate::error::{Error, Result};

/// The most key groups (Flink's `UPPER_BOUND_MAX_PARALLELISM`, 2^15).
pub const MAX_KEY_GROUPS: usize = 1 << 15;

/// Flink's default number of key groups for a parallelism: `1.5 x parallelism` rounded up to a
/// power of two, at least 128 and at most [`MAX_KEY_GROUPS`]
/// (`KeyGroupRangeAssignment.computeDefaultMaxParallelism`).
pub fn default_key_groups(parallelism: usize) -> usize {
    (parallelism + parallelism / 2)
        .next_power_of_two()
        .clamp(128, MAX_KEY_GROUPS)
}

/// The key groups of an operator and the worker that owns each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyGroups {
    count: usize,
    workers: usize,
    /// The owner of each key group.
    owner: Vec<u32>,
}

impl KeyGroups {
    /// `count` key groups over `workers` workers; `count` of 0 takes Flink's default for the
    /// parallelism ([`default_key_groups`]).
    ///
    /// # Errors
    /// Fewer key groups than workers, more than [`MAX_KEY_GROUPS`], or no worker.
    pub fn new(count: usize, workers: usize) -> Result<Self> {
        let count = if count == 0 {
            default_key_groups(workers)
        } else {
            count
        };
        if workers == 0 || workers > count || count > MAX_KEY_GROUPS {
            return Err(Error::config(
                crate::config::MAX_PARALLELISM,
                format!(
                    "{count} key groups cannot be spread over {workers} workers: it must be at least the parallelism and at most {MAX_KEY_GROUPS}"
                ),
            ));
        }
        let owner = (0..count).map(|g| (g * workers / count) as u32).collect();
        Ok(Self {
            count,
            workers,
            owner,
        })
    }

    /// The number of key groups.
    pub fn count(&self) -> usize {
        self.count
    }

    /// The number of workers.
    pub fn workers(&self) -> usize {
        self.workers
    }

    /// The key group of a key hash.
    #[inline(always)]
    pub fn of_hash(&self, hash: u64) -> usize {
        partition_of(hash, self.count)
    }

    /// The worker that owns a key hash's key group.
    #[inline(always)]
    pub fn worker_of_hash(&self, hash: u64) -> usize {
        self.owner[self.of_hash(hash)] as usize
    }

    /// The key groups worker `w` owns (Flink's `computeKeyGroupRangeForOperatorIndex`).
    pub fn range(&self, w: usize) -> Range<usize> {
        let start = (w * self.count).div_ceil(self.workers);
        let end = ((w + 1) * self.count).div_ceil(self.workers);
        start..end
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_flinks_and_match_the_owners() {
        assert_eq!(default_key_groups(1), 128);
        assert_eq!(default_key_groups(100), 256);
        assert_eq!(default_key_groups(1 << 16), MAX_KEY_GROUPS);
        for (count, workers) in [(128, 1), (128, 3), (128, 128), (300, 7), (1 << 15, 5)] {
            let kg = KeyGroups::new(count, workers).unwrap();
            let mut next = 0;
            for w in 0..workers {
                let r = kg.range(w);
                assert_eq!(r.start, next, "{count}/{workers}: contiguous");
                assert!(
                    !r.is_empty(),
                    "{count}/{workers}: every worker owns a key group"
                );
                for g in r.clone() {
                    assert_eq!(kg.owner[g] as usize, w);
                }
                next = r.end;
            }
            assert_eq!(next, count);
        }
        // Flink's ranges for 128 key groups over 3 operators: 0-42, 43-85, 86-127.
        let kg = KeyGroups::new(128, 3).unwrap();
        assert_eq!(
            (kg.range(0), kg.range(1), kg.range(2)),
            (0..43, 43..86, 86..128)
        );
        assert!(KeyGroups::new(4, 8).is_err());
        assert!(KeyGroups::new(MAX_KEY_GROUPS + 1, 1).is_err());
    }

    #[test]
    fn a_key_keeps_its_key_group_at_every_parallelism() {
        for h in [0u64, 1, 0xdead_beef, u64::MAX, 0x9e37_79b9_7f4a_7c15] {
            let groups: Vec<usize> = [1, 2, 5, 16]
                .iter()
                .map(|&p| KeyGroups::new(128, p).unwrap().of_hash(h))
                .collect();
            assert!(groups.windows(2).all(|w| w[0] == w[1]), "{h}: {groups:?}");
        }
        // The worker a key is routed to owns the key's key group, at every parallelism, and
        // every key group receives keys.
        for p in [1usize, 3, 7, 16] {
            let kg = KeyGroups::new(0, p).unwrap();
            let mut hit = vec![false; kg.count()];
            let mut h = 0x2545_f491_4f6c_dd1du64;
            for _ in 0..20_000 {
                h = h
                    .wrapping_mul(0x5851_f42d_4c95_7f2d)
                    .wrapping_add(0x1405_7b7e_f767_814f);
                let g = kg.of_hash(h);
                assert!(kg.range(kg.worker_of_hash(h)).contains(&g), "{p}: {h}");
                hit[g] = true;
            }
            assert!(hit.iter().all(|&x| x), "{p}: a key group no key reaches");
        }
    }
}
