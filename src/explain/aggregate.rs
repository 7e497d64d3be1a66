//! EXPLAIN for an aggregate built through the library: its steps as plan nodes (Calc,
//! [LocalGroupAggregate,] Exchange, GroupAggregate or GlobalGroupAggregate) and the phase
//! decision's note, without SQL. The SQL planner shows the same steps in Flink's full names
//! (`tally::sql`).

use super::{AggregateStep, Explain, PlanNode};
use crate::config::Config;
use crate::operator::{GroupAggregate, ParallelAggregate};
use crate::phases::PhaseDecision;
use crate::plan::AggregatePlan;

/// The nodes of an aggregate of `plan` (aggregate 0 of its pipeline): Calc, then the local phase
/// (`two_phase`) and the exchange (`exchange`), then the keyed step.
fn nodes(
    plan: &AggregatePlan,
    config: &Config,
    two_phase: bool,
    exchange: bool,
    keyed: AggregateStep,
) -> Vec<PlanNode> {
    let in_mode: Vec<&'static str> = if plan.changelog {
        vec!["I", "UB", "UA", "D"]
    } else {
        vec!["I"]
    };
    let keys = plan.key_names.join(", ");
    let mut calc: Vec<String> = plan.key_names.clone();
    calc.extend(plan.calc.arg_names.iter().cloned());
    calc.extend(
        plan.calc
            .filter_names
            .iter()
            .enumerate()
            .map(|(i, f)| format!("{f} AS $f{i}")),
    );
    let calls: Vec<String> = plan
        .calls
        .iter()
        .map(|c| {
            let arg = c
                .arg
                .and_then(|a| plan.calc.arg_names.get(a))
                .map_or("*".to_string(), |a| {
                    format!("{}{a}", if c.distinct { "DISTINCT " } else { "" })
                });
            let filter = c
                .filter
                .map(|f| format!(" FILTER $f{f}"))
                .unwrap_or_default();
            format!("{}({arg}){filter} AS {}", c.kind.name(), c.name)
        })
        .collect();
    let group_by = (!keys.is_empty()).then(|| format!("groupBy=[{keys}]"));
    let select = |calls: &[String]| {
        let mut attrs: Vec<String> = group_by.iter().cloned().collect();
        let mut cols: Vec<String> = plan.key_names.clone();
        cols.extend(calls.iter().cloned());
        attrs.push(format!("select=[{}]", cols.join(", ")));
        attrs
    };
    let mut out_mode = vec!["I", "UB", "UA", "D"];
    out_mode.retain(|m| match *m {
        "UB" => config.emit_update_before,
        "D" => plan.changelog,
        _ => true,
    });
    let mut nodes = vec![PlanNode::step(
        0,
        AggregateStep::Calc,
        vec![format!("select=[{}]", calc.join(", "))],
        in_mode.clone(),
    )];
    if two_phase {
        nodes.push(PlanNode::step(
            0,
            AggregateStep::LocalGroupAggregate,
            select(&calls),
            vec!["I"],
        ));
    }
    if exchange {
        let distribution = if keys.is_empty() {
            "single".to_string()
        } else {
            format!("hash[{keys}]")
        };
        nodes.push(PlanNode::step(
            0,
            AggregateStep::Exchange,
            vec![format!("distribution=[{distribution}]")],
            if two_phase { vec!["I"] } else { in_mode },
        ));
    }
    nodes.push(PlanNode::step(0, keyed, select(&calls), out_mode));
    nodes
}

/// `nodes` with the phase decision's note (for an aggregate on `workers` workers), Flink's
/// advice and the warnings attached to the keyed step.
fn explain(
    mut nodes: Vec<PlanNode>,
    config: &Config,
    decision: &PhaseDecision,
    workers: Option<usize>,
) -> Explain {
    let mut explain = Explain::default();
    let mut advice = vec![];
    if let Some(workers) = workers {
        let label = AggregateStep::keyed(decision.two_phase).name();
        explain.strategy.push(decision.note(label, config, workers));
        if let Some(a) = decision.advice(config) {
            advice.push(explain.add_advice("ADVICE", a));
        }
    }
    for w in &decision.warnings {
        advice.push(explain.add_advice("WARNING", w.clone()));
    }
    if let Some(keyed) = nodes.last_mut() {
        keyed.advice = advice;
    }
    explain.nodes = nodes;
    explain
}

impl ParallelAggregate {
    /// What runs, as EXPLAIN shows it: Calc, (LocalGroupAggregate,) Exchange, and
    /// GroupAggregate or GlobalGroupAggregate, with how many workers and why so many phases,
    /// and the settings that had no effect as warnings. Render it with
    /// [`Explain::render`], with this aggregate's [`ParallelAggregate::metrics`] for EXPLAIN
    /// ANALYZE.
    pub fn explain(&self) -> Explain {
        let decision = PhaseDecision {
            two_phase: self.is_two_phase(),
            warnings: self.warnings().to_vec(),
            partitioned: false,
        };
        let two_phase = decision.two_phase;
        let nodes = nodes(
            self.plan(),
            self.config(),
            two_phase,
            true,
            AggregateStep::keyed(two_phase),
        );
        explain(nodes, self.config(), &decision, Some(self.parallelism()))
    }
}

impl GroupAggregate {
    /// What runs, as EXPLAIN shows it: Calc and GroupAggregate (or GlobalGroupAggregate for a
    /// global phase), and the settings that had no effect as warnings; see
    /// [`ParallelAggregate::explain`].
    pub fn explain(&self) -> Explain {
        let decision = PhaseDecision {
            two_phase: false,
            warnings: self.warnings().to_vec(),
            partitioned: false,
        };
        let keyed = AggregateStep::keyed(self.is_global());
        let nodes = nodes(self.plan(), self.config(), false, false, keyed);
        explain(nodes, self.config(), &decision, None)
    }
}
