//! Running a [`Pipeline`] on the pipelined runtime: whether it can, how its splits must cover
//! the input, and the run itself, with its checkpoints ([`Output`]).

use std::collections::BTreeSet;
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;

use super::{Pipeline, Stage, map_through, stage_entry};
use crate::changelog::ChangeBatch;
use crate::error::{Error, Result};
use crate::operator::ParallelAggregate;
use crate::operator::pipelined::{Delivery, FiringFold, InputOrder, chunk_rows};

/// What [`Pipeline::run_splits`] hands its caller, in order.
#[derive(Debug)]
pub enum Output {
    /// Changes of the last stage.
    Changes(ChangeBatch),
    /// A consistent state of the whole pipeline after `rows` input rows of this run (a prefix
    /// of it): every change before it has been delivered; `stages` as [`Pipeline::snapshot`]
    /// names them.
    Checkpoint {
        /// Input rows applied.
        rows: u64,
        /// Each stateful stage's state: its name, schema and batches.
        stages: Vec<(String, SchemaRef, Vec<RecordBatch>)>,
    },
}

/// Tells the per-batch stages `stages` (last to first) which output columns of the last no
/// later stage reads ([`Stage::leave_unread`]).
fn leave_unread(stages: &mut [Box<dyn Stage>], unread: &BTreeSet<usize>) {
    let mut unread = unread.clone();
    for stage in stages.iter_mut().rev() {
        match stage.leave_unread(&unread) {
            Some(before) => unread = before,
            None => break,
        }
    }
}

impl Pipeline {
    /// The aggregate the source feeds through per-batch stages (Calc, Expand), if the first
    /// other stage is one.
    fn first_aggregate(&self) -> Option<&ParallelAggregate> {
        self.stages
            .iter()
            .find(|s| !s.per_batch())
            .and_then(|s| s.as_aggregate())
    }

    /// How many splits the pipelined runtime reads the source in: P times
    /// `tally.exec.pipelined.splits-per-worker` of the aggregate the source feeds.
    pub fn splits(&self) -> usize {
        let per = self
            .first_aggregate()
            .map_or(1, |agg| agg.config().splits_per_worker);
        self.parallelism()
            .saturating_mul(usize::try_from(per).unwrap_or(1).max(1))
    }

    /// How the splits of the pipelined runtime must cover the input ([`InputOrder`]): chunks in
    /// turn for a changelog input (each key's rows in input order; a chunk is a mini-batch of
    /// the whole input, [`crate::operator::pipelined::chunk_rows`]), any split otherwise.
    pub fn input_order(&self) -> InputOrder {
        let changelog = self
            .first_aggregate()
            .is_some_and(|agg| agg.plan().changelog);
        match self.chunked_order() {
            Some(chunks) if changelog => chunks,
            _ => InputOrder::Any,
        }
    }

    /// The layout of chunks in turn for this pipeline's aggregate (a chunk is a mini-batch of the
    /// whole input, [`crate::operator::pipelined::chunk_rows`]), under which the rows applied at
    /// the end of a round are a prefix of the input (checkpoints need it); `None` without an
    /// aggregate.
    pub fn chunked_order(&self) -> Option<InputOrder> {
        let agg = self.first_aggregate()?;
        Some(InputOrder::Chunks(chunk_rows(
            usize::try_from(agg.config().mini_batch_size).unwrap_or(1),
            self.parallelism(),
        )))
    }

    /// Whether the pipeline can run on the pipelined runtime: its first stages are per-batch
    /// stages (Calc, Expand) feeding an aggregate with mini-batch on and `tally.exec.pipelined`.
    ///
    /// # Errors
    /// Why it cannot, in words.
    pub fn pipelined(&self) -> std::result::Result<(), String> {
        let Some(agg) = self.first_aggregate() else {
            return Err("no aggregate follows the Calc stages".into());
        };
        if !agg.config().pipelined {
            return Err("'tally.exec.pipelined' is false".into());
        }
        if !agg.config().mini_batch_enabled {
            return Err("mini-batch is off: rows are processed per record, in input order".into());
        }
        Ok(())
    }

    /// Runs the pipeline over `splits` of its input, laid out as `order` says (for a file,
    /// [`Pipeline::input_order`], or [`Pipeline::chunked_order`] with checkpoints), on the
    /// pipelined runtime ([`ParallelAggregate::run_splits_checkpointed`]): each split's task
    /// runs the per-batch stages (Calc, Expand) and the local phase on what it reads; the changes of the aggregate
    /// go through the later stages on the caller's thread, in order, and then to `deliver`.
    /// With `checkpoint_every`, at each of the aggregate's checkpoints the later stages fire
    /// what they hold and `deliver` gets every stage's state ([`Output::Checkpoint`]).
    /// Everything fires: at the end nothing is pending.
    ///
    /// # Errors
    /// A pipeline that cannot ([`Pipeline::pipelined`]), and the first error of a stage, a
    /// split, or `deliver`.
    pub fn run_splits(
        &mut self,
        splits: Vec<crate::operator::pipelined::Split>,
        order: InputOrder,
        checkpoint_every: Option<u64>,
        deliver: &mut dyn FnMut(Output) -> Result<()>,
    ) -> Result<()> {
        self.pipelined().map_err(|why| {
            Error::invalid_input(format!(
                "the pipelined runtime cannot run this pipeline: {why}"
            ))
        })?;
        let k = self
            .stages
            .iter()
            .position(|s| !s.per_batch())
            .ok_or_else(|| Error::internal("no aggregate stage"))?;
        let (before, rest) = self.stages.split_at_mut(k);
        let Some((aggregate, after)) = rest.split_first_mut() else {
            return Err(Error::internal("no aggregate stage"));
        };
        let agg = aggregate
            .as_aggregate_mut()
            .ok_or_else(|| Error::internal("no aggregate stage"))?;
        let agg_schema = agg.snapshot_schema();
        let incremental = after.first().is_some_and(|s| s.as_incremental().is_some());
        // A PARTIAL whose firings an incremental FINAL folds keys its workers' state by the
        // query's keys alone, the buckets only routing rows (one group per key and worker, not
        // per bucket). A run that takes checkpoints does so where its snapshots can cut that
        // state back into a group per bucket (`KeyedState::export_cut`, over insert-only
        // input), and state restored from one merges again; otherwise a hot key keeps a group
        // per bucket, and a cold one, whose buckets every runtime leaves NULL, one per key
        // (`AggregatePlan::leave_cold`).
        let checkpoints = checkpoint_every.is_some();
        agg.merge_buckets(incremental && (!checkpoints || agg.cuts_merged_state()))?;
        // On one such worker every key has one PARTIAL row, which the FINAL reads through in a
        // run without checkpoints (with them it keeps every key's state, which its checkpoints
        // hold), and the buckets route nowhere: nothing reads them, and the Calc leaves them
        // NULL. On several whose local phases route at the flush, only the rows that go around
        // the local phases read them: their sources compute them there (`BucketFill`).
        let one_row = agg.merges_buckets() && agg.parallelism() == 1;
        let unread = if one_row || agg.routes_at_flush() {
            agg.plan().bucket_columns_unread()
        } else {
            BTreeSet::new()
        };
        // On several, where only hot keys are spread, every cold key has one PARTIAL row too:
        // the FINAL reads those through and folds and merges the hot keys'.
        let hot = agg
            .plan()
            .bucket_keys
            .as_ref()
            .and_then(|b| b.hot.as_ref())
            .filter(|_| agg.merges_buckets() && !one_row && !checkpoints);
        let (through, cold_through) = match after.first_mut().and_then(|s| s.as_incremental_mut()) {
            Some(fin) => {
                // A worker holding one group per key fires each key once: its delta rows are
                // the fold's rows as they are.
                fin.fold_rows_as_keys(agg.plan(), agg.merges_buckets());
                let through = fin.read_through(agg.plan(), one_row && !checkpoints)?;
                let cold = fin.read_cold_through(agg.plan(), hot)?;
                (through, cold)
            }
            None => (false, false),
        };
        // Set for this run only: reset below whatever the run's outcome.
        leave_unread(before, &unread);
        let shared: &[Box<dyn Stage>] = before;
        let pre = |b: ChangeBatch| map_through(shared, b);
        // The next stage's share of the work done on the aggregate's workers, if it has one.
        let fold = after.first().and_then(|s| s.firing_fold());
        // Where the fold can, the PARTIAL's workers fire delta rows instead of their changelog.
        let deltas = fold.is_some()
            && !through
            && !cold_through
            && after
                .first()
                .and_then(|s| s.as_incremental())
                .is_some_and(|i| i.takes_deltas_from(agg.plan()));
        let post = fold
            .as_deref()
            .map(|f| f as &(dyn Fn() -> Result<FiringFold> + Sync));
        let runtime = &self.runtime;
        // Pushes `batches` that stage `first` of the later stages produced through the rest.
        let onward = |after: &mut [Box<dyn Stage>],
                      first: usize,
                      batches: Vec<ChangeBatch>,
                      deliver: &mut dyn FnMut(Output) -> Result<()>|
         -> Result<()> {
            let mut current = batches;
            for stage in after[first..].iter_mut() {
                if current.is_empty() {
                    break;
                }
                current = stage.push(current, runtime)?;
            }
            for c in current {
                deliver(Output::Changes(c))?;
            }
            Ok(())
        };
        let mut through = |d: Delivery| -> Result<()> {
            match d {
                Delivery::Changes(batches) => onward(after, 0, batches, deliver),
                Delivery::Checkpoint { rows, state } => {
                    // As at a barrier: the later stages fire what they hold, then every
                    // stage's state is taken.
                    for i in 0..after.len() {
                        let tail = after[i].finish(runtime)?;
                        onward(after, i + 1, tail, deliver)?;
                    }
                    let mut stages = vec![(stage_entry(k), Arc::clone(&agg_schema), state)];
                    for (i, s) in after.iter().enumerate() {
                        if let Some((schema, batches)) = s.snapshot()? {
                            stages.push((stage_entry(k + 1 + i), schema, batches));
                        }
                    }
                    deliver(Output::Checkpoint { rows, stages })
                }
            }
        };
        agg.set_emit_deltas(deltas);
        let run =
            agg.run_splits_checkpointed(splits, order, checkpoint_every, &pre, post, &mut through);
        agg.set_emit_deltas(false);
        leave_unread(before, &BTreeSet::new());
        run?;
        // The later stages' pending mini-batches fire at the end of input.
        for c in self.finish()? {
            deliver(Output::Changes(c))?;
        }
        Ok(())
    }
}
