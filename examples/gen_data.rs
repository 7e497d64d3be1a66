//! Regenerates the sample inputs in `data/` (seeded, so the files are reproducible):
//!
//! * `data/orders.parquet`: 100,000 insert-only orders over 50 shops, `shop-0000` holding half;
//! * `data/orders_changelog.parquet`: 100,000 changelog rows (`op` column) where a fifth of the
//!   orders are later deleted or updated;
//! * `data/replay.arrow`: a recorded stream, 20,000 changelog rows (an Arrow IPC file with `op`
//!   and the arrival time `ts`), and `data/replay_expected.csv`, the final table of
//!   `data/replay.sql` over it, computed here row by row without the engine.
//!
//! `cargo run --release --example gen_data`

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::File;

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{Int8Type, Int64Type};

use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;
use tally::datagen::{OrdersConfig, OrdersGenerator};

fn write(path: &str, config: OrdersConfig, rows: usize) -> tally::Result<()> {
    let mut generator = OrdersGenerator::new(config);
    let props = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(9)?))
        .set_max_row_group_row_count(Some(50_000))
        .build();
    let mut writer = ArrowWriter::try_new(File::create(path)?, generator.schema(), Some(props))?;
    for batch in generator.batches(rows) {
        writer.write(&batch)?;
    }
    writer.close()?;
    println!("wrote {path}");
    Ok(())
}

/// The final table of `data/replay.sql` (`shop, orders, total, biggest, buyers`), folding the
/// changelog one row at a time: each order id's live row, then per shop COUNT(*), SUM(amount),
/// MAX(amount), COUNT(DISTINCT user_id).
fn replay_expected(batches: &[RecordBatch]) -> String {
    let mut live: HashMap<i64, (String, i64, Option<i64>)> = HashMap::new();
    for b in batches {
        let op = b.column(0).as_primitive::<Int8Type>();
        let id = b.column(1).as_primitive::<Int64Type>();
        let shop = b.column(2).as_string::<i32>();
        let user = b.column(3).as_primitive::<Int64Type>();
        let amount = b.column(4).as_primitive::<Int64Type>();
        for r in 0..b.num_rows() {
            let row = (
                shop.value(r).to_string(),
                user.value(r),
                amount.is_valid(r).then(|| amount.value(r)),
            );
            match op.value(r) {
                0 | 2 => {
                    live.insert(id.value(r), row);
                }
                _ => {
                    let old = live.remove(&id.value(r));
                    assert_eq!(old, Some(row), "a retraction of a row that is not live");
                }
            }
        }
    }
    type Acc = (usize, Option<i64>, Option<i64>, BTreeSet<i64>);
    let mut shops: BTreeMap<String, Acc> = BTreeMap::new();
    for (shop, user, amount) in live.into_values() {
        let e = shops.entry(shop).or_default();
        e.0 += 1;
        if let Some(a) = amount {
            e.1 = Some(e.1.unwrap_or(0) + a);
            e.2 = Some(e.2.map_or(a, |m: i64| m.max(a)));
        }
        e.3.insert(user);
    }
    let opt = |v: Option<i64>| v.map_or(String::new(), |v| v.to_string());
    let mut out = String::from("shop,orders,total,biggest,buyers\n");
    for (shop, (n, total, biggest, users)) in shops {
        out.push_str(&format!(
            "{shop},{n},{},{},{}\n",
            opt(total),
            opt(biggest),
            users.len()
        ));
    }
    out
}

fn write_replay() -> tally::Result<()> {
    let mut generator = OrdersGenerator::new(OrdersConfig {
        seed: 9,
        keys: 20,
        hot_share: 0.4,
        users: 2_000,
        updates: 0.3,
        batch_size: 1_000,
        ..OrdersConfig::default()
    });
    let schema = generator.schema();
    let batches = generator.batches(20_000);
    tally::datagen::write_file(
        std::path::Path::new("data/replay.arrow"),
        schema,
        batches.clone(),
        |_| {},
    )?;
    std::fs::write("data/replay_expected.csv", replay_expected(&batches))?;
    println!("wrote data/replay.arrow and data/replay_expected.csv");
    Ok(())
}

fn main() -> tally::Result<()> {
    write_replay()?;
    let base = OrdersConfig {
        seed: 7,
        keys: 50,
        hot_share: 0.5,
        users: 5_000,
        batch_size: 10_000,
        ..OrdersConfig::default()
    };
    write("data/orders.parquet", base.clone(), 100_000)?;
    write(
        "data/orders_changelog.parquet",
        OrdersConfig {
            seed: 8,
            updates: 0.2,
            ..base
        },
        100_000,
    )?;
    Ok(())
}
