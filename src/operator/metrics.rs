//! What the operators measure: an operator's counters ([`Metrics`]) and, for a parallel
//! aggregation, its stages, its workers, skew, state, hot keys and the adaptive local phase
//! ([`AggregateMetrics`], printed by `--metrics` and EXPLAIN ANALYZE); on the pipelined runtime,
//! each task's busy and waiting times ([`TaskMetrics`]) and how many tasks are busy at once
//! ([`Activity`](crate::runtime::Activity), which gives the serial fraction).

use std::fmt;
use std::time::Duration;

use crate::error::Result;
use crate::operator::{LocalGroupAggregate, ParallelAggregate};

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
    /// Mini-batches fired (with mini-batch off: runs of distinct keys).
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
    /// (group, value) entries of the DISTINCT tables.
    pub distinct_pairs: u64,
    /// Bytes of the DISTINCT tables (part of `state_bytes`), from capacity.
    pub distinct_bytes: u64,
}

/// The busiest worker's rows received over the mean (1.0 when none received any).
pub(crate) fn skew_ratio(workers: &[WorkerMetrics]) -> f64 {
    let total: u64 = workers.iter().map(|w| w.rows_received).sum();
    let max = workers.iter().map(|w| w.rows_received).max().unwrap_or(0);
    if total == 0 {
        1.0
    } else {
        max as f64 * workers.len() as f64 / total as f64
    }
}

/// A step of a streaming aggregate: what runs, what EXPLAIN names, what metrics are kept for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AggregateStep {
    /// Evaluating the keys, arguments and FILTER masks, and hashing the keys.
    Calc,
    /// The local phase of a two-phase aggregate.
    LocalGroupAggregate,
    /// Routing rows (or accumulator rows) to the worker of their key.
    Exchange,
    /// The keyed aggregate of a one-phase aggregate.
    GroupAggregate,
    /// The global phase of a two-phase aggregate.
    GlobalGroupAggregate,
}

impl AggregateStep {
    /// The step's name, as Flink's EXPLAIN names it.
    pub fn name(self) -> &'static str {
        match self {
            AggregateStep::Calc => "Calc",
            AggregateStep::LocalGroupAggregate => "LocalGroupAggregate",
            AggregateStep::Exchange => "Exchange",
            AggregateStep::GroupAggregate => "GroupAggregate",
            AggregateStep::GlobalGroupAggregate => "GlobalGroupAggregate",
        }
    }

    /// The keyed step of an aggregate in one or two phases.
    pub fn keyed(two_phase: bool) -> Self {
        if two_phase {
            AggregateStep::GlobalGroupAggregate
        } else {
            AggregateStep::GroupAggregate
        }
    }

    /// Whether it is the keyed step (which holds the state and emits the changelog).
    pub fn is_keyed(self) -> bool {
        matches!(
            self,
            AggregateStep::GroupAggregate | AggregateStep::GlobalGroupAggregate
        )
    }
}

/// How many hot keys the metrics report.
pub const HOT_KEYS: usize = 5;

/// Counters of one stage of a parallel aggregation.
#[derive(Debug, Clone, PartialEq)]
pub struct StageMetrics {
    /// The step of the aggregate.
    pub step: AggregateStep,
    /// Rows into the stage.
    pub rows_in: u64,
    /// Rows out of the stage (for the aggregate: changelog rows).
    pub rows_out: u64,
    /// Tasks run (slices, or worker calls).
    pub batches: u64,
    /// Time spent in the stage's tasks, summed over workers.
    pub busy: Duration,
}

impl StageMetrics {
    /// Zero counters for `step`.
    pub fn new(step: AggregateStep) -> Self {
        Self {
            step,
            rows_in: 0,
            rows_out: 0,
            batches: 0,
            busy: Duration::ZERO,
        }
    }
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
    /// The last measured reduction ratio, once one was measured: what the local phase handed
    /// on (accumulator rows, and the DISTINCT (group, value) entries their lists carry) per row
    /// it folded.
    pub last_ratio: Option<f64>,
    /// The largest share of a local phase's input that one key held in the last measurement
    /// (the share one worker would get from that key if the local phase were bypassed).
    pub last_hot_share: Option<f64>,
    /// Input rows the local phase folded.
    pub rows_in: u64,
    /// Accumulator rows it emitted.
    pub rows_out: u64,
    /// DISTINCT (group, value) entries the lists of those rows carried.
    pub entries_out: u64,
    /// Input rows that went around it.
    pub rows_bypassed: u64,
    /// Times it was switched off.
    pub bypass_decisions: u64,
    /// Times it was switched on again to be measured.
    pub probes: u64,
}

/// What a task of the pipelined runtime does ([`crate::operator::pipelined`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum TaskRole {
    /// Reads a split of the input and runs Calc and the local phase on it.
    #[default]
    Source,
    /// The keyed step (global phase, or one-phase aggregate) of one worker.
    Keyed,
    /// The caller's thread, handing the changes on (to the rest of the pipeline and the sink).
    Consumer,
}

impl TaskRole {
    /// The role's name in metrics.
    pub fn name(self) -> &'static str {
        match self {
            TaskRole::Source => "source",
            TaskRole::Keyed => "keyed",
            TaskRole::Consumer => "consumer",
        }
    }
}

/// Where one task of the pipelined runtime spent its time.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TaskMetrics {
    /// What it does.
    pub role: TaskRole,
    /// Its index among the tasks of its role (split, worker).
    pub index: usize,
    /// Rows it processed (sources: rows read from the split; keyed tasks: rows and accumulator rows
    /// received; the consumer: changelog rows).
    pub rows: u64,
    /// Mini-batches (epochs) it completed.
    pub epochs: u64,
    /// Time it worked (for a source, including `reading`).
    pub busy: Duration,
    /// Of `busy`, the time a source spent reading and decoding its split.
    pub reading: Duration,
    /// Time it waited for input (an empty channel).
    pub waiting_input: Duration,
    /// Time it waited to hand on its output (a full channel: backpressure).
    pub waiting_output: Duration,
}

/// Where the time of a run on the pipelined runtime went.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RuntimeMetrics {
    /// Wall time of the run.
    pub wall: Duration,
    /// The share of the wall time in which at most one task was busy: the part of the run
    /// that more workers cannot shorten.
    pub serial_fraction: f64,
    /// The mean number of tasks busy over the wall time: the parallelism the run got. Beside
    /// the serial fraction it says how far more workers could go: at P = 1 the keyed task and
    /// the consumer already run beside the source. A task waiting for a core counts as busy,
    /// so it can exceed the cores.
    pub mean_busy_tasks: f64,
    /// Every task: sources, keyed tasks, the consumer.
    pub tasks: Vec<TaskMetrics>,
}

/// Metrics of a parallel aggregation: per stage, per worker, skew, state and hot keys.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AggregateMetrics {
    /// Workers.
    pub parallelism: usize,
    /// Key groups (`pipeline.max-parallelism`), spread over the workers in contiguous ranges.
    pub key_groups: usize,
    /// Whether it runs a local and a global phase.
    pub two_phase: bool,
    /// Rows pushed into the aggregate.
    pub rows_in: u64,
    /// Changelog rows emitted.
    pub rows_out: u64,
    /// Mini-batches completed.
    pub mini_batches: u64,
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
    /// (group, value) entries of the workers' DISTINCT tables.
    pub distinct_pairs: u64,
    /// Bytes of the workers' DISTINCT tables, from capacity.
    pub distinct_bytes: u64,
    /// The keys that received the most input rows, hottest first.
    pub hot_keys: Vec<(String, u64)>,
    /// Whether the workers keyed a split-distinct PARTIAL's state by the query's keys alone,
    /// its buckets only routing rows (an incremental FINAL on the pipelined runtime, without
    /// checkpoints): one group per key and worker instead of one per (key, bucket).
    pub merges_buckets: bool,
    /// Whether, so keyed on several workers, the local phases folded a key's rows whatever
    /// their buckets and routed each DISTINCT entry by its value's bucket when they flushed,
    /// looking up no route per row (where every call of a bucketed set is DISTINCT over the
    /// bucketed argument, over insert-only input).
    pub routes_at_flush: bool,
    /// Whether a split-distinct FINAL read its PARTIAL through (one PARTIAL worker whose state
    /// merges the buckets: each key's one PARTIAL row is its result), keeping no state.
    pub reads_through: bool,
    /// Whether a split-distinct FINAL read its cold keys through (several PARTIAL workers
    /// whose state merges the buckets, only hot keys spread: each other key's one PARTIAL row
    /// is its result), keeping state for the hot keys alone.
    pub reads_cold_through: bool,
    /// Where a split-distinct PARTIAL names hot keys ([`crate::plan::HotKeys`], from the SQL
    /// planner's sample or the checkpoint restored), how many: only their DISTINCT work was
    /// spread by bucket, every other key staying with its worker in one group. None where every
    /// key is spread (as Flink's split does) and for any other aggregate.
    pub spread_keys: Option<usize>,
    /// The local phase (two-phase only).
    pub local: Option<LocalPhaseMetrics>,
    /// Where the time went, per task, when the last run was on the pipelined runtime.
    pub runtime: Option<RuntimeMetrics>,
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
            self.mini_batches
        )?;
        for s in &self.stages {
            writeln!(
                f,
                "  {:<21} rows in {:>12}  rows out {:>12}  tasks {:>8}  busy {}",
                s.step.name(),
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
        if let Some(n) = self.spread_keys {
            writeln!(
                f,
                "  split spreads the DISTINCT work of {n} hot keys by bucket; every other key stays with its worker, in one group"
            )?;
        }
        if self.merges_buckets {
            writeln!(
                f,
                "  state keyed by the query's keys alone: the buckets only route rows to workers"
            )?;
        }
        if self.routes_at_flush {
            writeln!(
                f,
                "  local phases fold each key's rows together (each input row once for all its group sets, a mini-batch counting input rows) and route each DISTINCT entry by its value's bucket when they flush"
            )?;
        }
        if self.reads_through {
            writeln!(
                f,
                "  read through: each key's one PARTIAL row is its result (one worker whose state merges the buckets), no state of its own"
            )?;
        }
        if self.reads_cold_through {
            writeln!(
                f,
                "  cold keys read through: each key but the hot ones has one PARTIAL row, its result; state for the hot keys alone"
            )?;
        }
        if self.distinct_pairs > 0 {
            writeln!(
                f,
                "  DISTINCT: {} (group, value) pairs in {} bytes ({:.1} bytes a pair)",
                self.distinct_pairs,
                self.distinct_bytes,
                self.distinct_bytes as f64 / self.distinct_pairs as f64
            )?;
        }
        if let Some(l) = &self.local {
            let ratio = l
                .last_ratio
                .map_or("not measured yet".to_string(), |r| format!("{r:.3}"));
            let hot = l
                .last_hot_share
                .map_or("-".to_string(), |r| format!("{r:.3}"));
            writeln!(
                f,
                "  local phase: {} (adaptive {}), reduction ratio {ratio}, hottest key's share {hot}, rows in {}, rows out {}, DISTINCT entries out {}, rows bypassed {}, bypass decisions {}, probes {}",
                if l.bypassed { "bypassed" } else { "active" },
                if l.adaptive { "on" } else { "off" },
                l.rows_in,
                l.rows_out,
                l.entries_out,
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
        if let Some(r) = &self.runtime {
            writeln!(
                f,
                "  pipelined runtime: wall {}, serial fraction {:.1} % (share of the wall time with at most one task busy), {:.2} tasks busy on average",
                ms(r.wall),
                r.serial_fraction * 100.0,
                r.mean_busy_tasks
            )?;
            for t in &r.tasks {
                writeln!(
                    f,
                    "    {:<8} {:<3} rows {:>12}  mini-batches {:>6}  busy {} (reading {})  waiting on input {}  waiting on output {}",
                    t.role.name(),
                    t.index,
                    t.rows,
                    t.epochs,
                    ms(t.busy),
                    ms(t.reading),
                    ms(t.waiting_input),
                    ms(t.waiting_output)
                )?;
            }
        }
        Ok(())
    }
}

impl ParallelAggregate {
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
        let skew_ratio = skew_ratio(&workers);
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
            key_groups: self.key_groups.count(),
            two_phase: self.two_phase,
            rows_in: self.calc.rows_in,
            rows_out: self.aggregate.rows_out,
            mini_batches: self.mini_batches,
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
            distinct_pairs: workers.iter().map(|w| w.operator.distinct_pairs).sum(),
            distinct_bytes: workers.iter().map(|w| w.operator.distinct_bytes).sum(),
            workers,
            skew_ratio,
            hot_keys,
            merges_buckets: self.workers.iter().any(|w| w.agg.merges_buckets()),
            routes_at_flush: self.locals.iter().any(LocalGroupAggregate::routes_at_flush),
            reads_through: false,
            reads_cold_through: false,
            spread_keys: self.plan.hot_keys().map(|h| h.len()),
            local: self.two_phase.then(|| self.adaptive.m.clone()),
            runtime: self.runtime_metrics.clone(),
        })
    }
}
