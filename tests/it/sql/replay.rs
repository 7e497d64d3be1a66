//! Replays of `tally sql` driven by a time column: deterministic changelogs, the bundled
//! recording's expected table, and checked times and speeds.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use super::{BIN, csv_rows, ok, ok_file, scratch, tally};
use crate::common::live_orders;

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
