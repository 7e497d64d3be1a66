//! The source threads of the pipelined runtime: P threads take turns on the splits.
//!
//! A run may have more splits than workers (each split one [`Source`], with its own local
//! phase, mini-batch trigger and channels to the workers). A source thread takes a split,
//! reads it until the split sends the workers a run of epochs (a *turn*, some
//! [`SEND_ROWS`](super::tasks::SEND_ROWS) rows), puts it back and takes the split that is
//! furthest behind: the one that has ended the fewest epochs, then read the fewest rows. So the
//! splits move in step, and a thread that the machine slows down (another task on its core)
//! takes fewer turns rather than holding every other thread back at the end: each worker merges
//! epoch `e` of every split before epoch `e + 1`, so one split behind stalls them all.
//!
//! What a split sends depends only on its rows (its epochs end by its own row counts), not on
//! which thread took which turn, so the changelog stays the same on every run.
//!
//! # Why taking the split furthest behind cannot deadlock
//!
//! A thread blocks only on a full channel to a worker (backpressure), which holds
//! [`CHANNEL_DEPTH`](super::CHANNEL_DEPTH) runs of the split's epochs that the worker has not
//! merged: the worker waits for an earlier epoch of another split. Each turn sends at most one
//! run to each worker (and, at the split's end, the empty run that ends it; the depth is more
//! than one), so a thread blocked on a split that it took with `c` epochs ended waits for a
//! split with fewer than `c` epochs. That split is not in the pool: the thread would have
//! taken it instead (a split's count changes only in a turn), and a split put back after the
//! thread took its own is taken at once by the thread that put it back (or one with fewer
//! epochs is). So it is being read by another thread, which in turn waits only for a split
//! with fewer epochs still; the chain ends at a thread that is not blocked.

use std::sync::Mutex;

use super::PreStages;
use super::Split;
use super::tasks::{Source, SourceReport};
use crate::error::Result;
use crate::operator::local::RetiredFlushes;
use crate::runtime::Activity;

/// A split and its source task.
pub(super) struct Unit<'a> {
    pub(super) source: Source<'a>,
    pub(super) split: Split,
}

impl Unit<'_> {
    /// How far the split has got: its epochs ended, then the source rows it read.
    fn position(&self) -> (u64, u64) {
        let task = &self.source.report.task;
        (task.epochs, task.rows)
    }
}

/// Of splits at `positions` (index, [`Unit::position`]), the one furthest behind: the fewest
/// epochs ended, then the fewest rows read, then the first.
fn furthest_behind(positions: impl Iterator<Item = (usize, (u64, u64))>) -> Option<usize> {
    positions.min_by_key(|&(i, at)| (at, i)).map(|(i, _)| i)
}

/// Where each split is.
enum Slot<'a> {
    /// Waiting for a turn.
    Pooled(Box<Unit<'a>>),
    /// A thread is reading it.
    Taken,
    /// Ended (or failed).
    Done,
}

/// The splits of a run, shared by its source threads.
pub(super) struct Units<'a> {
    slots: Mutex<Vec<Slot<'a>>>,
}

impl<'a> Units<'a> {
    pub(super) fn new(units: Vec<Unit<'a>>) -> Self {
        let slots = units
            .into_iter()
            .map(|u| Slot::Pooled(Box::new(u)))
            .collect();
        Self {
            slots: Mutex::new(slots),
        }
    }

    /// Puts back the split `held` (taken, and not ended) and takes the split furthest behind
    /// (none: every split has ended or is being read by another thread).
    fn next(&self, held: Option<(usize, Box<Unit<'a>>)>) -> Option<(usize, Box<Unit<'a>>)> {
        // A poisoned lock only means another source thread panicked: its split is gone (its
        // channels closed with it, which stops the run), the others are whole.
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((i, unit)) = held {
            slots[i] = Slot::Pooled(unit);
        }
        let i = furthest_behind(slots.iter().enumerate().filter_map(|(i, s)| match s {
            Slot::Pooled(unit) => Some((i, unit.position())),
            _ => None,
        }))?;
        match std::mem::replace(&mut slots[i], Slot::Taken) {
            Slot::Pooled(unit) => Some((i, unit)),
            _ => None,
        }
    }

    /// Drops every split still waiting for a turn, closing its channels (the workers then stop):
    /// when no thread is left to read them.
    pub(super) fn abandon(&self) {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        for slot in slots.iter_mut() {
            if matches!(slot, Slot::Pooled(..)) {
                *slot = Slot::Done;
            }
        }
    }

    fn done(&self, i: usize) {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        slots[i] = Slot::Done;
    }
}

/// What a source thread returns: the report (or error) of each split it ended, by split index.
pub(super) type SourceReports = Vec<(usize, Result<SourceReport>)>;

/// One source thread: takes turns on the splits until none is left to take, and returns the
/// report (or error) of each split it ended, by split index. The flushes it routes are freed on
/// it ([`RetiredFlushes`]), whichever split they came from.
pub(super) fn source_thread(
    units: &Units<'_>,
    pre: PreStages<'_>,
    activity: &Activity,
) -> Result<SourceReports> {
    // A thread that panics leaves no split waiting for a turn that no thread may take.
    let _abandon = AbandonOnPanic(units);
    let mut retired = RetiredFlushes::default();
    let mut reports = vec![];
    let mut held = None;
    while let Some((i, mut unit)) = units.next(held.take()) {
        let Unit { source, split } = &mut *unit;
        std::mem::swap(&mut source.retired, &mut retired);
        let turn = source.turn(split, pre);
        std::mem::swap(&mut source.retired, &mut retired);
        let ended = match turn {
            Ok(false) => {
                held = Some((i, unit));
                continue;
            }
            Ok(true) => Ok(()),
            Err(e) => Err(e),
        };
        units.done(i);
        let Unit { source, .. } = *unit;
        reports.push((i, source.finish(ended)));
    }
    // The thread ends: it no longer counts as busy.
    activity.change(-1);
    Ok(reports)
}

/// Abandons the splits waiting for a turn ([`Units::abandon`]) if its thread panics.
struct AbandonOnPanic<'u, 'a>(&'u Units<'a>);

impl Drop for AbandonOnPanic<'_, '_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.abandon();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A thread takes the split with the fewest epochs ended, then the fewest rows read, then
    /// the first: the rule the deadlock argument rests on.
    #[test]
    fn the_split_furthest_behind_is_taken() {
        let pick = |at: &[(usize, (u64, u64))]| furthest_behind(at.iter().copied());
        assert_eq!(pick(&[]), None);
        assert_eq!(pick(&[(0, (3, 10)), (2, (2, 900)), (5, (4, 0))]), Some(2));
        assert_eq!(pick(&[(1, (2, 50)), (3, (2, 40))]), Some(3));
        assert_eq!(pick(&[(4, (2, 40)), (1, (2, 40))]), Some(1));
    }
}
