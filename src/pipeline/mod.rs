//! Linear pipelines of streaming stages over changelog batches.
//!
//! A [`ChangeBatch`] is a batch of rows plus, for a changelog, their row kinds. Stages transform
//! change batches: [`CalcStage`] filters and projects (a filter or projection over a changelog
//! passes each row's kind through), [`AggregateStage`] runs a [`ParallelAggregate`]. A
//! [`Pipeline`] chains them from a source to a sink.
//!
//! Between stages the stream travels as *slices*: consecutive pieces of it, in order. The
//! pipeline cuts each source batch into up to P slices; a Calc stage processes its slices as
//! parallel tasks; an aggregate takes them as the slices of its local phases or its exchange and
//! emits its workers' changelogs, which are the slices of the next stage.

use std::collections::BTreeSet;
use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch};
use arrow::datatypes::{Field, Schema, SchemaRef};

use crate::changelog::ChangeBatch;
use crate::error::{Error, Result};
use crate::operator::exchange::even_slices;
use crate::operator::pipelined::{Delivery, FiringFold, InputOrder, chunk_rows};
use crate::operator::{AggregateMetrics, IncrementalAggregate, ParallelAggregate};
use crate::runtime::Runtime;

mod calc;
mod expand;
mod incremental;

pub use calc::{CalcStage, physical_expr};
pub use expand::ExpandStage;
pub use incremental::IncrementalStage;

/// Makes a keyed task's fold of its firings ([`Stage::firing_fold`]).
pub type FoldFactory = Box<dyn Fn() -> Result<FiringFold> + Send + Sync>;

/// A streaming transformation of change batches.
pub trait Stage: Send + Sync + std::fmt::Debug {
    /// Consumes consecutive slices of the stream and returns what became due, as slices.
    ///
    /// # Errors
    /// When evaluation fails on the data.
    fn push(&mut self, slices: Vec<ChangeBatch>, runtime: &Runtime) -> Result<Vec<ChangeBatch>>;

    /// End of input: flushes what is buffered.
    ///
    /// # Errors
    /// As [`Stage::push`].
    fn finish(&mut self, runtime: &Runtime) -> Result<Vec<ChangeBatch>>;

    /// The aggregate's metrics, if this stage is one.
    ///
    /// # Errors
    /// When the metrics cannot be collected (a bug).
    fn metrics(&self) -> Result<Option<AggregateMetrics>> {
        Ok(None)
    }

    /// Whether the stage keeps keyed state (an aggregate), which checkpoints hold.
    fn keeps_state(&self) -> bool {
        false
    }

    /// Whether every input row comes out as one output row of the same kind (a projection):
    /// a consumer of the stage's output sees its input's changes one for one.
    fn passes_every_row(&self) -> bool {
        false
    }

    /// The input columns (by index) the stage reads; `None` when it passes its input through
    /// whole (every column).
    fn columns_read(&self) -> Option<BTreeSet<usize>> {
        None
    }

    /// The stage as a Calc stage, if it is one.
    fn as_calc(&self) -> Option<&CalcStage> {
        None
    }

    /// Whether the stage keeps nothing between batches (Calc, Expand): each source task of the
    /// pipelined runtime then runs it on what it reads, through [`Stage::map_batch`].
    fn per_batch(&self) -> bool {
        false
    }

    /// One batch through a [`Stage::per_batch`] stage: what comes out of it, in order (nothing
    /// when a filter drops every row).
    ///
    /// # Errors
    /// As [`Stage::push`]; a stage that is not per batch (a bug).
    fn map_batch(&self, _batch: ChangeBatch) -> Result<Vec<ChangeBatch>> {
        Err(Error::internal("this stage does not run batch by batch"))
    }

    /// The stage's aggregate, if it is an aggregate stage.
    fn as_aggregate(&self) -> Option<&ParallelAggregate> {
        None
    }

    /// The stage's split-distinct FINAL under Flink's incremental aggregate, if it is one.
    fn as_incremental(&self) -> Option<&IncrementalAggregate> {
        None
    }

    /// As [`Stage::as_incremental`], to set how it reads the PARTIAL.
    fn as_incremental_mut(&mut self) -> Option<&mut IncrementalAggregate> {
        None
    }

    /// Where the stage right after an aggregate can take over part of its work on the
    /// aggregate's own workers: what makes each keyed task a fold of its firings, whose
    /// output [`Stage::push`] then takes as well as the firings themselves (split-distinct's
    /// incremental FINAL). `None` for other stages.
    ///
    /// # Errors
    /// In the fold it makes: as [`Stage::push`].
    fn firing_fold(&self) -> Option<FoldFactory> {
        None
    }

    /// As [`Stage::as_aggregate`], to run it.
    fn as_aggregate_mut(&mut self) -> Option<&mut ParallelAggregate> {
        None
    }

    /// Tells a per-batch stage that no later stage reads its output columns `unread` in the
    /// coming run (an empty set: all are read again). A stage that computes such a column may
    /// leave it NULL; one that passes its input's columns on by position returns the input
    /// columns that are then unread (the walk goes on before it); others return `None`.
    fn leave_unread(&mut self, _unread: &BTreeSet<usize>) -> Option<BTreeSet<usize>> {
        None
    }

    /// Given the output columns that later stages may take as dictionaries of their strings,
    /// the input columns a per-batch stage may take so: those it passes on as they are to such
    /// an output, or only compares with literals. None by default (the stage needs its input's
    /// plain strings).
    fn dictionary_inputs(&self, _outputs: &BTreeSet<usize>) -> BTreeSet<usize> {
        BTreeSet::new()
    }

    /// Sets an aggregate's smallest slice worth a task of its own
    /// ([`ParallelAggregate::set_min_slice_rows`]); other stages ignore it.
    fn set_min_slice_rows(&mut self, _rows: usize) {}

    /// Switches an aggregate's `-U` rows off (for an upsert consumer keyed by its group keys).
    ///
    /// # Errors
    /// A stage that is not an aggregate.
    fn drop_update_before(&mut self) -> Result<()> {
        Err(Error::internal("only an aggregate emits -U rows"))
    }

    /// The stage's keyed state (an aggregate's), as snapshot batches and their schema; `None`
    /// for a stateless stage. Taken after [`Stage::finish`], when nothing is buffered.
    ///
    /// # Errors
    /// A mini-batch still pending.
    fn snapshot(&self) -> Result<Option<(SchemaRef, Vec<RecordBatch>)>> {
        Ok(None)
    }

    /// Loads state made by [`Stage::snapshot`] into this (fresh) stage.
    ///
    /// # Errors
    /// A stateless stage, and state of another query.
    fn restore(&mut self, _batches: &[RecordBatch]) -> Result<()> {
        Err(Error::invalid_input("this stage keeps no state to restore"))
    }
}

/// `declared` with the data types of `cols` where they differ (dictionaries of strings passed on
/// where `declared` has the strings, [`Pipeline::dictionary_columns`]); `declared` itself when
/// none differs.
fn schema_of(declared: &SchemaRef, cols: &[ArrayRef]) -> SchemaRef {
    let fields = declared.fields();
    if fields
        .iter()
        .zip(cols)
        .all(|(f, c)| f.data_type() == c.data_type())
    {
        return Arc::clone(declared);
    }
    let fields: Vec<Field> = fields
        .iter()
        .zip(cols)
        .map(|(f, c)| f.as_ref().clone().with_data_type(c.data_type().clone()))
        .collect();
    Arc::new(Schema::new_with_metadata(
        fields,
        declared.metadata().clone(),
    ))
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

/// One batch through per-batch `stages` ([`Stage::map_batch`]), in order: what comes out of the
/// last.
///
/// # Errors
/// The first stage error; a stage that is not per batch (a bug).
pub fn map_through(stages: &[Box<dyn Stage>], batch: ChangeBatch) -> Result<Vec<ChangeBatch>> {
    let mut current = vec![batch];
    for stage in stages {
        let mut next = Vec::with_capacity(current.len());
        for b in current {
            next.extend(stage.map_batch(b)?);
        }
        current = next;
    }
    Ok(current)
}

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

/// Stages chained in order, on a [`Runtime`].
#[derive(Debug)]
pub struct Pipeline {
    stages: Vec<Box<dyn Stage>>,
    runtime: Arc<Runtime>,
}

impl Pipeline {
    /// A pipeline of `stages`, first to last, running on `runtime`.
    pub fn new(stages: Vec<Box<dyn Stage>>, runtime: Arc<Runtime>) -> Self {
        Self { stages, runtime }
    }

    /// The runtime its stages run on.
    pub fn runtime(&self) -> &Runtime {
        &self.runtime
    }

    /// The number of workers it runs on.
    pub fn parallelism(&self) -> usize {
        self.runtime.parallelism()
    }

    /// The stages.
    pub fn stages(&self) -> &[Box<dyn Stage>] {
        &self.stages
    }

    /// The stages, to adjust them before the pipeline runs.
    pub fn stages_mut(&mut self) -> &mut [Box<dyn Stage>] {
        &mut self.stages
    }

    /// The metrics of every aggregate stage, first to last.
    ///
    /// # Errors
    /// When metrics cannot be collected (a bug).
    pub fn metrics(&self) -> Result<Vec<AggregateMetrics>> {
        let mut out = vec![];
        for s in &self.stages {
            out.extend(s.metrics()?);
        }
        Ok(out)
    }

    fn run_from(&mut self, first: usize, slices: Vec<ChangeBatch>) -> Result<Vec<ChangeBatch>> {
        let mut current = slices;
        for stage in &mut self.stages[first..] {
            if current.is_empty() {
                break;
            }
            current = stage.push(current, &self.runtime)?;
        }
        Ok(current)
    }

    /// Pushes one input batch, cut into up to P slices, through every stage.
    ///
    /// # Errors
    /// The first stage error.
    pub fn push(&mut self, batch: ChangeBatch) -> Result<Vec<ChangeBatch>> {
        let slices = even_slices(batch.num_rows(), self.runtime.parallelism())
            .into_iter()
            .map(|(offset, len)| ChangeBatch {
                op: batch.op.as_ref().map(|o| o.slice(offset, len)),
                data: batch.data.slice(offset, len),
            })
            .collect();
        self.run_from(0, slices)
    }

    /// The source columns (by index) the pipeline reads (`None`: every column): those its first
    /// stage reads, and through filters that keep the columns, the next stage's too.
    pub fn columns_read(&self) -> Option<BTreeSet<usize>> {
        let mut filtered = BTreeSet::new();
        for stage in &self.stages {
            if let Some(calc) = stage.as_calc()
                && calc.keeps_columns()
            {
                filtered.extend(calc.filter_columns());
                continue;
            }
            let mut read = stage.columns_read()?;
            read.extend(filtered);
            return Some(read);
        }
        None
    }

    /// The source columns (by index) that may be read as dictionaries of their strings: those
    /// the first aggregate only compares with literals or keys by
    /// ([`crate::plan::AggregatePlan::dictionary_columns`]), traced back through the per-batch
    /// stages before it to the source columns they pass on as they are
    /// ([`Stage::dictionary_inputs`]: a filter's columns compared with literals, a projection's
    /// bare columns, an Expand's columns that no set nulls), plus those the filters only compare
    /// with literals. Empty when another stage comes first.
    pub fn dictionary_columns(&self) -> BTreeSet<usize> {
        let Some(at) = self.stages.iter().position(|s| !s.per_batch()) else {
            return BTreeSet::new();
        };
        let Some(agg) = self.stages[at].as_aggregate() else {
            return BTreeSet::new();
        };
        self.stages[..at]
            .iter()
            .rev()
            .fold(agg.plan().dictionary_columns.clone(), |outputs, stage| {
                stage.dictionary_inputs(&outputs)
            })
    }

    /// The aggregate the source feeds through per-batch stages (Calc, Expand), if the first
    /// other stage is one.
    fn first_aggregate(&self) -> Option<&ParallelAggregate> {
        self.stages
            .iter()
            .find(|s| !s.per_batch())
            .and_then(|s| s.as_aggregate())
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
        // per bucket), unless the run takes checkpoints, which cut state by key group, or the
        // state was restored from one.
        agg.merge_buckets(incremental && checkpoint_every.is_none())?;
        // On one such worker every key has one PARTIAL row, which the FINAL reads through,
        // and the buckets route nowhere: nothing reads them, and the Calc leaves them NULL.
        let one_row = agg.merges_buckets() && agg.parallelism() == 1;
        let unread = if one_row {
            agg.plan().bucket_columns_unread()
        } else {
            BTreeSet::new()
        };
        let through = match after.first_mut().and_then(|s| s.as_incremental_mut()) {
            Some(fin) => fin.read_through(agg.plan(), one_row)?,
            None => false,
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
                Delivery::Changes(b) => onward(after, 0, vec![b], deliver),
                Delivery::Checkpoint { rows, state } => {
                    // As at a barrier: the later stages fire what they hold, then every
                    // stage's state is taken.
                    for i in 0..after.len() {
                        let tail = after[i].finish(runtime)?;
                        onward(after, i + 1, tail, deliver)?;
                    }
                    let mut stages = vec![(format!("stage-{k}"), Arc::clone(&agg_schema), state)];
                    for (i, s) in after.iter().enumerate() {
                        if let Some((schema, batches)) = s.snapshot()? {
                            stages.push((format!("stage-{}", k + 1 + i), schema, batches));
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

    /// The state of every aggregate stage, named `stage-<i>` by the stage's position, for a
    /// [`crate::checkpoint::Checkpoint`]. Call [`Pipeline::finish`] first (and deliver its
    /// output): a checkpoint holds no pending mini-batch.
    ///
    /// # Errors
    /// A mini-batch still pending.
    pub fn snapshot(&self) -> Result<Vec<(String, SchemaRef, Vec<RecordBatch>)>> {
        let mut out = vec![];
        for (i, s) in self.stages.iter().enumerate() {
            if let Some((schema, batches)) = s.snapshot()? {
                out.push((format!("stage-{i}"), schema, batches));
            }
        }
        Ok(out)
    }

    /// Loads the stage states of `chk` (from [`Pipeline::snapshot`] of the same query; the
    /// parallelism may differ) into this fresh pipeline.
    ///
    /// # Errors
    /// A checkpoint of another query (other stages or state columns).
    pub fn restore(&mut self, chk: &crate::checkpoint::Checkpoint) -> Result<()> {
        let stateful: Vec<usize> = (0..self.stages.len())
            .filter(|&i| self.stages[i].keeps_state())
            .collect();
        let held = chk
            .entries
            .iter()
            .filter(|e| e.0.starts_with("stage-"))
            .count();
        if held != stateful.len() {
            return Err(Error::invalid_input(format!(
                "the checkpoint holds {held} aggregate states and this query has {}: it was taken for another query",
                stateful.len()
            )));
        }
        for i in stateful {
            let batches = chk.entry(&format!("stage-{i}")).map_err(|_| {
                Error::invalid_input(format!(
                    "the checkpoint has no state for stage {i}: it was taken for another query"
                ))
            })?;
            self.stages[i].restore(batches)?;
        }
        Ok(())
    }

    /// End of input: finishes each stage in order, pushing what it flushes through the rest.
    ///
    /// # Errors
    /// The first stage error.
    pub fn finish(&mut self) -> Result<Vec<ChangeBatch>> {
        let mut out = vec![];
        for i in 0..self.stages.len() {
            let tail = self.stages[i].finish(&self.runtime)?;
            out.extend(self.run_from(i + 1, tail)?);
        }
        Ok(out)
    }
}
