//! EXPLAIN: a plan as nodes in Flink's names, printed Flink-style, and annotated with the
//! metrics of a run (EXPLAIN ANALYZE).
//!
//! An [`Explain`] is built beside what runs: the SQL planner builds one for a query's pipeline
//! (`tally::sql`), and an aggregate built through the library explains itself
//! ([`crate::ParallelAggregate::explain`], [`crate::GroupAggregate::explain`], written in
//! `explain/aggregate.rs`). A node that shows one step of an aggregate carries
//! the aggregate's position in the pipeline and the [`AggregateStep`], by which
//! [`Explain::render`] finds that step's figures in the run's [`AggregateMetrics`].

mod aggregate;

pub use crate::operator::metrics::AggregateStep;
use crate::operator::{AggregateMetrics, TaskRole};

/// EXPLAIN details.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExplainDetail {
    /// `PLAN_ADVICE`: advice and warnings attached to nodes.
    PlanAdvice,
    /// `CHANGELOG_MODE`: each node's changelog mode.
    ChangelogMode,
}

/// One node of a plan: one line of EXPLAIN.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanNode {
    /// The node's name (Flink's).
    pub name: &'static str,
    /// Its attributes, `key=[value]`, in order.
    pub attrs: Vec<String>,
    /// The row kinds it emits: `I`, `UB`, `UA`, `D`.
    pub mode: Vec<&'static str>,
    /// The numbers (from 1) of the [`Explain::advice`] entries about it.
    pub advice: Vec<usize>,
    /// The aggregate (its position among the pipeline's aggregates, first is 0) and the step
    /// of it the node shows, whose metrics EXPLAIN ANALYZE adds.
    pub step: Option<(usize, AggregateStep)>,
}

impl PlanNode {
    /// A node without advice or metrics.
    pub fn new(name: &'static str, attrs: Vec<String>, mode: Vec<&'static str>) -> Self {
        Self {
            name,
            attrs,
            mode,
            advice: vec![],
            step: None,
        }
    }

    /// The node of `step` of aggregate `aggregate`.
    pub fn step(
        aggregate: usize,
        step: AggregateStep,
        attrs: Vec<String>,
        mode: Vec<&'static str>,
    ) -> Self {
        Self {
            step: Some((aggregate, step)),
            ..Self::new(step.name(), attrs, mode)
        }
    }
}

/// Advice or a warning (PLAN_ADVICE).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Advice {
    /// `ADVICE` or `WARNING`.
    pub kind: &'static str,
    /// The text.
    pub text: String,
}

/// A plan as EXPLAIN shows it: a chain of nodes (source first), what the aggregate strategy
/// decided and why, and advice.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Explain {
    /// The nodes, source first.
    pub nodes: Vec<PlanNode>,
    /// One note per decision about an aggregate (phases, split-distinct, `-U` rows).
    pub strategy: Vec<String>,
    /// Advice and warnings, numbered from 1 in the text.
    pub advice: Vec<Advice>,
}

impl Explain {
    /// Adds advice or a warning and returns its number.
    pub fn add_advice(&mut self, kind: &'static str, text: String) -> usize {
        self.advice.push(Advice { kind, text });
        self.advice.len()
    }

    /// The plan as text, Flink-style: one node per line, the sink-side node first, indented as
    /// a tree, then the aggregate strategy; with PLAN_ADVICE the advice, with CHANGELOG_MODE
    /// each node's row kinds; with the `metrics` of a run (per aggregate, in pipeline order)
    /// each aggregate step's rows in and out and busy time, and the keyed step's workers, skew
    /// and state.
    pub fn render(
        &self,
        details: &[ExplainDetail],
        metrics: Option<&[AggregateMetrics]>,
    ) -> String {
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
            if let (Some(metrics), Some((agg, step))) = (metrics, node.step)
                && let Some(m) = metrics.get(agg)
            {
                attrs.extend(analyzed(m, step));
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

/// EXPLAIN ANALYZE attributes for `step` of an aggregate with metrics `m`.
fn analyzed(m: &AggregateMetrics, step: AggregateStep) -> Vec<String> {
    let mut attrs = vec![];
    if let Some(s) = m.stages.iter().find(|s| s.step == step) {
        attrs.push(format!("rows=[in {}, out {}]", s.rows_in, s.rows_out));
        attrs.push(format!("busy=[{:.1} ms]", s.busy.as_secs_f64() * 1e3));
    }
    let tasks = |role: TaskRole| -> Vec<String> {
        m.runtime
            .iter()
            .flat_map(|r| &r.tasks)
            .filter(|t| t.role == role)
            .map(|t| {
                format!(
                    "{}: busy {:.1} ms{}, waiting on input {:.1} ms, on output {:.1} ms",
                    t.index,
                    t.busy.as_secs_f64() * 1e3,
                    if role == TaskRole::Source {
                        format!(" (reading {:.1} ms)", t.reading.as_secs_f64() * 1e3)
                    } else {
                        String::new()
                    },
                    t.waiting_input.as_secs_f64() * 1e3,
                    t.waiting_output.as_secs_f64() * 1e3
                )
            })
            .collect()
    };
    if step == AggregateStep::Calc && m.runtime.is_some() {
        attrs.push(format!("sources=[{}]", tasks(TaskRole::Source).join("; ")));
    }
    if step.is_keyed() {
        attrs.push(format!("workers=[{}]", m.parallelism));
        attrs.push(format!("keyGroups=[{}]", m.key_groups));
        if let Some(r) = &m.runtime {
            attrs.push(format!("tasks=[{}]", tasks(TaskRole::Keyed).join("; ")));
            attrs.push(format!(
                "serial=[{:.1} % of {:.1} ms]",
                r.serial_fraction * 100.0,
                r.wall.as_secs_f64() * 1e3
            ));
        }
        attrs.push(format!("skew=[{:.2}]", m.skew_ratio));
        attrs.push(format!(
            "state=[{} keys, {} bytes]",
            m.keys_in_state, m.state_bytes
        ));
        if m.distinct_pairs > 0 {
            attrs.push(format!(
                "distinct=[{} pairs, {} bytes]",
                m.distinct_pairs, m.distinct_bytes
            ));
        }
    }
    if step == AggregateStep::LocalGroupAggregate
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
