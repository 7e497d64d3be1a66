//! Snapshots, restores and compaction of a [`GroupAggregate`]: its live groups exported as Arrow
//! batches ([`GroupAggregate::snapshot`]: keys, accumulator columns, record counts, last write
//! times, input rows) and imported into an operator without state; compaction is the same export
//! and import into fresh tables, so that the memory of deleted and expired groups is returned.

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::{Schema, SchemaRef};

use crate::error::{Error, Result};
use crate::operator::exchange::route_snapshots;
use crate::operator::keyed::{KeyedState, hash_keys};
use crate::operator::{GroupAggregate, ParallelAggregate};
use crate::plan::{AggregatePlan, HOT_KEYS_METADATA, HotKeys};

/// The fewest dead (deleted or expired) groups that make a compaction due; it also needs at
/// least as many dead groups as live ones, so its cost is amortized over the deletions that
/// made it due (BENCHMARKS.md, "Soak": state flat under a churning key space).
pub const COMPACT_MIN_DEAD: usize = 1024;

/// Groups exported per step by compactions and snapshots: it bounds the transient copy (a chunk
/// of keys and accumulator columns), not the speed. BENCHMARKS.md, "Tuning constants".
const EXPORT_CHUNK: usize = 1 << 16;

impl GroupAggregate {
    /// The schema of [`GroupAggregate::snapshot`]: the group keys, the accumulator columns (as
    /// the local phase names them), `count1` (the record count, 0 over insert-only input),
    /// `$last_write_ms` (the TTL clock of the group's last write; `i64::MIN` without a TTL, which
    /// an operator with a TTL reads as written at its first clock reading after the restore) and
    /// `$input_rows` (input rows the group received, for the hot keys).
    pub fn snapshot_schema(&self) -> SchemaRef {
        self.keyed.snapshot_schema()
    }

    /// Whether a mini-batch (or a run) is in progress: rows applied but not yet fired and
    /// emitted.
    pub fn has_pending(&self) -> bool {
        self.mini_batch.is_open() || !self.pending.kinds.is_empty()
    }

    /// The state of every live group as batches of [`GroupAggregate::snapshot_schema`] (at most
    /// 65536 groups each). Like Flink's checkpoint of a mini-batch operator, it needs the
    /// pending mini-batch fired first ([`GroupAggregate::finish`], whose changes are delivered
    /// before the snapshot is taken, so that none is lost or emitted twice on restore).
    ///
    /// A split PARTIAL whose state merges its buckets (`GroupAggregate::merge_buckets`: one
    /// group per key) is cut into the groups of state keyed by every key, which any run
    /// restores (`KeyedState::export_cut`).
    ///
    /// # Errors
    /// A mini-batch still pending; state that merges a split PARTIAL's buckets and cannot be
    /// cut (over input with retractions).
    pub fn snapshot(&self) -> Result<Vec<RecordBatch>> {
        if self.has_pending() {
            return Err(Error::invalid_input(
                "cannot snapshot with a mini-batch pending: call finish() and deliver its changes first",
            ));
        }
        let schema = self.snapshot_schema();
        let live = self.keyed.live_groups();
        if !self.keyed.merges_buckets() {
            return self.keyed.export_chunks(&live, EXPORT_CHUNK, &schema);
        }
        let mut out = vec![];
        for chunk in live.chunks(EXPORT_CHUNK) {
            out.extend(self.keyed.export_cut(chunk, &schema)?);
        }
        Ok(out)
    }

    /// Loads batches made by [`GroupAggregate::snapshot`] (of an operator of the same query;
    /// the parallelism and options may differ) into this operator, which must hold no state.
    ///
    /// # Errors
    /// An operator with state, a batch of another schema (another query), or a key present
    /// twice.
    pub fn restore_snapshot(&mut self, batches: &[RecordBatch]) -> Result<()> {
        refuse_held_state(self.holds_state())?;
        if let Some(hot) = recorded_hot_keys(&self.plan, batches)? {
            self.replace_plan(Arc::new(self.plan.with_hot_keys(hot)))?;
        }
        let k = self.plan.key_types.len();
        let mut parts = Vec::with_capacity(batches.len());
        for b in batches {
            let mut hashes = vec![];
            if b.num_columns() >= k {
                hash_keys(&b.columns()[..k], b.num_rows(), &mut hashes)?;
            }
            parts.push((b.clone(), hashes));
        }
        self.restore_hashed(&parts)
    }

    /// [`GroupAggregate::restore_snapshot`] of batches whose key hashes are known (the parallel
    /// restore routes by them).
    pub(crate) fn restore_hashed(&mut self, parts: &[(RecordBatch, Vec<u64>)]) -> Result<()> {
        refuse_held_state(self.holds_state())?;
        let schema = self.snapshot_schema();
        let mut gids = std::mem::take(&mut self.gids);
        let mut seen = std::collections::HashSet::new();
        let result = (|| -> Result<()> {
            for (b, hashes) in parts {
                check_snapshot_schema(&schema, b)?;
                self.unstamped |= self.keyed.import(b, hashes, &mut gids, &mut seen)?;
                self.grow();
            }
            Ok(())
        })();
        self.gids = gids;
        result
    }

    /// Merges the buckets of state restored from a snapshot (keyed by every key), as
    /// [`GroupAggregate::merge_buckets`] keys fresh state; returns whether it did (not where it
    /// already does or the state could not be cut again, [`KeyedState::merged`]).
    ///
    /// # Errors
    /// A mini-batch pending (a bug: a restore has none).
    pub(crate) fn merge_restored_buckets(&mut self) -> Result<bool> {
        if self.has_pending() {
            return Err(Error::internal(
                "an aggregate changed its keys with a mini-batch pending",
            ));
        }
        let Some(merged) = self.keyed.merged(EXPORT_CHUNK)? else {
            return Ok(false);
        };
        self.replace_keyed(merged);
        Ok(true)
    }

    /// Takes `keyed` (this state rebuilt) in place of its state: new group ids, so the
    /// per-group marks start afresh.
    fn replace_keyed(&mut self, keyed: KeyedState) {
        self.keyed = keyed;
        self.mini_batch.clear_marks();
        self.run_mark = vec![];
        self.grow();
    }

    /// Compacts when at least half the groups, and at least [`COMPACT_MIN_DEAD`], are dead and
    /// no mini-batch is in progress.
    pub(super) fn maybe_compact(&mut self) -> Result<()> {
        let dead = self.keyed.dead();
        if dead < COMPACT_MIN_DEAD || dead < self.keyed.live as usize || self.has_pending() {
            return Ok(());
        }
        self.compact()
    }

    /// Rebuilds the group table and the accumulators with only the live groups (their ids
    /// change: the per-group marks start afresh).
    fn compact(&mut self) -> Result<()> {
        let peak = self.state_bytes();
        self.metrics.peak_state_bytes = self.metrics.peak_state_bytes.max(peak);
        let rebuilt = self.keyed.rebuilt(EXPORT_CHUNK)?;
        self.replace_keyed(rebuilt);
        self.metrics.compactions += 1;
        Ok(())
    }
}

impl crate::checkpoint::Checkpointed for GroupAggregate {
    fn snapshot_schema(&self) -> SchemaRef {
        GroupAggregate::snapshot_schema(self)
    }
    fn snapshot(&self) -> Result<Vec<RecordBatch>> {
        GroupAggregate::snapshot(self)
    }
    fn restore_snapshot(&mut self, batches: &[RecordBatch]) -> Result<()> {
        GroupAggregate::restore_snapshot(self, batches)
    }
}

/// Refuses a restore into an operator that `held` state.
fn refuse_held_state(held: bool) -> Result<()> {
    if held {
        return Err(Error::invalid_input(
            "restore needs an operator without state",
        ));
    }
    Ok(())
}

/// The hot keys a split PARTIAL's snapshot `batches` were keyed under, where they are not
/// those `plan` names (Some(None): every key spread, as in a snapshot that records none, of an
/// earlier Tally); None where they are the same, for a plan without buckets, and for a
/// snapshot without groups, which any run may restore.
///
/// # Errors
/// Hot keys recorded in another form (a corrupt snapshot).
fn recorded_hot_keys(
    plan: &AggregatePlan,
    batches: &[RecordBatch],
) -> Result<Option<Option<HotKeys>>> {
    let Some(first) = batches.iter().find(|b| b.num_rows() > 0) else {
        return Ok(None);
    };
    if plan.bucket_keys.is_none() {
        return Ok(None);
    }
    let recorded = match first.schema().metadata().get(HOT_KEYS_METADATA) {
        Some(text) => HotKeys::parse(text)?,
        None => None,
    };
    if recorded.as_ref() == plan.hot_keys().map(|h| h.as_ref()) {
        return Ok(None);
    }
    Ok(Some(recorded))
}

/// Checks that a snapshot batch was made for this operator's query.
fn check_snapshot_schema(expected: &SchemaRef, batch: &RecordBatch) -> Result<()> {
    let got = batch.schema();
    let same = got.fields().len() == expected.fields().len()
        && got
            .fields()
            .iter()
            .zip(expected.fields())
            .all(|(a, b)| a.name() == b.name() && a.data_type() == b.data_type());
    if !same {
        let names = |s: &Schema| -> String {
            s.fields()
                .iter()
                .map(|f| format!("{} {}", f.name(), f.data_type()))
                .collect::<Vec<_>>()
                .join(", ")
        };
        return Err(Error::invalid_input(format!(
            "the snapshot was taken for another query: its state columns are ({}), this query's are ({})",
            names(&got),
            names(expected)
        )));
    }
    Ok(())
}

/// Snapshots of a [`ParallelAggregate`]: its workers' states, restored to any parallelism.
impl ParallelAggregate {
    /// The schema of [`ParallelAggregate::snapshot`] (that of [`GroupAggregate::snapshot`]).
    pub fn snapshot_schema(&self) -> arrow::datatypes::SchemaRef {
        self.workers[0].agg.snapshot_schema()
    }

    /// The keyed state of every worker, as [`GroupAggregate::snapshot`] batches. The mini-batch
    /// in progress must be finished first ([`ParallelAggregate::finish`], whose changes are
    /// delivered before the snapshot is kept), as Flink fires its mini-batch before a
    /// checkpoint barrier; the local phases then hold nothing.
    ///
    /// # Errors
    /// A mini-batch in progress.
    pub fn snapshot(&self) -> Result<Vec<RecordBatch>> {
        if self.rows > 0
            || self.locals.iter().any(|l| l.keys() > 0)
            || self.workers.iter().any(|w| w.agg.has_pending())
        {
            return Err(Error::invalid_input(
                "cannot snapshot with a mini-batch pending: call finish() and deliver its changes first",
            ));
        }
        let mut out = vec![];
        for w in &self.workers {
            out.extend(w.agg.snapshot()?);
        }
        Ok(out)
    }

    /// Loads a snapshot (of any parallelism) into this aggregate, which must hold no state: each
    /// group goes to the worker its key hashes to.
    ///
    /// # Errors
    /// As [`GroupAggregate::restore_snapshot`].
    pub fn restore_snapshot(&mut self, batches: &[RecordBatch]) -> Result<()> {
        refuse_held_state(
            self.workers.iter().any(|w| w.agg.holds_state())
                || self.locals.iter().any(|l| l.keys() > 0),
        )?;
        if let Some(hot) = recorded_hot_keys(&self.plan, batches)? {
            let plan = Arc::new(self.plan.with_hot_keys(hot));
            for w in &mut self.workers {
                w.agg.replace_plan(Arc::clone(&plan))?;
            }
            for l in &mut self.locals {
                l.replace_plan(Arc::clone(&plan))?;
            }
            self.plan = plan;
        }
        // Each key is hashed once: the hash routes the group and interns it in its worker.
        let parts = route_snapshots(batches, self.plan.key_types.len(), &self.key_groups)?;
        let tasks: Vec<_> = self.workers.iter_mut().zip(parts).collect();
        let results = self
            .runtime
            .map(tasks, |(w, parts)| w.agg.restore_hashed(&parts));
        results.into_iter().collect()
    }
}

impl crate::checkpoint::Checkpointed for ParallelAggregate {
    fn snapshot_schema(&self) -> arrow::datatypes::SchemaRef {
        ParallelAggregate::snapshot_schema(self)
    }
    fn snapshot(&self) -> Result<Vec<RecordBatch>> {
        ParallelAggregate::snapshot(self)
    }
    fn restore_snapshot(&mut self, batches: &[RecordBatch]) -> Result<()> {
        ParallelAggregate::restore_snapshot(self, batches)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use arrow::array::Array;

    use super::*;
    use crate::changelog::ChangeBatch;
    use crate::config::Config;
    use crate::plan::split_fixture::{self, key_hash};

    /// The split fixture's PARTIAL over 4 buckets, naming `hot`.
    fn partial(hot: Option<HotKeys>) -> GroupAggregate {
        let plan = split_fixture::plan(4, false).with_hot_keys(hot);
        let clock = Arc::new(crate::clock::SystemClock);
        GroupAggregate::try_new(Arc::new(plan), Config::default(), clock).unwrap()
    }

    /// Rows of `u`'s set: keys 1, 1, 2, 2 with values 10 to 13 in buckets 2, 3, 0, 1.
    fn rows() -> RecordBatch {
        let [u_set, _] = split_fixture::hot_and_cold_sets();
        u_set
    }

    fn snapshot_of(hot: Option<HotKeys>) -> Vec<RecordBatch> {
        let mut agg = partial(hot);
        agg.push(&rows()).unwrap();
        agg.finish().unwrap();
        agg.snapshot().unwrap()
    }

    fn with_metadata(
        batches: &[RecordBatch],
        metadata: HashMap<String, String>,
    ) -> Vec<RecordBatch> {
        batches
            .iter()
            .map(|b| {
                let schema =
                    Schema::new_with_metadata(b.schema().fields().clone(), metadata.clone());
                RecordBatch::try_new(Arc::new(schema), b.columns().to_vec()).unwrap()
            })
            .collect()
    }

    /// A split PARTIAL's snapshot records its hot keys; an aggregate restoring it takes them in
    /// place of its own (other hot keys, or none), so that a cold key's later rows meet its
    /// restored group under NULL buckets. A snapshot recording none, or nothing (an earlier
    /// Tally's), spread every key and is restored so; hot keys recorded in another form are a
    /// one-line error.
    #[test]
    fn a_split_partial_restores_under_the_hot_keys_its_snapshot_records() {
        let hot = HotKeys::from_hashes([key_hash(1)]);
        let taken = snapshot_of(Some(hot.clone()));
        // Key 1 hot: a group per bucket; key 2 cold: one group, its buckets NULL.
        assert_eq!(taken.iter().map(RecordBatch::num_rows).sum::<usize>(), 3);
        assert_eq!(
            taken[0].schema().metadata()[HOT_KEYS_METADATA],
            HotKeys::describe(Some(&hot))
        );
        for own in [None, Some(HotKeys::from_hashes([key_hash(2)]))] {
            let mut restored = partial(own);
            restored.restore_snapshot(&taken).unwrap();
            assert_eq!(restored.plan.hot_keys().map(|h| h.as_ref()), Some(&hot));
            let cb = restored
                .plan
                .evaluate(&ChangeBatch::inserts(rows()))
                .unwrap();
            let cold: Vec<bool> = (0..4).map(|r| cb.keys[1].is_null(r)).collect();
            assert_eq!(cold, [false, false, true, true]);
            restored.push(&rows()).unwrap();
            restored.finish().unwrap();
            // The same values again: no group is added.
            let again = restored.snapshot().unwrap();
            assert_eq!(again.iter().map(RecordBatch::num_rows).sum::<usize>(), 3);
        }
        let spread = snapshot_of(None);
        assert_eq!(spread.iter().map(RecordBatch::num_rows).sum::<usize>(), 4);
        assert_eq!(spread[0].schema().metadata()[HOT_KEYS_METADATA], "none");
        for recorded in [spread.clone(), with_metadata(&spread, HashMap::new())] {
            let mut restored = partial(Some(hot.clone()));
            restored.restore_snapshot(&recorded).unwrap();
            assert!(restored.plan.hot_keys().is_none());
        }
        let bad = with_metadata(
            &taken,
            [(HOT_KEYS_METADATA.to_string(), "zz".to_string())].into(),
        );
        let e = partial(None)
            .restore_snapshot(&bad)
            .unwrap_err()
            .to_string();
        assert!(e.contains(HOT_KEYS_METADATA) && !e.contains('\n'), "{e}");
    }
}
