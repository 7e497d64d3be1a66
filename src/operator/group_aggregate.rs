//! `GroupAggregate`: one-phase streaming group aggregation with Flink's changelog.
//!
//! # How a mini-batch is processed
//!
//! Each input batch is evaluated ([`crate::plan::Calc`]), hashed and interned into group ids once.
//! Its rows are then applied to the keyed state as whole columns, and the output is derived at the
//! end of the mini-batch from what changed:
//!
//! * on first touch in a mini-batch, a group is marked dirty and its current results are
//!   snapshotted (vectorized `evaluate` over the newly dirty groups);
//! * with retraction input, a retraction is dropped when its key had no state before the
//!   mini-batch and no accumulate of that key came before it in the mini-batch (Flink's "leading
//!   retractions"); the hidden record count (`count1`) counts the remaining rows;
//! * every accumulator folds the rows with its FILTER and the accumulate/retract masks;
//! * when the mini-batch fires, each dirty group gets at most one transition, exactly as
//!   Flink's `MiniBatchGroupAggFunction`: `+I` (new), `-U`/`+U` (changed values), nothing
//!   (unchanged), `-D` (count back to 0). Old and new values are compared column-wise and the
//!   output batch is assembled with `interleave`.
//!
//! Applying rows eagerly and emitting at the boundary is equivalent to Flink's buffering because
//! every accumulator is order-insensitive within a key; only the leading-retraction rule depends on
//! order, and it is applied in arrival order.
//!
//! With mini-batch off, the batch is cut into runs in which no key repeats; each run is one unit
//! of work, and because no key appears twice in it, its output is exactly Flink's per-record
//! output (`GroupAggFunction`), in input order.
//!
//! A deleted or expired group keeps its id until the next compaction: its accumulators are reset,
//! and it comes back as a new group (`+I`) if its key returns first. When at least half the
//! groups (and at least [`COMPACT_MIN_DEAD`]) are dead, the table is rebuilt between mini-batches
//! with only the live groups (their keys, accumulators, record counts and TTL timestamps), so the
//! memory of expired keys is returned; the cost is amortized over the deletions that made it due.
//!
//! [`GroupAggregate::snapshot`] exports the live groups as one Arrow batch (keys, accumulator
//! columns, record counts, last write times, input rows) and [`GroupAggregate::restore_snapshot`] takes it
//! back; compaction is the same export and import into fresh tables.

use std::sync::Arc;

use arrow::array::BooleanBufferBuilder;
use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, Int64Array, RecordBatch, UInt64Array};
use arrow::buffer::BooleanBuffer;
use arrow::compute::kernels::cmp::distinct;
use arrow::compute::{concat, interleave, or};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion_expr::Expr;
use tally_kernels::group_values::{GroupValues, new_group_values};

use crate::changelog::{RowKind, op_array};
use crate::clock::{Clock, SystemClock};
use crate::config::{AggPhaseStrategy, Config};
use crate::error::{Error, Result};
use crate::operator::ParallelAggregate;
use crate::operator::local::Flushed;
use crate::operator::state::{AggState, intern_hashed, intern_keys};
use crate::plan::{AggregatePlan, CalcBatch};
use crate::runtime::Runtime;

/// The fewest dead (deleted or expired) groups that make a compaction due; it also needs at
/// least as many dead groups as live ones.
pub const COMPACT_MIN_DEAD: usize = 1024;

/// A snapshot's `$last_write_ms` for a group written without a TTL.
const UNSTAMPED: i64 = i64::MIN;

/// Groups exported per step by compactions and snapshots (bounds the transient copy).
const EXPORT_CHUNK: usize = 1 << 16;

/// Counters of a running aggregation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Metrics {
    /// Input rows pushed.
    pub rows_in: u64,
    /// Input batches pushed.
    pub batches_in: u64,
    /// Changelog rows emitted.
    pub rows_out: u64,
    /// Changelog batches emitted.
    pub batches_out: u64,
    /// Units of work fired (mini-batches; with mini-batch off, runs of distinct keys).
    pub mini_batches: u64,
    /// Groups that currently have state.
    pub keys_in_state: u64,
    /// Bytes of keyed state (key table, accumulators, record counts), from capacity.
    pub state_bytes: u64,
    /// The largest `state_bytes` seen: measured before each compaction and now (between
    /// compactions state only grows, so this is the peak).
    pub peak_state_bytes: u64,
    /// Retractions dropped because their key had no state (Flink drops them silently; a
    /// retraction of a row never inserted, or arriving after its key's state expired).
    pub dropped_retractions: u64,
    /// Times the group table was rebuilt without its deleted and expired groups.
    pub compactions: u64,
}

/// Builds a [`GroupAggregate`]. Created by [`GroupAggregate::builder`].
#[derive(Debug)]
pub struct GroupAggregateBuilder {
    schema: SchemaRef,
    group_by: Vec<Expr>,
    aggregates: Vec<Expr>,
    config: Config,
    changelog: Option<String>,
    clock: Option<Arc<dyn Clock>>,
}

impl GroupAggregateBuilder {
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
        AggregatePlan::try_new(
            Arc::clone(&self.schema),
            &self.group_by,
            &self.aggregates,
            self.changelog.as_deref(),
        )
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

/// Per-mini-batch bookkeeping.
#[derive(Debug, Default)]
struct Bundle {
    /// Current bundle id; `mark[g] == id` means `g` is dirty in this bundle.
    id: u32,
    rows: usize,
    dirty: Vec<u32>,
    had_state: Vec<bool>,
    mark: Vec<u32>,
    /// `seen_acc[g] == id`: an accumulate of `g` came in this bundle.
    seen_acc: Vec<u32>,
    /// Results of the dirty groups before the bundle, per output column, in pieces.
    old: Vec<Vec<ArrayRef>>,
}

impl Bundle {
    fn next(&mut self) {
        self.rows = 0;
        self.dirty.clear();
        self.had_state.clear();
        self.old.iter_mut().for_each(Vec::clear);
        if self.id == u32::MAX {
            self.mark.fill(0);
            self.seen_acc.fill(0);
            self.id = 0;
        }
        self.id += 1;
    }
}

/// One-phase streaming GROUP BY: keyed state plus Flink's changelog emission.
///
/// # Examples
/// ```
/// use std::sync::Arc;
/// use arrow::array::{Int64Array, RecordBatch, StringArray};
/// use arrow::datatypes::{DataType, Field, Schema};
/// use datafusion_expr::col;
/// use tally::aggregates::{count_star, sum};
/// use tally::GroupAggregate;
///
/// let schema = Arc::new(Schema::new(vec![
///     Field::new("country", DataType::Utf8, true),
///     Field::new("amount", DataType::Int64, true),
/// ]));
/// let mut agg = GroupAggregate::builder(schema.clone())
///     .group_by([col("country")])
///     .aggregate([count_star(), sum(col("amount")).alias("total")])
///     .build()
///     .unwrap();
/// let batch = RecordBatch::try_new(schema, vec![
///     Arc::new(StringArray::from(vec!["NL", "DE", "NL"])),
///     Arc::new(Int64Array::from(vec![10, 20, 5])),
/// ]).unwrap();
/// // Mini-batch is off: one transition per input row (+I NL, +I DE, -U NL, +U NL).
/// let changes = agg.push(&batch).unwrap();
/// let rows: usize = changes.iter().map(|b| b.num_rows()).sum();
/// assert_eq!(rows, 4);
/// ```
#[derive(Debug)]
pub struct GroupAggregate {
    plan: Arc<AggregatePlan>,
    config: Config,
    clock: Arc<dyn Clock>,
    groups: Box<dyn GroupValues>,
    state: AggState,
    /// Whether each group has state (Flink: `state(k) != null`).
    alive: Vec<bool>,
    /// Hidden record count per group (retraction input only).
    count1: Vec<i64>,
    live_keys: u64,
    bundle: Bundle,
    /// Start of the latency interval last seen on the clock.
    last_interval: i64,
    /// Mini-batch off: run id per group, to cut runs where a key repeats.
    run_mark: Vec<u32>,
    run_id: u32,
    /// State TTL in ms (0 = none), the last write time of each group, the clock reading of the
    /// current push, and when expired groups are next swept.
    ttl_ms: i64,
    last_write: Vec<i64>,
    now: i64,
    next_sweep: i64,
    hashes: Vec<u64>,
    gids: Vec<u32>,
    pending: Pending,
    metrics: Metrics,
    /// Set for a global phase: the accumulator batches it takes.
    accumulators: Option<SchemaRef>,
    /// Driven by a parallel runtime: mini-batches fire only when it says (`finish`), never by
    /// size or latency on their own.
    driven: bool,
    /// Input rows received per group (for the hot keys).
    key_rows: Vec<u64>,
    /// Groups restored without a TTL timestamp (from a snapshot taken without a TTL) count as
    /// written at the first clock reading after the restore.
    unstamped: bool,
    /// Settings that had no effect, found by the builder.
    warnings: Vec<String>,
}

/// Rows routed to one worker by the exchange: evaluated columns and each row's key hash.
#[derive(Debug)]
pub(crate) struct Routed {
    pub(crate) cb: CalcBatch,
    pub(crate) hashes: arrow::buffer::ScalarBuffer<u64>,
}

impl GroupAggregate {
    /// A builder over batches of `input_schema`.
    pub fn builder(input_schema: SchemaRef) -> GroupAggregateBuilder {
        GroupAggregateBuilder {
            schema: input_schema,
            group_by: vec![],
            aggregates: vec![],
            config: Config::default(),
            changelog: None,
            clock: None,
        }
    }

    /// An operator for an already resolved plan.
    ///
    /// # Errors
    /// When the configuration is inconsistent or an accumulator cannot be built.
    pub fn try_new(
        plan: Arc<AggregatePlan>,
        config: Config,
        clock: Arc<dyn Clock>,
    ) -> Result<Self> {
        config.validate()?;
        let groups = new_group_values(&plan.key_types)
            .map_err(|e| Error::plan(format!("group keys: {e}")))?;
        let state = AggState::try_new(&plan)?;
        let ttl_ms = config.state_ttl.as_millis().min(i64::MAX as u128) as i64;
        let bundle = Bundle {
            id: 1,
            old: vec![vec![]; plan.calls.len()],
            ..Bundle::default()
        };
        Ok(Self {
            plan,
            config,
            clock,
            groups,
            state,
            alive: vec![],
            count1: vec![],
            live_keys: 0,
            bundle,
            last_interval: i64::MIN,
            run_mark: vec![],
            run_id: 1,
            ttl_ms,
            last_write: vec![],
            now: 0,
            next_sweep: i64::MIN,
            hashes: vec![],
            gids: vec![],
            pending: Pending::default(),
            metrics: Metrics::default(),
            accumulators: None,
            driven: false,
            key_rows: vec![],
            unstamped: false,
            warnings: vec![],
        })
    }

    /// The global phase of local-global aggregation: takes the accumulator batches of
    /// [`crate::operator::LocalGroupAggregate`]s (through [`GroupAggregate::push_accumulators`]),
    /// merges them into keyed state and emits the changelog as Flink's
    /// `MiniBatchGlobalGroupAggFunction` does: like the one-phase mini-batch operator, except
    /// that no retraction is dropped (a key without state whose merged record count is not zero,
    /// even negative, is a new key).
    ///
    /// # Errors
    /// Mini-batch off (Flink: "Local-Global optimization is only worked in miniBatch mode"), and
    /// as [`GroupAggregate::try_new`].
    pub fn try_new_global(
        plan: Arc<AggregatePlan>,
        config: Config,
        clock: Arc<dyn Clock>,
    ) -> Result<Self> {
        if !config.mini_batch_enabled {
            return Err(Error::config(
                crate::config::MINI_BATCH_ENABLED,
                "Local-Global optimization is only worked in miniBatch mode",
            ));
        }
        let mut agg = Self::try_new(plan, config, clock)?;
        agg.accumulators = Some(crate::operator::local::accumulator_schema(
            &agg.plan, &agg.state,
        ));
        Ok(agg)
    }

    /// Merges one accumulator batch (a global phase only). Each accumulator row counts as one
    /// input record for the mini-batch size, as in Flink.
    ///
    /// # Errors
    /// Not a global phase, or a batch of another schema.
    pub fn push_accumulators(&mut self, batch: &RecordBatch) -> Result<Vec<RecordBatch>> {
        let schema = self.accumulators.clone().ok_or_else(|| {
            Error::invalid_input("push_accumulators needs a global phase (try_new_global)")
        })?;
        if batch.schema().fields() != schema.fields() {
            return Err(Error::invalid_input(
                "accumulator batch schema does not match this aggregate's accumulators",
            ));
        }
        let mut out = vec![];
        self.set_now();
        self.check_latency(&mut out)?;
        let n = batch.num_rows();
        self.metrics.batches_in += 1;
        if n == 0 {
            return Ok(out);
        }
        let k = self.plan.key_types.len();
        let keys = &batch.columns()[..k];
        intern_keys(
            self.groups.as_mut(),
            keys,
            n,
            &mut self.hashes,
            &mut self.gids,
        )?;
        self.grow_groups(self.groups.len());
        let gids = std::mem::take(&mut self.gids);
        let size = usize::try_from(self.config.mini_batch_size)
            .map_err(|_| Error::internal("mini-batch size not validated"))?;
        let mut off = 0;
        let result = (|| -> Result<()> {
            while off < n {
                let take = (n - off).min(size - self.bundle.rows);
                self.merge_rows(&batch.slice(off, take), &gids[off..off + take], None)?;
                off += take;
                if self.bundle.rows >= size {
                    self.fire()?;
                    self.emit(&mut out)?;
                }
            }
            Ok(())
        })();
        self.gids = gids;
        result?;
        self.metrics.rows_in += n as u64;
        Ok(out)
    }

    /// The schema of the emitted changelog: `op` (Int8), the keys, the aggregate results.
    pub fn output_schema(&self) -> SchemaRef {
        Arc::clone(&self.plan.output_schema)
    }

    /// The resolved query.
    pub fn plan(&self) -> &AggregatePlan {
        &self.plan
    }

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The settings that had no effect on this operator, as the builder reported them.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// Counters so far, with the current state size.
    pub fn metrics(&self) -> Metrics {
        let mut m = self.metrics.clone();
        m.keys_in_state = self.live_keys;
        m.state_bytes = self.state_bytes();
        m.peak_state_bytes = m.peak_state_bytes.max(m.state_bytes);
        m
    }

    /// Bytes of keyed state, from capacity.
    fn state_bytes(&self) -> u64 {
        (self.groups.size()
            + self.state.size()
            + self.alive.capacity()
            + self.count1.capacity() * 8
            + (self.bundle.mark.capacity() + self.bundle.seen_acc.capacity()) * 4
            + self.run_mark.capacity() * 4
            + self.last_write.capacity() * 8
            + self.key_rows.capacity() * 8) as u64
    }

    /// Consumes one input batch and returns the changelog batches that became due: with mini-batch
    /// off, the changes of every row; with it on, those of each mini-batch that filled up (or
    /// whose latency passed on the clock).
    ///
    /// # Errors
    /// A batch whose schema differs from the input schema, a bad changelog op, or an expression
    /// that fails on the data. Such a batch is refused whole before anything happens: the state
    /// is unchanged and no mini-batch fires (a pending one fires on the next call), so no change
    /// is lost.
    pub fn push(&mut self, batch: &RecordBatch) -> Result<Vec<RecordBatch>> {
        self.plan.check_input(batch)?;
        let n = batch.num_rows();
        // Calc first: a batch that fails to evaluate changes nothing, and fires nothing whose
        // changes the error would lose.
        let cb = if n > 0 {
            Some(self.plan.calc.evaluate(batch)?)
        } else {
            None
        };
        let mut out = vec![];
        self.set_now();
        self.check_latency(&mut out)?;
        self.sweep_expired()?;
        self.metrics.batches_in += 1;
        let Some(cb) = cb else {
            return Ok(out);
        };
        intern_keys(
            self.groups.as_mut(),
            &cb.keys,
            n,
            &mut self.hashes,
            &mut self.gids,
        )?;
        let total = self.groups.len();
        self.grow_groups(total);
        self.metrics.rows_in += n as u64;
        let gids = std::mem::take(&mut self.gids);
        let result = if self.config.mini_batch_enabled {
            self.push_mini_batch(&cb, &gids, &mut out)
        } else {
            self.push_per_record(&cb, &gids, &mut out)
        };
        self.gids = gids;
        result?;
        Ok(out)
    }

    /// Fires the pending mini-batch if the latency interval has passed on the clock (for a
    /// source that has gone quiet). Returns the changes it emitted.
    ///
    /// # Errors
    /// As [`GroupAggregate::push`].
    pub fn poll(&mut self) -> Result<Vec<RecordBatch>> {
        let mut out = vec![];
        self.set_now();
        self.check_latency(&mut out)?;
        self.sweep_expired()?;
        Ok(out)
    }

    /// End of input: fires the pending mini-batch and returns its changes.
    ///
    /// # Errors
    /// As [`GroupAggregate::push`].
    pub fn finish(&mut self) -> Result<Vec<RecordBatch>> {
        let mut out = vec![];
        self.set_now();
        self.fire()?;
        self.emit(&mut out)?;
        Ok(out)
    }

    /// Sets `tally.exec.emit.update-before` (see [`ParallelAggregate::set_emit_update_before`]).
    pub(crate) fn set_emit_update_before(&mut self, emit: bool) {
        self.config.emit_update_before = emit;
    }

    /// Hands mini-batch firing to a parallel runtime (see [`Self::driven`]).
    pub(crate) fn set_driven(&mut self) {
        self.driven = true;
    }

    /// Takes rows routed to this worker, in order. With mini-batch on they join the pending
    /// mini-batch (a global phase applies them as raw rows, dropping no retraction); with it off
    /// each part is processed per record and the changes of all parts come back as one batch.
    pub(crate) fn push_routed(&mut self, parts: &[Routed]) -> Result<Vec<RecordBatch>> {
        let mut out = vec![];
        self.set_now();
        self.sweep_expired()?;
        let mut gids = std::mem::take(&mut self.gids);
        let result = (|| -> Result<()> {
            for part in parts {
                let n = part.cb.num_rows;
                self.metrics.batches_in += 1;
                if n == 0 {
                    continue;
                }
                intern_hashed(self.groups.as_mut(), &part.cb.keys, &part.hashes, &mut gids)?;
                self.grow_groups(self.groups.len());
                self.metrics.rows_in += n as u64;
                if self.config.mini_batch_enabled {
                    self.apply(&part.cb, 0, n, &gids)?;
                    self.bundle.rows += n;
                } else {
                    self.run_records(&part.cb, &gids)?;
                }
            }
            if !self.config.mini_batch_enabled {
                self.emit(&mut out)?;
            }
            Ok(())
        })();
        self.gids = gids;
        result?;
        Ok(out)
    }

    /// Merges accumulator rows routed to this worker (a global phase, driven), with their key
    /// hashes and the input rows each folds.
    pub(crate) fn merge_routed(&mut self, parts: &[Flushed]) -> Result<()> {
        if self.accumulators.is_none() {
            return Err(Error::internal("merge_routed needs a global phase"));
        }
        self.set_now();
        self.sweep_expired()?;
        let k = self.plan.key_types.len();
        let mut gids = std::mem::take(&mut self.gids);
        let result = (|| -> Result<()> {
            for part in parts {
                let batch = &part.batch;
                let n = batch.num_rows();
                self.metrics.batches_in += 1;
                if n == 0 {
                    continue;
                }
                intern_hashed(
                    self.groups.as_mut(),
                    &batch.columns()[..k],
                    &part.hashes,
                    &mut gids,
                )?;
                self.grow_groups(self.groups.len());
                self.merge_rows(batch, &gids, Some(&part.rows))?;
                self.metrics.rows_in += n as u64;
            }
            Ok(())
        })();
        self.gids = gids;
        result
    }

    /// Merges accumulator rows (interned as `gids`) into the pending mini-batch: snapshots the
    /// groups on first touch, merges the states, adds the record counts, and counts the input
    /// rows each stands for (`rows`, or the absolute record count when not given).
    fn merge_rows(
        &mut self,
        batch: &RecordBatch,
        gids: &[u32],
        rows: Option<&[u64]>,
    ) -> Result<()> {
        let k = self.plan.key_types.len();
        let last = batch.num_columns() - 1;
        let counts = batch
            .column(last)
            .as_primitive_opt::<arrow::datatypes::Int64Type>()
            .ok_or_else(|| Error::invalid_input("count1 is not Int64"))?;
        self.touch(gids, false)?;
        self.state
            .merge(&batch.columns()[k..last], gids, self.groups.len())?;
        if self.plan.has_retractions() {
            for (&g, &c) in gids.iter().zip(counts.values()) {
                self.count1[g as usize] += c;
            }
        }
        match rows {
            Some(rows) => {
                for (&g, &r) in gids.iter().zip(rows) {
                    self.key_rows[g as usize] += r;
                }
            }
            None => {
                for (&g, &c) in gids.iter().zip(counts.values()) {
                    self.key_rows[g as usize] += c.unsigned_abs();
                }
            }
        }
        self.bundle.rows += gids.len();
        Ok(())
    }

    /// The `k` keys that received the most input rows, hottest first, with their row counts;
    /// each key is shown as its values joined by `, `.
    ///
    /// # Errors
    /// When a key cannot be formatted (a bug).
    pub fn hot_keys(&self, k: usize) -> Result<Vec<(String, u64)>> {
        let mut top: Vec<(u64, u32)> = Vec::with_capacity(k + 1);
        for (g, &rows) in self.key_rows.iter().enumerate() {
            if rows == 0 || (top.len() == k && top.last().is_some_and(|t| t.0 >= rows)) {
                continue;
            }
            let at = top.partition_point(|t| t.0 >= rows);
            top.insert(at, (rows, g as u32));
            top.truncate(k);
        }
        let ids: Vec<u32> = top.iter().map(|t| t.1).collect();
        let keys = self.groups.keys(&ids)?;
        let opts = arrow::util::display::FormatOptions::default().with_null("NULL");
        let fmts = keys
            .iter()
            .map(|c| arrow::util::display::ArrayFormatter::try_new(c.as_ref(), &opts))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(top
            .iter()
            .enumerate()
            .map(|(i, &(rows, _))| {
                let parts: Vec<String> = fmts.iter().map(|f| f.value(i).to_string()).collect();
                let key = if parts.is_empty() {
                    "()".to_string()
                } else {
                    parts.join(", ")
                };
                (key, rows)
            })
            .collect())
    }

    fn check_latency(&mut self, out: &mut Vec<RecordBatch>) -> Result<()> {
        if !self.config.mini_batch_enabled || self.driven {
            return Ok(());
        }
        let latency = self.config.mini_batch_allow_latency;
        if crate::clock::crossed_interval(&mut self.last_interval, self.now, latency) {
            self.fire()?;
            self.emit(out)?;
        }
        Ok(())
    }

    /// Reads the clock; stamps groups restored without a TTL timestamp with this first reading.
    fn set_now(&mut self) {
        self.now = self.clock.now_ms();
        if self.unstamped {
            self.unstamped = false;
            for t in &mut self.last_write {
                if *t == UNSTAMPED {
                    *t = self.now;
                }
            }
        }
    }

    /// Drops the state of groups idle for longer than the TTL (at most once per TTL period).
    /// Expiry is also checked when a group is touched, so sweeping only frees memory early; it
    /// never changes output. Groups touched by the pending mini-batch are left alone.
    fn sweep_expired(&mut self) -> Result<()> {
        if self.ttl_ms <= 0 || self.now < self.next_sweep {
            return Ok(());
        }
        self.next_sweep = self.now.saturating_add(self.ttl_ms);
        let mut expired = vec![];
        for (g, alive) in self.alive.iter_mut().enumerate() {
            if *alive
                && self.bundle.mark[g] != self.bundle.id
                && self.now.saturating_sub(self.last_write[g]) >= self.ttl_ms
            {
                *alive = false;
                expired.push(g as u32);
                if let Some(c) = self.count1.get_mut(g) {
                    *c = 0;
                }
            }
        }
        self.live_keys -= expired.len() as u64;
        self.state.reset(&expired);
        self.maybe_compact()
    }

    fn push_mini_batch(
        &mut self,
        cb: &CalcBatch,
        gids: &[u32],
        out: &mut Vec<RecordBatch>,
    ) -> Result<()> {
        let size = usize::try_from(self.config.mini_batch_size)
            .map_err(|_| Error::internal("mini-batch size not validated"))?;
        let n = cb.num_rows;
        if self.driven {
            self.apply(cb, 0, n, gids)?;
            self.bundle.rows += n;
            return Ok(());
        }
        let mut off = 0;
        while off < n {
            let take = (n - off).min(size - self.bundle.rows);
            self.apply(cb, off, take, &gids[off..off + take])?;
            self.bundle.rows += take;
            off += take;
            if self.bundle.rows >= size {
                self.fire()?;
                self.emit(out)?;
            }
        }
        Ok(())
    }

    fn push_per_record(
        &mut self,
        cb: &CalcBatch,
        gids: &[u32],
        out: &mut Vec<RecordBatch>,
    ) -> Result<()> {
        self.run_records(cb, gids)?;
        // One changelog batch per pushed batch, in input order.
        self.emit(out)
    }

    /// Mini-batch off: applies `cb` in runs without a repeated key, firing each run.
    fn run_records(&mut self, cb: &CalcBatch, gids: &[u32]) -> Result<()> {
        if self.run_mark.len() < self.groups.len() {
            self.run_mark.resize(self.groups.len(), 0);
        }
        let mut start = 0;
        for (i, &g) in gids.iter().enumerate() {
            let g = g as usize;
            if self.run_mark[g] == self.run_id {
                self.apply(cb, start, i - start, &gids[start..i])?;
                self.fire()?;
                self.next_run();
                start = i;
            }
            self.run_mark[g] = self.run_id;
        }
        self.apply(cb, start, gids.len() - start, &gids[start..])?;
        self.fire()?;
        self.next_run();
        Ok(())
    }

    fn next_run(&mut self) {
        if self.run_id == u32::MAX {
            self.run_mark.fill(0);
            self.run_id = 0;
        }
        self.run_id += 1;
    }

    /// Grows the per-group vectors to `total` groups.
    fn grow_groups(&mut self, total: usize) {
        if self.alive.len() < total {
            self.alive.resize(total, false);
            self.bundle.mark.resize(total, 0);
            self.bundle.seen_acc.resize(total, 0);
            if self.plan.has_retractions() {
                self.count1.resize(total, 0);
            }
            if self.ttl_ms > 0 {
                self.last_write.resize(total, 0);
            }
            self.key_rows.resize(total, 0);
        }
    }

    /// Marks the groups of `gids` dirty in the current unit of work; on first touch, expires a
    /// group whose TTL passed and snapshots the results of the newly dirty groups before they
    /// change. With `raw_rows`, each id is one input row and counts towards its key's rows.
    fn touch(&mut self, gids: &[u32], raw_rows: bool) -> Result<()> {
        let bundle = &mut self.bundle;
        let first_new = bundle.dirty.len();
        let mut expired = vec![];
        for &g in gids {
            let gi = g as usize;
            if raw_rows {
                // Each raw row counts for the hot keys (in the pass that marks the group).
                self.key_rows[gi] += 1;
            }
            if bundle.mark[gi] != bundle.id {
                bundle.mark[gi] = bundle.id;
                bundle.dirty.push(g);
                if self.alive[gi]
                    && self.ttl_ms > 0
                    && self.now.saturating_sub(self.last_write[gi]) >= self.ttl_ms
                {
                    // The state expired: the key is new again.
                    self.alive[gi] = false;
                    self.live_keys -= 1;
                    if let Some(c) = self.count1.get_mut(gi) {
                        *c = 0;
                    }
                    expired.push(g);
                }
                bundle.had_state.push(self.alive[gi]);
            }
        }
        if !expired.is_empty() {
            self.state.reset(&expired);
        }
        if bundle.dirty.len() > first_new {
            let old = self.state.evaluate(&bundle.dirty[first_new..])?;
            for (pieces, a) in bundle.old.iter_mut().zip(old) {
                pieces.push(a);
            }
        }
        Ok(())
    }

    /// Applies rows `off..off + len` (group ids `gids`) to the state.
    fn apply(&mut self, cb: &CalcBatch, off: usize, len: usize, gids: &[u32]) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let sliced;
        let cb = if off == 0 && len == cb.num_rows {
            cb
        } else {
            sliced = cb.slice(off, len);
            &sliced
        };
        self.touch(gids, true)?;
        let bundle = &mut self.bundle;
        let total = self.groups.len();
        // A global phase drops no retraction (it takes raw rows when its local phase is bypassed).
        let global = self.accumulators.is_some();
        // Over insert-only input no group is ever deleted, so no record count is kept (a merged
        // local count is always positive), in the global phase as in the one-phase operator.
        let Some(retract) = cb.retract.as_ref() else {
            return self.state.apply(cb, gids, None, None, total);
        };
        // Retraction input: drop leading retractions of stateless keys, count the rest.
        let mut dropped: Option<BooleanBufferBuilder> = None;
        for (r, &g) in gids.iter().enumerate() {
            let gi = g as usize;
            if retract.value(r) {
                if !global && !self.alive[gi] && bundle.seen_acc[gi] != bundle.id {
                    dropped
                        .get_or_insert_with(|| {
                            let mut b = BooleanBufferBuilder::new(len);
                            b.append_n(len, false);
                            b
                        })
                        .set_bit(r, true);
                } else {
                    self.count1[gi] -= 1;
                }
            } else {
                bundle.seen_acc[gi] = bundle.id;
                self.count1[gi] += 1;
            }
        }
        let retracts = retract.count_set_bits();
        if retracts == 0 {
            return self.state.apply(cb, gids, None, None, total);
        }
        let acc_mask = !retract;
        let ret_mask = match dropped {
            Some(mut d) => {
                let d = d.finish();
                self.metrics.dropped_retractions += d.count_set_bits() as u64;
                retract & &!&d
            }
            None => retract.clone(),
        };
        self.state
            .apply(cb, gids, Some(&acc_mask), Some(&ret_mask), total)
    }

    /// Ends the unit of work: derives one transition per dirty group and queues it for
    /// [`Self::emit`].
    fn fire(&mut self) -> Result<()> {
        if self.bundle.dirty.is_empty() {
            self.bundle.next();
            return Ok(());
        }
        self.metrics.mini_batches += 1;
        let dirty = std::mem::take(&mut self.bundle.dirty);
        let had_state = std::mem::take(&mut self.bundle.had_state);
        let new = self.state.evaluate(&dirty)?;
        let old = self
            .bundle
            .old
            .iter()
            .map(|pieces| {
                if pieces.len() == 1 {
                    Ok(Arc::clone(&pieces[0]))
                } else {
                    let refs: Vec<&dyn Array> = pieces.iter().map(|a| a.as_ref()).collect();
                    concat(&refs)
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        let retractions = self.plan.has_retractions();
        let changed = if had_state.iter().any(|&h| h) {
            Some(changed_rows(&old, &new)?)
        } else {
            None
        };
        let ub = self.config.emit_update_before;
        let ttl = self.ttl_ms > 0;
        let mut kinds = Vec::with_capacity(dirty.len());
        let mut picks: Vec<(usize, usize)> = Vec::with_capacity(dirty.len());
        let mut emit_groups = Vec::with_capacity(dirty.len());
        let mut deleted = vec![];
        for (p, &g) in dirty.iter().enumerate() {
            let gi = g as usize;
            let zero = retractions && self.count1[gi] == 0;
            if !zero {
                if !self.alive[gi] {
                    self.alive[gi] = true;
                    self.live_keys += 1;
                }
                if ttl {
                    self.last_write[gi] = self.now;
                }
                if !had_state[p] {
                    kinds.push(RowKind::Insert);
                    picks.push((1, p));
                    emit_groups.push(g);
                } else if ttl || changed.as_ref().is_some_and(|c| c.value(p)) {
                    if ub {
                        kinds.push(RowKind::UpdateBefore);
                        picks.push((0, p));
                        emit_groups.push(g);
                    }
                    kinds.push(RowKind::UpdateAfter);
                    picks.push((1, p));
                    emit_groups.push(g);
                }
            } else {
                if had_state[p] {
                    kinds.push(RowKind::Delete);
                    picks.push((0, p));
                    emit_groups.push(g);
                    self.alive[gi] = false;
                    self.live_keys -= 1;
                }
                deleted.push(g);
            }
        }
        self.state.reset(&deleted);
        self.bundle.dirty = dirty;
        self.bundle.had_state = had_state;
        self.bundle.next();
        if !kinds.is_empty() {
            self.pending.add(kinds, emit_groups, &picks, old, new);
        }
        Ok(())
    }

    /// Emits the transitions collected since the last call as one changelog batch.
    fn emit(&mut self, out: &mut Vec<RecordBatch>) -> Result<()> {
        let Some(pending) = self.pending.take() else {
            return self.maybe_compact();
        };
        let mut columns = Vec::with_capacity(self.plan.output_schema.fields().len());
        columns.push(op_array(&pending.kinds));
        columns.extend(self.groups.keys(&pending.groups)?);
        for sources in &pending.sources {
            let refs: Vec<&dyn Array> = sources.iter().map(|a| a.as_ref()).collect();
            columns.push(interleave(&refs, &pending.picks)?);
        }
        let batch = RecordBatch::try_new(Arc::clone(&self.plan.output_schema), columns)
            .map_err(|e| Error::internal(format!("output batch: {e}")))?;
        self.metrics.rows_out += batch.num_rows() as u64;
        self.metrics.batches_out += 1;
        out.push(batch);
        self.maybe_compact()
    }
}

/// Snapshots and compaction: the live groups exported as Arrow columns and imported into fresh
/// tables.
impl GroupAggregate {
    /// The schema of [`GroupAggregate::snapshot`]: the group keys, the accumulator columns (as
    /// the local phase names them), `count1` (the record count, 0 over insert-only input),
    /// `$last_write_ms` (the TTL clock of the group's last write; `i64::MIN` without a TTL, which
    /// an operator with a TTL reads as written at its first clock reading after the restore) and
    /// `$input_rows` (input rows the group received, for the hot keys).
    pub fn snapshot_schema(&self) -> SchemaRef {
        let acc = crate::operator::local::accumulator_schema(&self.plan, &self.state);
        let mut fields: Vec<Field> = acc.fields().iter().map(|f| f.as_ref().clone()).collect();
        fields.push(Field::new("$last_write_ms", DataType::Int64, false));
        fields.push(Field::new("$input_rows", DataType::UInt64, false));
        Arc::new(Schema::new(fields))
    }

    /// Whether a mini-batch (or a run) is in progress: rows applied but not yet fired and
    /// emitted.
    pub fn has_pending(&self) -> bool {
        !self.bundle.dirty.is_empty() || !self.pending.kinds.is_empty()
    }

    /// The state of every live group as batches of [`GroupAggregate::snapshot_schema`] (at most
    /// 65536 groups each). Like Flink's checkpoint of a mini-batch operator, it needs the
    /// pending mini-batch fired first ([`GroupAggregate::finish`], whose changes are delivered
    /// before the snapshot is taken, so that none is lost or emitted twice on restore).
    ///
    /// # Errors
    /// A mini-batch still pending.
    pub fn snapshot(&self) -> Result<Vec<RecordBatch>> {
        if self.has_pending() {
            return Err(Error::invalid_input(
                "cannot snapshot with a mini-batch pending: call finish() and deliver its changes first",
            ));
        }
        let live = self.live_groups();
        let schema = self.snapshot_schema();
        live.chunks(EXPORT_CHUNK)
            .map(|chunk| self.export(chunk, &schema))
            .collect()
    }

    /// Loads batches made by [`GroupAggregate::snapshot`] (of an operator of the same query;
    /// the parallelism and options may differ) into this operator, which must hold no state.
    ///
    /// # Errors
    /// An operator with state, a batch of another schema (another query), or a key present
    /// twice.
    pub fn restore_snapshot(&mut self, batches: &[RecordBatch]) -> Result<()> {
        let k = self.plan.key_types.len();
        let mut parts = Vec::with_capacity(batches.len());
        for b in batches {
            let mut hashes = vec![];
            if b.num_columns() >= k {
                crate::operator::state::hash_keys(&b.columns()[..k], b.num_rows(), &mut hashes)?;
            }
            parts.push((b.clone(), hashes));
        }
        self.restore_hashed(&parts)
    }

    /// [`GroupAggregate::restore_snapshot`] of batches whose key hashes are known (the parallel
    /// restore routes by them).
    pub(crate) fn restore_hashed(&mut self, parts: &[(RecordBatch, Vec<u64>)]) -> Result<()> {
        if !self.groups.is_empty() || self.has_pending() {
            return Err(Error::invalid_input(
                "restore needs an operator without state",
            ));
        }
        let schema = self.snapshot_schema();
        for (b, hashes) in parts {
            check_snapshot_schema(&schema, b)?;
            self.import(b, hashes)?;
        }
        Ok(())
    }

    /// The ids of the groups with state, in order.
    fn live_groups(&self) -> Vec<u32> {
        (0..self.alive.len() as u32)
            .filter(|&g| self.alive[g as usize])
            .collect()
    }

    /// The snapshot rows of groups `ids` (all live).
    fn export(&self, ids: &[u32], schema: &SchemaRef) -> Result<RecordBatch> {
        Keyed {
            groups: self.groups.as_ref(),
            state: &self.state,
            count1: &self.count1,
            last_write: &self.last_write,
            key_rows: &self.key_rows,
        }
        .export(ids, schema)
    }

    /// Interns the groups of a snapshot batch (with their key hashes) as new live groups.
    fn import(&mut self, batch: &RecordBatch, hashes: &[u64]) -> Result<()> {
        let n = batch.num_rows();
        if n == 0 {
            return Ok(());
        }
        let k = self.plan.key_types.len();
        let width = batch.num_columns();
        let before = self.groups.len();
        let mut gids = std::mem::take(&mut self.gids);
        let result = (|| -> Result<()> {
            intern_hashed(
                self.groups.as_mut(),
                &batch.columns()[..k],
                hashes,
                &mut gids,
            )?;
            if self.groups.len() != before + n {
                return Err(Error::invalid_input(
                    "snapshot holds a group key twice (or a key this operator already has)",
                ));
            }
            let total = self.groups.len();
            self.grow_groups(total);
            self.state
                .merge(&batch.columns()[k..width - 3], &gids, total)?;
            let int64 = |i: usize| -> Result<&Int64Array> {
                batch.column(i).as_primitive_opt().ok_or_else(|| {
                    Error::invalid_input(format!("snapshot column {i} is not Int64"))
                })
            };
            let count1 = int64(width - 3)?;
            let last_write = int64(width - 2)?;
            let rows: &UInt64Array = batch
                .column(width - 1)
                .as_primitive_opt()
                .ok_or_else(|| Error::invalid_input("snapshot column $input_rows is not UInt64"))?;
            for (i, &g) in gids.iter().enumerate() {
                let g = g as usize;
                self.alive[g] = true;
                if let Some(c) = self.count1.get_mut(g) {
                    *c = count1.value(i);
                }
                if let Some(t) = self.last_write.get_mut(g) {
                    *t = last_write.value(i);
                    self.unstamped |= *t == UNSTAMPED;
                }
                self.key_rows[g] = rows.value(i);
            }
            self.live_keys += n as u64;
            Ok(())
        })();
        self.gids = gids;
        result
    }

    /// Compacts when at least half the groups, and at least [`COMPACT_MIN_DEAD`], are dead and
    /// no mini-batch is in progress.
    fn maybe_compact(&mut self) -> Result<()> {
        let dead = self.groups.len() - self.live_keys as usize;
        if dead < COMPACT_MIN_DEAD || dead < self.live_keys as usize || self.has_pending() {
            return Ok(());
        }
        self.compact()
    }

    /// Rebuilds the group table and the accumulators with only the live groups, in id order
    /// (live group ids stay in their relative order), and shrinks the per-group vectors.
    fn compact(&mut self) -> Result<()> {
        let peak = self.state_bytes();
        self.metrics.peak_state_bytes = self.metrics.peak_state_bytes.max(peak);
        let live = self.live_groups();
        let schema = self.snapshot_schema();
        let groups = std::mem::replace(
            &mut self.groups,
            new_group_values(&self.plan.key_types)
                .map_err(|e| Error::plan(format!("group keys: {e}")))?,
        );
        let state = std::mem::replace(&mut self.state, AggState::try_new(&self.plan)?);
        let (count1, last_write, key_rows) = (
            std::mem::take(&mut self.count1),
            std::mem::take(&mut self.last_write),
            std::mem::take(&mut self.key_rows),
        );
        let old = Keyed {
            groups: groups.as_ref(),
            state: &state,
            count1: &count1,
            last_write: &last_write,
            key_rows: &key_rows,
        };
        self.alive = vec![];
        self.bundle.mark = vec![];
        self.bundle.seen_acc = vec![];
        self.run_mark = vec![];
        self.live_keys = 0;
        let all_hashes = groups.hashes();
        for chunk in live.chunks(EXPORT_CHUNK) {
            let batch = old.export(chunk, &schema)?;
            let hashes: Vec<u64> = chunk.iter().map(|&g| all_hashes[g as usize]).collect();
            self.import(&batch, &hashes)?;
        }
        self.metrics.compactions += 1;
        Ok(())
    }
}

/// The per-group parts of an operator's keyed state that a snapshot holds.
struct Keyed<'a> {
    groups: &'a dyn GroupValues,
    state: &'a AggState,
    count1: &'a [i64],
    last_write: &'a [i64],
    key_rows: &'a [u64],
}

impl Keyed<'_> {
    /// The snapshot rows of groups `ids` (all live).
    fn export(&self, ids: &[u32], schema: &SchemaRef) -> Result<RecordBatch> {
        let mut cols = self.groups.keys(ids)?;
        cols.extend(self.state.state(ids)?);
        let gather = |v: &[i64], none: i64| -> ArrayRef {
            Arc::new(Int64Array::from_iter_values(
                ids.iter()
                    .map(|&g| v.get(g as usize).copied().unwrap_or(none)),
            ))
        };
        cols.push(gather(self.count1, 0));
        cols.push(gather(self.last_write, UNSTAMPED));
        cols.push(Arc::new(UInt64Array::from_iter_values(
            ids.iter().map(|&g| self.key_rows[g as usize]),
        )));
        RecordBatch::try_new(Arc::clone(schema), cols)
            .map_err(|e| Error::internal(format!("snapshot batch: {e}")))
    }
}

impl crate::checkpoint::Checkpointed for GroupAggregate {
    fn snapshot_schema(&self) -> SchemaRef {
        GroupAggregate::snapshot_schema(self)
    }
    fn snapshot(&self) -> Result<Vec<RecordBatch>> {
        GroupAggregate::snapshot(self)
    }
    fn restore_snapshot(&mut self, batches: &[RecordBatch]) -> Result<()> {
        GroupAggregate::restore_snapshot(self, batches)
    }
}

/// Checks that a snapshot batch was made for this operator's query.
fn check_snapshot_schema(expected: &SchemaRef, batch: &RecordBatch) -> Result<()> {
    let got = batch.schema();
    let same = got.fields().len() == expected.fields().len()
        && got
            .fields()
            .iter()
            .zip(expected.fields())
            .all(|(a, b)| a.name() == b.name() && a.data_type() == b.data_type());
    if !same {
        let names = |s: &Schema| -> String {
            s.fields()
                .iter()
                .map(|f| format!("{} {}", f.name(), f.data_type()))
                .collect::<Vec<_>>()
                .join(", ")
        };
        return Err(Error::invalid_input(format!(
            "the snapshot was taken for another query: its state columns are ({}), this query's are ({})",
            names(&got),
            names(expected)
        )));
    }
    Ok(())
}

/// Transitions waiting to be emitted: row kinds, groups, and for each output column the arrays
/// their values come from (`picks` index into them).
#[derive(Debug, Default)]
struct Pending {
    kinds: Vec<RowKind>,
    groups: Vec<u32>,
    sources: Vec<Vec<ArrayRef>>,
    picks: Vec<(usize, usize)>,
}

impl Pending {
    /// Adds one unit's transitions; `picks` are `(0 = old | 1 = new, position)`.
    fn add(
        &mut self,
        kinds: Vec<RowKind>,
        groups: Vec<u32>,
        picks: &[(usize, usize)],
        old: Vec<ArrayRef>,
        new: Vec<ArrayRef>,
    ) {
        if self.sources.is_empty() {
            self.sources = vec![vec![]; old.len()];
        }
        let base = self.sources[0].len();
        for ((col, o), n) in self.sources.iter_mut().zip(old).zip(new) {
            col.push(o);
            col.push(n);
        }
        self.kinds.extend(kinds);
        self.groups.extend(groups);
        self.picks
            .extend(picks.iter().map(|&(which, pos)| (base + which, pos)));
    }

    /// The collected transitions, if any, leaving this empty.
    fn take(&mut self) -> Option<Pending> {
        if self.kinds.is_empty() {
            return None;
        }
        Some(std::mem::take(self))
    }
}

/// Rows where any column differs between `old` and `new` (NULL-aware).
fn changed_rows(old: &[ArrayRef], new: &[ArrayRef]) -> Result<BooleanBuffer> {
    let mut acc: Option<BooleanArray> = None;
    for (o, n) in old.iter().zip(new) {
        let d = distinct(o, n)?;
        acc = Some(match acc {
            None => d,
            Some(a) => or(&a, &d)?,
        });
    }
    let acc = acc.ok_or_else(|| Error::internal("no aggregate columns"))?;
    Ok(acc.values().clone())
}
