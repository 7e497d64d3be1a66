//! `ParallelAggregate`: a streaming GROUP BY over P workers, in one or two phases: its parts
//! (the workers, the local phases, the key groups, the trigger and the metrics) and what it
//! says about itself. It runs on one of two runtimes: the ordered one
//! ([`crate::operator::ordered`]: pushed slices, a barrier per step) and the pipelined one
//! ([`crate::operator::pipelined`]: input splits, a task per split and per worker, no barrier).

use std::sync::Arc;
use std::time::Duration;

use crate::clock::Clock;
use crate::config::Config;
use crate::error::Result;
use crate::operator::adaptive::Adaptive;
use crate::operator::exchange::MIN_SLICE_ROWS;
use crate::operator::key_groups::KeyGroups;
use crate::operator::metrics::{AggregateStep, RuntimeMetrics, StageMetrics};
use crate::operator::mini_batch::Trigger;
use crate::operator::{GroupAggregate, LocalGroupAggregate};
use crate::plan::AggregatePlan;
use crate::runtime::Runtime;

/// One worker: its keyed aggregate and what it was sent.
#[derive(Debug)]
pub(super) struct Worker {
    pub(super) agg: GroupAggregate,
    pub(super) rows_received: u64,
    pub(super) input_rows: u64,
    pub(super) busy: Duration,
}

/// A streaming GROUP BY over the workers of a [`Runtime`]: one phase (the exchange routes rows
/// to keyed [`GroupAggregate`]s) or two (per-slice [`LocalGroupAggregate`]s, an exchange of
/// accumulator rows, global phases), with the adaptive local phase. See the module docs.
///
/// # Examples
/// ```
/// use std::sync::Arc;
/// use arrow::array::{Int64Array, RecordBatch, StringArray};
/// use arrow::datatypes::{DataType, Field, Schema};
/// use datafusion_expr::col;
/// use tally::aggregates::{count_star, sum};
/// use tally::{Config, GroupAggregate};
///
/// let schema = Arc::new(Schema::new(vec![
///     Field::new("shop", DataType::Utf8, true),
///     Field::new("amount", DataType::Int64, true),
/// ]));
/// let config = Config::from_pairs([
///     ("table.exec.mini-batch.enabled", "true"),
///     ("table.exec.mini-batch.allow-latency", "1 s"),
///     ("table.exec.mini-batch.size", "1000"),
///     ("table.exec.resource.default-parallelism", "4"),
/// ]).unwrap();
/// let mut agg = GroupAggregate::builder(schema.clone())
///     .group_by([col("shop")])
///     .aggregate([count_star().alias("orders"), sum(col("amount")).alias("total")])
///     .config(config)
///     .build_parallel()
///     .unwrap();
/// assert!(agg.is_two_phase()); // AUTO with mini-batch on: local-global
/// let batch = RecordBatch::try_new(schema, vec![
///     Arc::new(StringArray::from(vec!["a", "b", "a"])),
///     Arc::new(Int64Array::from(vec![10, 20, 5])),
/// ]).unwrap();
/// agg.push(&batch).unwrap();
/// let changes = agg.finish().unwrap();
/// assert_eq!(changes.iter().map(|b| b.num_rows()).sum::<usize>(), 2); // +I a, +I b
/// let m = agg.metrics().unwrap();
/// assert_eq!(m.rows_in, 3);
/// assert_eq!(m.hot_keys[0], ("a".to_string(), 2));
/// ```
#[derive(Debug)]
pub struct ParallelAggregate {
    pub(super) plan: Arc<AggregatePlan>,
    pub(super) config: Config,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) runtime: Arc<Runtime>,
    pub(super) two_phase: bool,
    pub(super) locals: Vec<LocalGroupAggregate>,
    pub(super) workers: Vec<Worker>,
    /// When a mini-batch ends: `table.exec.mini-batch.size` rows per worker, or the latency.
    pub(super) trigger: Trigger,
    /// Rows of the current mini-batch: all of them, those the local phases folded, and those
    /// routed around them.
    pub(super) rows: u64,
    pub(super) folded: u64,
    pub(super) bypassed: u64,
    pub(super) adaptive: Adaptive,
    pub(super) calc: StageMetrics,
    pub(super) local: StageMetrics,
    pub(super) exchange: StageMetrics,
    pub(super) aggregate: StageMetrics,
    pub(super) mini_batches: u64,
    pub(super) min_slice_rows: usize,
    /// Settings that had no effect, found by the builder.
    pub(super) warnings: Vec<String>,
    /// Where the time of the last run on the pipelined runtime went.
    pub(super) runtime_metrics: Option<RuntimeMetrics>,
    /// The key groups and the worker owning each: where the exchange sends a key.
    pub(super) key_groups: KeyGroups,
}

impl ParallelAggregate {
    /// An aggregate of `plan` over the workers of `runtime`, in two phases when `two_phase`
    /// (which needs mini-batch).
    ///
    /// # Errors
    /// Two phases without mini-batch (Flink's message), and as [`GroupAggregate::try_new`].
    pub fn try_new(
        plan: Arc<AggregatePlan>,
        config: Config,
        clock: Arc<dyn Clock>,
        runtime: Arc<Runtime>,
        two_phase: bool,
    ) -> Result<Self> {
        config.validate()?;
        let p = runtime.parallelism();
        let key_groups = KeyGroups::new(usize::try_from(config.max_parallelism).unwrap_or(0), p)?;
        let mut workers = Vec::with_capacity(p);
        for _ in 0..p {
            let agg = if two_phase {
                GroupAggregate::try_new_global(
                    Arc::clone(&plan),
                    config.clone(),
                    Arc::clone(&clock),
                )?
            } else {
                GroupAggregate::try_new(Arc::clone(&plan), config.clone(), Arc::clone(&clock))?
            };
            let agg = agg.into_worker();
            workers.push(Worker {
                agg,
                rows_received: 0,
                input_rows: 0,
                busy: Duration::ZERO,
            });
        }
        let locals = if two_phase {
            (0..p)
                .map(|_| LocalGroupAggregate::try_new(Arc::clone(&plan)))
                .collect::<Result<Vec<_>>>()?
        } else {
            vec![]
        };
        let adaptive = Adaptive::new(&config, p);
        let size = usize::try_from(config.mini_batch_size)
            .unwrap_or(1)
            .saturating_mul(p);
        let trigger = Trigger::new(size, config.mini_batch_allow_latency);
        let stage = StageMetrics::new;
        Ok(Self {
            plan,
            config,
            clock,
            runtime,
            two_phase,
            locals,
            workers,
            trigger,
            rows: 0,
            folded: 0,
            bypassed: 0,
            adaptive,
            calc: stage(AggregateStep::Calc),
            local: stage(AggregateStep::LocalGroupAggregate),
            exchange: stage(AggregateStep::Exchange),
            aggregate: stage(AggregateStep::keyed(two_phase)),
            mini_batches: 0,
            min_slice_rows: MIN_SLICE_ROWS,
            warnings: vec![],
            runtime_metrics: None,
            key_groups,
        })
    }

    /// Sets the smallest slice worth a task of its own (default [`MIN_SLICE_ROWS`]); smaller
    /// input is processed by fewer workers. Tests set 1 to spread even tiny batches.
    pub fn with_min_slice_rows(mut self, rows: usize) -> Self {
        self.set_min_slice_rows(rows);
        self
    }

    /// As [`ParallelAggregate::with_min_slice_rows`], in place.
    pub fn set_min_slice_rows(&mut self, rows: usize) {
        self.min_slice_rows = rows.max(1);
    }

    /// Sets `tally.exec.emit.update-before` on every worker: with `false` no `-U` row is
    /// emitted (for an upsert consumer keyed by the group keys).
    pub fn set_emit_update_before(&mut self, emit: bool) {
        self.config.emit_update_before = emit;
        for w in &mut self.workers {
            w.agg.set_emit_update_before(emit);
        }
    }

    /// Has every worker emit its firings as delta rows ([`crate::operator::deltas`]), or the
    /// changelog again: for a split-distinct PARTIAL whose workers' folds take them. Nothing
    /// may be pending.
    pub(crate) fn set_emit_deltas(&mut self, on: bool) {
        for w in &mut self.workers {
            w.agg.set_emit_deltas(on);
        }
    }

    /// Has every worker key a split-distinct PARTIAL's state by the query's keys alone, the
    /// buckets only routing rows to workers, and its local phases fold by key and worker
    /// (`on`), or every key again (see [`GroupAggregate::merge_buckets`]). Workers holding
    /// state restored from a checkpoint (keyed by every key) merge it where its snapshots can
    /// be cut again ([`GroupAggregate::merge_restored_buckets`]), and otherwise keep their
    /// keying.
    ///
    /// # Errors
    /// A key type that cannot be a key (a bug: the plan's keys were checked).
    pub(crate) fn merge_buckets(&mut self, on: bool) -> Result<()> {
        for (i, w) in self.workers.iter_mut().enumerate() {
            w.agg.set_owner(&self.key_groups, i);
        }
        if self.workers.iter().any(|w| w.agg.holds_state()) {
            if !on || self.merges_buckets() || !self.cuts_merged_state() {
                return Ok(());
            }
            let tasks: Vec<_> = self.workers.iter_mut().collect();
            let merged = self.runtime.map(tasks, |w| w.agg.merge_restored_buckets());
            for m in merged {
                m?;
            }
        } else {
            for w in &mut self.workers {
                w.agg.merge_buckets(on)?;
            }
        }
        // The local phases fold a key's rows bound for one worker into one accumulator row,
        // whatever their buckets.
        let by = on.then_some(&self.key_groups);
        for l in &mut self.locals {
            l.merge_buckets(by)?;
        }
        Ok(())
    }

    /// Whether its workers' state can be snapshot where it merges a split PARTIAL's buckets
    /// ([`GroupAggregate::cuts_merged_state`]).
    pub(crate) fn cuts_merged_state(&self) -> bool {
        self.workers.iter().all(|w| w.agg.cuts_merged_state())
    }

    /// Whether its workers' state merges a split PARTIAL's buckets
    /// ([`ParallelAggregate::merge_buckets`]).
    pub(crate) fn merges_buckets(&self) -> bool {
        self.workers.iter().all(|w| w.agg.merges_buckets())
    }

    /// Whether its local phases (a split PARTIAL's on several workers) fold a key's rows
    /// whatever their buckets and route each DISTINCT entry when they flush, so that they read
    /// no bucket column and only the rows that go around them need one ([`BucketFill`]).
    ///
    /// [`BucketFill`]: crate::plan::BucketFill
    pub(crate) fn routes_at_flush(&self) -> bool {
        !self.locals.is_empty()
            && self.locals.iter().all(LocalGroupAggregate::routes_at_flush)
            && crate::plan::BucketFill::try_new(self.plan()).is_some()
    }

    /// Makes sure there are at least `n` local phases (two-phase only), the new ones folding as
    /// the first does: the pipelined runtime gives each split one.
    ///
    /// # Errors
    /// As [`LocalGroupAggregate::try_new`].
    pub(crate) fn add_locals(&mut self, n: usize) -> Result<()> {
        let merged = self
            .locals
            .first()
            .is_some_and(LocalGroupAggregate::merges_buckets);
        while self.locals.len() < n {
            let mut local = LocalGroupAggregate::try_new(Arc::clone(&self.plan))?;
            if merged {
                local.merge_buckets(Some(&self.key_groups))?;
            }
            self.locals.push(local);
        }
        Ok(())
    }

    /// Keeps the settings that had no effect on this aggregate (see
    /// [`ParallelAggregate::warnings`]).
    pub(crate) fn with_warnings(mut self, warnings: Vec<String>) -> Self {
        self.warnings = warnings;
        self
    }

    /// The settings that had no effect on this aggregate, as the builder reported them.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// The number of workers.
    pub fn parallelism(&self) -> usize {
        self.runtime.parallelism()
    }

    /// The key groups its state is partitioned into and the worker owning each
    /// ([`KeyGroups`]).
    pub fn key_groups(&self) -> &KeyGroups {
        &self.key_groups
    }

    /// The configuration it runs under.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Whether it runs a local and a global phase.
    pub fn is_two_phase(&self) -> bool {
        self.two_phase
    }

    /// The resolved query.
    pub fn plan(&self) -> &AggregatePlan {
        &self.plan
    }

    /// The resolved query, shared (to build another operator of the same query).
    pub fn shared_plan(&self) -> Arc<AggregatePlan> {
        Arc::clone(&self.plan)
    }

    /// The schema of the emitted changes' rows: the keys, then the aggregate results.
    pub fn output_schema(&self) -> arrow::datatypes::SchemaRef {
        Arc::clone(&self.plan.output_schema)
    }

    /// The accumulator batch schema of the local phase (two-phase only).
    pub fn accumulator_schema(&self) -> Option<arrow::datatypes::SchemaRef> {
        self.locals
            .first()
            .map(LocalGroupAggregate::accumulator_schema)
    }

    /// For each aggregate call in output order, the names of its accumulator columns (two-phase
    /// only).
    pub fn accumulator_names(&self) -> Option<Vec<Vec<String>>> {
        self.locals
            .first()
            .map(LocalGroupAggregate::accumulator_names)
    }
}
