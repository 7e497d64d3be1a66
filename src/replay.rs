//! Replaying a recorded stream: pacing by recorded time and end-to-end latency.
//!
//! A recorded stream carries each row's arrival time (the table's `time-column`). A replay at
//! speed X releases a row when `(t_row - t_first) / X` has passed on the wall clock since the
//! replay started (`max`: as fast as the engine takes it). A row's latency is the wall time from
//! its release to the emission of the first changelog output after it was pushed: the change
//! that includes it (with mini-batch, the end of its mini-batch). Outputs are observed per pushed
//! batch, so a row pushed in the same batch as the end of its mini-batch counts as emitted then.

use std::fmt;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// Relative precision of [`LatencyHistogram`]: bucket bounds grow by this factor.
const GROWTH: f64 = 1.02;

/// A histogram of latencies in microseconds with 2 % relative precision and an exact maximum,
/// in constant memory whatever the number of rows.
#[derive(Debug, Clone, Default)]
pub struct LatencyHistogram {
    counts: Vec<u64>,
    total: u64,
    max_us: u64,
}

impl LatencyHistogram {
    fn bucket(us: u64) -> usize {
        if us <= 1 {
            0
        } else {
            ((us as f64).ln() / GROWTH.ln()).ceil() as usize
        }
    }

    /// Records `count` rows of latency `us` microseconds.
    pub fn record(&mut self, us: u64, count: u64) {
        if count == 0 {
            return;
        }
        let b = Self::bucket(us);
        if self.counts.len() <= b {
            self.counts.resize(b + 1, 0);
        }
        self.counts[b] += count;
        self.total += count;
        self.max_us = self.max_us.max(us);
    }

    /// Rows recorded.
    pub fn count(&self) -> u64 {
        self.total
    }

    /// The latency under which a share `q` (0 to 1) of the rows fall (the bucket's upper bound,
    /// at most the maximum); zero when nothing was recorded.
    pub fn quantile(&self, q: f64) -> Duration {
        if self.total == 0 {
            return Duration::ZERO;
        }
        let want = ((q.clamp(0.0, 1.0) * self.total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (b, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= want {
                let upper = GROWTH.powi(b as i32).round() as u64;
                return Duration::from_micros(upper.min(self.max_us));
            }
        }
        Duration::from_micros(self.max_us)
    }

    /// The largest latency recorded.
    pub fn max(&self) -> Duration {
        Duration::from_micros(self.max_us)
    }
}

/// What a replay measured.
#[derive(Debug, Clone, Default)]
pub struct ReplayStats {
    /// The replay speed (None: as fast as possible).
    pub speed: Option<f64>,
    /// Rows replayed.
    pub rows: u64,
    /// Wall time of the replay.
    pub wall: Duration,
    /// Recorded time the stream spans.
    pub recorded: Duration,
    /// Latencies from release to emission.
    pub latency: LatencyHistogram,
}

impl fmt::Display for ReplayStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        write!(
            f,
            "replay at {}: {} rows in {:.3} s ({:.0} rows/s; {:.1} s of recorded time); latency p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
            self.speed
                .map_or("max speed".to_string(), |x| format!("{x}x recorded speed")),
            self.rows,
            self.wall.as_secs_f64(),
            self.rows as f64 / self.wall.as_secs_f64().max(1e-9),
            self.recorded.as_secs_f64(),
            ms(self.latency.quantile(0.5)),
            ms(self.latency.quantile(0.99)),
            ms(self.latency.max())
        )
    }
}

/// Paces a replay and measures latencies (see the module docs).
#[derive(Debug)]
pub struct Replayer {
    speed: Option<f64>,
    start: Instant,
    first_ms: Option<i64>,
    last_ms: i64,
    /// Rows pushed whose output has not been seen: release times and how many rows share each.
    pending: Vec<(Instant, u64)>,
    stats: ReplayStats,
}

/// The longest a replay waits for a row to be due (ten years of wall time).
pub const MAX_WAIT: Duration = Duration::from_secs(10 * 365 * 86_400);

/// The slowest and the fastest replay speed (times recorded speed) a replay accepts; `max`
/// (None) replays as fast as possible.
pub const SPEED_RANGE: std::ops::RangeInclusive<f64> = 0.001..=1_000_000.0;

impl Replayer {
    /// A replay at `speed` times recorded speed (None: as fast as possible).
    ///
    /// # Errors
    /// A speed outside [`SPEED_RANGE`] (or not a number).
    pub fn new(speed: Option<f64>) -> Result<Self> {
        if let Some(x) = speed
            && !SPEED_RANGE.contains(&x)
        {
            return Err(Error::invalid_input(format!(
                "replay speed {x} is out of range: give 'max' or a speed from {} to {} times the recorded speed",
                SPEED_RANGE.start(),
                SPEED_RANGE.end()
            )));
        }
        Ok(Self {
            speed,
            start: Instant::now(),
            first_ms: None,
            last_ms: i64::MIN,
            pending: vec![],
            stats: ReplayStats {
                speed,
                ..ReplayStats::default()
            },
        })
    }

    /// Before pushing a batch whose rows arrived at `times_ms`: waits until its last row is due
    /// and notes each row's release time. A row recorded before the first row is due at once.
    ///
    /// # Errors
    /// A recorded time so far after the first row's that its wall-clock wait cannot be
    /// represented.
    pub fn before_push(&mut self, times_ms: &[i64]) -> Result<()> {
        let now = Instant::now();
        let Some(&last) = times_ms.iter().max() else {
            return Ok(());
        };
        let first = *self
            .first_ms
            .get_or_insert(times_ms.iter().copied().min().unwrap_or(last));
        self.last_ms = self.last_ms.max(last);
        self.stats.rows += times_ms.len() as u64;
        let Some(x) = self.speed else {
            // As fast as possible: the whole batch is released when read.
            self.pending.push((now, times_ms.len() as u64));
            return Ok(());
        };
        let start = self.start;
        // The difference of two i64 times fits an i128; a wait beyond MAX_WAIT (a broken time
        // column, far more often than a recording that long) is refused, never overflowed.
        let due = |t: i64| -> Result<Instant> {
            let ms = (i128::from(t) - i128::from(first)).max(0) as f64;
            Duration::try_from_secs_f64(ms / x / 1e3)
                .ok()
                .filter(|d| *d <= MAX_WAIT)
                .and_then(|d| start.checked_add(d))
                .ok_or_else(|| {
                    Error::invalid_input(format!(
                        "a row recorded at {t} ms comes {ms} ms after the first row ({first} ms): at {x}x it would be released more than {} years after the replay starts; check the time column or replay faster",
                        MAX_WAIT.as_secs() / (365 * 86_400)
                    ))
                })
        };
        let wait_until = due(last)?;
        let now = Instant::now();
        if wait_until > now {
            std::thread::sleep(wait_until - now);
        }
        // Rows that arrived in the same millisecond share a release time.
        let mut run: Option<(i64, u64)> = None;
        for &t in times_ms {
            match &mut run {
                Some((rt, n)) if *rt == t => *n += 1,
                _ => {
                    if let Some((rt, n)) = run {
                        self.pending.push((due(rt)?, n));
                    }
                    run = Some((t, 1));
                }
            }
        }
        if let Some((rt, n)) = run {
            self.pending.push((due(rt)?, n));
        }
        Ok(())
    }

    /// After a push (or the end of input) that emitted `output_rows` changelog rows: the rows
    /// pushed so far are emitted now if there was output.
    pub fn after_push(&mut self, output_rows: usize) {
        if output_rows == 0 {
            return;
        }
        let now = Instant::now();
        for (due, rows) in self.pending.drain(..) {
            let us = now.saturating_duration_since(due).as_micros() as u64;
            self.stats.latency.record(us, rows);
        }
    }

    /// The end of the replay.
    pub fn finish(mut self) -> ReplayStats {
        self.stats.wall = self.start.elapsed();
        let span = match self.first_ms {
            Some(first) => i128::from(self.last_ms) - i128::from(first),
            None => 0,
        };
        self.stats.recorded = Duration::from_millis(span.clamp(0, i128::from(u64::MAX)) as u64);
        self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_within_the_precision() {
        let mut h = LatencyHistogram::default();
        for us in 1..=10_000u64 {
            h.record(us, 1);
        }
        assert_eq!(h.count(), 10_000);
        for (q, want) in [(0.5, 5_000.0), (0.99, 9_900.0), (1.0, 10_000.0)] {
            let got = h.quantile(q).as_micros() as f64;
            assert!((got - want).abs() / want <= 0.021, "q {q}: {got} vs {want}");
        }
        assert_eq!(h.max(), Duration::from_micros(10_000));
        assert_eq!(LatencyHistogram::default().quantile(0.5), Duration::ZERO);
    }

    #[test]
    fn pacing_waits_for_recorded_time() {
        // 100 ms of recorded time at 10x: about 10 ms of wall time.
        let mut r = Replayer::new(Some(10.0)).unwrap();
        r.before_push(&[1_000, 1_050]).unwrap();
        r.after_push(1);
        r.before_push(&[1_100]).unwrap();
        r.after_push(1);
        let s = r.finish();
        assert!(s.wall >= Duration::from_millis(10), "{s}");
        assert_eq!(s.rows, 3);
        assert_eq!(s.recorded, Duration::from_millis(100));
        assert_eq!(s.latency.count(), 3);
    }

    #[test]
    fn speeds_and_extreme_times_are_errors_not_panics() {
        for bad in [1e-300, 0.0, -1.0, f64::NAN, f64::INFINITY, 1e7] {
            let e = Replayer::new(Some(bad)).unwrap_err().to_string();
            assert!(e.contains("replay speed") && e.contains("max"), "{e}");
        }
        // Times at the ends of BIGINT: no overflow; the row far ahead is refused instead of a
        // wait of millions of years (or a wrapped difference, or a panic).
        for speed in [0.001, 1.0, 1e6] {
            let mut r = Replayer::new(Some(speed)).unwrap();
            let e = r
                .before_push(&[i64::MIN, i64::MAX])
                .unwrap_err()
                .to_string();
            assert!(e.contains("check the time column"), "{e}");
        }
        // Earlier rows are due at once, whatever their distance.
        let mut r = Replayer::new(Some(1.0)).unwrap();
        r.before_push(&[0]).unwrap();
        r.before_push(&[i64::MIN, -5]).unwrap();
        let mut r = Replayer::new(None).unwrap();
        r.before_push(&[i64::MIN, i64::MAX]).unwrap();
        assert_eq!(r.finish().rows, 2);
    }
}
