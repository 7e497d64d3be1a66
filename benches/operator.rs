//! `GroupAggregate` end to end on 10M generated orders (200 shops, one holding half the rows),
//! insert-only and with a changelog, under mini-batch. Throughput is input rows per second.
//!
//! `cargo bench --bench operator`

use std::sync::Arc;

use arrow::array::RecordBatch;
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use datafusion_expr::{Expr, ExprFunctionExt, col, lit};
use tally::aggregates::{count, count_star, max, sum};
use tally::clock::ManualClock;
use tally::datagen::{OrdersConfig, OrdersGenerator};
use tally::{Config, GroupAggregate};

const ROWS: usize = 10_000_000;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn operator(batches: &[RecordBatch], aggs: Vec<Expr>, mini_batch: Option<usize>) -> GroupAggregate {
    let mut pairs = vec![];
    if let Some(size) = mini_batch {
        pairs.push((
            "table.exec.mini-batch.enabled".to_string(),
            "true".to_string(),
        ));
        pairs.push(("table.exec.mini-batch.allow-latency".into(), "1 s".into()));
        pairs.push(("table.exec.mini-batch.size".into(), size.to_string()));
    }
    GroupAggregate::builder(batches[0].schema())
        .group_by([col("shop")])
        .aggregate(aggs)
        .config(Config::from_pairs(pairs).unwrap())
        .clock(Arc::new(ManualClock::new(0)))
        .build()
        .unwrap()
}

fn run(mut agg: GroupAggregate, batches: &[RecordBatch]) -> u64 {
    let mut out = 0;
    for b in batches {
        out += agg.push(b).unwrap().len();
    }
    out += agg.finish().unwrap().len();
    out as u64 + agg.metrics().rows_out
}

fn simple() -> Vec<Expr> {
    vec![count_star(), sum(col("amount"))]
}

fn rich() -> Vec<Expr> {
    vec![
        count_star(),
        sum(col("amount")),
        sum(col("amount"))
            .filter(col("status").eq(lit("PAID")))
            .build()
            .unwrap(),
        max(col("amount")),
        count(col("user_id")).distinct().build().unwrap(),
    ]
}

/// (name, input, aggregates, mini-batch size)
type Case<'a> = (
    &'a str,
    &'a Vec<RecordBatch>,
    fn() -> Vec<Expr>,
    Option<usize>,
);

fn bench(c: &mut Criterion) {
    let insert_only = OrdersGenerator::new(OrdersConfig::default()).batches(ROWS);
    let changelog = OrdersGenerator::new(OrdersConfig {
        updates: 0.2,
        ..OrdersConfig::default()
    })
    .batches(ROWS);
    let mut g = c.benchmark_group("group_aggregate_10M_hot_key");
    g.throughput(Throughput::Elements(ROWS as u64));
    g.sample_size(10);
    let cases: Vec<Case> = vec![
        (
            "count_sum/mini_batch_10k",
            &insert_only,
            simple,
            Some(10_000),
        ),
        ("count_sum/mini_batch_1k", &insert_only, simple, Some(1_000)),
        ("rich/mini_batch_10k", &insert_only, rich, Some(10_000)),
        (
            "count_sum/changelog/mini_batch_10k",
            &changelog,
            simple,
            Some(10_000),
        ),
        (
            "rich/changelog/mini_batch_10k",
            &changelog,
            rich,
            Some(10_000),
        ),
    ];
    for (name, data, aggs, mb) in cases {
        g.bench_function(name, |b| {
            b.iter_batched(
                || operator(data, aggs(), mb),
                |agg| run(agg, data),
                BatchSize::PerIteration,
            )
        });
    }
    g.finish();

    // Mini-batch off emits per record; on the hot key that is a transition for most rows.
    let small = &insert_only[..insert_only.len() / 10];
    let rows: usize = small.iter().map(|b| b.num_rows()).sum();
    let mut g = c.benchmark_group("group_aggregate_1M_hot_key");
    g.throughput(Throughput::Elements(rows as u64));
    g.sample_size(10);
    g.bench_function("count_sum/mini_batch_off", |b| {
        b.iter_batched(
            || operator(small, simple(), None),
            |agg| run(agg, small),
            BatchSize::PerIteration,
        )
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
