//! The source task of the pipelined runtime, one per split (read, Calc, local phase, and the
//! end of each epoch), and what it sends the workers; an Expand's group sets are fed in
//! `tasks/sets.rs`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::SyncSender;
use std::time::{Duration, Instant};

use super::{PreStages, Split};

mod sets;

use crate::changelog::ChangeBatch;
use crate::error::Result;
use crate::operator::LocalGroupAggregate;
use crate::operator::adaptive::Adaptive;
use crate::operator::exchange::{Hashed, Routed, Rows, route};
use crate::operator::key_groups::KeyGroups;
use crate::operator::keyed::{FirstKeyHashes, hash_keys, hash_keys_reusing};
use crate::operator::local::{FlushedPart, RetiredFlushes};
use crate::operator::metrics::{LocalPhaseMetrics, TaskMetrics};
use crate::operator::mini_batch::Trigger;
use crate::plan::{AggregatePlan, BucketFill};
use crate::runtime::Activity;

/// The source rows a source reads before it sends the workers the epochs those rows ended: one
/// message per worker per this many rows, however small the input batches are (a Parquet
/// reader's batches end at its dictionary pages, some 8,000 rows), so that a worker wakes once
/// per run of mini-batches. An epoch the latency trigger ended goes at once, with every epoch
/// held before it: `table.exec.mini-batch.allow-latency` still bounds how long a mini-batch's
/// rows wait (as the trigger is read, at each input batch).
pub(super) const SEND_ROWS: u64 = 65_536;

/// The most epochs a source holds before it sends them (small mini-batches: a message of at
/// most this many).
pub(super) const MAX_HELD_EPOCHS: usize = 16;

/// Whether a source sends the epochs it holds: `held` of them, over `unsent_rows` source rows
/// read since the last send, `latency` where the latency trigger ended one of them.
fn send_due(unsent_rows: u64, held: usize, latency: bool) -> bool {
    latency || unsent_rows >= SEND_ROWS || held >= MAX_HELD_EPOCHS
}

/// What a source task sends one worker for one epoch.
pub(super) struct EpochPart {
    /// Raw rows (one-phase, or a bypassed local phase).
    pub(super) rows: Vec<Routed>,
    /// Accumulator rows of the local phase: the worker's range of the epoch's flush, which the
    /// workers share.
    pub(super) accumulators: Option<FlushedPart>,
    /// The split's rows the epoch covers (before any filter): with chunks, the input position
    /// advances by them.
    pub(super) source_rows: u64,
    /// Whether the latency trigger ended the epoch (Flink's mini-batch marker, which fires the
    /// global phase too).
    pub(super) by_latency: bool,
}

/// What a source task did.
#[derive(Debug, Default)]
pub(super) struct SourceReport {
    pub(super) task: TaskMetrics,
    pub(super) calc_busy: Duration,
    pub(super) local_busy: Duration,
    pub(super) exchange_busy: Duration,
    pub(super) batches: u64,
    pub(super) rows: u64,
    pub(super) folded: u64,
    pub(super) flushed: u64,
    pub(super) bypassed: u64,
    pub(super) adaptive: LocalPhaseMetrics,
}

/// When the sources stop reading: at once (a task downstream failed, or a split of any rows
/// did), or once each has ended a number of epochs (a split of chunks failed in its epoch `k`:
/// the others read on to the end of their epoch `k - 1`, so that the rounds before the failed
/// chunk are whole, and the last checkpoint is at the same place on every run).
#[derive(Debug)]
pub(super) struct Stop(AtomicU64);

impl Stop {
    pub(super) fn new() -> Self {
        Self(AtomicU64::new(u64::MAX))
    }

    /// Stops every source at once.
    pub(super) fn now(&self) {
        self.0.store(0, Ordering::Relaxed);
    }

    /// Stops every source once it has ended `epochs` epochs (or earlier, if asked so before).
    pub(super) fn after(&self, epochs: u64) {
        self.0.fetch_min(epochs, Ordering::Relaxed);
    }

    /// Whether a source that has ended `epochs` epochs stops.
    pub(super) fn reached(&self, epochs: u64) -> bool {
        epochs >= self.0.load(Ordering::Relaxed)
    }

    /// Whether every source stopped at once.
    pub(super) fn is_now(&self) -> bool {
        self.0.load(Ordering::Relaxed) == 0
    }
}

/// One source task: its split, its local phase and the channels to the workers.
pub(super) struct Source<'a> {
    pub(super) plan: &'a AggregatePlan,
    pub(super) local: Option<&'a mut LocalGroupAggregate>,
    /// Where the local phase routes at the flush: how the rows that go around it get their
    /// bucket columns, which the run leaves unread ([`BucketFill`]).
    pub(super) bucket_fill: Option<BucketFill>,
    pub(super) adaptive: Adaptive,
    pub(super) trigger: Trigger,
    pub(super) clock: &'a dyn crate::clock::Clock,
    pub(super) senders: Vec<SyncSender<Vec<EpochPart>>>,
    /// Per worker: its channel closed (the worker ended), so nothing more goes to it.
    pub(super) gone: Vec<bool>,
    /// Each worker's parts of the epochs ended since the last send: sent together once the
    /// source has read [`SEND_ROWS`] rows since, at an epoch the latency trigger ended, or once
    /// they are [`MAX_HELD_EPOCHS`] ([`Source::send_if_due`]), and at the end of the split.
    pub(super) pending: Vec<Vec<EpochPart>>,
    /// Source rows read since the last send.
    pub(super) unsent_rows: u64,
    pub(super) key_groups: &'a KeyGroups,
    /// Whether there is one worker, whose keyed state hashes the keys it keeps itself: rows
    /// that go to it (around the local phase, or with none) need no key hashes.
    pub(super) one_worker_hashes_keys: bool,
    pub(super) activity: &'a Activity,
    pub(super) stop: &'a Stop,
    /// Whether the source stopped before the end of its split ([`Stop`]).
    pub(super) cut_short: bool,
    /// The first key column last hashed and its hashes (an Expand's group sets share it).
    pub(super) first_key: FirstKeyHashes,
    /// Rows routed to each worker in the current epoch.
    pub(super) routed: Vec<Vec<Routed>>,
    /// With [`InputOrder::Chunks`], the chunk's rows: its epochs end by source rows.
    pub(super) chunk: Option<usize>,
    /// With chunks, the source rows read of the current chunk.
    pub(super) in_chunk: usize,
    /// Source rows of the current epoch (counted with chunks).
    pub(super) epoch_source_rows: u64,
    pub(super) epoch_folded: u64,
    pub(super) epoch_bypassed: u64,
    /// The flushes routed, until the workers let go of them: the source thread's own, which it
    /// swaps in for each turn (`units.rs`), so that they are freed on the thread that made them
    /// whichever split they came from.
    pub(super) retired: RetiredFlushes,
    pub(super) report: SourceReport,
}

impl Source<'_> {
    /// Reads the split until the source sends the workers a run of epochs (`false`: the split
    /// goes on, another turn reads on from there) or the split ends (`true`: its last epoch
    /// ended and went out). Its busy time is counted.
    pub(super) fn turn(&mut self, split: &mut Split, pre: PreStages<'_>) -> Result<bool> {
        let (started, waited) = (Instant::now(), self.report.task.waiting_output);
        let result = self.read_turn(split, pre);
        let waited = self.report.task.waiting_output.saturating_sub(waited);
        self.report.task.busy += started.elapsed().saturating_sub(waited);
        result
    }

    /// Ends the source after its last turn (`result`: `Ok` where the split ended, or the
    /// turn's error): tells the workers its epochs are all sent, or on an error stops the
    /// other sources ([`Stop`]). Returns its report, or the error.
    pub(super) fn finish(mut self, result: Result<()>) -> Result<SourceReport> {
        match result {
            Ok(()) => self.send_end(),
            Err(_) if self.chunk.is_some() => {
                // The chunks ended before the failed one are whole: they go out, and the other
                // sources read on to the end of the same epochs.
                self.send_pending();
                self.stop.after(self.report.task.epochs);
            }
            Err(_) => self.stop.now(),
        }
        self.report.adaptive = self.adaptive.m.clone();
        result.map(|()| self.report)
    }

    fn read_turn(&mut self, split: &mut Split, pre: PreStages<'_>) -> Result<bool> {
        while let Some(batch) = self.next_batch(split)? {
            let n = batch.num_rows();
            match self.chunk {
                Some(chunk) => self.push_chunked(batch, chunk, pre)?,
                None => self.push_all(pre(batch)?)?,
            }
            if self.send_if_due(n) {
                return Ok(false);
            }
        }
        // The end of the split: its last epoch ends (with chunks, even one whose rows a filter
        // dropped: the workers count the epochs to keep chunk order).
        let open = match self.chunk {
            Some(_) => self.in_chunk > 0,
            None => self.epoch_folded + self.epoch_bypassed > 0,
        };
        if open && !self.cut_short {
            self.end_epoch(false)?;
        }
        self.send_pending();
        Ok(true)
    }

    /// Takes one batch of a split of chunks of `chunk` source rows, ending an epoch at the end
    /// of each chunk.
    fn push_chunked(&mut self, batch: ChangeBatch, chunk: usize, pre: PreStages<'_>) -> Result<()> {
        let n = batch.num_rows();
        let mut off = 0;
        while off < n {
            let take = (chunk - self.in_chunk).min(n - off);
            let piece = if take == n {
                batch.clone()
            } else {
                batch.slice(off, take)
            };
            off += take;
            self.in_chunk += take;
            self.epoch_source_rows += take as u64;
            self.push_all(pre(piece)?)?;
            if self.in_chunk == chunk {
                self.end_epoch(false)?;
                self.in_chunk = 0;
            }
        }
        Ok(())
    }

    /// The split's next batch (its reading time and rows counted); `None` at its end, or when
    /// the sources stop ([`Stop`]: then the source is cut short).
    fn next_batch(&mut self, split: &mut Split) -> Result<Option<ChangeBatch>> {
        if self.stop.reached(self.report.task.epochs) {
            self.cut_short = true;
            return Ok(None);
        }
        let start = Instant::now();
        let Some(batch) = split.next().transpose()? else {
            return Ok(None);
        };
        self.report.task.reading += start.elapsed();
        self.report.task.rows += batch.num_rows() as u64;
        self.report.batches += 1;
        Ok(Some(batch))
    }

    /// Tells every worker that the split's epochs are all sent (an empty run, see
    /// [`Aligner`](super::Aligner)), unless the source was cut short or the run stopped.
    fn send_end(&mut self) {
        if self.cut_short || self.stop.is_now() {
            return;
        }
        for tx in &self.senders {
            let (_, waited) = self.activity.send(tx, vec![]);
            self.report.task.waiting_output += waited;
        }
    }

    /// After an input batch of `rows` source rows: sends the epochs held ([`Source::pending`])
    /// where one of them the latency trigger ended, where the source has read [`SEND_ROWS`]
    /// rows since the last send, or where they are [`MAX_HELD_EPOCHS`]. Which epochs a message
    /// holds changes only when the workers wake, not what they merge, nor in what order.
    /// Returns whether a send was due (a turn ends there, even where no epoch had ended).
    fn send_if_due(&mut self, rows: usize) -> bool {
        self.unsent_rows += rows as u64;
        // Every worker holds a part of every epoch: the first worker's tell them all.
        let held = self.pending.first().map_or(&[][..], Vec::as_slice);
        let latency = held.iter().any(|e| e.by_latency);
        let due = send_due(self.unsent_rows, held.len(), latency);
        if due {
            self.send_pending();
        }
        due
    }

    /// Sends each worker the parts of the epochs ended since the last send (none when none
    /// ended). A worker that has ended gets nothing more, and the others still get theirs: it
    /// ended because the rounds did (a split failed: the others need the epochs before that
    /// split's last, [`Stop`]) or because a task failed, which stops the sources itself.
    fn send_pending(&mut self) {
        self.unsent_rows = 0;
        for w in 0..self.senders.len() {
            // What a worker that has ended would get is dropped, not held.
            let run = std::mem::take(&mut self.pending[w]);
            if run.is_empty() || self.gone[w] || self.stop.is_now() {
                continue;
            }
            let (sent, waited) = self.activity.send(&self.senders[w], run);
            self.report.task.waiting_output += waited;
            self.gone[w] = sent.is_err();
        }
    }

    fn push(&mut self, batch: ChangeBatch) -> Result<()> {
        let rows = self.evaluate(&batch)?;
        self.feed(rows)
    }

    /// Evaluates one batch (Calc) and hashes its keys where the local phase does not; its rows
    /// counted as the Calc's.
    fn evaluate(&mut self, batch: &ChangeBatch) -> Result<Hashed> {
        let hashed = self.evaluate_uncounted(batch)?;
        self.report.rows += hashed.num_rows() as u64;
        Ok(hashed)
    }

    /// [`Source::evaluate`], the rows not counted.
    fn evaluate_uncounted(&mut self, batch: &ChangeBatch) -> Result<Hashed> {
        self.plan.check_input(batch)?;
        let start = Instant::now();
        // A split's set batch: its set, for the Calc and for the bucket columns.
        let set = self.plan.calc.set_of(&batch.data)?;
        let mut cb = self.plan.calc.evaluate_in_set(batch, set.as_deref())?;
        // The query keys' hashes where cold keys were looked for: the rows' hashes go on
        // from them.
        let mut prefix = self.plan.leave_cold(&mut cb)?;
        let n = cb.num_rows;
        let mut hashes = vec![];
        // A local phase whose key table hashes the keys it keeps takes the rows unhashed (they
        // are hashed in `take` if the local phase is bypassed meanwhile and several workers
        // need them routed), and so does one worker whose keyed state hashes its keys, when
        // the rows go to it.
        let unhashed = match &self.local {
            Some(l) if !self.adaptive.m.bypassed => l.hashes_keys_itself(),
            _ => self.one_worker_hashes_keys,
        };
        if !unhashed {
            // Hashed rows go around the local phase: their bucket columns are read.
            if let Some(fill) = &self.bucket_fill {
                prefix = fill.fill(set.as_deref(), &mut cb)?;
            }
            if let Some(prefix) = &prefix {
                // The bucket columns follow the query keys, whose hashes are known.
                self.plan.hash_after_query_keys(prefix, &cb, &mut hashes)?;
            } else if batch
                .data
                .schema()
                .index_of(crate::plan::SET_ID_COLUMN)
                .is_ok()
            {
                // A group set's batch of an Expand: the sets share their first key column.
                hash_keys_reusing(&cb.keys, n, &mut self.first_key, &mut hashes)?;
            } else {
                hash_keys(&cb.keys, n, &mut hashes)?;
            }
        }
        let hashed = Hashed {
            cb,
            hashes: hashes.into(),
        };
        self.report.calc_busy += start.elapsed();
        Ok(hashed)
    }

    /// Ends the mini-batch on the latency trigger, if it is due and the mini-batch holds rows.
    fn end_epoch_if_late(&mut self) -> Result<()> {
        if self.trigger.has_latency()
            && self.trigger.latency_due(self.clock.now_ms())
            && self.epoch_folded + self.epoch_bypassed > 0
        {
            self.trigger.reset();
            self.end_epoch(true)?;
        }
        Ok(())
    }

    /// Folds (or routes) evaluated rows, ending the mini-batch at its size or latency.
    fn feed(&mut self, hashed: Hashed) -> Result<()> {
        let n = hashed.num_rows();
        self.end_epoch_if_late()?;
        for (off, len, ends) in self.trigger.cut(n) {
            let piece = if len == n {
                hashed.clone()
            } else {
                hashed.slice(off, len)
            };
            self.take(piece)?;
            if ends {
                self.end_epoch(false)?;
            }
        }
        Ok(())
    }

    /// Folds `rows` into the local phase, or routes them to the workers.
    fn take(&mut self, rows: Hashed) -> Result<()> {
        let n = rows.num_rows() as u64;
        let start = Instant::now();
        match &mut self.local {
            Some(local) if !self.adaptive.m.bypassed => {
                local.push_evaluated(&rows.cb, &rows.hashes)?;
                self.report.local_busy += start.elapsed();
                self.epoch_folded += n;
            }
            _ => {
                // One worker takes the rows as they are (hashed or not: its keyed state hashes
                // them where its table does not).
                let rows = if self.key_groups.workers() == 1 {
                    rows
                } else {
                    let mut rows = rows;
                    if rows.hashes.is_empty()
                        && let Some(fill) = &self.bucket_fill
                    {
                        // Rows evaluated for the local phase, which stepped aside since: rows
                        // of no Expand (an Expand's sets go through `push_sets`).
                        fill.fill_all(&mut rows.cb)?;
                    }
                    rows.hash()?
                };
                for (w, part) in route(rows, self.key_groups)?.into_iter().enumerate() {
                    if part.cb.num_rows > 0 {
                        self.routed[w].push(part);
                    }
                }
                self.report.exchange_busy += start.elapsed();
                self.epoch_bypassed += n;
            }
        }
        Ok(())
    }

    /// Ends the source's mini-batch (`by_latency`: on the latency trigger): flushes the local
    /// phase and queues every worker its part (sent after the input batch where it is due,
    /// [`Source::send_if_due`]).
    fn end_epoch(&mut self, by_latency: bool) -> Result<()> {
        let p = self.senders.len();
        let start = Instant::now();
        let (mut parts, mut flushed, mut hot_share, mut entries) = (vec![], 0u64, 0.0f64, 0u64);
        if let Some(local) = &mut self.local
            && let Some(f) = local.flush_routed(self.key_groups)?
        {
            hot_share = f.hot_share;
            flushed = f.parts.iter().map(|p| p.len() as u64).sum();
            entries = f.entries;
            self.report.local_busy += start.elapsed().saturating_sub(f.routing);
            self.report.exchange_busy += f.routing;
            if let Some(first) = f.parts.first() {
                self.retired.hold(first.handle());
            }
            parts = f.parts;
        }
        let mut parts = parts.into_iter();
        for w in 0..p {
            self.pending[w].push(EpochPart {
                rows: std::mem::take(&mut self.routed[w]),
                accumulators: parts.next().filter(|f| !f.is_empty()),
                source_rows: self.epoch_source_rows,
                by_latency,
            });
        }
        if self.local.is_some() {
            self.adaptive.after_mini_batch(
                self.epoch_folded,
                flushed,
                entries,
                hot_share,
                self.epoch_bypassed,
            );
        }
        self.report.folded += self.epoch_folded;
        self.report.bypassed += self.epoch_bypassed;
        self.report.flushed += flushed;
        self.report.task.epochs += 1;
        (self.epoch_folded, self.epoch_bypassed) = (0, 0);
        self.epoch_source_rows = 0;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Epochs go out once their rows reach a run's worth, once they are many, and at once after
    /// the latency trigger ended one; otherwise the source holds them.
    #[test]
    fn a_source_sends_runs_of_epochs() {
        assert!(!send_due(8_192, 1, false));
        assert!(!send_due(SEND_ROWS - 1, MAX_HELD_EPOCHS - 1, false));
        assert!(send_due(SEND_ROWS, 13, false));
        assert!(send_due(1_000, MAX_HELD_EPOCHS, false));
        assert!(send_due(100, 1, true));
    }
}
