//! `tally.optimizer.distinct-agg.split.auto`: split-distinct decided from the skew of the keys on
//! a sample of the source, with its reason in EXPLAIN, and the same results either way.

use std::path::Path;

use crate::common::tally_run;
use crate::scratch::Scratch;

fn scratch(name: &str) -> Scratch {
    Scratch::dir(&format!("auto-{name}"))
}

/// `rows` rows `k,u` where key `hot` takes `hot_percent` of them (the rest spread over 50 keys)
/// and `u` takes 300 values.
fn write_rows(path: &Path, rows: usize, hot_percent: usize) {
    let mut csv = String::from("k,u\n");
    for i in 0..rows {
        let k = if i % 100 < hot_percent {
            "hot".to_string()
        } else {
            format!("k{}", i % 50)
        };
        csv.push_str(&format!("{k},{}\n", (i * 7919) % 300));
    }
    std::fs::write(path, csv).unwrap();
}

fn script(path: &Path, workers: usize, settings: &str, query: &str) -> String {
    format!(
        "CREATE TABLE t (k STRING, u INT) WITH ('connector' = 'filesystem', 'path' = '{}', \
         'format' = 'csv'); \
         SET 'table.exec.mini-batch.enabled' = 'true'; \
         SET 'table.exec.mini-batch.allow-latency' = '1 s'; \
         SET 'table.exec.mini-batch.size' = '100'; \
         SET 'table.exec.resource.default-parallelism' = '{workers}'; \
         SET 'tally.optimizer.distinct-agg.split.auto' = 'true'; {settings} {query}",
        path.display()
    )
}

const QUERY: &str = "SELECT k, COUNT(DISTINCT u) AS users, COUNT(*) AS n FROM t GROUP BY k;";

fn run(args: &[&str]) -> (String, String) {
    let mut all = vec!["sql"];
    all.extend(args);
    let (code, out, err) = tally_run(&all);
    assert_eq!(code, 0, "{err}");
    (out, err)
}

fn explain(path: &Path, workers: usize, settings: &str) -> String {
    run(&[
        "-e",
        &script(path, workers, settings, &format!("EXPLAIN {QUERY}")),
    ])
    .0
}

/// The final table, sorted.
fn table(path: &Path, workers: usize, settings: &str) -> Vec<String> {
    table_of(path, workers, settings, QUERY)
}

/// The final table of `query`, sorted.
fn table_of(path: &Path, workers: usize, settings: &str, query: &str) -> Vec<String> {
    let (out, _) = run(&[
        "-e",
        &script(path, workers, settings, query),
        "--emit",
        "final",
        "--format",
        "csv",
    ]);
    let mut rows: Vec<String> = out.lines().skip(1).map(str::to_string).collect();
    rows.sort();
    rows
}

#[test]
fn a_hot_key_splits_where_its_worker_would_be_overloaded() {
    let dir = scratch("hot");
    let path = dir.join("t.csv");
    write_rows(&path, 4000, 60);
    // 60 % on one key: at P = 4 its worker does 2.4x a fair share; at P = 2, 1.2x.
    let plan = explain(&path, 4, "");
    assert!(plan.contains("split into 32 buckets: the hottest of 41 keys holds 60.0 % of the first 4000 source rows, so its worker would do 2.40x a fair share at P = 4"), "{plan}");
    assert!(plan.contains("PARTIAL"), "{plan}");
    let plan = explain(&path, 2, "");
    assert!(
        plan.contains("no split: the hottest of 41 keys holds 60.0 %"),
        "{plan}"
    );
    assert!(
        plan.contains("1.20x a fair share at P = 2 (split pays from 2x)"),
        "{plan}"
    );
    assert!(!plan.contains("PARTIAL"), "{plan}");
    let plan = explain(&path, 1, "");
    assert!(plan.contains("no split on one worker"), "{plan}");
    // A bucket count set by the user is kept (a checkpoint of another P resumes with it).
    let plan = explain(
        &path,
        4,
        "SET 'table.optimizer.distinct-agg.split.bucket-num' = '7';",
    );
    assert!(plan.contains("split into 7 buckets"), "{plan}");
    assert!(plan.contains("MOD(HASH_CODE(u), 7)"), "{plan}");
    let settings = "SET 'table.optimizer.distinct-agg.split.bucket-num' = '7';";
    let (_, err) = run(&["-e", &script(&path, 4, settings, QUERY)]);
    assert!(!err.contains("has no effect"), "{err}");
}

/// With two DISTINCT arguments the Expand triples the PARTIAL's rows (a set per argument and
/// one for COUNT(*)): the same hot key splits only where its worker would do 6x a fair share.
#[test]
fn an_expand_raises_the_bar() {
    let dir = scratch("expand");
    let path = dir.join("t.csv");
    write_rows(&path, 4000, 60);
    let two = "EXPLAIN SELECT k, COUNT(DISTINCT u) AS users, COUNT(DISTINCT u % 7) AS sevens, \
               COUNT(*) AS n FROM t GROUP BY k;";
    let (plan, _) = run(&["-e", &script(&path, 4, "", two)]);
    assert!(
        plan.contains("2.40x a fair share at P = 4 (split pays from 6x here: its Expand feeds the PARTIAL 3 copies of every row)"),
        "{plan}"
    );
    assert!(!plan.contains("partialFinalType=[PARTIAL]"), "{plan}");
    let (plan, _) = run(&["-e", &script(&path, 12, "", two)]);
    assert!(plan.contains("split into 128 buckets"), "{plan}");
    assert!(plan.contains("partialFinalType=[PARTIAL]"), "{plan}");
}

#[test]
fn even_keys_do_not_split() {
    let dir = scratch("even");
    let path = dir.join("t.csv");
    write_rows(&path, 4000, 0);
    let plan = explain(&path, 4, "");
    assert!(
        plan.contains("no split: the hottest of 50 keys holds 2.0 %"),
        "{plan}"
    );
}

#[test]
fn a_nested_aggregate_is_not_sampled() {
    let dir = scratch("nested");
    let path = dir.join("t.csv");
    write_rows(&path, 1000, 60);
    let nested = "EXPLAIN SELECT n, COUNT(DISTINCT k) AS keys FROM \
                  (SELECT k, COUNT(*) AS n FROM t GROUP BY k) GROUP BY n;";
    let (plan, _) = run(&["-e", &script(&path, 4, "", nested)]);
    assert!(
        plan.contains("another aggregate's changelog, not the source"),
        "{plan}"
    );
}

/// Whatever the decision, the table is the one without split; the split options it overrides
/// say they have no effect.
#[test]
fn the_decision_keeps_the_results() {
    let dir = scratch("same");
    let path = dir.join("t.csv");
    write_rows(&path, 3000, 70);
    let want = table(
        &path,
        1,
        "SET 'tally.optimizer.distinct-agg.split.auto' = 'false';",
    );
    assert!(want.iter().any(|r| r == "hot,210,2100"), "{want:?}");
    for workers in [1, 2, 4] {
        assert_eq!(table(&path, workers, ""), want, "{workers} workers");
    }
    let (_, err) = run(&[
        "-e",
        &script(
            &path,
            4,
            "SET 'table.optimizer.distinct-agg.split.enabled' = 'false';",
            QUERY,
        ),
        "--emit",
        "final",
    ]);
    assert!(
        err.contains("'table.optimizer.distinct-agg.split.enabled' = 'false' has no effect: 'tally.optimizer.distinct-agg.split.auto' is true"),
        "{err}"
    );
}

/// A split spreads only its hot keys where its workers merge the buckets: with one key holding
/// 60 % of the rows and 40 others 1 % each, forced split at P = 3 names one key hot in EXPLAIN,
/// keeps the cold keys' PARTIAL state on one worker each (at most 41 + 2 PARTIAL groups, where
/// spreading every key gave 86), reads those cold keys through at the FINAL (whose state holds
/// the hot key alone), and gives the unsplit table at P = 1, 2 and 3: where the local
/// phases route DISTINCT entries at the flush (`COUNT(DISTINCT u)` alone), and where they route
/// rows by their buckets (with a `COUNT(*)` beside it).
#[test]
fn only_hot_keys_spread_and_the_table_stays_the_same() {
    let dir = scratch("hot-only");
    let path = dir.join("t.csv");
    write_rows(&path, 6000, 60);
    let forced = "SET 'tally.optimizer.distinct-agg.split.auto' = 'false'; \
                  SET 'table.optimizer.distinct-agg.split.enabled' = 'true';";
    let unsplit = "SET 'tally.optimizer.distinct-agg.split.auto' = 'false';";
    for query in [
        "SELECT k, COUNT(DISTINCT u) AS users FROM t GROUP BY k;",
        "SELECT k, COUNT(DISTINCT u) AS users, COUNT(*) AS n FROM t GROUP BY k;",
    ] {
        let (out, _) = run(&[
            "-e",
            &script(&path, 3, forced, &format!("EXPLAIN ANALYZE {query}")),
        ]);
        assert!(
            out.contains("Only hot keys are spread: 1 of the 41 keys"),
            "{out}"
        );
        let partial_keys: usize = out
            .lines()
            .find(|l| l.contains("IncrementalGroupAggregate("))
            .and_then(|l| l.split("state=[").nth(1))
            .and_then(|s| s.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no PARTIAL state in {out}"));
        assert!(
            partial_keys <= 43,
            "{query}: {partial_keys} PARTIAL groups: {out}"
        );
        // Every cold key has its one PARTIAL row, which the FINAL reads through: it keeps the
        // hot key alone.
        let final_keys: usize = out
            .lines()
            .find(|l| l.contains("partialFinalType=[FINAL]"))
            .and_then(|l| l.split("state=[").nth(1))
            .and_then(|s| s.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no FINAL state in {out}"));
        assert_eq!(final_keys, 1, "{query}: {out}");
        assert!(out.contains("reads their changes through"), "{out}");
        let want = table_of(&path, 1, unsplit, query);
        assert_eq!(want.len(), 41);
        for workers in [2, 3] {
            assert_eq!(
                table_of(&path, workers, forced, query),
                want,
                "{query}: split at P = {workers}"
            );
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Hot keys are a choice of routes: where the sample cannot be read (EXPLAIN of a file not
/// written yet), a forced split still plans, spreading every key, and names no hot keys.
#[test]
fn a_forced_split_plans_without_a_readable_sample() {
    let dir = scratch("no-sample");
    let path = dir.join("not-yet.csv");
    let forced = "SET 'tally.optimizer.distinct-agg.split.auto' = 'false'; \
                  SET 'table.optimizer.distinct-agg.split.enabled' = 'true';";
    let (out, _) = run(&[
        "-e",
        &script(
            &path,
            3,
            forced,
            "EXPLAIN SELECT k, COUNT(DISTINCT u) AS users FROM t GROUP BY k;",
        ),
    ]);
    assert!(out.contains("split-distinct applies"), "{out}");
    assert!(!out.contains("hot keys"), "{out}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A load just under the bar is shown with four decimals, not rounded onto the bar it misses:
/// 1,999 of 4,000 rows on one key at P = 4 is 1.999x a fair share, not "2.00x" beside "split
/// pays from 2x".
#[test]
fn a_load_just_under_the_bar_is_not_shown_on_it() {
    let dir = scratch("under");
    let path = dir.join("t.csv");
    let mut csv = String::from("k,u\n");
    for i in 0..4000 {
        let k = if i < 1999 {
            "hot".to_string()
        } else {
            format!("k{}", i % 50)
        };
        csv.push_str(&format!("{k},{}\n", (i * 7919) % 300));
    }
    std::fs::write(&path, csv).unwrap();
    let plan = explain(&path, 4, "");
    assert!(
        plan.contains("would do 1.9990x a fair share at P = 4 (split pays from 2x)"),
        "{plan}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
