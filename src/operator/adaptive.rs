//! The adaptive local phase: whether a parallel aggregation's local phases fold their input or
//! step aside.
//!
//! A local phase pays off when it folds many rows into little (few accumulator rows, short
//! DISTINCT lists), or when it folds a hot key that would otherwise pin one worker. It measures
//! its reduction ratio (accumulator rows and the DISTINCT (group, value) entries their lists
//! carry, out / rows in) and the largest share of its input held by one key over at least
//! `tally.exec.local-agg.adaptive.min-rows` input rows; when the ratio is above
//! `tally.exec.local-agg.adaptive.threshold` and no key holds more than 1 / P of the input, the
//! following mini-batches bypass it (rows go through the exchange to the global phases, which
//! apply them as raw rows), and after `tally.exec.local-agg.adaptive.probe-interval` bypassed rows
//! it is measured again. Decisions are taken between mini-batches, from row counts only, so a
//! given input and configuration always takes the same decisions. Results do not depend on them:
//! merging the fold of some rows equals applying the rows.

use crate::config::Config;
use crate::operator::metrics::LocalPhaseMetrics;

/// An Expand's sets are fed chunk by chunk while the local phase's last mini-batch emitted more
/// accumulator rows than this per row it folded: below it, a key's sets already fold into few
/// rows each, and the chunks' smaller slices only cost. Nexmark q15 (one day: 0.0002) pays 6 to
/// 8 % more instructions for chunks; q16 (10,004 keys: near 0.2 chunked) runs twice as fast with
/// them (BENCHMARKS.md, eleventh pass).
const CHUNKED_SETS_MIN_RATIO: f64 = 0.01;

/// The adaptive local phase's state machine (see the module docs).
#[derive(Debug, Clone, Default)]
pub(crate) struct Adaptive {
    /// What it measured and decided.
    pub(crate) m: LocalPhaseMetrics,
    /// `tally.exec.local-agg.adaptive.threshold`.
    threshold: f64,
    /// The group sets of an Expand the phase folds together (1 without one,
    /// [`Adaptive::fold_sets`]).
    sets: usize,
    /// The last mini-batch's accumulator rows per row folded (none before the first that
    /// folded), measured whether or not the phase adapts ([`Adaptive::chunks_sets`]).
    last_fold_ratio: Option<f64>,
    min_rows: u64,
    probe_interval: u64,
    window_in: u64,
    window_out: u64,
    /// The accumulator rows alone of `window_out`.
    window_rows: u64,
    window_hot_share: f64,
    since_bypass: u64,
    workers: usize,
}

impl Adaptive {
    pub(crate) fn new(config: &Config, workers: usize) -> Self {
        Self {
            m: LocalPhaseMetrics {
                adaptive: config.adaptive_local,
                ..LocalPhaseMetrics::default()
            },
            threshold: config.adaptive_threshold,
            sets: 1,
            min_rows: config.adaptive_min_rows,
            probe_interval: config.adaptive_probe_interval,
            workers,
            ..Self::default()
        }
    }

    /// The local phase folds the `sets` group sets of an Expand together (a split PARTIAL whose
    /// workers merge the buckets, fed each input chunk's sets in turn): its input is every input
    /// row once per set, so that what it hands on per row folded is diluted by the sets, and
    /// what bypassing it costs depends on its keys ([`Adaptive::threshold_now`]).
    pub(crate) fn fold_sets(&mut self, sets: usize) {
        self.sets = sets.max(1);
    }

    /// The threshold the last window's ratio is held against. Without an Expand, the option's.
    /// With `sets` sets folded together it depends on how many keys the rows fold into:
    /// - few (below [`CHUNKED_SETS_MIN_RATIO`] accumulator rows per row folded: a key's rows come
    ///   in long runs, which a bypassed phase's workers intern by comparing a row with the one
    ///   before): bypassing costs about what folding does, so what counts is what the phase
    ///   hands on per input row, `sets` times its ratio per row folded: the threshold divided by
    ///   `sets`. Nexmark q15 split at P = 1 (one day; 0.083 per row folded, three sets) runs
    ///   1.25-1.5x faster bypassed (BENCHMARKS.md, fifteenth pass);
    /// - many: each bypassed set row costs the workers a probe of a large key table where the
    ///   phase's own table finds it by position, so the threshold is multiplied by `sets`.
    ///   Nexmark q16 split at P = 1 (10,004 keys; 0.53 per row folded, four sets) runs faster
    ///   folding than bypassed (1.8x over 2M bids in the eleventh pass, 1.2-1.5x over 500k in
    ///   the fifteenth).
    fn threshold_now(&self) -> f64 {
        if self.sets == 1 {
            return self.threshold;
        }
        let rows = self.window_rows as f64 / self.window_in.max(1) as f64;
        if rows < CHUNKED_SETS_MIN_RATIO {
            self.threshold / self.sets as f64
        } else {
            self.threshold * self.sets as f64
        }
    }

    /// Whether an Expand's sets are worth feeding to a local phase that folds them together
    /// chunk of rows by chunk: while its last mini-batch emitted more than
    /// [`CHUNKED_SETS_MIN_RATIO`] accumulator rows per row folded (or before any).
    pub(crate) fn chunks_sets(&self) -> bool {
        self.last_fold_ratio
            .is_none_or(|r| r > CHUNKED_SETS_MIN_RATIO)
    }

    /// Accounts for a finished mini-batch: `folded` input rows became `out` accumulator rows
    /// whose DISTINCT lists carry `entries` (group, value) entries (the hottest key held
    /// `hot_share` of a local phase's input), and `bypassed` rows went around the local phase.
    ///
    /// The local phase is bypassed when its ratio, accumulator rows and DISTINCT entries out per
    /// row in, is above the threshold and no key holds more than a worker's fair share (1 / P) of
    /// its input: bypassing would send such a key's raw rows to one worker, which is the skew the
    /// local phase exists to remove. The entries count because the global phase merges each of
    /// them as it would apply a raw row's value: a local phase whose rows fold but whose DISTINCT
    /// values do not (a few keys, each with about a new value a row) hands on as much as it took.
    pub(crate) fn after_mini_batch(
        &mut self,
        folded: u64,
        out: u64,
        entries: u64,
        hot_share: f64,
        bypassed: u64,
    ) {
        self.m.rows_in += folded;
        self.m.rows_out += out;
        self.m.entries_out += entries;
        self.m.rows_bypassed += bypassed;
        if folded > 0 {
            self.last_fold_ratio = Some(out as f64 / folded as f64);
        }
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
        self.window_out += out + entries;
        self.window_rows += out;
        self.window_hot_share = self.window_hot_share.max(hot_share);
        if self.window_in >= self.min_rows {
            let ratio = self.window_out as f64 / self.window_in as f64;
            self.m.last_ratio = Some(ratio);
            self.m.last_hot_share = Some(self.window_hot_share);
            if ratio > self.threshold_now() && self.window_hot_share <= 1.0 / self.workers as f64 {
                self.m.bypassed = true;
                self.m.bypass_decisions += 1;
                self.since_bypass = 0;
            }
            self.window_in = 0;
            self.window_out = 0;
            self.window_rows = 0;
            self.window_hot_share = 0.0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        a.after_mini_batch(60, 59, 0, 0.01, 0);
        assert!(!a.m.bypassed && a.m.last_ratio.is_none());
        // A hot key over 1/4 of the input keeps the local phase, whatever the ratio.
        a.after_mini_batch(60, 59, 0, 0.3, 0);
        assert!(!a.m.bypassed);
        assert_eq!(a.m.last_hot_share, Some(0.3));
        // A low ratio keeps it too.
        a.after_mini_batch(100, 40, 0, 0.01, 0);
        assert!(!a.m.bypassed);
        assert_eq!(a.m.last_ratio, Some(0.4));
        // High ratio, no hot key: bypassed, until the probe interval has gone around it.
        a.after_mini_batch(100, 90, 0, 0.01, 0);
        assert!(a.m.bypassed);
        assert_eq!(a.m.bypass_decisions, 1);
        a.after_mini_batch(0, 0, 0, 0.0, 999);
        assert!(a.m.bypassed);
        a.after_mini_batch(0, 0, 0, 0.0, 1);
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
        off.after_mini_batch(1000, 1000, 0, 0.0, 0);
        assert!(!off.m.bypassed && off.m.last_ratio.is_none());
    }

    /// A phase with the default threshold (0.2), measured over `min_rows` rows, on `workers`
    /// workers, folding `sets` group sets together (1: no Expand).
    fn phase(min_rows: u64, workers: usize, sets: usize) -> Adaptive {
        let config = Config {
            adaptive_threshold: 0.2,
            adaptive_min_rows: min_rows,
            ..Config::default()
        };
        let mut a = Adaptive::new(&config, workers);
        if sets > 1 {
            a.fold_sets(sets);
        }
        a
    }

    /// Folding an Expand's sets together multiplies the threshold by the sets where the rows
    /// fold into many keys.
    #[test]
    fn folding_sets_together_scales_the_threshold() {
        let mut a = phase(100, 1, 4);
        // 0.7 is above 0.2 but under 0.2 x 4: the local phase keeps folding.
        a.after_mini_batch(100, 70, 0, 0.0, 0);
        assert!(!a.m.bypassed);
        a.after_mini_batch(100, 81, 0, 0.0, 0);
        assert!(a.m.bypassed);
        // Many sets: 0.2 x 9 = 1.8, past a ratio of rows alone; rows and DISTINCT entries
        // may reach it.
        let mut b = phase(100, 1, 9);
        b.after_mini_batch(100, 100, 0, 0.0, 0);
        assert!(!b.m.bypassed);
        b.after_mini_batch(100, 90, 95, 0.0, 0);
        assert!(b.m.bypassed);
    }

    /// Folding an Expand's sets into few keys (under 0.01 accumulator rows a row) divides the
    /// threshold by the sets: what counts is what the phase hands on per input row.
    #[test]
    fn sets_folding_into_few_keys_divide_the_threshold() {
        let mut a = phase(1000, 1, 4);
        // 5 rows and 40 entries per 1,000 rows folded: 0.045, under 0.2 / 4.
        a.after_mini_batch(1000, 5, 40, 1.0, 0);
        assert!(!a.m.bypassed);
        assert_eq!(a.m.last_ratio, Some(0.045));
        // 0.065: over it.
        a.after_mini_batch(1000, 5, 60, 1.0, 0);
        assert!(a.m.bypassed);
        // The same ratio over many keys (20 rows per 1,000) is held against 0.2 x 4.
        let mut many = phase(1000, 1, 4);
        many.after_mini_batch(1000, 20, 45, 1.0, 0);
        assert!(!many.m.bypassed);
        // Without sets, the option's threshold.
        let mut plain = phase(1000, 1, 1);
        plain.after_mini_batch(1000, 5, 60, 1.0, 0);
        assert!(!plain.m.bypassed);
        plain.after_mini_batch(1000, 5, 200, 1.0, 0);
        assert!(plain.m.bypassed);
    }

    /// A local phase whose rows fold into few accumulator rows, but whose DISTINCT lists carry
    /// about a value a row, hands on as much as it takes: it steps aside (without a hot key).
    #[test]
    fn distinct_entries_count_as_handed_on() {
        let mut a = phase(100, 2, 1);
        // Rows alone: 5 per 100, folding.
        a.after_mini_batch(100, 5, 0, 0.3, 0);
        assert!(!a.m.bypassed);
        assert_eq!(a.m.last_ratio, Some(0.05));
        // The same rows with 90 entries: 0.95 handed on per row.
        a.after_mini_batch(100, 5, 90, 0.3, 0);
        assert!(a.m.bypassed);
        assert_eq!(a.m.last_ratio, Some(0.95));
        assert_eq!((a.m.rows_out, a.m.entries_out), (10, 90));
        // A hot key past 1 / P keeps it folding whatever the entries.
        let mut hot = phase(100, 4, 1);
        hot.after_mini_batch(100, 5, 90, 0.3, 0);
        assert!(!hot.m.bypassed);
    }

    /// The sets go chunk by chunk before any mini-batch and while the last one that folded
    /// emitted more than 0.01 accumulator rows per row, whether or not the phase adapts.
    #[test]
    fn sets_go_in_chunks_while_they_fold_into_many_rows() {
        for adaptive in [true, false] {
            let config = Config {
                adaptive_local: adaptive,
                ..Config::default()
            };
            let mut a = Adaptive::new(&config, 2);
            assert!(a.chunks_sets());
            a.after_mini_batch(10_000, 5, 0, 0.0, 0);
            assert!(!a.chunks_sets(), "adaptive {adaptive}");
            // A mini-batch that folded nothing leaves the ratio as it was.
            a.after_mini_batch(0, 0, 0, 0.0, 100);
            assert!(!a.chunks_sets(), "adaptive {adaptive}");
            a.after_mini_batch(10_000, 2_000, 0, 0.0, 0);
            assert!(a.chunks_sets(), "adaptive {adaptive}");
        }
    }
}
