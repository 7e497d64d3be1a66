//! The clock that drives the mini-batch latency trigger.
//!
//! Live runs use processing time ([`SystemClock`]); tests and replays inject a [`ManualClock`]
//! so that when a mini-batch fires is deterministic.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

/// A source of the current time in milliseconds.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// Milliseconds since an arbitrary, fixed origin; never decreases.
    fn now_ms(&self) -> i64;
}

/// Wall-clock processing time (milliseconds since the Unix epoch).
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64)
    }
}

/// A clock that moves only when told to. Clones share the same time.
///
/// # Examples
/// ```
/// use tally::clock::{Clock, ManualClock};
/// let clock = ManualClock::new(0);
/// let shared = clock.clone();
/// clock.advance_ms(250);
/// assert_eq!(shared.now_ms(), 250);
/// ```
#[derive(Debug, Clone, Default)]
pub struct ManualClock(Arc<AtomicI64>);

impl ManualClock {
    /// A clock showing `start_ms`.
    pub fn new(start_ms: i64) -> Self {
        Self(Arc::new(AtomicI64::new(start_ms)))
    }

    /// Moves the clock forward by `ms`.
    pub fn advance_ms(&self, ms: i64) {
        self.0.fetch_add(ms.max(0), Ordering::SeqCst);
    }

    /// Sets the time; a time earlier than now is ignored (the clock never goes back).
    pub fn set_ms(&self, ms: i64) {
        self.0.fetch_max(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// The mini-batch latency trigger: whether `now_ms` lies in a later interval of `latency` than
/// the one recorded in `last` (which it then records). A mini-batch fires once per interval
/// boundary the clock crosses.
pub(crate) fn crossed_interval(last: &mut i64, now_ms: i64, latency: std::time::Duration) -> bool {
    let interval = (latency.as_millis() as i64).max(1);
    let current = now_ms - now_ms.rem_euclid(interval);
    if current > *last {
        *last = current;
        true
    } else {
        false
    }
}
