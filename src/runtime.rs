//! The worker pool the parallel stages run on.
//!
//! A [`Runtime`] owns a rayon thread pool of `parallelism` threads (none for a parallelism of 1,
//! where every task runs inline on the caller's thread). Stages hand it one task per slice or per
//! worker and wait for all of them: a barrier per step, which keeps results deterministic for a
//! given input and configuration.

use std::sync::mpsc::{Receiver, RecvError, SendError, SyncSender, TryRecvError, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rayon::prelude::*;

use crate::error::{Error, Result};

/// A pool of `parallelism` workers.
#[derive(Debug)]
pub struct Runtime {
    parallelism: usize,
    pool: Option<rayon::ThreadPool>,
    /// Counts the tasks [`Runtime::map`] runs, while a run watches ([`Runtime::watch`]).
    activity: Mutex<Option<Arc<Activity>>>,
}

impl Runtime {
    /// A runtime with `parallelism` workers (at least 1).
    ///
    /// # Errors
    /// When the operating system refuses the threads.
    pub fn new(parallelism: usize) -> Result<Arc<Self>> {
        let parallelism = parallelism.max(1);
        let pool = if parallelism > 1 {
            Some(
                rayon::ThreadPoolBuilder::new()
                    .num_threads(parallelism)
                    .thread_name(|i| format!("tally-worker-{i}"))
                    .build()
                    .map_err(|e| {
                        Error::internal(format!("cannot start {parallelism} worker threads: {e}"))
                    })?,
            )
        } else {
            None
        };
        Ok(Arc::new(Self {
            parallelism,
            pool,
            activity: Mutex::new(None),
        }))
    }

    /// The number of workers.
    pub fn parallelism(&self) -> usize {
        self.parallelism
    }

    /// Runs `f` on a worker of the pool (inline without a pool). Work that calls
    /// [`Runtime::map`] many times runs inside one `install`, so that its tasks are forked from a
    /// worker (cheap work stealing) rather than injected from outside and waited for on a lock,
    /// which costs a thread wake-up per call.
    pub fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        match &self.pool {
            Some(pool) => pool.install(f),
            None => f(),
        }
    }

    /// Runs `f` on every item, one task each, and returns the results in item order. While a
    /// run watches, the tasks count as busy and the caller, waiting for them, as idle.
    pub fn map<T, R, F>(&self, items: Vec<T>, f: F) -> Vec<R>
    where
        T: Send,
        R: Send,
        F: Fn(T) -> R + Sync + Send,
    {
        match &self.pool {
            Some(pool) if items.len() > 1 => {
                let watching = self
                    .activity
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clone();
                match watching {
                    None => pool.install(|| items.into_par_iter().with_max_len(1).map(f).collect()),
                    Some(a) => {
                        let task = |item: T| {
                            a.change(1);
                            let r = f(item);
                            a.change(-1);
                            r
                        };
                        a.wait(|| {
                            pool.install(|| {
                                items.into_par_iter().with_max_len(1).map(task).collect()
                            })
                        })
                        .0
                    }
                }
            }
            _ => items.into_iter().map(f).collect(),
        }
    }

    /// Counts the busy tasks of every [`Runtime::map`] in `activity` from now on (`None`: no
    /// more); the caller's thread counts as one busy task outside the maps.
    pub fn watch(&self, activity: Option<Arc<Activity>>) {
        *self.activity.lock().unwrap_or_else(|e| e.into_inner()) = activity;
    }
}

/// How many tasks are busy, over time: the serial fraction is the share of the run in which at
/// most one task was busy, and the mean of the count is the parallelism the run got.
#[derive(Debug)]
pub struct Activity {
    inner: Mutex<ActivityState>,
}

#[derive(Debug)]
struct ActivityState {
    start: Instant,
    last: Instant,
    busy: usize,
    /// Time during which at most one task was busy.
    serial: Duration,
    /// The busy tasks' time, summed over the tasks (the count integrated over time).
    task_time: Duration,
}

impl Activity {
    /// Starts counting with `busy` tasks busy.
    pub fn new(busy: usize) -> Self {
        let now = Instant::now();
        Self {
            inner: Mutex::new(ActivityState {
                start: now,
                last: now,
                busy,
                serial: Duration::ZERO,
                task_time: Duration::ZERO,
            }),
        }
    }

    pub(crate) fn change(&self, delta: isize) {
        // A poisoned lock only means another task panicked; the counts are still usable.
        let mut s = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let since = now - s.last;
        if s.busy <= 1 {
            s.serial += since;
        }
        let busy = u32::try_from(s.busy).unwrap_or(u32::MAX);
        s.task_time += since.saturating_mul(busy);
        s.last = now;
        s.busy = s.busy.saturating_add_signed(delta);
    }

    /// Runs `f` (a blocking wait) with the calling task counted as idle, and returns its result
    /// and how long it took.
    fn wait<R>(&self, f: impl FnOnce() -> R) -> (R, Duration) {
        self.change(-1);
        let start = Instant::now();
        let r = f();
        let waited = start.elapsed();
        self.change(1);
        (r, waited)
    }

    /// Sends `v` on `tx`; returns the send's result and how long it waited. Only a send to a
    /// full channel waits, with the task counted idle meanwhile (which takes the lock shared
    /// by every task); a send that goes through at once reads no clock and takes no lock.
    pub fn send<T>(&self, tx: &SyncSender<T>, v: T) -> (Result<(), SendError<T>>, Duration) {
        match tx.try_send(v) {
            Ok(()) => (Ok(()), Duration::ZERO),
            Err(TrySendError::Disconnected(v)) => (Err(SendError(v)), Duration::ZERO),
            Err(TrySendError::Full(v)) => self.wait(|| tx.send(v)),
        }
    }

    /// Receives from `rx`; returns the result and how long it waited. Only a receive from an
    /// empty channel waits, counted as [`Activity::send`] counts a wait.
    pub fn recv<T>(&self, rx: &Receiver<T>) -> (Result<T, RecvError>, Duration) {
        match rx.try_recv() {
            Ok(v) => (Ok(v), Duration::ZERO),
            Err(TryRecvError::Disconnected) => (Err(RecvError), Duration::ZERO),
            Err(TryRecvError::Empty) => self.wait(|| rx.recv()),
        }
    }

    /// What the counts give so far, read at one instant.
    pub fn reading(&self) -> ActivityReading {
        self.change(0);
        let s = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let wall = s.last - s.start;
        let per_wall = |d: Duration| {
            if wall.is_zero() {
                0.0
            } else {
                d.as_secs_f64() / wall.as_secs_f64()
            }
        };
        ActivityReading {
            wall,
            serial_fraction: per_wall(s.serial),
            mean_busy_tasks: per_wall(s.task_time),
        }
    }
}

/// What an [`Activity`] counted over a run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ActivityReading {
    /// The wall time so far.
    pub wall: Duration,
    /// The share of it in which at most one task was busy.
    pub serial_fraction: f64,
    /// The mean number of tasks busy over it: the parallelism the run got (a task that a core
    /// could not take at once counts as busy too, so more tasks than cores can show above the
    /// cores).
    pub mean_busy_tasks: f64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::sync_channel;

    /// The mean of the busy count lies between its least and its greatest over the run: two
    /// tasks busy for a while, then one, give more than one and less than two, however long
    /// each lasted.
    #[test]
    fn the_mean_busy_count_weighs_each_count_by_its_time() {
        let activity = Activity::new(2);
        std::thread::sleep(Duration::from_millis(5));
        activity.change(-1);
        std::thread::sleep(Duration::from_millis(5));
        let read = activity.reading();
        let mean = read.mean_busy_tasks;
        assert!(mean > 1.0 && mean < 2.0, "{mean}");
        // The serial fraction counts the second stretch only.
        let serial = read.serial_fraction;
        assert!(serial > 0.0 && serial < 1.0, "{serial}");
    }

    /// A send with room goes through without waiting; a send to a full channel waits until
    /// its receiver takes a message (how long depends on the scheduler, so it is not
    /// asserted); messages arrive in order; a closed channel hands the value back (send) or
    /// reports the end (receive).
    #[test]
    fn sends_and_receives_wait_only_when_they_must() {
        let activity = Arc::new(Activity::new(1));
        let (tx, rx) = sync_channel::<u32>(1);
        let (sent, waited) = activity.send(&tx, 1);
        assert_eq!((sent.is_ok(), waited), (true, Duration::ZERO));
        let taker = {
            let activity = Arc::clone(&activity);
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                let got: Vec<u32> = (0..2).map(|_| activity.recv(&rx).0.unwrap()).collect();
                (got, activity.recv(&rx).0.is_err())
            })
        };
        // Full, unless the taker has already taken the first: waits for the taker.
        assert!(activity.send(&tx, 2).0.is_ok());
        drop(tx);
        assert_eq!(taker.join().unwrap(), (vec![1, 2], true));
        let (tx, rx) = sync_channel::<u32>(1);
        drop(rx);
        assert_eq!(activity.send(&tx, 7).0.unwrap_err().0, 7);
    }
}
