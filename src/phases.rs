//! The phase strategy decision, shared by the SQL planner and the library builder.
//!
//! As Flink decides it: an aggregate runs in two phases (a local phase per slice, an exchange of
//! accumulator rows, a global phase per worker) when mini-batch is on, the strategy
//! (`table.optimizer.agg-phase-strategy`) is not `ONE_PHASE`, every aggregate can merge (all of
//! Tally's can), and its input is not already partitioned by its group keys (an aggregate below
//! grouped by them). `AUTO` behaves as `TWO_PHASE`. A `TWO_PHASE` that cannot apply is a setting
//! with no effect, which the decision reports.

use crate::config::{
    ADAPTIVE_ENABLED, AGG_PHASE_STRATEGY, AggPhaseStrategy, Config, MINI_BATCH_ALLOW_LATENCY,
    MINI_BATCH_ENABLED, MINI_BATCH_SIZE,
};

/// How one aggregate runs, and the requested settings that had no effect on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PhaseDecision {
    /// Two phases (local and global); one phase otherwise.
    pub two_phase: bool,
    /// Settings that had no effect on this aggregate, as warnings.
    pub warnings: Vec<String>,
    /// Whether the input was already partitioned by the group keys.
    pub partitioned: bool,
}

impl PhaseDecision {
    /// What EXPLAIN says about the decision for the aggregate `label` on `workers` workers:
    /// how it runs and why.
    pub fn note(&self, label: &str, config: &Config, workers: usize) -> String {
        let strategy = config.agg_phase_strategy;
        let mut note = format!(
            "{label}: runs {} on {workers} worker{}. Requested '{AGG_PHASE_STRATEGY}' = '{}'",
            if self.two_phase {
                "TWO_PHASE"
            } else {
                "ONE_PHASE"
            },
            if workers == 1 { "" } else { "s" },
            strategy.name()
        );
        if self.partitioned {
            note.push_str("; the input is already partitioned by the group keys, so a local phase would not reduce the exchange (Flink keeps one phase too).");
        } else if self.two_phase {
            note.push_str(": each slice's LocalGroupAggregate folds its rows into one accumulator row per key, the exchange routes them to the worker owning their key group, each worker's GlobalGroupAggregate merges them.");
            if config.adaptive_local {
                note.push_str(&format!(
                    " Adaptive local phase: bypassed while its rows and DISTINCT entries out / rows in is above {} and no key holds more than 1/{workers} of its input (measured over {} rows, probed again after {} bypassed rows).",
                    config.adaptive_threshold,
                    config.adaptive_min_rows,
                    config.adaptive_probe_interval
                ));
            } else {
                note.push_str(&format!(
                    " Adaptive local phase off ('{ADAPTIVE_ENABLED}' = 'false')."
                ));
            }
        } else if strategy == AggPhaseStrategy::OnePhase {
            note.push_str(" (one phase, as requested).");
        } else if !config.mini_batch_enabled {
            note.push_str(&format!(
                "; two phases need mini-batch, and '{MINI_BATCH_ENABLED}' is false."
            ));
        }
        note
    }

    /// Flink's advice (its `GroupAggregationAnalyzer`) for an aggregate that runs in one phase
    /// for want of settings: what to set for two phases. None when it runs in two, or its input
    /// is partitioned.
    pub fn advice(&self, config: &Config) -> Option<String> {
        if self.two_phase || self.partitioned {
            return None;
        }
        let mut unmet = vec![];
        if config.agg_phase_strategy == AggPhaseStrategy::OnePhase {
            unmet.push(format!("'{AGG_PHASE_STRATEGY}' to 'AUTO'"));
        }
        if !config.mini_batch_enabled {
            unmet.push(format!("'{MINI_BATCH_ENABLED}' to 'true'"));
        }
        if config.mini_batch_allow_latency.as_millis() == 0 {
            unmet.push(format!(
                "'{MINI_BATCH_ALLOW_LATENCY}' to a positive long value"
            ));
        }
        if config.mini_batch_size <= 0 {
            unmet.push(format!("'{MINI_BATCH_SIZE}' to a positive long value"));
        }
        Some(format!(
            "You might want to enable local-global two-phase optimization by configuring ({}).",
            unmet.join(", ")
        ))
    }
}

/// Decides the phases of an aggregate under `config`, its input being `partitioned` by its
/// group keys or not; `label` names the aggregate in warnings (as EXPLAIN names it, which
/// depends on the decision).
pub fn decide(
    config: &Config,
    partitioned: bool,
    label: impl FnOnce(bool) -> String,
) -> PhaseDecision {
    let mini_batch = config.mini_batch_enabled;
    let strategy = config.agg_phase_strategy;
    let two_phase = mini_batch && strategy != AggPhaseStrategy::OnePhase && !partitioned;
    let label = label(two_phase);
    let mut warnings = vec![];
    if strategy == AggPhaseStrategy::TwoPhase && !mini_batch {
        warnings.push(format!(
            "'{AGG_PHASE_STRATEGY}' = 'TWO_PHASE' has no effect: two-phase aggregation needs mini-batch; set '{MINI_BATCH_ENABLED}' to 'true' with a positive '{MINI_BATCH_ALLOW_LATENCY}' and '{MINI_BATCH_SIZE}'"
        ));
    } else if strategy == AggPhaseStrategy::TwoPhase && partitioned {
        warnings.push(format!(
            "'{AGG_PHASE_STRATEGY}' = 'TWO_PHASE' has no effect on {label}: its input is already partitioned by its group keys (an aggregate below groups by them), so a local phase would not reduce the exchange (Flink keeps one phase too)"
        ));
    }
    PhaseDecision {
        two_phase,
        warnings,
        partitioned,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(pairs: &[(&str, &str)]) -> Config {
        Config::from_pairs(pairs.iter().copied()).unwrap()
    }

    #[test]
    fn two_phases_need_mini_batch_a_strategy_and_unpartitioned_input() {
        let mb = [
            (MINI_BATCH_ENABLED, "true"),
            (MINI_BATCH_ALLOW_LATENCY, "1 s"),
            (MINI_BATCH_SIZE, "10"),
        ];
        let auto = config(&mb);
        assert!(decide(&auto, false, |_| "a".into()).two_phase);
        assert!(decide(&auto, false, |_| "a".into()).warnings.is_empty());
        // Partitioned input under AUTO: one phase, and nothing was asked for.
        assert_eq!(
            decide(&auto, true, |_| "a".into()),
            PhaseDecision {
                two_phase: false,
                warnings: vec![],
                partitioned: true,
            }
        );
        let mut two = mb.to_vec();
        two.push((AGG_PHASE_STRATEGY, "TWO_PHASE"));
        let d = decide(&config(&two), true, |two| {
            assert!(!two);
            "GroupAggregate(groupBy=[c])".into()
        });
        assert!(!d.two_phase);
        assert!(d.warnings[0].contains("already partitioned"), "{d:?}");
        assert!(
            d.warnings[0].contains("GroupAggregate(groupBy=[c])"),
            "{d:?}"
        );
        let d = decide(&config(&[(AGG_PHASE_STRATEGY, "TWO_PHASE")]), false, |_| {
            "a".into()
        });
        assert!(
            !d.two_phase && d.warnings[0].contains("needs mini-batch"),
            "{d:?}"
        );
        let mut one = mb.to_vec();
        one.push((AGG_PHASE_STRATEGY, "ONE_PHASE"));
        assert!(!decide(&config(&one), false, |_| "a".into()).two_phase);
    }
}
