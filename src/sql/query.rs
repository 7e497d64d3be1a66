//! A planned query: the job that runs it ([`crate::run::Job`]) and its EXPLAIN, with what its
//! changelog looks like (keys, `-U` rows) for the sink that materializes it.

use std::sync::Arc;

use arrow::datatypes::SchemaRef;

use crate::error::{Error, Result};
use crate::explain::{Explain, ExplainDetail};
use crate::run::Job;
use crate::sink::{Discard, ResultTable};

/// A query planned into a job (a pipeline over one file table) and its EXPLAIN.
pub struct PlannedQuery {
    pub(super) job: Job,
    pub(super) output: SchemaRef,
    pub(super) explain: Explain,
    pub(super) warnings: Vec<String>,
    pub(super) changelog_output: bool,
    /// Output positions of the top aggregate's group keys, when they survive to the output.
    pub(super) keys: Option<Vec<usize>>,
    pub(super) update_before: bool,
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
    /// strategy and the runtime a run would take ([`crate::run::Job::planned_runtime`]); with
    /// PLAN_ADVICE the advice, with CHANGELOG_MODE each node's row kinds.
    pub fn explain(&self, details: &[ExplainDetail]) -> String {
        let mut explain = self.explain.clone();
        explain
            .strategy
            .push(format!("Runtime: {}", self.job.planned_runtime()));
        explain.render(details, None)
    }

    /// EXPLAIN ANALYZE: runs the query (reading its source in batches of `batch_size` rows and
    /// discarding the output), then returns the plan with each aggregate stage annotated with
    /// its rows in and out and busy time, and a metrics section per aggregate (workers, skew
    /// ratio, state, the local phase's reduction ratio and decision, hot keys).
    ///
    /// # Errors
    /// As [`crate::run::Job::run`].
    pub fn explain_analyze(
        &mut self,
        details: &[ExplainDetail],
        batch_size: usize,
    ) -> Result<String> {
        let started = std::time::Instant::now();
        let stats = self.job.run(batch_size, &mut Discard, |_, _| {})?;
        let mut explain = self.explain.clone();
        explain.strategy.push(format!("Runtime: {}", stats.runtime));
        let mut text = explain.render(details, Some(&stats.aggregates));
        text.push_str(&format!(
            "\n== Metrics ==\nrows read {}, output rows {}, wall time {:.1} ms{}\n",
            stats.rows_in,
            stats.rows_out,
            started.elapsed().as_secs_f64() * 1e3,
            stats.serial_fraction.map_or(String::new(), |f| format!(
                ", at most one task busy {:.1} % of it",
                f * 100.0
            )) + &stats
                .mean_busy_tasks
                .map_or(String::new(), |m| format!(", {m:.2} tasks busy on average"))
        ));
        for (i, m) in stats.aggregates.iter().enumerate() {
            text.push_str(&format!("aggregate {i}: {m}"));
        }
        Ok(text)
    }
}
