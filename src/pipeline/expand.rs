//! Flink's `Expand`: every row once per group set of a split-distinct aggregate.

use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch, RecordBatchOptions};
use arrow::datatypes::SchemaRef;

use super::Stage;
use crate::changelog::ChangeBatch;
use crate::error::Result;
use crate::runtime::Runtime;

/// Flink's `Expand` for split-distinct aggregation over several bucketed argument sets: every
/// input row is emitted once per group set, with the bucket columns outside that set NULL and a
/// last `$e` (Int64) column holding the set's id. Row kinds pass through.
#[derive(Debug)]
pub struct ExpandStage {
    /// Per group set: the columns it sets to NULL, and its id.
    sets: Vec<(Vec<usize>, i64)>,
    output: SchemaRef,
}

impl ExpandStage {
    /// An expand producing batches of `output` (the input's fields, then `$e`) for `sets`.
    pub fn new(sets: Vec<(Vec<usize>, i64)>, output: SchemaRef) -> Self {
        Self { sets, output }
    }

    fn expand(&self, batch: &ChangeBatch) -> Result<Vec<ChangeBatch>> {
        let n = batch.num_rows();
        self.sets
            .iter()
            .map(|(nulls, id)| {
                let mut cols: Vec<ArrayRef> = batch.data.columns().to_vec();
                for &c in nulls {
                    cols[c] = arrow::array::new_null_array(cols[c].data_type(), n);
                }
                cols.push(Arc::new(arrow::array::Int64Array::from(vec![*id; n])));
                Ok(ChangeBatch {
                    op: batch.op.clone(),
                    data: RecordBatch::try_new_with_options(
                        Arc::clone(&self.output),
                        cols,
                        &RecordBatchOptions::new().with_row_count(Some(n)),
                    )?,
                })
            })
            .collect()
    }
}

impl Stage for ExpandStage {
    fn push(&mut self, slices: Vec<ChangeBatch>, runtime: &Runtime) -> Result<Vec<ChangeBatch>> {
        let this = &*self;
        let mut out = Vec::with_capacity(slices.len() * self.sets.len());
        for r in runtime.map(slices, |s| this.expand(&s)) {
            out.extend(r?);
        }
        Ok(out)
    }

    fn finish(&mut self, _runtime: &Runtime) -> Result<Vec<ChangeBatch>> {
        Ok(vec![])
    }

    fn per_batch(&self) -> bool {
        true
    }

    fn map_batch(&self, batch: ChangeBatch) -> Result<Vec<ChangeBatch>> {
        self.expand(&batch)
    }
}
