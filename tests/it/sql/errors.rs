//! `tally sql`'s errors and warnings: bad settings, queries, command lines and input files are
//! one-line errors, and settings without effect warn once (errors under `tally.strict`).

use std::path::Path;
use std::process::Command;

use super::{
    BIN, CSV_QUERY, MINI_BATCH, csv_reference, csv_rows, csv_stream, csv_table, ok, scratch, tally,
    write_csv,
};

#[test]
fn user_errors_exit_nonzero_with_one_line() {
    let dir = scratch("errors");
    let path = dir.join("t.csv");
    write_csv(&path, &csv_stream(false));
    let table = csv_table(&path, false);
    let cases: Vec<(String, &str)> = vec![
        ("SET 'table.exec.mini-batch.enable' = 'true';".into(), "'table.exec.mini-batch.enable'"),
        ("SET 'table.exec.mini-batch.size' = 'many';".into(), "table.exec.mini-batch.size"),
        ("SET 'table.exec.state.ttl' = 'forever';".into(), "table.exec.state.ttl"),
        ("SET 'table.optimizer.agg-phase-strategy' = 'THREE';".into(), "THREE"),
        (
            format!("{table} SET 'table.exec.mini-batch.enabled' = 'true'; {CSV_QUERY}"),
            "MiniBatch Latency must be greater than 0 ms.",
        ),
        (
            format!("{table} SET 'table.exec.mini-batch.enabled' = 'true'; SET 'table.exec.mini-batch.allow-latency' = '1 s'; {CSV_QUERY}"),
            "Key: 'table.exec.mini-batch.size' , default: -1 (fallback keys: []) must be > 0.",
        ),
        (format!("{table} SELECT k, COUNT(*) FROM nope GROUP BY k;"), "nope"),
        (format!("{table} SELECT k, SUM(missing) FROM t GROUP BY k;"), "missing"),
        (format!("{table} SELECT k, SUM(k) FROM t GROUP BY k;"), "SUM"),
        (format!("{table} SELECT k, COUNT(*) FROM t GROUP BY k ORDER BY k;"), "ORDER BY"),
        (format!("{table} SELEC k FROM t;"), "SELEC"),
        (format!("{table} SELECT k, COUNT(*) FROM t GROUP BY;"), "GROUP BY"),
        (
            "CREATE TABLE x (a INT) WITH ('connector' = 'filesystem', 'path' = '/nonexistent/x.csv', 'format' = 'csv'); \
             SELECT a, COUNT(*) FROM x GROUP BY a;".into(),
            "/nonexistent/x.csv",
        ),
        (
            format!(
                "CREATE TABLE x (k STRING, zzz INT) WITH ('connector' = 'filesystem', 'path' = '{}', 'format' = 'csv'); \
                 SELECT k, COUNT(*) FROM x GROUP BY k;",
                path.display()
            ),
            "'zzz'",
        ),
        (
            // The file's shop is a string: no silent NULLs from a cast that cannot read it.
            "CREATE TABLE x (order_id BIGINT, shop BIGINT) WITH ('connector' = 'filesystem', 'path' = 'data/orders.parquet', 'format' = 'parquet'); \
             SELECT shop, COUNT(*) FROM x GROUP BY shop;".into(),
            "column 'shop' holds Utf8 that cannot be read as Int64",
        ),
        (
            format!("{table} SET 'table.optimizer.agg-phase-strategy' = 'TWO_PHASE'; SET 'tally.strict' = 'true'; {CSV_QUERY}"),
            "TWO_PHASE",
        ),
        (
            format!("{table} SET 'table.optimizer.distinct-agg.split.enabled' = 'true'; SET 'tally.strict' = 'true'; SELECT k, COUNT(*) FROM t GROUP BY k;"),
            "no DISTINCT",
        ),
    ];
    for (script, needle) in cases {
        let (code, _, err) = tally(&script, &["--emit", "final"]);
        assert_eq!(code, 1, "{script}: {err}");
        assert_eq!(err.lines().count(), 1, "{script}: {err}");
        assert!(
            err.starts_with("error: ") && err.contains(needle),
            "{script}: {err}"
        );
    }
}

#[test]
fn warnings_are_printed_once_and_runs_continue() {
    let dir = scratch("warn");
    let path = dir.join("t.csv");
    let rows = csv_stream(false);
    write_csv(&path, &rows);
    let script = format!(
        "{} SET 'table.optimizer.agg-phase-strategy' = 'TWO_PHASE'; {CSV_QUERY} {CSV_QUERY}",
        csv_table(&path, false)
    );
    let (code, out, err) = tally(&script, &["--emit", "final", "--format", "csv"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(err.matches("warning:").count(), 1, "{err}");
    assert!(
        err.contains("TWO_PHASE") && err.contains("mini-batch"),
        "{err}"
    );
    assert_eq!(out.matches("k,n,paid,users").count(), 2);
}

#[test]
fn bad_command_lines_are_one_line_errors() {
    for args in [
        vec!["sql"],
        vec!["sql", "-e", "SELECT 1", "--emit", "everything"],
        vec!["sql", "-f", "/nonexistent/script.sql"],
        vec!["frobnicate"],
        // The argument a missing one is needed by is named.
        vec!["sql", "-e", "SELECT 1", "--checkpoint-every", "5"],
    ] {
        let out = Command::new(BIN).args(&args).output().unwrap();
        let err = String::from_utf8(out.stderr).unwrap();
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.starts_with("error"), "{args:?}: {err}");
        if args.contains(&"--checkpoint-every") {
            assert!(err.contains("--checkpoint-dir"), "{err}");
        }
    }
    let out = Command::new(BIN).arg("--help").output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8(out.stdout).unwrap().contains("sql"));
}

/// Malformed and truncated input files are one-line errors naming the table and file, never a
/// panic or a silent partial result.
#[test]
fn corrupt_and_malformed_files_are_one_line_errors() {
    let dir = scratch("corrupt");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let orders = std::fs::read(root.join("data/orders.parquet")).unwrap();
    let replay = std::fs::read(root.join("data/replay.arrow")).unwrap();
    let files: Vec<(&str, Vec<u8>)> = vec![
        ("truncated.parquet", orders[..orders.len() / 2].to_vec()),
        ("garbage.parquet", b"PAR1 this is not parquet".to_vec()),
        ("truncated.arrow", replay[..replay.len() / 3].to_vec()),
        ("empty.arrow", vec![]),
        ("badvalue.csv", b"k,v\na,1\nb,x\n".to_vec()),
        ("short.csv", b"k,v\na,1\nb\n".to_vec()),
        ("nullop.csv", b"op,k,v\n,a,1\n".to_vec()),
        ("badop.csv", b"op,k,v\n+I,a,1\n+X,b,2\n".to_vec()),
    ];
    for (name, bytes) in &files {
        std::fs::write(dir.join(name), bytes).unwrap();
    }
    let orders_cols = "order_id BIGINT, shop STRING, user_id BIGINT, amount BIGINT, status STRING, ts TIMESTAMP(3)";
    // (file, columns, format, extra table options, the query's key and value, what the error names)
    let cases = [
        ("truncated.parquet", orders_cols, "parquet", "", "shop", "truncated.parquet"),
        ("garbage.parquet", orders_cols, "parquet", "", "shop", "not a readable Parquet file"),
        ("truncated.arrow", orders_cols, "arrow", ", 'changelog-column' = 'op'", "shop", "truncated.arrow"),
        ("empty.arrow", orders_cols, "arrow", "", "shop", "empty.arrow"),
        ("badvalue.csv", "k STRING, v BIGINT", "csv", "", "k", "'x'"),
        ("short.csv", "k STRING, v BIGINT", "csv", "", "k", "number of fields"),
        ("nullop.csv", "k STRING, v BIGINT", "csv", ", 'changelog-column' = 'op'", "k", "NULL op"),
        ("badop.csv", "k STRING, v BIGINT", "csv", ", 'changelog-column' = 'op'", "k", "'+X'"),
    ]
    .map(|(file, cols, format, extra, key, needle)| {
        let script = format!(
            "CREATE TABLE t ({cols}) WITH ('connector' = 'filesystem', 'path' = '{}', 'format' = '{format}'{extra}); \
             SELECT {key}, COUNT(*) FROM t GROUP BY {key};",
            dir.join(file).display()
        );
        (script, needle)
    });
    for (script, needle) in cases {
        for emit in ["final", "changelog"] {
            let (code, out, err) = tally(&script, &["--emit", emit]);
            assert_eq!(code, 1, "{script}: {err}");
            assert_eq!(err.lines().count(), 1, "{script}: {err}");
            assert!(
                err.starts_with("error: ") && err.contains(needle),
                "{script}: {err}"
            );
            if emit == "final" {
                assert!(out.is_empty(), "{script}: a partial result {out}");
            }
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Each setting that has no effect is a warning, printed once on standard error and listed in
/// PLAN_ADVICE, and an error under `tally.strict`.
#[test]
fn settings_without_effect_warn_and_are_errors_when_strict() {
    let dir = scratch("no-ops");
    let path = dir.join("t.csv");
    write_csv(&path, &csv_stream(false));
    let table = csv_table(&path, false);
    let nested_same_key =
        "SELECT k, COUNT(*) AS m FROM (SELECT k, COUNT(*) AS c FROM t GROUP BY k) GROUP BY k;";
    let cases: Vec<(String, &str, &str)> = vec![
        (
            "SET 'table.exec.mini-batch.size' = '100';".into(),
            CSV_QUERY,
            "'table.exec.mini-batch.size' = '100' has no effect: 'table.exec.mini-batch.enabled' is false",
        ),
        (
            "SET 'table.exec.mini-batch.allow-latency' = '2 s';".into(),
            CSV_QUERY,
            "'table.exec.mini-batch.allow-latency' = '2000 ms' has no effect: 'table.exec.mini-batch.enabled' is false",
        ),
        (
            "SET 'table.optimizer.distinct-agg.split.bucket-num' = '16';".into(),
            CSV_QUERY,
            "'table.optimizer.distinct-agg.split.bucket-num' = '16' has no effect: 'table.optimizer.distinct-agg.split.enabled' is false",
        ),
        (
            format!(
                "{MINI_BATCH} SET 'table.optimizer.agg-phase-strategy' = 'ONE_PHASE'; SET 'tally.exec.local-agg.adaptive.threshold' = '0.5';"
            ),
            CSV_QUERY,
            "'tally.exec.local-agg.adaptive.threshold' has no effect: no local phase runs",
        ),
        (
            "SET 'tally.exec.local-agg.adaptive.enabled' = 'false';".into(),
            CSV_QUERY,
            "'tally.exec.local-agg.adaptive.enabled' has no effect: no local phase runs",
        ),
        (
            format!("{MINI_BATCH} SET 'table.optimizer.agg-phase-strategy' = 'TWO_PHASE';"),
            nested_same_key,
            "'table.optimizer.agg-phase-strategy' = 'TWO_PHASE' has no effect on GroupAggregate(groupBy=[k, c]): its input is already partitioned by its group keys",
        ),
        (
            "SET 'table.exec.state.ttl' = '500 us';".into(),
            CSV_QUERY,
            "'table.exec.state.ttl' = '500 us' has no effect: it is below the state's 1 ms resolution",
        ),
        (
            "SET 'table.optimizer.agg-phase-strategy' = 'TWO_PHASE';".into(),
            CSV_QUERY,
            "'table.optimizer.agg-phase-strategy' = 'TWO_PHASE' has no effect: two-phase aggregation needs mini-batch",
        ),
    ];
    for (settings, query, warning) in cases {
        let script = format!("{table} {settings} {query} {query}");
        let (code, out, err) = tally(&script, &["--emit", "final", "--format", "csv"]);
        assert_eq!(code, 0, "{settings}: {err}");
        assert_eq!(err.matches(warning).count(), 1, "{settings}: {err}");
        assert_eq!(
            err.lines().count(),
            1,
            "{settings}: one warning, once: {err}"
        );
        assert_eq!(
            out.lines().filter(|l| l.starts_with("k,")).count(),
            2,
            "{out}"
        );
        let advice = ok(
            &format!("{table} {settings} EXPLAIN PLAN_ADVICE {query}"),
            &[],
        );
        assert!(
            advice.contains(&format!("[WARNING] {warning}")),
            "{settings}: {advice}"
        );
        let (code, _, err) = tally(
            &format!("{table} {settings} SET 'tally.strict' = 'true'; {query}"),
            &[],
        );
        assert_eq!(code, 1, "{settings}: {err}");
        assert!(
            err.starts_with("error: ") && err.contains(warning) && err.contains("tally.strict"),
            "{settings}: {err}"
        );
    }
}

/// `(SELECT …)` is a query for the command line as for the session: two of them cannot share
/// one `--output` file (the second used to overwrite the first).
#[test]
fn parenthesized_queries_are_counted_as_queries() {
    let dir = scratch("paren");
    let path = dir.join("t.csv");
    write_csv(&path, &csv_stream(false));
    let table = csv_table(&path, false);
    let out_file = dir.join("out.csv");
    let output = out_file.to_str().unwrap();
    let q1 = "(SELECT k, COUNT(*) AS n FROM t GROUP BY k)";
    let q2 = "(SELECT k, SUM(v) AS s FROM t GROUP BY k)";
    let (code, _, err) = tally(
        &format!("{table} {q1}; {q2};"),
        &["--emit", "final", "--output", output],
    );
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("2 queries") && !out_file.exists(), "{err}");
    let (code, _, err) = tally(
        &format!("{table} {q1};"),
        &["--emit", "final", "--output", output],
    );
    assert_eq!(code, 0, "{err}");
    let written = std::fs::read_to_string(&out_file).unwrap();
    let expected: Vec<String> = csv_reference(&csv_stream(false))
        .iter()
        .map(|l| l.split(',').take(2).collect::<Vec<_>>().join(","))
        .collect();
    assert_eq!(csv_rows(&written), expected);
}
