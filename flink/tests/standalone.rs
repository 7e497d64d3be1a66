//! The Flink operator and Tally standalone agree: the same query over the same changelog gives
//! the same final table through the operator's chain of phases (two sources, three subtasks) and
//! through Tally's own SQL over a file on its pipelined runtime (two workers), for plain,
//! nested and split-distinct aggregates, with and without Flink's incremental aggregate.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{Array, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use arrow::util::display::array_value_to_string;
use tally::changelog::{ChangeBatch, RowKind};
use tally::sql::Session;
use tally_flink::Query;

use common::{Job, Order, SQL, changelog, columns, options, reference};

/// `changes` as an Arrow file with an `op` column, read by Tally's SQL as a changelog.
fn write_arrow(path: &std::path::Path, changes: &[(RowKind, Order)]) {
    let schema = Arc::new(Schema::new(vec![
        Field::new("shop", DataType::Utf8, true),
        Field::new("user_id", DataType::Int64, true),
        Field::new("amount", DataType::Int64, true),
        Field::new("op", DataType::Utf8, false),
    ]));
    let file = std::fs::File::create(path).unwrap();
    let mut w = arrow::ipc::writer::FileWriter::try_new(file, &schema).unwrap();
    for rows in changes.chunks(500) {
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![
                Arc::new(StringArray::from_iter(rows.iter().map(|r| r.1.0.clone()))),
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.1.1))),
                Arc::new(Int64Array::from_iter(rows.iter().map(|r| r.1.2))),
                Arc::new(StringArray::from_iter_values(
                    rows.iter().map(|r| r.0.short()),
                )),
            ],
        )
        .unwrap();
        w.write(&batch).unwrap();
    }
    w.finish().unwrap();
}

/// Tally standalone's run of `sql` over `changes` at parallelism `p`: its final table (keyed by
/// the first column, the other columns as text, as the chain's table is) and its changelog
/// (`+I key columns...`, as the chain's).
fn standalone(
    name: &str,
    sql: &str,
    options: &[(String, String)],
    changes: &[(RowKind, Order)],
    p: usize,
) -> (BTreeMap<Option<String>, String>, Vec<String>) {
    let path = std::env::temp_dir().join(format!(
        "tally-flink-standalone-{}-{name}.arrow",
        std::process::id()
    ));
    write_arrow(&path, changes);
    let mut session = Session::new();
    for (k, v) in options {
        session.set(k, v).unwrap();
    }
    session
        .set("table.exec.resource.default-parallelism", &p.to_string())
        .unwrap();
    session
        .execute(&format!(
            "CREATE TABLE orders (shop STRING, user_id BIGINT, amount BIGINT) WITH \
             ('connector' = 'filesystem', 'path' = '{}', 'format' = 'arrow', \
             'changelog-column' = 'op')",
            path.display()
        ))
        .unwrap();
    let mut q = session.plan_query(sql).unwrap();
    let mut table = q.result_table().unwrap();
    let mut changelog = vec![];
    let mut sink = |c: &ChangeBatch| -> tally::Result<()> {
        let kinds = c.row_kinds()?;
        for (r, kind) in kinds.iter().enumerate() {
            let cells: Vec<String> = (0..c.data.num_columns())
                .map(|i| cell(&c.data, i, r).unwrap_or_else(|| "NULL".into()))
                .collect();
            changelog.push(format!("{} {}", kind.short(), cells.join(" ")));
        }
        table.apply(c)
    };
    q.job().run(64, &mut sink, |_, _| {}).unwrap();
    let _ = std::fs::remove_file(&path);
    let batch = table.to_batch().unwrap();
    let rows = (0..batch.num_rows())
        .map(|r| {
            let row = (1..batch.num_columns())
                .map(|i| cell(&batch, i, r).unwrap_or_else(|| "NULL".into()))
                .collect::<Vec<_>>()
                .join(" ");
            (cell(&batch, 0, r), row)
        })
        .collect();
    (rows, changelog)
}

fn cell(batch: &RecordBatch, i: usize, r: usize) -> Option<String> {
    let a = batch.column(i);
    a.is_valid(r).then(|| array_value_to_string(a, r).unwrap())
}

/// The chain's final table of `sql` under `options`: two sources, three keyed subtasks.
fn in_flink(
    sql: &str,
    options: &[(String, String)],
    changes: &[(RowKind, Order)],
) -> BTreeMap<Option<String>, String> {
    let plan = || Query::plan(sql, "orders", &columns(), true, options).unwrap();
    let q = plan();
    let phases = (0..q.phases())
        .map(|k| {
            let n = if k == 0 { 2 } else { 3 };
            (0..n).map(|_| plan().into_phase(k).unwrap()).collect()
        })
        .collect();
    let mut job = Job::with(phases, &q, 3);
    job.run(changes, 100);
    job.barrier();
    job.table
}

#[test]
fn the_operator_and_tally_standalone_give_the_same_final_table() {
    let nested = "SELECT orders, COUNT(*) AS shops, MAX(total) AS best FROM \
        (SELECT shop, COUNT(*) AS orders, SUM(amount) AS total FROM orders GROUP BY shop) \
        GROUP BY orders";
    let with = |two_phase: bool, more: &[(&str, &str)]| {
        let mut o = options(two_phase);
        o.extend(more.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        o
    };
    let split = [
        ("table.optimizer.distinct-agg.split.enabled", "true"),
        ("table.optimizer.distinct-agg.split.bucket-num", "8"),
    ];
    let split_off = [
        split[0],
        split[1],
        ("table.optimizer.incremental-agg-enabled", "false"),
    ];
    let changes = changelog(31, 4_000);
    let want = reference(&changes);
    for (name, sql, options) in [
        ("two-phase", SQL, with(true, &[])),
        ("one-phase", SQL, with(false, &[])),
        ("nested", nested, with(true, &[])),
        ("split", SQL, with(true, &split)),
        ("split-not-incremental", SQL, with(true, &split_off)),
        ("split-one-phase", SQL, with(false, &split)),
    ] {
        let flink = in_flink(sql, &options, &changes);
        assert!(!flink.is_empty(), "{name}");
        assert_eq!(
            flink,
            standalone(name, sql, &options, &changes, 2).0,
            "{name}: the operator and Tally standalone"
        );
        if sql == SQL {
            assert_eq!(flink, want, "{name}: the operator and the reference");
        }
    }
}

/// One source, one keyed subtask, mini-batch off: each batch crosses as one part in input order
/// (`Phase::with_receivers(1)`), so the operator's changelog is Tally standalone's row for row,
/// as Flink's own is at parallelism 1; cut by key group it is only the same per key.
#[test]
fn with_one_receiver_the_changelog_is_the_same_row_for_row() {
    let nested = "SELECT orders, COUNT(*) AS shops, MAX(total) AS best FROM \
        (SELECT shop, COUNT(*) AS orders, SUM(amount) AS total FROM orders GROUP BY shop) \
        GROUP BY orders";
    let changes = changelog(37, 2_000);
    for (name, sql) in [("plain-p1", SQL), ("nested-p1", nested)] {
        let options = options(false);
        let (_, want) = standalone(name, sql, &options, &changes, 1);
        assert!(want.len() > 1_000, "{name}: {} changes", want.len());
        let run = |receivers: usize| {
            let plan = || Query::plan(sql, "orders", &columns(), true, &options).unwrap();
            let q = plan();
            let phases = (0..q.phases())
                .map(|k| vec![plan().into_phase(k).unwrap().with_receivers(receivers)])
                .collect();
            let mut job = Job::with(phases, &q, 1);
            job.run(&changes, 100);
            job.barrier();
            job.changelog
        };
        assert_eq!(run(1), want, "{name}");
        assert_ne!(
            run(0),
            want,
            "{name}: by key group the order across keys is not the input's"
        );
    }
}
