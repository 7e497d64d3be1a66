//! `ParallelAggregate`: a streaming GROUP BY over P workers, in one or two phases.
//!
//! # Execution
//!
//! Input arrives as slices (consecutive pieces of the stream, as P readers or the pipeline cut
//! it). Every step below runs as one task per slice or per worker on the [`Runtime`], with a
//! barrier between steps:
//!
//! 1. **Calc**: each slice evaluates the keys, arguments and FILTER masks and hashes its keys,
//!    once per row. Nothing is applied before every slice has evaluated, so a batch that fails
//!    (a bad cast, say) leaves the state untouched.
//! 2. Two-phase: each slice folds its rows into its own [`LocalGroupAggregate`], which keeps them
//!    until the mini-batch ends. One-phase (or a bypassed local phase): the **Exchange** routes
//!    each row to worker `partition_of(hash, P)`, reusing the hash, and the workers apply their
//!    rows.
//! 3. At the end of a mini-batch (a *round*: `table.exec.mini-batch.size` input rows per worker,
//!    i.e. size × P rows, as each of Flink's P tasks buffers `size` rows; or the latency interval
//!    passing on the clock; or the end of input), the local phases flush one
//!    accumulator row per key, the exchange routes those rows by the same hash, each worker's
//!    global phase merges them, and every worker emits its part of the changelog. The output of
//!    a round is the workers' changelogs in worker order; each key lives on one worker, so its
//!    changes stay in order.
//!
//! With mini-batch off there are no rounds: the workers run one phase per record (Flink's
//! `GroupAggFunction`) on the rows routed to them, in input order.
//!
//! # The adaptive local phase
//!
//! A local phase pays off when it folds many rows into few accumulator rows, or when it folds a
//! hot key that would otherwise pin one worker. It measures its reduction ratio (accumulator rows
//! out / rows in) and the largest share of its input held by one key over at least
//! `tally.exec.local-agg.adaptive.min-rows` input rows; when the ratio is above
//! `tally.exec.local-agg.adaptive.threshold` and no key holds more than 1 / P of the input,
//! following rounds bypass it (rows go through the exchange to the global phase, which applies
//! them as raw rows), and after
//! `tally.exec.local-agg.adaptive.probe-interval` bypassed rows it is measured again. Decisions
//! are taken between rounds, from row counts only, so a given input and configuration always
//! takes the same decisions. Results do not depend on them: merging the fold of some rows equals
//! applying the rows.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::{RecordBatch, UInt32Array};
use arrow::buffer::ScalarBuffer;
use arrow::compute::take_record_batch;
use tally_kernels::hash::partition_of;

use crate::clock::Clock;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::operator::group_aggregate::Routed;
use crate::operator::local::Flushed;
use crate::operator::state::hash_keys;
use crate::operator::{GroupAggregate, LocalGroupAggregate, Metrics};
use crate::plan::{AggregatePlan, CalcBatch};
use crate::runtime::Runtime;

/// How many hot keys the metrics report.
pub const HOT_KEYS: usize = 5;

/// Counters of one stage of a parallel aggregation.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StageMetrics {
    /// The stage, by its EXPLAIN name (`Calc`, `LocalGroupAggregate`, `Exchange`,
    /// `GroupAggregate` or `GlobalGroupAggregate`).
    pub name: &'static str,
    /// Rows into the stage.
    pub rows_in: u64,
    /// Rows out of the stage (for the aggregate: changelog rows).
    pub rows_out: u64,
    /// Tasks run (slices, or worker calls).
    pub batches: u64,
    /// Time spent in the stage's tasks, summed over workers.
    pub busy: Duration,
}

/// Counters of one worker of the aggregate stage.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WorkerMetrics {
    /// Rows the exchange sent it (raw rows, or accumulator rows in two-phase mode).
    pub rows_received: u64,
    /// Input rows those rows stand for (equal to `rows_received` in one-phase mode).
    pub input_rows: u64,
    /// Time spent in its tasks.
    pub busy: Duration,
    /// The operator's own counters (rows, state keys and bytes, …).
    pub operator: Metrics,
}

/// What the adaptive local phase measured and decided.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LocalPhaseMetrics {
    /// Whether the adaptive bypass is enabled.
    pub adaptive: bool,
    /// Whether the local phase is bypassed now.
    pub bypassed: bool,
    /// The last measured reduction ratio (rows out / rows in), once one was measured.
    pub last_ratio: Option<f64>,
    /// The largest share of a local phase's input that one key held in the last measurement
    /// (the share one worker would get from that key if the local phase were bypassed).
    pub last_hot_share: Option<f64>,
    /// Input rows the local phase folded.
    pub rows_in: u64,
    /// Accumulator rows it emitted.
    pub rows_out: u64,
    /// Input rows that went around it.
    pub rows_bypassed: u64,
    /// Times it was switched off.
    pub bypass_decisions: u64,
    /// Times it was switched on again to be measured.
    pub probes: u64,
}

/// Metrics of a parallel aggregation: per stage, per worker, skew, state and hot keys.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AggregateMetrics {
    /// Workers.
    pub parallelism: usize,
    /// Whether it runs a local and a global phase.
    pub two_phase: bool,
    /// Rows pushed into the aggregate.
    pub rows_in: u64,
    /// Changelog rows emitted.
    pub rows_out: u64,
    /// Mini-batches (rounds) completed.
    pub rounds: u64,
    /// The stages, in data-flow order.
    pub stages: Vec<StageMetrics>,
    /// The workers of the aggregate stage.
    pub workers: Vec<WorkerMetrics>,
    /// Rows received by the busiest worker divided by the mean over workers (1 = even load;
    /// P = everything on one worker). In two-phase mode workers receive accumulator rows, so a
    /// hot key weighs what its local phases emit, not what they folded.
    pub skew_ratio: f64,
    /// Groups with state, over all workers.
    pub keys_in_state: u64,
    /// Bytes of keyed state over all workers (plus the local phases' buffers).
    pub state_bytes: u64,
    /// The sum of the workers' peak state bytes (an upper bound of the peak of the whole; see
    /// [`Metrics::peak_state_bytes`]), plus the local phases' buffers.
    pub peak_state_bytes: u64,
    /// Retractions dropped, over all workers, because their key had no state.
    pub dropped_retractions: u64,
    /// Compactions of the workers' group tables.
    pub compactions: u64,
    /// The keys that received the most input rows, hottest first.
    pub hot_keys: Vec<(String, u64)>,
    /// The local phase (two-phase only).
    pub local: Option<LocalPhaseMetrics>,
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

impl fmt::Display for AggregateMetrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "parallelism {}, {}, rows in {}, changelog rows out {}, mini-batches {}",
            self.parallelism,
            if self.two_phase {
                "two-phase"
            } else {
                "one-phase"
            },
            self.rows_in,
            self.rows_out,
            self.rounds
        )?;
        for s in &self.stages {
            writeln!(
                f,
                "  {:<21} rows in {:>12}  rows out {:>12}  tasks {:>8}  busy {}",
                s.name,
                s.rows_in,
                s.rows_out,
                s.batches,
                ms(s.busy)
            )?;
        }
        for (i, w) in self.workers.iter().enumerate() {
            writeln!(
                f,
                "  worker {i:<3} received {:>12} rows (input rows {:>12})  busy {}  keys {}  state {} bytes",
                w.rows_received,
                w.input_rows,
                ms(w.busy),
                w.operator.keys_in_state,
                w.operator.state_bytes
            )?;
        }
        writeln!(
            f,
            "  skew ratio {:.2} (busiest worker's rows received / mean)",
            self.skew_ratio
        )?;
        writeln!(
            f,
            "  state: {} keys, {} bytes (peak {} bytes), compactions {}, dropped retractions {}",
            self.keys_in_state,
            self.state_bytes,
            self.peak_state_bytes,
            self.compactions,
            self.dropped_retractions
        )?;
        if let Some(l) = &self.local {
            let ratio = l
                .last_ratio
                .map_or("not measured yet".to_string(), |r| format!("{r:.3}"));
            let hot = l
                .last_hot_share
                .map_or("-".to_string(), |r| format!("{r:.3}"));
            writeln!(
                f,
                "  local phase: {} (adaptive {}), reduction ratio {ratio}, hottest key's share {hot}, rows in {}, rows out {}, rows bypassed {}, bypass decisions {}, probes {}",
                if l.bypassed { "bypassed" } else { "active" },
                if l.adaptive { "on" } else { "off" },
                l.rows_in,
                l.rows_out,
                l.rows_bypassed,
                l.bypass_decisions,
                l.probes
            )?;
        }
        if !self.hot_keys.is_empty() {
            let keys: Vec<String> = self
                .hot_keys
                .iter()
                .map(|(k, n)| format!("[{k}] {n}"))
                .collect();
            writeln!(f, "  hot keys (input rows): {}", keys.join(", "))?;
        }
        Ok(())
    }
}

/// The adaptive local phase's state machine (see the module docs).
#[derive(Debug, Clone, Default)]
struct Adaptive {
    m: LocalPhaseMetrics,
    threshold: f64,
    min_rows: u64,
    probe_interval: u64,
    window_in: u64,
    window_out: u64,
    window_hot_share: f64,
    since_bypass: u64,
    workers: usize,
}

impl Adaptive {
    fn new(config: &Config, workers: usize) -> Self {
        Self {
            m: LocalPhaseMetrics {
                adaptive: config.adaptive_local,
                ..LocalPhaseMetrics::default()
            },
            threshold: config.adaptive_threshold,
            min_rows: config.adaptive_min_rows,
            probe_interval: config.adaptive_probe_interval,
            workers,
            ..Self::default()
        }
    }

    /// Accounts for a finished round: `folded` input rows became `out` accumulator rows (the
    /// hottest key held `hot_share` of a local phase's input), and `bypassed` rows went around
    /// the local phase.
    ///
    /// The local phase is bypassed when its ratio is above the threshold and no key holds more
    /// than a worker's fair share (1 / P) of its input: bypassing would send such a key's raw rows
    /// to one worker, which is the skew the local phase exists to remove.
    fn after_round(&mut self, folded: u64, out: u64, hot_share: f64, bypassed: u64) {
        self.m.rows_in += folded;
        self.m.rows_out += out;
        self.m.rows_bypassed += bypassed;
        if !self.m.adaptive {
            return;
        }
        if self.m.bypassed {
            self.since_bypass += bypassed;
            if self.since_bypass >= self.probe_interval {
                self.m.bypassed = false;
                self.m.probes += 1;
            }
            return;
        }
        self.window_in += folded;
        self.window_out += out;
        self.window_hot_share = self.window_hot_share.max(hot_share);
        if self.window_in >= self.min_rows {
            let ratio = self.window_out as f64 / self.window_in as f64;
            self.m.last_ratio = Some(ratio);
            self.m.last_hot_share = Some(self.window_hot_share);
            if ratio > self.threshold && self.window_hot_share <= 1.0 / self.workers as f64 {
                self.m.bypassed = true;
                self.m.bypass_decisions += 1;
                self.since_bypass = 0;
            }
            self.window_in = 0;
            self.window_out = 0;
            self.window_hot_share = 0.0;
        }
    }
}

#[derive(Debug)]
struct Worker {
    agg: GroupAggregate,
    rows_received: u64,
    input_rows: u64,
    busy: Duration,
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
    plan: Arc<AggregatePlan>,
    config: Config,
    clock: Arc<dyn Clock>,
    runtime: Arc<Runtime>,
    two_phase: bool,
    locals: Vec<LocalGroupAggregate>,
    workers: Vec<Worker>,
    /// Input rows in the current round.
    round_rows: usize,
    /// Rows folded by, and routed around, the local phases in the current round.
    round_folded: u64,
    round_bypassed: u64,
    last_interval: i64,
    adaptive: Adaptive,
    calc: StageMetrics,
    local: StageMetrics,
    exchange: StageMetrics,
    aggregate: StageMetrics,
    rounds: u64,
    min_slice_rows: usize,
    /// Settings that had no effect, found by the builder.
    warnings: Vec<String>,
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
        let mut workers = Vec::with_capacity(p);
        for _ in 0..p {
            let mut agg = if two_phase {
                GroupAggregate::try_new_global(
                    Arc::clone(&plan),
                    config.clone(),
                    Arc::clone(&clock),
                )?
            } else {
                GroupAggregate::try_new(Arc::clone(&plan), config.clone(), Arc::clone(&clock))?
            };
            agg.set_driven();
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
        let stage = |name| StageMetrics {
            name,
            ..StageMetrics::default()
        };
        Ok(Self {
            plan,
            config,
            clock,
            runtime,
            two_phase,
            locals,
            workers,
            round_rows: 0,
            round_folded: 0,
            round_bypassed: 0,
            last_interval: i64::MIN,
            adaptive,
            calc: stage("Calc"),
            local: stage("LocalGroupAggregate"),
            exchange: stage("Exchange"),
            aggregate: stage(if two_phase {
                "GlobalGroupAggregate"
            } else {
                "GroupAggregate"
            }),
            rounds: 0,
            min_slice_rows: MIN_SLICE_ROWS,
            warnings: vec![],
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

    /// Whether it runs a local and a global phase.
    pub fn is_two_phase(&self) -> bool {
        self.two_phase
    }

    /// The resolved query.
    pub fn plan(&self) -> &AggregatePlan {
        &self.plan
    }

    /// The schema of the emitted changelog: `op` (Int8), the keys, the aggregate results.
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

    /// Consumes one input batch, cut into up to P slices, and returns the changes that became
    /// due (see [`ParallelAggregate::push_slices`]).
    ///
    /// # Errors
    /// As [`ParallelAggregate::push_slices`].
    pub fn push(&mut self, batch: &RecordBatch) -> Result<Vec<RecordBatch>> {
        let slices = split(batch, self.runtime.parallelism());
        self.push_slices(slices)
    }

    /// Consumes consecutive slices of the input (in stream order) and returns the changes that
    /// became due: with mini-batch off, the changes of every row; with it on, those of each
    /// mini-batch that filled up (or whose latency passed on the clock).
    ///
    /// # Errors
    /// A slice whose schema differs from the input schema, a bad changelog op, or an expression
    /// that fails on the data; a batch that fails so leaves the state as it was before it.
    pub fn push_slices(&mut self, slices: Vec<RecordBatch>) -> Result<Vec<RecordBatch>> {
        let runtime = Arc::clone(&self.runtime);
        runtime.install(|| self.push_slices_on_pool(slices))
    }

    fn push_slices_on_pool(&mut self, slices: Vec<RecordBatch>) -> Result<Vec<RecordBatch>> {
        for s in &slices {
            self.plan.check_input(s)?;
        }
        let n: usize = slices.iter().map(RecordBatch::num_rows).sum();
        let mini_batch = self.config.mini_batch_enabled;
        let size = if mini_batch {
            usize::try_from(self.config.mini_batch_size)
                .map_err(|_| Error::internal("mini-batch size not validated"))?
                .saturating_mul(self.runtime.parallelism())
        } else {
            usize::MAX
        };
        // One-phase rows are routed in the same task as their Calc when no mini-batch ends
        // inside this push (a latency trigger ends one before it, which only empties the round).
        let route_early = !self.two_phase && self.round_rows.saturating_add(n) < size;
        // Calc runs on the whole push before anything is applied or fired: a batch that fails
        // to evaluate (a bad cast, say) leaves the state as it was and loses no change that
        // became due.
        let evaluated = self.evaluate(slices, route_early)?;
        let mut out = vec![];
        self.check_latency(&mut out)?;
        if route_early {
            if mini_batch {
                self.round_rows += n;
            }
            let routed = evaluated
                .into_iter()
                .filter_map(|e| match e {
                    Evaluated::Routed(parts) => Some(parts),
                    Evaluated::Hashed(_) => None,
                })
                .collect();
            self.apply_routed(routed, n as u64, &mut out)?;
            return Ok(out);
        }
        let mut round = vec![];
        for e in evaluated {
            let Evaluated::Hashed(mut s) = e else {
                return Err(Error::internal(
                    "rows routed before their mini-batch was cut",
                ));
            };
            loop {
                let need = size - self.round_rows;
                let n = s.num_rows();
                if n < need {
                    self.round_rows += n;
                    if n > 0 {
                        round.push(s);
                    }
                    break;
                }
                round.push(s.slice(0, need));
                self.round_rows = size;
                self.process(std::mem::take(&mut round), &mut out)?;
                self.end_round(&mut out)?;
                if n == need {
                    break;
                }
                s = s.slice(need, n - need);
            }
        }
        self.process(round, &mut out)?;
        Ok(out)
    }

    /// Calc: evaluates and hashes the slices, regrouped into at most P tasks of consecutive
    /// rows, and with `route` also routes them to the workers. Returns the slices in order.
    fn evaluate(&mut self, slices: Vec<RecordBatch>, route_rows: bool) -> Result<Vec<Evaluated>> {
        let p = self.runtime.parallelism();
        let tasks = balance(slices, p, self.min_slice_rows);
        let n_tasks = tasks.len() as u64;
        let plan = &self.plan;
        let results = self.runtime.map(
            tasks,
            |batches| -> Result<(Vec<Evaluated>, u64, Duration, Duration)> {
                let (mut calc_busy, mut exchange_busy) = (Duration::ZERO, Duration::ZERO);
                let mut rows = 0;
                let mut out = Vec::with_capacity(batches.len());
                for b in batches {
                    let start = Instant::now();
                    let cb = plan.calc.evaluate(&b)?;
                    rows += cb.num_rows as u64;
                    let mut hashes = vec![];
                    hash_keys(&cb.keys, cb.num_rows, &mut hashes)?;
                    let routing = Instant::now();
                    calc_busy += routing - start;
                    let hashed = Hashed {
                        cb,
                        hashes: hashes.into(),
                    };
                    if route_rows {
                        out.push(Evaluated::Routed(route(hashed, p)?));
                        exchange_busy += routing.elapsed();
                    } else {
                        out.push(Evaluated::Hashed(hashed));
                    }
                }
                Ok((out, rows, calc_busy, exchange_busy))
            },
        );
        // Counted only once every slice has evaluated (a failed push counts nothing).
        let results = results.into_iter().collect::<Result<Vec<_>>>()?;
        let mut all = vec![];
        for (evaluated, rows, calc_busy, exchange_busy) in results {
            self.calc.busy += calc_busy;
            self.exchange.busy += exchange_busy;
            self.calc.rows_in += rows;
            self.calc.rows_out += rows;
            all.extend(evaluated);
        }
        self.calc.batches += n_tasks;
        Ok(all)
    }

    /// Fires the pending mini-batch if the latency interval has passed on the clock.
    ///
    /// # Errors
    /// As [`ParallelAggregate::push_slices`].
    pub fn poll(&mut self) -> Result<Vec<RecordBatch>> {
        let runtime = Arc::clone(&self.runtime);
        runtime.install(|| {
            let mut out = vec![];
            self.check_latency(&mut out)?;
            Ok(out)
        })
    }

    /// End of input: fires the pending mini-batch and returns its changes.
    ///
    /// # Errors
    /// As [`ParallelAggregate::push_slices`].
    pub fn finish(&mut self) -> Result<Vec<RecordBatch>> {
        let runtime = Arc::clone(&self.runtime);
        runtime.install(|| {
            let mut out = vec![];
            self.end_round(&mut out)?;
            Ok(out)
        })
    }

    fn check_latency(&mut self, out: &mut Vec<RecordBatch>) -> Result<()> {
        if !self.config.mini_batch_enabled {
            return Ok(());
        }
        let (now, latency) = (self.clock.now_ms(), self.config.mini_batch_allow_latency);
        if crate::clock::crossed_interval(&mut self.last_interval, now, latency) {
            self.end_round(out)?;
        }
        Ok(())
    }

    /// Runs evaluated slices through the local phase, or through the exchange to the workers:
    /// they are regrouped into at most P tasks of consecutive rows, near-equal in size.
    fn process(&mut self, slices: Vec<Hashed>, out: &mut Vec<RecordBatch>) -> Result<()> {
        let p = self.runtime.parallelism();
        let tasks = balance(slices, p, self.min_slice_rows);
        if tasks.is_empty() {
            return Ok(());
        }
        let rows: u64 = tasks.iter().flatten().map(|h| h.num_rows() as u64).sum();
        let n_tasks = tasks.len() as u64;
        if self.two_phase && !self.adaptive.m.bypassed {
            let work: Vec<(&mut LocalGroupAggregate, Vec<Hashed>)> =
                self.locals.iter_mut().zip(tasks).collect();
            let results = self
                .runtime
                .map(work, |(local, slices)| -> Result<Duration> {
                    let start = Instant::now();
                    for h in slices {
                        local.push_evaluated(&h.cb, &h.hashes)?;
                    }
                    Ok(start.elapsed())
                });
            for r in results {
                self.local.busy += r?;
            }
            self.local.rows_in += rows;
            self.local.batches += n_tasks;
            self.round_folded += rows;
            return Ok(());
        }
        let results = self
            .runtime
            .map(tasks, |slices| -> Result<(Vec<Vec<Routed>>, Duration)> {
                let start = Instant::now();
                let routed = slices
                    .into_iter()
                    .map(|h| route(h, p))
                    .collect::<Result<Vec<_>>>()?;
                Ok((routed, start.elapsed()))
            });
        let mut routed = Vec::with_capacity(results.len());
        for r in results {
            let (parts, busy) = r?;
            self.exchange.busy += busy;
            routed.extend(parts);
        }
        if self.two_phase {
            self.round_bypassed += rows;
        }
        self.apply_routed(routed, rows, out)
    }

    /// The exchange's delivery: each worker applies the rows routed to it (`routed[i][w]` is
    /// slice `i`'s part for worker `w`), in slice order, and emits what became due.
    fn apply_routed(
        &mut self,
        routed: Vec<Vec<Routed>>,
        rows: u64,
        out: &mut Vec<RecordBatch>,
    ) -> Result<()> {
        let p = self.runtime.parallelism();
        let slices = routed.len() as u64;
        let mut per_worker: Vec<Vec<Routed>> = (0..p).map(|_| vec![]).collect();
        for parts in routed {
            for (w, part) in parts.into_iter().enumerate() {
                if part.cb.num_rows > 0 {
                    per_worker[w].push(part);
                }
            }
        }
        self.exchange.rows_in += rows;
        self.exchange.rows_out += rows;
        self.exchange.batches += slices;
        let tasks: Vec<(&mut Worker, Vec<Routed>)> =
            self.workers.iter_mut().zip(per_worker).collect();
        let results = self
            .runtime
            .map(tasks, |(w, parts)| -> Result<Vec<RecordBatch>> {
                if parts.is_empty() {
                    return Ok(vec![]);
                }
                let start = Instant::now();
                let n: u64 = parts.iter().map(|r| r.cb.num_rows as u64).sum();
                let changes = w.agg.push_routed(&parts)?;
                w.rows_received += n;
                w.input_rows += n;
                w.busy += start.elapsed();
                Ok(changes)
            });
        self.collect(results, out)
    }

    /// Appends the workers' changes in worker order.
    fn collect(
        &mut self,
        results: Vec<Result<Vec<RecordBatch>>>,
        out: &mut Vec<RecordBatch>,
    ) -> Result<()> {
        for r in results {
            for b in r? {
                self.aggregate.rows_out += b.num_rows() as u64;
                out.push(b);
            }
        }
        Ok(())
    }

    /// Ends the round: flushes the local phases through the exchange into the global phases and
    /// has every worker emit its changes.
    fn end_round(&mut self, out: &mut Vec<RecordBatch>) -> Result<()> {
        let p = self.runtime.parallelism();
        let mut flushed_rows = 0u64;
        let mut hot_share = 0.0f64;
        let mut per_worker: Vec<Vec<Flushed>> = (0..p).map(|_| vec![]).collect();
        if self.locals.iter().any(|l| l.keys() > 0) {
            let locals: Vec<&mut LocalGroupAggregate> = self.locals.iter_mut().collect();
            let flushed = self.runtime.map(
                locals,
                |local| -> Result<(Vec<Flushed>, f64, Duration, Duration)> {
                    let start = Instant::now();
                    let Some(f) = local.flush_parts()? else {
                        return Ok((vec![], 0.0, start.elapsed(), Duration::ZERO));
                    };
                    let top = f.rows.iter().copied().max().unwrap_or(0);
                    let all: u64 = f.rows.iter().sum();
                    let hot_share = top as f64 / all.max(1) as f64;
                    let routing = Instant::now();
                    let parts = route_accumulators(f, p)?;
                    Ok((parts, hot_share, routing - start, routing.elapsed()))
                },
            );
            for f in flushed {
                let (parts, share, local_busy, exchange_busy) = f?;
                hot_share = hot_share.max(share);
                self.local.busy += local_busy;
                self.exchange.busy += exchange_busy;
                for (w, part) in parts.into_iter().enumerate() {
                    if part.batch.num_rows() > 0 {
                        flushed_rows += part.batch.num_rows() as u64;
                        per_worker[w].push(part);
                    }
                }
            }
            self.local.rows_out += flushed_rows;
            self.exchange.rows_in += flushed_rows;
            self.exchange.rows_out += flushed_rows;
            self.exchange.batches += p as u64;
        }
        // Each worker merges what it received and emits its changes, in one task.
        let tasks: Vec<(&mut Worker, Vec<Flushed>)> =
            self.workers.iter_mut().zip(per_worker).collect();
        let results = self
            .runtime
            .map(tasks, |(w, parts)| -> Result<Vec<RecordBatch>> {
                let start = Instant::now();
                if !parts.is_empty() {
                    w.agg.merge_routed(&parts)?;
                    w.rows_received += parts.iter().map(|f| f.batch.num_rows() as u64).sum::<u64>();
                    w.input_rows += parts.iter().flat_map(|f| &f.rows).sum::<u64>();
                }
                let changes = w.agg.finish()?;
                w.busy += start.elapsed();
                Ok(changes)
            });
        self.collect(results, out)?;
        if self.round_rows > 0 {
            self.rounds += 1;
        }
        if self.two_phase {
            self.adaptive.after_round(
                self.round_folded,
                flushed_rows,
                hot_share,
                self.round_bypassed,
            );
        }
        self.round_rows = 0;
        self.round_folded = 0;
        self.round_bypassed = 0;
        Ok(())
    }

    /// The schema of [`ParallelAggregate::snapshot`] (that of [`GroupAggregate::snapshot`]).
    pub fn snapshot_schema(&self) -> arrow::datatypes::SchemaRef {
        self.workers[0].agg.snapshot_schema()
    }

    /// The keyed state of every worker, as [`GroupAggregate::snapshot`] batches. The round in
    /// progress must be finished first ([`ParallelAggregate::finish`], whose changes are
    /// delivered before the snapshot is kept), as Flink fires its mini-batch before a
    /// checkpoint barrier; the local phases then hold nothing.
    ///
    /// # Errors
    /// A round in progress.
    pub fn snapshot(&self) -> Result<Vec<RecordBatch>> {
        if self.round_rows > 0
            || self.locals.iter().any(|l| l.keys() > 0)
            || self.workers.iter().any(|w| w.agg.has_pending())
        {
            return Err(Error::invalid_input(
                "cannot snapshot with a mini-batch pending: call finish() and deliver its changes first",
            ));
        }
        let mut out = vec![];
        for w in &self.workers {
            out.extend(w.agg.snapshot()?);
        }
        Ok(out)
    }

    /// Loads a snapshot (of any parallelism) into this aggregate, which must hold no state: each
    /// group goes to the worker its key hashes to.
    ///
    /// # Errors
    /// As [`GroupAggregate::restore_snapshot`].
    pub fn restore_snapshot(&mut self, batches: &[RecordBatch]) -> Result<()> {
        let p = self.workers.len();
        let k = self.plan.key_types.len();
        // Each key is hashed once: the hash routes the group and interns it in its worker.
        let mut parts: Vec<Vec<(RecordBatch, Vec<u64>)>> = (0..p).map(|_| vec![]).collect();
        for b in batches {
            if b.num_columns() < k {
                return Err(Error::invalid_input(
                    "the snapshot was taken for another query: too few columns",
                ));
            }
            let mut hashes = vec![];
            crate::operator::state::hash_keys(&b.columns()[..k], b.num_rows(), &mut hashes)?;
            if p == 1 {
                parts[0].push((b.clone(), hashes));
                continue;
            }
            for (w, rows) in partition(&hashes, p).into_iter().enumerate() {
                if !rows.is_empty() {
                    let part_hashes = rows.iter().map(|&r| hashes[r as usize]).collect();
                    let idx = arrow::array::UInt32Array::from(rows);
                    parts[w].push((arrow::compute::take_record_batch(b, &idx)?, part_hashes));
                }
            }
        }
        let tasks: Vec<_> = self.workers.iter_mut().zip(parts).collect();
        let results = self
            .runtime
            .map(tasks, |(w, parts)| w.agg.restore_hashed(&parts));
        results.into_iter().collect()
    }

    /// The metrics so far.
    ///
    /// # Errors
    /// When a hot key cannot be formatted (a bug).
    pub fn metrics(&self) -> Result<AggregateMetrics> {
        let workers: Vec<WorkerMetrics> = self
            .workers
            .iter()
            .map(|w| WorkerMetrics {
                rows_received: w.rows_received,
                input_rows: w.input_rows,
                busy: w.busy,
                operator: w.agg.metrics(),
            })
            .collect();
        let total: u64 = workers.iter().map(|w| w.rows_received).sum();
        let max = workers.iter().map(|w| w.rows_received).max().unwrap_or(0);
        let skew_ratio = if total == 0 {
            1.0
        } else {
            max as f64 * workers.len() as f64 / total as f64
        };
        let mut hot_keys = vec![];
        for w in &self.workers {
            hot_keys.extend(w.agg.hot_keys(HOT_KEYS)?);
        }
        hot_keys.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        hot_keys.truncate(HOT_KEYS);
        let mut aggregate = self.aggregate.clone();
        aggregate.rows_in = workers.iter().map(|w| w.rows_received).sum();
        aggregate.batches = workers.iter().map(|w| w.operator.batches_in).sum();
        aggregate.busy = workers.iter().map(|w| w.busy).sum();
        let mut stages = vec![self.calc.clone()];
        if self.two_phase {
            stages.push(self.local.clone());
        }
        stages.push(self.exchange.clone());
        stages.push(aggregate);
        let local_bytes: usize = self.locals.iter().map(LocalGroupAggregate::size).sum();
        Ok(AggregateMetrics {
            parallelism: self.workers.len(),
            two_phase: self.two_phase,
            rows_in: self.calc.rows_in,
            rows_out: self.aggregate.rows_out,
            rounds: self.rounds,
            stages,
            keys_in_state: workers.iter().map(|w| w.operator.keys_in_state).sum(),
            state_bytes: workers.iter().map(|w| w.operator.state_bytes).sum::<u64>()
                + local_bytes as u64,
            peak_state_bytes: workers
                .iter()
                .map(|w| w.operator.peak_state_bytes)
                .sum::<u64>()
                + local_bytes as u64,
            dropped_retractions: workers.iter().map(|w| w.operator.dropped_retractions).sum(),
            compactions: workers.iter().map(|w| w.operator.compactions).sum(),
            workers,
            skew_ratio,
            hot_keys,
            local: self.two_phase.then(|| self.adaptive.m.clone()),
        })
    }
}

impl crate::checkpoint::Checkpointed for ParallelAggregate {
    fn snapshot_schema(&self) -> arrow::datatypes::SchemaRef {
        ParallelAggregate::snapshot_schema(self)
    }
    fn snapshot(&self) -> Result<Vec<RecordBatch>> {
        ParallelAggregate::snapshot(self)
    }
    fn restore_snapshot(&mut self, batches: &[RecordBatch]) -> Result<()> {
        ParallelAggregate::restore_snapshot(self, batches)
    }
}

/// Rows after Calc, with each row's key hash.
#[derive(Debug, Clone)]
struct Hashed {
    cb: CalcBatch,
    hashes: ScalarBuffer<u64>,
}

/// A slice after Calc: hashed (for a local phase, or for the exchange once its mini-batch is
/// cut), or already routed to the workers.
enum Evaluated {
    Hashed(Hashed),
    Routed(Vec<Routed>),
}

/// Consecutive rows that can be cut without copying: record batches and evaluated slices.
trait Rows: Sized {
    fn num_rows(&self) -> usize;
    fn slice(&self, offset: usize, len: usize) -> Self;
}

impl Rows for RecordBatch {
    fn num_rows(&self) -> usize {
        RecordBatch::num_rows(self)
    }
    fn slice(&self, offset: usize, len: usize) -> Self {
        RecordBatch::slice(self, offset, len)
    }
}

impl Rows for Hashed {
    fn num_rows(&self) -> usize {
        self.cb.num_rows
    }
    fn slice(&self, offset: usize, len: usize) -> Self {
        Hashed {
            cb: self.cb.slice(offset, len),
            hashes: self.hashes.slice(offset, len),
        }
    }
}

/// Cuts `batch` into up to `p` consecutive slices of at least [`MIN_SLICE_ROWS`] rows.
pub fn split(batch: &RecordBatch, p: usize) -> Vec<RecordBatch> {
    split_rows(batch.num_rows(), p)
        .into_iter()
        .map(|(offset, len)| batch.slice(offset, len))
        .collect()
}

/// `(offset, len)` of up to `p` consecutive, near-equal slices of `n` rows, each of at least
/// [`MIN_SLICE_ROWS`] rows (one slice when `n` is smaller).
pub fn split_rows(n: usize, p: usize) -> Vec<(usize, usize)> {
    let pieces = p.min(n / MIN_SLICE_ROWS).max(1);
    let mut out = Vec::with_capacity(pieces);
    let mut start = 0;
    for i in 0..pieces {
        let end = n * (i + 1) / pieces;
        out.push((start, end - start));
        start = end;
    }
    out
}

/// Regroups consecutive slices into at most `p` tasks of consecutive rows, near-equal in size
/// (each of at least `min_rows` rows when there are enough), cutting slices where needed
/// (zero-copy). Task `j`'s rows all come before task `j + 1`'s.
fn balance<T: Rows>(slices: Vec<T>, p: usize, min_rows: usize) -> Vec<Vec<T>> {
    let total: usize = slices.iter().map(Rows::num_rows).sum();
    if total == 0 {
        return vec![];
    }
    let tasks = p.min(total / min_rows).max(1);
    let mut out: Vec<Vec<T>> = (0..tasks).map(|_| vec![]).collect();
    let (mut task, mut pos) = (0, 0);
    for s in slices {
        let n = s.num_rows();
        let mut off = 0;
        while off < n {
            let task_end = total * (task + 1) / tasks;
            let take = (n - off).min(task_end - pos);
            if take > 0 {
                out[task].push(s.slice(off, take));
            }
            off += take;
            pos += take;
            if pos == task_end {
                task += 1;
            }
        }
    }
    out
}

/// Slices smaller than this are not worth a task of their own.
pub const MIN_SLICE_ROWS: usize = 1024;

/// Row indices per worker: row `r` goes to `partition_of(hashes[r], p)`.
fn partition(hashes: &[u64], p: usize) -> Vec<Vec<u32>> {
    let mut idx: Vec<Vec<u32>> = (0..p)
        .map(|_| Vec::with_capacity(hashes.len() / p + 16))
        .collect();
    for (r, &h) in hashes.iter().enumerate() {
        idx[partition_of(h, p)].push(r as u32);
    }
    idx
}

/// The exchange for evaluated rows: one part per worker.
fn route(h: Hashed, p: usize) -> Result<Vec<Routed>> {
    if p == 1 {
        return Ok(vec![Routed {
            cb: h.cb,
            hashes: h.hashes,
        }]);
    }
    partition(&h.hashes, p)
        .into_iter()
        .map(|idx| {
            let part_hashes: Vec<u64> = idx.iter().map(|&i| h.hashes[i as usize]).collect();
            let idx = UInt32Array::from(idx);
            Ok(Routed {
                cb: h.cb.take(&idx)?,
                hashes: part_hashes.into(),
            })
        })
        .collect()
}

/// The exchange for accumulator rows: one part per worker.
fn route_accumulators(f: Flushed, p: usize) -> Result<Vec<Flushed>> {
    if p == 1 {
        return Ok(vec![f]);
    }
    partition(&f.hashes, p)
        .into_iter()
        .map(|idx| {
            let hashes = idx.iter().map(|&i| f.hashes[i as usize]).collect();
            let rows = idx.iter().map(|&i| f.rows[i as usize]).collect();
            let idx = UInt32Array::from(idx);
            Ok(Flushed {
                batch: take_record_batch(&f.batch, &idx)?,
                hashes,
                rows,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{AsArray, Int64Array};
    use arrow::datatypes::{DataType, Field, Int64Type, Schema};

    fn batch(from: i64, n: usize) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, false)]));
        let values: Vec<i64> = (from..from + n as i64).collect();
        RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(values))]).unwrap()
    }

    #[test]
    fn balance_keeps_order_and_evens_out_tasks() {
        for (sizes, p, min_rows) in [
            (vec![10usize, 0, 3, 25, 1], 3, 1),
            (vec![100], 4, 1),
            (vec![5, 5], 4, 1),
            (vec![2000, 10], 4, 1024),
            (vec![0, 0], 2, 1),
            (vec![7], 1, 1),
        ] {
            let mut from = 0;
            let slices: Vec<RecordBatch> = sizes
                .iter()
                .map(|&n| {
                    let b = batch(from, n);
                    from += n as i64;
                    b
                })
                .collect();
            let total: usize = sizes.iter().sum();
            let tasks = balance(slices, p, min_rows);
            if total == 0 {
                assert!(tasks.is_empty());
                continue;
            }
            let want = p.min(total / min_rows).max(1);
            assert_eq!(tasks.len(), want, "{sizes:?} p {p}");
            let lens: Vec<usize> = tasks
                .iter()
                .map(|t| t.iter().map(RecordBatch::num_rows).sum())
                .collect();
            let (lo, hi) = (lens.iter().min().unwrap(), lens.iter().max().unwrap());
            assert!(hi - lo <= 1, "{sizes:?} p {p}: {lens:?}");
            let values: Vec<i64> = tasks
                .iter()
                .flatten()
                .flat_map(|b| {
                    let a = b.column(0).as_primitive::<Int64Type>();
                    (0..a.len()).map(|i| a.value(i)).collect::<Vec<_>>()
                })
                .collect();
            assert_eq!(values, (0..total as i64).collect::<Vec<_>>(), "{sizes:?}");
        }
    }

    #[test]
    fn adaptive_bypasses_without_a_hot_key_and_probes_again() {
        let config = Config {
            adaptive_threshold: 0.5,
            adaptive_min_rows: 100,
            adaptive_probe_interval: 1000,
            ..Config::default()
        };
        let mut a = Adaptive::new(&config, 4);
        // Not enough rows measured yet.
        a.after_round(60, 59, 0.01, 0);
        assert!(!a.m.bypassed && a.m.last_ratio.is_none());
        // A hot key over 1/4 of the input keeps the local phase, whatever the ratio.
        a.after_round(60, 59, 0.3, 0);
        assert!(!a.m.bypassed);
        assert_eq!(a.m.last_hot_share, Some(0.3));
        // A low ratio keeps it too.
        a.after_round(100, 40, 0.01, 0);
        assert!(!a.m.bypassed);
        assert_eq!(a.m.last_ratio, Some(0.4));
        // High ratio, no hot key: bypassed, until the probe interval has gone around it.
        a.after_round(100, 90, 0.01, 0);
        assert!(a.m.bypassed);
        assert_eq!(a.m.bypass_decisions, 1);
        a.after_round(0, 0, 0.0, 999);
        assert!(a.m.bypassed);
        a.after_round(0, 0, 0.0, 1);
        assert!(!a.m.bypassed);
        assert_eq!(a.m.probes, 1);
        assert_eq!(
            (a.m.rows_in, a.m.rows_out, a.m.rows_bypassed),
            (320, 248, 1000)
        );
        // Off: never bypassed.
        let mut off = Adaptive::new(
            &Config {
                adaptive_local: false,
                ..config
            },
            4,
        );
        off.after_round(1000, 1000, 0.0, 0);
        assert!(!off.m.bypassed && off.m.last_ratio.is_none());
    }

    #[test]
    fn split_rows_covers_the_batch() {
        for (n, p) in [(0, 4), (100, 4), (5000, 4), (4096, 4), (1 << 20, 16)] {
            let parts = split_rows(n, p);
            assert!(parts.len() <= p.max(1));
            let mut at = 0;
            for (off, len) in parts {
                assert_eq!(off, at);
                at += len;
            }
            assert_eq!(at, n);
        }
    }
}
