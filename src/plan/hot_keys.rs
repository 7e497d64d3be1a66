//! A split-distinct PARTIAL's hot keys: the query keys whose DISTINCT values are spread over
//! the workers by bucket; every other key stays with its own worker, as without split.
//!
//! Split-distinct spreads a key's DISTINCT work over the workers by its values' buckets, and
//! pays for it with a PARTIAL group per (key, worker) and their rows through the FINAL. For a
//! key that holds a small share of the input that is all cost: its worker was not overloaded.
//! Flink splits every key. Tally spreads only the keys named here, found hot in a sample of
//! the source (the SQL planner's); a cold key's entries and rows all go to the worker of the
//! key alone, and its PARTIAL state is one group (its bucket columns NULL). Where a local phase
//! routes each DISTINCT entry by its value's bucket when it flushes (`EntryRoutes`, with
//! [`super::BucketFill`] for the rows that go around it), the flush routes a cold key's
//! entries with the key alone. Wherever else the plan's rows are evaluated (a local phase
//! routing rows by their buckets, workers keeping every bucket's group apart because the run
//! takes checkpoints, the ordered runtime), a cold key's bucket columns are set back to NULL
//! as its rows are evaluated ([`AggregatePlan::evaluate`], `HotKeys::leave_cold`). The choice
//! is made once, before the run, and every row and entry of a key follows it, so each (key,
//! value) pair has one group and one worker and the FINAL's sums of the PARTIAL's counts are
//! exact whichever keys are hot; a snapshot records the choice ([`HOT_KEYS_METADATA`]) and a
//! restore takes it. A key that grows hot after the sample is not spread: its DISTINCT work
//! stays on one worker, as without split.

use std::sync::Arc;

use arrow::array::{Array, BooleanArray};
use arrow::buffer::BooleanBuffer;
use arrow::compute::nullif;
use tally_kernels::hash::{hash_columns, hash_columns_after};

use super::{AggregatePlan, BucketKeys, CalcBatch};
use crate::changelog::ChangeBatch;
use crate::error::{Error, Result};

/// The hot keys of a split PARTIAL, by the hash of their query keys (`hash_columns` over the
/// query's key columns, as a local phase's key table hashes them). A cold key whose hash equals
/// a hot key's is taken as hot: a key's choice only has to be the same everywhere, which a
/// function of its hash is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HotKeys {
    /// The hashes other than 0 in an open-addressed table of a power of two slots, at most a
    /// quarter full (0: an empty slot), where a lookup takes a load or two: where the sources
    /// leave cold keys' buckets NULL, every row's key is looked up.
    slots: Vec<u64>,
    /// Whether the hash 0 (which `slots` cannot hold) is hot.
    zero: bool,
}

impl HotKeys {
    /// The keys whose query keys hash to `hashes`.
    pub fn from_hashes(hashes: impl IntoIterator<Item = u64>) -> Self {
        let mut hashes: Vec<u64> = hashes.into_iter().collect();
        hashes.sort_unstable();
        hashes.dedup();
        let mut slots = vec![0u64; (hashes.len() * 4).next_power_of_two().max(16)];
        let mask = slots.len() - 1;
        for &h in hashes.iter().filter(|&&h| h != 0) {
            let mut i = slot_of(h, slots.len());
            while slots[i] != 0 {
                i = (i + 1) & mask;
            }
            slots[i] = h;
        }
        let zero = hashes.first() == Some(&0);
        Self { slots, zero }
    }

    /// How many keys are hot.
    pub fn len(&self) -> usize {
        self.slots.iter().filter(|&&h| h != 0).count() + usize::from(self.zero)
    }

    /// Whether no key is hot (every key stays with its worker).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the key whose query keys hash to `prefix` is hot; without key columns (`None`)
    /// the one key is (splitting it is the point).
    #[inline]
    pub fn is_hot(&self, prefix: Option<u64>) -> bool {
        let Some(h) = prefix else {
            return true;
        };
        if h == 0 {
            return self.zero;
        }
        let mask = self.slots.len() - 1;
        let mut i = slot_of(h, self.slots.len());
        loop {
            match self.slots[i] {
                s if s == h => return true,
                0 => return false,
                _ => i = (i + 1) & mask,
            }
        }
    }

    /// The hot hashes, ascending.
    pub fn hashes(&self) -> Vec<u64> {
        let mut out: Vec<u64> = self.slots.iter().copied().filter(|&h| h != 0).collect();
        if self.zero {
            out.push(0);
        }
        out.sort_unstable();
        out
    }

    /// The hot keys as a snapshot records them ([`HOT_KEYS_METADATA`]): `none` where every key
    /// is spread (no hot keys named), else the hot hashes in hexadecimal, comma-separated
    /// (empty where no key is hot).
    pub fn describe(hot: Option<&HotKeys>) -> String {
        match hot {
            None => "none".into(),
            Some(h) => h
                .hashes()
                .iter()
                .map(|h| format!("{h:x}"))
                .collect::<Vec<_>>()
                .join(","),
        }
    }

    /// Reads what [`HotKeys::describe`] wrote: None for `none` (every key spread).
    ///
    /// # Errors
    /// Text that is not a list of hexadecimal hashes (a corrupt snapshot).
    pub fn parse(text: &str) -> Result<Option<HotKeys>> {
        if text == "none" {
            return Ok(None);
        }
        let hashes = text
            .split(',')
            .filter(|h| !h.is_empty())
            .map(|h| u64::from_str_radix(h, 16))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|_| {
                Error::invalid_input(format!(
                    "snapshot: bad hot keys '{HOT_KEYS_METADATA}': '{}'",
                    text.chars().take(40).collect::<String>()
                ))
            })?;
        Ok(Some(HotKeys::from_hashes(hashes)))
    }

    /// Sets the bucket columns (the keys after the first `query_keys`) of the rows of `cb`
    /// whose key is cold back to NULL, so that they go with the key alone. Returns the hashes
    /// of the query keys where it computed them (rows with some bucket), for the rows' routes
    /// to go on from ([`tally_kernels::hash::hash_columns_after`]) rather than hash the keys
    /// again.
    ///
    /// # Errors
    /// Key columns that cannot be hashed (a bug: the plan checked them).
    pub(crate) fn leave_cold(
        &self,
        query_keys: usize,
        cb: &mut CalcBatch,
    ) -> Result<Option<Vec<u64>>> {
        let bucketed = &cb.keys[query_keys..];
        if query_keys == 0 || bucketed.iter().all(|c| c.null_count() == c.len()) {
            return Ok(None);
        }
        let mut hashes = vec![];
        hash_columns(&cb.keys[..query_keys], &mut hashes)
            .map_err(|e| Error::internal(format!("key hashes: {e}")))?;
        let cold = BooleanBuffer::collect_bool(hashes.len(), |r| !self.is_hot(Some(hashes[r])));
        if cold.count_set_bits() == 0 {
            return Ok(Some(hashes));
        }
        let cold = BooleanArray::new(cold, None);
        for column in &mut cb.keys[query_keys..] {
            if column.null_count() < column.len() {
                *column = nullif(column, &cold)
                    .map_err(|e| Error::internal(format!("bucket column: {e}")))?;
            }
        }
        Ok(Some(hashes))
    }
}

/// The schema metadata key under which a split PARTIAL's snapshot records its hot keys
/// ([`HotKeys::describe`]): its state holds a cold key under NULL buckets, so a run restoring
/// it must route that key's rows the same way ([`crate::plan::AggregatePlan::with_hot_keys`]).
/// A split PARTIAL's snapshot without it (of an earlier Tally) spread every key.
pub const HOT_KEYS_METADATA: &str = "tally.split.hot_keys";

impl AggregatePlan {
    /// [`Calc::evaluate`](super::Calc::evaluate) of `changes`, with a split PARTIAL's cold
    /// keys' bucket columns set back to NULL where the plan names hot keys
    /// (`HotKeys::leave_cold`): how every runtime evaluates the rows of an aggregate.
    ///
    /// # Errors
    /// As [`Calc::evaluate`](super::Calc::evaluate).
    pub fn evaluate(&self, changes: &ChangeBatch) -> Result<CalcBatch> {
        let mut cb = self.calc.evaluate(changes)?;
        self.leave_cold(&mut cb)?;
        Ok(cb)
    }

    /// The hot keys of a split PARTIAL ([`BucketKeys::hot`]), if it names them.
    pub fn hot_keys(&self) -> Option<&Arc<HotKeys>> {
        self.bucket_keys.as_ref().and_then(|b| b.hot.as_ref())
    }

    /// Where the plan names hot keys, sets the bucket columns of the rows of `cb` whose key is
    /// cold back to NULL ([`HotKeys::leave_cold`]), in every runtime and whatever the
    /// workers' state keys by, so that each (key, value) pair has one group and one worker.
    /// Returns the query keys' hashes where it computed them.
    ///
    /// # Errors
    /// As [`HotKeys::leave_cold`].
    pub(crate) fn leave_cold(&self, cb: &mut CalcBatch) -> Result<Option<Vec<u64>>> {
        match &self.bucket_keys {
            Some(BucketKeys {
                hot: Some(hot),
                columns,
                ..
            }) => hot.leave_cold(self.key_types.len().saturating_sub(*columns), cb),
            _ => Ok(None),
        }
    }

    /// Each row's hash over every key of `cb` ([`tally_kernels::hash::hash_columns`]'s), going
    /// on from `prefix`, the query keys' hashes that [`AggregatePlan::leave_cold`] returned,
    /// over the bucket columns after them: the query keys are not hashed twice.
    ///
    /// # Errors
    /// Key columns that cannot be hashed (a bug: the plan checked them).
    pub(crate) fn hash_after_query_keys(
        &self,
        prefix: &[u64],
        cb: &CalcBatch,
        out: &mut Vec<u64>,
    ) -> Result<()> {
        let buckets = self.bucket_keys.as_ref().map_or(0, |b| b.columns);
        let query_keys = cb.keys.len().saturating_sub(buckets);
        hash_columns_after(prefix, &cb.keys[query_keys..], out)
            .map_err(|e| Error::internal(format!("key hashes: {e}")))
    }

    /// The rows' hashes over the first `keys` keys of `cb`, from `prefix`, the query keys'
    /// hashes [`AggregatePlan::leave_cold`] returned: those themselves where `keys` are the
    /// query keys (state that merges a split PARTIAL's buckets), continued over the bucket
    /// columns where they are every key ([`AggregatePlan::hash_after_query_keys`]).
    ///
    /// # Errors
    /// As [`AggregatePlan::hash_after_query_keys`].
    pub(crate) fn hash_from_lookup(
        &self,
        prefix: Vec<u64>,
        cb: &CalcBatch,
        keys: usize,
        out: &mut Vec<u64>,
    ) -> Result<()> {
        if keys < cb.keys.len() {
            *out = prefix;
            Ok(())
        } else {
            self.hash_after_query_keys(&prefix, cb, out)
        }
    }

    /// This plan with other hot keys (None: every key spread): for an aggregate restoring a
    /// snapshot whose state was keyed under them ([`HOT_KEYS_METADATA`]).
    pub fn with_hot_keys(&self, hot: Option<HotKeys>) -> AggregatePlan {
        let mut plan = self.clone();
        if let Some(b) = &mut plan.bucket_keys {
            b.hot = hot.map(Arc::new);
        }
        plan
    }
}

/// The first slot of hash `h` in a table of `len` slots (a power of two): its top bits after
/// a multiplication, so that hashes alike in some bits still spread.
#[inline]
fn slot_of(h: u64, len: usize) -> usize {
    (h.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - len.trailing_zeros())) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A key is hot where its hash was named, repeats and order aside; the key of an aggregate
    /// without key columns always is.
    #[test]
    fn a_key_is_hot_where_its_hash_was_named() {
        let hot = HotKeys::from_hashes([42, 7, 42, u64::MAX]);
        assert_eq!(hot.len(), 3);
        assert!(hot.is_hot(Some(7)) && hot.is_hot(Some(42)) && hot.is_hot(Some(u64::MAX)));
        assert!(!hot.is_hot(Some(8)) && !hot.is_hot(Some(0)));
        assert!(hot.is_hot(None));
        let none = HotKeys::from_hashes([]);
        assert!(none.is_empty() && !none.is_hot(Some(7)) && none.is_hot(None));
    }

    /// What a snapshot records reads back as the same hot keys: none named (every key
    /// spread), none hot, and hashes with 0 and the largest among them; other text is an error
    /// on one line.
    #[test]
    fn hot_keys_read_back_as_a_snapshot_records_them() {
        assert_eq!(HotKeys::describe(None), "none");
        assert_eq!(HotKeys::parse("none").unwrap(), None);
        for hashes in [vec![], vec![0, 1, u64::MAX], vec![0x9e37_79b9, 42, 7]] {
            let hot = HotKeys::from_hashes(hashes.iter().copied());
            let text = HotKeys::describe(Some(&hot));
            assert_eq!(HotKeys::parse(&text).unwrap(), Some(hot.clone()), "{text}");
            let mut sorted = hashes.clone();
            sorted.sort_unstable();
            assert_eq!(hot.hashes(), sorted);
        }
        assert_eq!(
            HotKeys::describe(Some(&HotKeys::from_hashes([255, 16]))),
            "10,ff"
        );
        for bad in ["zz", "1,,x", "10000000000000000", "-1"] {
            let e = HotKeys::parse(bad).unwrap_err().to_string();
            assert!(
                e.contains(HOT_KEYS_METADATA) && !e.contains('\n'),
                "{bad}: {e}"
            );
        }
    }

    /// Through its table, a hash is hot exactly where it was named: for hashes next to hot
    /// ones, for random ones, for 0, and for many that start at nearby slots.
    #[test]
    fn a_hash_is_hot_exactly_where_it_was_named() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(17);
        let named: Vec<u64> = (0..40).map(|_| rng.random()).collect();
        let hot = HotKeys::from_hashes(named.iter().copied());
        for &h in &named {
            assert!(hot.is_hot(Some(h)));
            for other in [h ^ 1, h ^ (1 << 63), h.wrapping_add(1)] {
                assert_eq!(hot.is_hot(Some(other)), named.contains(&other));
            }
        }
        for _ in 0..10_000 {
            let h: u64 = rng.random();
            assert_eq!(hot.is_hot(Some(h)), named.contains(&h), "{h:#x}");
        }
        assert!(!hot.is_hot(Some(0)));
        let with_zero = HotKeys::from_hashes([0, 5]);
        assert!(with_zero.is_hot(Some(0)) && with_zero.is_hot(Some(5)));
        assert!(!with_zero.is_hot(Some(6)));
        // Small hashes differ in their low bits only, which the slot spreads; many of them fill
        // runs of slots that lookups probe past.
        let small: Vec<u64> = (1..=200).collect();
        let hot = HotKeys::from_hashes(small.iter().copied());
        assert!(small.iter().all(|&h| hot.is_hot(Some(h))));
        assert!((201..5_000u64).all(|h| !hot.is_hot(Some(h))));
    }
}
