//! Results against the row-at-a-time reference: every split, strategy, parallelism and size,
//! two keys while the local phase steps aside, and when the global phase fires.

use std::collections::BTreeMap;
use std::path::Path;

use datafusion_expr::col;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tally::aggregates::{count_star, sum};
use tally::changelog::ChangeBatch;
use tally::source::Format;

use super::{
    Row, Settings, batch, final_rows, grouped_job, opt, random_rows, reference, run, schema, table,
    temp, write_csv, write_parquet,
};
use crate::common::{format_changes, test_seed};

fn write_arrow(path: &Path, rows: &[Row], rng: &mut StdRng) {
    let file = std::fs::File::create(path).unwrap();
    let mut w = arrow::ipc::writer::FileWriter::try_new(file, &schema()).unwrap();
    let mut at = 0;
    while at < rows.len() {
        let n = rng.random_range(1..=400).min(rows.len() - at);
        w.write(&batch(&rows[at..at + n])).unwrap();
        at += n;
    }
    w.finish().unwrap();
}

#[test]
fn every_split_and_strategy_matches_the_reference() {
    for seed in 0..6u64 {
        let mut rng = StdRng::seed_from_u64(test_seed(seed));
        let n = rng.random_range(500..3000);
        let rows = random_rows(&mut rng, n);
        let kept: Vec<Row> = rows.iter().filter(|r| r.v != Some(3)).cloned().collect();
        // Parquet with many row groups, with one (split by row ranges), and an Arrow file.
        let many = temp(&format!("many-{seed}.parquet"));
        write_parquet(&many, &rows, rng.random_range(100..700));
        let one = temp(&format!("one-{seed}.parquet"));
        write_parquet(&one, &rows, n);
        let arrow = temp(&format!("t-{seed}.arrow"));
        write_arrow(&arrow, &rows, &mut rng);
        let csv = temp(&format!("t-{seed}.csv"));
        write_csv(&csv, &rows);
        for (path, format) in [
            (many, Format::Parquet),
            (one, Format::Parquet),
            (arrow, Format::Arrow),
            (csv, Format::Csv),
        ] {
            for _ in 0..3 {
                let s = Settings {
                    workers: rng.random_range(1..=4),
                    two_phase: rng.random_bool(0.7),
                    size: [1, 7, 300][rng.random_range(0..3)],
                    adaptive_probe: rng.random_bool(0.5),
                    pipelined: true,
                    batch: [5, 64, 4096][rng.random_range(0..3)],
                    filter: rng.random_bool(0.5),
                    splits: rng.random_range(1..=3),
                };
                let what = format!("seed {seed}, {} {s:?}", path.display());
                let (stats, lines) = run(table(&path, format), &s);
                assert!(
                    stats.runtime.starts_with("pipelined"),
                    "{what}: {}",
                    stats.runtime
                );
                assert_eq!(stats.rows_in, n as u64, "{what}");
                assert_eq!(stats.rows_out, lines.len() as u64, "{what}");
                let expected = reference(if s.filter { &kept } else { &rows });
                assert_eq!(final_rows(&lines), expected, "{what}");
                let m = &stats.aggregates[0];
                let kept_rows = if s.filter { kept.len() } else { n };
                assert_eq!(m.rows_in, kept_rows as u64, "{what}");
                let r = m.runtime.as_ref().expect("runtime metrics");
                let sources = r
                    .tasks
                    .iter()
                    .filter(|t| t.role == tally::operator::TaskRole::Source)
                    .count();
                assert!(
                    sources >= 1 && sources <= s.workers * s.splits,
                    "{what}: {sources}"
                );
                assert_eq!(r.tasks.len(), sources + s.workers + 1, "{what}");
                assert!((0.0..=1.0).contains(&r.serial_fraction), "{what}");
                // The mean count of busy tasks: never more than the tasks there are.
                let mean = r.mean_busy_tasks;
                assert!(
                    mean >= 0.0 && mean <= r.tasks.len() as f64,
                    "{what}: {mean}"
                );
                assert_eq!(stats.mean_busy_tasks, Some(mean), "{what}");
                let read: u64 = r
                    .tasks
                    .iter()
                    .filter(|t| t.role == tally::operator::TaskRole::Source)
                    .map(|t| t.rows)
                    .sum();
                assert_eq!(read, n as u64, "{what}");
                // The same changelog on every run.
                let (_, again) = run(table(&path, format), &s);
                assert_eq!(again, lines, "{what}: a second run");
                // The ordered runtime: another changelog, the same final table.
                let ordered = Settings {
                    pipelined: false,
                    ..s.clone()
                };
                let (stats, lines) = run(table(&path, format), &ordered);
                assert!(stats.runtime.starts_with("ordered"), "{what}");
                let serial = stats
                    .serial_fraction
                    .expect("the ordered runtime's serial fraction");
                assert!((0.0..=1.0).contains(&serial), "{what}: {serial}");
                let mean = stats
                    .mean_busy_tasks
                    .expect("the ordered runtime's busy tasks");
                assert!(mean.is_finite() && mean >= 0.0, "{what}: {mean}");
                if ordered.workers == 1 {
                    // One worker: the caller's thread alone, but while the reader decodes.
                    assert!(serial > 0.0, "{what}: {serial}");
                }
                assert_eq!(final_rows(&lines), expected, "{what}: ordered");
            }
        }
    }
}

type TwoKeys = (Option<String>, Option<i64>);

/// Keys of a string and an integer (a packed key table, which hashes the keys it keeps): with
/// the local phase stepping aside and back, on one worker the rows it lets by reach the keyed
/// state without key hashes (the state hashes each new key itself), on two they are hashed to
/// be routed; either way the final table is the reference's.
#[test]
fn two_keys_match_the_reference_while_the_local_phase_steps_aside() {
    let mut bypasses = 0;
    for seed in 0..4u64 {
        let mut rng = StdRng::seed_from_u64(100 + seed);
        let n = rng.random_range(1000..3000);
        let rows = random_rows(&mut rng, n);
        let path = temp(&format!("two-keys-{seed}.parquet"));
        write_parquet(&path, &rows, rng.random_range(200..900));
        // (k, g) -> (COUNT(*), SUM(v)).
        let mut by_key: BTreeMap<TwoKeys, (usize, Option<i64>)> = BTreeMap::new();
        for r in &rows {
            let e = by_key.entry((r.k.clone(), r.g)).or_insert((0, None));
            e.0 += 1;
            if let Some(v) = r.v {
                e.1 = Some(e.1.unwrap_or(0) + v);
            }
        }
        let mut expected: Vec<String> = by_key
            .iter()
            .map(|((k, g), (c, t))| format!("[{}, {}, {c}, {}]", opt(k.clone()), opt(*g), opt(*t)))
            .collect();
        expected.sort();
        for workers in [1, 2] {
            let s = Settings {
                workers,
                two_phase: true,
                size: [7, 300][rng.random_range(0..2)],
                adaptive_probe: true,
                pipelined: true,
                batch: [64, 4096][rng.random_range(0..2)],
                filter: false,
                splits: 1,
            };
            let what = format!("seed {seed}, {s:?}");
            let aggs = vec![count_star().alias("n"), sum(col("v")).alias("total")];
            let mut lines = vec![];
            let mut sink = |b: &ChangeBatch| -> tally::Result<()> {
                lines.extend(format_changes(std::slice::from_ref(b)));
                Ok(())
            };
            let stats = grouped_job(
                table(&path, Format::Parquet),
                &s,
                vec![col("k"), col("g")],
                aggs,
            )
            .run(s.batch, &mut sink, |_, _| {})
            .unwrap();
            assert!(stats.runtime.starts_with("pipelined"), "{what}");
            assert_eq!(final_rows(&lines), expected, "{what}");
            if workers == 1 {
                bypasses += stats.aggregates[0]
                    .local
                    .as_ref()
                    .map_or(0, |l| l.bypass_decisions);
            }
        }
    }
    assert!(
        bypasses > 0,
        "the local phase never stepped aside on one worker"
    );
}

/// A worker's global phase fires as Flink's global aggregate does: once the accumulator rows it
/// merged since it last fired reach the mini-batch size (and at the end of the input), not at
/// every local flush. One split, four keys in turn, mini-batches of 100 rows: each local flush
/// sends 4 accumulator rows, so the global phase fires every 25 flushes: 4 times over 10,000
/// rows (4 `+I`, then a `-U`/`+U` pair per key 3 times), where a firing per flush would give
/// 4 + 99 x 8 changes.
#[test]
fn a_global_phase_fires_after_a_mini_batch_of_accumulator_rows() {
    let rows: Vec<Row> = (0..10_000)
        .map(|i| Row {
            k: Some(format!("k{}", i % 4)),
            g: Some(i % 12),
            v: Some(i % 100),
            s: i.to_string(),
        })
        .collect();
    let path = temp("bundle.parquet");
    write_parquet(&path, &rows, rows.len());
    let s = Settings {
        workers: 1,
        two_phase: true,
        size: 100,
        adaptive_probe: false,
        pipelined: true,
        batch: 1000,
        filter: false,
        splits: 1,
    };
    let (stats, lines) = run(table(&path, Format::Parquet), &s);
    assert_eq!(stats.rows_out, 4 + 3 * 8, "changes: {}", lines.len());
    assert_eq!(lines.iter().filter(|l| l.starts_with("-U")).count(), 3 * 4);
    assert_eq!(final_rows(&lines), reference(&rows));
}
