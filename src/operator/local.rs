//! `LocalGroupAggregate`: the stateless first phase of local-global aggregation.
//!
//! It folds the rows of one mini-batch slice into one accumulator row per key and emits them as
//! an insert-only Arrow batch, retractions included (counts may go negative), exactly as Flink's
//! `MiniBatchLocalGroupAggFunction`. A [`GroupAggregate`](crate::GroupAggregate) built with
//! [`GroupAggregate::try_new_global`](crate::GroupAggregate::try_new_global) merges such batches and emits the changelog.
//!
//! # The accumulator batch
//! One row per key of the slice: the group key columns (as in the query), then each aggregate's
//! state columns, named as Flink names accumulators (`sum$1`, `count$2`, `value$3` for MIN/MAX
//! over insert-only input, a `List<Struct<value, count>>` for MIN/MAX with retraction, and
//! `distinct$0` — a `List<Struct<value, count0, …>>` — shared by the DISTINCT calls on one
//! argument), then `count1$N` (N: the number of accumulator fields before it), the signed number
//! of input rows (Int64, never NULL). It is an ordinary record batch: Arrow IPC carries it to a
//! global phase elsewhere.

use std::sync::Arc;

use arrow::array::{ArrayRef, Int64Array, RecordBatch};
use arrow::datatypes::SchemaRef;
use tally_kernels::group_values::{GroupValues, new_group_values};

use crate::changelog::ChangeBatch;
use crate::error::{Error, Result};
use crate::operator::accumulators::Accumulators;
use crate::operator::keyed::{accumulator_schema, hash_keys, intern_hashed};
use crate::plan::{AggregatePlan, CalcBatch};

/// The local phase: folds rows into accumulator rows, one per key, and forgets them on flush.
#[derive(Debug)]
pub struct LocalGroupAggregate {
    plan: Arc<AggregatePlan>,
    groups: Box<dyn GroupValues>,
    state: Accumulators,
    count1: Vec<i64>,
    schema: SchemaRef,
    hashes: Vec<u64>,
    gids: Vec<u32>,
    /// Per group: the input rows it received since the last flush, kept only once a row
    /// retracted (until then they are `count1`, which counts the same rows).
    group_rows: Vec<u64>,
    /// Whether a retracting row was folded since the last flush.
    retracted: bool,
}

/// A flushed accumulator batch with, per row, its key's hash and the input rows it folds.
#[derive(Debug)]
pub(crate) struct Flushed {
    pub(crate) batch: RecordBatch,
    pub(crate) hashes: Vec<u64>,
    pub(crate) rows: Vec<u64>,
}

impl LocalGroupAggregate {
    /// A local phase for `plan`.
    ///
    /// # Errors
    /// When an accumulator cannot be built.
    pub fn try_new(plan: Arc<AggregatePlan>) -> Result<Self> {
        let state = Accumulators::try_new(&plan)?;
        let schema = accumulator_schema(&plan, &state);
        let groups = new_group_values(&plan.key_types)
            .map_err(|e| Error::plan(format!("group keys: {e}")))?;
        Ok(Self {
            plan,
            groups,
            state,
            count1: vec![],
            schema,
            hashes: vec![],
            gids: vec![],
            group_rows: vec![],
            retracted: false,
        })
    }

    /// The schema of the accumulator batches [`LocalGroupAggregate::flush`] emits.
    pub fn accumulator_schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    /// For each aggregate call in output order, the names of its accumulator columns in
    /// [`LocalGroupAggregate::accumulator_schema`].
    pub fn accumulator_names(&self) -> Vec<Vec<String>> {
        self.state.call_state_names()
    }

    /// Folds one record batch of the plan's record schema (its changelog column, if any, read
    /// as row kinds) into the accumulators.
    ///
    /// # Errors
    /// As [`LocalGroupAggregate::push_changes`]; a batch of another schema.
    pub fn push(&mut self, batch: &RecordBatch) -> Result<()> {
        let changes = self.plan.to_changes(batch)?;
        self.push_changes(&changes)
    }

    /// Folds one batch of changes into the accumulators.
    ///
    /// # Errors
    /// Rows of another schema, bad row kinds, an expression failing on the data.
    pub fn push_changes(&mut self, changes: &ChangeBatch) -> Result<()> {
        self.plan.check_input(changes)?;
        let n = changes.num_rows();
        if n == 0 {
            return Ok(());
        }
        let cb = self.plan.calc.evaluate(changes)?;
        let mut hashes = std::mem::take(&mut self.hashes);
        let result =
            hash_keys(&cb.keys, n, &mut hashes).and_then(|()| self.push_evaluated(&cb, &hashes));
        self.hashes = hashes;
        result
    }

    /// Folds rows already evaluated and hashed (`hashes[r]` is row `r`'s key hash).
    pub(crate) fn push_evaluated(&mut self, cb: &CalcBatch, hashes: &[u64]) -> Result<()> {
        let n = cb.num_rows;
        if n == 0 {
            return Ok(());
        }
        intern_hashed(self.groups.as_mut(), &cb.keys, hashes, &mut self.gids)?;
        let total = self.groups.len();
        self.count1.resize(total, 0);
        match &cb.retract {
            Some(retract) if retract.count_set_bits() > 0 => {
                if !self.retracted {
                    // Until now every row accumulated: each group's rows are its count.
                    self.group_rows.clear();
                    self.group_rows
                        .extend(self.count1.iter().map(|&c| c as u64));
                    self.retracted = true;
                }
                self.group_rows.resize(total, 0);
                for (r, &g) in self.gids.iter().enumerate() {
                    self.count1[g as usize] += if retract.value(r) { -1 } else { 1 };
                    self.group_rows[g as usize] += 1;
                }
                let acc = !retract;
                self.state
                    .apply(cb, &self.gids, Some(&acc), Some(retract), total)?;
            }
            _ => {
                for &g in &self.gids {
                    self.count1[g as usize] += 1;
                }
                if self.retracted {
                    self.group_rows.resize(total, 0);
                    for &g in &self.gids {
                        self.group_rows[g as usize] += 1;
                    }
                }
                self.state.apply(cb, &self.gids, None, None, total)?;
            }
        }
        Ok(())
    }

    /// Keys folded since the last flush.
    pub fn keys(&self) -> usize {
        self.groups.len()
    }

    /// Bytes held by the keys and accumulators folded since the last flush.
    pub fn size(&self) -> usize {
        self.groups.size()
            + self.state.size()
            + (self.count1.capacity() + self.group_rows.capacity()) * 8
    }

    /// Emits one accumulator row per key folded since the last flush (None if there was none)
    /// and starts afresh.
    ///
    /// # Errors
    /// When the state cannot be represented (a bug).
    pub fn flush(&mut self) -> Result<Option<RecordBatch>> {
        Ok(self.flush_parts()?.map(|f| f.batch))
    }

    /// [`LocalGroupAggregate::flush`], with each row's key hash and input row count.
    pub(crate) fn flush_parts(&mut self) -> Result<Option<Flushed>> {
        let n = self.groups.len();
        if n == 0 {
            return Ok(None);
        }
        let ids: Vec<u32> = (0..n as u32).collect();
        let mut cols: Vec<ArrayRef> = self.groups.keys(&ids)?;
        cols.extend(self.state.state(&ids)?);
        let rows = if std::mem::take(&mut self.retracted) {
            std::mem::take(&mut self.group_rows)
        } else {
            self.count1.iter().map(|&c| c as u64).collect()
        };
        cols.push(Arc::new(Int64Array::from(std::mem::take(&mut self.count1))));
        let batch = RecordBatch::try_new(Arc::clone(&self.schema), cols)
            .map_err(|e| Error::internal(format!("accumulator batch: {e}")))?;
        let hashes = self.groups.hashes().to_vec();
        self.groups.clear();
        // The next mini-batch starts from group 0 again, in the same allocations.
        self.state.clear(n);
        Ok(Some(Flushed {
            batch,
            hashes,
            rows,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::StringArray;
    use arrow::datatypes::{DataType, Field, Schema};
    use datafusion_expr::col;

    /// The input rows each flushed key folded: every row, accumulating or retracting, before
    /// and after the first retraction of a mini-batch and in the next one.
    #[test]
    fn a_flush_counts_each_keys_rows() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("op", DataType::Utf8, false),
        ]));
        let plan = AggregatePlan::try_new(
            Arc::clone(&schema),
            &[col("k")],
            &[crate::aggregates::count_star()],
            None,
        )
        .unwrap();
        let mut local = LocalGroupAggregate::try_new(Arc::new(plan)).unwrap();
        let batch = |keys: Vec<i64>, ops: Vec<&str>| {
            let cols: Vec<ArrayRef> = vec![
                Arc::new(Int64Array::from(keys)),
                Arc::new(StringArray::from(ops)),
            ];
            RecordBatch::try_new(Arc::clone(&schema), cols).unwrap()
        };
        let rows_of = |f: Flushed| -> Vec<u64> { f.rows };
        local
            .push(&batch(vec![1, 2, 1], vec!["+I", "+I", "+I"]))
            .unwrap();
        local.push(&batch(vec![1, 3], vec!["-D", "+I"])).unwrap();
        local.push(&batch(vec![2, 3], vec!["+I", "+I"])).unwrap();
        // Keys in first-seen order: 1, 2, 3.
        assert_eq!(
            rows_of(local.flush_parts().unwrap().unwrap()),
            vec![3, 2, 2]
        );
        local
            .push(&batch(vec![3, 3, 2], vec!["+I", "+I", "+I"]))
            .unwrap();
        assert_eq!(rows_of(local.flush_parts().unwrap().unwrap()), vec![2, 1]);
        local.push(&batch(vec![2], vec!["-D"])).unwrap();
        assert_eq!(rows_of(local.flush_parts().unwrap().unwrap()), vec![1]);
    }
}
