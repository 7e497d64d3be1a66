//! The folds of a split-distinct FINAL that run on the PARTIAL's workers, one per worker, each
//! taking that worker's firings as they are fired (Flink's `IncrementalGroupAggregate` runs in
//! the PARTIAL's tasks): into delta rows ([`DeltaFold`]), read through ([`ThroughFold`]), or
//! both, by key ([`ColdFold`]).

use std::sync::{Arc, Mutex};
use std::time::Instant;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;

use super::coalesce::Coalescer;
use crate::changelog::ChangeBatch;
use crate::error::Result;
use crate::operator::deltas;
use crate::operator::keyed::KeyHashes;
use crate::operator::pipelined::FoldFirings;
use crate::operator::read_through::{ColdChanges, ColdThrough, ReadThrough, SplitFiring};
use crate::operator::{LocalGroupAggregate, StageMetrics};

/// The fold of the PARTIAL's firings into delta rows: each firing becomes one row of delta
/// accumulators per FINAL key it touched. Stateless between firings, so any worker of the
/// PARTIAL can fold its own firings ([`IncrementalAggregate::fold_factory`](super::IncrementalAggregate::fold_factory)), as Flink's
/// `IncrementalGroupAggregate` does in the PARTIAL's tasks; their counters add up in one place.
#[derive(Debug)]
pub struct DeltaFold {
    pub(super) deltas: LocalGroupAggregate,
    /// The PARTIAL's output schema (the FINAL's input), to know its delta rows.
    pub(super) partial_output: SchemaRef,
    /// Whether a firing's delta rows hold each FINAL key once: each is then its key's delta
    /// accumulator row as it is (`LocalGroupAggregate::deltas_as_groups`), no key interned.
    pub(super) rows_are_keys: bool,
    pub(super) metrics: Arc<Mutex<StageMetrics>>,
}

impl DeltaFold {
    /// One firing's delta accumulator rows (none for an empty firing): the firing is the
    /// PARTIAL's changes, or its delta rows where its worker emits them
    /// ([`crate::operator::deltas`]).
    ///
    /// # Errors
    /// A batch of another schema than the PARTIAL's output (or its delta rows').
    pub fn fold(&mut self, firing: &ChangeBatch) -> Result<Option<RecordBatch>> {
        if firing.num_rows() == 0 {
            return Ok(None);
        }
        let start = Instant::now();
        let deltas = match deltas::split(firing, &self.partial_output) {
            Some((rows, keys_delta)) if self.rows_are_keys => {
                self.deltas.deltas_as_groups(&rows, keys_delta.values())?
            }
            Some((rows, keys_delta)) => {
                self.deltas.push_deltas(&rows, keys_delta.values())?;
                self.deltas.flush()?
            }
            None => {
                self.deltas.push_changes(firing)?;
                self.deltas.flush()?
            }
        };
        count_firing(
            &self.metrics,
            firing,
            deltas.as_ref().map(|d| d.num_rows()),
            start,
        );
        Ok(deltas)
    }

    /// The schema of the delta rows.
    pub fn delta_schema(&self) -> SchemaRef {
        self.deltas.accumulator_schema()
    }
}

/// A worker's projection of its firings where the FINAL reads its PARTIAL through
/// ([`IncrementalAggregate::through_factory`](super::IncrementalAggregate::through_factory)), counted with the fold's counters.
#[derive(Debug, Clone)]
pub struct ThroughFold {
    pub(super) through: ReadThrough,
    pub(super) metrics: Arc<Mutex<StageMetrics>>,
}

impl ThroughFold {
    /// One firing of the PARTIAL as the FINAL's changes ([`ReadThrough::read`]).
    ///
    /// # Errors
    /// As [`ReadThrough::read`].
    pub fn fold(&mut self, firing: &ChangeBatch) -> Result<Option<ChangeBatch>> {
        let start = Instant::now();
        let out = self.through.read(firing)?;
        count_firing(
            &self.metrics,
            firing,
            out.as_ref().map(|d| d.num_rows()),
            start,
        );
        Ok(out)
    }
}

/// A worker's fold of its firings where the FINAL reads its cold keys through
/// ([`IncrementalAggregate::cold_factory`](super::IncrementalAggregate::cold_factory)): the
/// cold keys' rows projected onto the FINAL's output and merged per key over the FINAL's
/// mini-batch (`coalesce.rs`), the hot keys' rows folded into delta rows, both counted with the
/// fold's counters.
#[derive(Debug)]
pub struct ColdFold {
    pub(super) cold: ColdThrough,
    pub(super) deltas: DeltaFold,
    pub(super) held: Coalescer,
}

impl FoldFirings for ColdFold {
    /// One firing of the PARTIAL as the FINAL's merged changes of its cold keys, where the
    /// mini-batch of them came due (first), and the delta rows of its hot keys (then; a batch
    /// of inserts of [`DeltaFold::delta_schema`]).
    fn fold_firing(&mut self, firing: ChangeBatch) -> Result<Vec<ChangeBatch>> {
        self.fold_cold_firing(firing, None)
    }

    fn takes_key_hashes(&self) -> bool {
        true
    }

    fn fold_hashed_firing(
        &mut self,
        firing: ChangeBatch,
        hashes: KeyHashes,
    ) -> Result<Vec<ChangeBatch>> {
        self.fold_cold_firing(firing, Some(hashes))
    }

    fn flush(&mut self) -> Result<Vec<ChangeBatch>> {
        Ok(self.held.flush()?.into_iter().collect())
    }
}

impl ColdFold {
    /// [`FoldFirings::fold_firing`], with the firing's key hashes where its worker handed them
    /// on.
    fn fold_cold_firing(
        &mut self,
        firing: ChangeBatch,
        hashes: Option<KeyHashes>,
    ) -> Result<Vec<ChangeBatch>> {
        let (through, folded) = fold_cold(&self.cold, &mut self.deltas, &firing, hashes)?;
        let merged = match through {
            Some(cold) => self.held.push(cold.changes, &cold.hashes)?,
            None => None,
        };
        Ok(merged
            .into_iter()
            .chain(folded.map(ChangeBatch::inserts))
            .collect())
    }
}

impl FoldFirings for DeltaFold {
    fn fold_firing(&mut self, firing: ChangeBatch) -> Result<Vec<ChangeBatch>> {
        Ok(self
            .fold(&firing)?
            .map(ChangeBatch::inserts)
            .into_iter()
            .collect())
    }
}

impl FoldFirings for ThroughFold {
    fn fold_firing(&mut self, firing: ChangeBatch) -> Result<Vec<ChangeBatch>> {
        Ok(self.fold(&firing)?.into_iter().collect())
    }
}

/// One firing cut by `cold`: its cold keys' rows read through (with their keys' hashes), and
/// its hot keys' delta rows (`deltas` folds them); `hashes`, where known, are the firing's key
/// hashes ([`ColdThrough::split_hashed`]).
pub(super) fn fold_cold(
    cold: &ColdThrough,
    deltas: &mut DeltaFold,
    firing: &ChangeBatch,
    hashes: Option<KeyHashes>,
) -> Result<(Option<ColdChanges>, Option<RecordBatch>)> {
    let start = Instant::now();
    let SplitFiring { through, hot } = cold.split_hashed(firing, hashes)?;
    let cut = start.elapsed();
    // The hot keys' rows are a firing of the delta fold, which counts them; the cold keys' rows
    // and the cut are counted here.
    let folded = match &hot {
        Some(hot) => deltas.fold(hot)?,
        None => None,
    };
    let cold_rows = firing.num_rows() - hot.as_ref().map_or(0, ChangeBatch::num_rows);
    {
        let mut m = deltas.metrics.lock().unwrap_or_else(|e| e.into_inner());
        m.rows_in += cold_rows as u64;
        m.rows_out += through.as_ref().map_or(0, |c| c.changes.num_rows()) as u64;
        m.busy += cut;
        if hot.is_none() {
            m.batches += 1;
        }
    }
    Ok((through, folded))
}

/// Counts one firing taken since `start` in a fold's counters: its rows, and the rows it made.
pub(super) fn count_firing(
    metrics: &Mutex<StageMetrics>,
    firing: &ChangeBatch,
    made: Option<usize>,
    start: Instant,
) {
    let busy = start.elapsed();
    let mut m = metrics.lock().unwrap_or_else(|e| e.into_inner());
    m.rows_in += firing.num_rows() as u64;
    m.rows_out += made.unwrap_or(0) as u64;
    m.batches += 1;
    m.busy += busy;
}
