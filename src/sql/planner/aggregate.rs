//! Planning one GROUP BY: the phase decision, the operator and its stage, its EXPLAIN nodes and
//! strategy notes, and the warnings about settings without effect on it.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion_expr::Expr;
use tally_kernels::aggregates::AggregateKind;

use super::context::{Built, Ctx, Role, unsupported};
use crate::config::SPLIT_ENABLED;
use crate::error::Result;
use crate::operator::ParallelAggregate;
use crate::pipeline::AggregateStage;
use crate::plan::{AggregatePlan, BucketKeys};
use crate::sql::explain::{AggregateShape, aggregate_label, aggregate_nodes};

/// Plans `agg` over `built` in its `role`; `bucket_keys` tells a split PARTIAL's bucket keys.
pub(super) fn aggregate_on(
    ctx: &mut Ctx<'_>,
    agg: &datafusion_expr::logical_plan::Aggregate,
    mut built: Built,
    aliases: &HashMap<String, String>,
    role: Role,
    bucket_keys: Option<BucketKeys>,
) -> Result<Built> {
    let agg_index = ctx.aggregates;
    ctx.aggregates += 1;
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
    plan.bucket_keys = bucket_keys;
    // A split FINAL over a PARTIAL of insert-only input: each PARTIAL MIN/MAX only moves its
    // way, so the FINAL's need not retract (Flink's plan).
    let partial_insert_only = || {
        built
            .stages
            .last()
            .and_then(|s| s.as_aggregate())
            .is_some_and(|p| !p.plan().has_retractions())
    };
    if role == Role::Final && partial_insert_only() {
        plan.set_monotonic_min_max();
    }
    // The resolved kind of each call (COUNT(*) or COUNT(x), MIN/MAX, …), for EXPLAIN.
    let kinds: Vec<AggregateKind> = plan.calls.iter().map(|c| c.kind).collect();
    let monotonic: Vec<bool> = plan.calls.iter().map(|c| c.monotonic).collect();

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

    let mut shown = aggregate_nodes(
        agg,
        AggregateShape {
            index: agg_index,
            aliases,
            partial_final: match role {
                Role::Whole => None,
                Role::Partial => Some("PARTIAL"),
                Role::Final => Some("FINAL"),
            },
            changelog,
            two_phase,
            in_mode: built.mode(),
            kinds,
            monotonic,
            acc_names,
            count1: count1_name,
        },
    )?;
    let (keys, has_distinct, distinct_args) =
        (&shown.keys, shown.has_distinct, &shown.distinct_args);
    let label = aggregate_label(two_phase, &agg.group_expr);
    ctx.labels.push((label.clone(), role));

    let mut node_advice = vec![];
    let workers = ctx.runtime.parallelism();
    if let Some(advice) = decision.advice(&cfg) {
        node_advice.push(ctx.explain.add_advice("ADVICE", advice));
    }
    let note = decision.note(&label, &cfg, workers);
    for w in decision.warnings.clone() {
        ctx.warn(w)?;
        node_advice.push(ctx.explain.advice.len());
    }
    ctx.explain.strategy.push(note);
    // Split-distinct (the parts of a split aggregate are not split again).
    if role != Role::Whole {
    } else if cfg.split_enabled && !cfg.split_auto {
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
        ctx.explain.strategy.push(format!(
            "{label}: split-distinct requested; {}",
            w.split(": ").last().unwrap_or("")
        ));
        ctx.warn(w)?;
        node_advice.push(ctx.explain.advice.len());
    } else if has_distinct && !cfg.split_auto {
        ctx.explain.strategy.push(format!(
            "{label}: split-distinct off ('{SPLIT_ENABLED}' = 'false')."
        ));
    }
    if let Some(keyed) = shown.nodes.last_mut() {
        keyed.advice = node_advice;
    }
    built.nodes.append(&mut shown.nodes);
    built.changelog = true;
    built.keys = Some((0..agg.group_expr.len()).collect());
    built.names = shown.names;
    Ok(built)
}
