//! The pipelined runtime: a [`ParallelAggregate`] over input splits, with no barrier.
//!
//! # Tasks and channels
//!
//! - One **source task** per split (a part of the input: row groups of a Parquet file, record
//!   batches of an Arrow file, or batches in memory). It pulls its batches (decoding them, for a
//!   file), runs the Calc stages before the aggregate, evaluates and hashes the keys, and folds
//!   the rows into its own local phase (two-phase), or routes them to the workers (one-phase, or
//!   a bypassed local phase): decoding, Calc and the local phase run on the same thread, on the
//!   data it just decoded. There are at most P **source threads**: with more splits than
//!   workers, the threads take turns on them, the split furthest behind first (`units.rs`).
//! - One **keyed task** per worker: the global phase (or the one-phase keyed aggregate) of the
//!   keys that hash to it.
//! - The **caller's thread** collects the workers' changes and hands them on (the rest of the
//!   pipeline, the sink).
//!
//! Every source task fires its own mini-batches: after `table.exec.mini-batch.size` of its rows
//! (Flink counts the size per task), or when the latency interval passes. The end of its `e`-th
//! mini-batch is *epoch* `e`: each worker gets the source's part of the epoch (its routed rows
//! and flushed accumulator rows). A worker aligns the epochs: it takes epoch `e` from every
//! source still running, in source order, and merges it; its own mini-batch fires, as a Flink
//! keyed aggregate's bundle does, once the input records it took (rows and accumulator rows)
//! reach the mini-batch size, at an epoch the latency trigger ended, before a checkpoint and at
//! the end of the input, always at the end of an epoch. It hands the caller one output per epoch
//! (empty where it did not fire), and the caller takes each epoch from the workers in worker
//! order. Epochs travel in runs (an
//! `Aligner` takes them apart): a source sends each worker, in one message, the parts of the
//! epochs that some 65,536 of its rows ended (13 mini-batches of 5,000; at most 16 epochs a
//! message, and at once after an epoch the latency trigger ended), and a worker sends the
//! caller the changes of the epochs it fired before it would wait, so a task wakes once per run
//! rather than once per mini-batch or input batch. Channels are bounded ([`CHANNEL_DEPTH`]
//! messages): a slow worker holds its sources back (backpressure), and memory stays bounded. No
//! step waits for all workers except the alignment of an epoch at each worker, so sources run
//! ahead of the keyed tasks by up to the channels' depth.
//!
//! # Determinism
//!
//! What a source sends in each epoch depends only on its split and the row counts (the latency
//! trigger aside, which reads the clock), and each worker merges epochs in source order, so for a
//! given input, splits, options and P the changelog is the same on every run. The rows of one
//! mini-batch are those of one epoch, which differ from the ordered runtime's (which cuts the
//! input stream at every `size` × P rows): the changelog differs from it, the final result does
//! not.
//!
//! # Input order
//!
//! With [`InputOrder::Any`] splits are read concurrently, so rows of one key from two splits
//! reach its worker in epoch order, not input order. That is exact for insert-only input (every
//! accumulator is order-insensitive within a key). A changelog input needs each key's rows in
//! input order: it runs with [`InputOrder::Chunks`], where the input is cut into chunks of a fixed
//! number of rows dealt to the splits in turn (split `s` of `n` reads chunks `s`, `s + n`, …),
//! each chunk is one epoch of its source (cut by source rows, before any filter), and every
//! worker applies the epochs source by source within a round: chunk after chunk, in
//! input order. The sources still decode, filter and fold their chunks in parallel.
//!
//! # Where the time goes
//!
//! Each task measures its busy time, and the time it waited on input (an empty channel) and on
//! output (a full one); an [`crate::runtime::Activity`] counts how many threads are busy at each
//! moment (one that waits or has ended is not), which gives the share of the run in which at
//! most one was (the serial fraction).

use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::time::{Duration, Instant};

use arrow::array::RecordBatch;

use crate::changelog::ChangeBatch;
use crate::error::{Error, Result};
use crate::operator::ParallelAggregate;
use crate::operator::keyed::KeyHashes;
use crate::operator::metrics::{LocalPhaseMetrics, RuntimeMetrics, TaskMetrics, TaskRole};
use crate::operator::mini_batch::Trigger;
use crate::plan::BucketFill;
use crate::runtime::Activity;

mod aligner;
mod keyed_task;
mod tasks;
mod units;

use aligner::Aligner;
use keyed_task::{KeyedRun, WorkerOutput, keyed_task};
use tasks::{EpochPart, Source, SourceReport, Stop};
use units::{SourceReports, Unit, Units, source_thread};

/// Messages (runs of epochs) a channel holds before its sender waits (backpressure). Source
/// threads that the OS runs by turns on one core run many epochs apart; some 64 epochs of slack
/// let them without stalling (BENCHMARKS.md, "CHANNEL_DEPTH", measured when a message held one
/// epoch), and a source's message holds up to 16 epochs. Memory: at most this many messages per
/// source-worker pair, each a worker's share of the mini-batches some 65,536 source rows ended.
pub const CHANNEL_DEPTH: usize = 8;

/// One split of the input: change batches in order.
pub type Split = Box<dyn Iterator<Item = Result<ChangeBatch>> + Send>;

/// How the splits cover the input, and so in which order a key's rows may be applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputOrder {
    /// Any partition of the rows (insert-only input): a source's mini-batch ends after
    /// `table.exec.mini-batch.size` of its rows (or the latency), and each worker merges one
    /// mini-batch of every source at a time (firing its own mini-batch by its input records).
    Any,
    /// Chunks of this many rows dealt to the splits in turn (split `s` of `n` holds chunks `s`,
    /// `s + n`, …, the input's last chunk possibly shorter): each chunk is one mini-batch of its
    /// source, and each worker applies them in chunk order, so that every key's rows are
    /// applied in input order (a changelog input). No latency trigger: chunks end by rows.
    Chunks(usize),
}

/// The fewest rows in a chunk of [`InputOrder::Chunks`] at P > 1: chunks that span Parquet
/// pages let each split skip the others' pages whole (a parquet-rs page holds up to 20 000
/// rows by default).
pub const MIN_CHUNK_ROWS: usize = 1 << 16;

/// The chunk of a changelog input at P workers with mini-batches of `size` rows per worker: a
/// mini-batch of the whole input, `size` x P rows (the ordered runtime's), at least
/// [`MIN_CHUNK_ROWS`] at P > 1.
pub fn chunk_rows(size: usize, p: usize) -> usize {
    let rows = size.max(1).saturating_mul(p.max(1));
    if p > 1 {
        rows.max(MIN_CHUNK_ROWS)
    } else {
        rows
    }
}

/// What the pipelined runtime hands the caller, in order: changes, and with checkpoints the
/// aggregate's state at the end of a round of chunks.
#[derive(Debug)]
pub enum Delivery {
    /// Changes, never none: those the workers fired at the end of one epoch, in worker order
    /// (each batch one firing of one worker), or what the ordered runtime left pending.
    Changes(Vec<ChangeBatch>),
    /// A consistent state: every change fired before it has been delivered, none after; `rows`
    /// input rows (of this run) are applied, exactly the first `rows` of the splits' chunks;
    /// `state` is [`ParallelAggregate::snapshot`]'s, taken at that point.
    Checkpoint {
        /// Input rows applied (a prefix of this run's input).
        rows: u64,
        /// The snapshot batches, worker by worker.
        state: Vec<RecordBatch>,
    },
}

/// The stages before the aggregate, run by each source task on each batch it reads: the
/// batches that come out, in order (none when a filter drops every row; several from an
/// Expand).
pub type PreStages<'a> = &'a (dyn Fn(ChangeBatch) -> Result<Vec<ChangeBatch>> + Sync);

/// What a keyed task does to the changes of each of its firings before they go to the caller.
/// Split-distinct's incremental FINAL folds each firing of the PARTIAL into delta rows this way,
/// on the PARTIAL's workers, as Flink's `IncrementalGroupAggregate` runs in the PARTIAL's tasks.
pub trait FoldFirings: Send {
    /// The batches that go instead of one firing's changes, in order (none: nothing goes).
    ///
    /// # Errors
    /// A firing the fold cannot take.
    fn fold_firing(&mut self, firing: ChangeBatch) -> Result<Vec<ChangeBatch>>;

    /// Whether the fold reads its firings' key hashes ([`FoldFirings::fold_hashed_firing`]): its
    /// keyed task then hands them on (false by default).
    fn takes_key_hashes(&self) -> bool {
        false
    }

    /// [`FoldFirings::fold_firing`] given each row's key hash, as the firing worker's state
    /// hashed it (over the firing's first `hashes.keys` columns). By default the hashes are
    /// left unread.
    ///
    /// # Errors
    /// As [`FoldFirings::fold_firing`].
    fn fold_hashed_firing(
        &mut self,
        firing: ChangeBatch,
        hashes: KeyHashes,
    ) -> Result<Vec<ChangeBatch>> {
        let _ = hashes;
        self.fold_firing(firing)
    }

    /// What the fold holds back, handed on at the end of an epoch the latency trigger ended,
    /// before a checkpoint, and at the end of the input (none by default).
    ///
    /// # Errors
    /// As [`FoldFirings::fold_firing`].
    fn flush(&mut self) -> Result<Vec<ChangeBatch>> {
        Ok(vec![])
    }
}

/// A keyed task's [`FoldFirings`].
pub type FiringFold = Box<dyn FoldFirings>;

/// Makes each keyed task its [`FiringFold`].
pub type PostFiring<'a> = &'a (dyn Fn() -> Result<FiringFold> + Sync);

impl ParallelAggregate {
    /// Runs the aggregate over `splits` of its input on the pipelined runtime (see the module
    /// docs): one source task per split (on at most P threads, which take turns on the splits
    /// where they are more), each running `pre` (the stages before the
    /// aggregate) and the local phase on what it reads, and one keyed task per worker; `emit`
    /// gets the changes on the caller's thread, epoch by epoch, in worker order. Fires
    /// everything: at the end nothing is pending.
    ///
    /// `order` says how the splits cover the input ([`InputOrder`]): a changelog input needs
    /// [`InputOrder::Chunks`].
    ///
    /// # Errors
    /// An input with row kinds in splits of [`InputOrder::Any`], mini-batch off, the first
    /// error of a split, of Calc or of the keyed tasks, and `emit`'s. Changes fired before an
    /// error have been handed to `emit`.
    pub fn run_splits(
        &mut self,
        splits: Vec<Split>,
        order: InputOrder,
        pre: PreStages<'_>,
        emit: &mut dyn FnMut(ChangeBatch) -> Result<()>,
    ) -> Result<()> {
        self.run_splits_checkpointed(splits, order, None, pre, None, &mut |d| match d {
            Delivery::Changes(batches) => batches.into_iter().try_for_each(&mut *emit),
            Delivery::Checkpoint { .. } => Ok(()),
        })
    }

    /// As [`ParallelAggregate::run_splits`], and with `checkpoint_every` (chunks only) a
    /// [`Delivery::Checkpoint`] after each round of chunks (one chunk of every split) that takes
    /// the input rows applied past a multiple of it: the workers snapshot their state at the
    /// end of that round, as Flink's tasks do at an aligned barrier, while the sources read on.
    /// With `post`, each keyed task passes the changes of each of its firings through its own
    /// [`FiringFold`] before they are delivered.
    ///
    /// # Errors
    /// As [`ParallelAggregate::run_splits`], and checkpoints over [`InputOrder::Any`] (whose
    /// applied rows are no prefix of the input).
    pub fn run_splits_checkpointed(
        &mut self,
        splits: Vec<Split>,
        order: InputOrder,
        checkpoint_every: Option<u64>,
        pre: PreStages<'_>,
        post: Option<PostFiring<'_>>,
        deliver: &mut dyn FnMut(Delivery) -> Result<()>,
    ) -> Result<()> {
        if checkpoint_every.is_some() && order == InputOrder::Any {
            return Err(Error::invalid_input(
                "checkpoints need chunks in turn (InputOrder::Chunks): the rows applied at a checkpoint must be a prefix of the input",
            ));
        }
        if checkpoint_every == Some(0) {
            return Err(Error::invalid_input(
                "the checkpoint interval must be at least 1 row",
            ));
        }
        if self.plan.changelog && order == InputOrder::Any {
            return Err(Error::invalid_input(
                "a changelog input needs each key's rows in input order: run it over splits of InputOrder::Chunks",
            ));
        }
        if order == InputOrder::Chunks(0) {
            return Err(Error::invalid_input("a chunk needs at least one row"));
        }
        if !self.config.mini_batch_enabled {
            return Err(Error::internal(
                "the pipelined runtime fires mini-batches: mini-batch off runs on the ordered runtime",
            ));
        }
        // Whatever the ordered runtime left pending fires first.
        let pending = self.finish()?;
        if !pending.is_empty() {
            deliver(Delivery::Changes(pending))?;
        }
        let p = self.workers.len();
        let sources = splits.len();
        // P threads take turns on the splits (`units.rs`), each split with a local phase.
        let threads = sources.min(p);
        if self.two_phase {
            self.add_locals(sources)?;
        }
        let activity = Activity::new(threads + p + 1);
        let stop = Stop::new();
        let (size, latency, chunk) = match order {
            InputOrder::Any => (
                usize::try_from(self.config.mini_batch_size).unwrap_or(usize::MAX),
                self.config.mini_batch_allow_latency,
                None,
            ),
            InputOrder::Chunks(rows) => (usize::MAX, Duration::ZERO, Some(rows)),
        };
        let (plan, clock) = (&*self.plan, &*self.clock);
        let two_phase = self.two_phase;
        // Channels: source s → worker w, and worker w → the caller.
        let mut to_workers: Vec<Vec<Receiver<Vec<EpochPart>>>> = (0..p).map(|_| vec![]).collect();
        let mut from_sources: Vec<Vec<SyncSender<Vec<EpochPart>>>> = vec![];
        for _ in 0..sources {
            let mut senders = Vec::with_capacity(p);
            for rx in to_workers.iter_mut() {
                let (tx, r) = sync_channel(CHANNEL_DEPTH);
                senders.push(tx);
                rx.push(r);
            }
            from_sources.push(senders);
        }
        let mut outputs = Vec::with_capacity(p);
        let mut output_senders = Vec::with_capacity(p);
        for _ in 0..p {
            let (tx, rx) = sync_channel(CHANNEL_DEPTH);
            output_senders.push(tx);
            outputs.push(rx);
        }
        let adaptive = self.adaptive.clone();
        let one_worker_hashes_keys = p == 1 && self.workers[0].agg.hashes_keys_itself();
        // Local phases routing at the flush read no bucket column: the run leaves them unread
        // (`Pipeline::run_splits`, on the same condition), and the sources compute them for
        // the rows that go around the local phases.
        let bucket_fill = if two_phase && self.routes_at_flush() {
            BucketFill::try_new(plan)
        } else {
            None
        };
        let mut locals = self.locals.iter_mut();
        let workers = &mut self.workers;
        let key_groups = &self.key_groups;
        let mut units = Vec::with_capacity(sources);
        for (split, senders) in splits.into_iter().zip(from_sources) {
            let local = if two_phase { locals.next() } else { None };
            let source = Source {
                plan,
                local,
                bucket_fill: bucket_fill.clone(),
                adaptive: adaptive.clone(),
                trigger: Trigger::new(size, latency),
                clock,
                senders,
                gone: vec![false; p],
                pending: (0..p).map(|_| vec![]).collect(),
                unsent_rows: 0,
                key_groups,
                one_worker_hashes_keys,
                activity: &activity,
                stop: &stop,
                cut_short: false,
                first_key: None,
                routed: (0..p).map(|_| vec![]).collect(),
                chunk,
                in_chunk: 0,
                epoch_source_rows: 0,
                epoch_folded: 0,
                epoch_bypassed: 0,
                retired: Default::default(),
                report: SourceReport::default(),
            };
            units.push(Unit { source, split });
        }
        let units = Units::new(units);
        let (collected, source_reports, keyed_reports) = std::thread::scope(|scope| {
            let activity = &activity;
            let stop = &stop;
            let units = &units;
            let mut source_handles = Vec::with_capacity(threads);
            for index in 0..threads {
                let handle = std::thread::Builder::new()
                    .name(format!("tally-source-{index}"))
                    .spawn_scoped(scope, move || source_thread(units, pre, activity));
                if handle.is_err() {
                    activity.change(-1);
                }
                source_handles.push(handle);
            }
            if source_handles.iter().all(std::io::Result::is_err) {
                // No thread reads the splits: their channels close, and the workers stop.
                units.abandon();
            }
            let run = KeyedRun {
                per_source: chunk.is_some(),
                checkpoint_every,
                post,
                activity,
                stop,
            };
            let mut keyed_handles = Vec::with_capacity(p);
            for (w, ((worker, receivers), out)) in workers
                .iter_mut()
                .zip(to_workers)
                .zip(output_senders)
                .enumerate()
            {
                let handle = std::thread::Builder::new()
                    .name(format!("tally-worker-{w}"))
                    .spawn_scoped(scope, move || keyed_task(worker, receivers, out, &run));
                keyed_handles.push(handle);
            }
            let collected = collect(outputs, deliver, activity, stop);
            let sources = split_reports(sources, source_handles);
            let keyed: Vec<Result<TaskMetrics>> =
                keyed_handles.into_iter().map(join_task).collect();
            (collected, sources, keyed)
        });
        let crate::runtime::ActivityReading {
            wall,
            serial_fraction,
            mean_busy_tasks,
        } = activity.reading();
        // Errors in data-flow order: a source's first, then a worker's, then the consumer's.
        let mut tasks = vec![];
        let mut first_error = None;
        let mut locals_metrics = vec![];
        for (i, r) in source_reports.into_iter().enumerate() {
            match r {
                Ok(s) => {
                    self.calc.busy += s.calc_busy;
                    self.calc.rows_in += s.rows;
                    self.calc.rows_out += s.rows;
                    self.calc.batches += s.batches;
                    self.local.busy += s.local_busy;
                    self.local.rows_in += s.folded;
                    self.local.rows_out += s.flushed;
                    self.local.batches += s.task.epochs;
                    self.exchange.busy += s.exchange_busy;
                    self.exchange.rows_in += s.bypassed + s.flushed;
                    self.exchange.rows_out += s.bypassed + s.flushed;
                    self.exchange.batches += s.task.epochs * p as u64;
                    let mut task = s.task;
                    task.role = TaskRole::Source;
                    task.index = i;
                    tasks.push(task);
                    locals_metrics.push(s.adaptive);
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        let mut epochs = 0;
        for (w, r) in keyed_reports.into_iter().enumerate() {
            match r {
                Ok(mut task) => {
                    epochs = epochs.max(task.epochs);
                    task.role = TaskRole::Keyed;
                    task.index = w;
                    tasks.push(task);
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        match collected {
            Ok((mut task, rows_out)) => {
                self.aggregate.rows_out += rows_out;
                task.role = TaskRole::Consumer;
                tasks.push(task);
            }
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
        self.mini_batches += epochs;
        if two_phase && !locals_metrics.is_empty() {
            self.adaptive.m = merge_local_metrics(&self.adaptive.m, &locals_metrics);
        }
        self.runtime_metrics = Some(RuntimeMetrics {
            wall,
            serial_fraction,
            mean_busy_tasks,
            tasks,
        });
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// Each split's report (or error), in split order, from the source threads that ended them (a
/// thread that panicked answers for the first split it leaves without one).
fn split_reports(
    splits: usize,
    threads: Vec<std::io::Result<std::thread::ScopedJoinHandle<'_, Result<SourceReports>>>>,
) -> Vec<Result<SourceReport>> {
    let mut reports: Vec<Option<Result<SourceReport>>> = (0..splits).map(|_| None).collect();
    let mut failed = vec![];
    for h in threads {
        match join_task(h) {
            Ok(ended) => {
                for (i, r) in ended {
                    reports[i] = Some(r);
                }
            }
            Err(e) => failed.push(e),
        }
    }
    let mut failed = failed.into_iter();
    reports
        .into_iter()
        .map(|r| {
            r.unwrap_or_else(|| {
                Err(failed
                    .next()
                    .unwrap_or_else(|| Error::internal("a split that no source thread ended")))
            })
        })
        .collect()
}

/// The result of a task, or why there is none.
fn join_task<T>(h: std::io::Result<std::thread::ScopedJoinHandle<'_, Result<T>>>) -> Result<T> {
    h.map_err(|e| Error::internal(format!("cannot start a runtime thread: {e}")))?
        .join()
        .map_err(|_| Error::internal("a runtime thread panicked"))?
}

/// The caller's part: takes each epoch's changes from the workers in worker order and hands
/// them to `emit`. Returns its task metrics and the rows the workers fired.
fn collect(
    outputs: Vec<Receiver<Vec<WorkerOutput>>>,
    deliver: &mut dyn FnMut(Delivery) -> Result<()>,
    activity: &Activity,
    stop: &Stop,
) -> Result<(TaskMetrics, u64)> {
    let started = Instant::now();
    let mut task = TaskMetrics::default();
    let mut outputs = Aligner::new(outputs);
    let mut rows_out = 0u64;
    let result = (|| -> Result<()> {
        while let Some(round) = outputs.round(activity, &mut task) {
            let mut checkpoint: Option<(u64, Vec<RecordBatch>)> = None;
            let workers = round.len();
            let mut states = 0;
            let mut changes = vec![];
            for out in round {
                rows_out += out.fired_rows;
                for b in out.changes {
                    task.rows += b.num_rows() as u64;
                    changes.push(b);
                }
                if let Some((rows, state)) = out.state {
                    states += 1;
                    let (at, all) = checkpoint.get_or_insert_with(|| (rows, vec![]));
                    if *at != rows {
                        return Err(Error::internal(format!(
                            "workers disagree on a checkpoint's position: {at} and {rows} rows"
                        )));
                    }
                    all.extend(state);
                }
            }
            if !changes.is_empty() {
                deliver(Delivery::Changes(changes))?;
            }
            if let Some((rows, state)) = checkpoint {
                if states != workers {
                    return Err(Error::internal(
                        "a checkpoint without the state of every worker",
                    ));
                }
                deliver(Delivery::Checkpoint { rows, state })?;
            }
            task.epochs += 1;
        }
        Ok(())
    })();
    if result.is_err() {
        stop.now();
    }
    // Dropping the receivers here stops the workers, whose senders then stop the sources.
    drop(outputs);
    task.busy = started.elapsed().saturating_sub(task.waiting_input);
    result.map(|()| (task, rows_out))
}

/// The local phases' metrics, summed over the source tasks (each decides for itself); the
/// ratio and hot share shown are the first source's.
fn merge_local_metrics(
    before: &LocalPhaseMetrics,
    each: &[LocalPhaseMetrics],
) -> LocalPhaseMetrics {
    let mut m = before.clone();
    for l in each {
        m.rows_in += l.rows_in.saturating_sub(before.rows_in);
        m.rows_out += l.rows_out.saturating_sub(before.rows_out);
        m.entries_out += l.entries_out.saturating_sub(before.entries_out);
        m.rows_bypassed += l.rows_bypassed.saturating_sub(before.rows_bypassed);
        m.bypass_decisions += l.bypass_decisions.saturating_sub(before.bypass_decisions);
        m.probes += l.probes.saturating_sub(before.probes);
    }
    m.bypassed = each.iter().all(|l| l.bypassed);
    if let Some(first) = each.first() {
        m.last_ratio = first.last_ratio.or(m.last_ratio);
        m.last_hot_share = first.last_hot_share.or(m.last_hot_share);
    }
    m
}
