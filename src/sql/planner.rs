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

use arrow::datatypes::{Schema, SchemaRef};
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
use crate::pipeline::{AggregateStage, CalcStage, ExpandStage, Pipeline, Stage};
use crate::plan::AggregatePlan;
use crate::run::{Job, RunStats};
use crate::runtime::Runtime;
use crate::sink::{Discard, ResultTable, Sink};
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

/// A query planned into a job (a pipeline over one file table) and its EXPLAIN.
pub struct PlannedQuery {
    job: Job,
    output: SchemaRef,
    /// Bottom-up chain of plan nodes.
    nodes: Vec<Node>,
    advice: Vec<Advice>,
    strategy: Vec<String>,
    warnings: Vec<String>,
    changelog_output: bool,
    /// Output positions of the top aggregate's group keys, when they survive to the output.
    keys: Option<Vec<usize>>,
    update_before: bool,
}

impl std::fmt::Debug for PlannedQuery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlannedQuery")
            .field("job", &self.job)
            .field("output", &self.output)
            .finish()
    }
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

    /// The table the query's changelog materializes ([`ResultTable`]): upserts by the group
    /// keys when the changelog has no `-U` rows, the multiset of its rows otherwise.
    ///
    /// # Errors
    /// An upsert changelog whose group keys are not all in the SELECT list.
    pub fn result_table(&self) -> Result<ResultTable> {
        let upsert = self.changelog_output && !self.update_before;
        let keys = match (&self.keys, upsert) {
            (_, false) => None,
            (Some(keys), true) => Some(keys.as_slice()),
            (None, true) => {
                return Err(Error::invalid_input(
                    "--emit final without -U rows ('tally.exec.emit.update-before' = 'false') needs the group keys in the SELECT list",
                ));
            }
        };
        ResultTable::try_new(self.output_schema(), keys)
    }

    /// The job that runs the query: run, replay, checkpoint and restore it there.
    pub fn job(&mut self) -> &mut Job {
        &mut self.job
    }

    /// Runs the query ([`Job::run`]).
    ///
    /// # Errors
    /// As [`Job::run`].
    pub fn run(
        &mut self,
        batch_size: usize,
        sink: &mut impl Sink,
        on_progress: impl FnMut(u64, Option<u64>),
    ) -> Result<RunStats> {
        self.job.run(batch_size, sink, on_progress)
    }

    /// Sets every aggregate's smallest slice worth a task of its own (default 1024 rows): tests
    /// set 1 so that small inputs run several local phases and exchanges, as large ones do.
    #[doc(hidden)]
    pub fn set_min_slice_rows(&mut self, rows: usize) {
        for stage in self.job.pipeline_mut().stages_mut() {
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
        let stats = self.job.run(batch_size, &mut Discard, |_, _| {})?;
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
    let mut state_settings = vec![(SPLIT_ENABLED.to_string(), split.to_string())];
    if split {
        state_settings.push((
            crate::config::SPLIT_BUCKET_NUM.to_string(),
            ctx.config.split_bucket_num.to_string(),
        ));
    }
    let pipeline = Pipeline::new(built.stages, runtime);
    Ok(PlannedQuery {
        job: Job::new(built.table, pipeline, ctx.manual).with_state_settings(state_settings),
        output: Arc::new(plan.schema().as_arrow().clone()),
        nodes: built.nodes,
        advice: ctx.advice,
        strategy: ctx.strategy,
        warnings: ctx.warnings,
        changelog_output: built.changelog,
        keys: built.keys,
        update_before,
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
    let mut plan = AggregatePlan::try_new_with(
        Arc::new(input.as_arrow().clone()),
        input,
        &agg.group_expr,
        &agg.aggr_expr,
        changelog,
    )?;
    plan.rename_output(Arc::new(agg.schema.as_arrow().clone()))?;
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
    built.stages.push(Box::new(AggregateStage::new(operator)));

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
