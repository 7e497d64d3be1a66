//! The aggregate stage: a [`ParallelAggregate`] as a stage, its input the upstream's changes,
//! its output the aggregate's changelog.

use std::collections::BTreeSet;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;

use super::Stage;
use crate::changelog::ChangeBatch;
use crate::error::Result;
use crate::operator::{AggregateMetrics, ParallelAggregate};
use crate::runtime::Runtime;

/// A [`ParallelAggregate`] as a stage: its input is the upstream's changes (the aggregate's
/// plan names the data columns and whether they carry row kinds), its output the aggregate's
/// changelog.
#[derive(Debug)]
pub struct AggregateStage {
    agg: ParallelAggregate,
}

impl AggregateStage {
    /// Wraps `agg`.
    pub fn new(agg: ParallelAggregate) -> Self {
        Self { agg }
    }

    /// The aggregate.
    pub fn aggregate(&self) -> &ParallelAggregate {
        &self.agg
    }
}

impl Stage for AggregateStage {
    fn push(&mut self, slices: Vec<ChangeBatch>, _runtime: &Runtime) -> Result<Vec<ChangeBatch>> {
        self.agg.push_slices(slices)
    }

    fn finish(&mut self, _runtime: &Runtime) -> Result<Vec<ChangeBatch>> {
        self.agg.finish()
    }

    fn metrics(&self) -> Result<Option<AggregateMetrics>> {
        self.agg.metrics().map(Some)
    }

    fn as_aggregate(&self) -> Option<&ParallelAggregate> {
        Some(&self.agg)
    }

    fn columns_read(&self) -> Option<BTreeSet<usize>> {
        Some(self.agg.plan().calc.columns_read())
    }

    fn as_aggregate_mut(&mut self) -> Option<&mut ParallelAggregate> {
        Some(&mut self.agg)
    }

    fn keeps_state(&self) -> bool {
        true
    }

    fn drop_update_before(&mut self) -> Result<()> {
        self.agg.set_emit_update_before(false);
        Ok(())
    }

    fn set_min_slice_rows(&mut self, rows: usize) {
        self.agg.set_min_slice_rows(rows);
    }

    fn snapshot(&self) -> Result<Option<(SchemaRef, Vec<RecordBatch>)>> {
        Ok(Some((self.agg.snapshot_schema(), self.agg.snapshot()?)))
    }

    fn restore(&mut self, batches: &[RecordBatch]) -> Result<()> {
        self.agg.restore_snapshot(batches)
    }
}
