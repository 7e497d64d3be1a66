//! Regenerates the sample inputs in `data/` (seeded, so the files are reproducible):
//!
//! * `data/orders.parquet`: 100,000 insert-only orders over 50 shops, `shop-0000` holding half;
//! * `data/orders_changelog.parquet`: 100,000 changelog rows (`op` column) where a fifth of the
//!   orders are later deleted or updated.
//!
//! `cargo run --release --example gen_data`

use std::fs::File;

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

fn main() -> tally::Result<()> {
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
