//! `tally sql` end to end, one file per topic; final results are compared with a reference
//! computed here from the same rows. Here: running the binary, and the generated CSV stream
//! with its reference that several files share.

mod errors;
mod explain;
mod formats;
mod replay;
mod results;
mod split_distinct;
mod update_before;

use crate::scratch::Scratch;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const BIN: &str = env!("CARGO_BIN_EXE_tally");

/// A scratch directory for one test, removed when dropped.
fn scratch(name: &str) -> Scratch {
    Scratch::dir(name)
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
