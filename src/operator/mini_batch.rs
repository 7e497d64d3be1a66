//! The mini-batch: when one ends ([`Trigger`]), what it touched ([`MiniBatch`]), and the one
//! transition per touched group it emits when it fires (Flink's `MiniBatchGroupAggFunction`,
//! and with mini-batch off, its per-record `GroupAggFunction` over runs of distinct keys).
//!
//! Rows are applied to the keyed state as they arrive; on first touch in a mini-batch a group is
//! marked and its current results are kept (vectorized `evaluate` over the newly touched groups).
//! When the mini-batch fires, each touched group gets at most one transition: `+I` (new),
//! `-U`/`+U` (changed values), nothing (unchanged), `-D` (record count back to 0). Old and new
//! values are compared column-wise and the output is assembled with `interleave` (or, for a
//! split-distinct PARTIAL whose fold takes them, as delta rows: `operator/deltas.rs`). Applying
//! rows eagerly and emitting at the end is equivalent to Flink's buffering because every
//! accumulator is order-insensitive within a key; only the leading-retraction rule depends on
//! order, and it is applied in arrival order.

use std::sync::Arc;
use std::time::Duration;

use arrow::array::{Array, ArrayRef, BooleanArray, BooleanBufferBuilder};
use arrow::buffer::BooleanBuffer;
use arrow::compute::kernels::cmp::distinct;
use arrow::compute::{concat, interleave, or};

use crate::changelog::{ChangeBatch, RowKind, op_array};
use crate::error::{Error, Result};
use crate::operator::GroupAggregate;
use crate::operator::keyed::KeyHashes;
use crate::plan::CalcBatch;

/// When a mini-batch ends: after `size` rows, or when the clock crosses a multiple of the
/// latency. The one trigger of the one-phase operator, of a global phase taking accumulator
/// rows, and of the parallel operator (whose `size` counts the rows of all its workers).
#[derive(Debug, Clone)]
pub(crate) struct Trigger {
    size: usize,
    latency: Duration,
    /// Rows in the current mini-batch.
    rows: usize,
    /// Start of the latency interval last seen on the clock.
    last_interval: i64,
}

impl Trigger {
    /// A trigger after `size` rows (at least 1) or `latency`.
    pub(crate) fn new(size: usize, latency: Duration) -> Self {
        Self {
            size: size.max(1),
            latency,
            rows: 0,
            last_interval: i64::MIN,
        }
    }

    /// The rows a mini-batch holds.
    pub(crate) fn size(&self) -> usize {
        self.size
    }

    /// Whether a latency fires mini-batches too (else only sizes do, and the clock need not be
    /// read).
    pub(crate) fn has_latency(&self) -> bool {
        !self.latency.is_zero()
    }

    /// Whether the clock reading `now_ms` lies in a later latency interval than the last
    /// reading: a mini-batch fires once per interval boundary the clock crosses.
    pub(crate) fn latency_due(&mut self, now_ms: i64) -> bool {
        crate::clock::crossed_interval(&mut self.last_interval, now_ms, self.latency)
    }

    /// Cuts `n` incoming rows at the mini-batch boundaries: `(offset, len, ends)` for each
    /// piece, `ends` when the piece fills the mini-batch (which the caller then fires).
    pub(crate) fn cut(&mut self, n: usize) -> Vec<(usize, usize, bool)> {
        let mut pieces = vec![];
        let mut off = 0;
        while off < n {
            let take = (n - off).min(self.size - self.rows);
            self.rows += take;
            let ends = self.rows >= self.size;
            if ends {
                self.rows = 0;
            }
            pieces.push((off, take, ends));
            off += take;
        }
        pieces
    }

    /// Whether `n` more rows fit in the current mini-batch without filling it.
    pub(crate) fn cut_free(&self, n: usize) -> bool {
        self.rows + n < self.size
    }

    /// The mini-batch ended early (latency, end of input): count afresh.
    pub(crate) fn reset(&mut self) {
        self.rows = 0;
    }
}

/// The groups one mini-batch (with mini-batch off: one run of distinct keys) touched.
#[derive(Debug, Default)]
pub(crate) struct MiniBatch {
    /// The current mini-batch's id; `mark[g] == id` means `g` was touched in it.
    pub(crate) id: u32,
    pub(crate) touched: Vec<u32>,
    /// Whether each touched group had state before the mini-batch.
    pub(crate) had_state: Vec<bool>,
    pub(crate) mark: Vec<u32>,
    /// `seen_acc[g] == id`: an accumulate of `g` came in this mini-batch.
    pub(crate) seen_acc: Vec<u32>,
    /// Results of the touched groups before the mini-batch, per output column, in pieces.
    pub(crate) old: Vec<Vec<ArrayRef>>,
}

impl MiniBatch {
    /// Bookkeeping for `outputs` output columns.
    pub(crate) fn new(outputs: usize) -> Self {
        Self {
            id: 1,
            old: vec![vec![]; outputs],
            ..Self::default()
        }
    }

    /// Grows the per-group marks to `total` groups.
    pub(crate) fn grow(&mut self, total: usize) {
        if self.mark.len() < total {
            self.mark.resize(total, 0);
            self.seen_acc.resize(total, 0);
        }
    }

    /// Whether a mini-batch is in progress (some group touched).
    pub(crate) fn is_open(&self) -> bool {
        !self.touched.is_empty()
    }

    /// Starts the next mini-batch.
    pub(crate) fn next(&mut self) {
        self.touched.clear();
        self.had_state.clear();
        self.old.iter_mut().for_each(Vec::clear);
        if self.id == u32::MAX {
            self.mark.fill(0);
            self.seen_acc.fill(0);
            self.id = 0;
        }
        self.id += 1;
    }

    /// Forgets the per-group marks (the group ids changed) and starts afresh.
    pub(crate) fn clear_marks(&mut self) {
        self.mark = vec![];
        self.seen_acc = vec![];
    }

    /// Bytes of the per-group marks.
    pub(crate) fn size(&self) -> usize {
        (self.mark.capacity() + self.seen_acc.capacity()) * 4
    }
}

/// Transitions waiting to be emitted: row kinds, groups, and for each output column the arrays
/// their values come from (`picks` index into them).
#[derive(Debug, Default)]
pub(crate) struct Pending {
    pub(crate) kinds: Vec<RowKind>,
    groups: Vec<u32>,
    sources: Vec<Vec<ArrayRef>>,
    picks: Vec<(usize, usize)>,
}

impl Pending {
    /// Adds one mini-batch's transitions; `picks` are `(0 = old | 1 = new, position)`.
    fn add(
        &mut self,
        kinds: Vec<RowKind>,
        groups: Vec<u32>,
        picks: &[(usize, usize)],
        old: Vec<ArrayRef>,
        new: Vec<ArrayRef>,
    ) {
        if self.sources.is_empty() {
            self.sources = vec![vec![]; old.len()];
        }
        let base = self.sources[0].len();
        for ((col, o), n) in self.sources.iter_mut().zip(old).zip(new) {
            col.push(o);
            col.push(n);
        }
        self.kinds.extend(kinds);
        self.groups.extend(groups);
        self.picks
            .extend(picks.iter().map(|&(which, pos)| (base + which, pos)));
    }

    /// The collected transitions, if any, leaving this empty.
    fn take(&mut self) -> Option<Pending> {
        if self.kinds.is_empty() {
            return None;
        }
        Some(std::mem::take(self))
    }
}

/// Rows where any column differs between `old` and `new` (NULL-aware).
pub(crate) fn changed_rows(old: &[ArrayRef], new: &[ArrayRef]) -> Result<BooleanBuffer> {
    let mut acc: Option<BooleanArray> = None;
    for (o, n) in old.iter().zip(new) {
        let d = distinct(o, n)?;
        acc = Some(match acc {
            None => d,
            Some(a) => or(&a, &d)?,
        });
    }
    let acc = acc.ok_or_else(|| Error::internal("no aggregate columns"))?;
    Ok(acc.values().clone())
}

/// Applying rows and firing mini-batches.
impl GroupAggregate {
    /// Mini-batch off: applies `cb` in runs without a repeated key, firing each run.
    pub(super) fn run_records(&mut self, cb: &CalcBatch, gids: &[u32]) -> Result<()> {
        if self.run_mark.len() < self.keyed.len() {
            self.run_mark.resize(self.keyed.len(), 0);
        }
        let mut start = 0;
        for (i, &g) in gids.iter().enumerate() {
            let g = g as usize;
            if self.run_mark[g] == self.run_id {
                self.apply(cb, start, i - start, &gids[start..i])?;
                self.fire()?;
                self.next_run();
                start = i;
            }
            self.run_mark[g] = self.run_id;
        }
        self.apply(cb, start, gids.len() - start, &gids[start..])?;
        self.fire()?;
        self.next_run();
        Ok(())
    }

    fn next_run(&mut self) {
        if self.run_id == u32::MAX {
            self.run_mark.fill(0);
            self.run_id = 0;
        }
        self.run_id += 1;
    }

    /// Marks the groups of `gids` touched in the current mini-batch; on first touch, expires a
    /// group whose TTL passed and keeps the results of the newly touched groups before they
    /// change. With `raw_rows`, each id is one input row and counts towards its key's rows.
    pub(super) fn touch(&mut self, gids: &[u32], raw_rows: bool) -> Result<()> {
        let batch = &mut self.mini_batch;
        let keyed = &mut self.keyed;
        let first_new = batch.touched.len();
        let mut expired = vec![];
        // One hot key's rows (all one group) are touched once, not row after row into the
        // same counter: its first row standing for them all.
        let (ids, rows) = match one_group(gids) {
            Some(_) => (&gids[..1], gids.len() as u64),
            None => (gids, 1),
        };
        for &g in ids {
            let gi = g as usize;
            if raw_rows {
                // Each raw row counts for the hot keys (in the pass that marks the group).
                keyed.key_rows[gi] += rows;
            }
            if batch.mark[gi] != batch.id {
                batch.mark[gi] = batch.id;
                batch.touched.push(g);
                if keyed.alive[gi]
                    && self.ttl_ms > 0
                    && self.now.saturating_sub(keyed.last_write[gi]) >= self.ttl_ms
                {
                    // The state expired: the key is new again.
                    keyed.alive[gi] = false;
                    keyed.live -= 1;
                    expired.push(g);
                }
                batch.had_state.push(keyed.alive[gi]);
            }
        }
        if !expired.is_empty() {
            keyed.kill(&expired);
        }
        if batch.touched.len() > first_new {
            let old = keyed.accs.evaluate(&batch.touched[first_new..])?;
            for (pieces, a) in batch.old.iter_mut().zip(old) {
                pieces.push(a);
            }
        }
        Ok(())
    }

    /// Applies rows `off..off + len` (group ids `gids`) to the state.
    pub(super) fn apply(
        &mut self,
        cb: &CalcBatch,
        off: usize,
        len: usize,
        gids: &[u32],
    ) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let sliced;
        let cb = if off == 0 && len == cb.num_rows {
            cb
        } else {
            sliced = cb.slice(off, len);
            &sliced
        };
        self.touch(gids, true)?;
        let total = self.keyed.len();
        // A global phase drops no retraction (it takes raw rows when its local phase is
        // bypassed).
        let global = self.is_global();
        // Over insert-only input no group is ever deleted, so no record count is kept (a merged
        // local count is always positive), in the global phase as in the one-phase operator.
        let Some(retract) = cb.retract.as_ref() else {
            return self.keyed.accs.apply(cb, gids, None, None, total);
        };
        // Retraction input: drop leading retractions of stateless keys, count the rest.
        let batch = &mut self.mini_batch;
        let keyed = &mut self.keyed;
        let mut dropped: Option<BooleanBufferBuilder> = None;
        for (r, &g) in gids.iter().enumerate() {
            let gi = g as usize;
            if retract.value(r) {
                if !global && !keyed.alive[gi] && batch.seen_acc[gi] != batch.id {
                    dropped
                        .get_or_insert_with(|| {
                            let mut b = BooleanBufferBuilder::new(len);
                            b.append_n(len, false);
                            b
                        })
                        .set_bit(r, true);
                } else {
                    keyed.count1[gi] -= 1;
                }
            } else {
                batch.seen_acc[gi] = batch.id;
                keyed.count1[gi] += 1;
            }
        }
        let retracts = retract.count_set_bits();
        if retracts == 0 {
            return keyed.accs.apply(cb, gids, None, None, total);
        }
        let acc_mask = !retract;
        let ret_mask = match dropped {
            Some(mut d) => {
                let d = d.finish();
                self.metrics.dropped_retractions += d.count_set_bits() as u64;
                retract & &!&d
            }
            None => retract.clone(),
        };
        keyed
            .accs
            .apply(cb, gids, Some(&acc_mask), Some(&ret_mask), total)
    }

    /// Ends the mini-batch: derives one transition per touched group and queues it for
    /// [`Self::emit`].
    pub(super) fn fire(&mut self) -> Result<()> {
        if !self.mini_batch.is_open() {
            self.mini_batch.next();
            return Ok(());
        }
        self.metrics.mini_batches += 1;
        let touched = std::mem::take(&mut self.mini_batch.touched);
        let had_state = std::mem::take(&mut self.mini_batch.had_state);
        let new = self.keyed.accs.evaluate(&touched)?;
        let old = self
            .mini_batch
            .old
            .iter()
            .map(|pieces| {
                if pieces.len() == 1 {
                    Ok(Arc::clone(&pieces[0]))
                } else {
                    let refs: Vec<&dyn Array> = pieces.iter().map(|a| a.as_ref()).collect();
                    concat(&refs)
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        let retractions = self.plan.has_retractions();
        let changed = if had_state.iter().any(|&h| h) {
            Some(changed_rows(&old, &new)?)
        } else {
            None
        };
        // Delta rows take an update's old results too.
        let ub = self.config.emit_update_before || self.deltas.is_some();
        let ttl = self.ttl_ms > 0;
        let mut kinds = Vec::with_capacity(touched.len());
        let mut picks: Vec<(usize, usize)> = Vec::with_capacity(touched.len());
        let mut emit_groups = Vec::with_capacity(touched.len());
        let mut deleted = vec![];
        for (p, &g) in touched.iter().enumerate() {
            let gi = g as usize;
            let zero = retractions && self.keyed.count1[gi] == 0;
            if !zero {
                self.keyed.revive(gi);
                if ttl {
                    self.keyed.last_write[gi] = self.now;
                }
                if !had_state[p] {
                    kinds.push(RowKind::Insert);
                    picks.push((1, p));
                    emit_groups.push(g);
                } else if ttl || changed.as_ref().is_some_and(|c| c.value(p)) {
                    if ub {
                        kinds.push(RowKind::UpdateBefore);
                        picks.push((0, p));
                        emit_groups.push(g);
                    }
                    kinds.push(RowKind::UpdateAfter);
                    picks.push((1, p));
                    emit_groups.push(g);
                }
            } else {
                if had_state[p] {
                    kinds.push(RowKind::Delete);
                    picks.push((0, p));
                    emit_groups.push(g);
                }
                deleted.push(g);
            }
        }
        self.keyed.kill(&deleted);
        self.mini_batch.touched = touched;
        self.mini_batch.had_state = had_state;
        self.mini_batch.next();
        if !kinds.is_empty() {
            match &mut self.deltas {
                Some(deltas) => deltas.add(&kinds, &emit_groups, &picks, &old, &new)?,
                None => self.pending.add(kinds, emit_groups, &picks, old, new),
            }
        }
        Ok(())
    }

    /// The key hashes of the rows the next [`GroupAggregate::emit`] emits as its changelog
    /// batch, in order; `None` where it emits none, or delta rows instead.
    ///
    /// # Errors
    /// A pending group past the key table (a bug).
    pub(super) fn pending_key_hashes(&self) -> Result<Option<KeyHashes>> {
        if self.deltas.is_some() || self.pending.kinds.is_empty() {
            return Ok(None);
        }
        self.keyed.key_hashes(&self.pending.groups).map(Some)
    }

    /// Emits the transitions collected since the last call as one changelog batch, then
    /// compacts the state where that is due (which renumbers the groups).
    pub(super) fn emit(&mut self, out: &mut Vec<ChangeBatch>) -> Result<()> {
        self.emit_keeping_ids(out)?;
        self.maybe_compact()
    }

    /// [`GroupAggregate::emit`] without the compaction, so that the group ids handed out so
    /// far stay valid: for a batch interned whole and cut at a mini-batch's end, whose later
    /// rows are applied with those ids after the emission (the caller compacts after them).
    pub(super) fn emit_keeping_ids(&mut self, out: &mut Vec<ChangeBatch>) -> Result<()> {
        if let Some(deltas) = &mut self.deltas {
            if !deltas.groups().is_empty() {
                let keys = self.keyed.key_columns(deltas.groups())?;
                if let Some(batch) = deltas.take(keys)? {
                    self.metrics.rows_out += batch.num_rows() as u64;
                    self.metrics.batches_out += 1;
                    out.push(batch);
                }
            }
            return Ok(());
        }
        let Some(pending) = self.pending.take() else {
            return Ok(());
        };
        let mut columns = Vec::with_capacity(self.plan.output_schema.fields().len());
        columns.extend(self.keyed.key_columns(&pending.groups)?);
        for sources in &pending.sources {
            let refs: Vec<&dyn Array> = sources.iter().map(|a| a.as_ref()).collect();
            columns.push(interleave(&refs, &pending.picks)?);
        }
        let batch = self.plan.output(op_array(&pending.kinds), columns)?;
        self.metrics.rows_out += batch.num_rows() as u64;
        self.metrics.batches_out += 1;
        out.push(batch);
        Ok(())
    }
}

/// The one id of `ids` where they are all the same (a batch of one hot key's rows), tested
/// sixteen at a time in passes the compiler vectorizes, stopping at the first sixteen that
/// differ; None otherwise (or empty).
fn one_group(ids: &[u32]) -> Option<u32> {
    let &g = ids.first()?;
    ids.chunks(16)
        .all(|c| c.iter().fold(true, |all, &x| all & (x == g)))
        .then_some(g)
}

#[cfg(test)]
mod tests {
    use super::one_group;
    use crate::aggregates::count_star;
    use crate::{Config, GroupAggregate};
    use arrow::array::{RecordBatch, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};
    use datafusion_expr::col;
    use rand::{Rng, SeedableRng};
    use std::collections::HashMap;
    use std::sync::Arc;

    /// A mini-batch counts each key's input rows (the hot keys) whether a batch holds one key
    /// or several, in runs or one at a time.
    #[test]
    fn a_mini_batch_counts_the_rows_of_each_key() {
        let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Utf8, true)]));
        let config = Config::from_pairs([
            ("table.exec.mini-batch.enabled", "true"),
            ("table.exec.mini-batch.allow-latency", "1 h"),
            ("table.exec.mini-batch.size", "300"),
        ])
        .unwrap();
        let mut agg = GroupAggregate::builder(Arc::clone(&schema))
            .group_by([col("k")])
            .aggregate([count_star()])
            .config(config)
            .build()
            .unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let mut want: HashMap<String, u64> = HashMap::new();
        for _ in 0..20 {
            let mut keys: Vec<String> = vec![];
            if rng.random_bool(0.3) {
                // A batch of one key, cut or not by the mini-batch size.
                let len = rng.random_range(1..400);
                keys.extend(std::iter::repeat_n(
                    format!("k{}", rng.random_range(0..4)),
                    len,
                ));
            }
            while keys.len() < 100 {
                let key = format!("k{}", rng.random_range(0..4));
                let len = if rng.random_bool(0.5) {
                    1
                } else {
                    rng.random_range(2..40)
                };
                keys.extend(std::iter::repeat_n(key, len));
            }
            for k in &keys {
                *want.entry(k.clone()).or_default() += 1;
            }
            let batch =
                RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(StringArray::from(keys))])
                    .unwrap();
            agg.push(&batch).unwrap();
        }
        agg.finish().unwrap();
        let mut have = agg.hot_keys(10).unwrap();
        have.sort();
        let mut want: Vec<(String, u64)> = want.into_iter().collect();
        want.sort();
        assert_eq!(have, want);
    }

    /// Ids all the same, across the sixteen-id passes and past them, have their one group;
    /// one id different anywhere among them, or none, has none.
    #[test]
    fn one_group_is_found_where_every_id_is_the_same() {
        assert_eq!(one_group(&[]), None);
        for len in 1..=40 {
            let mut ids = vec![7u32; len];
            assert_eq!(one_group(&ids), Some(7), "{len} ids");
            for at in (0..len).filter(|_| len > 1) {
                ids[at] = 8;
                assert_eq!(one_group(&ids), None, "{len} ids, {at} differs");
                ids[at] = 7;
            }
        }
    }
}
