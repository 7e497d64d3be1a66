//! The alignment of epochs over channels that carry runs of them: a round is the next epoch
//! of every channel still open, in channel order.

use std::collections::VecDeque;
use std::sync::mpsc::{Receiver, TryRecvError};

use crate::operator::metrics::TaskMetrics;
use crate::runtime::Activity;

/// The alignment of epochs over channels that carry runs of them: each message is a `Vec` of
/// consecutive epochs of one sender (a source sends the epochs one input batch ended, a worker
/// the epochs it fired before it would wait), so a receiver wakes once per run, not once per
/// epoch. A round is the next epoch of every channel still open, in channel order. A sender
/// that finishes sends an empty run (the end of its epochs) and then closes: its channel is left
/// out from then on. A channel that closes without that end (its sender failed or stopped) ends
/// the alignment: no round is complete from there on, so none is made ([`Aligner::broken`]).
pub(super) struct Aligner<T> {
    channels: Vec<Receiver<Vec<T>>>,
    queues: Vec<VecDeque<T>>,
    /// Per channel: its sender sent the end of its epochs.
    ended: Vec<bool>,
    /// Per channel: closed (after its end, or without it).
    closed: Vec<bool>,
}

/// What an [`Aligner`] found on one channel.
enum Next {
    /// The channel's queue holds its next epoch, or the channel is done.
    Ready,
    /// Nothing yet (only without waiting).
    Empty,
}

impl<T> Aligner<T> {
    pub(super) fn new(channels: Vec<Receiver<Vec<T>>>) -> Self {
        let n = channels.len();
        Self {
            channels,
            queues: (0..n).map(|_| VecDeque::new()).collect(),
            ended: vec![false; n],
            closed: vec![false; n],
        }
    }

    /// Whether a channel closed without the end of its epochs: its sender failed or stopped.
    pub(super) fn broken(&self) -> bool {
        self.closed
            .iter()
            .zip(&self.ended)
            .any(|(&closed, &ended)| closed && !ended)
    }

    /// Takes what channel `c` delivered: a run of epochs, its end, or its closing.
    fn take(&mut self, c: usize, msg: std::result::Result<Vec<T>, ()>) {
        match msg {
            Ok(run) if run.is_empty() => self.ended[c] = true,
            Ok(run) => self.queues[c].extend(run),
            Err(()) => self.closed[c] = true,
        }
    }

    /// Fills channel `c`'s queue with its next epoch if one is there, without waiting.
    fn poll(&mut self, c: usize) -> Next {
        while !self.closed[c] && self.queues[c].is_empty() {
            match self.channels[c].try_recv() {
                Ok(run) => self.take(c, Ok(run)),
                Err(TryRecvError::Empty) => return Next::Empty,
                Err(TryRecvError::Disconnected) => self.take(c, Err(())),
            }
        }
        Next::Ready
    }

    /// The next round if every channel it needs already holds its epoch (none waits); `None`
    /// when one would wait, when all are done, or when the alignment broke.
    pub(super) fn try_round(&mut self) -> Option<Vec<T>> {
        for c in 0..self.channels.len() {
            if let Next::Empty = self.poll(c) {
                return None;
            }
        }
        self.pop_round()
    }

    /// The next round, waiting for each channel in turn; `None` once all are done, or when the
    /// alignment broke. The time spent waiting counts as `task`'s waiting on input.
    pub(super) fn round(&mut self, activity: &Activity, task: &mut TaskMetrics) -> Option<Vec<T>> {
        for c in 0..self.channels.len() {
            while !self.closed[c] && self.queues[c].is_empty() {
                let (msg, waited) = activity.recv(&self.channels[c]);
                task.waiting_input += waited;
                self.take(c, msg.map_err(|_| ()));
            }
        }
        self.pop_round()
    }

    /// Takes the front epoch of every channel that has one (each open channel has one here).
    fn pop_round(&mut self) -> Option<Vec<T>> {
        if self.broken() {
            return None;
        }
        let round: Vec<T> = self
            .queues
            .iter_mut()
            .filter_map(VecDeque::pop_front)
            .collect();
        (!round.is_empty()).then_some(round)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::{SyncSender, sync_channel};

    type Channels = (
        SyncSender<Vec<&'static str>>,
        SyncSender<Vec<&'static str>>,
        Aligner<&'static str>,
        Activity,
        TaskMetrics,
    );

    /// Two senders, an aligner over their channels, and what waiting is counted in.
    fn two_channels() -> Channels {
        let (a_tx, a) = sync_channel(4);
        let (b_tx, b) = sync_channel(4);
        let aligner = Aligner::new(vec![a, b]);
        (
            a_tx,
            b_tx,
            aligner,
            Activity::new(1),
            TaskMetrics::default(),
        )
    }

    /// Runs of any length align as single epochs would: a round is the next epoch of every
    /// channel still open, in channel order; a finished channel (its end sent, then closed)
    /// drops out once its epochs are taken; `try_round` never takes a round that would wait.
    #[test]
    fn runs_of_epochs_align_epoch_by_epoch() {
        let (a_tx, b_tx, mut aligner, activity, mut task) = two_channels();
        a_tx.send(vec!["a0", "a1", "a2"]).unwrap();
        // Channel b has nothing yet: no round without waiting.
        assert_eq!(aligner.try_round(), None);
        b_tx.send(vec!["b0"]).unwrap();
        assert_eq!(aligner.try_round(), Some(vec!["a0", "b0"]));
        assert_eq!(aligner.try_round(), None);
        b_tx.send(vec!["b1", "b2", "b3", "b4"]).unwrap();
        assert_eq!(aligner.try_round(), Some(vec!["a1", "b1"]));
        assert_eq!(aligner.try_round(), Some(vec!["a2", "b2"]));
        // a finishes after three epochs: b's later epochs make rounds of their own.
        a_tx.send(vec![]).unwrap();
        drop(a_tx);
        assert_eq!(aligner.try_round(), Some(vec!["b3"]));
        assert_eq!(aligner.round(&activity, &mut task), Some(vec!["b4"]));
        b_tx.send(vec![]).unwrap();
        drop(b_tx);
        assert_eq!(aligner.round(&activity, &mut task), None);
        assert_eq!(aligner.try_round(), None);
        assert!(!aligner.broken());
    }

    /// A channel that closes without the end of its epochs (its sender failed) breaks the
    /// alignment: no later round is made, though the other channels hold epochs (a round
    /// without the failed sender's epoch would apply rows out of input order, and a checkpoint
    /// there would claim rows that were never applied).
    #[test]
    fn a_sender_that_fails_ends_the_rounds() {
        let (a_tx, b_tx, mut aligner, activity, mut task) = two_channels();
        a_tx.send(vec!["a0", "a1", "a2"]).unwrap();
        b_tx.send(vec!["b0"]).unwrap();
        assert_eq!(aligner.round(&activity, &mut task), Some(vec!["a0", "b0"]));
        drop(b_tx);
        assert_eq!(aligner.round(&activity, &mut task), None);
        assert!(aligner.broken());
        assert_eq!(aligner.try_round(), None);
    }
}
