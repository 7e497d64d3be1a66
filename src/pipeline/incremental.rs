//! The FINAL aggregate of split-distinct under Flink's incremental aggregate, as a stage.

use std::collections::BTreeSet;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;

use super::{FoldFactory, Stage};
use crate::changelog::ChangeBatch;
use crate::error::Result;
use crate::operator::pipelined::FiringFold;
use crate::operator::{AggregateMetrics, IncrementalAggregate};
use crate::runtime::Runtime;

/// An [`IncrementalAggregate`] as a stage: its input is the PARTIAL aggregate's changes, one
/// batch per firing of one of its workers (as both runtimes hand them on), its output the
/// FINAL's changelog.
#[derive(Debug)]
pub struct IncrementalStage {
    agg: IncrementalAggregate,
}

impl IncrementalStage {
    /// Wraps `agg`.
    pub fn new(agg: IncrementalAggregate) -> Self {
        Self { agg }
    }
}

impl Stage for IncrementalStage {
    fn push(&mut self, firings: Vec<ChangeBatch>, runtime: &Runtime) -> Result<Vec<ChangeBatch>> {
        self.agg.push(&firings, runtime)
    }

    fn finish(&mut self, runtime: &Runtime) -> Result<Vec<ChangeBatch>> {
        self.agg.finish(runtime)
    }

    fn metrics(&self) -> Result<Option<AggregateMetrics>> {
        Ok(Some(self.agg.metrics()))
    }

    fn columns_read(&self) -> Option<BTreeSet<usize>> {
        Some(self.agg.plan().calc.columns_read())
    }

    /// Each worker of the PARTIAL folds its own firings into delta rows (Flink's
    /// `IncrementalGroupAggregate` in the PARTIAL's tasks); the merge stays here. Where the
    /// FINAL reads the PARTIAL through, each worker projects its firings instead; where it reads
    /// the cold keys through, each worker projects those and folds the hot keys' rows.
    fn firing_fold(&self) -> Option<FoldFactory> {
        if let Some(make) = self.agg.through_factory() {
            return Some(Box::new(move || Ok(Box::new(make()) as FiringFold)));
        }
        if let Some(make) = self.agg.cold_factory() {
            return Some(Box::new(move || Ok(Box::new(make()?) as FiringFold)));
        }
        let make = self.agg.fold_factory();
        Some(Box::new(move || Ok(Box::new(make()?) as FiringFold)))
    }

    fn as_incremental(&self) -> Option<&IncrementalAggregate> {
        Some(&self.agg)
    }

    fn as_incremental_mut(&mut self) -> Option<&mut IncrementalAggregate> {
        Some(&mut self.agg)
    }

    fn keeps_state(&self) -> bool {
        true
    }

    fn drop_update_before(&mut self) -> Result<()> {
        self.agg.drop_update_before();
        Ok(())
    }

    fn snapshot(&self) -> Result<Option<(SchemaRef, Vec<RecordBatch>)>> {
        Ok(Some((self.agg.snapshot_schema(), self.agg.snapshot()?)))
    }

    fn restore(&mut self, batches: &[RecordBatch]) -> Result<()> {
        self.agg.restore_snapshot(batches)
    }
}
