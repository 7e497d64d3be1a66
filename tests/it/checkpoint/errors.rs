//! Clear errors around checkpoints: bad checkpoints and resumptions are refused with one
//! line, and bad input mid-file keeps the accepted rows in a checkpoint.

use std::path::Path;

use tally::checkpoint::CheckpointDir;

use super::{scratch, script, tally};

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
        "--emit",
        "final",
        "--checkpoint-dir",
        &chk_s,
        "--checkpoint-every",
        "0",
    ]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("at least 1 row"), "{err}");
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
/// of the state before the bad batch (the ordered runtime) or at the end of the last whole round
/// of chunks before it (the pipelined one, here at P = 2: chunks of 65 536 rows, rounds of two;
/// the bad row is in the third round's second chunk): once the file is fixed, `--restore`
/// resumes without losing or repeating a row.
#[test]
fn bad_input_mid_file_keeps_the_accepted_rows_in_a_checkpoint() {
    for (pipelined, rows, bad_at, every, saved) in [
        (
            false,
            3000usize,
            2500usize,
            "1000",
            "after the 2400 rows before it",
        ),
        (
            true,
            400_000,
            390_000,
            "100000",
            "after the first 262144 rows",
        ),
    ] {
        bad_input_mid_file(pipelined, rows, bad_at, every, saved);
    }
}

/// `COUNT(*)` and `SUM(v)` by `k` over the CSV file `csv` of `k,v` rows, at P = 2 on the
/// pipelined runtime or the ordered one.
fn count_and_sum(csv: &Path, pipelined: bool) -> String {
    format!(
        "CREATE TABLE t (k STRING, v BIGINT) WITH ('connector' = 'filesystem', 'path' = '{}', 'format' = 'csv');
         SET 'table.exec.mini-batch.enabled' = 'true';
         SET 'table.exec.mini-batch.allow-latency' = '1 s';
         SET 'table.exec.mini-batch.size' = '300';
         SET 'table.exec.resource.default-parallelism' = '2';
         SET 'tally.exec.pipelined' = '{pipelined}';
         SELECT k, COUNT(*) AS n, SUM(v) AS s FROM t GROUP BY k",
        csv.display()
    )
}

/// The test above on one runtime: `saved` is how its message names the checkpoint's position.
fn bad_input_mid_file(pipelined: bool, n: usize, bad_at: usize, every: &str, saved: &str) {
    let dir = scratch(&format!("badinput-{pipelined}"));
    let csv = dir.join("t.csv");
    let rows: Vec<(String, i64)> = (0..n)
        .map(|i| (format!("k{}", (i * 7919) % 13), (i % 100) as i64))
        .collect();
    let write = |bad: bool| {
        let mut text = String::from("k,v\n");
        for (i, (k, v)) in rows.iter().enumerate() {
            if bad && i == bad_at {
                text.push_str(&format!("{k},oops\n"));
            } else {
                text.push_str(&format!("{k},{v}\n"));
            }
        }
        std::fs::write(&csv, text).unwrap();
    };
    write(true);
    let script = count_and_sum(&csv, pipelined);
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
        every,
        "--output",
        &out,
    ];
    let mut args = vec!["-e", &script];
    args.extend(common);
    let (code, _, err) = tally(&args);
    assert_eq!(code, 1, "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("oops")
            && err.contains(&format!("at line {}", bad_at + 1))
            && err.contains(saved)
            && err.contains("saved in checkpoint")
            && err.contains("--restore"),
        "pipelined {pipelined}: {err}"
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
    assert_eq!(got, want, "pipelined {pipelined}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A checkpoint that cannot be written fails the run with one line naming the folder, on
/// either runtime (the pipelined one writes checkpoints while the run goes on, and waits for
/// the last before it ends), and claims no saved state.
#[test]
fn a_checkpoint_that_cannot_be_written_fails_the_run() {
    for pipelined in [true, false] {
        let dir = scratch(&format!("unwritable-{pipelined}"));
        let csv = dir.join("t.csv");
        let mut text = String::from("k,v\n");
        for i in 0..5000 {
            text.push_str(&format!("k{},{}\n", i % 17, i % 10));
        }
        std::fs::write(&csv, text).unwrap();
        // The checkpoint directory is a file.
        let chk = dir.join("chk");
        std::fs::write(&chk, "not a directory").unwrap();
        let script = count_and_sum(&csv, pipelined);
        let chk = chk.display().to_string();
        let (code, _, err) = tally(&[
            "-e",
            &script,
            "--emit",
            "final",
            "--checkpoint-dir",
            &chk,
            "--checkpoint-every",
            "1000",
            "--output",
            &dir.join("out.csv").display().to_string(),
        ]);
        assert_eq!(code, 1, "pipelined {pipelined}: {err}");
        assert_eq!(err.lines().count(), 1, "pipelined {pipelined}: {err}");
        assert!(
            err.contains(&chk) && !err.contains("saved in checkpoint"),
            "pipelined {pipelined}: {err}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
