//! Split-distinct under Flink's incremental aggregate inside Flink's tasks: Flink's own test
//! programs for it (`IncrementalGroupAggregateTestPrograms`: the source rows before and after a
//! restore, and the changelogs their sinks must consume) through the operator's chain of phases
//! at parallelism 1, with the state of every keyed phase snapshotted and restored in between, as
//! Flink's restore tests run them.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{Int32Array, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use tally::changelog::ChangeBatch;
use tally_flink::{Column, Query, Type, wire};

use common::Job;

#[path = "../../tests/flink_programs/incremental_group_aggregate.rs"]
mod programs;
use programs::{AFTER, BEFORE, COMPLEX, COMPLEX_CHANGES, SIMPLE, SIMPLE_CHANGES};

fn columns() -> Vec<Column> {
    let c = |name: &str, ty| Column {
        name: name.into(),
        ty,
        nullable: true,
    };
    vec![
        c("a", Type::Int),
        c("b", Type::BigInt),
        c("c", Type::String),
    ]
}

/// The programs' options (mini-batch of one row, a 10 s latency, split-distinct on), with
/// Flink's incremental aggregate as Flink's default leaves it (on) or `incremental` set.
fn plan(sql: &str, incremental: Option<bool>) -> Query {
    let mut options: Vec<(String, String)> = [
        ("table.exec.mini-batch.enabled", "true"),
        ("table.exec.mini-batch.allow-latency", "10 s"),
        ("table.exec.mini-batch.size", "1"),
        ("table.optimizer.distinct-agg.split.enabled", "true"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    if let Some(on) = incremental {
        options.push((
            "table.optimizer.incremental-agg-enabled".into(),
            on.to_string(),
        ));
    }
    Query::plan(sql, "source_t", &columns(), false, &options).unwrap()
}

/// The chain at parallelism 1: one instance of each phase.
fn chain(sql: &str, incremental: Option<bool>) -> Job {
    let q = plan(sql, incremental);
    let phases = (0..q.phases())
        .map(|k| vec![plan(sql, incremental).into_phase(k).unwrap()])
        .collect();
    Job::with(phases, &q, 1)
}

/// Each CSV row (`a,b,c`) as its own column batch (the mini-batch size is one row).
fn run(job: &mut Job, csv: &str) {
    let rows = csv.lines().map(|l| {
        let mut f = l.splitn(3, ',');
        let mut next = || f.next().unwrap();
        (
            next().parse::<i32>().unwrap(),
            next().parse::<i64>().unwrap(),
            next(),
        )
    });
    let schema = Arc::new(Schema::new(vec![
        Field::new("a", DataType::Int32, true),
        Field::new("b", DataType::Int64, true),
        Field::new("c", DataType::Utf8, true),
    ]));
    for (a, b, c) in rows {
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![
                Arc::new(Int32Array::from(vec![a])),
                Arc::new(Int64Array::from(vec![b])),
                Arc::new(StringArray::from(vec![c])),
            ],
        )
        .unwrap();
        let out = job.phases[0][0]
            .push(&wire::encode(&ChangeBatch::inserts(batch)).unwrap())
            .unwrap();
        job.hand_on(0, out);
    }
}

/// The rows of each key (the first column), in order: what a changelog must keep.
fn per_key(rows: &[String]) -> BTreeMap<String, Vec<String>> {
    let mut keys: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for r in rows {
        let key = r.split(' ').nth(1).unwrap().to_string();
        keys.entry(key).or_default().push(r.clone());
    }
    keys
}

/// Flink's rows (`+I[1, 1]`) as the chain's changelog writes them (`+I 1 1`).
fn flink_rows(rows: &[&str]) -> Vec<String> {
    rows.iter()
        .map(|r| {
            let (kind, values) = r.split_once('[').unwrap();
            format!("{kind} {}", values.trim_end_matches(']').replace(", ", " "))
        })
        .collect()
}

/// Runs a program as Flink's restore tests do: the rows before, a checkpoint, then a new job
/// restored from it and the rows after. Each phase's changelog must be Flink's (each key's rows
/// in Flink's order; Flink compares them in any order).
fn program(sql: &str, incremental: Option<bool>, before: &[&str], after: &[&str]) {
    let mut a = chain(sql, incremental);
    run(&mut a, BEFORE);
    a.barrier();
    assert_eq!(
        per_key(&a.changelog),
        per_key(&flink_rows(before)),
        "before the restore: {:?}",
        a.changelog
    );
    assert_eq!(a.changelog.len(), before.len(), "{:?}", a.changelog);
    let mut b = chain(sql, incremental);
    for (from, to) in a.phases.iter_mut().zip(&mut b.phases) {
        let parts = from[0].snapshot().unwrap();
        let bytes: Vec<&[u8]> = parts.iter().map(|p| p.bytes.as_slice()).collect();
        to[0].restore(&bytes).unwrap();
    }
    b.table = a.table.clone();
    run(&mut b, AFTER);
    b.barrier();
    assert_eq!(
        per_key(&b.changelog),
        per_key(&flink_rows(after)),
        "after the restore: {:?}",
        b.changelog
    );
    assert_eq!(b.changelog.len(), after.len(), "{:?}", b.changelog);
}

#[test]
fn flink_incremental_group_aggregate_simple() {
    assert_eq!(plan(SIMPLE, None).phases(), 3, "PARTIAL, then FINAL");
    program(SIMPLE, None, SIMPLE_CHANGES.0, SIMPLE_CHANGES.1);
}

#[test]
fn flink_incremental_group_aggregate_complex() {
    assert_eq!(
        plan(COMPLEX, Some(true)).phases(),
        4,
        "inner, PARTIAL, FINAL"
    );
    program(COMPLEX, Some(true), COMPLEX_CHANGES.0, COMPLEX_CHANGES.1);
}

/// Without the incremental aggregate the FINAL consumes the PARTIAL's `-U` and `+U` of a bucket
/// as two changes: with mini-batches of one row it emits the state between them, a changelog
/// Flink's default plan never shows (here `[1, 1, 1, 1]` again after `[1, 3, 2, 2]`, so the
/// complex program fails with it off); the final table is the same.
#[test]
fn without_the_incremental_aggregate_the_final_sees_the_partial_changes_apart() {
    let mut off = chain(COMPLEX, Some(false));
    run(&mut off, BEFORE);
    off.barrier();
    let mut on = chain(COMPLEX, Some(true));
    run(&mut on, BEFORE);
    on.barrier();
    assert!(
        off.changelog.len() > on.changelog.len(),
        "{:?}",
        off.changelog
    );
    assert_eq!(off.table, on.table);
}
