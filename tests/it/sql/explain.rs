//! `tally sql`'s EXPLAIN against the golden files in `tests/golden/`, and EXPLAIN ANALYZE and
//! `--metrics` with each stage's figures.

use std::path::Path;

use super::{ok, tally};

/// EXPLAIN output against the files in `tests/golden/` (`TALLY_UPDATE_GOLDEN=1` rewrites them).
#[test]
fn explain_golden_files() {
    // A fixed parallelism: the strategy section names the number of workers.
    let table = "SET 'table.exec.resource.default-parallelism' = '4'; \
                 CREATE TABLE orders (order_id BIGINT, shop STRING, user_id BIGINT, amount BIGINT, status STRING, ts TIMESTAMP(3)) \
                 WITH ('connector' = 'filesystem', 'path' = 'data/orders.parquet', 'format' = 'parquet');";
    let changelog_table = "SET 'table.exec.resource.default-parallelism' = '4'; CREATE TABLE orders (order_id BIGINT, shop STRING, user_id BIGINT, amount BIGINT, status STRING, ts TIMESTAMP(3)) \
                 WITH ('connector' = 'filesystem', 'path' = 'data/orders_changelog.parquet', 'format' = 'parquet', 'changelog-column' = 'op');";
    let query = "SELECT shop, COUNT(*) AS orders, SUM(amount) FILTER (WHERE status = 'PAID') AS paid, \
                 COUNT(DISTINCT user_id) AS buyers FROM orders GROUP BY shop";
    let mb = "SET 'table.exec.mini-batch.enabled' = 'true'; SET 'table.exec.mini-batch.allow-latency' = '1 s'; \
              SET 'table.exec.mini-batch.size' = '1000';";
    let cases = [
        (
            "one_phase_no_mini_batch",
            format!("{table} EXPLAIN {query};"),
        ),
        (
            "advice_mini_batch_off",
            format!("{table} EXPLAIN PLAN_ADVICE {query};"),
        ),
        (
            "two_phase_mini_batch",
            format!("{table} {mb} EXPLAIN PLAN_ADVICE {query};"),
        ),
        (
            "two_phase_avg_min_max_adaptive_off",
            format!(
                "{changelog_table} {mb} SET 'tally.exec.local-agg.adaptive.enabled' = 'false'; \
                 EXPLAIN SELECT status, AVG(amount) AS mean, MIN(amount) AS low, MAX(amount) FILTER (WHERE shop <> 'shop-0000') AS high, \
                 COUNT(DISTINCT user_id) AS buyers, SUM(DISTINCT amount) FILTER (WHERE amount > 10) AS distinct_sum FROM orders GROUP BY status;"
            ),
        ),
        (
            "split_two_phase",
            format!(
                "{table} {mb} SET 'table.optimizer.distinct-agg.split.enabled' = 'true'; \
                 EXPLAIN PLAN_ADVICE SELECT shop, COUNT(*) AS orders, COUNT(DISTINCT user_id) FILTER (WHERE status = 'PAID') AS payers, \
                 COUNT(DISTINCT amount) AS amounts, AVG(amount) AS mean FROM orders GROUP BY shop;"
            ),
        ),
        (
            "split_one_phase_single_argument",
            format!(
                "{table} SET 'table.optimizer.distinct-agg.split.enabled' = 'true'; \
                 SET 'table.optimizer.distinct-agg.split.bucket-num' = '16'; \
                 EXPLAIN SELECT shop, COUNT(DISTINCT user_id) AS buyers, SUM(amount) AS total FROM orders GROUP BY shop;"
            ),
        ),
        (
            "global_two_phase",
            format!("{table} {mb} EXPLAIN SELECT COUNT(*) AS n, SUM(amount) AS total FROM orders;"),
        ),
        (
            "advice_one_phase",
            format!(
                "{table} {mb} SET 'table.optimizer.agg-phase-strategy' = 'ONE_PHASE'; EXPLAIN PLAN_ADVICE {query};"
            ),
        ),
        (
            "advice_two_phase_without_mini_batch",
            format!(
                "{table} SET 'table.optimizer.agg-phase-strategy' = 'TWO_PHASE'; EXPLAIN PLAN_ADVICE {query};"
            ),
        ),
        (
            "split_without_distinct",
            format!(
                "{table} SET 'table.optimizer.distinct-agg.split.enabled' = 'true'; EXPLAIN PLAN_ADVICE SELECT shop, COUNT(*) FROM orders GROUP BY shop;"
            ),
        ),
        (
            "changelog_mode_nested",
            format!(
                "{changelog_table} {mb} EXPLAIN CHANGELOG_MODE SELECT orders, COUNT(*) AS shops FROM \
                 (SELECT shop, COUNT(*) AS orders FROM orders WHERE amount > 100 GROUP BY shop) GROUP BY orders;"
            ),
        ),
    ];
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let update = std::env::var_os("TALLY_UPDATE_GOLDEN").is_some();
    for (name, script) in cases {
        let out = ok(&script, &[]);
        let path = dir.join(format!("{name}.txt"));
        if update {
            std::fs::write(&path, &out).unwrap();
        }
        let want = std::fs::read_to_string(&path).unwrap_or_else(|_| {
            panic!("missing {}; run with TALLY_UPDATE_GOLDEN=1", path.display())
        });
        assert_eq!(out, want, "{name}");
    }
}

#[test]
fn explain_analyze_and_metrics_show_each_stage() {
    let table = "CREATE TABLE orders (order_id BIGINT, shop STRING, user_id BIGINT, amount BIGINT, status STRING, ts TIMESTAMP(3)) \
                 WITH ('connector' = 'filesystem', 'path' = 'data/orders.parquet', 'format' = 'parquet');";
    let mb = "SET 'table.exec.mini-batch.enabled' = 'true'; SET 'table.exec.mini-batch.allow-latency' = '1 s'; \
              SET 'table.exec.mini-batch.size' = '5000'; SET 'table.exec.resource.default-parallelism' = '3';";
    let query = "SELECT shop, COUNT(*) AS orders, SUM(amount) AS total FROM orders GROUP BY shop";
    let out = ok(&format!("{table} {mb} EXPLAIN ANALYZE {query};"), &[]);
    let plan_line = |name: &str| {
        out.lines()
            .find(|l| l.contains(&format!("{name}(")))
            .unwrap_or_else(|| panic!("no {name} in\n{out}"))
            .to_string()
    };
    let global = plan_line("GlobalGroupAggregate");
    assert!(global.contains("workers=[3]"), "{global}");
    assert!(global.contains("keyGroups=[128]"), "{global}");
    // The runtime that ran: the file split across the three workers.
    assert!(out.contains("Runtime: pipelined (3 splits)"), "{out}");
    assert!(out.contains("at most one task busy"), "{out}");
    assert!(global.contains("skew=["), "{global}");
    let local = plan_line("LocalGroupAggregate");
    assert!(local.contains("rows=[in 100000, out "), "{local}");
    assert!(local.contains("local=[active]"), "{local}");
    assert!(
        plan_line("Calc").contains("rows=[in 100000, out 100000]"),
        "{out}"
    );
    assert!(out.contains("== Metrics =="), "{out}");
    assert!(out.contains("rows read 100000"), "{out}");
    // The hot shop holds half of the bundled orders.
    let hot = out
        .lines()
        .find(|l| l.contains("hot keys (input rows): [shop-0000] "))
        .unwrap_or_else(|| panic!("{out}"));
    let n: u64 = hot
        .split("[shop-0000] ")
        .nth(1)
        .unwrap()
        .split(',')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!((45_000..55_000).contains(&n), "{hot}");
    assert_eq!(out.matches("  worker ").count(), 3, "{out}");

    // --metrics after a run, on standard error; ONE_PHASE has no local phase.
    let (code, _out, err) = tally(
        &format!("{table} {mb} SET 'table.optimizer.agg-phase-strategy' = 'ONE_PHASE'; {query};"),
        &["--metrics", "--emit", "final"],
    );
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("one-phase"), "{err}");
    assert!(err.contains("skew ratio"), "{err}");
    assert!(!err.contains("LocalGroupAggregate"), "{err}");
    assert!(
        err.contains("GroupAggregate        rows in       100000"),
        "{err}"
    );

    // A second ANALYZE is a syntax error, not a silent no-op.
    let (code, _, err) = tally(&format!("{table} EXPLAIN ANALYZE ANALYZE {query};"), &[]);
    assert_eq!(code, 1, "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}
