//! Planning the split-distinct rewrite ([`crate::sql::split`]) into stages: Calc with the
//! bucket columns, Expand, the PARTIAL and FINAL aggregates, and a Calc back to the original
//! columns.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion_expr::Expr;

use super::aggregate::aggregate_on;
use super::context::{Built, Ctx, Role, field_names};
use crate::config::{AGG_PHASE_STRATEGY, INCREMENTAL_AGG, SPLIT_ENABLED};
use crate::error::Result;
use crate::explain::PlanNode;
use crate::operator::IncrementalAggregate;
use crate::pipeline::{ExpandStage, IncrementalStage};
use crate::plan::{BucketKeys, HotKeys};
use crate::sql::explain::show;

/// How a split-distinct aggregate splits: its bucket count, why it splits (where Tally decided,
/// for EXPLAIN), and its hot keys with their reason in words (None: every key is spread).
pub(super) struct SplitChoice {
    pub(super) buckets: u32,
    pub(super) why: Option<String>,
    pub(super) hot: Option<(HotKeys, String)>,
}

/// Plans the split-distinct rewrite of `agg` over `built` (see [`crate::sql::split`]): Calc with the
/// bucket columns, Expand when several arguments are bucketed, the PARTIAL aggregate, the FINAL
/// aggregate, and a Calc back to the original columns.
pub(super) fn build_split(
    ctx: &mut Ctx<'_>,
    agg: &datafusion_expr::logical_plan::Aggregate,
    mut built: Built,
    aliases: &HashMap<String, String>,
    split: crate::sql::split::Split,
    choice: SplitChoice,
) -> Result<Built> {
    let SplitChoice { buckets, why, hot } = choice;
    ctx.split_buckets = Some(buckets);
    let in_df = agg.input.schema();
    // Calc: the input columns the aggregate reads, and the buckets.
    built.project(in_df, &split.pre_exprs, split.pre_schema.as_arrow())?;
    let mode = built.mode();
    let mut select: Vec<String> = field_names(&split.pre_schema)
        .into_iter()
        .take(split.pre_exprs.len() - split.keys.len() - split.buckets.len() - split.filters.len())
        .map(|n| built.names.get(&n).cloned().unwrap_or(n))
        .collect();
    for (key, name) in &split.keys {
        select.push(format!("{} AS {name}", show(key)));
    }
    for (arg, name) in &split.buckets {
        select.push(format!(
            "MOD(HASH_CODE({}), {}) AS {name}",
            show(arg),
            buckets
        ));
    }
    for (condition, name) in &split.filters {
        select.push(format!("{} AS {name}", show(condition)));
    }
    built.nodes.push(PlanNode::new(
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
        built.nodes.push(PlanNode::new(
            "Expand",
            vec![format!("projects=[{}]", projects.join(", "))],
            mode,
        ));
    }
    let keys: Vec<String> = agg.group_expr.iter().map(show).collect();
    let final_label = if keys.is_empty() {
        "GroupAggregate".to_string()
    } else {
        format!("GroupAggregate(groupBy=[{}])", keys.join(", "))
    };
    // The PARTIAL's keys: the hoisted ones by their column's name, then the buckets.
    let mut label_keys: Vec<String> = split.partial.group_expr.iter().map(show).collect();
    label_keys.truncate(keys.len());
    label_keys.extend(split.buckets.iter().map(|b| b.1.clone()));
    let sets = split.expand.as_ref().map_or(1, |e| e.sets.len());
    let split_note = ctx.explain.strategy.len();
    ctx.explain.strategy.push(format!(
        "{final_label}: split-distinct applies ({}): a PARTIAL aggregate grouped by [{}]{} computes the calls per bucket, a FINAL aggregate grouped by the keys merges them ($SUM0 for COUNT and AVG's parts, SUM, MIN, MAX), consuming the partial changelog with retraction.",
        why.unwrap_or_else(|| format!("'{SPLIT_ENABLED}' = 'true', {buckets} buckets")),
        label_keys.join(", "),
        if sets > 1 {
            format!(" over an Expand of {sets} group sets (one per bucketed argument, $e tells them apart)")
        } else {
            String::new()
        }
    ));
    let (hot, hot_why) = match hot {
        Some((keys, why)) => (Some(Arc::new(keys)), Some(why)),
        None => (None, None),
    };
    let bucket_keys = BucketKeys {
        columns: split.buckets.len(),
        buckets,
        call_sets: split.call_sets.clone(),
        hot,
    };
    let built = aggregate_on(
        ctx,
        &split.partial,
        built,
        &HashMap::new(),
        Role::Partial,
        Some(bucket_keys),
    )?;
    let mut built = aggregate_on(
        ctx,
        &split.final_agg,
        built,
        &HashMap::new(),
        Role::Final,
        None,
    )?;
    let monotonic = built
        .stages
        .last()
        .and_then(|s| s.as_aggregate())
        .is_some_and(|f| f.plan().calls.iter().any(|c| c.monotonic));
    if monotonic && let Some(note) = ctx.explain.strategy.get_mut(split_note) {
        note.push_str(" Over insert-only input each PARTIAL MIN/MAX only moves its way, so the FINAL's MIN/MAX take no retraction and keep one value a key (Flink's plan).");
    }
    incremental(ctx, &mut built, &label_keys, agg.group_expr.len())?;
    // Hot keys are spread alone in every runtime; only under the incremental aggregate do the
    // PARTIAL's workers merge its buckets (on the pipelined runtime), and only there, in a run
    // without checkpoints, may the FINAL read the cold keys' rows through.
    let n = built.stages.len();
    let fin = built.stages.last().and_then(|s| s.as_incremental());
    let cold_through = match (fin, n.checked_sub(2).map(|i| &built.stages[i])) {
        (Some(fin), Some(partial)) => partial
            .as_aggregate()
            .is_some_and(|p| fin.cold_through_fits(p.plan())),
        _ => false,
    };
    if let (Some(why), Some(note)) = (hot_why, ctx.explain.strategy.get_mut(split_note)) {
        note.push_str(&format!(
            " Only hot keys are spread: {why}; every other key's values stay on its own worker, its buckets NULL (a checkpoint records the hot keys, and a run resumed from it keeps them).{}",
            if cold_through {
                " Where the PARTIAL's workers merge its buckets (the pipelined runtime, without checkpoints), each cold key has one PARTIAL row, whose results are the FINAL's: the FINAL reads their changes through (each PARTIAL worker merging them per key over the FINAL's mini-batch, where that pays) and keeps state for the hot keys alone."
            } else {
                ""
            }
        ));
    }
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
        built.nodes.push(PlanNode::new(
            "Calc",
            vec![format!("select=[{}]", select.join(", "))],
            mode,
        ));
    }
    built.keys = Some((0..agg.group_expr.len()).collect());
    built.names = names;
    Ok(built)
}

/// Flink's `IncrementalAggregateRule`: with `table.optimizer.incremental-agg-enabled` and both
/// aggregates of the split in two phases, the FINAL (the last stage of `built`) becomes an
/// [`IncrementalStage`]: each firing of a PARTIAL worker is folded into delta accumulators per
/// key, which a global phase in one shard per worker merges. EXPLAIN shows Flink's plan: the PARTIAL's global phase
/// and the FINAL's local phase as one `IncrementalGroupAggregate` node (grouped by
/// `partial_keys`; the first `final_keys` of them are the FINAL's), the FINAL's Calc and local
/// phase gone.
fn incremental(
    ctx: &mut Ctx<'_>,
    built: &mut Built,
    partial_keys: &[String],
    final_keys: usize,
) -> Result<()> {
    let n = built.stages.len();
    let two_phase =
        |s: &dyn crate::pipeline::Stage| s.as_aggregate().is_some_and(|a| a.is_two_phase());
    if !ctx.config.incremental_agg {
        return Ok(());
    }
    if n < 2 || !two_phase(built.stages[n - 1].as_ref()) || !two_phase(built.stages[n - 2].as_ref())
    {
        if ctx.config.is_set(INCREMENTAL_AGG) {
            ctx.warn(format!(
                "'{INCREMENTAL_AGG}' = 'true' has no effect: the split aggregates do not both run in two phases (they need mini-batch and '{AGG_PHASE_STRATEGY}' other than ONE_PHASE)"
            ))?;
        }
        return Ok(());
    }
    let Some(final_agg) = built.stages[n - 1].as_aggregate() else {
        return Ok(());
    };
    let reads_through = final_agg.config().state_ttl.is_zero()
        && built.stages[n - 2].as_aggregate().is_some_and(|p| {
            crate::operator::read_through::through_columns(p.plan(), final_agg.plan()).is_some()
        });
    let stage = IncrementalStage::new(IncrementalAggregate::try_new_sharded(
        final_agg.shared_plan(),
        final_agg.config().clone(),
        Arc::clone(&ctx.clock),
        final_agg.key_groups().clone(),
    )?);
    built.stages[n - 1] = Box::new(stage);
    // The nodes: ..., the PARTIAL's GlobalGroupAggregate, then the FINAL's Calc,
    // LocalGroupAggregate, Exchange and GlobalGroupAggregate.
    let m = built.nodes.len();
    let final_local = built.nodes[m - 3].attrs.last().cloned().unwrap_or_default();
    let partial = &mut built.nodes[m - 5];
    partial.name = "IncrementalGroupAggregate";
    partial.attrs = vec![
        format!("partialAggGrouping=[{}]", partial_keys.join(", ")),
        format!(
            "finalAggGrouping=[{}]",
            partial_keys[..final_keys].join(", ")
        ),
        final_local,
    ];
    partial.mode = vec!["I"];
    built.nodes.drain(m - 4..m - 2);
    let label = ctx.labels.last().map(|l| l.0.clone()).unwrap_or_default();
    if let Some(note) = ctx.explain.strategy.last_mut() {
        *note = format!(
            "{label}: the FINAL of split-distinct under Flink's incremental aggregate ('{INCREMENTAL_AGG}' = 'true'): each firing of a PARTIAL worker becomes one row of delta accumulators per key (its IncrementalGroupAggregate), merged by a GlobalGroupAggregate on every worker (each key's on the worker of its key group), which fires on the mini-batch size (counting its delta rows) and latency. On the pipelined runtime the PARTIAL's workers key their state by [{}] alone (with checkpoints, where a checkpoint can cut that state back into a group per bucket: over insert-only input, each call's state with a bucketed DISTINCT argument or with the keys alone): the buckets only route rows, and a worker holds one group per key instead of one per bucket.{}",
            partial_keys[..final_keys].join(", "),
            if reads_through {
                " On one worker, in a run without checkpoints, each key then has one PARTIAL row, whose results are the FINAL's: the FINAL reads the PARTIAL's changes through (cut at its firings) and keeps no state."
            } else {
                ""
            }
        );
    }
    Ok(())
}
