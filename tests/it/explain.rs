//! An aggregate built through the library explains itself, without SQL: its steps as plan
//! nodes, the phase decision, the settings that had no effect, and a run's figures.

use datafusion_expr::{ExprFunctionExt, col, lit};
use tally::Config;
use tally::aggregates::{count, count_star, sum};
use tally::explain::{AggregateStep, ExplainDetail};

use crate::common::{kv_batch, kv_schema};

fn builder(pairs: &[(&str, &str)]) -> tally::GroupAggregateBuilder {
    tally::GroupAggregate::builder(kv_schema(false))
        .group_by([col("k")])
        .aggregate([
            count_star().alias("n"),
            sum(col("v"))
                .filter(col("v").gt(lit(1i64)))
                .build()
                .unwrap()
                .alias("big"),
            count(col("v")).distinct().build().unwrap().alias("values"),
        ])
        .config(Config::from_pairs(pairs.iter().copied()).unwrap())
}

#[test]
fn a_parallel_aggregate_explains_its_phases_and_a_run() {
    let mini_batch = [
        ("table.exec.mini-batch.enabled", "true"),
        ("table.exec.mini-batch.allow-latency", "1 s"),
        ("table.exec.mini-batch.size", "2"),
        ("table.exec.resource.default-parallelism", "2"),
    ];
    let mut agg = builder(&mini_batch).build_parallel().unwrap();
    let explain = agg.explain();
    let steps: Vec<_> = explain.nodes.iter().map(|n| n.step.map(|s| s.1)).collect();
    assert_eq!(
        steps,
        [
            Some(AggregateStep::Calc),
            Some(AggregateStep::LocalGroupAggregate),
            Some(AggregateStep::Exchange),
            Some(AggregateStep::GlobalGroupAggregate),
        ]
    );
    let text = explain.render(&[ExplainDetail::ChangelogMode], None);
    for needle in [
        "GlobalGroupAggregate(groupBy=[k], select=[k, COUNT(*) AS n, SUM(v) FILTER $f0 AS big, COUNT(DISTINCT v) AS values], changelogMode=[I,UB,UA])",
        "+- Exchange(distribution=[hash[k]], changelogMode=[I])",
        "Calc(select=[k, v, v > 1 AS $f0], changelogMode=[I])",
        "GlobalGroupAggregate: runs TWO_PHASE on 2 workers",
    ] {
        assert!(text.contains(needle), "{needle}\n{text}");
    }
    assert!(!text.contains("rows=["), "{text}");
    let schema = kv_schema(false);
    let mut out = agg
        .push(&kv_batch(
            &schema,
            &["+I a 1", "+I b 2", "+I a 3", "+I a 1", "+I b null"],
        ))
        .unwrap();
    out.extend(agg.finish().unwrap());
    let metrics = agg.metrics().unwrap();
    // COUNT(DISTINCT v): the pairs (a, 1), (a, 3), (b, 2) in the global phases (NULL is no
    // value), their bytes part of the state.
    assert_eq!(metrics.distinct_pairs, 3, "{metrics:?}");
    assert!(
        metrics.distinct_bytes > 0 && metrics.distinct_bytes <= metrics.state_bytes,
        "{metrics:?}"
    );
    assert!(
        metrics
            .to_string()
            .contains("DISTINCT: 3 (group, value) pairs"),
        "{metrics}"
    );
    let text = explain.render(&[], Some(std::slice::from_ref(&metrics)));
    assert!(text.contains("distinct=[3 pairs, "), "{text}");
    assert!(
        text.contains("Calc(select=[k, v, v > 1 AS $f0], rows=[in 5, out 5]"),
        "{text}"
    );
    assert!(text.contains("workers=[2]"), "{text}");
}

#[test]
fn one_phase_and_settings_without_effect_show_as_advice() {
    // TWO_PHASE without mini-batch: one phase, Flink's advice, and the warning.
    let agg = builder(&[
        ("table.optimizer.agg-phase-strategy", "TWO_PHASE"),
        ("table.exec.resource.default-parallelism", "3"),
    ])
    .build_parallel()
    .unwrap();
    let text = agg.explain().render(&[ExplainDetail::PlanAdvice], None);
    assert!(!text.contains("LocalGroupAggregate"), "{text}");
    assert!(
        text.contains("GroupAggregate(advice=[1, 2], groupBy=[k]"),
        "{text}"
    );
    assert!(text.contains("runs ONE_PHASE on 3 workers"), "{text}");
    assert!(
        text.contains(
            "advice[1]: [ADVICE] You might want to enable local-global two-phase optimization"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "advice[2]: [WARNING] 'table.optimizer.agg-phase-strategy' = 'TWO_PHASE' has no effect"
        ),
        "{text}"
    );
    // One worker: Calc and GroupAggregate, no exchange.
    let single = builder(&[]).build().unwrap().explain();
    let names: Vec<_> = single.nodes.iter().map(|n| n.name).collect();
    assert_eq!(names, ["Calc", "GroupAggregate"]);
}
