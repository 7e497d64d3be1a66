//! Where an aggregate may drop its `-U` rows (`tally.exec.emit.update-before = false`).

use super::context::{Built, Ctx, Role};
use crate::error::{Error, Result};

/// Applies `tally.exec.emit.update-before = false` as Flink's changelog-mode inference does: an
/// aggregate may drop its `-U` rows only when its changes go straight to the sink (through
/// projections that keep its group keys), where an upsert consumer keyed by those keys needs
/// none; an aggregate whose changes feed a filter, another aggregate or a projection that drops
/// its keys keeps them, and the plan says why (a warning; an error under `tally.strict`).
/// Returns whether the query's output carries `-U` rows.
pub(super) fn settle_update_before(ctx: &mut Ctx<'_>, built: &mut Built) -> Result<bool> {
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
        let node = built
            .nodes
            .iter()
            .rposition(|n| n.step.is_some_and(|(i, step)| i == agg && step.is_keyed()));
        match reason {
            None => {
                built.stages[stage].drop_update_before()?;
                dropped = stage == last;
                if let Some(node) = node {
                    for n in &mut built.nodes[node..] {
                        n.mode.retain(|m| *m != "UB");
                    }
                }
                ctx.explain.strategy.push(format!(
                    "{label}: emits no -U rows ('{key}' = 'false'): its changes go straight to the sink, which upserts them by the group keys."
                ));
            }
            Some(reason) => {
                ctx.explain.strategy.push(format!(
                    "{label}: keeps its -U rows: its changes feed {reason}, which needs them."
                ));
                ctx.warn(format!(
                    "'{key}' = 'false' has no effect on {label}: its changes feed {reason}, which needs the -U rows (Flink keeps them there too)"
                ))?;
                if let Some(node) = node {
                    let id = ctx.explain.advice.len();
                    built.nodes[node].advice.push(id);
                }
            }
        }
    }
    Ok(!dropped)
}
