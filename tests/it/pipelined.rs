//! The pipelined runtime (the source split across the workers, mini-batches per worker, epochs
//! aligned at each worker, no barrier) gives the final table of a row-at-a-time reference under
//! every strategy, parallelism, mini-batch size and batch size, over Parquet (split by row
//! groups, and by row ranges inside a row group) and Arrow files (split by record batches); its
//! changelog is the same on every run; an error in one split ends the run with that error.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion_expr::{Expr, ExprFunctionExt, col, lit};
use parquet::arrow::ArrowWriter;
use parquet::file::properties::WriterProperties;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tally::aggregates::{count, count_star, max, min, sum};
use tally::changelog::ChangeBatch;
use tally::pipeline::{AggregateStage, CalcStage, Pipeline, Stage};
use tally::run::{Job, RunStats};
use tally::runtime::Runtime;
use tally::source::{FileTable, Format};
use tally::{Config, GroupAggregate};

use crate::common::{Materialized, format_changes};

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Row {
    pub(crate) k: Option<String>,
    g: Option<i64>,
    v: Option<i64>,
    s: String,
}

/// A hot key with half the rows, 30 others, NULL keys and values.
pub(crate) fn random_rows(rng: &mut StdRng, n: usize) -> Vec<Row> {
    (0..n)
        .map(|_| Row {
            k: if rng.random_bool(0.03) {
                None
            } else if rng.random_bool(0.5) {
                Some("hot".into())
            } else {
                Some(format!("k{}", rng.random_range(0..30)))
            },
            g: rng.random_bool(0.9).then(|| rng.random_range(0..12)),
            v: rng.random_bool(0.9).then(|| rng.random_range(-50..100)),
            s: rng.random_range(0..1000).to_string(),
        })
        .collect()
}

pub(crate) fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("k", DataType::Utf8, true),
        Field::new("g", DataType::Int64, true),
        Field::new("v", DataType::Int64, true),
        Field::new("s", DataType::Utf8, false),
    ]))
}

pub(crate) fn batch(rows: &[Row]) -> RecordBatch {
    let cols: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from_iter(rows.iter().map(|r| r.k.clone()))),
        Arc::new(Int64Array::from_iter(rows.iter().map(|r| r.g))),
        Arc::new(Int64Array::from_iter(rows.iter().map(|r| r.v))),
        Arc::new(StringArray::from_iter_values(rows.iter().map(|r| &r.s))),
    ];
    RecordBatch::try_new(schema(), cols).unwrap()
}

fn write_parquet(path: &Path, rows: &[Row], row_group: usize) {
    write_parquet_with(path, rows, row_group, WriterProperties::builder());
}

/// [`write_parquet`] with other writer properties (small pages, say).
fn write_parquet_with(
    path: &Path,
    rows: &[Row],
    row_group: usize,
    props: parquet::file::properties::WriterPropertiesBuilder,
) {
    let props = props.set_max_row_group_row_count(Some(row_group)).build();
    let file = std::fs::File::create(path).unwrap();
    let mut w = ArrowWriter::try_new(file, schema(), Some(props)).unwrap();
    for chunk in rows.chunks(333) {
        w.write(&batch(chunk)).unwrap();
    }
    w.close().unwrap();
}

/// A CSV file of the rows (a header, NULL as an empty field, no quotes).
pub(crate) fn write_csv(path: &Path, rows: &[Row]) {
    let file = std::fs::File::create(path).unwrap();
    let mut w = arrow::csv::WriterBuilder::new()
        .with_header(true)
        .build(file);
    for chunk in rows.chunks(500) {
        w.write(&batch(chunk)).unwrap();
    }
}

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

fn opt<T: ToString>(v: Option<T>) -> String {
    v.map_or("null".to_string(), |v| v.to_string())
}

/// `GROUP BY k`: COUNT(*), SUM(v), MIN(v), MAX(v), COUNT(DISTINCT g), SUM(v) FILTER (v > 0),
/// SUM(CAST(s AS BIGINT)), one row at a time.
pub(crate) fn reference(rows: &[Row]) -> Vec<String> {
    let mut by_key: BTreeMap<Option<String>, Vec<&Row>> = BTreeMap::new();
    for r in rows {
        by_key.entry(r.k.clone()).or_default().push(r);
    }
    let mut out: Vec<String> = by_key
        .iter()
        .map(|(k, rs)| {
            let vs: Vec<i64> = rs.iter().filter_map(|r| r.v).collect();
            let pos: Vec<i64> = vs.iter().copied().filter(|&v| v > 0).collect();
            let gs: BTreeSet<i64> = rs.iter().filter_map(|r| r.g).collect();
            let ss: i64 = rs.iter().map(|r| r.s.parse::<i64>().unwrap()).sum();
            let fields = [
                opt(k.clone()),
                rs.len().to_string(),
                opt((!vs.is_empty()).then(|| vs.iter().sum::<i64>())),
                opt(vs.iter().min()),
                opt(vs.iter().max()),
                gs.len().to_string(),
                opt((!pos.is_empty()).then(|| pos.iter().sum::<i64>())),
                ss.to_string(),
            ];
            format!("[{}]", fields.join(", "))
        })
        .collect();
    out.sort();
    out
}

/// The aggregates of [`reference`], by `k`.
pub(crate) fn aggregates() -> Vec<Expr> {
    let cast_s = Expr::Cast(datafusion_expr::expr::Cast::new(
        Box::new(col("s")),
        DataType::Int64,
    ));
    vec![
        count_star().alias("n"),
        sum(col("v")).alias("total"),
        min(col("v")).alias("lo"),
        max(col("v")).alias("hi"),
        count(col("g")).distinct().build().unwrap().alias("gs"),
        sum(col("v"))
            .filter(col("v").gt(lit(0i64)))
            .build()
            .unwrap()
            .alias("positive"),
        sum(cast_s).alias("ss"),
    ]
}

/// One configuration of the aggregate.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) workers: usize,
    pub(crate) two_phase: bool,
    pub(crate) size: usize,
    pub(crate) adaptive_probe: bool,
    pub(crate) pipelined: bool,
    pub(crate) batch: usize,
    /// A Calc stage before the aggregate: `WHERE v IS NULL OR v <> 3`.
    pub(crate) filter: bool,
}

pub(crate) fn job(table: FileTable, s: &Settings) -> Job {
    grouped_job(table, s, vec![col("k")], aggregates())
}

/// [`job`] grouped by `keys` with the aggregates `aggs`.
fn grouped_job(table: FileTable, s: &Settings, keys: Vec<Expr>, aggs: Vec<Expr>) -> Job {
    let mut pairs: Vec<(String, String)> = vec![
        (
            "table.exec.resource.default-parallelism".into(),
            s.workers.to_string(),
        ),
        ("table.exec.mini-batch.enabled".into(), "true".into()),
        ("table.exec.mini-batch.allow-latency".into(), "1 h".into()),
        ("table.exec.mini-batch.size".into(), s.size.to_string()),
        (
            "table.optimizer.agg-phase-strategy".into(),
            if s.two_phase {
                "TWO_PHASE"
            } else {
                "ONE_PHASE"
            }
            .into(),
        ),
        ("tally.exec.pipelined".into(), s.pipelined.to_string()),
    ];
    if s.adaptive_probe {
        for (k, v) in [
            ("tally.exec.local-agg.adaptive.threshold", "0.05"),
            ("tally.exec.local-agg.adaptive.min-rows", "20"),
            ("tally.exec.local-agg.adaptive.probe-interval", "60"),
        ] {
            pairs.push((k.into(), v.into()));
        }
    }
    let agg = GroupAggregate::builder(Arc::clone(&table.schema))
        .group_by(keys)
        .aggregate(aggs)
        .config(Config::from_pairs(pairs).unwrap())
        .build_parallel()
        .unwrap()
        .with_min_slice_rows(1);
    let mut stages: Vec<Box<dyn Stage>> = vec![];
    if s.filter {
        // WHERE v IS NULL OR v <> 3, run by each split's task before the aggregate.
        let input = datafusion_common::DFSchema::try_from(schema()).unwrap();
        let filter = col("v").is_null().or(col("v").not_eq(lit(3i64)));
        stages.push(Box::new(
            CalcStage::try_new(&input, Some(&filter), None, schema()).unwrap(),
        ));
    }
    stages.push(Box::new(AggregateStage::new(agg)));
    Job::new(
        table,
        Pipeline::new(stages, Runtime::new(s.workers).unwrap()),
        None,
    )
}

pub(crate) fn table(path: PathBuf, format: Format) -> FileTable {
    FileTable {
        name: "t".into(),
        schema: schema(),
        path,
        format,
        changelog_column: None,
        time_column: None,
        unread_columns: vec![],
        dictionary_columns: vec![],
    }
}

/// Runs the job; returns its stats and changelog lines.
fn run(table: FileTable, s: &Settings) -> (RunStats, Vec<String>) {
    let mut lines = vec![];
    let mut sink = |b: &ChangeBatch| -> tally::Result<()> {
        lines.extend(format_changes(std::slice::from_ref(b)));
        Ok(())
    };
    let stats = job(table, s).run(s.batch, &mut sink, |_, _| {}).unwrap();
    (stats, lines)
}

pub(crate) fn final_rows(lines: &[String]) -> Vec<String> {
    let mut m = Materialized::default();
    m.apply_lines(lines);
    m.rows()
}

pub(crate) fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tally-pipelined-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

#[test]
fn every_split_and_strategy_matches_the_reference() {
    for seed in 0..6u64 {
        let mut rng = StdRng::seed_from_u64(seed);
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
                };
                let what = format!("seed {seed}, {} {s:?}", path.display());
                let (stats, lines) = run(table(path.clone(), format), &s);
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
                assert!(sources >= 1 && sources <= s.workers, "{what}: {sources}");
                assert_eq!(r.tasks.len(), sources + s.workers + 1, "{what}");
                assert!((0.0..=1.0).contains(&r.serial_fraction), "{what}");
                let read: u64 = r
                    .tasks
                    .iter()
                    .filter(|t| t.role == tally::operator::TaskRole::Source)
                    .map(|t| t.rows)
                    .sum();
                assert_eq!(read, n as u64, "{what}");
                // The same changelog on every run.
                let (_, again) = run(table(path.clone(), format), &s);
                assert_eq!(again, lines, "{what}: a second run");
                // The ordered runtime: another changelog, the same final table.
                let ordered = Settings {
                    pipelined: false,
                    ..s.clone()
                };
                let (stats, lines) = run(table(path.clone(), format), &ordered);
                assert!(stats.runtime.starts_with("ordered"), "{what}");
                let serial = stats
                    .serial_fraction
                    .expect("the ordered runtime's serial fraction");
                assert!((0.0..=1.0).contains(&serial), "{what}: {serial}");
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
            };
            let what = format!("seed {seed}, {s:?}");
            let aggs = vec![count_star().alias("n"), sum(col("v")).alias("total")];
            let mut lines = vec![];
            let mut sink = |b: &ChangeBatch| -> tally::Result<()> {
                lines.extend(format_changes(std::slice::from_ref(b)));
                Ok(())
            };
            let stats = grouped_job(
                table(path.clone(), Format::Parquet),
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

/// Splits of Parquet row groups, and of row ranges inside one: every row once, and as many
/// source tasks as there are workers.
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
    };
    let (stats, lines) = run(table(path, Format::Parquet), &s);
    assert_eq!(stats.rows_out, 4 + 3 * 8, "changes: {}", lines.len());
    assert_eq!(lines.iter().filter(|l| l.starts_with("-U")).count(), 3 * 4);
    assert_eq!(final_rows(&lines), reference(&rows));
}

#[test]
fn parquet_is_split_across_every_worker() {
    let mut rng = StdRng::seed_from_u64(7);
    let rows = random_rows(&mut rng, 4000);
    // The last cases write pages of 100 rows (with an offset index, as parquet-rs does by
    // default): a split of a row group then reads only the pages that hold its rows.
    for (row_group, workers, pages) in [
        (1000, 4, false),
        (4000, 3, false),
        (1500, 2, false),
        (4000, 3, true),
        (1500, 5, true),
    ] {
        let path = temp(&format!("split-{row_group}-{workers}-{pages}.parquet"));
        let props = WriterProperties::builder();
        let props = if pages {
            props
                .set_data_page_row_count_limit(100)
                .set_write_batch_size(50)
        } else {
            props
        };
        write_parquet_with(&path, &rows, row_group, props);
        let splits = table(path, Format::Parquet)
            .open_splits(256, workers)
            .unwrap();
        assert_eq!(splits.len(), workers, "{row_group} rows per group");
        let mut seen: Vec<String> = vec![];
        for split in splits {
            for b in split {
                let b = b.unwrap();
                let s = b
                    .data
                    .column(3)
                    .as_any()
                    .downcast_ref::<StringArray>()
                    .unwrap();
                let k = b
                    .data
                    .column(0)
                    .as_any()
                    .downcast_ref::<StringArray>()
                    .unwrap();
                for i in 0..b.num_rows() {
                    seen.push(format!(
                        "{}:{}",
                        opt(k.is_valid(i).then(|| k.value(i))),
                        s.value(i)
                    ));
                }
            }
        }
        let mut want: Vec<String> = rows
            .iter()
            .map(|r| format!("{}:{}", opt(r.k.clone()), r.s))
            .collect();
        want.sort();
        seen.sort();
        assert_eq!(seen, want, "{row_group} rows per group, {workers} workers");
    }
}

/// A value that fails to evaluate, in one split: the run ends with that error (no hang, no
/// panic), whichever worker reads it.
#[test]
fn an_error_in_one_split_ends_the_run_with_it() {
    let mut rng = StdRng::seed_from_u64(11);
    let mut rows = random_rows(&mut rng, 3000);
    rows[2500].s = "not a number".into();
    let path = temp("bad.parquet");
    write_parquet(&path, &rows, 500);
    for workers in 1..=4 {
        let s = Settings {
            workers,
            two_phase: workers % 2 == 0,
            size: 100,
            adaptive_probe: false,
            pipelined: true,
            batch: 128,
            filter: false,
        };
        let mut sink = |_: &ChangeBatch| -> tally::Result<()> { Ok(()) };
        let err = job(table(path.clone(), Format::Parquet), &s)
            .run(s.batch, &mut sink, |_, _| {})
            .unwrap_err();
        assert!(
            err.to_string().contains("not a number"),
            "{workers} workers: {err}"
        );
    }
}

/// A sink that fails stops every task: the run ends with the sink's error.
#[test]
fn a_failing_sink_stops_the_run() {
    let mut rng = StdRng::seed_from_u64(12);
    let rows = random_rows(&mut rng, 3000);
    let path = temp("sink.parquet");
    write_parquet(&path, &rows, 300);
    let s = Settings {
        workers: 3,
        two_phase: true,
        size: 50,
        adaptive_probe: false,
        pipelined: true,
        batch: 64,
        filter: true,
    };
    let mut written = 0;
    let mut sink = |_: &ChangeBatch| -> tally::Result<()> {
        written += 1;
        if written == 3 {
            return Err(tally::Error::io("disk full"));
        }
        Ok(())
    };
    let err = job(table(path, Format::Parquet), &s)
        .run(s.batch, &mut sink, |_, _| {})
        .unwrap_err();
    assert!(err.to_string().contains("disk full"), "{err}");
}

/// A Parquet column the query never reads is not decoded: here it holds text where a BIGINT is
/// declared, which a query reading it reports, and one that does not never sees.
#[test]
fn columns_nothing_reads_are_not_decoded() {
    let file_schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Utf8, true),
        Field::new("v", DataType::Int64, true),
        Field::new("junk", DataType::Utf8, true),
    ]));
    let n = 5000;
    let cols: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from_iter_values(
            (0..n).map(|i| format!("k{}", i % 7)),
        )),
        Arc::new(Int64Array::from_iter_values(0..n as i64)),
        Arc::new(StringArray::from_iter_values(
            (0..n).map(|_| "not a number"),
        )),
    ];
    let path = temp("junk.parquet");
    let props = WriterProperties::builder()
        .set_max_row_group_row_count(Some(1000))
        .build();
    let mut w = ArrowWriter::try_new(
        std::fs::File::create(&path).unwrap(),
        Arc::clone(&file_schema),
        Some(props),
    )
    .unwrap();
    w.write(&RecordBatch::try_new(file_schema, cols).unwrap())
        .unwrap();
    w.close().unwrap();
    let declared = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Utf8, true),
        Field::new("v", DataType::Int64, true),
        Field::new("junk", DataType::Int64, true),
    ]));
    // (pipelined runtime, the query reads `junk`, a filter before the aggregate)
    for (pipelined, reads_junk, filter) in [
        (true, false, false),
        (false, false, false),
        (true, false, true),
        (true, true, false),
    ] {
        let table = FileTable {
            schema: Arc::clone(&declared),
            ..table(path.clone(), Format::Parquet)
        };
        let config = Config::from_pairs([
            ("table.exec.resource.default-parallelism", "2"),
            ("table.exec.mini-batch.enabled", "true"),
            ("table.exec.mini-batch.allow-latency", "1 h"),
            ("table.exec.mini-batch.size", "100"),
            (
                "tally.exec.pipelined",
                if pipelined { "true" } else { "false" },
            ),
        ])
        .unwrap();
        let summed = if reads_junk { col("junk") } else { col("v") };
        let agg = GroupAggregate::builder(Arc::clone(&declared))
            .group_by([col("k")])
            .aggregate([count_star().alias("n"), sum(summed).alias("s")])
            .config(config)
            .build_parallel()
            .unwrap();
        let mut stages: Vec<Box<dyn Stage>> = vec![];
        if filter {
            // WHERE v >= 0: keeps every row, and reads `v` only.
            let input = datafusion_common::DFSchema::try_from(declared.as_ref().clone()).unwrap();
            let keep = col("v").gt_eq(lit(0i64));
            stages.push(Box::new(
                CalcStage::try_new(&input, Some(&keep), None, Arc::clone(&declared)).unwrap(),
            ));
        }
        stages.push(Box::new(AggregateStage::new(agg)));
        let mut job = Job::new(table, Pipeline::new(stages, Runtime::new(2).unwrap()), None);
        let mut lines = vec![];
        let mut sink = |b: &ChangeBatch| -> tally::Result<()> {
            lines.extend(format_changes(std::slice::from_ref(b)));
            Ok(())
        };
        let result = job.run(512, &mut sink, |_, _| {});
        if reads_junk {
            let err = result.unwrap_err().to_string();
            assert!(err.contains("junk"), "{err}");
            continue;
        }
        result.unwrap();
        let mut expected: Vec<String> = (0..7)
            .map(|k| {
                let vs: Vec<i64> = (0..n as i64).filter(|i| i % 7 == k).collect();
                format!("[k{k}, {}, {}]", vs.len(), vs.iter().sum::<i64>())
            })
            .collect();
        expected.sort();
        assert_eq!(
            final_rows(&lines),
            expected,
            "pipelined {pipelined}, filter {filter}"
        );
    }
}
