//! `GroupAggregate`: streaming group aggregation with Flink's changelog, on one worker.
//!
//! Each input batch is evaluated ([`crate::plan::Calc`]), hashed and interned into group ids
//! once; its rows are then applied to the keyed state (`operator/keyed.rs`) as whole
//! columns, and the output is derived when the mini-batch fires (`operator/mini_batch.rs`).
//! With retraction input, a retraction is dropped when its key had no state before the
//! mini-batch and no accumulate of that key came before it in the mini-batch (Flink's "leading
//! retractions"); the hidden record count (`count1`) counts the remaining rows.
//!
//! With mini-batch off, each batch is cut into runs in which no key repeats; each run fires on
//! its own, and because no key appears twice in it, its output is exactly Flink's per-record
//! output (`GroupAggFunction`), in input order.
//!
//! An operator runs in one of three roles, fixed when it is made: on its own (it fires its
//! mini-batches by size and latency), as a worker of a [`crate::ParallelAggregate`] (the runtime
//! fires them), or as a global phase (it merges the accumulator rows of local phases and drops
//! no retraction), on its own or as a worker.

use std::sync::Arc;

use arrow::datatypes::SchemaRef;

use crate::changelog::ChangeBatch;
use crate::clock::Clock;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::operator::GroupAggregateBuilder;
use crate::operator::deltas::Deltas;
use crate::operator::key_groups::KeyGroups;
use crate::operator::keyed::{KeyedState, UNSTAMPED};
use crate::operator::metrics::Metrics;
use crate::operator::mini_batch::{MiniBatch, Pending, Trigger};
use crate::plan::AggregatePlan;

mod input;

/// What a [`GroupAggregate`] takes.
#[derive(Debug, Clone)]
enum Input {
    /// Input rows.
    Rows,
    /// The accumulator rows of local phases, of this schema (a global phase), and input rows
    /// routed around a bypassed local phase.
    Accumulators(SchemaRef),
}

/// Who ends a [`GroupAggregate`]'s mini-batches.
#[derive(Debug, Clone)]
enum Firing {
    /// The operator itself, by size and latency on its clock.
    Own(Trigger),
    /// The parallel runtime, which calls `finish` at the end of each of its mini-batches.
    Runtime,
}

/// Streaming GROUP BY on one worker: keyed state plus Flink's changelog emission.
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
    pub(super) plan: Arc<AggregatePlan>,
    pub(super) config: Config,
    clock: Arc<dyn Clock>,
    pub(super) keyed: KeyedState,
    pub(super) mini_batch: MiniBatch,
    input: Input,
    firing: Firing,
    /// Mini-batch off: run id per group, to cut runs where a key repeats.
    pub(super) run_mark: Vec<u32>,
    pub(super) run_id: u32,
    /// State TTL in ms (0 = none), the clock reading of the current call, and when expired
    /// groups are next swept.
    pub(super) ttl_ms: i64,
    pub(super) now: i64,
    next_sweep: i64,
    /// Groups restored without a TTL timestamp (from a snapshot taken without a TTL) count as
    /// written at the first clock reading after the restore.
    pub(super) unstamped: bool,
    /// Scratch: key hashes and group ids of the batch at hand.
    hashes: Vec<u64>,
    pub(super) gids: Vec<u32>,
    pub(super) pending: Pending,
    /// Set while its firings go to a fold that takes delta rows ([`Deltas`]): the transitions
    /// wait here, as delta rows, instead of in `pending`.
    pub(super) deltas: Option<Deltas>,
    pub(super) metrics: Metrics,
    /// Settings that had no effect, found by the builder.
    pub(super) warnings: Vec<String>,
}

impl GroupAggregate {
    /// A builder over batches of `input_schema`.
    pub fn builder(input_schema: SchemaRef) -> GroupAggregateBuilder {
        GroupAggregateBuilder::new(input_schema)
    }

    /// An operator for an already resolved plan, firing its own mini-batches.
    ///
    /// # Errors
    /// When the configuration is inconsistent or an accumulator cannot be built.
    pub fn try_new(
        plan: Arc<AggregatePlan>,
        config: Config,
        clock: Arc<dyn Clock>,
    ) -> Result<Self> {
        config.validate()?;
        let ttl_ms = config.state_ttl.as_millis().min(i64::MAX as u128) as i64;
        let keyed = KeyedState::try_new(Arc::clone(&plan), ttl_ms > 0)?;
        let size = usize::try_from(config.mini_batch_size).unwrap_or(1);
        Ok(Self {
            mini_batch: MiniBatch::new(plan.calls.len()),
            plan,
            firing: Firing::Own(Trigger::new(size, config.mini_batch_allow_latency)),
            config,
            clock,
            keyed,
            input: Input::Rows,
            run_mark: vec![],
            run_id: 1,
            ttl_ms,
            now: 0,
            next_sweep: i64::MIN,
            unstamped: false,
            hashes: vec![],
            gids: vec![],
            pending: Pending::default(),
            deltas: None,
            metrics: Metrics::default(),
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
        agg.input = Input::Accumulators(crate::operator::keyed::accumulator_schema(
            &agg.plan,
            &agg.keyed.accs,
        ));
        Ok(agg)
    }

    /// Hands mini-batch firing to a parallel runtime: the operator becomes one of its workers.
    pub(crate) fn into_worker(mut self) -> Self {
        self.firing = Firing::Runtime;
        self
    }

    /// Whether it is a global phase (built by [`GroupAggregate::try_new_global`]).
    pub fn is_global(&self) -> bool {
        matches!(self.input, Input::Accumulators(_))
    }

    /// The schema of the emitted changes' rows: the keys, then the aggregate results.
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
        m.keys_in_state = self.keyed.live;
        m.state_bytes = self.state_bytes();
        let (pairs, bytes) = self.keyed.accs.distinct_usage();
        (m.distinct_pairs, m.distinct_bytes) = (pairs as u64, bytes as u64);
        m.peak_state_bytes = m.peak_state_bytes.max(m.state_bytes);
        m
    }

    /// Bytes of keyed state, from capacity.
    pub(super) fn state_bytes(&self) -> u64 {
        (self.keyed.size() + self.mini_batch.size() + self.run_mark.capacity() * 4) as u64
    }

    /// The `k` keys that received the most input rows, hottest first, with their row counts;
    /// each key is shown as its values joined by `, `.
    ///
    /// # Errors
    /// When a key cannot be formatted (a bug).
    pub fn hot_keys(&self, k: usize) -> Result<Vec<(String, u64)>> {
        self.keyed.hot_keys(k)
    }

    /// Sets `tally.exec.emit.update-before` (see
    /// [`crate::ParallelAggregate::set_emit_update_before`]).
    pub(crate) fn set_emit_update_before(&mut self, emit: bool) {
        self.config.emit_update_before = emit;
    }

    /// Emits each firing as delta rows ([`crate::operator::deltas`]) instead of the changelog,
    /// or the changelog again; for a split-distinct PARTIAL whose firings its worker's fold
    /// takes. Nothing may be pending.
    pub(crate) fn set_emit_deltas(&mut self, on: bool) {
        self.deltas = on.then(|| Deltas::new(&self.plan.output_schema, &self.plan.calls));
    }

    /// Keys a split-distinct PARTIAL's state by the query's keys alone, its buckets only
    /// routing rows, or by every key again (see [`KeyedState::merge_buckets`]); for a worker
    /// whose firings an incremental FINAL folds.
    ///
    /// # Errors
    /// An operator that holds state ([`GroupAggregate::holds_state`]).
    pub(crate) fn merge_buckets(&mut self, on: bool) -> Result<()> {
        if self.holds_state() {
            return Err(Error::internal(
                "an aggregate changed its keys while holding state",
            ));
        }
        self.keyed.merge_buckets(on)
    }

    /// Whether a snapshot of its state can be taken where it merges a split PARTIAL's
    /// buckets ([`KeyedState::cuts_merged_state`]): for a run that takes checkpoints.
    pub(crate) fn cuts_merged_state(&self) -> bool {
        self.keyed.cuts_merged_state()
    }

    /// Takes the key groups and the worker it is, one of several (where a snapshot of state
    /// that merges buckets puts what no bucket locates: [`KeyedState::export_cut`]).
    pub(crate) fn set_owner(&mut self, key_groups: &KeyGroups, worker: usize) {
        self.keyed.set_owner(key_groups, worker);
    }

    /// Takes `plan` (the same query, with other hot keys: [`AggregatePlan::with_hot_keys`])
    /// in place of its own, before it holds state.
    ///
    /// # Errors
    /// An operator that holds state ([`GroupAggregate::holds_state`]).
    pub(crate) fn replace_plan(&mut self, plan: Arc<AggregatePlan>) -> Result<()> {
        if self.holds_state() {
            return Err(Error::internal(
                "an aggregate changed its plan while holding state",
            ));
        }
        self.keyed.replace_plan(Arc::clone(&plan))?;
        self.plan = plan;
        Ok(())
    }

    /// Whether it holds groups or a pending mini-batch.
    pub(crate) fn holds_state(&self) -> bool {
        self.keyed.len() > 0 || self.has_pending()
    }

    /// Whether the key table hashes the keys it keeps itself (rows may come without key
    /// hashes).
    pub(crate) fn hashes_keys_itself(&self) -> bool {
        self.keyed.hashes_keys_itself()
    }

    /// Whether its state merges a split PARTIAL's buckets ([`GroupAggregate::merge_buckets`]).
    pub(crate) fn merges_buckets(&self) -> bool {
        self.keyed.merges_buckets()
    }

    /// Fires the pending mini-batch when the operator fires its own and the clock crossed a
    /// latency boundary.
    fn check_latency(&mut self, out: &mut Vec<ChangeBatch>) -> Result<()> {
        if !self.config.mini_batch_enabled {
            return Ok(());
        }
        let Firing::Own(trigger) = &mut self.firing else {
            return Ok(());
        };
        if trigger.latency_due(self.now) {
            trigger.reset();
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
            for t in &mut self.keyed.last_write {
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
        let expired: Vec<u32> = (0..self.keyed.alive.len())
            .filter(|&g| {
                self.keyed.alive[g]
                    && self.mini_batch.mark[g] != self.mini_batch.id
                    && self.now.saturating_sub(self.keyed.last_write[g]) >= self.ttl_ms
            })
            .map(|g| g as u32)
            .collect();
        self.keyed.kill(&expired);
        self.maybe_compact()
    }

    /// Grows the per-group vectors to the groups in the table.
    pub(super) fn grow(&mut self) {
        self.keyed.grow();
        self.mini_batch.grow(self.keyed.len());
    }
}
