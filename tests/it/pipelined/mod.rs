//! The pipelined runtime (the source split across the workers, mini-batches per worker, epochs
//! aligned at each worker, no barrier) gives the final table of a row-at-a-time reference under
//! every strategy, parallelism, mini-batch size and batch size, over Parquet (split by row
//! groups, and by row ranges inside a row group) and Arrow files (split by record batches); its
//! changelog is the same on every run; an error in one split ends the run with that error.

mod errors;
mod reading;
mod results;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

use arrow::array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion_expr::{Expr, ExprFunctionExt, col, lit};
use parquet::arrow::ArrowWriter;
use parquet::file::properties::WriterProperties;
use rand::Rng;
use rand::rngs::StdRng;
use tally::aggregates::{count, count_star, max, min, sum};
use tally::changelog::ChangeBatch;
use tally::pipeline::{AggregateStage, CalcStage, Pipeline, Stage};
use tally::run::{Job, RunStats};
use tally::runtime::Runtime;
use tally::source::{FileTable, Format};
use tally::{Config, GroupAggregate};

use crate::common::{Materialized, format_changes};
use crate::scratch::Scratch;

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
    /// `tally.exec.pipelined.splits-per-worker` (set where `pipelined`).
    pub(crate) splits: usize,
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
    if s.pipelined {
        pairs.push((
            "tally.exec.pipelined.splits-per-worker".into(),
            s.splits.to_string(),
        ));
    }
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

pub(crate) fn table(path: &Path, format: Format) -> FileTable {
    FileTable {
        name: "t".into(),
        schema: schema(),
        path: path.to_path_buf(),
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

pub(crate) fn temp(name: &str) -> Scratch {
    Scratch::file(&format!("pipelined-{name}"))
}
