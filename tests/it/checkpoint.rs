//! Checkpoints and exactly-once resumption: a query stopped at any checkpoint, or killed
//! mid-replay, and resumed gives the same final table as an uninterrupted run; corrupt
//! checkpoints and mismatched resumptions are clear errors.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use arrow::array::RecordBatch;
use tally::checkpoint::CheckpointDir;
use tally::sql::plan_script;

use crate::common::{Materialized, format_changes};

const BIN: &str = env!("CARGO_BIN_EXE_tally");

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tally-chk-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A bundled script without its comments, with `settings` in front and paths made absolute.
fn script(file: &str, settings: &str) -> String {
    let text = std::fs::read_to_string(root().join(file)).unwrap();
    let body: Vec<&str> = text.lines().filter(|l| !l.starts_with("--")).collect();
    let data = root().join("data").display().to_string();
    format!("{settings}\n{}", body.join("\n")).replace("'data/", &format!("'{data}/"))
}

/// Runs a planned script and returns its changelog lines.
fn run_lines(q: &mut tally::sql::PlannedQuery, batch: usize) -> Vec<String> {
    let mut out: Vec<RecordBatch> = vec![];
    std::env::set_current_dir(root()).unwrap();
    q.run(
        batch,
        |b| {
            out.push(b.with_op_column()?);
            Ok(())
        },
        |_, _| {},
    )
    .unwrap();
    format_changes(&out)
}

fn table(lines: &[String]) -> Vec<(String, i64)> {
    let mut m = Materialized::default();
    m.apply_lines(lines);
    m.0.into_iter().collect()
}

/// Every checkpoint of a run is a point to resume from: restored (with another parallelism),
/// the rest of the run's output appended to what the checkpoint says was delivered gives the
/// final table of the whole run. Covers one aggregate, nested aggregates over a changelog,
/// split-distinct (two aggregates, DISTINCT sets and MIN/MAX multisets under retraction), and a
/// TTL driven by recorded time.
#[test]
fn resuming_from_any_checkpoint_gives_the_same_final_table() {
    let cases = [
        ("replay", script("data/replay.sql", ""), 900, 2500),
        (
            "nested",
            script(
                "data/orders_changelog.sql",
                "SET 'table.exec.resource.default-parallelism' = '2';",
            ),
            1000,
            4000,
        ),
        (
            "split",
            script(
                "data/replay.sql",
                "SET 'table.optimizer.distinct-agg.split.enabled' = 'true'; SET 'table.optimizer.distinct-agg.split.bucket-num' = '8';",
            ),
            700,
            3000,
        ),
        (
            "ttl",
            script("data/replay.sql", "SET 'table.exec.state.ttl' = '2 s';"),
            500,
            2000,
        ),
    ];
    for (name, script, batch, every) in cases {
        let dir = scratch(name);
        let store = CheckpointDir::new(&dir).retain(1000);
        let mut q = plan_script(&script).unwrap();
        q.checkpoint_every(store.clone(), every).unwrap();
        let full = run_lines(&mut q, batch);
        let expected = table(&full);
        if name != "ttl" {
            // Checkpoints change when mini-batches fire, never the final table.
            let plain = run_lines(&mut plan_script(&script).unwrap(), batch);
            assert_eq!(table(&plain), expected, "{name}: checkpointed vs plain");
        }
        let checkpoints = store.list().unwrap();
        assert!(checkpoints.len() >= 3, "{name}: {checkpoints:?}");
        for (id, folder) in checkpoints {
            let resumed_script = format!(
                "SET 'table.exec.resource.default-parallelism' = '{}'; {script}",
                1 + id % 3
            );
            let mut q = plan_script(&resumed_script).unwrap();
            let chk = q.restore(&folder).unwrap();
            // Resumed with the same checkpoint interval: a checkpoint fires the pending
            // mini-batches, which (as in Flink) writes the TTL timestamps of their keys.
            q.checkpoint_every(CheckpointDir::new(dir.join("resumed")), every)
                .unwrap();
            assert_eq!(chk.id, id);
            let delivered: usize = chk.meta("output.rows").unwrap().parse().unwrap();
            let mut lines = full[..delivered].to_vec();
            lines.extend(run_lines(&mut q, batch));
            assert_eq!(
                table(&lines),
                expected,
                "{name}: resumed from checkpoint {id}"
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// Runs `tally sql ARGS…` from the repository root.
fn tally(args: &[&str]) -> (i32, String, String) {
    crate::common::tally_command(args)
}

/// The final table of a changelog CSV file (`op,keys…,values…` with `-U` rows).
fn csv_changelog_table(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut lines = text.lines();
    let header = lines.next().unwrap();
    assert!(header.starts_with("op,"), "{header}");
    let changes: Vec<String> = lines
        .map(|l| {
            let (op, row) = l.split_once(',').unwrap();
            format!("{op}[{row}]")
        })
        .collect();
    let mut rows = vec![];
    for (row, n) in table(&changes) {
        for _ in 0..n {
            rows.push(row[1..row.len() - 1].to_string());
        }
    }
    rows.sort();
    rows
}

/// A replay killed (SIGKILL) after it has written checkpoints, then resumed with
/// `--restore` (and another parallelism): its changelog file, truncated to the checkpoint and
/// appended to, materializes to the expected final table — no row lost, none counted twice.
#[test]
fn a_killed_replay_resumes_exactly_once() {
    let dir = scratch("kill");
    let chk = dir.join("chk");
    let out = dir.join("out.csv");
    let expected: Vec<String> = {
        let text = std::fs::read_to_string(root().join("data/replay_expected.csv")).unwrap();
        let mut v: Vec<String> = text.lines().skip(1).map(str::to_string).collect();
        v.sort();
        v
    };
    let (chk_s, out_s) = (chk.display().to_string(), out.display().to_string());
    // Paced at 2x recorded speed: about 7 s for the whole recording.
    let mut child = Command::new(BIN)
        .current_dir(root())
        .args([
            "sql",
            "-f",
            "data/replay.sql",
            "--replay-speed",
            "2",
            "--batch-size",
            "500",
            "--checkpoint-dir",
            &chk_s,
            "--checkpoint-every",
            "1500",
            "--output",
            &out_s,
        ])
        .spawn()
        .unwrap();
    let store = CheckpointDir::new(&chk);
    let start = Instant::now();
    while store.list().unwrap().len() < 2 {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no checkpoint written"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "the replay ended early"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    child.kill().unwrap();
    child.wait().unwrap();
    let killed_at = std::fs::metadata(&out).unwrap().len();
    let (code, _, err) = tally(&[
        "-e",
        &format!(
            "SET 'table.exec.resource.default-parallelism' = '3'; {}",
            script("data/replay.sql", "")
        ),
        "--restore",
        &chk_s,
        "--checkpoint-dir",
        &chk_s,
        "--checkpoint-every",
        "4000",
        "--output",
        &out_s,
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("resumed from checkpoint"), "{err}");
    assert!(killed_at > 0);
    assert_eq!(csv_changelog_table(&out), expected);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Resumptions that cannot be exact are refused with one line naming the problem.
#[test]
fn bad_checkpoints_and_resumptions_are_clear_errors() {
    let dir = scratch("errors");
    let chk = dir.join("chk");
    let out = dir.join("final.csv");
    let (chk_s, out_s) = (chk.display().to_string(), out.display().to_string());
    let (code, _, err) = tally(&[
        "-f",
        "data/replay.sql",
        "--emit",
        "final",
        "--checkpoint-dir",
        &chk_s,
        "--checkpoint-every",
        "5000",
        "--output",
        &out_s,
    ]);
    assert_eq!(code, 0, "{err}");
    let newest = CheckpointDir::new(&chk).latest().unwrap().unwrap();
    let other_query = script("data/replay.sql", "").replace("MAX(amount)", "MIN(amount)");
    let corrupt = |p: &Path| {
        let f = p.join("entry-1.arrows");
        let mut data = std::fs::read(&f).unwrap();
        let i = data.len() / 3;
        data[i] ^= 1;
        std::fs::write(&f, data).unwrap();
    };
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec!["-e".into(), other_query, "--emit".into(), "final".into()],
            "another query",
        ),
        (
            vec![
                "-f".into(),
                "data/replay.sql".into(),
                "--output".into(),
                out_s.clone(),
            ],
            "--emit final",
        ),
        (
            vec![
                "-f".into(),
                "data/replay.sql".into(),
                "--format".into(),
                "csv".into(),
            ],
            "--output FILE in CSV",
        ),
    ];
    for (args, needle) in cases {
        let mut all: Vec<&str> = args.iter().map(String::as_str).collect();
        all.extend(["--restore", &chk_s]);
        let (code, _, err) = tally(&all);
        assert_eq!(code, 1, "{args:?}: {err}");
        assert!(
            err.contains(needle) && err.lines().count() == 1,
            "{args:?}: {err}"
        );
    }
    let (code, _, err) = tally(&[
        "-f",
        "data/replay.sql",
        "--checkpoint-dir",
        &chk_s,
        "--checkpoint-every",
        "0",
    ]);
    assert_eq!(code, 1, "{err}");
    corrupt(&newest);
    let restore = |from: &str| {
        tally(&[
            "-f",
            "data/replay.sql",
            "--emit",
            "final",
            "--restore",
            from,
        ])
    };
    let (code, _, err) = restore(&chk_s);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("corrupt") && err.contains("checksum") && err.contains("older checkpoint"),
        "{err}"
    );
    let (code, _, err) = restore(&dir.join("nothing").display().to_string());
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("no checkpoint"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Bad input in the middle of a file fails the run with one line naming it, after a checkpoint
/// of the state before the bad batch: once the file is fixed, `--restore` resumes without
/// losing or repeating a row.
#[test]
fn bad_input_mid_file_keeps_the_accepted_rows_in_a_checkpoint() {
    let dir = scratch("badinput");
    let csv = dir.join("t.csv");
    let rows: Vec<(String, i64)> = (0..3000)
        .map(|i| (format!("k{}", (i * 7919) % 13), (i % 100) as i64))
        .collect();
    let write = |bad: bool| {
        let mut text = String::from("k,v\n");
        for (i, (k, v)) in rows.iter().enumerate() {
            if bad && i == 2500 {
                text.push_str(&format!("{k},oops\n"));
            } else {
                text.push_str(&format!("{k},{v}\n"));
            }
        }
        std::fs::write(&csv, text).unwrap();
    };
    write(true);
    let script = format!(
        "CREATE TABLE t (k STRING, v BIGINT) WITH ('connector' = 'filesystem', 'path' = '{}', 'format' = 'csv');
         SET 'table.exec.mini-batch.enabled' = 'true';
         SET 'table.exec.mini-batch.allow-latency' = '1 s';
         SET 'table.exec.mini-batch.size' = '300';
         SELECT k, COUNT(*) AS n, SUM(v) AS s FROM t GROUP BY k",
        csv.display()
    );
    let chk = dir.join("chk").display().to_string();
    let out = dir.join("out.csv").display().to_string();
    let common = [
        "--emit",
        "final",
        "--batch-size",
        "200",
        "--checkpoint-dir",
        &chk,
        "--checkpoint-every",
        "1000",
        "--output",
        &out,
    ];
    let mut args = vec!["-e", &script];
    args.extend(common);
    let (code, _, err) = tally(&args);
    assert_eq!(code, 1, "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("oops") && err.contains("saved in checkpoint") && err.contains("--restore"),
        "{err}"
    );
    write(false);
    args.extend(["--restore", &chk]);
    let (code, _, err) = tally(&args);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("input has changed"), "{err}");
    let mut expected: std::collections::BTreeMap<&str, (i64, i64)> = Default::default();
    for (k, v) in &rows {
        let e = expected.entry(k).or_default();
        e.0 += 1;
        e.1 += v;
    }
    let mut want: Vec<String> = expected
        .iter()
        .map(|(k, (n, s))| format!("{k},{n},{s}"))
        .collect();
    want.sort();
    let text = std::fs::read_to_string(&out).unwrap();
    let mut got: Vec<String> = text.lines().skip(1).map(str::to_string).collect();
    got.sort();
    assert_eq!(got, want);
    std::fs::remove_dir_all(&dir).unwrap();
}
