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

use arrow::array::{AsArray, RecordBatch};
use arrow::datatypes::SchemaRef;

use crate::changelog::ChangeBatch;
use crate::clock::Clock;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::operator::GroupAggregateBuilder;
use crate::operator::deltas::Deltas;
use crate::operator::exchange::Routed;
use crate::operator::keyed::{KeyedState, UNSTAMPED};
use crate::operator::local::Flushed;
use crate::operator::metrics::Metrics;
use crate::operator::mini_batch::{MiniBatch, Pending, Trigger};
use crate::plan::{AggregatePlan, CalcBatch};

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
        self.deltas = on.then(|| Deltas::new(&self.plan.output_schema, self.plan.calls.len()));
    }

    /// Keys a split-distinct PARTIAL's state by the query's keys alone, its buckets only
    /// routing rows, or by every key again (see [`KeyedState::merge_buckets`]); for a worker
    /// whose firings an incremental FINAL folds, in a run without checkpoints.
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

    /// Consumes one record batch of the builder's schema (its changelog column, if any, read as
    /// row kinds) and returns the changes that became due; see
    /// [`GroupAggregate::push_changes`].
    ///
    /// # Errors
    /// As [`GroupAggregate::push_changes`]; a batch of another schema.
    pub fn push(&mut self, batch: &RecordBatch) -> Result<Vec<ChangeBatch>> {
        let changes = self.plan.to_changes(batch)?;
        self.push_changes(&changes)
    }

    /// Consumes one batch of changes and returns the changelog batches that became due: with
    /// mini-batch off, the changes of every row; with it on, those of each mini-batch that
    /// filled up (or whose latency passed on the clock).
    ///
    /// # Errors
    /// Rows whose schema differs from the input schema, bad row kinds, or an expression that
    /// fails on the data. Such a batch is refused whole before anything happens: the state is
    /// unchanged and no mini-batch fires (a pending one fires on the next call), so no change is
    /// lost.
    pub fn push_changes(&mut self, changes: &ChangeBatch) -> Result<Vec<ChangeBatch>> {
        self.plan.check_input(changes)?;
        let n = changes.num_rows();
        // Calc first: a batch that fails to evaluate changes nothing, and fires nothing whose
        // changes the error would lose.
        let cb = if n > 0 {
            Some(self.plan.calc.evaluate(changes)?)
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
        crate::operator::keyed::hash_keys(&cb.keys, n, &mut self.hashes)?;
        let mut gids = std::mem::take(&mut self.gids);
        let result = self
            .keyed
            .intern(&cb.keys, &self.hashes, cb.keys.len(), n, &mut gids)
            .and_then(|()| {
                self.grow();
                self.metrics.rows_in += n as u64;
                if self.config.mini_batch_enabled {
                    self.push_mini_batch(&cb, &gids, &mut out)
                } else {
                    // One changelog batch per pushed batch, in input order.
                    self.run_records(&cb, &gids)
                        .and_then(|()| self.emit(&mut out))
                }
            });
        self.gids = gids;
        result?;
        Ok(out)
    }

    /// Merges one accumulator batch (a global phase only). Each accumulator row counts as one
    /// input record for the mini-batch size, as in Flink.
    ///
    /// # Errors
    /// Not a global phase, or a batch of another schema.
    pub fn push_accumulators(&mut self, batch: &RecordBatch) -> Result<Vec<ChangeBatch>> {
        let Input::Accumulators(schema) = &self.input else {
            return Err(Error::invalid_input(
                "push_accumulators needs a global phase (try_new_global)",
            ));
        };
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
        crate::operator::keyed::hash_keys(&batch.columns()[..k], n, &mut self.hashes)?;
        let mut gids = std::mem::take(&mut self.gids);
        let result = (|| -> Result<()> {
            self.keyed
                .intern(&batch.columns()[..k], &self.hashes, k, n, &mut gids)?;
            self.grow();
            let pieces = match &mut self.firing {
                Firing::Own(trigger) => trigger.cut(n),
                Firing::Runtime => vec![(0, n, false)],
            };
            for (off, len, ends) in pieces {
                self.merge_rows(&batch.slice(off, len), &gids[off..off + len], None)?;
                if ends {
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

    /// Fires the pending mini-batch if the latency interval has passed on the clock (for a
    /// source that has gone quiet). Returns the changes it emitted.
    ///
    /// # Errors
    /// As [`GroupAggregate::push_changes`].
    pub fn poll(&mut self) -> Result<Vec<ChangeBatch>> {
        let mut out = vec![];
        self.set_now();
        self.check_latency(&mut out)?;
        self.sweep_expired()?;
        Ok(out)
    }

    /// End of input (or, for a worker, the end of the runtime's mini-batch): fires the pending
    /// mini-batch and returns its changes.
    ///
    /// # Errors
    /// As [`GroupAggregate::push_changes`].
    pub fn finish(&mut self) -> Result<Vec<ChangeBatch>> {
        let mut out = vec![];
        self.set_now();
        if let Firing::Own(trigger) = &mut self.firing {
            trigger.reset();
        }
        self.fire()?;
        self.emit(&mut out)?;
        Ok(out)
    }

    /// Takes rows routed to this worker, in order. With mini-batch on they join the pending
    /// mini-batch (a global phase applies them as raw rows, dropping no retraction); with it off
    /// each part is processed per record and the changes of all parts come back as one batch.
    pub(crate) fn push_routed(&mut self, parts: &[Routed]) -> Result<Vec<ChangeBatch>> {
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
                self.keyed.intern(
                    &part.cb.keys,
                    &part.hashes,
                    part.cb.keys.len(),
                    n,
                    &mut gids,
                )?;
                self.grow();
                self.metrics.rows_in += n as u64;
                if self.config.mini_batch_enabled {
                    self.apply(&part.cb, 0, n, &gids)?;
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

    /// Merges accumulator rows routed to this worker (a global phase of the runtime), with their
    /// key hashes and the input rows each folds.
    pub(crate) fn merge_routed(&mut self, parts: &[Flushed]) -> Result<()> {
        if !self.is_global() {
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
                self.keyed.intern(
                    &batch.columns()[..k],
                    &part.hashes,
                    part.hashed_keys,
                    n,
                    &mut gids,
                )?;
                self.grow();
                self.merge_rows(batch, &gids, Some(&part.rows))?;
                self.metrics.rows_in += n as u64;
            }
            Ok(())
        })();
        self.gids = gids;
        result
    }

    /// Merges accumulator rows (interned as `gids`) into the pending mini-batch: keeps the
    /// groups' results on first touch, merges the states, adds the record counts, and counts the
    /// input rows each stands for (`rows`, or the absolute record count when not given).
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
        let total = self.keyed.len();
        self.keyed
            .accs
            .merge(&batch.columns()[k..last], gids, total)?;
        if self.plan.has_retractions() {
            for (&g, &c) in gids.iter().zip(counts.values()) {
                self.keyed.count1[g as usize] += c;
            }
        }
        match rows {
            Some(rows) => {
                for (&g, &r) in gids.iter().zip(rows) {
                    self.keyed.key_rows[g as usize] += r;
                }
            }
            None => {
                for (&g, &c) in gids.iter().zip(counts.values()) {
                    self.keyed.key_rows[g as usize] += c.unsigned_abs();
                }
            }
        }
        Ok(())
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

    /// Mini-batch on: applies `cb` (group ids `gids`) to the pending mini-batch, firing each
    /// one that fills up on the way when the operator fires its own.
    fn push_mini_batch(
        &mut self,
        cb: &CalcBatch,
        gids: &[u32],
        out: &mut Vec<ChangeBatch>,
    ) -> Result<()> {
        let n = cb.num_rows;
        let pieces = match &mut self.firing {
            Firing::Own(trigger) => trigger.cut(n),
            Firing::Runtime => vec![(0, n, false)],
        };
        for (off, len, ends) in pieces {
            self.apply(cb, off, len, &gids[off..off + len])?;
            if ends {
                self.fire()?;
                self.emit(out)?;
            }
        }
        Ok(())
    }

    /// Grows the per-group vectors to the groups in the table.
    pub(super) fn grow(&mut self) {
        self.keyed.grow();
        self.mini_batch.grow(self.keyed.len());
    }
}
