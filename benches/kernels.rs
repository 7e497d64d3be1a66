//! Kernel families on 10M generated rows (200 shops, one holding half the rows): hashing,
//! interning, and accumulator updates. Throughput is rows per second.
//!
//! `cargo bench --bench kernels`

use std::hint::black_box;
use std::sync::Arc;

use arrow::array::StringArray;
use arrow::array::{ArrayRef, RecordBatch};
use arrow::buffer::BooleanBuffer;
use arrow::compute::kernels::cmp::eq;
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use tally::datagen::{OrdersConfig, OrdersGenerator};
use tally_kernels::aggregates::{AggregateKind, new_accumulator};
use tally_kernels::distinct::DistinctAccumulator;
use tally_kernels::group_values::new_group_values;
use tally_kernels::hash::hash_columns;

const ROWS: usize = 10_000_000;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn data() -> Vec<RecordBatch> {
    OrdersGenerator::new(OrdersConfig::default()).batches(ROWS)
}

fn col(b: &RecordBatch, name: &str) -> ArrayRef {
    Arc::clone(b.column(b.schema().index_of(name).unwrap()))
}

/// Group ids of every batch for the `shop` key.
fn group_ids(batches: &[RecordBatch]) -> (Vec<Vec<u32>>, usize) {
    let mut table = new_group_values(&[arrow::datatypes::DataType::Utf8]).unwrap();
    let mut hashes = vec![];
    let ids = batches
        .iter()
        .map(|b| {
            let keys = [col(b, "shop")];
            hash_columns(&keys, &mut hashes).unwrap();
            let mut g = vec![];
            table.intern(&keys, &hashes, &mut g).unwrap();
            g
        })
        .collect();
    (ids, table.len())
}

fn kernels(c: &mut Criterion) {
    let batches = data();
    let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
    let (ids, groups) = group_ids(&batches);
    let paid: Vec<BooleanBuffer> = batches
        .iter()
        .map(|b| {
            let s = col(b, "status");
            eq(&s, &StringArray::new_scalar("PAID"))
                .unwrap()
                .values()
                .clone()
        })
        .collect();

    let mut g = c.benchmark_group("kernels_10M");
    g.throughput(Throughput::Elements(rows as u64));
    g.sample_size(10);

    g.bench_function("hash_utf8_key", |b| {
        let mut hashes = vec![];
        b.iter(|| {
            for batch in &batches {
                hash_columns(&[col(batch, "shop")], &mut hashes).unwrap();
                black_box(&hashes);
            }
        })
    });
    for (name, column, dt) in [
        (
            "intern_utf8_200_keys",
            "shop",
            arrow::datatypes::DataType::Utf8,
        ),
        (
            "intern_i64_1M_users",
            "user_id",
            arrow::datatypes::DataType::Int64,
        ),
    ] {
        g.bench_function(name, |b| {
            b.iter_batched(
                || new_group_values(std::slice::from_ref(&dt)).unwrap(),
                |mut table| {
                    let mut hashes = vec![];
                    let mut gids = vec![];
                    for batch in &batches {
                        let keys = [col(batch, column)];
                        hash_columns(&keys, &mut hashes).unwrap();
                        table.intern(&keys, &hashes, &mut gids).unwrap();
                    }
                    table.len()
                },
                BatchSize::PerIteration,
            )
        });
    }
    for (name, kind, filtered) in [
        ("sum_i64_nullable", AggregateKind::Sum, false),
        ("sum_i64_nullable_filtered", AggregateKind::Sum, true),
        ("count_star", AggregateKind::CountStar, false),
        ("avg_i64", AggregateKind::Avg, false),
        ("max_i64", AggregateKind::Max, false),
    ] {
        g.bench_function(name, |b| {
            let dt = arrow::datatypes::DataType::Int64;
            b.iter_batched(
                || new_accumulator(kind, Some(&dt), false).unwrap(),
                |mut acc| {
                    for ((batch, gids), f) in batches.iter().zip(&ids).zip(&paid) {
                        let v = [col(batch, "amount")];
                        acc.update(&v, gids, filtered.then_some(f), groups).unwrap();
                    }
                    acc.size()
                },
                BatchSize::PerIteration,
            )
        });
    }
    g.bench_function("max_i64_retractable", |b| {
        let dt = arrow::datatypes::DataType::Int64;
        b.iter_batched(
            || new_accumulator(AggregateKind::Max, Some(&dt), true).unwrap(),
            |mut acc| {
                for (batch, gids) in batches.iter().zip(&ids) {
                    acc.update(&[col(batch, "amount")], gids, None, groups)
                        .unwrap();
                }
                acc.size()
            },
            BatchSize::PerIteration,
        )
    });
    g.bench_function("count_distinct_user", |b| {
        let dt = arrow::datatypes::DataType::Int64;
        b.iter_batched(
            || DistinctAccumulator::try_new(&dt, &[AggregateKind::Count], false).unwrap(),
            |mut acc| {
                for (batch, gids) in batches.iter().zip(&ids) {
                    acc.apply(&col(batch, "user_id"), gids, &[None], groups, 1)
                        .unwrap();
                }
                acc.size()
            },
            BatchSize::PerIteration,
        )
    });
    g.finish();
}

criterion_group!(benches, kernels);
criterion_main!(benches);
