//! The FINAL aggregate of split-distinct behind Flink's `IncrementalGroupAggregate`.
//!
//! With split-distinct and two phases Flink fuses the PARTIAL aggregate's global phase and the
//! FINAL aggregate's local phase into one operator (`MiniBatchIncrementalGroupAggFunction`): each
//! bundle of the PARTIAL becomes, per FINAL key, one row of *delta* accumulators (for
//! `COUNT(DISTINCT x)`: the distinct values the bundle added to the key, less those it removed),
//! which the FINAL's global phase merges. The FINAL therefore sees one change per key and bundle,
//! never the PARTIAL's `-U` apart from its `+U`.
//!
//! [`IncrementalAggregate`] is that FINAL: it takes the PARTIAL's changes one firing (one
//! worker's mini-batch) at a time, folds each firing whole into delta accumulator rows (a
//! [`LocalGroupAggregate`] without a trigger of its own: the delta of every FINAL key the firing
//! touched, counts negative where it retracted), and merges them into a global phase
//! ([`GroupAggregate::try_new_global`]) that fires on the mini-batch size and latency as Flink's
//! global aggregate does, counting delta rows. The FINAL keeps only its own state: one row of
//! accumulators per key.
//!
//! With several workers the global phase is cut into one shard per worker
//! ([`IncrementalAggregate::try_new_sharded`]), as Flink runs its global aggregate in parallel
//! tasks keyed by the FINAL's keys: each delta row goes to the shard of its key's key group,
//! the shards merge what a push holds side by side on the runtime's workers, and each fires on
//! its own count of delta rows. A key's changes keep their order; the FINAL is no serial step.
//!
//! Where a key has exactly one PARTIAL row, its results are the FINAL's, and the FINAL reads
//! them through instead ([`crate::operator::read_through`]): every key on one worker, or on
//! several, where only hot keys are spread, every cold key (`reading.rs`, `folds.rs`), the
//! workers then merging their cold keys' changes over the FINAL's mini-batch
//! (`coalesce.rs`).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arrow::array::{RecordBatch, UInt32Array};
use arrow::compute::take_record_batch;
use arrow::datatypes::SchemaRef;

use crate::changelog::ChangeBatch;
use crate::clock::Clock;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::operator::exchange::{MIN_SLICE_ROWS, partition, route_snapshots};
use crate::operator::key_groups::KeyGroups;
use crate::operator::metrics::{AggregateStep, Metrics, skew_ratio};
use crate::operator::read_through::{ColdThrough, ReadThrough};
use crate::operator::{
    AggregateMetrics, GroupAggregate, LocalGroupAggregate, StageMetrics, WorkerMetrics, hash_keys,
};
use crate::plan::AggregatePlan;
use crate::runtime::Runtime;

mod coalesce;
mod folds;
mod reading;

pub use folds::{ColdFold, DeltaFold, ThroughFold};

/// The FINAL aggregate of split-distinct under Flink's incremental aggregate (see the module
/// docs): delta accumulators per PARTIAL firing, merged by a global phase in one shard per
/// worker.
#[derive(Debug)]
pub struct IncrementalAggregate {
    plan: Arc<AggregatePlan>,
    fold: DeltaFold,
    /// The global phase, one shard per worker of the FINAL: each key's delta rows go to the
    /// shard of its key group, and the shards merge a push's rows side by side.
    shards: Vec<Shard>,
    key_groups: KeyGroups,
    /// The merge's counters, for EXPLAIN ANALYZE (the fold's are in `fold`).
    merge: StageMetrics,
    /// Set where every key has one PARTIAL row ([`IncrementalAggregate::read_through`]): the
    /// firings are projected onto the output instead of folded and merged.
    through: Option<ReadThrough>,
    /// Set where every cold key has one PARTIAL row ([`IncrementalAggregate::read_cold_through`]):
    /// the cold keys' rows of each firing are projected onto the output, the hot keys' folded
    /// and merged.
    cold: Option<ColdThrough>,
    /// Set where each PARTIAL worker holds one group per FINAL key
    /// ([`IncrementalAggregate::fold_rows_as_keys`]).
    rows_are_keys: bool,
}

/// One shard of the FINAL's global phase, with the delta rows it merged and the time it took.
#[derive(Debug)]
struct Shard {
    agg: GroupAggregate,
    rows: u64,
    busy: Duration,
}

/// One shard's rows of one batch of delta rows: the batch's index in the push, the rows (all
/// of them where `None`), and their key hashes.
struct Part {
    batch: usize,
    rows: Option<UInt32Array>,
    hashes: Vec<u64>,
}

impl IncrementalAggregate {
    /// The FINAL aggregate `plan` (over the PARTIAL's changes) under `config`'s mini-batch
    /// trigger and `clock`.
    ///
    /// # Errors
    /// Mini-batch off, and as [`GroupAggregate::try_new_global`].
    pub fn try_new(
        plan: Arc<AggregatePlan>,
        config: Config,
        clock: Arc<dyn Clock>,
    ) -> Result<Self> {
        Self::try_new_sharded(plan, config, clock, KeyGroups::new(1, 1)?)
    }

    /// As [`IncrementalAggregate::try_new`], with the global phase cut into one shard per
    /// worker of `key_groups` (the FINAL's parallelism): each key's delta rows go to the shard
    /// of its key group, each shard fires on its own mini-batch size and latency (as Flink's
    /// global aggregate does per task), and the shards merge a push's rows side by side on the
    /// runtime's workers ([`IncrementalAggregate::push`]).
    ///
    /// # Errors
    /// As [`IncrementalAggregate::try_new`].
    pub fn try_new_sharded(
        plan: Arc<AggregatePlan>,
        config: Config,
        clock: Arc<dyn Clock>,
        key_groups: KeyGroups,
    ) -> Result<Self> {
        let s = key_groups.workers();
        let shards = (0..s)
            .map(|_| {
                let agg = GroupAggregate::try_new_global(
                    Arc::clone(&plan),
                    config.clone(),
                    Arc::clone(&clock),
                )?;
                Ok(Shard {
                    agg,
                    rows: 0,
                    busy: Duration::ZERO,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            plan: Arc::clone(&plan),
            fold: DeltaFold {
                deltas: LocalGroupAggregate::try_new(Arc::clone(&plan))?,
                partial_output: Arc::clone(&plan.input_schema),
                rows_are_keys: false,
                metrics: Arc::new(Mutex::new(StageMetrics::new(
                    AggregateStep::LocalGroupAggregate,
                ))),
            },
            shards,
            key_groups,
            merge: StageMetrics::new(AggregateStep::GlobalGroupAggregate),
            through: None,
            cold: None,
            rows_are_keys: false,
        })
    }

    /// The resolved FINAL aggregate.
    pub fn plan(&self) -> &AggregatePlan {
        &self.plan
    }

    /// The resolved FINAL aggregate, shared (to build its phases elsewhere: the Flink
    /// operator runs the fold and the merge in two tasks).
    pub fn shared_plan(&self) -> Arc<AggregatePlan> {
        Arc::clone(&self.plan)
    }

    /// The configuration the global phase fires under.
    pub fn config(&self) -> &Config {
        self.shards[0].agg.config()
    }

    /// Takes the PARTIAL's changes, each batch one firing of one of its workers, in order:
    /// each becomes one delta row per FINAL key it touched, merged into the global phase (the
    /// shards side by side on `runtime`'s workers, each taking its keys' rows of every firing in
    /// order). A batch of delta rows (of [`DeltaFold::delta_schema`], a firing folded by its
    /// worker with [`IncrementalAggregate::fold_factory`]) is merged as it is. Returns the
    /// changes of the mini-batches that became due, shard by shard.
    ///
    /// # Errors
    /// A batch of another schema, and as [`GroupAggregate::push_accumulators`].
    pub fn push(&mut self, firings: &[ChangeBatch], runtime: &Runtime) -> Result<Vec<ChangeBatch>> {
        if let Some(through) = &self.through {
            let mut fold = ThroughFold {
                through: through.clone(),
                metrics: Arc::clone(&self.fold.metrics),
            };
            let mut out = vec![];
            for firing in firings {
                if firing.data.schema() == *through.output() {
                    out.push(firing.clone());
                } else {
                    out.extend(fold.fold(firing)?);
                }
            }
            return Ok(out);
        }
        let delta_schema = self.fold.delta_schema();
        let mut deltas = Vec::with_capacity(firings.len());
        // Where the cold keys are read through, their changes go first, in firing order; the
        // merge's of the hot keys follow.
        let mut out = vec![];
        for firing in firings {
            let folded = firing.op.is_none() && firing.data.schema() == delta_schema;
            if folded {
                deltas.push(firing.data.clone());
                continue;
            }
            let Some(cold) = &self.cold else {
                deltas.extend(self.fold.fold(firing)?);
                continue;
            };
            if firing.data.schema() == *cold.output() {
                out.push(firing.clone());
                continue;
            }
            // A firing not folded on its worker: its cold keys' changes go as they are.
            let (through, folded) = folds::fold_cold(cold, &mut self.fold, firing, None)?;
            out.extend(through.map(|cold| cold.changes));
            deltas.extend(folded);
        }
        if deltas.is_empty() {
            return Ok(out);
        }
        let start = Instant::now();
        let rows: usize = deltas.iter().map(RecordBatch::num_rows).sum();
        let changes = self.merge_deltas(&deltas, rows, runtime)?;
        self.count_merge(rows, &changes, start.elapsed());
        out.extend(changes);
        Ok(out)
    }

    /// Merges `deltas` (`total` rows) in order: with one shard as they are; with several, each
    /// shard takes its rows of each batch (cut by key hash, hashed once), the shards side by
    /// side.
    fn merge_deltas(
        &mut self,
        deltas: &[RecordBatch],
        total: usize,
        runtime: &Runtime,
    ) -> Result<Vec<ChangeBatch>> {
        if let [shard] = &mut self.shards[..] {
            let start = Instant::now();
            let mut out = vec![];
            for d in deltas {
                out.extend(shard.agg.push_accumulators(d)?);
            }
            shard.rows += total as u64;
            shard.busy += start.elapsed();
            return Ok(out);
        }
        // Each row is hashed once, here; the shards cut their rows out themselves, side by side.
        let k = self.plan.key_types.len();
        let mut parts: Vec<Vec<Part>> = (0..self.shards.len()).map(|_| vec![]).collect();
        let mut hashes = vec![];
        for (i, d) in deltas.iter().enumerate() {
            hash_keys(&d.columns()[..k], d.num_rows(), &mut hashes)?;
            for (w, rows) in partition(&hashes, &self.key_groups).into_iter().enumerate() {
                if rows.is_empty() {
                    continue;
                }
                let part_hashes = rows.iter().map(|&r| hashes[r as usize]).collect();
                let rows = (rows.len() < d.num_rows()).then(|| UInt32Array::from(rows));
                parts[w].push(Part {
                    batch: i,
                    rows,
                    hashes: part_hashes,
                });
            }
        }
        let tasks: Vec<(&mut Shard, Vec<Part>)> = self.shards.iter_mut().zip(parts).collect();
        let merge = |(shard, parts): (&mut Shard, Vec<Part>)| -> Result<Vec<ChangeBatch>> {
            let start = Instant::now();
            // A shard the push holds no rows for still fires on the latency, as each task of
            // Flink's global aggregate does at a mini-batch's marker.
            let mut out = if parts.is_empty() {
                shard.agg.fire_if_late()?
            } else {
                vec![]
            };
            for part in &parts {
                let batch = &deltas[part.batch];
                let taken;
                let batch = match &part.rows {
                    Some(idx) => {
                        taken = take_record_batch(batch, idx)?;
                        &taken
                    }
                    None => batch,
                };
                out.extend(shard.agg.push_accumulators_hashed(batch, &part.hashes)?);
                shard.rows += batch.num_rows() as u64;
            }
            shard.busy += start.elapsed();
            Ok(out)
        };
        // A push of few rows is not worth the pool's tasks: the shards take it in turn.
        let results: Vec<Result<Vec<ChangeBatch>>> = if total < MIN_SLICE_ROWS {
            tasks.into_iter().map(merge).collect()
        } else {
            runtime.map(tasks, merge)
        };
        let mut out = vec![];
        for r in results {
            out.extend(r?);
        }
        Ok(out)
    }

    fn count_merge(&mut self, rows_in: usize, changes: &[ChangeBatch], busy: Duration) {
        self.merge.rows_in += rows_in as u64;
        self.merge.rows_out += changes.iter().map(|c| c.num_rows() as u64).sum::<u64>();
        self.merge.batches += 1;
        self.merge.busy += busy;
    }

    /// End of input: fires every shard's pending mini-batch, shard by shard.
    ///
    /// # Errors
    /// As [`GroupAggregate::finish`].
    pub fn finish(&mut self, runtime: &Runtime) -> Result<Vec<ChangeBatch>> {
        if self.through.is_some() {
            return Ok(vec![]);
        }
        let start = Instant::now();
        let results = runtime.map(self.shards.iter_mut().collect(), |s: &mut Shard| {
            s.agg.finish()
        });
        let mut changes = vec![];
        for r in results {
            changes.extend(r?);
        }
        self.count_merge(0, &changes, start.elapsed());
        Ok(changes)
    }

    /// Switches the `-U` rows off (for an upsert consumer keyed by the group keys).
    pub fn drop_update_before(&mut self) {
        for shard in &mut self.shards {
            shard.agg.set_emit_update_before(false);
        }
    }

    /// The FINAL's metrics: the fold into deltas as its local step, the merge as its global
    /// step (a worker per shard).
    pub fn metrics(&self) -> AggregateMetrics {
        let fold = self
            .fold
            .metrics
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let workers: Vec<WorkerMetrics> = self
            .shards
            .iter()
            .map(|shard| WorkerMetrics {
                rows_received: shard.rows,
                input_rows: shard.rows,
                busy: shard.busy,
                operator: shard.agg.metrics(),
            })
            .collect();
        let sum = |f: fn(&Metrics) -> u64| workers.iter().map(|w| f(&w.operator)).sum::<u64>();
        AggregateMetrics {
            parallelism: self.shards.len(),
            key_groups: self.key_groups.count(),
            two_phase: true,
            rows_in: fold.rows_in,
            rows_out: if self.through.is_some() {
                fold.rows_out
            } else {
                sum(|m| m.rows_out)
            },
            mini_batches: workers
                .iter()
                .map(|w| w.operator.mini_batches)
                .max()
                .unwrap_or(0),
            stages: vec![fold.clone(), self.merge.clone()],
            skew_ratio: skew_ratio(&workers),
            keys_in_state: sum(|m| m.keys_in_state),
            state_bytes: sum(|m| m.state_bytes),
            peak_state_bytes: sum(|m| m.peak_state_bytes),
            dropped_retractions: sum(|m| m.dropped_retractions),
            compactions: sum(|m| m.compactions),
            distinct_pairs: sum(|m| m.distinct_pairs),
            distinct_bytes: sum(|m| m.distinct_bytes),
            reads_through: self.through.is_some(),
            reads_cold_through: self.cold.is_some(),
            spread_keys: None,
            workers,
            ..AggregateMetrics::default()
        }
    }

    /// The schema of [`IncrementalAggregate::snapshot`]'s batches (a FINAL aggregate's, on any
    /// runtime).
    pub fn snapshot_schema(&self) -> SchemaRef {
        self.shards[0].agg.snapshot_schema()
    }

    /// The FINAL's state, one row per key.
    ///
    /// # Errors
    /// A mini-batch still pending.
    pub fn snapshot(&self) -> Result<Vec<RecordBatch>> {
        if self.through.is_some() || self.cold.is_some() {
            return Err(Error::invalid_input(
                "cannot snapshot a split-distinct FINAL that read its PARTIAL through (a run without checkpoints): set the checkpoints before the run",
            ));
        }
        let mut out = vec![];
        for shard in &self.shards {
            out.extend(shard.agg.snapshot()?);
        }
        Ok(out)
    }

    /// Loads state made by [`IncrementalAggregate::snapshot`] (or by the FINAL aggregate of the
    /// same query without the incremental aggregate), of any number of shards: each key goes to
    /// the shard of its key group.
    ///
    /// # Errors
    /// State of another query.
    pub fn restore_snapshot(&mut self, batches: &[RecordBatch]) -> Result<()> {
        let parts = route_snapshots(batches, self.plan.key_types.len(), &self.key_groups)?;
        for (shard, parts) in self.shards.iter_mut().zip(parts) {
            shard.agg.restore_hashed(&parts)?;
        }
        Ok(())
    }
}
