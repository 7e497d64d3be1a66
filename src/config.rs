//! Configuration with Flink's option keys and defaults.
//!
//! A Flink user's settings carry over unchanged: the keys are Flink's
//! (`table.exec.mini-batch.enabled`, …), values are parsed as Flink parses them (durations such
//! as `5 s`, `200 ms`, `1 min`, or a bare number of milliseconds), and an inconsistent setting fails
//! with Flink's message. Options Flink lacks live under `tally.`. An unknown key or a bad value is
//! an error that names the key: no option is silently ignored.

use std::time::Duration;

use crate::error::{Error, Result};

/// `table.exec.mini-batch.enabled`
pub const MINI_BATCH_ENABLED: &str = "table.exec.mini-batch.enabled";
/// `table.exec.mini-batch.allow-latency`
pub const MINI_BATCH_ALLOW_LATENCY: &str = "table.exec.mini-batch.allow-latency";
/// `table.exec.mini-batch.size`
pub const MINI_BATCH_SIZE: &str = "table.exec.mini-batch.size";
/// `table.exec.state.ttl`
pub const STATE_TTL: &str = "table.exec.state.ttl";
/// `table.optimizer.agg-phase-strategy`
pub const AGG_PHASE_STRATEGY: &str = "table.optimizer.agg-phase-strategy";
/// `table.optimizer.distinct-agg.split.enabled`
pub const SPLIT_ENABLED: &str = "table.optimizer.distinct-agg.split.enabled";
/// `table.optimizer.distinct-agg.split.bucket-num`
pub const SPLIT_BUCKET_NUM: &str = "table.optimizer.distinct-agg.split.bucket-num";
/// `table.exec.resource.default-parallelism`
pub const DEFAULT_PARALLELISM: &str = "table.exec.resource.default-parallelism";
/// `tally.strict`
pub const STRICT: &str = "tally.strict";
/// `tally.exec.emit.update-before`
pub const EMIT_UPDATE_BEFORE: &str = "tally.exec.emit.update-before";

/// `tally.exec.local-agg.adaptive.enabled`
pub const ADAPTIVE_ENABLED: &str = "tally.exec.local-agg.adaptive.enabled";
/// `tally.exec.local-agg.adaptive.threshold`
pub const ADAPTIVE_THRESHOLD: &str = "tally.exec.local-agg.adaptive.threshold";
/// `tally.exec.local-agg.adaptive.min-rows`
pub const ADAPTIVE_MIN_ROWS: &str = "tally.exec.local-agg.adaptive.min-rows";
/// `tally.exec.local-agg.adaptive.probe-interval`
pub const ADAPTIVE_PROBE_INTERVAL: &str = "tally.exec.local-agg.adaptive.probe-interval";

/// Every key [`Config::set`] accepts.
pub const KEYS: &[&str] = &[
    MINI_BATCH_ENABLED,
    MINI_BATCH_ALLOW_LATENCY,
    MINI_BATCH_SIZE,
    STATE_TTL,
    AGG_PHASE_STRATEGY,
    SPLIT_ENABLED,
    SPLIT_BUCKET_NUM,
    DEFAULT_PARALLELISM,
    STRICT,
    EMIT_UPDATE_BEFORE,
    ADAPTIVE_ENABLED,
    ADAPTIVE_THRESHOLD,
    ADAPTIVE_MIN_ROWS,
    ADAPTIVE_PROBE_INTERVAL,
];

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

/// The options Tally reads. Every field has Flink's default.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// `table.exec.mini-batch.enabled` (default `false`): buffer input rows and fold each key's
    /// changes into one output transition per mini-batch.
    pub mini_batch_enabled: bool,
    /// `table.exec.mini-batch.allow-latency` (default `0 ms`): a mini-batch fires when this much
    /// clock time has passed. Must be positive when mini-batch is enabled.
    pub mini_batch_allow_latency: Duration,
    /// `table.exec.mini-batch.size` (default `-1`): a mini-batch fires when this many input rows
    /// are buffered. Must be positive when mini-batch is enabled.
    pub mini_batch_size: i64,
    /// `table.exec.state.ttl` (default `0 ms` = never): a group whose state has not been written
    /// for this long (processing time, on the operator's clock) is dropped; a retraction for it is
    /// then ignored and its next accumulation starts a new group (`+I`). While a TTL is set, an
    /// update that leaves the values unchanged still emits `-U`/`+U` (Flink's FLINK-33936).
    pub state_ttl: Duration,
    /// `table.optimizer.agg-phase-strategy` (default `AUTO`).
    pub agg_phase_strategy: AggPhaseStrategy,
    /// `table.optimizer.distinct-agg.split.enabled` (default `false`): split DISTINCT aggregates
    /// into a bucketed partial and a final aggregate.
    pub split_enabled: bool,
    /// `table.optimizer.distinct-agg.split.bucket-num` (default 1024).
    pub split_bucket_num: u32,
    /// `table.exec.resource.default-parallelism` (default: the available cores).
    pub parallelism: usize,
    /// `tally.strict` (default `false`): settings that would have no effect are errors instead
    /// of warnings.
    pub strict: bool,
    /// `tally.exec.emit.update-before` (default `true`): emit `-U` rows before `+U` rows. Turn off
    /// for upsert consumers keyed on the group key (Flink decides this from the sink).
    pub emit_update_before: bool,
    /// `tally.exec.local-agg.adaptive.enabled` (default `true`): bypass a local phase that does
    /// not reduce its input (Flink has no such option).
    pub adaptive_local: bool,
    /// `tally.exec.local-agg.adaptive.threshold` (default `0.2`): the local phase is bypassed when
    /// its rows out / rows in is above this and no key holds more than 1 / P of its input.
    /// BENCHMARKS.md ("Adaptive local phase") has the measurement behind the default.
    pub adaptive_threshold: f64,
    /// `tally.exec.local-agg.adaptive.min-rows` (default 100000): input rows the local phase
    /// measures before it decides.
    pub adaptive_min_rows: u64,
    /// `tally.exec.local-agg.adaptive.probe-interval` (default 1000000): input rows that bypass
    /// the local phase before it is measured again.
    pub adaptive_probe_interval: u64,
    /// The keys given to [`Config::set`] (and not reset since), so that a warning can tell a
    /// chosen value from a default ([`Config::is_set`]).
    pub(crate) explicit: std::collections::BTreeSet<&'static str>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            mini_batch_enabled: false,
            mini_batch_allow_latency: Duration::ZERO,
            mini_batch_size: -1,
            state_ttl: Duration::ZERO,
            agg_phase_strategy: AggPhaseStrategy::Auto,
            split_enabled: false,
            split_bucket_num: 1024,
            parallelism: std::thread::available_parallelism().map_or(1, |n| n.get()),
            strict: false,
            emit_update_before: true,
            adaptive_local: true,
            adaptive_threshold: 0.2,
            adaptive_min_rows: 100_000,
            adaptive_probe_interval: 1_000_000,
            explicit: std::collections::BTreeSet::new(),
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

    fn set_value(&mut self, key: &str, value: &str) -> Result<()> {
        match key {
            MINI_BATCH_ENABLED => self.mini_batch_enabled = parse_bool(key, value)?,
            MINI_BATCH_ALLOW_LATENCY => self.mini_batch_allow_latency = parse_duration(key, value)?,
            MINI_BATCH_SIZE => {
                self.mini_batch_size = value
                    .trim()
                    .parse()
                    .map_err(|_| Error::config(key, format!("'{value}' is not a whole number")))?;
            }
            STATE_TTL => self.state_ttl = parse_duration(key, value)?,
            AGG_PHASE_STRATEGY => {
                self.agg_phase_strategy = match value.trim().to_ascii_uppercase().as_str() {
                    "AUTO" => AggPhaseStrategy::Auto,
                    "ONE_PHASE" => AggPhaseStrategy::OnePhase,
                    "TWO_PHASE" => AggPhaseStrategy::TwoPhase,
                    _ => {
                        return Err(Error::config(
                            key,
                            format!("'{value}' is not one of AUTO, ONE_PHASE, TWO_PHASE"),
                        ));
                    }
                }
            }
            SPLIT_ENABLED => self.split_enabled = parse_bool(key, value)?,
            SPLIT_BUCKET_NUM => {
                self.split_bucket_num = parse_positive(key, value)?;
            }
            DEFAULT_PARALLELISM => {
                self.parallelism = parse_positive::<u32>(key, value)? as usize;
            }
            STRICT => self.strict = parse_bool(key, value)?,
            EMIT_UPDATE_BEFORE => self.emit_update_before = parse_bool(key, value)?,
            ADAPTIVE_ENABLED => self.adaptive_local = parse_bool(key, value)?,
            ADAPTIVE_THRESHOLD => {
                self.adaptive_threshold = match value.trim().parse::<f64>() {
                    Ok(v) if v > 0.0 && v <= 1.0 => v,
                    _ => {
                        return Err(Error::config(
                            key,
                            format!("'{value}' is not a ratio in (0, 1]"),
                        ));
                    }
                }
            }
            ADAPTIVE_MIN_ROWS => self.adaptive_min_rows = parse_positive(key, value)?,
            ADAPTIVE_PROBE_INTERVAL => self.adaptive_probe_interval = parse_positive(key, value)?,
            _ => {
                return Err(Error::config(
                    key,
                    format!("unknown option (known: {})", KEYS.join(", ")),
                ));
            }
        }
        Ok(())
    }

    /// Every option and its current value, in [`KEYS`] order, as `SET` would print them.
    pub fn entries(&self) -> Vec<(&'static str, String)> {
        let ms = |d: Duration| format!("{} ms", d.as_millis());
        vec![
            (MINI_BATCH_ENABLED, self.mini_batch_enabled.to_string()),
            (MINI_BATCH_ALLOW_LATENCY, ms(self.mini_batch_allow_latency)),
            (MINI_BATCH_SIZE, self.mini_batch_size.to_string()),
            (STATE_TTL, ms(self.state_ttl)),
            (
                AGG_PHASE_STRATEGY,
                self.agg_phase_strategy.name().to_string(),
            ),
            (SPLIT_ENABLED, self.split_enabled.to_string()),
            (SPLIT_BUCKET_NUM, self.split_bucket_num.to_string()),
            (DEFAULT_PARALLELISM, self.parallelism.to_string()),
            (STRICT, self.strict.to_string()),
            (EMIT_UPDATE_BEFORE, self.emit_update_before.to_string()),
            (ADAPTIVE_ENABLED, self.adaptive_local.to_string()),
            (ADAPTIVE_THRESHOLD, self.adaptive_threshold.to_string()),
            (ADAPTIVE_MIN_ROWS, self.adaptive_min_rows.to_string()),
            (
                ADAPTIVE_PROBE_INTERVAL,
                self.adaptive_probe_interval.to_string(),
            ),
        ]
    }

    /// Resets one option to its default.
    ///
    /// # Errors
    /// An unknown key.
    pub fn reset(&mut self, key: &str) -> Result<()> {
        self.explicit.remove(key);
        let d = Config::default();
        match key {
            MINI_BATCH_ENABLED => self.mini_batch_enabled = d.mini_batch_enabled,
            MINI_BATCH_ALLOW_LATENCY => self.mini_batch_allow_latency = d.mini_batch_allow_latency,
            MINI_BATCH_SIZE => self.mini_batch_size = d.mini_batch_size,
            STATE_TTL => self.state_ttl = d.state_ttl,
            AGG_PHASE_STRATEGY => self.agg_phase_strategy = d.agg_phase_strategy,
            SPLIT_ENABLED => self.split_enabled = d.split_enabled,
            SPLIT_BUCKET_NUM => self.split_bucket_num = d.split_bucket_num,
            DEFAULT_PARALLELISM => self.parallelism = d.parallelism,
            STRICT => self.strict = d.strict,
            EMIT_UPDATE_BEFORE => self.emit_update_before = d.emit_update_before,
            ADAPTIVE_ENABLED => self.adaptive_local = d.adaptive_local,
            ADAPTIVE_THRESHOLD => self.adaptive_threshold = d.adaptive_threshold,
            ADAPTIVE_MIN_ROWS => self.adaptive_min_rows = d.adaptive_min_rows,
            ADAPTIVE_PROBE_INTERVAL => self.adaptive_probe_interval = d.adaptive_probe_interval,
            _ => return Err(Error::config(key, "unknown option")),
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
    /// `tally.strict`): a mini-batch size or latency while mini-batch is off, a bucket number
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
        if !self.split_enabled && self.is_set(SPLIT_BUCKET_NUM) {
            out.push(format!(
                "'{SPLIT_BUCKET_NUM}' = '{}' has no effect: '{SPLIT_ENABLED}' is false",
                shown(SPLIT_BUCKET_NUM)
            ));
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
