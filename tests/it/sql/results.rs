//! Final tables of `tally sql` against references computed from the same rows: CSV and Parquet
//! inputs, insert-only and changelog, nested aggregation, expressions and NULLs, output column
//! names, and the same table under every strategy.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use arrow::array::{Array, AsArray, RecordBatchReader};
use arrow::datatypes::{Int64Type, TimestampMillisecondType};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

use super::{
    CSV_QUERY, MINI_BATCH, csv_file, csv_reference, csv_rows, csv_stream, csv_table, live_rows, ok,
    ok_file, opt, scratch, tally, write_csv,
};
use crate::common::orders_changelog_expected;

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

/// Aggregates over a column and over a cast of it are two aggregates, as in Flink (DataFusion
/// names a cast by its operand, so they once collided: "duplicate unqualified field name"),
/// with the reference's results, insert-only and over a changelog, with and without
/// mini-batch and two phases.
#[test]
fn aggregates_over_a_column_and_its_cast_are_two() {
    let dir = scratch("casts");
    let query = "SELECT k, SUM(v) AS a, SUM(CAST(v AS DOUBLE)) AS b, MAX(v) AS m, \
                 MAX(CAST(v AS INT)) AS mi, COUNT(DISTINCT u) AS d, \
                 COUNT(DISTINCT CAST(u AS BIGINT)) AS dc FROM t GROUP BY k;";
    let two_phase = format!("{MINI_BATCH} SET 'table.optimizer.agg-phase-strategy' = 'TWO_PHASE';");
    for changelog in [false, true] {
        let (rows, path) = csv_file(&dir, changelog);
        let mut groups: BTreeMap<&str, Vec<_>> = BTreeMap::new();
        for r in live_rows(&rows) {
            groups.entry(r.1.as_str()).or_default().push(r);
        }
        let expected: Vec<String> = groups
            .into_iter()
            .map(|(k, rs)| {
                let vs: Vec<i64> = rs.iter().filter_map(|r| r.2).collect();
                let sum = (!vs.is_empty()).then(|| vs.iter().sum::<i64>());
                let max = vs.iter().max().copied();
                let users = rs.iter().map(|r| r.3).collect::<BTreeSet<_>>().len();
                let double = sum.map_or(String::new(), |s| format!("{:?}", s as f64));
                format!(
                    "{k},{},{double},{},{},{users},{users}",
                    opt(sum),
                    opt(max),
                    opt(max)
                )
            })
            .collect();
        for settings in ["", MINI_BATCH, two_phase.as_str()] {
            let script = format!("{} {settings} {query}", csv_table(&path, changelog));
            let out = ok(&script, &["--emit", "final", "--format", "csv"]);
            assert_eq!(
                csv_rows(&out),
                expected,
                "changelog {changelog} '{settings}'"
            );
        }
    }
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
fn changelog_script_matches_the_reference() {
    let expected = orders_changelog_expected();
    let got = csv_rows(&ok_file(
        "data/orders_changelog.sql",
        &["--emit", "final", "--format", "csv"],
    ));
    assert!(!expected.is_empty());
    assert_eq!(got, expected);
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
