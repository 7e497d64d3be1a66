//! Resuming a planned query from its checkpoints: from any of them it gives the reference's
//! final table, and only under the settings that shaped the state.

use arrow::array::RecordBatch;
use tally::checkpoint::CheckpointDir;
use tally::sql::plan_script;

use super::{root, scratch, script, table};

/// Runs a planned script and returns its changelog lines.
fn run_lines(q: &mut tally::sql::PlannedQuery, batch: usize) -> Vec<String> {
    std::env::set_current_dir(root()).unwrap();
    crate::common::run_query(q, batch).0
}

/// The final table of `data/replay.sql`, computed row by row by `examples/gen_data.rs`.
fn replay_expected() -> Vec<String> {
    let text = std::fs::read_to_string(root().join("data/replay_expected.csv")).unwrap();
    let mut rows: Vec<String> = text.lines().skip(1).map(str::to_string).collect();
    rows.sort();
    rows
}

/// The TTL query of [`resuming_from_any_checkpoint_matches_the_reference`]: per shop, COUNT(*)
/// and SUM(amount) over `data/replay.arrow`, mini-batch off, state TTL 200 ms on recorded time.
const TTL_QUERY: &str =
    "SELECT shop, COUNT(*) AS orders, SUM(amount) AS total FROM orders GROUP BY shop;";

/// Flink's per-record TTL rule over `data/replay.arrow` read in batches of `batch` rows, row at
/// a time: the clock is the largest recorded time read so far (the replay sets it per batch);
/// a key whose state was last written at least the TTL ago starts afresh (expiry emits nothing);
/// a retraction of a key without state is dropped; a key whose record count reaches 0 is
/// deleted (`-D`). Returns what an upsert consumer holds at the end: each key's last emitted
/// row, unless deleted.
fn ttl_reference(batch: usize, ttl_ms: i64) -> Vec<String> {
    use arrow::array::{Array, AsArray};
    use arrow::datatypes::{Int8Type, Int64Type, TimestampMillisecondType};
    let file = std::fs::File::open(root().join("data/replay.arrow")).unwrap();
    let reader = arrow::ipc::reader::FileReader::try_new(file, None).unwrap();
    let batches: Vec<RecordBatch> = reader.map(Result::unwrap).collect();
    let all = arrow::compute::concat_batches(&batches[0].schema(), &batches).unwrap();
    let col = |n: &str| all.column(all.schema().index_of(n).unwrap()).clone();
    let ops = tally::changelog::op_codes(&col("op")).unwrap();
    let ops = ops.as_primitive::<Int8Type>();
    let shop = col("shop");
    let shop = shop.as_string::<i32>();
    let amount = col("amount");
    let amount = amount.as_primitive::<Int64Type>();
    let ts = col("ts");
    let ts = ts.as_primitive::<TimestampMillisecondType>();
    // Per shop: record count, non-NULL amounts, their sum, last write.
    let mut state: std::collections::BTreeMap<String, (i64, i64, i64, i64)> = Default::default();
    let mut emitted: std::collections::BTreeMap<String, String> = Default::default();
    let mut now = i64::MIN;
    for start in (0..all.num_rows()).step_by(batch) {
        let end = (start + batch).min(all.num_rows());
        now = now.max((start..end).map(|r| ts.value(r)).max().unwrap());
        for r in start..end {
            let k = shop.value(r).to_string();
            if state.get(&k).is_some_and(|s| now - s.3 >= ttl_ms) {
                state.remove(&k);
            }
            let a = amount.is_valid(r).then(|| amount.value(r));
            let (d, da) = if ops.value(r) & 1 == 1 {
                (-1, -a.unwrap_or(0))
            } else {
                (1, a.unwrap_or(0))
            };
            if d < 0 && !state.contains_key(&k) {
                continue;
            }
            let s = state.entry(k.clone()).or_insert((0, 0, 0, now));
            s.0 += d;
            s.1 += if a.is_some() { d } else { 0 };
            s.2 += da;
            s.3 = now;
            if s.0 == 0 {
                state.remove(&k);
                emitted.remove(&k);
            } else {
                let sum = if s.1 == 0 {
                    String::new()
                } else {
                    s.2.to_string()
                };
                emitted.insert(k.clone(), format!("{k},{},{sum}", s.0));
            }
        }
    }
    emitted.into_values().collect()
}

/// What an upsert consumer keyed by the first column holds after a changelog: `+I`/`+U`
/// replace the key's row, `-D` removes it (`-U` rows are not needed), as sorted CSV lines.
fn upsert_lines(lines: &[String]) -> Vec<String> {
    let mut rows: std::collections::BTreeMap<String, String> = Default::default();
    for line in lines {
        let (kind, row) = line.split_at(2);
        let row = row[1..row.len() - 1].replace(", ", ",").replace("null", "");
        let key = row.split(',').next().unwrap().to_string();
        match kind {
            "+I" | "+U" => {
                rows.insert(key, row);
            }
            "-D" => {
                rows.remove(&key);
            }
            _ => {}
        }
    }
    rows.into_values().collect()
}

/// The rows of a materialized changelog as sorted CSV lines (NULL as an empty field).
fn csv_lines(table: &[(String, i64)]) -> Vec<String> {
    let mut rows = vec![];
    for (row, n) in table {
        let line = row[1..row.len() - 1].replace(", ", ",").replace("null", "");
        for _ in 0..*n {
            rows.push(line.clone());
        }
    }
    rows.sort();
    rows
}

/// Every checkpoint of a run is a point to resume from: restored (with another parallelism),
/// the rest of the run's output appended to what the checkpoint says was delivered gives the
/// final table computed without the engine (`data/replay_expected.csv`, the live orders of the
/// changelog file, or a row-at-a-time TTL reference). Covers one aggregate, nested aggregates
/// over a changelog, split-distinct (two aggregates, DISTINCT sets and MIN/MAX multisets under
/// retraction), and a TTL driven by recorded time.
#[test]
fn resuming_from_any_checkpoint_matches_the_reference() {
    let ttl_script = script(
        "data/replay.sql",
        "SET 'table.exec.state.ttl' = '200 ms'; SET 'table.exec.mini-batch.enabled' = 'false';",
    );
    let ttl_script = format!(
        "{}{TTL_QUERY}",
        &ttl_script[..ttl_script.find("SELECT shop").unwrap()]
    )
    .replace("SET 'table.exec.mini-batch.enabled' = 'true';", "")
    .replace("SET 'table.exec.mini-batch.allow-latency' = '2 s';", "")
    .replace("SET 'table.exec.mini-batch.size' = '100000';", "");
    let cases = [
        (
            "replay",
            script("data/replay.sql", ""),
            900,
            2500,
            replay_expected(),
        ),
        (
            "nested",
            script(
                "data/orders_changelog.sql",
                "SET 'table.exec.resource.default-parallelism' = '2'; SET 'tally.exec.pipelined' = 'false';",
            ),
            1000,
            4000,
            crate::common::orders_changelog_expected(),
        ),
        // The pipelined runtime: one worker here (its rounds are one mini-batch of 5 000 rows),
        // resumed on 1 to 3 workers (chunks of 65 536 rows dealt to the splits).
        (
            "nested-pipelined",
            script(
                "data/orders_changelog.sql",
                "SET 'table.exec.resource.default-parallelism' = '1';",
            ),
            1000,
            4000,
            crate::common::orders_changelog_expected(),
        ),
        (
            "split",
            script(
                "data/replay.sql",
                "SET 'table.optimizer.distinct-agg.split.enabled' = 'true'; SET 'table.optimizer.distinct-agg.split.bucket-num' = '8';",
            ),
            700,
            3000,
            replay_expected(),
        ),
        ("ttl", ttl_script, 500, 2000, ttl_reference(500, 200)),
    ];
    // The TTL matters on this recording: without it the table differs.
    assert_ne!(cases[4].4, ttl_reference(500, i64::MAX / 4));
    for (name, script, batch, every, expected) in cases {
        assert!(expected.len() > 5, "{name}: {expected:?}");
        let dir = scratch(name);
        let store = CheckpointDir::new(&*dir).retain(1000);
        let mut q = plan_script(&script).unwrap();
        q.job().checkpoint_every(store.clone(), every).unwrap();
        // Under a TTL the changelog is read by key: an expired key starts again with +I and
        // its old row is never retracted (as in Flink, whose TTL serves upsert consumers).
        let view = |lines: &[String]| {
            if name == "ttl" {
                upsert_lines(lines)
            } else {
                csv_lines(&table(lines))
            }
        };
        let full = run_lines(&mut q, batch);
        assert_eq!(view(&full), expected, "{name}: the whole run");
        let checkpoints = store.list().unwrap();
        assert!(checkpoints.len() >= 3, "{name}: {checkpoints:?}");
        for (id, folder) in checkpoints {
            let resumed_script = format!(
                "SET 'table.exec.resource.default-parallelism' = '{}'; {script}",
                1 + id % 3
            );
            let mut q = plan_script(&resumed_script).unwrap();
            let chk = q.job().restore(&folder).unwrap();
            q.job()
                .checkpoint_every(CheckpointDir::new(dir.join("resumed")), every)
                .unwrap();
            assert_eq!(chk.id, id);
            let delivered: usize = chk.meta("output.rows").unwrap().parse().unwrap();
            let mut lines = full[..delivered].to_vec();
            lines.extend(run_lines(&mut q, batch));
            assert_eq!(
                view(&lines),
                expected,
                "{name}: resumed from checkpoint {id}"
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// The settings that shape the state (whether split-distinct applies, and how many buckets)
/// are recorded in a checkpoint: restoring under others is refused, naming the setting (it
/// used to count distinct values in two sets of buckets).
#[test]
fn a_checkpoint_restores_only_under_the_settings_that_shaped_its_state() {
    let dir = scratch("settings");
    let split = |n: &str| {
        format!(
            "SET 'table.optimizer.distinct-agg.split.enabled' = 'true'; \
             SET 'table.optimizer.distinct-agg.split.bucket-num' = '{n}';"
        )
    };
    for (taken, resumed, needle) in [
        (
            split("4"),
            split("1024"),
            "taken with 'table.optimizer.distinct-agg.split.bucket-num' = '4' and this run has '1024'",
        ),
        (
            split("4"),
            String::new(),
            "taken with 'table.optimizer.distinct-agg.split.enabled' = 'true' and this run has 'false'",
        ),
        (
            String::new(),
            split("16"),
            "taken with 'table.optimizer.distinct-agg.split.enabled' = 'false' and this run has 'true'",
        ),
    ] {
        let _ = std::fs::remove_dir_all(&dir);
        let mut q = plan_script(&script("data/replay.sql", &taken)).unwrap();
        q.job()
            .checkpoint_every(CheckpointDir::new(&*dir), 6000)
            .unwrap();
        run_lines(&mut q, 1000);
        let mut other = plan_script(&script("data/replay.sql", &resumed)).unwrap();
        let e = other.job().restore(&dir).unwrap_err();
        assert!(e.is_user_error(), "{e}");
        let e = e.to_string();
        assert!(e.contains(needle) && !e.contains('\n'), "{e}");
        // Under the same settings (another parallelism) it resumes.
        let mut same = plan_script(&script(
            "data/replay.sql",
            &format!("{taken} SET 'table.exec.resource.default-parallelism' = '3';"),
        ))
        .unwrap();
        same.job().restore(&dir).unwrap();
    }
    // A query without DISTINCT is not split: the switch shapes nothing there.
    let _ = std::fs::remove_dir_all(&dir);
    let plain =
        script("data/replay.sql", "").replace(",\n       COUNT(DISTINCT user_id) AS buyers", "");
    assert!(!plain.contains("DISTINCT"), "{plain}");
    let mut q = plan_script(&plain).unwrap();
    q.job()
        .checkpoint_every(CheckpointDir::new(&*dir), 6000)
        .unwrap();
    run_lines(&mut q, 1000);
    let mut q = plan_script(&format!("{} {plain}", split("16"))).unwrap();
    q.job().restore(&dir).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The bundled orders' table (`data/orders.sql` without its query), its latency 1 h so that
/// mini-batches fire by rows alone.
fn orders_ddl() -> String {
    let base = script("data/orders.sql", "");
    base[..base.find("EXPLAIN").unwrap()].replace("'1 s'", "'1 h'")
}

/// Split-distinct over 16 buckets.
const SPLIT_16: &str = "SET 'table.optimizer.distinct-agg.split.enabled' = 'true'; \
                        SET 'table.optimizer.distinct-agg.split.bucket-num' = '16';";

/// The parallelism setting for `p` workers.
fn workers(p: usize) -> String {
    format!("SET 'table.exec.resource.default-parallelism' = '{p}';")
}

/// Runs `script` with a checkpoint every `every` source rows into `dir` (every one kept):
/// its changelog lines, what it measured, and its checkpoints.
fn run_checkpointed(
    script: &str,
    dir: &std::path::Path,
    every: u64,
) -> (
    Vec<String>,
    tally::run::RunStats,
    Vec<(u64, std::path::PathBuf)>,
) {
    let store = CheckpointDir::new(dir).retain(1000);
    let mut q = plan_script(script).unwrap();
    q.job().checkpoint_every(store.clone(), every).unwrap();
    std::env::set_current_dir(root()).unwrap();
    let (lines, stats) = crate::common::run_query(&mut q, 4096);
    (lines, stats, store.list().unwrap())
}

/// Resumes `script` from the checkpoint `folder` of a run whose changelog was `full`: the
/// lines delivered before the checkpoint and the resumed run's, and what it measured.
fn resume(
    script: &str,
    folder: &std::path::Path,
    full: &[String],
) -> (Vec<String>, tally::run::RunStats) {
    resume_checkpointed(script, folder, full, None)
}

/// [`resume`], taking checkpoints every `every.1` source rows into `every.0` where given.
fn resume_checkpointed(
    script: &str,
    folder: &std::path::Path,
    full: &[String],
    every: Option<(&std::path::Path, u64)>,
) -> (Vec<String>, tally::run::RunStats) {
    let mut q = plan_script(script).unwrap();
    let chk = q.job().restore(folder).unwrap();
    if let Some((dir, rows)) = every {
        q.job()
            .checkpoint_every(CheckpointDir::new(dir), rows)
            .unwrap();
    }
    let delivered: usize = chk.meta("output.rows").unwrap().parse().unwrap();
    let mut lines = full[..delivered].to_vec();
    let (rest, stats) = crate::common::run_query(&mut q, 4096);
    lines.extend(rest);
    (lines, stats)
}

/// The split PARTIAL's entry of a checkpoint (its schema records the hot keys), and how many
/// key columns it has (the query's key, then the bucket columns).
fn partial_entry(
    chk: &tally::checkpoint::Checkpoint,
) -> (&arrow::datatypes::SchemaRef, &[RecordBatch], usize) {
    let (_, schema, batches) = chk
        .entries
        .iter()
        .find(|e| e.1.metadata().contains_key(tally::plan::HOT_KEYS_METADATA))
        .expect("the PARTIAL's state names its hot keys");
    let buckets = schema
        .fields()
        .iter()
        .skip(1)
        .take_while(|f| f.name().starts_with("$f"))
        .count();
    (schema, batches, 1 + buckets)
}

/// A split-distinct run that takes checkpoints spreads only its hot keys: the checkpoint holds
/// one PARTIAL group per cold key (its buckets NULL) and names the hot keys, where spreading
/// every key gave a group per bucket. Restored on another parallelism, whose own sample names
/// other hot keys, or on the ordered runtime, it routes each key as the checkpoint's run did:
/// every resumption gives the unsplit run's table (routed otherwise, a user counted before the
/// checkpoint under one group and after it under another would count twice).
#[test]
fn a_split_with_checkpoints_spreads_only_its_hot_keys_and_a_restore_keeps_them() {
    let ddl = orders_ddl();
    let query = "SELECT shop, COUNT(DISTINCT user_id) AS buyers, COUNT(*) AS orders, \
                 MAX(amount) AS biggest FROM orders GROUP BY shop;";
    let mut unsplit = plan_script(&format!("{ddl}{}{query}", workers(1))).unwrap();
    let expected = table(&run_lines(&mut unsplit, 8192));
    let shops = expected.len();
    assert!(shops > 20, "{expected:?}");
    // The pipelined runtime checkpoints at the end of a round of chunks (one here), the
    // ordered one after the batch that crosses the interval.
    let mut hot_keys = std::collections::BTreeSet::new();
    for (taken, runtime) in [(3, "true"), (2, "false"), (1, "true")] {
        let dir = scratch(&format!("hot-{taken}"));
        let settings = format!(
            "{SPLIT_16}{} SET 'tally.exec.pipelined' = '{runtime}';",
            workers(taken)
        );
        let (full, stats, checkpoints) =
            run_checkpointed(&format!("{ddl}{settings}{query}"), &dir, 30_000);
        let spread_keys = stats.aggregates[0].spread_keys;
        assert_eq!(
            table(&full),
            expected,
            "taken with {settings}: the whole run"
        );
        assert!(
            checkpoints.len() > usize::from(runtime == "false"),
            "{checkpoints:?}"
        );
        for (id, folder) in checkpoints {
            let chk = CheckpointDir::read(&folder).unwrap();
            let (schema, batches, keys) = partial_entry(&chk);
            let hot = &schema.metadata()[tally::plan::HOT_KEYS_METADATA];
            let groups: usize = batches.iter().map(RecordBatch::num_rows).sum();
            // After the shop, the bucket columns (a DISTINCT argument's and the other calls').
            let buckets = keys - 1;
            assert!(buckets >= 1, "{schema:?}");
            let cold: usize = batches
                .iter()
                .map(|b| {
                    (0..b.num_rows())
                        .filter(|&r| (1..=buckets).all(|c| b.column(c).is_null(r)))
                        .count()
                })
                .sum();
            // Groups with some bucket: a spread key's DISTINCT work. The shop with half the
            // orders is hot, and a few more where P is larger: only their DISTINCT work is
            // spread; every shop keeps one group of its own (the calls without DISTINCT, and a
            // cold shop's all).
            let spread = groups - cold;
            let named = hot.split(',').count();
            assert!((1..=8).contains(&named), "{hot}");
            assert!(cold <= shops, "{cold} of {shops}");
            assert!(
                spread > 0 && spread <= 16 * buckets * named,
                "{spread} spread, {named} hot"
            );
            assert_eq!(
                spread_keys,
                Some(named),
                "the run's metrics count its hot keys"
            );
            hot_keys.insert(hot.clone());
            for resumed in [
                workers(1 + id as usize % 3),
                format!("{} SET 'tally.exec.pipelined' = 'false';", workers(2)),
            ] {
                let (lines, stats) =
                    resume(&format!("{ddl}{SPLIT_16}{resumed}{query}"), &folder, &full);
                // It spread the checkpoint's hot keys, not its own sample's.
                assert_eq!(stats.aggregates[0].spread_keys, Some(named), "{resumed}");
                assert_eq!(
                    table(&lines),
                    expected,
                    "taken with {settings}, resumed from checkpoint {id} with {resumed}"
                );
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
    // The parallelisms named different hot keys (P = 3 one more than P = 1 and 2): the
    // resumptions across them restored keys routed otherwise than their own samples would.
    assert!(hot_keys.len() >= 2, "{hot_keys:?}");
}

/// A split-distinct run over insert-only input whose PARTIAL merges its buckets (one group per
/// key and worker, where every call's state lies with a DISTINCT argument's bucket or with the
/// keys alone) keeps merging when it takes checkpoints: each checkpoint cuts that state into
/// the groups of state keyed by every key, whose keys are unique. Any run restores it, on
/// another parallelism (merging it again) or on the ordered runtime (keeping a group per
/// bucket), as it restores the ordered runtime's checkpoints, and gives the unsplit run's
/// table; resumed as it was taken (checkpoints included), it writes the uninterrupted run's
/// changelog. Over an Expand of two DISTINCT arguments beside calls of the keys alone, and over
/// one DISTINCT argument alone.
#[test]
fn a_split_that_merges_its_buckets_takes_checkpoints_any_run_restores() {
    let ddl = orders_ddl();
    for query in [
        "SELECT shop, COUNT(*) AS orders, COUNT(DISTINCT user_id) AS buyers, \
         COUNT(DISTINCT status) AS statuses, MAX(amount) AS biggest FROM orders GROUP BY shop;",
        "SELECT shop, COUNT(DISTINCT user_id) AS buyers FROM orders GROUP BY shop;",
    ] {
        let mut unsplit = plan_script(&format!("{ddl}{}{query}", workers(1))).unwrap();
        let expected = table(&run_lines(&mut unsplit, 8192));
        for (taken, pipelined) in [(1, true), (2, true), (3, true), (2, false)] {
            let dir = scratch(&format!("merged-{taken}-{pipelined}-{}", query.len()));
            let settings = format!(
                "{}SET 'tally.exec.pipelined' = '{pipelined}';",
                workers(taken)
            );
            let (full, stats, checkpoints) =
                run_checkpointed(&format!("{ddl}{SPLIT_16}{settings}{query}"), &dir, 20_000);
            let ctx = format!("{query} taken with {settings}");
            assert_eq!(table(&full), expected, "{ctx}: the whole run");
            assert_eq!(stats.aggregates[0].merges_buckets, pipelined, "{ctx}");
            assert!(!checkpoints.is_empty(), "{ctx}");
            for (id, folder) in checkpoints {
                let chk = CheckpointDir::read(&folder).unwrap();
                let (schema, batches, keys) = partial_entry(&chk);
                // One row per key (the shop and the bucket columns).
                let key_schema =
                    std::sync::Arc::new(schema.project(&(0..keys).collect::<Vec<_>>()).unwrap());
                let mut seen = std::collections::BTreeSet::new();
                for b in batches {
                    let key_columns =
                        RecordBatch::try_new(key_schema.clone(), b.columns()[..keys].to_vec())
                            .unwrap();
                    let text = arrow::util::pretty::pretty_format_batches(&[key_columns])
                        .unwrap()
                        .to_string();
                    for line in text.lines().skip(3).filter(|l| l.starts_with('|')) {
                        assert!(seen.insert(line.to_string()), "{ctx}: {line} twice");
                    }
                }
                // Resumed as it was taken, checkpoints and all: the same changelog, byte for
                // byte (the groups restored in their order, merged again).
                if pipelined {
                    let again = dir.join(format!("again-{id}"));
                    let script = format!("{ddl}{SPLIT_16}{settings}{query}");
                    let (lines, _) =
                        resume_checkpointed(&script, &folder, &full, Some((&again, 20_000)));
                    assert!(lines == full, "{ctx}: resumed from checkpoint {id}");
                }
                for resumed in [
                    workers(1 + id as usize % 3),
                    format!("{} SET 'tally.exec.pipelined' = 'false';", workers(2)),
                ] {
                    let (lines, stats) =
                        resume(&format!("{ddl}{SPLIT_16}{resumed}{query}"), &folder, &full);
                    let pipelined = !resumed.contains("pipelined");
                    assert_eq!(stats.aggregates[0].merges_buckets, pipelined, "{resumed}");
                    assert_eq!(
                        table(&lines),
                        expected,
                        "{ctx}, resumed from checkpoint {id} with {resumed}"
                    );
                }
            }
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }
}
