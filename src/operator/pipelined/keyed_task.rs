//! The keyed task of the pipelined runtime, one per worker: align the sources' epochs, apply
//! them, and fire its mini-batch.

use std::sync::mpsc::{Receiver, SyncSender};
use std::time::Instant;

use arrow::array::RecordBatch;

use super::tasks::{EpochPart, Stop};
use super::{Aligner, FiringFold, PostFiring};
use crate::changelog::ChangeBatch;
use crate::error::Result;
use crate::operator::metrics::TaskMetrics;
use crate::operator::parallel::Worker;
use crate::runtime::Activity;

/// What a keyed task sends the caller after an epoch: the changes (through its
/// [`FiringFold`], if any), the rows it fired, and at a checkpoint its state (the input rows
/// applied so far, the worker's snapshot).
pub(super) struct WorkerOutput {
    pub(super) changes: Vec<ChangeBatch>,
    pub(super) fired_rows: u64,
    pub(super) state: Option<(u64, Vec<RecordBatch>)>,
    /// Whether the latency trigger ended the epoch.
    pub(super) by_latency: bool,
}

impl WorkerOutput {
    /// Whether the caller should have it before the keyed task waits for input: it carries
    /// changes or a checkpoint's state, or ends an epoch the latency trigger ended. An empty
    /// output only keeps the caller's epochs aligned, and waits for the next one that counts.
    fn prompt(&self) -> bool {
        !self.changes.is_empty() || self.state.is_some() || self.by_latency
    }
}

/// The most epochs' outputs a keyed task holds before it sends them to the caller, when one of
/// them is prompt ([`WorkerOutput::prompt`]) and its sources are far ahead of it (their
/// channels full).
const MAX_FIRED_RUN: usize = 16;

/// The most epochs' outputs a keyed task holds before it sends them, when none is prompt: the
/// epochs in which it did not fire (most of them: a worker fires once its input records reach
/// a mini-batch) wake the caller once per this many, or with the next prompt one.
const MAX_HELD_OUTPUTS: usize = 256;

/// What every keyed task of a run shares: how it applies epochs, checkpoints and folds, and
/// the run's accounting and stop flag.
#[derive(Clone, Copy)]
pub(super) struct KeyedRun<'a> {
    /// Chunks in input order: each source's epoch applied and fired on its own.
    pub(super) per_source: bool,
    pub(super) checkpoint_every: Option<u64>,
    pub(super) post: Option<PostFiring<'a>>,
    pub(super) activity: &'a Activity,
    pub(super) stop: &'a Stop,
}

/// A keyed task's mini-batch, as Flink's bundle of a keyed aggregate counts it: the input
/// records (raw rows and accumulator rows) taken since it last fired. It fires at the end of the
/// first epoch that brings them to `table.exec.mini-batch.size`, at the end of an epoch the
/// latency trigger ended, before a checkpoint, and at the end of the input.
struct Bundle {
    size: u64,
    taken: u64,
    /// The input ended: what was taken fires.
    end: bool,
}

impl Bundle {
    fn new(worker: &Worker) -> Self {
        let size = worker.agg.config().mini_batch_size;
        Self {
            size: u64::try_from(size).unwrap_or(1).max(1),
            taken: 0,
            end: false,
        }
    }

    /// Whether the mini-batch fires after an epoch (`by_latency`: one the latency trigger
    /// ended) that brought it to `taken` records.
    fn fires(&self, by_latency: bool, checkpoint: bool) -> bool {
        checkpoint || (self.taken > 0 && (self.end || by_latency || self.taken >= self.size))
    }
}

/// One keyed task: aligns the epochs of the sources, merges them, and fires its mini-batch
/// ([`Bundle`]).
///
/// With `run.per_source` (chunks in input order), each source's epoch is applied on its own, in
/// source order; otherwise one epoch of every source is merged together. Each epoch (or source's
/// epoch) gives the caller one [`WorkerOutput`], empty where the mini-batch did not fire, and the
/// end of the input one more, of the last firing.
/// With `run.checkpoint_every` (chunks only), after a round of epochs that takes the input rows
/// applied past a multiple of it, the mini-batch fires and the worker's snapshot goes with the
/// round's last changes.
pub(super) fn keyed_task(
    worker: &mut Worker,
    receivers: Vec<Receiver<Vec<EpochPart>>>,
    out: SyncSender<Vec<WorkerOutput>>,
    run: &KeyedRun<'_>,
) -> Result<TaskMetrics> {
    let KeyedRun {
        per_source,
        checkpoint_every,
        post,
        activity,
        stop,
    } = *run;
    let started = Instant::now();
    let mut task = TaskMetrics::default();
    let mut sources = Aligner::new(receivers);
    let mut fold = match post.map(|make| make()).transpose() {
        Ok(f) => f,
        Err(e) => {
            stop.now();
            activity.change(-1);
            return Err(e);
        }
    };
    let mut position = 0u64;
    let mut bundle = Bundle::new(worker);
    // The outputs of the epochs since the last send, and whether one of them is prompt: sent
    // when the next round would wait and one is prompt, or once they are [`MAX_FIRED_RUN`]
    // with one prompt or [`MAX_HELD_OUTPUTS`] (one wake-up of the caller per firing or run of
    // firings, not per epoch or input message, and the changes never held back for long).
    let mut fired: Vec<WorkerOutput> = vec![];
    let mut prompt = false;
    let result = (|| -> Result<()> {
        loop {
            let full = fired.len()
                >= if prompt {
                    MAX_FIRED_RUN
                } else {
                    MAX_HELD_OUTPUTS
                };
            if full {
                prompt = false;
                if !send_fired(&out, &mut fired, activity, &mut task) {
                    return Ok(());
                }
            }
            let parts = match sources.try_round() {
                Some(parts) => parts,
                None => {
                    if std::mem::take(&mut prompt)
                        && !send_fired(&out, &mut fired, activity, &mut task)
                    {
                        return Ok(());
                    }
                    match sources.round(activity, &mut task) {
                        Some(parts) => parts,
                        None => break,
                    }
                }
            };
            let before = position;
            position += parts.iter().map(|p| p.source_rows).sum::<u64>();
            let due = checkpoint_every.is_some_and(|every| position / every > before / every);
            let steps: Vec<Vec<EpochPart>> = if per_source {
                parts.into_iter().map(|p| vec![p]).collect()
            } else {
                vec![parts]
            };
            let last = steps.len() - 1;
            for (i, parts) in steps.into_iter().enumerate() {
                let checkpoint = (due && i == last).then_some(position);
                let output = apply_and_fire(
                    worker,
                    parts,
                    checkpoint,
                    fold.as_mut(),
                    &mut bundle,
                    &mut task,
                )?;
                prompt |= output.prompt();
                fired.push(output);
            }
        }
        if sources.broken() {
            // What the other workers fired in these epochs reaches the caller with them.
            send_fired(&out, &mut fired, activity, &mut task);
            return Ok(());
        }
        // The end of the input fires what the last epochs left (every worker sends this output,
        // empty or not, so that the caller's rounds stay aligned).
        bundle.end = true;
        fired.push(apply_and_fire(
            worker,
            vec![],
            None,
            fold.as_mut(),
            &mut bundle,
            &mut task,
        )?);
        if send_fired(&out, &mut fired, activity, &mut task) {
            // The end of this worker's epochs (a source that failed leaves it out, and the
            // caller stops there too).
            let (_, waited) = activity.send(&out, vec![]);
            task.waiting_output += waited;
        }
        Ok(())
    })();
    if result.is_err() {
        stop.now();
    }
    // The task ends: it no longer counts as busy.
    activity.change(-1);
    task.busy = started
        .elapsed()
        .saturating_sub(task.waiting_input + task.waiting_output);
    result.map(|()| task)
}

/// Sends the caller the outputs fired since the last send (nothing when there are none);
/// returns whether the caller still listens.
fn send_fired(
    out: &SyncSender<Vec<WorkerOutput>>,
    fired: &mut Vec<WorkerOutput>,
    activity: &Activity,
    task: &mut TaskMetrics,
) -> bool {
    if fired.is_empty() {
        return true;
    }
    let run = std::mem::take(fired);
    let (sent, waited) = activity.send(out, run);
    task.waiting_output += waited;
    sent.is_ok()
}

/// Applies the rows and merges the accumulator rows of `parts` into the worker, and fires where
/// the `bundle` is due: the changes (through `fold`), with the worker's snapshot at a
/// `checkpoint` (the input rows applied).
fn apply_and_fire(
    worker: &mut Worker,
    parts: Vec<EpochPart>,
    checkpoint: Option<u64>,
    fold: Option<&mut FiringFold>,
    bundle: &mut Bundle,
    task: &mut TaskMetrics,
) -> Result<WorkerOutput> {
    let (mut rows, mut accumulators) = (vec![], vec![]);
    let mut by_latency = false;
    for part in parts {
        rows.extend(part.rows);
        accumulators.extend(part.accumulators);
        by_latency |= part.by_latency;
    }
    let start = Instant::now();
    let n_rows: u64 = rows.iter().map(|r| r.cb.num_rows as u64).sum();
    let n_acc: u64 = accumulators.iter().map(|f| f.len() as u64).sum();
    let folded: u64 = accumulators.iter().flat_map(|f| f.rows()).sum();
    let mut changes = worker.agg.push_routed(&rows)?;
    if !accumulators.is_empty() {
        worker.agg.merge_routed(&accumulators)?;
    }
    bundle.taken += n_rows + n_acc;
    // The firing's key hashes, where the fold reads them.
    let mut hashed = None;
    if bundle.fires(by_latency, checkpoint.is_some()) {
        if fold.as_ref().is_some_and(|f| f.takes_key_hashes()) {
            // Hashes come with a firing of one batch, which ends the changes.
            let (fired, hashes) = worker.agg.finish_hashed()?;
            hashed = hashes;
            changes.extend(fired);
        } else {
            changes.extend(worker.agg.finish()?);
        }
        bundle.taken = 0;
        task.epochs += 1;
    }
    worker.rows_received += n_rows + n_acc;
    worker.input_rows += n_rows + folded;
    worker.busy += start.elapsed();
    task.rows += n_rows + n_acc;
    let state = match checkpoint {
        Some(rows) => Some((rows, worker.agg.snapshot()?)),
        None => None,
    };
    let fired_rows = changes.iter().map(|c| c.num_rows() as u64).sum();
    let changes = match fold {
        Some(fold) => {
            let mut out = Vec::with_capacity(changes.len());
            let last = changes.len().saturating_sub(1);
            for (i, c) in changes.into_iter().enumerate() {
                match hashed.take_if(|_| i == last) {
                    Some(hashes) => out.extend(fold.fold_hashed_firing(c, hashes)?),
                    None => out.extend(fold.fold_firing(c)?),
                }
            }
            if by_latency || bundle.end || state.is_some() {
                out.extend(fold.flush()?);
            }
            out
        }
        None => changes,
    };
    Ok(WorkerOutput {
        changes,
        fired_rows,
        state,
        by_latency,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn output(changes: usize, state: bool, by_latency: bool) -> WorkerOutput {
        let schema = std::sync::Arc::new(arrow::datatypes::Schema::empty());
        let batch = ChangeBatch::inserts(RecordBatch::new_empty(schema));
        WorkerOutput {
            changes: vec![batch; changes],
            fired_rows: 0,
            state: state.then(|| (0, vec![])),
            by_latency,
        }
    }

    /// An output goes to the caller before the keyed task waits where it carries changes, a
    /// checkpoint's state, or the end of an epoch the latency trigger ended; an empty one waits
    /// for the next that does.
    #[test]
    fn only_outputs_that_count_are_prompt() {
        assert!(!output(0, false, false).prompt());
        assert!(output(1, false, false).prompt());
        assert!(output(0, true, false).prompt());
        assert!(output(0, false, true).prompt());
    }
}
