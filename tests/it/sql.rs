//! `tally sql` end to end: CSV and Parquet inputs, insert-only and changelog, nested aggregation,
//! FILTER and DISTINCT, configuration errors, and EXPLAIN golden files. Final results are
//! compared with a reference computed here from the same rows.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use arrow::array::{Array, AsArray, RecordBatchReader};
use arrow::datatypes::{Int64Type, TimestampMillisecondType};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

use crate::common::{live_orders, orders_changelog_expected};

const BIN: &str = env!("CARGO_BIN_EXE_tally");

/// A scratch directory for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tally-it-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs `tally sql -e SCRIPT ARGS…` from the repository root; returns (exit code, stdout, stderr).
fn tally(script: &str, args: &[&str]) -> (i32, String, String) {
    let mut all = vec!["-e", script];
    all.extend(args);
    crate::common::tally_command(&all)
}

/// Runs `tally sql -f FILE ARGS…` (a file of the repository), which must succeed; returns its
/// standard output.
fn ok_file(file: &str, args: &[&str]) -> String {
    let mut all = vec!["sql", "-f", file];
    all.extend(args);
    crate::common::tally_ok(&all)
}

/// Runs a script that must succeed and returns its standard output.
fn ok(script: &str, args: &[&str]) -> String {
    let (code, out, err) = tally(script, args);
    assert_eq!(code, 0, "stderr: {err}");
    out
}

/// Parses CSV output (header, then rows) into sorted lines without the header.
fn csv_rows(out: &str) -> Vec<String> {
    let mut rows: Vec<String> = out.lines().skip(1).map(str::to_string).collect();
    rows.sort();
    rows
}

fn opt(v: Option<i64>) -> String {
    v.map_or(String::new(), |v| v.to_string())
}

/// One generated row of the CSV tests: op, k, v, u, s.
type CsvRow = (&'static str, String, Option<i64>, i64, &'static str);

/// A deterministic changelog over a few keys: inserts, and deletes/updates of live rows.
fn csv_stream(changelog: bool) -> Vec<CsvRow> {
    let mut rows = vec![];
    let mut live: Vec<CsvRow> = vec![];
    let mut x: u64 = 12345;
    let mut next = || {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (x >> 33) as i64
    };
    for _ in 0..400 {
        let r = next() % 10;
        if changelog && !live.is_empty() && r < 3 {
            let i = (next() as usize) % live.len();
            let old = live.swap_remove(i);
            if r == 0 {
                rows.push(("-D", old.1, old.2, old.3, old.4));
            } else {
                let new = (
                    "+U",
                    old.1.clone(),
                    Some(next() % 50),
                    next() % 7,
                    ["PAID", "NEW"][(next() % 2) as usize],
                );
                rows.push(("-U", old.1, old.2, old.3, old.4));
                rows.push(new.clone());
                live.push(("+I", new.1, new.2, new.3, new.4));
            }
        } else {
            let k = if next() % 2 == 0 {
                "hot".to_string()
            } else {
                format!("k{}", next() % 5)
            };
            let v = (next() % 8 != 0).then(|| next() % 50 - 10);
            let row = (
                "+I",
                k,
                v,
                next() % 7,
                ["PAID", "NEW"][(next() % 2) as usize],
            );
            live.push(row.clone());
            rows.push(row);
        }
    }
    rows
}

/// The generated stream of [`csv_stream`] written to `DIR/t<changelog>.csv`.
fn csv_file(dir: &Path, changelog: bool) -> (Vec<CsvRow>, PathBuf) {
    let rows = csv_stream(changelog);
    let path = dir.join(format!("t{changelog}.csv"));
    write_csv(&path, &rows);
    (rows, path)
}

fn write_csv(path: &Path, rows: &[CsvRow]) {
    let mut s = String::from("s,op,k,v,u\n");
    for (op, k, v, u, st) in rows {
        s.push_str(&format!("{st},{op},{k},{},{u}\n", opt(*v)));
    }
    std::fs::write(path, s).unwrap();
}

/// The rows a changelog leaves: inserts minus what `-D`/`-U` rows retract.
fn live_rows(rows: &[CsvRow]) -> Vec<&CsvRow> {
    let mut live: Vec<&CsvRow> = vec![];
    for r in rows {
        if r.0 == "-D" || r.0 == "-U" {
            let i = live
                .iter()
                .position(|l| (&l.1, l.2, l.3, l.4) == (&r.1, r.2, r.3, r.4))
                .unwrap();
            live.swap_remove(i);
        } else {
            live.push(r);
        }
    }
    live
}

/// Reference: per key over the live rows, (count, sum(v) filter paid, count distinct u).
fn csv_reference(rows: &[CsvRow]) -> Vec<String> {
    let live = live_rows(rows);
    let mut groups: BTreeMap<&str, Vec<&CsvRow>> = BTreeMap::new();
    for r in live {
        groups.entry(r.1.as_str()).or_default().push(r);
    }
    groups
        .into_iter()
        .map(|(k, rs)| {
            let paid: Vec<i64> = rs
                .iter()
                .filter(|r| r.4 == "PAID")
                .filter_map(|r| r.2)
                .collect();
            let users: BTreeSet<i64> = rs.iter().map(|r| r.3).collect();
            let sum = (!paid.is_empty()).then(|| paid.iter().sum::<i64>());
            format!("{k},{},{},{}", rs.len(), opt(sum), users.len())
        })
        .collect()
}

fn csv_table(path: &Path, changelog: bool) -> String {
    format!(
        "CREATE TABLE t (k STRING, v BIGINT, u INT, s STRING) WITH ('connector' = 'filesystem', \
         'path' = '{}', 'format' = 'csv'{});",
        path.display(),
        if changelog {
            ", 'changelog-column' = 'op'"
        } else {
            ""
        }
    )
}

const CSV_QUERY: &str = "SELECT k, COUNT(*) AS n, SUM(v) FILTER (WHERE s = 'PAID') AS paid, \
                         COUNT(DISTINCT u) AS users FROM t GROUP BY k;";

const MINI_BATCH: &str = "SET 'table.exec.mini-batch.enabled' = 'true'; \
                          SET 'table.exec.mini-batch.allow-latency' = '1 s'; \
                          SET 'table.exec.mini-batch.size' = '7';";

#[test]
fn csv_insert_only_and_changelog_match_the_reference() {
    let dir = scratch("csv");
    for changelog in [false, true] {
        let (rows, path) = csv_file(&dir, changelog);
        let expected = csv_reference(&rows);
        for settings in ["", MINI_BATCH] {
            for batch in ["1", "13", "8192"] {
                let script = format!("{} {settings} {CSV_QUERY}", csv_table(&path, changelog));
                let out = ok(
                    &script,
                    &["--emit", "final", "--format", "csv", "--batch-size", batch],
                );
                assert_eq!(
                    csv_rows(&out),
                    expected,
                    "changelog {changelog} '{settings}' batch {batch}"
                );
            }
        }
    }
}

#[test]
fn changelog_output_applies_to_the_same_result() {
    let dir = scratch("changelog-out");
    let rows = csv_stream(true);
    let path = dir.join("t.csv");
    write_csv(&path, &rows);
    let out = ok(
        &format!("{} {CSV_QUERY}", csv_table(&path, true)),
        &["--format", "csv"],
    );
    // Apply the changelog as a multiset.
    let mut table: BTreeMap<String, i64> = BTreeMap::new();
    let mut lines = out.lines();
    assert_eq!(lines.next(), Some("op,k,n,paid,users"));
    for line in lines {
        let (op, row) = line.split_once(',').unwrap();
        let c = table.entry(row.to_string()).or_insert(0);
        match op {
            "+I" | "+U" => *c += 1,
            "-U" | "-D" => *c -= 1,
            other => panic!("op {other}"),
        }
    }
    let result: Vec<String> = table
        .into_iter()
        .filter(|(_, c)| *c != 0)
        .map(|(r, c)| {
            assert_eq!(c, 1);
            r
        })
        .collect();
    assert_eq!(result, csv_reference(&rows));
}

#[test]
fn nested_aggregation_consumes_the_inner_changelog() {
    let dir = scratch("nested");
    let rows = csv_stream(true);
    let path = dir.join("t.csv");
    write_csv(&path, &rows);
    // How many keys have each row count.
    let inner: BTreeMap<String, usize> = csv_reference(&rows)
        .iter()
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            (f[0].to_string(), f[1].parse().unwrap())
        })
        .collect();
    let mut expected: BTreeMap<usize, usize> = BTreeMap::new();
    for n in inner.values() {
        *expected.entry(*n).or_default() += 1;
    }
    let expected: Vec<String> = expected.iter().map(|(n, c)| format!("{n},{c}")).collect();
    for settings in ["", MINI_BATCH] {
        let script = format!(
            "{} {settings} SELECT n, COUNT(*) AS keys FROM (SELECT k, COUNT(*) AS n FROM t GROUP BY k) GROUP BY n;",
            csv_table(&path, true)
        );
        let out = ok(&script, &["--emit", "final", "--format", "csv"]);
        let mut got = csv_rows(&out);
        got.sort_by_key(|l| l.split(',').next().unwrap().parse::<usize>().unwrap());
        assert_eq!(got, expected, "'{settings}'");
    }
}

#[test]
fn parquet_orders_match_the_reference() {
    // Reference from the file itself.
    let file =
        std::fs::File::open(Path::new(env!("CARGO_MANIFEST_DIR")).join("data/orders.parquet"))
            .unwrap();
    let reader = ParquetRecordBatchReaderBuilder::try_new(file)
        .unwrap()
        .build()
        .unwrap();
    let schema = reader.schema();
    let idx = |n: &str| schema.index_of(n).unwrap();
    let mut groups: BTreeMap<String, (i64, i64, BTreeSet<i64>, Option<i64>)> = BTreeMap::new();
    let mut days: BTreeMap<(String, String), i64> = BTreeMap::new();
    for b in reader {
        let b = b.unwrap();
        let shop = b.column(idx("shop")).as_string::<i32>();
        let user = b.column(idx("user_id")).as_primitive::<Int64Type>();
        let amount = b.column(idx("amount")).as_primitive::<Int64Type>();
        let status = b.column(idx("status")).as_string::<i32>();
        let ts = b
            .column(idx("ts"))
            .as_primitive::<TimestampMillisecondType>();
        for i in 0..b.num_rows() {
            let g = groups.entry(shop.value(i).to_string()).or_default();
            g.0 += 1;
            if status.value(i) == "PAID" && amount.is_valid(i) {
                g.1 += amount.value(i);
            }
            g.2.insert(user.value(i));
            if amount.is_valid(i) {
                g.3 = Some(g.3.map_or(amount.value(i), |m: i64| m.max(amount.value(i))));
            }
            let day = chrono::DateTime::from_timestamp_millis(ts.value(i))
                .unwrap()
                .format("%Y-%m-%d")
                .to_string();
            *days.entry((shop.value(i).to_string(), day)).or_default() += 1;
        }
    }
    let expected: Vec<String> = groups
        .iter()
        .filter(|(_, g)| g.0 >= 1000)
        .map(|(k, g)| format!("{k},{},{},{},{}", g.0, g.1, g.2.len(), opt(g.3)))
        .collect();
    let out = ok_file("data/orders.sql", &["--emit", "final", "--format", "csv"]);
    // The script prints its EXPLAIN first; the CSV starts at the header.
    let csv = &out[out.find("shop,orders,paid,buyers,biggest").expect(&out)..];
    assert_eq!(csv_rows(csv), expected);

    // An expression key: per shop and day.
    let script = "CREATE TABLE o (shop STRING, ts TIMESTAMP(3)) WITH ('connector' = 'filesystem', \
                  'path' = 'data/orders.parquet', 'format' = 'parquet'); \
                  SELECT shop, DATE_FORMAT(ts, 'yyyy-MM-dd') AS day, COUNT(*) AS n FROM o \
                  GROUP BY shop, DATE_FORMAT(ts, 'yyyy-MM-dd');";
    let out = ok(script, &["--emit", "final", "--format", "csv"]);
    let expected: Vec<String> = days
        .iter()
        .map(|((s, d), n)| format!("{s},{d},{n}"))
        .collect();
    assert_eq!(csv_rows(&out), expected);
}

#[test]
fn where_having_case_cast_substring_mod() {
    let dir = scratch("exprs");
    let path = dir.join("e.csv");
    std::fs::write(
        &path,
        "name,qty,price\nalpha,3,1.5\nbeta,,2.0\nalpine,5,0.5\ngamma,7,3.25\nbeta,2,2.0\n",
    )
    .unwrap();
    let script = format!(
        "CREATE TABLE e (name STRING, qty INT, price DOUBLE) WITH ('connector' = 'filesystem', 'path' = '{}', 'format' = 'csv'); \
         SELECT SUBSTRING(name, 1, 2) AS p, \
                SUM(CASE WHEN MOD(qty, 2) = 1 THEN qty ELSE 0 END) AS odd_qty, \
                COUNT(qty) AS with_qty, \
                MAX(CAST(price * 100 AS BIGINT)) AS top_cents \
         FROM e WHERE name <> 'gamma' GROUP BY SUBSTRING(name, 1, 2) HAVING COUNT(*) > 1;",
        path.display()
    );
    let out = ok(&script, &["--emit", "final", "--format", "csv"]);
    // al: alpha(3, odd), alpine(5, odd) → 8, 2, 150; be: beta(NULL), beta(2) → 0, 1, 200.
    assert_eq!(csv_rows(&out), vec!["al,8,2,150", "be,0,1,200"]);
}

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
fn changelog_script_matches_the_reference() {
    let expected = orders_changelog_expected();
    let got = csv_rows(&ok_file(
        "data/orders_changelog.sql",
        &["--emit", "final", "--format", "csv"],
    ));
    assert!(!expected.is_empty());
    assert_eq!(got, expected);
}

/// With a time column the recorded time drives the mini-batch latency: replays are identical.
#[test]
fn replay_with_a_time_column_is_deterministic() {
    let script = "CREATE TABLE o (shop STRING, amount BIGINT, ts TIMESTAMP(3)) WITH ('connector' = 'filesystem', \
                  'path' = 'data/orders_changelog.parquet', 'format' = 'parquet', 'changelog-column' = 'op', 'time-column' = 'ts'); \
                  SET 'table.exec.mini-batch.enabled' = 'true'; SET 'table.exec.mini-batch.allow-latency' = '2 s'; \
                  SET 'table.exec.mini-batch.size' = '100000'; \
                  SELECT shop, COUNT(*) AS n, SUM(amount) AS total FROM o GROUP BY shop;";
    let first = ok(script, &["--format", "csv", "--batch-size", "500"]);
    let second = ok(script, &["--format", "csv", "--batch-size", "500"]);
    assert_eq!(first, second);
    // The latency trigger fired on recorded time: more than one mini-batch, so updates appear
    // (with size 100000 alone the whole file would be one mini-batch of inserts).
    assert!(
        first.lines().any(|l| l.starts_with("+U")),
        "{}",
        &first[..first.len().min(500)]
    );
    // And the result is the live rows' aggregate.
    let mut expected: BTreeMap<String, (i64, i64)> = BTreeMap::new();
    for (shop, amount, _, _) in live_orders("data/orders_changelog.parquet") {
        let e = expected.entry(shop).or_default();
        e.0 += 1;
        e.1 += amount.unwrap_or(0);
    }
    let expected: Vec<String> = expected
        .iter()
        .map(|(s, (n, t))| format!("{s},{n},{t}"))
        .collect();
    let out = ok(
        script,
        &["--emit", "final", "--format", "csv", "--batch-size", "500"],
    );
    assert_eq!(csv_rows(&out), expected);
}

/// Arrow IPC in, Parquet and Arrow out: the same rows as CSV.
#[test]
fn arrow_input_and_binary_outputs() {
    let dir = scratch("formats");
    let rows = csv_stream(true);
    let csv = dir.join("t.csv");
    write_csv(&csv, &rows);
    // Convert the CSV to an Arrow IPC file with tally itself.
    let ipc = dir.join("t.arrow");
    let script = format!(
        "CREATE TABLE t (s STRING, op STRING, k STRING, v BIGINT, u INT) WITH ('connector' = 'filesystem', 'path' = '{}', 'format' = 'csv'); \
         SELECT s, op, k, v, u FROM t;",
        csv.display()
    );
    ok(
        &script,
        &["--emit", "final", "--output", ipc.to_str().unwrap()],
    );
    let table = format!(
        "CREATE TABLE t (k STRING, v BIGINT, u INT, s STRING) WITH ('connector' = 'filesystem', 'path' = '{}', 'format' = 'arrow', 'changelog-column' = 'op');",
        ipc.display()
    );
    let expected = csv_reference(&rows);
    for (format, ext) in [("parquet", "parquet"), ("arrow", "arrow")] {
        let out = dir.join(format!("out.{ext}"));
        ok(
            &format!("{table} {CSV_QUERY}"),
            &[
                "--emit",
                "final",
                "--format",
                format,
                "--output",
                out.to_str().unwrap(),
            ],
        );
        // Read it back through tally as a table of that format.
        let back = format!(
            "CREATE TABLE r (k STRING, n BIGINT, paid BIGINT, users BIGINT) WITH ('connector' = 'filesystem', 'path' = '{}', 'format' = '{format}'); \
             SELECT k, n, paid, users FROM r;",
            out.display()
        );
        let text = ok(&back, &["--emit", "final", "--format", "csv"]);
        assert_eq!(csv_rows(&text), expected, "{format}");
    }
}

/// Empty CSV fields are NULL, strings included; a query without GROUP BY is a global aggregate.
#[test]
fn empty_csv_fields_are_null_and_global_aggregates() {
    let dir = scratch("nulls");
    let path = dir.join("n.csv");
    std::fs::write(&path, "k,v\na,1\n,2\nb,\n,\n").unwrap();
    let table = format!(
        "CREATE TABLE t (k STRING, v INT) WITH ('connector' = 'filesystem', 'path' = '{}', 'format' = 'csv');",
        path.display()
    );
    let out = ok(
        &format!(
            "{table} SELECT COUNT(*) AS n, COUNT(k) AS nk, COUNT(v) AS nv, MIN(k) AS mk, SUM(v) AS s FROM t;"
        ),
        &["--emit", "final", "--format", "csv"],
    );
    assert_eq!(csv_rows(&out), vec!["4,2,2,a,3"]);
    let out = ok(
        &format!("{table} SELECT k IS NULL AS missing, COUNT(*) AS n FROM t GROUP BY k IS NULL;"),
        &["--emit", "final", "--format", "csv"],
    );
    assert_eq!(csv_rows(&out), vec!["false,2", "true,2"]);
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

/// Without `-U` rows the final table is built by upserts on the group keys.
#[test]
fn final_table_without_update_before() {
    let dir = scratch("upsert");
    let rows = csv_stream(true);
    let path = dir.join("t.csv");
    write_csv(&path, &rows);
    let no_ub = "SET 'tally.exec.emit.update-before' = 'false';";
    let table = csv_table(&path, true);
    let out = ok(
        &format!("{table} {no_ub} {MINI_BATCH} {CSV_QUERY}"),
        &["--emit", "final", "--format", "csv"],
    );
    assert_eq!(csv_rows(&out), csv_reference(&rows));
    let changelog = ok(
        &format!("{table} {no_ub} {CSV_QUERY}"),
        &["--format", "csv"],
    );
    assert!(!changelog.lines().any(|l| l.starts_with("-U")));
    // Keys moved behind the values are found; keys dropped from the SELECT cannot be upserted.
    let out = ok(
        &format!("{table} {no_ub} SELECT COUNT(*) AS n, k FROM t GROUP BY k;"),
        &["--emit", "final", "--format", "csv"],
    );
    let expected: Vec<String> = csv_reference(&rows)
        .iter()
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            format!("{},{}", f[1], f[0])
        })
        .collect();
    let mut expected = expected;
    expected.sort();
    assert_eq!(csv_rows(&out), expected);
    // Without its keys in the SELECT, nothing could upsert the changes: the aggregate keeps
    // its -U rows (a warning says so) and the final table is the multiset of counts.
    let (code, out, err) = tally(
        &format!("{table} {no_ub} SELECT COUNT(*) AS n FROM t GROUP BY k;"),
        &["--emit", "final", "--format", "csv"],
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("has no effect on GroupAggregate(groupBy=[k])")
            && err.contains("without its group keys"),
        "{err}"
    );
    let mut counts: Vec<String> = csv_reference(&rows)
        .iter()
        .map(|l| l.split(',').nth(1).unwrap().to_string())
        .collect();
    counts.sort();
    assert_eq!(csv_rows(&out), counts);
}

/// `tally.exec.emit.update-before = false` drops `-U` rows only where the aggregate's changes go
/// straight to the sink; an aggregate feeding another one or a HAVING keeps them (Flink's
/// changelog-mode inference), which the plan shows and a warning says. The example:
/// both queries used to lose rows.
#[test]
fn update_before_is_dropped_only_where_the_sink_upserts() {
    let dir = scratch("ub-nested");
    let path = dir.join("t.csv");
    std::fs::write(&path, "k,v\na,1\na,2\nb,3\na,4\nb,5\n").unwrap();
    let table = format!(
        "CREATE TABLE t (k STRING, v BIGINT) WITH ('connector' = 'filesystem', 'path' = '{}', 'format' = 'csv');",
        path.display()
    );
    let no_ub = "SET 'tally.exec.emit.update-before' = 'false';";
    let nested =
        "SELECT c, COUNT(*) AS n FROM (SELECT k, COUNT(*) AS c FROM t GROUP BY k) GROUP BY c;";
    let having = "SELECT k, COUNT(*) AS c FROM t GROUP BY k HAVING COUNT(*) < 3;";
    for settings in ["", MINI_BATCH] {
        for (query, want) in [(nested, vec!["2,1", "3,1"]), (having, vec!["b,2"])] {
            let script = format!("{table} {no_ub} {settings} {query}");
            let (code, out, err) = tally(&script, &["--emit", "final", "--format", "csv"]);
            assert_eq!(code, 0, "{err}");
            assert_eq!(csv_rows(&out), want, "{query} {settings}");
            assert!(err.contains("which needs the -U rows"), "{err}");
            // The changelog applied as a multiset gives the same table.
            let changelog = ok(&script, &["--format", "csv"]);
            let mut table: BTreeMap<String, i64> = BTreeMap::new();
            for line in changelog.lines().skip(1) {
                let (op, row) = line.split_once(',').unwrap();
                let d = if op.starts_with('+') { 1 } else { -1 };
                *table.entry(row.to_string()).or_default() += d;
            }
            let rows: Vec<String> = table
                .into_iter()
                .filter(|(_, c)| *c != 0)
                .map(|(r, _)| r)
                .collect();
            assert_eq!(rows, want, "{query} {settings}: changelog");
        }
    }
    // EXPLAIN: the outer aggregate drops -U, the inner one keeps them, and says why.
    let out = ok(
        &format!("{table} {no_ub} EXPLAIN CHANGELOG_MODE, PLAN_ADVICE {nested}"),
        &[],
    );
    assert!(
        out.contains("groupBy=[c], select=[c, COUNT(*) AS n], changelogMode=[I,UA,D])"),
        "{out}"
    );
    assert!(
        out.contains("groupBy=[k], select=[k, COUNT(*) AS c], changelogMode=[I,UB,UA])"),
        "{out}"
    );
    assert!(
        out.contains(
            "GroupAggregate(groupBy=[k]): keeps its -U rows: its changes feed another aggregate"
        ),
        "{out}"
    );
    assert!(
        out.contains("GroupAggregate(groupBy=[c]): emits no -U rows"),
        "{out}"
    );
    // Under tally.strict, keeping -U where they were asked away is an error.
    let (code, _, err) = tally(
        &format!("{table} {no_ub} SET 'tally.strict' = 'true'; {having}"),
        &[],
    );
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("tally.exec.emit.update-before") && err.contains("HAVING"),
        "{err}"
    );
}

/// The bundled scripts' final tables are the same under every strategy: mini-batch off and on,
/// one and two phases, adaptive local phase on (with a threshold that bypasses it where no shop
/// holds more than a worker's share: on one worker, since the hot shop holds half the orders)
/// and off, small mini-batches, 1 and 3 workers (the oracle tests cover 1 to 4 on random
/// streams).
#[test]
fn every_strategy_gives_the_same_final_table() {
    let strategies: [&[(&str, &str)]; 6] = [
        &[("table.exec.mini-batch.enabled", "false")],
        &[("table.optimizer.agg-phase-strategy", "ONE_PHASE")],
        &[("table.optimizer.agg-phase-strategy", "TWO_PHASE")],
        &[("tally.exec.local-agg.adaptive.enabled", "false")],
        &[
            ("tally.exec.local-agg.adaptive.threshold", "0.005"),
            ("tally.exec.local-agg.adaptive.min-rows", "1000"),
            ("tally.exec.local-agg.adaptive.probe-interval", "20000"),
        ],
        &[("table.exec.mini-batch.size", "97")],
    ];
    for script in ["data/orders.sql", "data/orders_changelog.sql"] {
        let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(script))
            .unwrap()
            .lines()
            .filter(|l| !l.starts_with("--"))
            .collect::<Vec<_>>()
            .join("\n")
            .replace("EXPLAIN PLAN_ADVICE", "EXPLAIN");
        // Settings go just before the last statement (the query that runs).
        let at = text.trim_end().trim_end_matches(';').rfind(';').unwrap() + 1;
        // The CSV table follows the EXPLAIN text (which differs by strategy) after a blank line.
        let table = |out: &str| out.rsplit("\n\n").next().unwrap().to_string();
        let baseline = table(&ok(&text, &["--emit", "final", "--format", "csv"]));
        assert!(baseline.lines().count() > 2, "{baseline}");
        for workers in [1, 3] {
            for settings in strategies {
                let mut sets =
                    format!("SET 'table.exec.resource.default-parallelism' = '{workers}';\n");
                for (k, v) in settings {
                    sets.push_str(&format!("SET '{k}' = '{v}';\n"));
                }
                let script = format!("{}{sets}{}", &text[..at], &text[at..]);
                let (code, out, err) = tally(
                    &script,
                    &["--emit", "final", "--format", "csv", "--metrics"],
                );
                assert_eq!(code, 0, "{err}");
                assert_eq!(
                    table(&out),
                    baseline,
                    "{script}: {workers} workers, {settings:?}"
                );
                let bypasses: u64 = err
                    .split("bypass decisions ")
                    .skip(1)
                    .map(|t| t.split(',').next().unwrap().parse::<u64>().unwrap())
                    .sum();
                let bypassing = settings.iter().any(|s| s.1 == "0.005");
                if bypassing && workers == 1 {
                    assert!(bypasses > 0, "{script}: never bypassed\n{err}");
                } else if bypassing {
                    // The hot shop holds more than 1/3 of each slice: the local phase stays.
                    assert_eq!(bypasses, 0, "{script}\n{err}");
                }
            }
        }
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

/// Reference for [`SPLIT_QUERY`] over the live rows of `rows`.
fn split_reference(rows: &[CsvRow]) -> Vec<String> {
    let live = live_rows(rows);
    let mut groups: BTreeMap<&str, Vec<&CsvRow>> = BTreeMap::new();
    for r in &live {
        groups.entry(r.1.as_str()).or_default().push(r);
    }
    groups
        .into_iter()
        .map(|(k, rs)| {
            let users: BTreeSet<i64> = rs.iter().map(|r| r.3).collect();
            let payers: BTreeSet<i64> = rs.iter().filter(|r| r.4 == "PAID").map(|r| r.3).collect();
            let vs: Vec<i64> = rs.iter().filter_map(|r| r.2).collect();
            let distinct_v: BTreeSet<i64> = vs.iter().copied().collect();
            let positive: BTreeSet<i64> = distinct_v.iter().copied().filter(|&v| v > 0).collect();
            let dv = (!positive.is_empty()).then(|| positive.iter().sum::<i64>());
            let mean = (!vs.is_empty()).then(|| vs.iter().sum::<i64>() / vs.len() as i64);
            let lo = vs.iter().min().copied();
            let hi = rs.iter().map(|r| r.3).max().unwrap();
            format!(
                "{k},{},{},{},{},{},{},{},{hi}",
                rs.len(),
                users.len(),
                payers.len(),
                opt(dv),
                distinct_v.len(),
                opt(mean),
                opt(lo)
            )
        })
        .collect()
}

const SPLIT_QUERY: &str = "SELECT k, COUNT(*) AS n, COUNT(DISTINCT u) AS users, \
     COUNT(DISTINCT u) FILTER (WHERE s = 'PAID') AS payers, \
     SUM(DISTINCT v) FILTER (WHERE v > 0) AS dv, COUNT(DISTINCT v) AS nv, AVG(v) AS mean, \
     MIN(v) AS lo, MAX(u) AS hi FROM t GROUP BY k;";

/// The split-distinct invariant: two DISTINCT arguments (an Expand of three group sets), FILTERs,
/// AVG, MIN and MAX give the reference's final table with split on and off, bucket-num 1, 7 and
/// 1024, mini-batch off, one and two phases, 1, 2 and 4 workers, insert-only and changelog input.
#[test]
fn split_distinct_matches_the_reference() {
    let dir = scratch("split");
    for changelog in [false, true] {
        let (rows, path) = csv_file(&dir, changelog);
        let expected = split_reference(&rows);
        let table = csv_table(&path, changelog);
        let phases = [
            "",
            "SET 'table.optimizer.agg-phase-strategy' = 'ONE_PHASE';",
            "SET 'table.optimizer.agg-phase-strategy' = 'TWO_PHASE';",
        ];
        for (i, phase) in phases.iter().enumerate() {
            let mb = if i == 0 { "" } else { MINI_BATCH };
            for workers in [1, 2, 4] {
                for split in [
                    "false",
                    "1",
                    "7",
                    "1024",
                    "7 without the incremental aggregate",
                    "auto",
                ] {
                    let split_settings = match split {
                        "false" => String::new(),
                        "auto" => {
                            "SET 'tally.optimizer.distinct-agg.split.auto' = 'true';".to_string()
                        }
                        "7 without the incremental aggregate" => {
                            "SET 'table.optimizer.distinct-agg.split.enabled' = 'true'; \
                             SET 'table.optimizer.distinct-agg.split.bucket-num' = '7'; \
                             SET 'table.optimizer.incremental-agg-enabled' = 'false';"
                                .to_string()
                        }
                        n => format!(
                            "SET 'table.optimizer.distinct-agg.split.enabled' = 'true'; \
                             SET 'table.optimizer.distinct-agg.split.bucket-num' = '{n}';"
                        ),
                    };
                    let script = format!(
                        "SET 'table.exec.resource.default-parallelism' = '{workers}'; {table} \
                         {mb} {phase} {split_settings} {SPLIT_QUERY}"
                    );
                    let out = ok(&script, &["--emit", "final", "--format", "csv"]);
                    assert_eq!(
                        csv_rows(&out),
                        expected,
                        "changelog {changelog}, {phase} mini-batch {}, {workers} workers, split {split}",
                        !mb.is_empty()
                    );
                }
            }
        }
    }
}

/// A group key that is not a column (`CONCAT(k, '!')`) under split with an Expand: the Calc
/// before the Expand computes it once per input row (EXPLAIN shows it there, and the PARTIAL
/// grouped by its column), and the final table is the reference's with the key so computed,
/// split on and off, one and two phases, 1 and 3 workers, insert-only and changelog input.
#[test]
fn split_distinct_computes_an_expression_key_before_the_expand() {
    let dir = scratch("split-key");
    let query = SPLIT_QUERY
        .replacen("SELECT k,", "SELECT CONCAT(k, '!') AS k,", 1)
        .replace("GROUP BY k;", "GROUP BY CONCAT(k, '!');");
    for changelog in [false, true] {
        let (rows, path) = csv_file(&dir, changelog);
        let expected: Vec<String> = split_reference(&rows)
            .into_iter()
            .map(|r| r.replacen(',', "!,", 1))
            .collect();
        let table = csv_table(&path, changelog);
        for phase in ["ONE_PHASE", "TWO_PHASE"] {
            for workers in [1, 3] {
                for split in [false, true] {
                    let script = format!(
                        "SET 'table.exec.resource.default-parallelism' = '{workers}'; {table} \
                         {MINI_BATCH} SET 'table.optimizer.agg-phase-strategy' = '{phase}'; \
                         SET 'table.optimizer.distinct-agg.split.enabled' = '{split}'; \
                         SET 'table.optimizer.distinct-agg.split.bucket-num' = '7'; {query}"
                    );
                    let out = ok(&script, &["--emit", "final", "--format", "csv"]);
                    assert_eq!(
                        csv_rows(&out),
                        expected,
                        "changelog {changelog}, {phase}, {workers} workers, split {split}"
                    );
                }
            }
        }
    }
    let out = ok(
        &format!(
            "{} SET 'table.optimizer.distinct-agg.split.enabled' = 'true'; EXPLAIN {query}",
            csv_table(&dir.join("tfalse.csv"), false)
        ),
        &[],
    );
    for want in [
        "Calc(select=[v, u, CONCAT(k, '!') AS $f2, MOD(HASH_CODE(u), 1024) AS $f3",
        "GroupAggregate(groupBy=[$f2, $f3, $f4], partialFinalType=[PARTIAL]",
    ] {
        assert!(out.contains(want), "missing {want} in\n{out}");
    }
}

#[test]
fn split_distinct_explain_shows_partial_and_final() {
    let dir = scratch("split-explain");
    let path = dir.join("t.csv");
    write_csv(&path, &csv_stream(false));
    let out = ok(
        &format!(
            "SET 'table.exec.resource.default-parallelism' = '2'; {} \
             SET 'table.optimizer.distinct-agg.split.enabled' = 'true'; EXPLAIN {SPLIT_QUERY}",
            csv_table(&path, false)
        ),
        &[],
    );
    for want in [
        "GroupAggregate(groupBy=[k], partialFinalType=[FINAL], select=[k, $SUM0_RETRACT($p0) AS $q0",
        "GroupAggregate(groupBy=[k, $f3, $f4], partialFinalType=[PARTIAL]",
        "Exchange(distribution=[hash[k, $f3, $f4]])",
        // The columns the aggregate reads, the buckets, then the FILTER conditions (once per
        // input row, before the Expand; `s` only feeds a condition, so it stays behind).
        "Calc(select=[k, v, u, MOD(HASH_CODE(u), 1024) AS $f3, MOD(HASH_CODE(v), 1024) AS $f4, (s = 'PAID') AS $f5, (v > 0) AS $f6])",
        "($f5 AND ($e = 1)) IS TRUE AS $f9",
        "Expand(projects=[{",
        "IF(($q5_count = 0), null, ($q5_sum / $q5_count)) AS mean",
        "split-distinct applies",
    ] {
        assert!(out.contains(want), "missing {want} in\n{out}");
    }
    // Split requested where it cannot apply says why, once, as a warning.
    let (code, _, err) = tally(
        &format!(
            "{} SET 'table.optimizer.distinct-agg.split.enabled' = 'true'; SELECT k, COUNT(DISTINCT k) AS n FROM t GROUP BY k;",
            csv_table(&path, false)
        ),
        &["--emit", "final"],
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("its DISTINCT arguments are group keys"),
        "{err}"
    );
}

/// Nexmark q15 and q16 over generated bids: with split-distinct off and on (1 and 1024
/// buckets), one or two phases, 1 or 3 workers, the final tables match references computed from
/// the bids.
#[test]
fn nexmark_q15_q16_split_matches() {
    let dir = scratch("nexmark");
    let path = dir.join("bid.parquet");
    let mut bids = tally::datagen::NexmarkBids::new(0, 6000);
    let batches: Vec<_> = (0..2).map(|_| bids.next_batch()).collect();
    tally::datagen::write_file(&path, bids.schema(), batches.clone(), |_| {}).unwrap();
    let table = format!(
        "CREATE TABLE bid (auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING, \
         `dateTime` TIMESTAMP(3), extra STRING) WITH ('connector' = 'filesystem', 'path' = '{}', \
         'format' = 'parquet');",
        path.display()
    );
    let ranks = "COUNT(*) AS total_bids, COUNT(*) FILTER (WHERE price < 10000) AS rank1_bids, \
        COUNT(DISTINCT bidder) AS total_bidders, \
        COUNT(DISTINCT bidder) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_bidders, \
        COUNT(DISTINCT auction) AS total_auctions, \
        COUNT(DISTINCT auction) FILTER (WHERE price >= 1000000) AS rank3_auctions";
    let q15 = format!(
        "SELECT DATE_FORMAT(dateTime, 'yyyy-MM-dd') AS `day`, {ranks} FROM bid \
         GROUP BY DATE_FORMAT(dateTime, 'yyyy-MM-dd');"
    );
    let q16 = format!(
        "SELECT channel, DATE_FORMAT(dateTime, 'yyyy-MM-dd') AS `day`, \
         MAX(DATE_FORMAT(dateTime, 'HH:mm')) AS `minute`, {ranks} FROM bid \
         GROUP BY channel, DATE_FORMAT(dateTime, 'yyyy-MM-dd');"
    );
    // The references, row by row: q15 by day (all bids fall on one day), q16 by channel and
    // day, each with its minute (the latest HH:mm).
    #[derive(Default)]
    struct Ranks {
        minute: String,
        total: i64,
        rank1: i64,
        bidders: BTreeSet<i64>,
        rank2: BTreeSet<i64>,
        auctions: BTreeSet<i64>,
        rank3: BTreeSet<i64>,
    }
    impl Ranks {
        fn line(&self) -> String {
            format!(
                "{},{},{},{},{},{}",
                self.total,
                self.rank1,
                self.bidders.len(),
                self.rank2.len(),
                self.auctions.len(),
                self.rank3.len()
            )
        }
    }
    let mut by_day: BTreeMap<String, Ranks> = BTreeMap::new();
    let mut by_channel_day: BTreeMap<(String, String), Ranks> = BTreeMap::new();
    for b in &batches {
        let cols: Vec<_> = (0..3)
            .map(|i| b.column(i).as_primitive::<Int64Type>().clone())
            .collect();
        let channel = b.column(3).as_string::<i32>();
        let time = b.column(5).as_primitive::<TimestampMillisecondType>();
        for r in 0..b.num_rows() {
            let (auction, bidder, price) = (cols[0].value(r), cols[1].value(r), cols[2].value(r));
            let at = chrono::DateTime::from_timestamp_millis(time.value(r)).unwrap();
            let day = at.format("%Y-%m-%d").to_string();
            let minute = at.format("%H:%M").to_string();
            for ranks in [
                by_day.entry(day.clone()).or_default(),
                by_channel_day
                    .entry((channel.value(r).to_string(), day))
                    .or_default(),
            ] {
                ranks.minute = ranks.minute.clone().max(minute.clone());
                ranks.total += 1;
                ranks.rank1 += i64::from(price < 10000);
                ranks.bidders.insert(bidder);
                if (10000..1000000).contains(&price) {
                    ranks.rank2.insert(bidder);
                }
                ranks.auctions.insert(auction);
                if price >= 1000000 {
                    ranks.rank3.insert(auction);
                }
            }
        }
    }
    let q15_expected: Vec<String> = by_day
        .iter()
        .map(|(day, r)| format!("{day},{}", r.line()))
        .collect();
    assert_eq!(q15_expected.len(), 1, "all bids on one day");
    let mut q16_expected: Vec<String> = by_channel_day
        .iter()
        .map(|((channel, day), r)| format!("{channel},{day},{},{}", r.minute, r.line()))
        .collect();
    q16_expected.sort();
    assert!(q16_expected.len() > 10, "{q16_expected:?}");
    for (query, expected) in [(&q15, &q15_expected), (&q16, &q16_expected)] {
        let name = &query[..40];
        for workers in [1, 3] {
            for phase in ["ONE_PHASE", "TWO_PHASE"] {
                for split in ["false", "1", "1024"] {
                    let split_settings = match split {
                        "false" => String::new(),
                        n => format!(
                            "SET 'table.optimizer.distinct-agg.split.enabled' = 'true'; \
                             SET 'table.optimizer.distinct-agg.split.bucket-num' = '{n}';"
                        ),
                    };
                    let script = format!(
                        "SET 'table.exec.resource.default-parallelism' = '{workers}'; \
                         SET 'table.exec.mini-batch.enabled' = 'true'; \
                         SET 'table.exec.mini-batch.allow-latency' = '1 s'; \
                         SET 'table.exec.mini-batch.size' = '500'; \
                         SET 'table.optimizer.agg-phase-strategy' = '{phase}'; {split_settings} \
                         {table} {query}"
                    );
                    let rows = csv_rows(&ok(&script, &["--emit", "final", "--format", "csv"]));
                    assert_eq!(&rows, expected, "{name} {workers} {phase} split {split}");
                }
            }
        }
    }
}

/// The bundled recording (`data/replay.arrow`, driven by its recorded time): two replays give the
/// same changelog byte for byte, and the final table is `data/replay_expected.csv` (computed row by
/// row by `examples/gen_data.rs`) whatever the workers and phases.
#[test]
fn bundled_recording_replays_identically_and_matches_expected() {
    let expected = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("data/replay_expected.csv"),
    )
    .unwrap();
    let first = ok_file("data/replay.sql", &["--format", "csv"]);
    let second = ok_file("data/replay.sql", &["--format", "csv"]);
    assert!(first.lines().count() > 100, "{first}");
    assert_eq!(first, second, "two replays differ");
    // Paced at 100x its recorded speed (about 0.14 s here): the same changelog, since recorded
    // time drives the mini-batches, plus throughput and latency on standard error.
    let out = Command::new(BIN)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args([
            "sql",
            "-f",
            "data/replay.sql",
            "--format",
            "csv",
            "--replay-speed",
            "100",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(String::from_utf8(out.stdout).unwrap(), first);
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains("replay at 100x recorded speed: 20000 rows") && err.contains("latency p50"),
        "{err}"
    );
    let (code, _, err) = tally("SELECT 1;", &["--replay-speed", "0"]);
    assert_eq!(code, 1);
    assert!(err.contains("not 'max' or a speed from 0.001"), "{err}");
    assert_eq!(
        ok_file("data/replay.sql", &["--emit", "final", "--format", "csv"]),
        expected
    );
    let script =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("data/replay.sql"))
            .unwrap()
            .lines()
            .filter(|l| !l.starts_with("--"))
            .collect::<Vec<_>>()
            .join("\n");
    for settings in [
        "SET 'table.exec.resource.default-parallelism' = '3';",
        "SET 'table.exec.resource.default-parallelism' = '2'; SET 'table.optimizer.agg-phase-strategy' = 'ONE_PHASE';",
        "SET 'table.exec.mini-batch.enabled' = 'false';",
    ] {
        let out = ok(
            &format!("{settings} {script}"),
            &["--emit", "final", "--format", "csv"],
        );
        assert_eq!(out, expected, "{settings}");
    }
}

/// Parquet row groups decoded on several threads come back in file order: the same batches as
/// one reader's, for a changelog file with several row groups.
#[test]
fn parallel_parquet_decoding_keeps_file_order() {
    use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
    use tally::source::{FileTable, Format};
    let table = FileTable {
        name: "orders".into(),
        schema: std::sync::Arc::new(Schema::new(vec![
            Field::new("order_id", DataType::Int64, true),
            Field::new("shop", DataType::Utf8, true),
            Field::new("amount", DataType::Int64, true),
            Field::new("ts", DataType::Timestamp(TimeUnit::Millisecond, None), true),
        ])),
        path: Path::new(env!("CARGO_MANIFEST_DIR")).join("data/orders_changelog.parquet"),
        format: Format::Parquet,
        changelog_column: Some("op".into()),
        time_column: None,
        unread_columns: vec![],
        dictionary_columns: vec![],
    };
    let read = |decoders: usize, batch: usize| -> Vec<String> {
        table
            .open_with(batch, decoders)
            .unwrap()
            .prefetch(2, None)
            .flat_map(|b| {
                let b = b.unwrap();
                let rows =
                    arrow::util::pretty::pretty_format_batches(&[b.with_op_column().unwrap()])
                        .unwrap()
                        .to_string();
                rows.lines()
                    .skip(3)
                    .filter(|l| !l.starts_with('+'))
                    .map(str::to_string)
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    let one = read(1, 7000);
    assert_eq!(one.len(), 100_000);
    for decoders in [2, 3, 8] {
        assert!(
            read(decoders, 7000) == one,
            "{decoders} decoders changed the order"
        );
    }
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

/// Output columns carry Flink's names: an alias, a column's own name, else `EXPR$n` by the
/// position in the select list (duplicates get Calcite's suffixes). Queries that repeat an
/// expression, which DataFusion refused, run.
#[test]
fn output_columns_have_flinks_names() {
    let dir = scratch("names");
    let path = dir.join("t.csv");
    let rows = csv_stream(false);
    write_csv(&path, &rows);
    let table = csv_table(&path, false);
    let header = |query: &str| {
        let out = ok(
            &format!("{table} {query}"),
            &["--emit", "final", "--format", "csv"],
        );
        (out.lines().next().unwrap().to_string(), csv_rows(&out))
    };
    let (h, body) = header("SELECT COUNT(1), COUNT(1) FROM t;");
    assert_eq!(h, "EXPR$0,EXPR$1");
    assert_eq!(body, vec![format!("{0},{0}", rows.len())]);
    let (h, body) =
        header("SELECT k, SUM(v), SUM(v), MAX(v) + 1, MAX(v) AS m, t.k FROM t GROUP BY k;");
    assert_eq!(h, "k,EXPR$1,EXPR$2,EXPR$3,m,k0");
    assert_eq!(body.len(), csv_reference(&rows).len());
    for line in body {
        let f: Vec<&str> = line.split(',').collect();
        assert_eq!(f[1], f[2], "{line}");
        assert_eq!(f[0], f[5], "{line}");
    }
    // The changelog's header too, after its op column; nested queries name their columns alike.
    let out = ok(
        &format!(
            "{table} SELECT EXPR$1, COUNT(*) FROM (SELECT k, COUNT(*) FROM t GROUP BY k) GROUP BY EXPR$1;"
        ),
        &["--format", "csv"],
    );
    // `COUNT(*)` is `EXPR$1` by its position, taken by the column: Calcite's `EXPR$10`.
    assert_eq!(out.lines().next(), Some("op,EXPR$1,EXPR$10"), "{out}");
}

/// A replay's time column and speed are checked: a NULL time is a one-line error naming the row
/// (it used to make the replay wait for decades), and so are times too far apart to wait for
/// and speeds out of range (one used to panic); nothing hangs.
#[test]
fn replay_times_and_speeds_are_checked() {
    let dir = scratch("replay-times");
    let table = |path: &Path| {
        format!(
            "CREATE TABLE r (k STRING, t BIGINT) WITH ('connector' = 'filesystem', 'path' = '{}', \
             'format' = 'csv', 'time-column' = 't'); SELECT k, COUNT(*) AS n FROM r GROUP BY k;",
            path.display()
        )
    };
    let null_time = dir.join("null.csv");
    std::fs::write(&null_time, "k,t\na,1000\nb,1001\nc,\nd,1003\n").unwrap();
    let far = dir.join("far.csv");
    std::fs::write(&far, format!("k,t\na,{}\nb,{}\n", i64::MIN, i64::MAX)).unwrap();
    for (path, speed, needle) in [
        (
            &null_time,
            "1",
            "its time column 't' is NULL at row 3 of the input",
        ),
        (
            &null_time,
            "max",
            "its time column 't' is NULL at row 3 of the input",
        ),
        (&far, "1", "check the time column"),
        (&far, "1000000", "check the time column"),
    ] {
        let (code, _, err) = tally(
            &table(path),
            &["--replay-speed", speed, "--batch-size", "1"],
        );
        assert_eq!(code, 1, "{speed}: {err}");
        assert!(
            err.contains(needle) && err.lines().count() == 1,
            "{speed}: {err}"
        );
    }
    // Not replayed, the NULL time is as bad: the recorded time drives the clock.
    let (code, _, err) = tally(&table(&null_time), &[]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("NULL at row 3"), "{err}");
    for speed in ["1e-300", "0", "-2", "NaN", "inf", "1e9"] {
        let (code, _, err) = tally(&table(&far), &[&format!("--replay-speed={speed}")]);
        assert_eq!(code, 1, "{speed}: {err}");
        assert!(
            err.contains("is not 'max' or a speed from 0.001"),
            "{speed}: {err}"
        );
        assert_eq!(err.lines().count(), 1, "{speed}: {err}");
    }
}

/// DECIMAL SUM and AVG are NULL exactly when the exact sum overflows 38 digits (Flink's NULL on
/// overflow), under every strategy: split-distinct's partial sums (here two values of 6·10^35
/// share a bucket, whose sum alone overflows) carry the exact sum, so a bucket that overflows
/// does not lose its value when the whole sum fits.
#[test]
fn decimal_sums_are_null_exactly_on_overflow_under_every_strategy() {
    let dir = scratch("decimal");
    let path = dir.join("t.csv");
    let big = |digits: &str| format!("{digits}{}.00", "0".repeat(35));
    let rows = [
        ("a", big("5"), 1),
        ("a", big("5"), 1),
        ("b", big("6"), 1),
        ("b", big("7"), 1),
        ("b", format!("-{}", big("9")), 2),
        ("c", "1.25".to_string(), 1),
        ("c", "2.50".to_string(), 3),
    ];
    let mut text = String::from("k,d,u\n");
    for (k, d, u) in &rows {
        text.push_str(&format!("{k},{d},{u}\n"));
    }
    std::fs::write(&path, text).unwrap();
    let table = format!(
        "CREATE TABLE t (k STRING, d DECIMAL(38, 2), u INT) WITH ('connector' = 'filesystem', \
         'path' = '{}', 'format' = 'csv');",
        path.display()
    );
    let query = "SELECT k, SUM(d) AS s, AVG(d) AS a, COUNT(DISTINCT u) AS users FROM t GROUP BY k;";
    let expected = vec![
        // 10^36 does not fit DECIMAL(38, 2): NULL, and so is the AVG over that sum.
        "a,,,1".to_string(),
        // The sum fits; its mean, 1.33·10^35 with 6 decimals, does not fit DECIMAL(38, 6).
        format!("b,{},,2", big("4")),
        "c,3.75,1.875000,2".to_string(),
    ];
    for workers in [1, 2] {
        for mb in ["", MINI_BATCH] {
            for split in ["", "1", "4", "1024"] {
                let split = if split.is_empty() {
                    String::new()
                } else {
                    format!(
                        "SET 'table.optimizer.distinct-agg.split.enabled' = 'true'; \
                         SET 'table.optimizer.distinct-agg.split.bucket-num' = '{split}';"
                    )
                };
                let script = format!(
                    "SET 'table.exec.resource.default-parallelism' = '{workers}'; {table} {mb} {split} {query}"
                );
                let out = ok(&script, &["--emit", "final", "--format", "csv"]);
                assert_eq!(
                    csv_rows(&out),
                    expected,
                    "{workers} workers '{mb}' '{split}'"
                );
            }
        }
    }
}
