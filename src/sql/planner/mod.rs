//! From DataFusion's logical plan to Tally's pipeline: the walk over the plan (sources,
//! filters, projections), and the dispatch of each GROUP BY to one aggregate
//! (`aggregate.rs`) or the split-distinct stages (`split.rs`).
//!
//! The phase strategy and the split-distinct rewrite are decided under Flink's conditions
//! (two-phase: mini-batch on, strategy not ONE_PHASE, every aggregate mergeable, input not
//! already partitioned by the keys; split: enabled and at least one DISTINCT call). Every
//! aggregate runs on `table.exec.resource.default-parallelism` workers. Beside the stages the
//! planner builds the query's EXPLAIN: what runs and why; a setting that was asked for
//! explicitly but has no effect is a warning (an error with `tally.strict = true`), and where
//! `-U` rows may be dropped is settled last (`update_before.rs`).

use std::collections::HashMap;
use std::sync::Arc;

use datafusion_common::DFSchema;
use datafusion_common::tree_node::TreeNode;
use datafusion_expr::expr::Alias;
use datafusion_expr::{Expr, LogicalPlan};

use super::explain::{show_in, show_named};
use crate::clock::{ManualClock, SystemClock};
use crate::config::{Config, SPLIT_ENABLED};
use crate::error::{Error, Result};
use crate::explain::{Explain, PlanNode};
use crate::pipeline::{CalcStage, Pipeline, Stage};
use crate::run::Job;
use crate::runtime::Runtime;

use super::Catalog;
use super::query::PlannedQuery;
use context::{Built, Ctx, Role, field_names, unsupported};
use update_before::settle_update_before;

mod aggregate;
mod context;
mod skew;
mod split;
mod update_before;

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
        explain: Explain::default(),
        warnings: vec![],
        pending: HashMap::new(),
        labels: vec![],
        split_buckets: None,
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
    if let (true, Some(buckets)) = (split, ctx.split_buckets) {
        state_settings.push((
            crate::config::SPLIT_BUCKET_NUM.to_string(),
            buckets.to_string(),
        ));
    }
    let pipeline = Pipeline::new(built.stages, runtime);
    Ok(PlannedQuery {
        job: Job::new(built.table, pipeline, ctx.manual).with_state_settings(state_settings),
        output: Arc::new(plan.schema().as_arrow().clone()),
        explain: Explain {
            nodes: built.nodes,
            ..ctx.explain
        },
        warnings: ctx.warnings,
        changelog_output: built.changelog,
        keys: built.keys,
        update_before,
    })
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
            let mut nodes = vec![PlanNode {
                name: "TableSourceScan",
                attrs: vec![
                    format!("table=[[default_catalog, default_database, {name}]]"),
                    format!("fields=[{}]", fields.join(", ")),
                ],
                mode: mode.clone(),
                advice: vec![],
                step: None,
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
                nodes.push(PlanNode::new(
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
            built.nodes.push(PlanNode {
                name: "Calc",
                attrs: vec![
                    format!("select=[{}]", select.join(", ")),
                    format!("where=[{}]", show_in(&f.predicate, &built.names)),
                ],
                mode,
                advice: vec![],
                step: None,
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
            built.nodes.push(PlanNode::new(
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

fn build_aggregate(
    ctx: &mut Ctx<'_>,
    agg: &datafusion_expr::logical_plan::Aggregate,
) -> Result<Built> {
    let aliases = std::mem::take(&mut ctx.pending);
    let built = build(ctx, &agg.input)?;
    let (split, buckets, why, sample) = if ctx.config.split_auto {
        let d = skew::decide(ctx, agg, &built)?;
        (d.split, d.buckets, Some(d.reason), d.sample)
    } else {
        (
            ctx.config.split_enabled,
            ctx.config.split_bucket_num,
            None,
            None,
        )
    };
    if split && let Some(plan) = crate::sql::split::plan_split(agg, buckets)? {
        // Hot keys are a choice of routes, never needed for a result: a source that cannot be
        // read yet (EXPLAIN of a file not written yet) spreads every key, and the run reports
        // its read error itself.
        let hot = if built.changelog {
            None
        } else {
            skew::hot_keys(ctx, agg, &built, sample).ok().flatten()
        };
        let choice = split::SplitChoice { buckets, why, hot };
        return split::build_split(ctx, agg, built, &aliases, plan, choice);
    }
    let built = aggregate::aggregate_on(ctx, agg, built, &aliases, Role::Whole, None)?;
    if let Some(why) = why {
        let label = ctx.labels.last().map(|l| l.0.clone()).unwrap_or_default();
        let unsplittable = if split {
            " (but nothing can be bucketed: its DISTINCT arguments are group keys, so it runs unsplit)"
        } else {
            ""
        };
        ctx.explain.strategy.push(format!(
            "{label}: split-distinct decided by {why}{unsplittable}."
        ));
    }
    Ok(built)
}
