//! What the planner carries while it walks the plan: the context of the whole query ([`Ctx`]:
//! catalog, config, runtime, clock, EXPLAIN notes and warnings) and what a subtree built
//! ([`Built`]: its source, stages, EXPLAIN nodes, changelog mode, keys and column names).

use std::collections::HashMap;
use std::sync::Arc;

use arrow::datatypes::Schema;
use datafusion_common::DFSchema;
use datafusion_expr::Expr;
use datafusion_expr::expr::Alias;

use crate::clock::{Clock, ManualClock};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::explain::{Explain, PlanNode};
use crate::pipeline::{CalcStage, Stage};
use crate::runtime::Runtime;
use crate::source::FileTable;
use crate::sql::Catalog;

/// An aggregate's part in a split-distinct rewrite.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Role {
    /// Not split.
    Whole,
    /// The PARTIAL aggregate, grouped by the keys and the buckets.
    Partial,
    /// The FINAL aggregate, merging the partial results.
    Final,
}

/// What planning a subtree built.
pub(super) struct Built {
    pub(super) table: FileTable,
    pub(super) stages: Vec<Box<dyn Stage>>,
    pub(super) nodes: Vec<PlanNode>,
    pub(super) changelog: bool,
    /// Positions of the last aggregate's group keys in this subtree's output.
    pub(super) keys: Option<Vec<usize>>,
    /// EXPLAIN names of this subtree's output columns, where they differ from the schema's.
    pub(super) names: HashMap<String, String>,
}

impl Built {
    /// Adds a Calc stage computing `exprs` over `input` into batches of `output`; the keys the
    /// input is partitioned by survive where the projection passes them through as columns.
    pub(super) fn project(
        &mut self,
        input: &DFSchema,
        exprs: &[Expr],
        output: &Schema,
    ) -> Result<()> {
        // Keys survive a projection that passes them through as columns.
        self.keys = self.keys.as_ref().and_then(|keys| {
            keys.iter()
                .map(|&k| {
                    exprs.iter().position(|e| {
                        let e = match e {
                            Expr::Alias(Alias { expr, .. }) => expr.as_ref(),
                            other => other,
                        };
                        matches!(e, Expr::Column(c) if input.index_of_column(c).ok() == Some(k))
                    })
                })
                .collect::<Option<Vec<_>>>()
        });
        self.stages.push(Box::new(CalcStage::try_new(
            input,
            None,
            Some(exprs),
            Arc::new(output.clone()),
        )?));
        Ok(())
    }

    /// The changelog mode of the subtree's top node.
    pub(super) fn mode(&self) -> Vec<&'static str> {
        self.nodes
            .last()
            .map(|n| n.mode.clone())
            .unwrap_or_default()
    }
}

pub(super) struct Ctx<'a> {
    pub(super) catalog: &'a Catalog,
    pub(super) config: Config,
    pub(super) runtime: Arc<Runtime>,
    /// Aggregates planned so far.
    pub(super) aggregates: usize,
    pub(super) has_aggregate: bool,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) manual: Option<ManualClock>,
    /// The plan's strategy notes and advice (its nodes are built with the stages).
    pub(super) explain: Explain,
    pub(super) warnings: Vec<String>,
    /// Aliases of the Projection being planned (output column → alias), for the aggregate
    /// below it to name its results in EXPLAIN.
    pub(super) pending: HashMap<String, String>,
    /// Each aggregate's EXPLAIN label and role, in planning order (its index).
    pub(super) labels: Vec<(String, Role)>,
    /// The bucket count of the split-distinct rewrites planned (the same for all).
    pub(super) split_buckets: Option<u32>,
    /// Aggregates planned with a local phase.
    pub(super) local_phases: usize,
}

impl Ctx<'_> {
    /// Records a warning about a setting with no effect; an error under `tally.strict`.
    pub(super) fn warn(&mut self, w: String) -> Result<()> {
        if self.config.strict {
            return Err(crate::config::strict_error(&w));
        }
        self.explain.add_advice("WARNING", w.clone());
        self.warnings.push(w);
        Ok(())
    }
}

pub(super) fn unsupported(what: &str) -> Error {
    Error::plan(format!(
        "{what} is not supported in a streaming GROUP BY query"
    ))
}

pub(super) fn field_names(schema: &DFSchema) -> Vec<String> {
    schema.fields().iter().map(|f| f.name().clone()).collect()
}
