//! Flushing a [`LocalGroupAggregate`]: its accumulator rows, whole, cut by worker or by key
//! group, and what its key table keeps for the next mini-batch ([`RETAINED_KEYS`]).

use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::{ArrayRef, Int64Array, RecordBatch};

use super::LocalGroupAggregate;
use crate::error::{Error, Result};
use crate::operator::exchange::partition;
use crate::operator::key_groups::KeyGroups;
use crate::operator::local_ids::{KeyTableId, LocalIds};

/// The most keys a local phase keeps in its key table across a flush (their accumulators
/// reset), so that the next mini-batch finds them again instead of interning them afresh (a
/// dictionary's values, for one, each hashed and inserted again): a flush then sends only the
/// groups that got rows. A larger table is cleared, as the local phase keeps no state; so is
/// one of which the mini-batch flushed fewer than half the keys (they do not come back), and
/// one with DISTINCT accumulators (whose lists are built fastest for every group of the
/// table).
pub const RETAINED_KEYS: usize = 4096;

/// A flushed accumulator batch with, per row, its key's hash and the input rows it folds.
#[derive(Debug)]
pub(crate) struct Flushed {
    pub(crate) batch: RecordBatch,
    pub(crate) hashes: Vec<u64>,
    /// How many of the first key columns `hashes` are over: all of them, or a split
    /// PARTIAL's keys before the buckets where the local phase merged them
    /// ([`LocalGroupAggregate::merge_buckets`]).
    pub(crate) hashed_keys: usize,
    pub(crate) rows: Vec<u64>,
    /// Each row's key id in the local phase's key table, where the table outlives the flush
    /// (its keys come back under the same ids: [`crate::operator::local_ids`]).
    pub(crate) local_ids: Option<LocalIds>,
}

/// One worker's rows of a flush that the workers share (its rows run worker after worker): a
/// range of the flush, so that routing a flush costs a reference count per worker rather than
/// a batch cut and freed per worker. Cloning is a reference count.
#[derive(Debug, Clone)]
pub(crate) struct FlushedPart {
    flush: Arc<Flushed>,
    range: Range<usize>,
}

impl FlushedPart {
    /// Rows `range` of `flush`.
    pub(super) fn new(flush: Arc<Flushed>, range: Range<usize>) -> Self {
        Self { flush, range }
    }

    /// A flush that goes whole to one worker.
    #[cfg(test)]
    pub(crate) fn whole(flush: Flushed) -> Self {
        let range = 0..flush.batch.num_rows();
        Self {
            flush: Arc::new(flush),
            range,
        }
    }

    /// The accumulator rows.
    pub(crate) fn len(&self) -> usize {
        self.range.len()
    }

    /// Whether there are no accumulator rows.
    pub(crate) fn is_empty(&self) -> bool {
        self.range.is_empty()
    }

    /// The first of the part's rows in [`FlushedPart::shared`]'s batch.
    pub(crate) fn offset(&self) -> usize {
        self.range.start
    }

    /// The whole flush the part is rows of.
    pub(crate) fn shared(&self) -> &Flushed {
        &self.flush
    }

    /// A handle on the whole flush, which keeps it alive (see [`RetiredFlushes`]).
    pub(crate) fn handle(&self) -> Arc<Flushed> {
        Arc::clone(&self.flush)
    }

    /// The part's key hashes.
    pub(crate) fn hashes(&self) -> &[u64] {
        &self.flush.hashes[self.range.clone()]
    }

    /// The input rows each of the part's accumulator rows folds.
    pub(crate) fn rows(&self) -> &[u64] {
        &self.flush.rows[self.range.clone()]
    }

    /// The part's key ids in the local phase's key table, where the table outlives the flush.
    pub(crate) fn local_ids(&self) -> Option<(KeyTableId, &[u32])> {
        self.flush
            .local_ids
            .as_ref()
            .map(|l| (l.table, &l.ids[self.range.clone()]))
    }

    /// The part's accumulator rows as a batch of their own (zero-copy).
    pub(crate) fn batch(&self) -> RecordBatch {
        self.flush.batch.slice(self.range.start, self.range.len())
    }
}

/// The flushes a source has routed, held until every worker has let go of its part, so that the
/// source's own thread frees them: a flush's buffers are allocated there, and a worker that
/// dropped the last part freed them across threads (a tenth of an orders-count worker's
/// samples; BENCHMARKS.md, forty-second pass). Workers take their parts in flush order, so
/// the flushes come back in order: the oldest go first.
#[derive(Debug, Default)]
pub(crate) struct RetiredFlushes(std::collections::VecDeque<Arc<Flushed>>);

impl RetiredFlushes {
    /// Holds `flush` until its parts come back, and frees the oldest flushes no worker holds.
    pub(crate) fn hold(&mut self, flush: Arc<Flushed>) {
        self.free_returned();
        self.0.push_back(flush);
    }

    /// Frees the oldest flushes no worker holds any more.
    pub(crate) fn free_returned(&mut self) {
        while self.0.front().is_some_and(|f| Arc::strong_count(f) == 1) {
            self.0.pop_front();
        }
    }

    /// The flushes held.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }
}

impl LocalGroupAggregate {
    /// Emits one accumulator row per key folded since the last flush (None if there was none)
    /// and starts afresh.
    ///
    /// # Errors
    /// When the state cannot be represented (a bug).
    pub fn flush(&mut self) -> Result<Option<RecordBatch>> {
        Ok(self.flush_parts()?.map(|f| f.batch))
    }

    /// [`LocalGroupAggregate::flush`] cut by key group, for a host that routes by key group
    /// itself (Flink): one accumulator batch per key group of `key_groups` that holds keys, in
    /// key group order, each with its key group. Built once with its rows ordered by key group
    /// and sliced, from the hashes the local phase keeps (`LocalGroupAggregate::flush_routed`
    /// with a worker per key group).
    ///
    /// # Errors
    /// As [`LocalGroupAggregate::flush`]; no key group, or too many.
    pub fn flush_by_key_group(&mut self, key_groups: usize) -> Result<Vec<(usize, RecordBatch)>> {
        let kg = KeyGroups::new(key_groups, key_groups)?;
        let Some(flushed) = self.flush_routed(&kg)? else {
            return Ok(vec![]);
        };
        Ok(flushed
            .parts
            .into_iter()
            .enumerate()
            .filter(|(_, p)| !p.is_empty())
            .map(|(g, p)| (g, p.batch()))
            .collect())
    }

    /// [`LocalGroupAggregate::flush`], with each row's key hash and input row count.
    pub(crate) fn flush_parts(&mut self) -> Result<Option<Flushed>> {
        let n = self.len() as u32;
        let rows = self.rows_per_group();
        let parts = self.folded_only(vec![(0..n).collect()], &rows);
        Ok(self
            .flush_in_parts(parts, &rows)?
            .map(|(flushed, _)| flushed))
    }

    /// `parts` without the groups that got no rows since the last flush, where the key table
    /// retained keys of earlier mini-batches (otherwise every group got some).
    fn folded_only(&self, parts: Vec<Vec<u32>>, rows: &[u64]) -> Vec<Vec<u32>> {
        if !self.retained {
            return parts;
        }
        parts
            .into_iter()
            .map(|ids| ids.into_iter().filter(|&g| rows[g as usize] > 0).collect())
            .collect()
    }

    /// Flushes straight into one part per worker (the owner of each key's key group, in
    /// worker order; a part may be empty): the accumulator batch is built once with its rows
    /// ordered by worker, and each worker's part is its range of it ([`FlushedPart`]), instead
    /// of a batch built whole and gathered per worker. Also returns the hottest key's share of
    /// the rows folded. `None` when nothing was folded.
    ///
    /// # Errors
    /// As [`LocalGroupAggregate::flush`].
    pub(crate) fn flush_routed(&mut self, kg: &KeyGroups) -> Result<Option<RoutedFlush>> {
        if kg.workers() > 1 && self.entry_routes.is_some() {
            return self.flush_entry_routed(kg);
        }
        let n = self.len();
        let rows = self.rows_per_group();
        if rows.iter().all(|&r| r == 0) {
            return Ok(None);
        }
        let top = rows.iter().copied().max().unwrap_or(0);
        let all: u64 = rows.iter().sum();
        let hot_share = top as f64 / all.max(1) as f64;
        let start = Instant::now();
        let parts = if kg.workers() == 1 {
            vec![(0..n as u32).collect()]
        } else if let Some(owners) = &self.owners {
            owners.parts()
        } else {
            partition(self.groups.hashes(), kg)
        };
        let parts = self.folded_only(parts, &rows);
        let routing = start.elapsed();
        let entries = self.state.distinct_entries() as u64;
        let parts = match self.flush_in_parts(parts, &rows)? {
            Some((flushed, bounds)) => {
                let flush = Arc::new(flushed);
                bounds
                    .windows(2)
                    .map(|w| FlushedPart {
                        flush: Arc::clone(&flush),
                        range: w[0]..w[1],
                    })
                    .collect()
            }
            None => vec![],
        };
        Ok(Some(RoutedFlush {
            parts,
            hot_share,
            routing,
            entries,
        }))
    }

    /// The keys that got rows since the last flush (counted as [`Self::rows_per_group`] would
    /// give them, without the list).
    pub(super) fn folded_keys(&self) -> usize {
        if self.retracted {
            self.group_rows[..self.len()]
                .iter()
                .filter(|&&r| r > 0)
                .count()
        } else {
            self.count1.iter().filter(|&&c| c != 0).count()
        }
    }

    /// Each group's input rows since the last flush (0 for a retained key that got none).
    pub(super) fn rows_per_group(&self) -> Vec<u64> {
        let n = self.len();
        let mut rows: Vec<u64> = if self.retracted {
            self.group_rows[..n].to_vec()
        } else {
            self.count1.iter().map(|&c| c as u64).collect()
        };
        rows.resize(n, 0);
        rows
    }

    /// Flushes the groups of each part (together, every group once) as one [`Flushed`] whose
    /// rows run part after part, with the bounds of the parts (part `i` is rows `bounds[i]..
    /// bounds[i + 1]`), and starts afresh; `rows` are [`LocalGroupAggregate::rows_per_group`].
    fn flush_in_parts(
        &mut self,
        parts: Vec<Vec<u32>>,
        rows: &[u64],
    ) -> Result<Option<(Flushed, Vec<usize>)>> {
        let n = self.len();
        let order: Vec<u32> = parts.concat();
        if order.is_empty() {
            return Ok(None);
        }
        // A (key, worker) slot's key and hash are its query key's.
        let key_hashes = self.groups.hashes();
        let hash_of = |g: u32| match &self.owners {
            Some(owners) => owners.key_hash(g),
            None => key_hashes[g as usize],
        };
        let keys: Vec<ArrayRef> = match &self.owners {
            Some(owners) => owners.key_columns(&order)?,
            None => self.groups.keys(&order)?,
        };
        let count1: ArrayRef = Arc::new(Int64Array::from_iter_values(
            order.iter().map(|&g| self.count1[g as usize]),
        ));
        let batch = self.accumulator_batch(keys, self.state.state(&order)?, count1)?;
        // A small plain key table keeps its keys (their accumulators reset below) while most
        // of them come back in each mini-batch; the others start from group 0 again.
        self.retained = n <= RETAINED_KEYS
            && 2 * order.len() >= n
            && self.owners.is_none()
            && !self.merges_buckets()
            && !self.state.has_distinct();
        let mut bounds = Vec::with_capacity(parts.len() + 1);
        bounds.push(0);
        for ids in &parts {
            bounds.push(bounds[bounds.len() - 1] + ids.len());
        }
        let flushed = Flushed {
            batch,
            hashes: order.iter().map(|&g| hash_of(g)).collect(),
            hashed_keys: self.state_keys,
            rows: order.iter().map(|&g| rows[g as usize]).collect(),
            local_ids: self.retained.then_some(LocalIds {
                table: self.table,
                ids: order,
            }),
        };
        self.forget_folded(n);
        Ok(Some((flushed, bounds)))
    }

    /// The accumulator batch of the key columns the state keeps (`keys`; the bucket columns it
    /// does not keep are added NULL), the accumulators' `state` columns and each row's record
    /// count (`count1`, which a `COUNT(*)` the local phase counts itself reads too).
    ///
    /// # Errors
    /// Columns that do not fit the accumulator schema (a bug).
    pub(super) fn accumulator_batch(
        &self,
        mut keys: Vec<ArrayRef>,
        state: Vec<ArrayRef>,
        count1: ArrayRef,
    ) -> Result<RecordBatch> {
        let rows = count1.len();
        for t in &self.plan.key_types[self.state_keys..] {
            keys.push(arrow::array::new_null_array(t, rows));
        }
        let at = keys.len();
        let mut cols = keys;
        cols.extend(state);
        if let Some(c) = self.count_star_column {
            cols[at + c] = Arc::clone(&count1);
        }
        cols.push(count1);
        RecordBatch::try_new(Arc::clone(&self.schema), cols)
            .map_err(|e| Error::internal(format!("accumulator batch: {e}")))
    }

    /// Forgets what was folded since the last flush, keeping the allocations (and the keys, if
    /// the key table is [`LocalGroupAggregate::retained`]); `n`: the groups the accumulators
    /// hold.
    pub(super) fn forget_folded(&mut self, n: usize) {
        if !self.retained {
            self.groups.clear();
            self.table = KeyTableId::fresh();
        }
        if let Some(owners) = &mut self.owners {
            owners.clear();
        }
        self.last_keys = None;
        self.count1.clear();
        self.group_rows.clear();
        self.retracted = false;
        // Every group's accumulators start afresh, in the same allocations.
        self.state.clear(n);
    }
}

/// A local phase's flush routed to the workers ([`LocalGroupAggregate::flush_routed`]).
#[derive(Debug)]
pub(crate) struct RoutedFlush {
    /// One part per worker, in worker order (possibly empty), ranges of one flush.
    pub(crate) parts: Vec<FlushedPart>,
    /// The hottest key's share of the rows folded (for the adaptive local phase).
    pub(crate) hot_share: f64,
    /// The time taken to assign the keys to the workers (the exchange's share of the flush).
    pub(crate) routing: Duration,
    /// The DISTINCT (group, value) entries the flush's lists hold.
    pub(crate) entries: u64,
}
