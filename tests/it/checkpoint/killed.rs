//! A `tally sql` replay killed mid-run and resumed with `--restore`: exactly once.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use tally::checkpoint::CheckpointDir;

use super::{root, scratch, script, table, tally};

const BIN: &str = env!("CARGO_BIN_EXE_tally");

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
