//! What a checkpoint costs: snapshotting, restoring and writing + reading back the state of a
//! `GroupAggregate` keyed by `user_id` (2M generated orders over 1M possible users, about 860k
//! groups) with `COUNT(*)`, `SUM(amount)`, `MAX(amount)` and `COUNT(DISTINCT shop)`. Throughput
//! is groups per second.
//!
//! `cargo bench --bench checkpoint`

use std::sync::Arc;

use arrow::array::RecordBatch;
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use datafusion_expr::{ExprFunctionExt, col};
use tally::GroupAggregate;
use tally::aggregates::{count, count_star, max, sum};
use tally::checkpoint::{CheckpointDir, Checkpointed};
use tally::clock::ManualClock;
use tally::datagen::{OrdersConfig, OrdersGenerator};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn operator(schema: arrow::datatypes::SchemaRef) -> GroupAggregate {
    GroupAggregate::builder(schema)
        .group_by([col("user_id")])
        .aggregate([
            count_star(),
            sum(col("amount")),
            max(col("amount")),
            count(col("shop")).distinct().build().unwrap(),
        ])
        .clock(Arc::new(ManualClock::new(0)))
        .build()
        .unwrap()
}

fn bench(c: &mut Criterion) {
    let batches: Vec<RecordBatch> = OrdersGenerator::new(OrdersConfig {
        users: 1_000_000,
        batch_size: 65_536,
        ..OrdersConfig::default()
    })
    .batches(2_000_000);
    let schema = batches[0].schema();
    let mut agg = operator(Arc::clone(&schema));
    for b in &batches {
        agg.push(b).unwrap();
    }
    agg.finish().unwrap();
    let groups = agg.metrics().keys_in_state;
    let snapshot = agg.snapshot().unwrap();
    let dir = CheckpointDir::new(
        std::env::temp_dir().join(format!("tally-bench-chk-{}", std::process::id())),
    );
    let mut g = c.benchmark_group("checkpoint");
    g.sample_size(10);
    g.throughput(Throughput::Elements(groups));
    g.bench_function("snapshot", |b| b.iter(|| agg.snapshot().unwrap()));
    g.bench_function("restore_snapshot", |b| {
        b.iter_batched(
            || operator(Arc::clone(&schema)),
            // Returned, so that dropping it is not timed.
            |mut fresh| {
                fresh.restore_snapshot(&snapshot).unwrap();
                fresh
            },
            BatchSize::PerIteration,
        )
    });
    g.bench_function("write_and_read_back", |b| {
        b.iter(|| {
            let path = agg.checkpoint(&dir, Default::default()).unwrap();
            CheckpointDir::read(&path).unwrap()
        })
    });
    g.finish();
    let _ = std::fs::remove_dir_all(dir.root());
}

criterion_group!(benches, bench);
criterion_main!(benches);
