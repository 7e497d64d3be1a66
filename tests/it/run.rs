//! A library user runs, checkpoints and restores a pipeline over a file without the SQL front
//! end (`tally::run::Job`), and gets the result a single operator computes.

use std::path::PathBuf;
use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use datafusion_expr::{ExprFunctionExt, col};
use tally::Config;
use tally::aggregates::{count, count_star, max, sum};
use tally::checkpoint::CheckpointDir;
use tally::pipeline::{AggregateStage, Pipeline, Stage};
use tally::run::Job;
use tally::runtime::Runtime;
use tally::sink::{FinalTable, ResultTable};
use tally::source::{FileTable, Format};

fn orders() -> FileTable {
    FileTable {
        name: "orders".into(),
        schema: Arc::new(Schema::new(vec![
            Field::new("order_id", DataType::Int64, true),
            Field::new("shop", DataType::Utf8, true),
            Field::new("user_id", DataType::Int64, true),
            Field::new("amount", DataType::Int64, true),
            Field::new("status", DataType::Utf8, true),
            Field::new("ts", DataType::Timestamp(TimeUnit::Millisecond, None), true),
        ])),
        path: PathBuf::from("data/orders.parquet"),
        format: Format::Parquet,
        changelog_column: None,
        time_column: None,
        unread_columns: vec![],
        dictionary_columns: vec![],
    }
}

/// `SELECT shop, COUNT(*), SUM(amount), MAX(amount), COUNT(DISTINCT user_id) GROUP BY shop` on
/// `workers` workers, mini-batch on (two phases) or off.
fn job(workers: usize, mini_batch: bool) -> Job {
    job_on(workers, mini_batch, true)
}

/// [`job`], on the pipelined runtime where it can run or on the ordered one.
fn job_on(workers: usize, mini_batch: bool, pipelined: bool) -> Job {
    let table = orders();
    let mut pairs = vec![(
        "table.exec.resource.default-parallelism".to_string(),
        workers.to_string(),
    )];
    if mini_batch {
        for (k, v) in [
            ("table.exec.mini-batch.enabled", "true"),
            ("table.exec.mini-batch.allow-latency", "1 h"),
            ("table.exec.mini-batch.size", "700"),
        ] {
            pairs.push((k.into(), v.into()));
        }
    }
    pairs.push(("tally.exec.pipelined".into(), pipelined.to_string()));
    let agg = tally::GroupAggregate::builder(Arc::clone(&table.schema))
        .group_by([col("shop")])
        .aggregate([
            count_star().alias("orders"),
            sum(col("amount")).alias("total"),
            max(col("amount")).alias("biggest"),
            count(col("user_id"))
                .distinct()
                .build()
                .unwrap()
                .alias("buyers"),
        ])
        .config(Config::from_pairs(pairs).unwrap())
        .build_parallel()
        .unwrap();
    assert_eq!(agg.is_two_phase(), mini_batch);
    let stages: Vec<Box<dyn Stage>> = vec![Box::new(AggregateStage::new(agg))];
    Job::new(
        table,
        Pipeline::new(stages, Runtime::new(workers).unwrap()),
        None,
    )
}

fn table() -> ResultTable {
    // The aggregate's output is a changelog keyed by `shop`.
    let schema = Arc::new(Schema::new(vec![
        Field::new("shop", DataType::Utf8, true),
        Field::new("orders", DataType::Int64, false),
        Field::new("total", DataType::Int64, true),
        Field::new("biggest", DataType::Int64, true),
        Field::new("buyers", DataType::Int64, false),
    ]));
    ResultTable::Upsert(FinalTable::try_new(schema, &[0]).unwrap())
}

#[test]
fn a_job_runs_checkpoints_and_resumes_without_sql() {
    // The reference: one worker, mini-batch off (one transition per record).
    let mut reference = table();
    let stats = job(1, false).run(8192, &mut reference, |_, _| {}).unwrap();
    assert_eq!(stats.rows_in, 100_000);
    let expected = reference.to_batch().unwrap();
    assert_eq!(expected.num_rows(), 50, "one row per shop");

    // The ordered runtime on two workers (a checkpoint after the batch that brings 30 000
    // rows), and the pipelined one on one worker (after the round of chunks, here one
    // mini-batch of 700 rows, that does): three checkpoints each.
    for (workers, pipelined, runtime) in [(2, false, "ordered"), (1, true, "pipelined")] {
        let dir = std::env::temp_dir().join(format!("tally-run-{}-{runtime}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let store = CheckpointDir::new(&dir).retain(100);
        let mut first = job_on(workers, true, pipelined);
        first.checkpoint_every(store.clone(), 30_000).unwrap();
        let mut whole = table();
        let stats = first.run(4096, &mut whole, |_, _| {}).unwrap();
        assert!(stats.runtime.starts_with(runtime), "{}", stats.runtime);
        assert_eq!(
            whole.to_batch().unwrap(),
            expected,
            "{runtime}: two phases on {workers} workers"
        );
        assert_eq!(stats.checkpoints, 3, "{runtime}: {stats:?}");
        for (id, folder) in store.list().unwrap() {
            // Resume on another parallelism (pipelined), with the final table the checkpoint
            // holds.
            let mut resumed = job(1 + id as usize % 3, true);
            let chk = resumed.restore(&folder).unwrap();
            let mut sink = table();
            sink.restore(&chk).unwrap();
            let stats = resumed.run(4096, &mut sink, |_, _| {}).unwrap();
            assert!(stats.runtime.starts_with("pipelined"), "{}", stats.runtime);
            let position: u64 = chk.meta("source.rows").unwrap().parse().unwrap();
            assert_eq!(
                stats.rows_in,
                100_000 - position,
                "{runtime}: checkpoint {id}"
            );
            assert_eq!(
                sink.to_batch().unwrap(),
                expected,
                "{runtime}: resumed from checkpoint {id}"
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
