//! Building an operator: the query as `datafusion_expr` expressions over an input schema, the
//! options, the clock; then [`GroupAggregateBuilder::build`] (one worker) or
//! [`GroupAggregateBuilder::build_parallel`] (P workers, in the phases [`crate::phases`]
//! decides), each reporting the settings that have no effect.

use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use datafusion_expr::Expr;

use crate::clock::{Clock, SystemClock};
use crate::config::{AggPhaseStrategy, Config};
use crate::error::{Error, Result};
use crate::operator::{GroupAggregate, ParallelAggregate};
use crate::plan::AggregatePlan;
use crate::runtime::Runtime;

/// Builds a [`GroupAggregate`]. Created by [`GroupAggregate::builder`].
#[derive(Debug)]
pub struct GroupAggregateBuilder {
    schema: SchemaRef,
    group_by: Vec<Expr>,
    aggregates: Vec<Expr>,
    config: Config,
    changelog: Option<String>,
    clock: Option<Arc<dyn Clock>>,
    monotonic_min_max: bool,
}

impl GroupAggregateBuilder {
    /// A builder over batches of `schema` (see [`GroupAggregate::builder`]).
    pub(crate) fn new(schema: SchemaRef) -> Self {
        Self {
            schema,
            group_by: vec![],
            aggregates: vec![],
            config: Config::default(),
            changelog: None,
            clock: None,
            monotonic_min_max: false,
        }
    }

    /// Group keys (expressions over the input; `alias` names the output column).
    pub fn group_by(mut self, keys: impl IntoIterator<Item = Expr>) -> Self {
        self.group_by.extend(keys);
        self
    }

    /// Aggregate calls ([`crate::aggregates`]), in output order.
    pub fn aggregate(mut self, aggregates: impl IntoIterator<Item = Expr>) -> Self {
        self.aggregates.extend(aggregates);
        self
    }

    /// The whole configuration.
    pub fn config(mut self, config: Config) -> Self {
        self.config = config;
        self
    }

    /// Sets one option by its Flink key.
    ///
    /// # Errors
    /// An unknown key or a bad value.
    pub fn option(mut self, key: &str, value: &str) -> Result<Self> {
        self.config.set(key, value)?;
        Ok(self)
    }

    /// Names the changelog column of the input (default: `op` when the schema has it).
    pub fn changelog_column(mut self, name: impl Into<String>) -> Self {
        self.changelog = Some(name.into());
        self
    }

    /// Makes the MIN/MAX calls ignore retractions and keep one value a group
    /// ([`crate::plan::AggregateCall::monotonic`]): for a changelog in which each MAX's argument
    /// only grows and each MIN's only shrinks, such as a split-distinct FINAL's input where the
    /// PARTIAL takes insert-only input. On another changelog the results are wrong.
    pub fn monotonic_min_max(mut self) -> Self {
        self.monotonic_min_max = true;
        self
    }

    /// The clock for the latency trigger (default: [`SystemClock`]).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// Validates the configuration, resolves the query and builds the operator.
    ///
    /// Settings that have no effect (a mini-batch size while mini-batch is off, the adaptive
    /// local phase's options in this one-phase operator, …: [`Config::ineffective_settings`])
    /// are printed once on standard error and kept in [`GroupAggregate::warnings`]; under
    /// `tally.strict` they are errors.
    ///
    /// # Errors
    /// Configuration errors (Flink's messages; `TWO_PHASE`, which needs
    /// [`GroupAggregateBuilder::build_parallel`]; split-distinct, which the SQL planner applies;
    /// with `tally.strict`, a setting that has no effect) and plan errors (unknown column,
    /// unsupported function or type).
    pub fn build(self) -> Result<GroupAggregate> {
        self.config.validate()?;
        if self.config.agg_phase_strategy == AggPhaseStrategy::TwoPhase {
            return Err(Error::config(
                crate::config::AGG_PHASE_STRATEGY,
                "TWO_PHASE needs the parallel operator: use build_parallel() (build() makes the one-phase operator)",
            ));
        }
        let plan = self.resolve()?;
        // No local phase runs in this operator.
        let mut warnings = self.config.ineffective_settings();
        warnings.extend(self.config.adaptive_without_local_phase());
        crate::config::report_warnings(&self.config, &warnings)?;
        let mut agg = GroupAggregate::try_new(
            Arc::new(plan),
            self.config,
            self.clock.unwrap_or_else(|| Arc::new(SystemClock)),
        )?;
        agg.warnings = warnings;
        Ok(agg)
    }
}

impl GroupAggregateBuilder {
    /// Checks what no single operator can honour and resolves the query.
    fn resolve(&self) -> Result<AggregatePlan> {
        check_no_split(&self.config)?;
        let mut plan = AggregatePlan::try_new(
            Arc::clone(&self.schema),
            &self.group_by,
            &self.aggregates,
            self.changelog.as_deref(),
        )?;
        if self.monotonic_min_max {
            plan.set_monotonic_min_max();
        }
        Ok(plan)
    }

    /// Validates the configuration, resolves the query and builds a [`ParallelAggregate`] over
    /// `table.exec.resource.default-parallelism` workers, in two phases where Flink would use
    /// them (mini-batch on and `table.optimizer.agg-phase-strategy` not `ONE_PHASE`; see
    /// [`crate::phases`]). Settings that have no effect (`TWO_PHASE` without mini-batch, say)
    /// are warnings, as for [`GroupAggregateBuilder::build`].
    ///
    /// # Errors
    /// As [`GroupAggregateBuilder::build`].
    pub fn build_parallel(self) -> Result<ParallelAggregate> {
        self.config.validate()?;
        let plan = self.resolve()?;
        let decision = crate::phases::decide(&self.config, false, |_| "the aggregate".into());
        let mut warnings = self.config.ineffective_settings();
        warnings.extend(decision.warnings);
        if !decision.two_phase {
            warnings.extend(self.config.adaptive_without_local_phase());
        }
        crate::config::report_warnings(&self.config, &warnings)?;
        let runtime = Runtime::new(self.config.parallelism)?;
        Ok(ParallelAggregate::try_new(
            Arc::new(plan),
            self.config,
            self.clock.unwrap_or_else(|| Arc::new(SystemClock)),
            runtime,
            decision.two_phase,
        )?
        .with_warnings(warnings))
    }
}

/// Split-distinct is a rewrite of the query into two aggregates, which the SQL planner does
/// (`tally::sql`, feature `sql`); a single operator cannot honour it, so asking is an error rather
/// than a silent no-op.
fn check_no_split(config: &Config) -> Result<()> {
    if config.split_enabled {
        return Err(Error::config(
            crate::config::SPLIT_ENABLED,
            "split-distinct rewrites the query into a PARTIAL and a FINAL aggregate, which the SQL front end (tally::sql) plans; a single operator cannot apply it, so turn it off here",
        ));
    }
    Ok(())
}
