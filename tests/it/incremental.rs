//! Split-distinct under Flink's incremental aggregate (`table.optimizer.incremental-agg-enabled`):
//! Flink's own test programs for it (`IncrementalGroupAggregateTestPrograms`: their source rows
//! before and after a restore and the changelogs their sinks must consume), and what the option
//! changes.

use std::collections::BTreeMap;
use std::path::Path;

use crate::common::tally_run;

#[path = "../flink_programs/incremental_group_aggregate.rs"]
mod programs;
use crate::scratch::Scratch;
use programs::{AFTER, BEFORE, COMPLEX, COMPLEX_CHANGES, SIMPLE, SIMPLE_CHANGES};

/// The programs' options: mini-batch of one row, a 10 s latency, split-distinct on; one worker.
const SETTINGS: &str = "SET 'table.exec.mini-batch.enabled' = 'true'; \
                        SET 'table.exec.mini-batch.allow-latency' = '10 s'; \
                        SET 'table.exec.mini-batch.size' = '1'; \
                        SET 'table.optimizer.distinct-agg.split.enabled' = 'true'; \
                        SET 'table.exec.resource.default-parallelism' = '1';";

fn scratch(name: &str) -> Scratch {
    Scratch::dir(&format!("inc-{name}"))
}

fn script(dir: &Path, settings: &str, query: &str) -> String {
    format!(
        "CREATE TABLE source_t (a INT, b BIGINT, c STRING) WITH ('connector' = 'filesystem', \
         'path' = '{}', 'format' = 'csv'); {SETTINGS} {settings} {query};",
        dir.join("source.csv").display()
    )
}

/// Runs `script` with the changelog written to `dir/out.csv`; returns its rows as Flink prints
/// them (`+I[1, 1]`).
fn run(dir: &Path, script: &str, args: &[&str]) -> Vec<String> {
    let out = dir.join("out.csv");
    let mut all = vec!["sql", "-e", script, "--emit", "changelog", "--output"];
    all.push(out.to_str().unwrap());
    all.extend(args);
    let (code, _, err) = tally_run(&all);
    assert_eq!(code, 0, "{err}");
    std::fs::read_to_string(&out)
        .unwrap()
        .lines()
        .skip(1)
        .map(|l| {
            let (op, values) = l.split_once(',').unwrap();
            format!("{op}[{}]", values.replace(',', ", "))
        })
        .collect()
}

/// The rows of each key (the first column), in order: what a changelog must keep.
fn per_key(rows: &[String]) -> BTreeMap<String, Vec<String>> {
    let mut keys: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for r in rows {
        let key = r[3..].split([',', ']']).next().unwrap().to_string();
        keys.entry(key).or_default().push(r.clone());
    }
    keys
}

/// The table a changelog leaves: each key's last row, unless it is a retraction.
fn final_table(rows: &[String]) -> BTreeMap<String, String> {
    let mut table = BTreeMap::new();
    for (key, changes) in per_key(rows) {
        let last = changes.last().unwrap();
        if !last.starts_with('-') {
            table.insert(key, last[3..].to_string());
        }
    }
    table
}

fn owned(rows: &[&str]) -> Vec<String> {
    rows.iter().map(|r| r.to_string()).collect()
}

/// Runs a program as Flink's restore tests do: the rows before, a checkpoint, then the rows
/// after, resumed from it. Checks what the sink consumed before and after against Flink's
/// expectations: the same rows, each key's in the same order (Flink's test compares them in
/// any order; across keys Tally emits in its own deterministic order).
fn program(name: &str, query: &str, before: &[&str], after: &[&str]) {
    let dir = scratch(name);
    std::fs::write(dir.join("source.csv"), format!("a,b,c\n{BEFORE}")).unwrap();
    let script = script(&dir, "", query);
    let ck = dir.join("checkpoints");
    let ck = ck.to_str().unwrap();
    let first = run(
        &dir,
        &script,
        &["--checkpoint-dir", ck, "--checkpoint-every", "3"],
    );
    assert_eq!(
        per_key(&first),
        per_key(&owned(before)),
        "{name}, before the restore"
    );
    assert_eq!(
        first.len(),
        before.len(),
        "{name}, before the restore: {first:?}"
    );
    std::fs::write(dir.join("source.csv"), format!("a,b,c\n{BEFORE}{AFTER}")).unwrap();
    let all = run(&dir, &script, &["--restore", ck]);
    assert_eq!(
        all[..first.len()],
        first[..],
        "{name}: the resumed run keeps the output"
    );
    let second = all[first.len()..].to_vec();
    assert_eq!(
        per_key(&second),
        per_key(&owned(after)),
        "{name}, after the restore"
    );
    assert_eq!(
        second.len(),
        after.len(),
        "{name}, after the restore: {second:?}"
    );
}

#[test]
fn flink_incremental_group_aggregate_simple() {
    program("simple", SIMPLE, SIMPLE_CHANGES.0, SIMPLE_CHANGES.1);
}

#[test]
fn flink_incremental_group_aggregate_complex() {
    program("complex", COMPLEX, COMPLEX_CHANGES.0, COMPLEX_CHANGES.1);
}

/// Without the incremental aggregate the FINAL consumes the PARTIAL's `-U` and `+U` of a bucket
/// as two changes, and with mini-batches of one row it emits the state between them (here
/// `[1, 1, 1, 1]` again after `[1, 3, 2, 2]`): a changelog Flink's default plan never shows.
/// The final table is the same, and EXPLAIN shows which plan ran.
#[test]
fn incremental_aggregate_off_shows_the_partial_changes_apart() {
    let dir = scratch("off");
    std::fs::write(dir.join("source.csv"), format!("a,b,c\n{BEFORE}{AFTER}")).unwrap();
    let on = run(&dir, &script(&dir, "", COMPLEX), &[]);
    let off_settings = "SET 'table.optimizer.incremental-agg-enabled' = 'false';";
    let off = run(&dir, &script(&dir, off_settings, COMPLEX), &[]);
    let between = |rows: &[String]| {
        rows.windows(2)
            .any(|w| w[0] == "-U[1, 3, 2, 2]" && w[1] == "+U[1, 1, 1, 1]")
    };
    assert!(!between(&on), "{on:?}");
    assert!(between(&off), "{off:?}");
    assert_eq!(final_table(&on), final_table(&off));

    let explain = |settings: &str| {
        let (code, out, err) = tally_run(&[
            "sql",
            "-e",
            &script(&dir, settings, &format!("EXPLAIN {COMPLEX}")),
        ]);
        assert_eq!(code, 0, "{err}");
        out
    };
    let plan = explain("");
    assert!(
        plan.contains(
            "IncrementalGroupAggregate(partialAggGrouping=[b, $f2], finalAggGrouping=[b]"
        ),
        "{plan}"
    );
    assert!(
        !plan.contains("partialFinalType=[FINAL], select=[b, SUM_RETRACT($p0)"),
        "{plan}"
    );
    let plan = explain(off_settings);
    assert!(!plan.contains("IncrementalGroupAggregate"), "{plan}");
    assert!(
        plan.contains("LocalGroupAggregate(groupBy=[b], partialFinalType=[FINAL]"),
        "{plan}"
    );
}

/// The FINAL keeps the same state either way: a checkpoint written without the incremental
/// aggregate resumes with it (and back), to the same final table.
#[test]
fn checkpoints_move_between_the_plans() {
    for (first, second) in [("false", "true"), ("true", "false")] {
        let dir = scratch(&format!("move-{first}"));
        std::fs::write(dir.join("source.csv"), format!("a,b,c\n{BEFORE}")).unwrap();
        let ck = dir.join("checkpoints");
        let ck = ck.to_str().unwrap();
        let set = |v: &str| format!("SET 'table.optimizer.incremental-agg-enabled' = '{v}';");
        run(
            &dir,
            &script(&dir, &set(first), COMPLEX),
            &["--checkpoint-dir", ck, "--checkpoint-every", "3"],
        );
        std::fs::write(dir.join("source.csv"), format!("a,b,c\n{BEFORE}{AFTER}")).unwrap();
        let resumed = run(
            &dir,
            &script(&dir, &set(second), COMPLEX),
            &["--restore", ck],
        );
        let table: Vec<String> = final_table(&resumed).into_values().collect();
        assert_eq!(table, ["1, 9, 3, 4]", "2, 2, 1, 1]"], "{first} -> {second}");
    }
}

/// Set where it cannot apply (one phase), the option says so instead of doing nothing silently.
#[test]
fn incremental_aggregate_without_two_phases_warns() {
    let dir = scratch("warn");
    std::fs::write(dir.join("source.csv"), format!("a,b,c\n{BEFORE}")).unwrap();
    let settings = "SET 'table.optimizer.incremental-agg-enabled' = 'true'; \
                    SET 'table.optimizer.agg-phase-strategy' = 'ONE_PHASE';";
    let (code, _, err) = tally_run(&["sql", "-e", &script(&dir, settings, SIMPLE)]);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("'table.optimizer.incremental-agg-enabled' = 'true' has no effect"),
        "{err}"
    );
}

/// On the pipelined runtime a split PARTIAL whose firings the incremental FINAL folds keys its
/// workers' state by the query's keys alone, the buckets only routing rows: at most one group
/// per shop and worker instead of one per (shop, set, bucket), over the bundled orders and their
/// changelog, with the unsplit plan's final table, and its local phases fold a shop's rows bound
/// for one worker into one accumulator row; on one worker the FINAL reads the PARTIAL through.
/// With checkpoints the FINAL merges; the PARTIAL's state merges the buckets still over
/// insert-only input (a checkpoint cuts it into a group per bucket) and keeps them over the
/// changelog; the same table.
#[test]
fn a_split_partial_keys_its_state_by_the_query_keys() {
    use tally::sql::plan_script;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let data = root.join("data");
    for (file, changelog) in [
        ("orders.parquet", ""),
        ("orders_changelog.parquet", ", 'changelog-column' = 'op'"),
    ] {
        for workers in [1, 2, 3] {
            let script = |split: bool| {
                format!(
                    "CREATE TABLE orders (order_id BIGINT, shop STRING, user_id BIGINT, amount BIGINT, \
                     status STRING, ts TIMESTAMP(3)) WITH ('connector' = 'filesystem', \
                     'path' = '{}', 'format' = 'parquet'{changelog}); \
                     SET 'table.exec.mini-batch.enabled' = 'true'; \
                     SET 'table.exec.mini-batch.allow-latency' = '1 h'; \
                     SET 'table.exec.mini-batch.size' = '2000'; \
                     SET 'table.exec.resource.default-parallelism' = '{workers}'; \
                     SET 'table.optimizer.distinct-agg.split.enabled' = '{split}'; \
                     SELECT shop, COUNT(*) AS orders, COUNT(DISTINCT user_id) AS buyers, \
                     COUNT(DISTINCT status) AS statuses, MAX(amount) AS biggest \
                     FROM orders GROUP BY shop;",
                    data.join(file).display()
                )
            };
            let ctx = format!("{file}, {workers} workers");
            let table = |lines: &[String]| {
                let mut m = crate::common::Materialized::default();
                m.apply_lines(lines);
                m.rows()
            };
            let (unsplit, _) =
                crate::common::run_query(&mut plan_script(&script(false)).unwrap(), 4096);
            let mut q = plan_script(&script(true)).unwrap();
            let (lines, stats) = crate::common::run_query(&mut q, 4096);
            assert!(
                stats.runtime.starts_with("pipelined"),
                "{ctx}: {}",
                stats.runtime
            );
            assert_eq!(table(&lines), table(&unsplit), "{ctx}");
            let partial = &stats.aggregates[0];
            let shops = table(&unsplit).len() as u64;
            assert!(partial.merges_buckets, "{ctx}");
            // On one worker each shop has one PARTIAL row, which the FINAL reads through: no
            // state of its own, and no update that changes nothing.
            let fin = &stats.aggregates[1];
            assert_eq!(fin.reads_through, workers == 1, "{ctx}");
            if workers == 1 {
                assert_eq!(fin.keys_in_state, 0, "{ctx}");
                assert_eq!(fin.rows_out as usize, lines.len(), "{ctx}");
                for pair in lines.windows(2) {
                    if pair[0].starts_with("-U") && pair[1].starts_with("+U") {
                        assert_ne!(pair[0][2..], pair[1][2..], "{ctx}");
                    }
                }
            }
            let exchanged = |m: &tally::AggregateMetrics| {
                m.stages
                    .iter()
                    .find(|s| s.step == tally::explain::AggregateStep::Exchange)
                    .map_or(0, |s| s.rows_in)
            };
            let merged_exchange = exchanged(partial);
            assert!(
                partial.keys_in_state <= shops * workers as u64,
                "{ctx}: {} groups for {shops} shops",
                partial.keys_in_state
            );
            // With checkpoints, over insert-only input the state merges the buckets still (a
            // checkpoint cuts it into a group per bucket); over a changelog it keeps (shop,
            // set, bucket) groups for a spread shop. The same table either way; the FINAL
            // keeps state for every shop.
            let merges = changelog.is_empty();
            let dir = scratch(&format!("merge-{workers}-{}", changelog.is_empty()));
            let mut q = plan_script(&script(true)).unwrap();
            q.job()
                .checkpoint_every(
                    tally::checkpoint::CheckpointDir::new(dir.to_path_buf()),
                    20_000,
                )
                .unwrap();
            let (lines, stats) = crate::common::run_query(&mut q, 4096);
            assert_eq!(table(&lines), table(&unsplit), "{ctx}: with checkpoints");
            let partial = &stats.aggregates[0];
            assert_eq!(partial.merges_buckets, merges, "{ctx}: with checkpoints");
            assert!(
                !stats.aggregates[1].reads_through,
                "{ctx}: with checkpoints"
            );
            std::fs::remove_dir_all(&dir).unwrap();
            if merges {
                assert!(
                    partial.keys_in_state <= shops * workers as u64,
                    "{ctx}: {} groups with checkpoints",
                    partial.keys_in_state
                );
                continue;
            }
            // The local phases folded a shop's rows bound for one worker into one row, not one
            // per (set, bucket): fewer rows than with checkpoints, which spread every shop over
            // a changelog (no hot keys sampled).
            assert!(
                merged_exchange < exchanged(partial),
                "{ctx}: {merged_exchange} accumulator rows exchanged, {} with checkpoints",
                exchanged(partial)
            );
            assert!(
                partial.keys_in_state > shops * workers as u64,
                "{ctx}: {} groups with checkpoints",
                partial.keys_in_state
            );
        }
    }
}

/// With several workers the FINAL's global phase is cut into one shard per worker, each
/// merging the delta rows of the keys of its key groups: every shard takes rows, and the final
/// table is one worker's (a key merged by two shards would show twice); the changelog is the
/// same on every run. Pushes of few delta rows (a few keys) are merged shard after shard on the
/// caller's thread, larger ones (thousands of keys) on the pool. A state TTL keeps every key
/// in the FINAL's shards (it then reads no cold key through: an expired PARTIAL row would
/// restart a key's results).
#[test]
fn the_final_merges_in_one_shard_per_worker() {
    for (name, keys, rows, size) in [("few", 60, 3000, 50), ("many", 3000, 30_000, 4000)] {
        final_in_shards(name, keys, rows, size);
    }
}

fn final_in_shards(name: &str, keys: u64, rows: u64, size: usize) {
    let dir = scratch(&format!("shards-{name}"));
    let mut csv = String::from("a,b,c\n");
    for i in 0..rows {
        // Key 0 the hot one; up to 40 distinct c per key.
        let x = (i * 2_654_435_761) % (1 << 32);
        let b = if i % 3 == 0 { 0 } else { x % keys };
        let c = (x >> 8) % 40;
        csv.push_str(&format!("{},{b},c{c}\n", i % 11));
    }
    std::fs::write(dir.join("source.csv"), csv).unwrap();
    let query = "SELECT b, COUNT(DISTINCT c) AS n, SUM(a) AS s FROM source_t GROUP BY b";
    let script = |workers: usize| {
        format!(
            "CREATE TABLE source_t (a INT, b BIGINT, c STRING) WITH ('connector' = 'filesystem', \
             'path' = '{}', 'format' = 'csv'); \
             SET 'table.exec.mini-batch.enabled' = 'true'; \
             SET 'table.exec.mini-batch.allow-latency' = '1 h'; \
             SET 'table.exec.mini-batch.size' = '{size}'; \
             SET 'table.optimizer.agg-phase-strategy' = 'TWO_PHASE'; \
             SET 'table.optimizer.distinct-agg.split.enabled' = 'true'; \
             SET 'table.exec.state.ttl' = '1 h'; \
             SET 'table.exec.resource.default-parallelism' = '{workers}'; {query};",
            dir.join("source.csv").display()
        )
    };
    let run_on = |workers: usize| {
        let mut q = tally::sql::plan_script(&script(workers)).unwrap();
        crate::common::run_query(&mut q, 1024)
    };
    let (one, _) = run_on(1);
    let (three, stats) = run_on(3);
    let table = |lines: &[String]| {
        let mut m = crate::common::Materialized::default();
        m.apply_lines(lines);
        m.rows()
    };
    assert_eq!(table(&three), table(&one), "{name}");
    assert_eq!(table(&one).len(), keys as usize, "{name}");
    let fin = stats.aggregates.last().unwrap();
    assert!(!fin.reads_through && !fin.reads_cold_through);
    assert_eq!(fin.parallelism, 3);
    assert_eq!(fin.workers.len(), 3);
    assert!(
        fin.workers.iter().all(|w| w.rows_received > 0),
        "{name}: {:?}",
        fin.workers
    );
    let merged: u64 = fin.workers.iter().map(|w| w.rows_received).sum();
    assert_eq!(merged, fin.stages[1].rows_in, "{name}");
    // The largest push (the merge's rows over its pushes) decides the path taken.
    assert_eq!(
        fin.stages[1].rows_in / fin.stages[1].batches.max(1) > 1024,
        name == "many",
        "{name}: {:?}",
        fin.stages[1]
    );
    assert_eq!(
        run_on(3).0,
        three,
        "{name}: the same changelog on every run"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
