//! A split-distinct PARTIAL's hot keys: the query keys whose DISTINCT values are spread over
//! the workers by bucket; every other key stays with its own worker, as without split.
//!
//! Split-distinct spreads a key's DISTINCT work over the workers by its values' buckets, and
//! pays for it with a PARTIAL group per (key, worker) and their rows through the FINAL. For a
//! key that holds a small share of the input that is all cost: its worker was not overloaded.
//! Flink splits every key. Where a local phase routes each DISTINCT entry by its value's bucket
//! when it flushes (`EntryRoutes`, with [`super::BucketFill`] for the rows that go around it),
//! Tally spreads only the keys named here, found hot in a sample of the source (the SQL
//! planner's); a cold key's entries and rows all go to the worker of the key alone (its bucket
//! columns NULL). Where the local phase routes rows by their buckets instead (the workers still
//! merging the buckets), the source tasks leave a cold key's bucket columns NULL as they
//! evaluate its rows ([`HotKeys::leave_cold`]), so that every path routes them with the key
//! alone. The choice is made once, before the run, and every row and entry of a key
//! follows it, so each (key, value) pair has one worker and the FINAL's sums of the PARTIAL's
//! counts are exact whichever keys are hot. A key that grows hot after the sample is not
//! spread: its DISTINCT work stays on one worker, as without split.

use arrow::array::{Array, BooleanArray};
use arrow::buffer::BooleanBuffer;
use arrow::compute::nullif;
use tally_kernels::hash::hash_columns;

use super::CalcBatch;
use crate::error::{Error, Result};

/// The hot keys of a split PARTIAL, by the hash of their query keys (`hash_columns` over the
/// query's key columns, as a local phase's key table hashes them). A cold key whose hash equals
/// a hot key's is taken as hot: a key's choice only has to be the same everywhere, which a
/// function of its hash is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HotKeys {
    /// Sorted, without repeats.
    hashes: Vec<u64>,
}

impl HotKeys {
    /// The keys whose query keys hash to `hashes`.
    pub fn from_hashes(hashes: impl IntoIterator<Item = u64>) -> Self {
        let mut hashes: Vec<u64> = hashes.into_iter().collect();
        hashes.sort_unstable();
        hashes.dedup();
        Self { hashes }
    }

    /// How many keys are hot.
    pub fn len(&self) -> usize {
        self.hashes.len()
    }

    /// Whether no key is hot (every key stays with its worker).
    pub fn is_empty(&self) -> bool {
        self.hashes.is_empty()
    }

    /// Whether the key whose query keys hash to `prefix` is hot; without key columns (`None`)
    /// the one key is (splitting it is the point).
    #[inline]
    pub fn is_hot(&self, prefix: Option<u64>) -> bool {
        prefix.is_none_or(|h| self.hashes.binary_search(&h).is_ok())
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
}
