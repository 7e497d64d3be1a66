//! Runs a skewed GROUP BY over the bundled orders (or any Parquet file of the same shape) and
//! prints the changelog it emitted, the state it kept, and the final table.
//!
//! ```text
//! cargo run --release --example orders                                  # data/orders.parquet
//! cargo run --release --example orders -- data/orders_changelog.parquet # a changelog input
//! ```
//!
//! The query, in Flink SQL terms, with `table.exec.mini-batch.enabled = true`,
//! `allow-latency = 1 s`, `size = 5000`:
//!
//! ```sql
//! SELECT shop, COUNT(*) AS orders, SUM(amount) FILTER (WHERE status = 'PAID') AS paid,
//!        COUNT(DISTINCT user_id) AS buyers, MAX(amount) AS biggest
//! FROM orders GROUP BY shop
//! ```

use std::collections::BTreeMap;
use std::fs::File;

use arrow::array::RecordBatchReader;
use arrow::compute::{SortOptions, sort_to_indices, take_record_batch};
use datafusion_expr::{ExprFunctionExt, col, lit};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use tally::aggregates::{count, count_star, max, sum};
use tally::changelog::{ChangeBatch, RowKind};
use tally::sink::FinalTable;
use tally::{Config, GroupAggregate};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run() -> tally::Result<()> {
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "data/orders.parquet".to_string());
    let file = File::open(&path).map_err(|e| tally::Error::io(format!("{path}: {e}")))?;
    let reader = ParquetRecordBatchReaderBuilder::try_new(file)?
        .with_batch_size(8192)
        .build()?;
    let schema = reader.schema();

    let mut agg = GroupAggregate::builder(schema)
        .group_by([col("shop")])
        .aggregate([
            count_star().alias("orders"),
            sum(col("amount"))
                .filter(col("status").eq(lit("PAID")))
                .build()?
                .alias("paid"),
            count(col("user_id")).distinct().build()?.alias("buyers"),
            max(col("amount")).alias("biggest"),
        ])
        .config(Config::from_pairs([
            ("table.exec.mini-batch.enabled", "true"),
            ("table.exec.mini-batch.allow-latency", "1 s"),
            ("table.exec.mini-batch.size", "5000"),
        ])?)
        .build()?;

    let mut table = FinalTable::try_new(agg.output_schema(), &[0])?;
    let mut kinds: BTreeMap<RowKind, u64> = BTreeMap::new();
    let mut consume = |changes: Vec<ChangeBatch>| -> tally::Result<()> {
        for c in &changes {
            for k in c.row_kinds()? {
                *kinds.entry(k).or_default() += 1;
            }
            table.apply(c)?;
        }
        Ok(())
    };
    let started = std::time::Instant::now();
    for batch in reader {
        consume(agg.push(&batch?)?)?;
    }
    consume(agg.finish()?)?;
    let elapsed = started.elapsed();

    let m = agg.metrics();
    println!(
        "input: {path}: {} rows in {} batches",
        m.rows_in, m.batches_in
    );
    let kinds: Vec<String> = kinds.iter().map(|(k, n)| format!("{k} {n}")).collect();
    println!(
        "changelog: {} rows ({}) from {} mini-batches",
        m.rows_out,
        kinds.join(", "),
        m.mini_batches
    );
    println!("state: {} keys, {} bytes", m.keys_in_state, m.state_bytes);
    println!("time: {:.1} ms", elapsed.as_secs_f64() * 1e3);

    let result = table.to_batch()?;
    let order = sort_to_indices(
        result.column(1),
        Some(SortOptions {
            descending: true,
            nulls_first: false,
        }),
        Some(10),
    )?;
    let top = take_record_batch(&result, &order)?;
    println!(
        "final table: {} shops; the 10 with the most orders:",
        result.num_rows()
    );
    println!("{}", arrow::util::pretty::pretty_format_batches(&[top])?);
    Ok(())
}
