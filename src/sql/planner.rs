//! From DataFusion's logical plan to Tally's pipeline, the aggregate strategy decisions, and
//! EXPLAIN in Flink's node names.
//!
//! The phase strategy and the split-distinct rewrite are decided under Flink's conditions
//! (two-phase: mini-batch on, strategy not ONE_PHASE, every aggregate mergeable, input not
//! already partitioned by the keys; split: enabled and at least one DISTINCT call). Every
//! aggregate runs on `table.exec.resource.default-parallelism` workers, in one or two phases as
//! decided, split into PARTIAL and FINAL aggregates when split-distinct applies (`split.rs`).
//! EXPLAIN says what runs and why, and a setting
//! that was asked for explicitly but has no effect is a warning (an error with
//! `tally.strict = true`). EXPLAIN ANALYZE runs the query and annotates the plan with each
//! stage's figures.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::AsArray;
use arrow::datatypes::{DataType, Int64Type, Schema, SchemaRef, TimeUnit};
use datafusion_common::tree_node::TreeNode;
use datafusion_common::{DFSchema, ScalarValue};
use datafusion_expr::expr::{AggregateFunction, Alias, ScalarFunction};
use datafusion_expr::{BinaryExpr, Expr, LogicalPlan};

use crate::clock::{Clock, ManualClock, SystemClock};
use crate::config::{
    ADAPTIVE_ENABLED, AGG_PHASE_STRATEGY, AggPhaseStrategy, Config, MINI_BATCH_ALLOW_LATENCY,
    MINI_BATCH_ENABLED, MINI_BATCH_SIZE, SPLIT_ENABLED,
};
use crate::error::{Error, Result};
use crate::operator::{AggregateMetrics, ParallelAggregate};
use crate::pipeline::{
    AggregateStage, CalcStage, ChangeBatch, ExpandStage, OP_FIELD, Pipeline, Stage,
};
use crate::plan::AggregatePlan;
use crate::replay::{ReplayStats, Replayer};
use crate::runtime::Runtime;
use crate::source::FileTable;
use tally_kernels::aggregates::AggregateKind;

use super::Catalog;

/// EXPLAIN details.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExplainDetail {
    /// `PLAN_ADVICE`: advice and warnings attached to nodes.
    PlanAdvice,
    /// `CHANGELOG_MODE`: each node's changelog mode.
    ChangelogMode,
}

/// One line of the plan.
#[derive(Debug, Clone)]
struct Node {
    name: &'static str,
    attrs: Vec<String>,
    /// The row kinds the node emits: `I`, `UB`, `UA`, `D`.
    mode: Vec<&'static str>,
    /// Advice numbers attached (PLAN_ADVICE).
    advice: Vec<usize>,
    /// The aggregate (bottom-up index) and stage whose metrics EXPLAIN ANALYZE shows here.
    stage: Option<(usize, &'static str)>,
}

impl Node {
    /// A node without advice or metrics.
    fn plain(name: &'static str, attrs: Vec<String>, mode: Vec<&'static str>) -> Self {
        Self {
            name,
            attrs,
            mode,
            advice: vec![],
            stage: None,
        }
    }
}

/// Advice or a warning for PLAN_ADVICE.
#[derive(Debug, Clone)]
struct Advice {
    kind: &'static str,
    text: String,
}

/// A query planned into a pipeline over one file table.
pub struct PlannedQuery {
    table: FileTable,
    pipeline: Pipeline,
    output: SchemaRef,
    /// Bottom-up chain of plan nodes.
    nodes: Vec<Node>,
    advice: Vec<Advice>,
    strategy: Vec<String>,
    warnings: Vec<String>,
    changelog_output: bool,
    /// Output positions of the top aggregate's group keys, when they survive to the output.
    keys: Option<Vec<usize>>,
    clock: Option<ManualClock>,
    update_before: bool,
    /// Where and how often to checkpoint while running.
    checkpoints: Option<CheckpointPolicy>,
    /// Source rows to skip: the position of the checkpoint restored.
    resume_rows: u64,
    /// The settings that shape the query's state (how split-distinct buckets it): a checkpoint
    /// records them, and restores only where they are the same.
    state_settings: Vec<(&'static str, String)>,
}

/// When and where [`PlannedQuery::run`] writes checkpoints.
#[derive(Debug, Clone)]
pub struct CheckpointPolicy {
    /// The checkpoint directory.
    pub dir: crate::checkpoint::CheckpointDir,
    /// A checkpoint is taken after the source batch that brings the rows read since the last
    /// one to at least this many.
    pub every_rows: u64,
}

impl std::fmt::Debug for PlannedQuery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlannedQuery")
            .field("table", &self.table.name)
            .field("output", &self.output)
            .finish()
    }
}

/// What running a query did.
#[derive(Debug, Clone, Default)]
pub struct RunStats {
    /// Rows read from the source (by this run: a restored run starts after the checkpoint's
    /// position).
    pub rows_in: u64,
    /// Output rows (changelog rows, or rows of the insert-only result).
    pub rows_out: u64,
    /// Checkpoints written.
    pub checkpoints: u64,
    /// Per aggregate (bottom-up): its metrics.
    pub aggregates: Vec<AggregateMetrics>,
}

impl PlannedQuery {
    /// The output schema (without the row kind).
    pub fn output_schema(&self) -> SchemaRef {
        Arc::clone(&self.output)
    }

    /// Whether the output is a changelog (it has row kinds other than `+I`).
    pub fn is_changelog(&self) -> bool {
        self.changelog_output
    }

    /// The output positions of the group keys of the last aggregate, when the output keeps them.
    pub fn key_columns(&self) -> Option<&[usize]> {
        self.keys.as_deref()
    }

    /// Whether the changelog carries `-U` rows.
    pub fn emits_update_before(&self) -> bool {
        self.update_before
    }

    /// Sets every aggregate's smallest slice worth a task of its own (default 1024 rows): tests
    /// set 1 so that small inputs run several local phases and exchanges, as large ones do.
    #[doc(hidden)]
    pub fn set_min_slice_rows(&mut self, rows: usize) {
        for stage in self.pipeline.stages_mut() {
            stage.set_min_slice_rows(rows);
        }
    }

    /// Warnings about settings that have no effect (each also in EXPLAIN).
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// The plan as text, Flink-style: one node per line, indented as a tree, then the aggregate
    /// strategy; with PLAN_ADVICE the advice, with CHANGELOG_MODE each node's row kinds.
    pub fn explain(&self, details: &[ExplainDetail]) -> String {
        self.explain_with(details, None)
    }

    /// EXPLAIN ANALYZE: runs the query (reading its source in batches of `batch_size` rows and
    /// discarding the output), then returns the plan with each aggregate stage annotated with
    /// its rows in and out and busy time, and a metrics section per aggregate (workers, skew
    /// ratio, state, the local phase's reduction ratio and decision, hot keys).
    ///
    /// # Errors
    /// As [`PlannedQuery::run`].
    pub fn explain_analyze(
        &mut self,
        details: &[ExplainDetail],
        batch_size: usize,
    ) -> Result<String> {
        let started = std::time::Instant::now();
        let stats = self.run(batch_size, |_| Ok(()), |_, _| {})?;
        let mut text = self.explain_with(details, Some(&stats));
        text.push_str(&format!(
            "\n== Metrics ==\nrows read {}, output rows {}, wall time {:.1} ms\n",
            stats.rows_in,
            stats.rows_out,
            started.elapsed().as_secs_f64() * 1e3
        ));
        for (i, m) in stats.aggregates.iter().enumerate() {
            text.push_str(&format!("aggregate {i}: {m}"));
        }
        Ok(text)
    }

    fn explain_with(&self, details: &[ExplainDetail], stats: Option<&RunStats>) -> String {
        let advice = details.contains(&ExplainDetail::PlanAdvice);
        let modes = details.contains(&ExplainDetail::ChangelogMode);
        let mut out = String::from("== Physical Plan ==\n");
        for (depth, node) in self.nodes.iter().rev().enumerate() {
            let mut attrs = vec![];
            if advice && !node.advice.is_empty() {
                let ids: Vec<String> = node.advice.iter().map(|a| a.to_string()).collect();
                attrs.push(format!("advice=[{}]", ids.join(", ")));
            }
            attrs.extend(node.attrs.iter().cloned());
            if modes {
                attrs.push(format!("changelogMode=[{}]", node.mode.join(",")));
            }
            if let (Some(stats), Some((agg, stage))) = (stats, node.stage)
                && let Some(m) = stats.aggregates.get(agg)
            {
                attrs.extend(analyzed(m, stage));
            }
            if depth > 0 {
                out.push_str(&"   ".repeat(depth - 1));
                out.push_str("+- ");
            }
            out.push_str(&format!("{}({})\n", node.name, attrs.join(", ")));
        }
        if !self.strategy.is_empty() {
            out.push_str("\n== Aggregate Strategy ==\n");
            for s in &self.strategy {
                out.push_str(s);
                out.push('\n');
            }
        }
        if advice {
            out.push('\n');
            if self.advice.is_empty() {
                out.push_str("No available advice...\n");
            }
            for (i, a) in self.advice.iter().enumerate() {
                out.push_str(&format!("advice[{}]: [{}] {}\n", i + 1, a.kind, a.text));
            }
        }
        out
    }

    /// Runs the query: reads the source in batches of `batch_size` rows, pushes them through the
    /// pipeline and hands every output batch to `on_output`; `on_progress` gets the rows read so
    /// far and the rows in the source (when the format says) after each batch.
    ///
    /// # Errors
    /// Source errors, evaluation errors, and whatever `on_output` returns.
    pub fn run(
        &mut self,
        batch_size: usize,
        on_output: impl FnMut(&ChangeBatch) -> Result<()>,
        on_progress: impl FnMut(u64, Option<u64>),
    ) -> Result<RunStats> {
        self.run_with(batch_size, None, on_output, on_progress, || {
            Ok(crate::checkpoint::Checkpoint::default())
        })
        .map(|(stats, _)| stats)
    }

    /// The size of the input file in bytes (None when it cannot be read).
    pub fn input_bytes(&self) -> Option<u64> {
        std::fs::metadata(&self.table.path).map(|m| m.len()).ok()
    }

    /// Writes a checkpoint to `dir` every `every_rows` source rows while running (see
    /// [`PlannedQuery::run_checkpointed`]).
    ///
    /// # Errors
    /// `every_rows` of 0.
    pub fn checkpoint_every(
        &mut self,
        dir: crate::checkpoint::CheckpointDir,
        every_rows: u64,
    ) -> Result<()> {
        if every_rows == 0 {
            return Err(Error::invalid_input(
                "the checkpoint interval must be at least 1 row",
            ));
        }
        self.checkpoints = Some(CheckpointPolicy { dir, every_rows });
        Ok(())
    }

    /// Restores the state of a checkpoint written by a run of the same query (the newest
    /// under `path`, or the one `path` names) into this freshly planned query: the aggregate
    /// states (redistributed over this run's workers) and the source position, so that the
    /// next run starts with the row after it. Returns the checkpoint, whose metadata tells the
    /// caller where its sink stood (`output.rows`, and what `on_checkpoint` added).
    ///
    /// The input is not checked beyond its length (a run that finds fewer rows than the
    /// checkpoint's position fails): the metadata's `source.bytes` is the input's size when the
    /// checkpoint was taken, for the caller to compare (a file fixed after bad input may differ).
    /// The settings that shape the state (whether split-distinct applies, and its bucket count)
    /// are recorded in the checkpoint and must be the same; the others (parallelism, phases,
    /// mini-batch size, …) may change.
    ///
    /// # Errors
    /// A missing, corrupt or unsupported checkpoint; one of another query or of other state
    /// settings (named); a query with state.
    pub fn restore(&mut self, path: &std::path::Path) -> Result<crate::checkpoint::Checkpoint> {
        let chk = crate::checkpoint::CheckpointDir::read(path)?;
        for (key, value) in &self.state_settings {
            let then = chk.meta(&format!("setting.{key}")).map_err(|_| {
                Error::invalid_input(format!(
                    "the checkpoint does not record '{key}', which shapes the state (it was written by an older Tally): resume it with that version"
                ))
            })?;
            if then != value {
                return Err(Error::invalid_input(format!(
                    "the checkpoint was taken with '{key}' = '{then}' and this run has '{value}', which lays out the state differently: set '{key}' = '{then}' to resume from it"
                )));
            }
        }
        let rows: u64 = chk
            .meta("source.rows")?
            .parse()
            .map_err(|_| Error::invalid_input("checkpoint: bad source.rows"))?;
        self.pipeline.restore(&chk)?;
        self.resume_rows = rows;
        Ok(chk)
    }

    /// [`PlannedQuery::run`] (or, with `speed`, [`PlannedQuery::replay`]) that writes
    /// checkpoints as set by [`PlannedQuery::checkpoint_every`]. At each checkpoint, as Flink
    /// does before a barrier, every pending mini-batch is fired and its changes handed to
    /// `on_output`; then `on_checkpoint` makes the sink durable and returns what records where
    /// it stands: metadata, and entries of its own (named other than `stage-<i>`), to which the
    /// run adds `source.rows`, `source.bytes`, `source.path`, `output.rows` and the aggregate
    /// states before the checkpoint is written. A run restored from that checkpoint resumes
    /// from exactly there: the rows before it are not read again and the changes before it
    /// not emitted again.
    ///
    /// # Errors
    /// As [`PlannedQuery::run`], checkpoint I/O errors, and those of `on_checkpoint`.
    pub fn run_checkpointed(
        &mut self,
        batch_size: usize,
        speed: Option<Option<f64>>,
        on_output: impl FnMut(&ChangeBatch) -> Result<()>,
        on_progress: impl FnMut(u64, Option<u64>),
        on_checkpoint: impl FnMut() -> Result<crate::checkpoint::Checkpoint>,
    ) -> Result<(RunStats, Option<ReplayStats>)> {
        if speed.is_some() && self.table.time_column.is_none() {
            return Err(Error::invalid_input(format!(
                "a replay needs a table with a 'time-column'; table '{}' has none",
                self.table.name
            )));
        }
        let replayer = speed.map(Replayer::new).transpose()?;
        self.run_with(batch_size, replayer, on_output, on_progress, on_checkpoint)
    }

    /// Replays a recorded stream (a table with a `time-column`) at `speed` times its recorded
    /// speed (None: as fast as possible), as [`PlannedQuery::run`] does, and measures the
    /// end-to-end latency of its rows ([`crate::replay`]).
    ///
    /// # Errors
    /// A table without a time column, and as [`PlannedQuery::run`].
    pub fn replay(
        &mut self,
        batch_size: usize,
        speed: Option<f64>,
        on_output: impl FnMut(&ChangeBatch) -> Result<()>,
        on_progress: impl FnMut(u64, Option<u64>),
    ) -> Result<(RunStats, ReplayStats)> {
        if self.table.time_column.is_none() {
            return Err(Error::invalid_input(format!(
                "a replay needs a table with a 'time-column'; table '{}' has none",
                self.table.name
            )));
        }
        let (stats, replay) = self.run_with(
            batch_size,
            Some(Replayer::new(speed)?),
            on_output,
            on_progress,
            || Ok(crate::checkpoint::Checkpoint::default()),
        )?;
        Ok((stats, replay.unwrap_or_default()))
    }

    fn run_with(
        &mut self,
        batch_size: usize,
        mut replayer: Option<Replayer>,
        mut on_output: impl FnMut(&ChangeBatch) -> Result<()>,
        mut on_progress: impl FnMut(u64, Option<u64>),
        mut on_checkpoint: impl FnMut() -> Result<crate::checkpoint::Checkpoint>,
    ) -> Result<(RunStats, Option<ReplayStats>)> {
        let mut stats = RunStats::default();
        // Decoding runs ahead on threads of its own (source tasks, as in Flink): Parquet row
        // groups on up to P decoders, in file order.
        let decoders = self.pipeline.parallelism();
        let reader = self.table.open_with(batch_size, decoders)?.prefetch(4);
        let total_rows = reader.total_rows;
        let time_index = self
            .table
            .time_column
            .as_ref()
            .and_then(|t| self.table.schema.index_of(t).ok());
        let mut emit = |batches: Vec<ChangeBatch>, stats: &mut RunStats| -> Result<usize> {
            let mut rows = 0;
            for b in batches {
                rows += b.num_rows();
                on_output(&b)?;
            }
            stats.rows_out += rows as u64;
            Ok(rows)
        };
        // The source position (rows read, counting those before a restored checkpoint).
        let mut position = 0u64;
        let mut skip = std::mem::take(&mut self.resume_rows);
        let mut since_checkpoint = 0u64;
        for batch in reader {
            // A row without its recorded time is bad input, like a corrupt file.
            let batch = batch.and_then(|b| self.check_times(&b, time_index, position).map(|()| b));
            let mut batch = match batch {
                Ok(b) => b,
                Err(e) => {
                    // Bad input (a corrupt or malformed file): the rows before it are in the
                    // state, which a checkpoint keeps, so that nothing accepted is lost.
                    let Some(dir) = self.checkpoints.as_ref().map(|p| p.dir.clone()) else {
                        return Err(e);
                    };
                    let saved = self
                        .take_checkpoint(position, &mut stats, &mut emit, &mut on_checkpoint)
                        .map(|_| dir.latest());
                    return Err(match saved {
                        Ok(Ok(Some(p))) => e.with_note(format!(
                            "the state after the {position} rows before it is saved in checkpoint {}; resume from it with --restore once the input is fixed",
                            p.display()
                        )),
                        _ => e,
                    });
                }
            };
            if skip > 0 {
                let n = batch.num_rows() as u64;
                let drop = skip.min(n);
                skip -= drop;
                position += drop;
                if drop == n {
                    continue;
                }
                let (off, len) = (drop as usize, (n - drop) as usize);
                batch = ChangeBatch {
                    op: batch.op.as_ref().map(|o| o.slice(off, len)),
                    data: batch.data.slice(off, len),
                };
            }
            stats.rows_in += batch.num_rows() as u64;
            position += batch.num_rows() as u64;
            since_checkpoint += batch.num_rows() as u64;
            if let Some(i) = time_index {
                // Replay: the recorded time drives the latency trigger (and the pacing).
                let t = arrow::compute::cast(
                    batch.data.column(i),
                    &DataType::Timestamp(TimeUnit::Millisecond, None),
                )?;
                let t = arrow::compute::cast(&t, &DataType::Int64)?;
                let t = t.as_primitive::<Int64Type>();
                if let Some(r) = &mut replayer {
                    r.before_push(t.values())?;
                }
                if let (Some(clock), Some(max)) = (&self.clock, arrow::compute::max(t)) {
                    clock.set_ms(max);
                }
            }
            let out = self.pipeline.push(batch)?;
            let mut rows = emit(out, &mut stats)?;
            if let Some(policy) = &self.checkpoints
                && since_checkpoint >= policy.every_rows
            {
                since_checkpoint = 0;
                rows +=
                    self.take_checkpoint(position, &mut stats, &mut emit, &mut on_checkpoint)?;
            }
            if let Some(r) = &mut replayer {
                r.after_push(rows);
            }
            on_progress(stats.rows_in, total_rows);
        }
        if skip > 0 {
            return Err(Error::invalid_input(format!(
                "the checkpoint's source position ({position} + {skip} rows) is past the end of {}: it was taken over another input",
                self.table.path.display()
            )));
        }
        let out = self.pipeline.finish()?;
        let rows = emit(out, &mut stats)?;
        if let Some(r) = &mut replayer {
            // Whatever is still pending is emitted by the end of input (or never changes output).
            r.after_push(rows.max(1));
        }
        stats.aggregates = self.pipeline.metrics()?;
        Ok((stats, replayer.map(Replayer::finish)))
    }
}

impl PlannedQuery {
    /// Checks that every row of `batch` (the rows after source row `position`) has its recorded
    /// time, when the table has a time column (its column `time_index`).
    fn check_times(
        &self,
        batch: &ChangeBatch,
        time_index: Option<usize>,
        position: u64,
    ) -> Result<()> {
        let Some(i) = time_index else {
            return Ok(());
        };
        let times = batch.data.column(i);
        if times.null_count() == 0 {
            return Ok(());
        }
        let row = (0..times.len()).find(|&r| times.is_null(r)).unwrap_or(0) as u64;
        Err(Error::invalid_input(format!(
            "table '{}' ({}): its time column '{}' is NULL at row {} of the input; a recorded stream needs every row's time (Flink: RowTime field should not be null)",
            self.table.name,
            self.table.path.display(),
            self.table.time_column.as_deref().unwrap_or(""),
            position + row + 1
        )))
    }

    /// Takes a checkpoint at source row `position`: as before a checkpoint barrier, fires every
    /// pending mini-batch and delivers its changes (through `emit`), has the sink say where it
    /// stands, then writes the state. Returns the rows emitted.
    fn take_checkpoint(
        &mut self,
        position: u64,
        stats: &mut RunStats,
        emit: &mut impl FnMut(Vec<ChangeBatch>, &mut RunStats) -> Result<usize>,
        on_checkpoint: &mut impl FnMut() -> Result<crate::checkpoint::Checkpoint>,
    ) -> Result<usize> {
        let dir = self
            .checkpoints
            .as_ref()
            .map(|p| p.dir.clone())
            .ok_or_else(|| Error::internal("a checkpoint without a checkpoint directory"))?;
        let out = self.pipeline.finish()?;
        let rows = emit(out, stats)?;
        let mut chk = on_checkpoint()?;
        let meta = &mut chk.meta;
        meta.insert("source.rows".into(), position.to_string());
        if let Some(b) = self.input_bytes() {
            meta.insert("source.bytes".into(), b.to_string());
        }
        meta.insert(
            "source.path".into(),
            self.table
                .path
                .display()
                .to_string()
                .replace(['\n', '\r'], " "),
        );
        meta.insert("output.rows".into(), stats.rows_out.to_string());
        for (key, value) in &self.state_settings {
            meta.insert(format!("setting.{key}"), value.clone());
        }
        chk.id = dir.next_id()?;
        chk.entries.extend(self.pipeline.snapshot()?);
        dir.write(&chk)?;
        stats.checkpoints += 1;
        Ok(rows)
    }
}

/// EXPLAIN ANALYZE attributes for the node of `stage` in an aggregate with metrics `m`.
fn analyzed(m: &AggregateMetrics, stage: &str) -> Vec<String> {
    let mut attrs = vec![];
    if let Some(s) = m.stages.iter().find(|s| s.name == stage) {
        attrs.push(format!("rows=[in {}, out {}]", s.rows_in, s.rows_out));
        attrs.push(format!("busy=[{:.1} ms]", s.busy.as_secs_f64() * 1e3));
    }
    if matches!(stage, "GroupAggregate" | "GlobalGroupAggregate") {
        attrs.push(format!("workers=[{}]", m.parallelism));
        attrs.push(format!("skew=[{:.2}]", m.skew_ratio));
        attrs.push(format!(
            "state=[{} keys, {} bytes]",
            m.keys_in_state, m.state_bytes
        ));
    }
    if stage == "LocalGroupAggregate"
        && let Some(l) = &m.local
    {
        let ratio = l.last_ratio.map_or("-".to_string(), |r| format!("{r:.3}"));
        attrs.push(format!(
            "reduction=[{ratio}], local=[{}]",
            if l.bypassed { "bypassed" } else { "active" }
        ));
    }
    attrs
}

/// What planning a subtree built.
struct Built {
    table: FileTable,
    stages: Vec<Box<dyn Stage>>,
    nodes: Vec<Node>,
    changelog: bool,
    /// Positions of the last aggregate's group keys in this subtree's output.
    keys: Option<Vec<usize>>,
    /// EXPLAIN names of this subtree's output columns, where they differ from the schema's.
    names: HashMap<String, String>,
}

impl Built {
    /// Adds a Calc stage computing `exprs` over `input` into batches of `output`.
    fn project(&mut self, input: &DFSchema, exprs: &[Expr], output: &Schema) -> Result<()> {
        self.stages.push(Box::new(CalcStage::try_new(
            input,
            None,
            Some(exprs),
            Arc::new(output.clone()),
        )?));
        Ok(())
    }

    /// The changelog mode of the subtree's top node.
    fn mode(&self) -> Vec<&'static str> {
        self.nodes
            .last()
            .map(|n| n.mode.clone())
            .unwrap_or_default()
    }
}

struct Ctx<'a> {
    catalog: &'a Catalog,
    config: Config,
    runtime: Arc<Runtime>,
    /// Aggregates planned so far.
    aggregates: usize,
    has_aggregate: bool,
    clock: Arc<dyn Clock>,
    manual: Option<ManualClock>,
    advice: Vec<Advice>,
    strategy: Vec<String>,
    warnings: Vec<String>,
    /// Aliases of the Projection being planned (output column → alias), for the aggregate
    /// below it to name its results in EXPLAIN.
    pending: HashMap<String, String>,
    /// Each aggregate's EXPLAIN label and role, in planning order (its index).
    labels: Vec<(String, Role)>,
    /// Aggregates planned with a local phase.
    local_phases: usize,
}

/// Plans `plan` over the tables of `catalog` under `config`.
///
/// # Errors
/// Unsupported constructs, bad configuration, and (with `tally.strict`) settings that have no
/// effect.
pub fn plan(catalog: &Catalog, config: &Config, plan: &LogicalPlan) -> Result<PlannedQuery> {
    let config = config.clone();
    config.validate()?;
    let mut has_aggregate = false;
    plan.apply(|n| {
        if matches!(n, LogicalPlan::Aggregate(_)) {
            has_aggregate = true;
        }
        Ok(datafusion_common::tree_node::TreeNodeRecursion::Continue)
    })?;
    let runtime = Runtime::new(config.parallelism)?;
    let mut ctx = Ctx {
        catalog,
        config,
        runtime: Arc::clone(&runtime),
        aggregates: 0,
        has_aggregate,
        clock: Arc::new(SystemClock),
        manual: None,
        advice: vec![],
        strategy: vec![],
        warnings: vec![],
        pending: HashMap::new(),
        labels: vec![],
        local_phases: 0,
    };
    for w in ctx.config.ineffective_settings() {
        ctx.warn(w)?;
    }
    // A replayed table (time column) drives the clock from its recorded time.
    let mut table_name = None;
    plan.apply(|n| {
        if let LogicalPlan::TableScan(t) = n {
            table_name = Some(t.table_name.table().to_string());
        }
        Ok(datafusion_common::tree_node::TreeNodeRecursion::Continue)
    })?;
    if table_name
        .as_ref()
        .and_then(|n| ctx.catalog.table(n))
        .is_some_and(|t| t.time_column.is_some())
    {
        let clock = ManualClock::new(i64::MIN / 2);
        ctx.clock = Arc::new(clock.clone());
        ctx.manual = Some(clock);
    }
    let mut built = build(&mut ctx, plan)?;
    if ctx.has_aggregate
        && ctx.local_phases == 0
        && let Some(w) = ctx.config.adaptive_without_local_phase()
    {
        ctx.warn(w)?;
    }
    let update_before = settle_update_before(&mut ctx, &mut built)?;
    // What shapes the state beyond the query: whether split-distinct applied, and its buckets.
    let split = ctx.labels.iter().any(|(_, role)| *role == Role::Partial);
    let mut state_settings = vec![(SPLIT_ENABLED, split.to_string())];
    if split {
        state_settings.push((
            crate::config::SPLIT_BUCKET_NUM,
            ctx.config.split_bucket_num.to_string(),
        ));
    }
    Ok(PlannedQuery {
        table: built.table,
        pipeline: Pipeline::new(built.stages, runtime),
        output: Arc::new(plan.schema().as_arrow().clone()),
        nodes: built.nodes,
        advice: ctx.advice,
        strategy: ctx.strategy,
        warnings: ctx.warnings,
        changelog_output: built.changelog,
        keys: built.keys,
        clock: ctx.manual,
        update_before,
        checkpoints: None,
        resume_rows: 0,
        state_settings,
    })
}

impl Ctx<'_> {
    /// Records a warning about a setting with no effect; an error under `tally.strict`.
    fn warn(&mut self, w: String) -> Result<()> {
        if self.config.strict {
            return Err(crate::config::strict_error(&w));
        }
        self.advice.push(Advice {
            kind: "WARNING",
            text: w.clone(),
        });
        self.warnings.push(w);
        Ok(())
    }
}

/// Applies `tally.exec.emit.update-before = false` as Flink's changelog-mode inference does: an
/// aggregate may drop its `-U` rows only when its changes go straight to the sink (through
/// projections that keep its group keys), where an upsert consumer keyed by those keys needs
/// none; an aggregate whose changes feed a filter, another aggregate or a projection that drops
/// its keys keeps them, and the plan says why (a warning; an error under `tally.strict`).
/// Returns whether the query's output carries `-U` rows.
fn settle_update_before(ctx: &mut Ctx<'_>, built: &mut Built) -> Result<bool> {
    if ctx.config.emit_update_before {
        return Ok(true);
    }
    let key = crate::config::EMIT_UPDATE_BEFORE;
    let stateful: Vec<usize> = (0..built.stages.len())
        .filter(|&i| built.stages[i].keeps_state())
        .collect();
    let Some(&last) = stateful.last() else {
        ctx.warn(format!(
            "'{key}' = 'false' has no effect: the query has no aggregate, whose -U rows it would drop"
        ))?;
        return Ok(true);
    };
    let mut dropped = false;
    for (agg, &stage) in stateful.iter().enumerate() {
        let Some((label, role)) = ctx.labels.get(agg).cloned() else {
            return Err(Error::internal("an aggregate stage without a plan node"));
        };
        if role == Role::Partial {
            // A split's PARTIAL feeds its FINAL, which retracts with the -U rows.
            continue;
        }
        let later = &built.stages[stage + 1..];
        let reason = if later.iter().any(|s| s.keeps_state()) {
            Some("another aggregate")
        } else if !later.iter().all(|s| s.passes_every_row()) {
            Some("a filter (WHERE or HAVING) over its results")
        } else if built.keys.is_none() {
            Some("a projection without its group keys, by which an upsert consumer would key them")
        } else {
            None
        };
        let node = built.nodes.iter().rposition(|n| {
            n.stage.is_some_and(|(i, name)| {
                i == agg && matches!(name, "GroupAggregate" | "GlobalGroupAggregate")
            })
        });
        match reason {
            None => {
                built.stages[stage].drop_update_before()?;
                dropped = stage == last;
                if let Some(node) = node {
                    for n in &mut built.nodes[node..] {
                        n.mode.retain(|m| *m != "UB");
                    }
                }
                ctx.strategy.push(format!(
                    "{label}: emits no -U rows ('{key}' = 'false'): its changes go straight to the sink, which upserts them by the group keys."
                ));
            }
            Some(reason) => {
                ctx.strategy.push(format!(
                    "{label}: keeps its -U rows: its changes feed {reason}, which needs them."
                ));
                ctx.warn(format!(
                    "'{key}' = 'false' has no effect on {label}: its changes feed {reason}, which needs the -U rows (Flink keeps them there too)"
                ))?;
                if let Some(node) = node {
                    let id = ctx.advice.len();
                    built.nodes[node].advice.push(id);
                }
            }
        }
    }
    Ok(!dropped)
}

fn unsupported(what: &str) -> Error {
    Error::plan(format!(
        "{what} is not supported in a streaming GROUP BY query"
    ))
}

fn build(ctx: &mut Ctx<'_>, plan: &LogicalPlan) -> Result<Built> {
    match plan {
        LogicalPlan::TableScan(scan) => {
            let name = scan.table_name.table().to_string();
            let table = ctx
                .catalog
                .table(&name)
                .cloned()
                .ok_or_else(|| Error::plan(format!("table '{name}' not found")))?;
            let mode = if table.changelog_column.is_some() {
                vec!["I", "UB", "UA", "D"]
            } else {
                vec!["I"]
            };
            let fields: Vec<&str> = table
                .schema
                .fields()
                .iter()
                .map(|f| f.name().as_str())
                .collect();
            let mut nodes = vec![Node {
                name: "TableSourceScan",
                attrs: vec![
                    format!("table=[[default_catalog, default_database, {name}]]"),
                    format!("fields=[{}]", fields.join(", ")),
                ],
                mode: mode.clone(),
                advice: vec![],
                stage: None,
            }];
            if ctx.has_aggregate && ctx.config.mini_batch_enabled {
                let (interval, kind) = (
                    ctx.config.mini_batch_allow_latency.as_millis(),
                    if table.time_column.is_some() {
                        "RowTime"
                    } else {
                        "ProcTime"
                    },
                );
                nodes.push(Node::plain(
                    "MiniBatchAssigner",
                    vec![format!("interval=[{interval}ms]"), format!("mode=[{kind}]")],
                    mode,
                ));
            }
            let mut stages: Vec<Box<dyn Stage>> = vec![];
            if let Some(projection) = &scan.projection {
                let input = DFSchema::try_from(table.schema.as_ref().clone())?;
                let exprs: Vec<Expr> = projection
                    .iter()
                    .map(|&i| {
                        Expr::Column(datafusion_common::Column::new_unqualified(
                            table.schema.field(i).name(),
                        ))
                    })
                    .collect();
                stages.push(Box::new(CalcStage::try_new(
                    &input,
                    None,
                    Some(&exprs),
                    Arc::new(scan.projected_schema.as_arrow().clone()),
                )?));
            }
            if !scan.filters.is_empty() || scan.fetch.is_some() {
                return Err(unsupported("a filtered or limited scan"));
            }
            let changelog = table.changelog_column.is_some();
            Ok(Built {
                table,
                stages,
                nodes,
                changelog,
                keys: None,
                names: HashMap::new(),
            })
        }
        LogicalPlan::SubqueryAlias(a) => build(ctx, &a.input),
        LogicalPlan::Filter(f) => {
            // A Projection directly above folds this filter into one Calc (see below).
            let mut built = build(ctx, &f.input)?;
            let schema = f.input.schema();
            built.stages.push(Box::new(CalcStage::try_new(
                schema,
                Some(&f.predicate),
                None,
                Arc::new(schema.as_arrow().clone()),
            )?));
            let mode = built.mode();
            let select: Vec<String> = field_names(schema)
                .into_iter()
                .map(|n| built.names.get(&n).cloned().unwrap_or(n))
                .collect();
            built.nodes.push(Node {
                name: "Calc",
                attrs: vec![
                    format!("select=[{}]", select.join(", ")),
                    format!("where=[{}]", show_in(&f.predicate, &built.names)),
                ],
                mode,
                advice: vec![],
                stage: None,
            });
            Ok(built)
        }
        LogicalPlan::Projection(p) => {
            // Aliases of aggregate results (`COUNT(*) AS orders`) name them in the aggregate.
            let mut aliases = HashMap::new();
            for e in &p.expr {
                if let Expr::Alias(Alias { expr, name, .. }) = e {
                    let mut expr = expr.as_ref();
                    while let Expr::Alias(Alias { expr: inner, .. }) = expr {
                        expr = inner.as_ref();
                    }
                    if let Expr::Column(c) = expr {
                        aliases
                            .entry(c.name.clone())
                            .or_insert_with(|| name.clone());
                    }
                }
            }
            ctx.pending = aliases;
            let mut built = build(ctx, &p.input)?;
            let input = p.input.schema();
            let identity = p.expr.len() == input.fields().len()
                && p.expr.iter().enumerate().all(|(i, e)| match e {
                    Expr::Column(c) => input.index_of_column(c).ok() == Some(i),
                    _ => false,
                });
            // Keys survive a projection that passes them through as columns.
            built.keys = built.keys.as_ref().and_then(|keys| {
                keys.iter()
                    .map(|&k| {
                        p.expr.iter().position(|e| {
                            let e = match e {
                                Expr::Alias(Alias { expr, .. }) => expr.as_ref(),
                                other => other,
                            };
                            matches!(e, Expr::Column(c) if input.index_of_column(c).ok() == Some(k))
                        })
                    })
                    .collect::<Option<Vec<_>>>()
            });
            if identity && p.schema.as_arrow().fields() == input.as_arrow().fields() {
                return Ok(built);
            }
            built.project(input, &p.expr, p.schema.as_arrow())?;
            let mode = built.mode();
            let select: Vec<String> = p.expr.iter().map(|e| show_named(e, &built.names)).collect();
            let passthrough: Vec<String> = field_names(input)
                .into_iter()
                .map(|n| built.names.get(&n).cloned().unwrap_or(n))
                .collect();
            built.names = HashMap::new();
            if select == passthrough {
                // Only renames what EXPLAIN already shows by its new name.
                return Ok(built);
            }
            // A projection over a filter is one Calc in Flink's plans.
            if let Some(last) = built.nodes.last_mut()
                && last.name == "Calc"
                && last.attrs.len() == 2
                && last.attrs[1].starts_with("where=")
            {
                last.attrs[0] = format!("select=[{}]", select.join(", "));
                return Ok(built);
            }
            built.nodes.push(Node::plain(
                "Calc",
                vec![format!("select=[{}]", select.join(", "))],
                mode,
            ));
            Ok(built)
        }
        LogicalPlan::Aggregate(agg) => build_aggregate(ctx, agg),
        LogicalPlan::Sort(_) => Err(unsupported(
            "ORDER BY (the final table of --emit final is sorted)",
        )),
        LogicalPlan::Limit(_) => Err(unsupported("LIMIT")),
        LogicalPlan::Distinct(_) => Err(unsupported("SELECT DISTINCT (use GROUP BY)")),
        LogicalPlan::Join(_) => Err(unsupported("a join")),
        LogicalPlan::Union(_) => Err(unsupported("UNION")),
        LogicalPlan::Window(_) => Err(unsupported("a window function")),
        LogicalPlan::Values(_) | LogicalPlan::EmptyRelation(_) => {
            Err(unsupported("a query without a FROM table"))
        }
        other => Err(unsupported(&format!(
            "'{}'",
            other
                .display()
                .to_string()
                .split(':')
                .next()
                .unwrap_or("this plan")
        ))),
    }
}

fn field_names(schema: &DFSchema) -> Vec<String> {
    schema.fields().iter().map(|f| f.name().clone()).collect()
}

/// One aggregate call as EXPLAIN shows it.
struct CallInfo {
    /// `SUM(amount)`, `COUNT(*)`, `COUNT(DISTINCT user_id)`.
    call: String,
    fname: String,
    args: Vec<String>,
    distinct: bool,
    /// MIN or MAX (planned without its DISTINCT).
    minmax: bool,
    /// Index into the filter columns.
    filter: Option<usize>,
    /// The output name.
    name: String,
}

/// An aggregate's part in a split-distinct rewrite.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// Not split.
    Whole,
    /// The PARTIAL aggregate, grouped by the keys and the buckets.
    Partial,
    /// The FINAL aggregate, merging the partial results.
    Final,
}

fn build_aggregate(
    ctx: &mut Ctx<'_>,
    agg: &datafusion_expr::logical_plan::Aggregate,
) -> Result<Built> {
    let aliases = std::mem::take(&mut ctx.pending);
    let built = build(ctx, &agg.input)?;
    if ctx.config.split_enabled
        && let Some(split) = super::split::plan_split(agg, ctx.config.split_bucket_num)?
    {
        return build_split(ctx, agg, built, &aliases, split);
    }
    aggregate_on(ctx, agg, built, &aliases, Role::Whole)
}

/// Plans the split-distinct rewrite of `agg` over `built` (see [`super::split`]): Calc with the
/// bucket columns, Expand when several arguments are bucketed, the PARTIAL aggregate, the FINAL
/// aggregate, and a Calc back to the original columns.
fn build_split(
    ctx: &mut Ctx<'_>,
    agg: &datafusion_expr::logical_plan::Aggregate,
    mut built: Built,
    aliases: &HashMap<String, String>,
    split: super::split::Split,
) -> Result<Built> {
    let in_df = agg.input.schema();
    // Calc: the input columns and the buckets.
    built.project(in_df, &split.pre_exprs, split.pre_schema.as_arrow())?;
    let mode = built.mode();
    let mut select: Vec<String> = field_names(in_df)
        .into_iter()
        .map(|n| built.names.get(&n).cloned().unwrap_or(n))
        .collect();
    for (arg, name) in &split.buckets {
        select.push(format!(
            "MOD(HASH_CODE({}), {}) AS {name}",
            show(arg),
            ctx.config.split_bucket_num
        ));
    }
    built.nodes.push(Node::plain(
        "Calc",
        vec![format!("select=[{}]", select.join(", "))],
        mode.clone(),
    ));
    if let Some(expand) = &split.expand {
        built.stages.push(Box::new(ExpandStage::new(
            expand.sets.clone(),
            Arc::new(split.partial_input.as_arrow().clone()),
        )));
        let names = field_names(&split.pre_schema);
        let projects: Vec<String> = expand
            .sets
            .iter()
            .map(|(nulls, id)| {
                let mut cols: Vec<String> = names
                    .iter()
                    .enumerate()
                    .map(|(i, n)| {
                        if nulls.contains(&i) {
                            format!("null AS {n}")
                        } else {
                            n.clone()
                        }
                    })
                    .collect();
                cols.push(format!("{id} AS $e"));
                format!("{{{}}}", cols.join(", "))
            })
            .collect();
        built.nodes.push(Node::plain(
            "Expand",
            vec![format!("projects=[{}]", projects.join(", "))],
            mode,
        ));
    }
    let mut label_keys: Vec<String> = agg.group_expr.iter().map(show).collect();
    let final_label = if label_keys.is_empty() {
        "GroupAggregate".to_string()
    } else {
        format!("GroupAggregate(groupBy=[{}])", label_keys.join(", "))
    };
    label_keys.extend(split.buckets.iter().map(|b| b.1.clone()));
    let sets = split.expand.as_ref().map_or(1, |e| e.sets.len());
    ctx.strategy.push(format!(
        "{final_label}: split-distinct applies ('{SPLIT_ENABLED}' = 'true', {} buckets): a PARTIAL aggregate grouped by [{}]{} computes the calls per bucket, a FINAL aggregate grouped by the keys merges them ($SUM0 for COUNT and AVG's parts, SUM, MIN, MAX), consuming the partial changelog with retraction.",
        ctx.config.split_bucket_num,
        label_keys.join(", "),
        if sets > 1 {
            format!(" over an Expand of {sets} group sets (one per bucketed argument, $e tells them apart)")
        } else {
            String::new()
        }
    ));
    let built = aggregate_on(ctx, &split.partial, built, &HashMap::new(), Role::Partial)?;
    let mut built = aggregate_on(ctx, &split.final_agg, built, &HashMap::new(), Role::Final)?;
    // Calc: back to the original columns (AVG from its parts).
    built.project(
        split.final_agg.schema.as_ref(),
        &split.post_exprs,
        agg.schema.as_arrow(),
    )?;
    // EXPLAIN names of the original outputs.
    let mut names = HashMap::new();
    for (i, a) in agg.aggr_expr.iter().enumerate() {
        if !matches!(a, Expr::Alias(_)) {
            let field = agg.schema.field(agg.group_expr.len() + i).name().clone();
            let name = aliases
                .get(&field)
                .cloned()
                .unwrap_or_else(|| format!("EXPR${i}"));
            names.insert(field, name);
        }
    }
    {
        let select: Vec<String> = split
            .post_exprs
            .iter()
            .zip(agg.schema.fields())
            .map(|(e, f)| {
                let shown = show(e);
                let name = names.get(f.name()).cloned().unwrap_or(f.name().clone());
                if shown == name {
                    shown
                } else {
                    format!("{shown} AS {name}")
                }
            })
            .collect();
        let mode = built.mode();
        built.nodes.push(Node::plain(
            "Calc",
            vec![format!("select=[{}]", select.join(", "))],
            mode,
        ));
    }
    built.keys = Some((0..agg.group_expr.len()).collect());
    built.names = names;
    Ok(built)
}

fn aggregate_on(
    ctx: &mut Ctx<'_>,
    agg: &datafusion_expr::logical_plan::Aggregate,
    mut built: Built,
    aliases: &HashMap<String, String>,
    role: Role,
) -> Result<Built> {
    let agg_index = ctx.aggregates;
    ctx.aggregates += 1;
    let mut names: HashMap<String, String> = HashMap::new();
    if agg
        .group_expr
        .iter()
        .any(|e| matches!(e, Expr::GroupingSet(_)))
    {
        return Err(unsupported("GROUPING SETS / ROLLUP / CUBE"));
    }
    let input = agg.input.schema();
    let changelog = built.changelog;
    let input_schema = AggregateStage::input_schema(input.as_arrow(), changelog);
    let plan = AggregatePlan::try_new_with(
        input_schema,
        input,
        &agg.group_expr,
        &agg.aggr_expr,
        changelog.then_some(OP_FIELD),
    )?;
    // The resolved kind of each call (COUNT(*) or COUNT(x), MIN/MAX, …), for EXPLAIN.
    let kinds: Vec<AggregateKind> = plan.calls.iter().map(|c| c.kind).collect();

    // Is the input already partitioned by these keys (an aggregate grouped by some of these
    // columns below)? Then a local phase cannot help (Flink's condition 4).
    let partitioned = built.keys.as_ref().is_some_and(|prev| {
        let mine: Option<Vec<usize>> = agg
            .group_expr
            .iter()
            .map(|e| match e {
                Expr::Column(c) => input.index_of_column(c).ok(),
                _ => None,
            })
            .collect();
        // Partitioned by a subset of the keys: every group lives on one worker already.
        mine.is_some_and(|m| !prev.is_empty() && prev.iter().all(|k| m.contains(k)))
    });
    let cfg = ctx.config.clone();
    let mb = cfg.mini_batch_enabled;
    let strategy = cfg.agg_phase_strategy;
    let decision = crate::phases::decide(&cfg, partitioned, |two_phase| {
        aggregate_label(two_phase, &agg.group_expr)
    });
    let two_phase = decision.two_phase;
    ctx.local_phases += usize::from(two_phase);
    let mut op_config = cfg.clone();
    op_config.split_enabled = false;
    // Every aggregate emits -U rows; the one whose changes go straight to an upsert sink may
    // drop them once the whole plan is known (`settle_update_before`).
    op_config.emit_update_before = true;
    let operator = ParallelAggregate::try_new(
        Arc::new(plan),
        op_config,
        Arc::clone(&ctx.clock),
        Arc::clone(&ctx.runtime),
        two_phase,
    )?;
    let acc_names = operator.accumulator_names();
    let count1_name = operator
        .accumulator_schema()
        .and_then(|s| s.fields().last().map(|f| f.name().clone()));
    let output = Arc::new(agg.schema.as_arrow().clone());
    built.stages.push(Box::new(AggregateStage::try_new(
        operator, changelog, output,
    )?));

    // Explain: Calc (keys, arguments, filters) → [LocalGroupAggregate →] Exchange →
    // GroupAggregate or GlobalGroupAggregate.
    let keys: Vec<String> = agg.group_expr.iter().map(show).collect();
    let mut calc: Vec<String> = vec![];
    fn push_calc(calc: &mut Vec<String>, s: String) {
        if !calc.contains(&s) {
            calc.push(s);
        }
    }
    for k in &agg.group_expr {
        push_calc(&mut calc, show(k));
    }
    let mut filters: Vec<String> = vec![];
    let mut has_distinct = false;
    let mut distinct_args: Vec<String> = vec![];
    let mut calls: Vec<CallInfo> = vec![];
    for (i, a) in agg.aggr_expr.iter().enumerate() {
        let (inner, name) = match a {
            Expr::Alias(Alias { expr, name, .. }) => (expr.as_ref(), name.clone()),
            other => {
                let field = agg.schema.field(agg.group_expr.len() + i).name().clone();
                let name = aliases
                    .get(&field)
                    .cloned()
                    .unwrap_or_else(|| format!("EXPR${i}"));
                names.insert(field, name.clone());
                (other, name)
            }
        };
        let Expr::AggregateFunction(AggregateFunction { params, .. }) = inner else {
            return Err(Error::plan(format!("{inner} is not an aggregate call")));
        };
        let kind = kinds[i];
        // Flink marks the functions of an aggregate that consumes retractions.
        let fname = format!("{}{}", kind.name(), if changelog { "_RETRACT" } else { "" });
        let star = kind == AggregateKind::CountStar;
        let args: Vec<String> = if star {
            vec![]
        } else {
            params.args.iter().map(show).collect()
        };
        for a in &args {
            push_calc(&mut calc, a.clone());
        }
        let call = if star {
            "COUNT(*)".to_string()
        } else {
            format!(
                "{fname}({}{})",
                if params.distinct { "DISTINCT " } else { "" },
                args.join(", ")
            )
        };
        if params.distinct {
            has_distinct = true;
            distinct_args.extend(args.iter().cloned());
        }
        let filter = params.filter.as_ref().map(|f| {
            let f = format!("{} IS TRUE", show(f));
            match filters.iter().position(|x| *x == f) {
                Some(i) => i,
                None => {
                    filters.push(f);
                    filters.len() - 1
                }
            }
        });
        calls.push(CallInfo {
            call,
            fname,
            args,
            distinct: params.distinct,
            minmax: matches!(kind, AggregateKind::Min | AggregateKind::Max),
            filter,
            name,
        });
    }
    // Filter columns follow the keys and arguments in the Calc, as `$f<position>` (after any
    // `$f<n>` column already there, such as a split's buckets).
    let base = calc
        .iter()
        .filter_map(|c| c.strip_prefix("$f").and_then(|n| n.parse::<usize>().ok()))
        .map(|n| n + 1)
        .chain([calc.len()])
        .max()
        .unwrap_or(0);
    let filter_of = |c: &CallInfo| {
        c.filter
            .map(|i| format!(" FILTER $f{}", base + i))
            .unwrap_or_default()
    };
    for (i, f) in filters.iter().enumerate() {
        calc.push(format!("{f} AS $f{}", base + i));
    }
    let mut select: Vec<String> = keys.clone();
    let mut local_select: Vec<String> = keys.clone();
    let mut global_select: Vec<String> = keys.clone();
    let mut distinct_sets: Vec<(String, String)> = vec![];
    for (j, c) in calls.iter().enumerate() {
        select.push(format!("{}{} AS {}", c.call, filter_of(c), c.name));
        let Some(accs) = acc_names.as_ref().and_then(|a| a.get(j)) else {
            continue;
        };
        let minmax = c.minmax;
        if c.distinct && !minmax {
            // DISTINCT calls over one argument share its value set (`distinct$k`).
            let set = accs.join(", ");
            let arg = c.args.join(", ");
            if !distinct_sets.iter().any(|d| d.1 == set) {
                distinct_sets.push((arg.clone(), set.clone()));
            }
            local_select.push(format!("{}({set} {arg}){}", c.fname, filter_of(c)));
            global_select.push(format!("{}({set} {arg}) AS {}", c.fname, c.name));
        } else {
            let accs = if accs.len() == 1 {
                accs[0].clone()
            } else {
                format!("({})", accs.join(", "))
            };
            local_select.push(format!("{}{} AS {accs}", c.call, filter_of(c)));
            global_select.push(format!("{}({accs}) AS {}", c.fname, c.name));
        }
    }
    if let Some(count1) = &count1_name {
        local_select.push(format!("COUNT(*) AS {count1}"));
    }
    for (arg, set) in &distinct_sets {
        local_select.push(format!("DISTINCT({arg}) AS {set}"));
    }
    let in_mode = built.mode();
    built.nodes.push(Node {
        name: "Calc",
        attrs: vec![format!("select=[{}]", calc.join(", "))],
        mode: in_mode.clone(),
        advice: vec![],
        stage: Some((agg_index, "Calc")),
    });
    let group_by = (!keys.is_empty()).then(|| format!("groupBy=[{}]", keys.join(", ")));
    let partial_final = match role {
        Role::Whole => None,
        Role::Partial => Some("partialFinalType=[PARTIAL]".to_string()),
        Role::Final => Some("partialFinalType=[FINAL]".to_string()),
    };
    if two_phase {
        let mut attrs: Vec<String> = group_by.iter().cloned().collect();
        attrs.extend(partial_final.clone());
        attrs.push(format!("select=[{}]", local_select.join(", ")));
        built.nodes.push(Node {
            name: "LocalGroupAggregate",
            attrs,
            mode: vec!["I"],
            advice: vec![],
            stage: Some((agg_index, "LocalGroupAggregate")),
        });
    }
    let distribution = if keys.is_empty() {
        "single".to_string()
    } else {
        format!("hash[{}]", keys.join(", "))
    };
    built.nodes.push(Node {
        name: "Exchange",
        attrs: vec![format!("distribution=[{distribution}]")],
        mode: if two_phase { vec!["I"] } else { in_mode },
        advice: vec![],
        stage: Some((agg_index, "Exchange")),
    });
    // -U rows, unless the plan lets the last aggregate drop them (`settle_update_before`).
    let mut out_mode = vec!["I", "UB", "UA"];
    if changelog {
        out_mode.push("D");
    }
    let node_name = if two_phase {
        "GlobalGroupAggregate"
    } else {
        "GroupAggregate"
    };
    let mut attrs: Vec<String> = group_by.iter().cloned().collect();
    attrs.extend(partial_final);
    attrs.push(format!(
        "select=[{}]",
        if two_phase { &global_select } else { &select }.join(", ")
    ));
    let label = aggregate_label(two_phase, &agg.group_expr);
    ctx.labels.push((label.clone(), role));

    let mut node_advice = vec![];
    let workers = ctx.runtime.parallelism();
    let mut note = format!(
        "{label}: runs {} on {workers} worker{}. Requested '{AGG_PHASE_STRATEGY}' = '{}'",
        if two_phase { "TWO_PHASE" } else { "ONE_PHASE" },
        if workers == 1 { "" } else { "s" },
        strategy.name()
    );
    if partitioned {
        note.push_str("; the input is already partitioned by the group keys, so a local phase would not reduce the exchange (Flink keeps one phase too).");
    } else if two_phase {
        note.push_str(": each slice's LocalGroupAggregate folds its rows into one accumulator row per key, the exchange routes them by key hash, each worker's GlobalGroupAggregate merges them.");
        if cfg.adaptive_local {
            note.push_str(&format!(
                " Adaptive local phase: bypassed while its rows out / rows in is above {} and no key holds more than 1/{workers} of its input (measured over {} rows, probed again after {} bypassed rows).",
                cfg.adaptive_threshold, cfg.adaptive_min_rows, cfg.adaptive_probe_interval
            ));
        } else {
            note.push_str(&format!(
                " Adaptive local phase off ('{ADAPTIVE_ENABLED}' = 'false')."
            ));
        }
    } else {
        // Flink's GroupAggregationAnalyzer advice: what to set for two phases.
        let mut unmet = vec![];
        if strategy == AggPhaseStrategy::OnePhase {
            unmet.push(format!("'{AGG_PHASE_STRATEGY}' to 'AUTO'"));
            note.push_str(" (one phase, as requested).");
        }
        if !mb {
            unmet.push(format!("'{MINI_BATCH_ENABLED}' to 'true'"));
            if strategy != AggPhaseStrategy::OnePhase {
                note.push_str(&format!(
                    "; two phases need mini-batch, and '{MINI_BATCH_ENABLED}' is false."
                ));
            }
        }
        if cfg.mini_batch_allow_latency.as_millis() == 0 {
            unmet.push(format!(
                "'{MINI_BATCH_ALLOW_LATENCY}' to a positive long value"
            ));
        }
        if cfg.mini_batch_size <= 0 {
            unmet.push(format!("'{MINI_BATCH_SIZE}' to a positive long value"));
        }
        ctx.advice.push(Advice {
            kind: "ADVICE",
            text: format!(
                "You might want to enable local-global two-phase optimization by configuring ({}).",
                unmet.join(", ")
            ),
        });
        node_advice.push(ctx.advice.len());
    }
    for w in decision.warnings {
        ctx.warn(w)?;
        node_advice.push(ctx.advice.len());
    }
    ctx.strategy.push(note);
    // Split-distinct (the parts of a split aggregate are not split again).
    if role != Role::Whole {
    } else if cfg.split_enabled {
        let key_args = distinct_args.iter().all(|a| keys.contains(a));
        let w = if !has_distinct {
            format!(
                "'{SPLIT_ENABLED}' = 'true' has no effect on {label}: it has no DISTINCT aggregate"
            )
        } else if key_args {
            format!(
                "'{SPLIT_ENABLED}' = 'true' has no effect on {label}: its DISTINCT arguments are group keys, so there is nothing to bucket"
            )
        } else {
            format!(
                "'{SPLIT_ENABLED}' = 'true' has no effect on {label}: only MIN/MAX arguments would be bucketed"
            )
        };
        ctx.strategy.push(format!(
            "{label}: split-distinct requested; {}",
            w.split(": ").last().unwrap_or("")
        ));
        ctx.warn(w)?;
        node_advice.push(ctx.advice.len());
    } else if has_distinct {
        ctx.strategy.push(format!(
            "{label}: split-distinct off ('{SPLIT_ENABLED}' = 'false')."
        ));
    }
    built.nodes.push(Node {
        name: node_name,
        attrs,
        mode: out_mode,
        advice: node_advice,
        stage: Some((agg_index, node_name)),
    });
    built.changelog = true;
    built.keys = Some((0..agg.group_expr.len()).collect());
    built.names = names;
    Ok(built)
}

/// How EXPLAIN's strategy notes and warnings name an aggregate:
/// `GroupAggregate(groupBy=[k])`, `GlobalGroupAggregate(groupBy=[k])`, or the name alone.
fn aggregate_label(two_phase: bool, group_expr: &[Expr]) -> String {
    let name = if two_phase {
        "GlobalGroupAggregate"
    } else {
        "GroupAggregate"
    };
    if group_expr.is_empty() {
        return name.to_string();
    }
    let keys: Vec<String> = group_expr.iter().map(show).collect();
    format!("{name}(groupBy=[{}])", keys.join(", "))
}

/// An expression in Flink's explain style: unqualified columns, SQL literals, upper-case
/// function names.
pub fn show(e: &Expr) -> String {
    show_in(e, &HashMap::new())
}

/// [`show`], naming columns by `names` where it has them.
fn show_in(e: &Expr, names: &HashMap<String, String>) -> String {
    let show = |e: &Expr| show_in(e, names);
    match e {
        Expr::Column(c) => names
            .get(&c.name)
            .cloned()
            .unwrap_or_else(|| c.name.clone()),
        Expr::Alias(Alias { expr, .. }) => show(expr),
        Expr::Literal(v, _) => match v {
            ScalarValue::Utf8(Some(s))
            | ScalarValue::LargeUtf8(Some(s))
            | ScalarValue::Utf8View(Some(s)) => {
                format!("'{}'", s.replace('\'', "''"))
            }
            v if v.is_null() => "null".to_string(),
            v => v.to_string(),
        },
        Expr::BinaryExpr(BinaryExpr { left, op, right }) => {
            format!("({} {op} {})", show(left), show(right))
        }
        Expr::Not(x) => format!("NOT({})", show(x)),
        Expr::IsNull(x) => format!("{} IS NULL", show(x)),
        Expr::IsNotNull(x) => format!("{} IS NOT NULL", show(x)),
        Expr::IsTrue(x) => format!("{} IS TRUE", show(x)),
        Expr::Negative(x) => format!("-({})", show(x)),
        Expr::Cast(c) => format!("CAST({} AS {})", show(&c.expr), c.field.data_type()),
        Expr::TryCast(c) => format!("TRY_CAST({} AS {})", show(&c.expr), c.field.data_type()),
        Expr::ScalarFunction(ScalarFunction { func, args })
            if func.name() == super::split_functions::BUCKET_FUNCTION =>
        {
            let n = super::split_functions::bucket_count(func).unwrap_or(0);
            let arg = args.first().map(&show).unwrap_or_default();
            format!("MOD(HASH_CODE({arg}), {n})")
        }
        Expr::ScalarFunction(ScalarFunction { func, args })
            if func.name() == super::split_functions::AVG_FINAL_FUNCTION && args.len() == 2 =>
        {
            let (s, c) = (show(&args[0]), show(&args[1]));
            format!("IF(({c} = 0), null, ({s} / {c}))")
        }
        Expr::ScalarFunction(ScalarFunction { func, args }) => {
            let args: Vec<String> = args.iter().map(&show).collect();
            format!("{}({})", func.name().to_ascii_uppercase(), args.join(", "))
        }
        Expr::Case(c) => {
            let mut s = String::from("CASE(");
            let mut parts = vec![];
            if let Some(x) = &c.expr {
                parts.push(show(x));
            }
            for (w, t) in &c.when_then_expr {
                parts.push(show(w));
                parts.push(show(t));
            }
            if let Some(x) = &c.else_expr {
                parts.push(show(x));
            }
            s.push_str(&parts.join(", "));
            s.push(')');
            s
        }
        other => other.to_string(),
    }
}

/// An expression with its output name (`expr AS name` unless it is that column).
fn show_named(e: &Expr, names: &HashMap<String, String>) -> String {
    match e {
        Expr::Alias(Alias { expr, name, .. }) => {
            let mut expr = expr.as_ref();
            while let Expr::Alias(Alias { expr: inner, .. }) = expr {
                expr = inner.as_ref();
            }
            let s = show_in(expr, names);
            if &s == name {
                s
            } else {
                format!("{s} AS {name}")
            }
        }
        other => show_in(other, names),
    }
}
