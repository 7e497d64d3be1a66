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
use crate::operator::pipelined::FiringFold;
use crate::operator::{AggregateMetrics, IncrementalAggregate, ParallelAggregate};
use crate::runtime::Runtime;

mod aggregate;
mod calc;
mod expand;
mod incremental;
mod pipelined;

pub use aggregate::AggregateStage;
pub use calc::{CalcStage, physical_expr};
pub use expand::ExpandStage;
pub use incremental::IncrementalStage;
pub use pipelined::Output;

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

/// Stages chained in order, on a [`Runtime`].
#[derive(Debug)]
pub struct Pipeline {
    stages: Vec<Box<dyn Stage>>,
    runtime: Arc<Runtime>,
}

/// The checkpoint entry that holds the state of the stage at position `i`.
pub(crate) fn stage_entry(i: usize) -> String {
    format!("{STAGE_ENTRY_PREFIX}{i}")
}

/// Whether a checkpoint entry holds a stage's state ([`stage_entry`]).
pub(crate) fn is_stage_entry(name: &str) -> bool {
    name.starts_with(STAGE_ENTRY_PREFIX)
}

const STAGE_ENTRY_PREFIX: &str = "stage-";

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
        columns_read_by(&self.stages, None)
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
                out.push((stage_entry(i), schema, batches));
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
        let held = chk.entries.iter().filter(|e| is_stage_entry(&e.0)).count();
        if held != stateful.len() {
            return Err(Error::invalid_input(format!(
                "the checkpoint holds {held} aggregate states and this query has {}: it was taken for another query",
                stateful.len()
            )));
        }
        for i in stateful {
            let batches = chk.entry(&stage_entry(i)).map_err(|_| {
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

/// The source columns (by index) `stages` read (`None`: every column): those the first reads,
/// and through filters that keep the columns, the next one's too; `after` where every stage is
/// such a filter (what reads their output: `None`, every column, when unknown).
pub(crate) fn columns_read_by(
    stages: &[Box<dyn Stage>],
    after: Option<BTreeSet<usize>>,
) -> Option<BTreeSet<usize>> {
    let mut filtered = BTreeSet::new();
    for stage in stages {
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
    let mut read = after?;
    read.extend(filtered);
    Some(read)
}
