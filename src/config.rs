//! Configuration with Flink's option keys and defaults.
//!
//! A Flink user's settings carry over unchanged: the keys are Flink's
//! (`table.exec.mini-batch.enabled`, …), values are parsed as Flink parses them (durations such
//! as `5 s`, `200 ms`, `1 min`, or a bare number of milliseconds), and an inconsistent setting fails
//! with Flink's message. Options Flink lacks live under `tally.`. An unknown key or a bad value is
//! an error that names the key: no option is silently ignored.

use std::time::Duration;

use crate::error::{Error, Result};

/// Declares every option once: its key constant, its field (with its doc), its default, how a
/// value is parsed and how it is printed. From that one list come [`Config`], its `Default`,
/// [`KEYS`], [`Config::set`], [`Config::entries`] and [`Config::reset`].
macro_rules! options {
    ($(
        $(#[doc = $doc:literal])*
        $konst:ident = $key:literal => $field:ident: $ty:ty = $default:expr,
            parse $parse:expr, show $show:expr;
    )*) => {
        $(
            #[doc = concat!("`", $key, "`")]
            pub const $konst: &str = $key;
        )*

        /// Every key [`Config::set`] accepts.
        pub const KEYS: &[&str] = &[$($konst),*];

        /// The options Tally reads. Every field has Flink's default.
        #[derive(Debug, Clone, PartialEq)]
        pub struct Config {
            $(
                $(#[doc = $doc])*
                pub $field: $ty,
            )*
            /// The keys given to [`Config::set`] (and not reset since), so that a warning can
            /// tell a chosen value from a default ([`Config::is_set`]).
            pub(crate) explicit: std::collections::BTreeSet<&'static str>,
        }

        impl Default for Config {
            fn default() -> Self {
                Self {
                    $($field: $default,)*
                    explicit: std::collections::BTreeSet::new(),
                }
            }
        }

        impl Config {
            /// Parses `value` into the option `key`.
            fn set_value(&mut self, key: &str, value: &str) -> Result<()> {
                match key {
                    $($konst => self.$field = ($parse)(key, value)?,)*
                    _ => {
                        return Err(Error::config(
                            key,
                            format!("unknown option (known: {})", KEYS.join(", ")),
                        ));
                    }
                }
                Ok(())
            }

            /// Every option and its current value, in [`KEYS`] order, as `SET` would print
            /// them.
            pub fn entries(&self) -> Vec<(&'static str, String)> {
                vec![$(($konst, ($show)(&self.$field)),)*]
            }

            /// Resets one option to its default.
            ///
            /// # Errors
            /// An unknown key.
            pub fn reset(&mut self, key: &str) -> Result<()> {
                self.explicit.remove(key);
                let d = Config::default();
                match key {
                    $($konst => self.$field = d.$field,)*
                    _ => return Err(Error::config(key, "unknown option")),
                }
                Ok(())
            }
        }
    };
}

options! {
    /// `table.exec.mini-batch.enabled` (default `false`): buffer input rows and fold each key's
    /// changes into one output transition per mini-batch.
    MINI_BATCH_ENABLED = "table.exec.mini-batch.enabled" => mini_batch_enabled: bool = false,
        parse parse_bool, show show_value;
    /// `table.exec.mini-batch.allow-latency` (default `0 ms`): a mini-batch fires when this much
    /// clock time has passed. Must be positive when mini-batch is enabled.
    MINI_BATCH_ALLOW_LATENCY = "table.exec.mini-batch.allow-latency" => mini_batch_allow_latency: Duration = Duration::ZERO,
        parse parse_duration, show show_ms;
    /// `table.exec.mini-batch.size` (default `-1`): a mini-batch fires when this many input rows
    /// are buffered. Must be positive when mini-batch is enabled.
    MINI_BATCH_SIZE = "table.exec.mini-batch.size" => mini_batch_size: i64 = -1,
        parse parse_whole, show show_value;
    /// `table.exec.state.ttl` (default `0 ms` = never): a group whose state has not been written
    /// for this long (processing time, on the operator's clock) is dropped; a retraction for it is
    /// then ignored and its next accumulation starts a new group (`+I`). While a TTL is set, an
    /// update that leaves the values unchanged still emits `-U`/`+U` (Flink's FLINK-33936).
    STATE_TTL = "table.exec.state.ttl" => state_ttl: Duration = Duration::ZERO,
        parse parse_duration, show show_ms;
    /// `table.optimizer.agg-phase-strategy` (default `AUTO`).
    AGG_PHASE_STRATEGY = "table.optimizer.agg-phase-strategy" => agg_phase_strategy: AggPhaseStrategy = AggPhaseStrategy::Auto,
        parse parse_strategy, show |s: &AggPhaseStrategy| s.name().to_string();
    /// `table.optimizer.distinct-agg.split.enabled` (default `false`): split DISTINCT aggregates
    /// into a bucketed partial and a final aggregate.
    SPLIT_ENABLED = "table.optimizer.distinct-agg.split.enabled" => split_enabled: bool = false,
        parse parse_bool, show show_value;
    /// `table.optimizer.distinct-agg.split.bucket-num` (default 1024).
    SPLIT_BUCKET_NUM = "table.optimizer.distinct-agg.split.bucket-num" => split_bucket_num: u32 = 1024,
        parse parse_positive, show show_value;
    /// `tally.optimizer.distinct-agg.split.auto` (default `false`): Tally decides split-distinct
    /// per aggregate from the skew of its keys on a sample of the source, and picks the bucket
    /// count from the parallelism unless `table.optimizer.distinct-agg.split.bucket-num` is set
    /// (`table.optimizer.distinct-agg.split.enabled` then has no effect).
    SPLIT_AUTO = "tally.optimizer.distinct-agg.split.auto" => split_auto: bool = false,
        parse parse_bool, show show_value;
    /// `table.optimizer.incremental-agg-enabled` (default `true`): with split-distinct and two
    /// phases, the PARTIAL's global phase and the FINAL's local phase act as one
    /// `IncrementalGroupAggregate`: each firing of a PARTIAL worker becomes one delta accumulator
    /// row per key for the FINAL's global phase (Flink's incremental aggregate).
    INCREMENTAL_AGG = "table.optimizer.incremental-agg-enabled" => incremental_agg: bool = true,
        parse parse_bool, show show_value;
    /// `table.exec.resource.default-parallelism` (default: the available cores).
    DEFAULT_PARALLELISM = "table.exec.resource.default-parallelism" => parallelism: usize =
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        parse |k: &str, v: &str| parse_positive::<u32>(k, v).map(|p| p as usize), show show_value;
    /// `pipeline.max-parallelism` (default `-1`: Flink's rule, 1.5 x the parallelism rounded up to
    /// a power of two, at least 128): the number of key groups keyed state is partitioned into
    /// (`tally::operator::key_groups`); at least the parallelism, at most 32768.
    MAX_PARALLELISM = "pipeline.max-parallelism" => max_parallelism: i64 = -1,
        parse parse_max_parallelism, show show_value;
    /// `tally.strict` (default `false`): settings that would have no effect are errors instead
    /// of warnings.
    STRICT = "tally.strict" => strict: bool = false,
        parse parse_bool, show show_value;
    /// `tally.exec.emit.update-before` (default `true`): emit `-U` rows before `+U` rows. Turn off
    /// for upsert consumers keyed on the group key (the SQL planner keeps them where an aggregate
    /// feeds anything but the sink, as Flink decides from the sink).
    EMIT_UPDATE_BEFORE = "tally.exec.emit.update-before" => emit_update_before: bool = true,
        parse parse_bool, show show_value;
    /// `tally.exec.local-agg.adaptive.enabled` (default `true`): bypass a local phase that does
    /// not reduce its input (Flink has no such option).
    ADAPTIVE_ENABLED = "tally.exec.local-agg.adaptive.enabled" => adaptive_local: bool = true,
        parse parse_bool, show show_value;
    /// `tally.exec.local-agg.adaptive.threshold` (default `0.2`): the local phase is bypassed when
    /// what it hands on per row it takes (accumulator rows and the DISTINCT entries their lists
    /// carry, out / rows in) is above this and no key holds more than 1 / P of its input (a split
    /// PARTIAL's local phase that folds an Expand's sets together takes this divided by the sets
    /// where they fold into few keys, times the sets where into many).
    /// BENCHMARKS.md ("Adaptive local phase: the threshold") has the measurement behind the
    /// default.
    ADAPTIVE_THRESHOLD = "tally.exec.local-agg.adaptive.threshold" => adaptive_threshold: f64 = 0.2,
        parse parse_ratio, show show_value;
    /// `tally.exec.local-agg.adaptive.min-rows` (default 100000): input rows the local phase
    /// measures before it decides (BENCHMARKS.md, "Tuning constants").
    ADAPTIVE_MIN_ROWS = "tally.exec.local-agg.adaptive.min-rows" => adaptive_min_rows: u64 = 100_000,
        parse parse_positive, show show_value;
    /// `tally.exec.local-agg.adaptive.probe-interval` (default 1000000): input rows that bypass
    /// the local phase before it is measured again (BENCHMARKS.md, "Tuning constants").
    ADAPTIVE_PROBE_INTERVAL = "tally.exec.local-agg.adaptive.probe-interval" => adaptive_probe_interval: u64 = 1_000_000,
        parse parse_positive, show show_value;
    /// `tally.exec.pipelined` (default `true`): run an aggregate fed by a file source on the
    /// pipelined runtime (`tally::operator::pipelined`: the source split across the workers,
    /// mini-batches per worker, no barrier; a changelog in chunks applied in input order);
    /// `false` keeps the ordered runtime, which cuts mini-batches from the input stream as a
    /// whole. Replays and mini-batch off always run ordered.
    PIPELINED = "tally.exec.pipelined" => pipelined: bool = true,
        parse parse_bool, show show_value;
    /// `tally.exec.pipelined.splits-per-worker` (default 1): the pipelined runtime reads a file
    /// in this many splits per worker, and its P source threads take turns on them, the split
    /// furthest behind first (`tally::operator::pipelined`), so that a thread the machine slows
    /// down leaves no split behind at the end. More splits cost each thread the caches of the
    /// split it left: BENCHMARKS.md ("Splits that take turns") has the measurements behind the
    /// default.
    SPLITS_PER_WORKER = "tally.exec.pipelined.splits-per-worker" => splits_per_worker: u32 = 1,
        parse parse_positive, show show_value;
}

/// `table.optimizer.agg-phase-strategy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AggPhaseStrategy {
    /// Two-phase where it applies (in streaming, Flink does no cost comparison: AUTO is
    /// TWO_PHASE).
    Auto,
    /// Always one phase.
    OnePhase,
    /// Two phases where the aggregates allow it.
    TwoPhase,
}

impl AggPhaseStrategy {
    /// Flink's spelling.
    pub fn name(self) -> &'static str {
        match self {
            AggPhaseStrategy::Auto => "AUTO",
            AggPhaseStrategy::OnePhase => "ONE_PHASE",
            AggPhaseStrategy::TwoPhase => "TWO_PHASE",
        }
    }
}

/// The keys of the adaptive local phase's options.
pub const ADAPTIVE_KEYS: &[&str] = &[
    ADAPTIVE_ENABLED,
    ADAPTIVE_THRESHOLD,
    ADAPTIVE_MIN_ROWS,
    ADAPTIVE_PROBE_INTERVAL,
];

impl Config {
    /// A configuration from `(key, value)` pairs applied in order over the defaults, then
    /// validated.
    ///
    /// # Errors
    /// An unknown key, a bad value, or an inconsistent combination ([`Config::validate`]).
    ///
    /// # Examples
    /// ```
    /// use tally::Config;
    /// let c = Config::from_pairs([
    ///     ("table.exec.mini-batch.enabled", "true"),
    ///     ("table.exec.mini-batch.allow-latency", "5 s"),
    ///     ("table.exec.mini-batch.size", "5000"),
    /// ]).unwrap();
    /// assert_eq!(c.mini_batch_allow_latency.as_millis(), 5000);
    /// ```
    pub fn from_pairs<K: AsRef<str>, V: AsRef<str>>(
        pairs: impl IntoIterator<Item = (K, V)>,
    ) -> Result<Self> {
        let mut c = Config::default();
        for (k, v) in pairs {
            c.set(k.as_ref(), v.as_ref())?;
        }
        c.validate()?;
        Ok(c)
    }

    /// Sets one option from its string form.
    ///
    /// # Errors
    /// An unknown key or a value that does not parse; the error names the key.
    pub fn set(&mut self, key: &str, value: &str) -> Result<()> {
        self.set_value(key, value)?;
        if let Some(k) = KEYS.iter().find(|k| **k == key) {
            self.explicit.insert(k);
        }
        Ok(())
    }

    /// The current value of option `key` as [`Config::entries`] prints it.
    pub fn value(&self, key: &str) -> Option<String> {
        self.entries()
            .into_iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v)
    }

    /// Whether option `key` was chosen: given to [`Config::set`], or holding a value other than
    /// its default.
    pub fn is_set(&self, key: &str) -> bool {
        self.explicit.contains(key) || self.value(key) != Config::default().value(key)
    }

    /// Settings that have no effect whatever the query (each a warning, an error under
    /// `tally.strict`): a mini-batch size or latency while mini-batch is off, splits per worker
    /// off the pipelined runtime, a bucket number
    /// while split-distinct is off, a state TTL below the operator's 1 ms resolution.
    pub fn ineffective_settings(&self) -> Vec<String> {
        let mut out = vec![];
        let shown = |key: &str| self.value(key).unwrap_or_default();
        if !self.mini_batch_enabled {
            for key in [MINI_BATCH_SIZE, MINI_BATCH_ALLOW_LATENCY] {
                if self.is_set(key) {
                    out.push(format!(
                        "'{key}' = '{}' has no effect: '{MINI_BATCH_ENABLED}' is false",
                        shown(key)
                    ));
                }
            }
        }
        if !self.mini_batch_enabled && self.pipelined && self.is_set(PIPELINED) {
            out.push(format!(
                "'{PIPELINED}' = 'true' has no effect: '{MINI_BATCH_ENABLED}' is false, and without mini-batches rows are processed per record in input order (the ordered runtime)"
            ));
        }
        if (!self.mini_batch_enabled || !self.pipelined) && self.is_set(SPLITS_PER_WORKER) {
            out.push(format!(
                "'{SPLITS_PER_WORKER}' = '{}' has no effect: only the pipelined runtime reads splits ('{MINI_BATCH_ENABLED}' and '{PIPELINED}' true)",
                shown(SPLITS_PER_WORKER)
            ));
        }
        if self.split_auto && self.is_set(SPLIT_ENABLED) {
            out.push(format!(
                "'{SPLIT_ENABLED}' = '{}' has no effect: '{SPLIT_AUTO}' is true, so Tally decides split-distinct",
                shown(SPLIT_ENABLED)
            ));
        }
        for key in [SPLIT_BUCKET_NUM, INCREMENTAL_AGG] {
            if !self.split_enabled && !self.split_auto && self.is_set(key) {
                out.push(format!(
                    "'{key}' = '{}' has no effect: '{SPLIT_ENABLED}' is false",
                    shown(key)
                ));
            }
        }
        if !self.state_ttl.is_zero() && self.state_ttl.as_millis() == 0 {
            let ns = self.state_ttl.as_nanos();
            let ttl = if ns.is_multiple_of(1000) {
                format!("{} us", ns / 1000)
            } else {
                format!("{ns} ns")
            };
            out.push(format!(
                "'{STATE_TTL}' = '{ttl}' has no effect: it is below the state's 1 ms resolution, so state never expires (Flink keeps TTLs in whole milliseconds too)"
            ));
        }
        out
    }

    /// The warning for the adaptive local phase's options set where no local phase runs, if
    /// any was set.
    pub fn adaptive_without_local_phase(&self) -> Option<String> {
        let set: Vec<String> = ADAPTIVE_KEYS
            .iter()
            .filter(|k| self.is_set(k))
            .map(|k| format!("'{k}'"))
            .collect();
        (!set.is_empty()).then(|| {
            format!(
                "{} {} no effect: no local phase runs (two-phase aggregation needs mini-batch and '{AGG_PHASE_STRATEGY}' other than ONE_PHASE)",
                set.join(", "),
                if set.len() == 1 { "has" } else { "have" }
            )
        })
    }

    /// Checks that the options fit together, with Flink's messages: enabling mini-batch needs a
    /// positive latency (checked first, as Flink's optimizer does) and a positive size.
    ///
    /// # Errors
    /// The first inconsistency found.
    pub fn validate(&self) -> Result<()> {
        if self.mini_batch_enabled {
            if self.mini_batch_allow_latency.as_millis() == 0 {
                return Err(Error::config(
                    MINI_BATCH_ALLOW_LATENCY,
                    "MiniBatch Latency must be greater than 0 ms.",
                ));
            }
            if self.mini_batch_size <= 0 {
                return Err(Error::config(
                    MINI_BATCH_SIZE,
                    "Key: 'table.exec.mini-batch.size' , default: -1 (fallback keys: []) must be > 0.",
                ));
            }
        }
        Ok(())
    }
}

/// Reports settings that have no effect: under `tally.strict` the first is an error; otherwise
/// each is printed once per process on standard error (the library's equivalent of the
/// planner's PLAN_ADVICE warnings; callers also keep them to show).
///
/// # Errors
/// `tally.strict` and a warning.
pub(crate) fn report_warnings(config: &Config, warnings: &[String]) -> Result<()> {
    static PRINTED: std::sync::Mutex<std::collections::BTreeSet<String>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    if let Some(w) = warnings.first()
        && config.strict
    {
        return Err(strict_error(w));
    }
    let mut printed = PRINTED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for w in warnings {
        if printed.insert(w.clone()) {
            eprintln!("warning: {w}");
        }
    }
    Ok(())
}

/// The error a warning becomes under `tally.strict`.
pub(crate) fn strict_error(warning: &str) -> Error {
    Error::config(
        STRICT,
        format!("{warning} (tally.strict = true turns this warning into an error)"),
    )
}

fn show_value(v: &impl ToString) -> String {
    v.to_string()
}

fn show_ms(d: &Duration) -> String {
    format!("{} ms", d.as_millis())
}

fn parse_whole(key: &str, value: &str) -> Result<i64> {
    value
        .trim()
        .parse()
        .map_err(|_| Error::config(key, format!("'{value}' is not a whole number")))
}

fn parse_max_parallelism(key: &str, value: &str) -> Result<i64> {
    match parse_whole(key, value)? {
        v @ (-1 | 1..=32768) => Ok(v),
        _ => Err(Error::config(
            key,
            format!("'{value}' is not -1 (the default) or a whole number from 1 to 32768"),
        )),
    }
}

fn parse_strategy(key: &str, value: &str) -> Result<AggPhaseStrategy> {
    match value.trim().to_ascii_uppercase().as_str() {
        "AUTO" => Ok(AggPhaseStrategy::Auto),
        "ONE_PHASE" => Ok(AggPhaseStrategy::OnePhase),
        "TWO_PHASE" => Ok(AggPhaseStrategy::TwoPhase),
        _ => Err(Error::config(
            key,
            format!("'{value}' is not one of AUTO, ONE_PHASE, TWO_PHASE"),
        )),
    }
}

fn parse_ratio(key: &str, value: &str) -> Result<f64> {
    match value.trim().parse::<f64>() {
        Ok(v) if v > 0.0 && v <= 1.0 => Ok(v),
        _ => Err(Error::config(
            key,
            format!("'{value}' is not a ratio in (0, 1]"),
        )),
    }
}

fn parse_positive<T: std::str::FromStr + PartialOrd + Default>(
    key: &str,
    value: &str,
) -> Result<T> {
    match value.trim().parse::<T>() {
        Ok(v) if v > T::default() => Ok(v),
        _ => Err(Error::config(
            key,
            format!("'{value}' is not a positive whole number"),
        )),
    }
}

fn parse_bool(key: &str, value: &str) -> Result<bool> {
    match value.trim().to_ascii_lowercase().as_str() {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(Error::config(
            key,
            format!("'{value}' is not a boolean (true or false)"),
        )),
    }
}

/// Parses a duration as Flink's `TimeUtils.parseDuration` does: a whole number, optional
/// whitespace, and an optional unit (`ns`, `us`/`µs`, `ms`, `s`, `min`/`m`, `h`, `d` and their
/// long forms); no unit means milliseconds.
///
/// # Errors
/// When the text is not of that form; the error names `key`.
pub fn parse_duration(key: &str, value: &str) -> Result<Duration> {
    let text = value.trim().to_ascii_lowercase();
    let digits_end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits_end);
    let bad = |why: &str| {
        Error::config(
            key,
            format!("'{value}' is not a duration ({why}; e.g. '5 s', '200 ms', '1 min')"),
        )
    };
    if number.is_empty() {
        return Err(bad("it does not start with a whole number"));
    }
    let n: u64 = number.parse().map_err(|_| bad("the number is too large"))?;
    let nanos_per: u64 = match unit.trim() {
        "" | "ms" | "milli" | "millis" | "millisecond" | "milliseconds" => 1_000_000,
        "ns" | "nano" | "nanos" | "nanosecond" | "nanoseconds" => 1,
        "us" | "µs" | "micro" | "micros" | "microsecond" | "microseconds" => 1_000,
        "s" | "sec" | "secs" | "second" | "seconds" => 1_000_000_000,
        "m" | "min" | "minute" | "minutes" => 60_000_000_000,
        "h" | "hour" | "hours" => 3_600_000_000_000,
        "d" | "day" | "days" => 86_400_000_000_000,
        _ => return Err(bad("unknown unit")),
    };
    let nanos = n
        .checked_mul(nanos_per)
        .ok_or_else(|| bad("the number is too large"))?;
    Ok(Duration::from_nanos(nanos))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_as_flink_writes_them() {
        let ms = |s: &str| parse_duration("k", s).unwrap().as_millis();
        assert_eq!(ms("5 s"), 5000);
        assert_eq!(ms("200 ms"), 200);
        assert_eq!(ms("1 min"), 60_000);
        assert_eq!(ms("5000"), 5000);
        assert_eq!(ms("2h"), 7_200_000);
        assert_eq!(ms(" 3 SECONDS "), 3000);
        for bad in ["", "s", "-1 s", "5 parsecs", "1.5 s"] {
            let e = parse_duration("k", bad).unwrap_err().to_string();
            assert!(e.contains("'k'"), "{e}");
        }
    }

    #[test]
    fn mini_batch_needs_latency_then_size() {
        let e = Config::from_pairs([(MINI_BATCH_ENABLED, "true")]).unwrap_err();
        assert!(
            e.to_string()
                .contains("MiniBatch Latency must be greater than 0 ms."),
            "{e}"
        );
        let e = Config::from_pairs([
            (MINI_BATCH_ENABLED, "true"),
            (MINI_BATCH_ALLOW_LATENCY, "1 s"),
        ])
        .unwrap_err();
        assert!(
            e.to_string().contains(
                "Key: 'table.exec.mini-batch.size' , default: -1 (fallback keys: []) must be > 0."
            ),
            "{e}"
        );
        let e = Config::from_pairs([
            (MINI_BATCH_ENABLED, "true"),
            (MINI_BATCH_ALLOW_LATENCY, "1 s"),
            (MINI_BATCH_SIZE, "-500"),
        ])
        .unwrap_err();
        assert!(e.to_string().contains("default: -1"), "{e}");
        // Disabled mini-batch does not care.
        Config::from_pairs([(MINI_BATCH_SIZE, "-5")]).unwrap();
    }

    #[test]
    fn unknown_keys_and_bad_values_name_the_key() {
        let e = Config::from_pairs([("table.exec.mini-batch.enable", "true")]).unwrap_err();
        assert!(
            e.to_string().contains("'table.exec.mini-batch.enable'"),
            "{e}"
        );
        let e = Config::from_pairs([(MINI_BATCH_ENABLED, "yes")]).unwrap_err();
        assert!(e.to_string().contains(MINI_BATCH_ENABLED), "{e}");
        let e = Config::from_pairs([(MINI_BATCH_SIZE, "lots")]).unwrap_err();
        assert!(e.to_string().contains(MINI_BATCH_SIZE), "{e}");
        assert!(e.is_user_error());
        for (k, bad) in [
            (AGG_PHASE_STRATEGY, "THREE_PHASE"),
            (SPLIT_BUCKET_NUM, "0"),
            (SPLIT_BUCKET_NUM, "-4"),
            (DEFAULT_PARALLELISM, "0"),
            (STRICT, "maybe"),
            (STATE_TTL, "soon"),
        ] {
            let e = Config::from_pairs([(k, bad)]).unwrap_err().to_string();
            assert!(e.contains(k) && e.contains(bad), "{e}");
        }
        let c = Config::from_pairs([(AGG_PHASE_STRATEGY, "two_phase"), (SPLIT_BUCKET_NUM, "16")])
            .unwrap();
        assert_eq!(c.agg_phase_strategy, AggPhaseStrategy::TwoPhase);
        assert_eq!(c.split_bucket_num, 16);
    }
}
