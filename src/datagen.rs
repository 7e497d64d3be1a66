//! Seeded generators of skewed input, for examples, benchmarks and tests.
//!
//! [`OrdersGenerator`] produces an orders stream for a skewed GROUP BY: a `shop` key where one
//! value (the hot key) holds a chosen share of the rows and the rest follow a Zipf-like law, a
//! high-cardinality `user_id`, an `amount`, a `status` and an increasing event time `ts`.
//! With `updates > 0` it also emits a changelog: that share of orders is later retracted (`-D`)
//! or updated (`-U` of the old row, `+U` of the new), in an `op` column.

use std::sync::Arc;

use arrow::array::{
    ArrayRef, Int8Array, Int64Array, RecordBatch, StringArray, TimestampMillisecondArray,
};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::changelog::RowKind;

/// Settings of [`OrdersGenerator`].
#[derive(Debug, Clone)]
pub struct OrdersConfig {
    /// Seed of the random stream: the same seed gives the same rows.
    pub seed: u64,
    /// Distinct `shop` values.
    pub keys: usize,
    /// Share of rows on the hot shop (`shop-0000`), 0..=1.
    pub hot_share: f64,
    /// Zipf exponent of the other shops.
    pub zipf: f64,
    /// Distinct `user_id` values.
    pub users: i64,
    /// Share of orders later retracted or updated (0 = insert-only, no `op` column).
    pub updates: f64,
    /// Share of NULL amounts.
    pub null_amounts: f64,
    /// Rows per batch.
    pub batch_size: usize,
}

impl Default for OrdersConfig {
    fn default() -> Self {
        Self {
            seed: 42,
            keys: 200,
            hot_share: 0.5,
            zipf: 1.1,
            users: 1_000_000,
            updates: 0.0,
            null_amounts: 0.01,
            batch_size: 8192,
        }
    }
}

const STATUSES: [&str; 4] = ["PAID", "NEW", "CANCELLED", "REFUNDED"];

#[derive(Debug, Clone)]
struct Order {
    shop: u32,
    user: i64,
    amount: Option<i64>,
    status: u8,
    ts: i64,
}

/// An endless, seeded stream of order batches (see the module docs).
///
/// # Examples
/// ```
/// use tally::datagen::{OrdersConfig, OrdersGenerator};
/// let mut g = OrdersGenerator::new(OrdersConfig { batch_size: 100, ..Default::default() });
/// let batch = g.next_batch();
/// assert_eq!(batch.num_rows(), 100);
/// assert_eq!(batch.schema().field(1).name(), "shop");
/// ```
#[derive(Debug)]
pub struct OrdersGenerator {
    config: OrdersConfig,
    rng: StdRng,
    schema: SchemaRef,
    /// Cumulative Zipf weights of shops 1..keys.
    cdf: Vec<f64>,
    shop_names: Vec<String>,
    next_id: i64,
    ts: i64,
    /// Orders that may still be retracted or updated: (order id, order).
    open: Vec<(i64, Order)>,
}

impl OrdersGenerator {
    /// A generator with `config`.
    pub fn new(config: OrdersConfig) -> Self {
        let keys = config.keys.max(1);
        let mut cdf = Vec::with_capacity(keys.saturating_sub(1));
        let mut acc = 0.0;
        for r in 1..keys {
            acc += 1.0 / (r as f64).powf(config.zipf);
            cdf.push(acc);
        }
        let mut fields = vec![];
        if config.updates > 0.0 {
            fields.push(Field::new("op", DataType::Int8, false));
        }
        fields.extend([
            Field::new("order_id", DataType::Int64, false),
            Field::new("shop", DataType::Utf8, false),
            Field::new("user_id", DataType::Int64, false),
            Field::new("amount", DataType::Int64, true),
            Field::new("status", DataType::Utf8, false),
            Field::new(
                "ts",
                DataType::Timestamp(TimeUnit::Millisecond, None),
                false,
            ),
        ]);
        Self {
            rng: StdRng::seed_from_u64(config.seed),
            schema: Arc::new(Schema::new(fields)),
            cdf,
            shop_names: (0..keys).map(|i| format!("shop-{i:04}")).collect(),
            next_id: 0,
            ts: 1_700_000_000_000,
            open: vec![],
            config,
        }
    }

    /// The schema of the batches.
    pub fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    fn new_order(&mut self) -> Order {
        let shop =
            if self.cdf.is_empty() || self.rng.random_bool(self.config.hot_share.clamp(0.0, 1.0)) {
                0
            } else {
                let total = *self.cdf.last().unwrap_or(&1.0);
                let x = self.rng.random::<f64>() * total;
                (self.cdf.partition_point(|&c| c < x) + 1).min(self.cdf.len()) as u32
            };
        self.ts += self.rng.random_range(0..3);
        Order {
            shop,
            user: self.rng.random_range(0..self.config.users.max(1)),
            amount: (!self
                .rng
                .random_bool(self.config.null_amounts.clamp(0.0, 1.0)))
            .then(|| self.rng.random_range(100..100_000)),
            status: self.rng.random_range(0..STATUSES.len() as u8),
            ts: self.ts,
        }
    }

    /// The next batch of `batch_size` rows.
    pub fn next_batch(&mut self) -> RecordBatch {
        let n = self.config.batch_size.max(1);
        let mut rows: Vec<(RowKind, i64, Order)> = Vec::with_capacity(n);
        while rows.len() < n {
            let change = self.config.updates > 0.0
                && !self.open.is_empty()
                && self
                    .rng
                    .random_bool((self.config.updates / (1.0 + self.config.updates)).min(1.0));
            if change && rows.len() + 2 <= n {
                let i = self.rng.random_range(0..self.open.len());
                let (id, old) = self.open.swap_remove(i);
                if self.rng.random_bool(0.5) {
                    rows.push((RowKind::Delete, id, old));
                } else {
                    let mut new = old.clone();
                    new.amount = Some(self.rng.random_range(100..100_000));
                    new.status = self.rng.random_range(0..STATUSES.len() as u8);
                    rows.push((RowKind::UpdateBefore, id, old));
                    rows.push((RowKind::UpdateAfter, id, new.clone()));
                    self.open.push((id, new));
                }
            } else {
                let o = self.new_order();
                let id = self.next_id;
                self.next_id += 1;
                if self.config.updates > 0.0 {
                    self.open.push((id, o.clone()));
                    // Bound the memory of open orders.
                    if self.open.len() > 1 << 16 {
                        let i = self.rng.random_range(0..self.open.len());
                        self.open.swap_remove(i);
                    }
                }
                rows.push((RowKind::Insert, id, o));
            }
        }
        let mut cols: Vec<ArrayRef> = vec![];
        if self.config.updates > 0.0 {
            cols.push(Arc::new(Int8Array::from_iter_values(
                rows.iter().map(|r| r.0.code()),
            )));
        }
        cols.push(Arc::new(Int64Array::from_iter_values(
            rows.iter().map(|r| r.1),
        )));
        cols.push(Arc::new(StringArray::from_iter_values(
            rows.iter()
                .map(|r| self.shop_names[r.2.shop as usize].as_str()),
        )));
        cols.push(Arc::new(Int64Array::from_iter_values(
            rows.iter().map(|r| r.2.user),
        )));
        cols.push(Arc::new(Int64Array::from_iter(
            rows.iter().map(|r| r.2.amount),
        )));
        cols.push(Arc::new(StringArray::from_iter_values(
            rows.iter().map(|r| STATUSES[r.2.status as usize]),
        )));
        cols.push(Arc::new(TimestampMillisecondArray::from_iter_values(
            rows.iter().map(|r| r.2.ts),
        )));
        RecordBatch::try_new(Arc::clone(&self.schema), cols).expect("generator schema")
    }

    /// `rows` rows (rounded up to whole batches).
    pub fn batches(&mut self, rows: usize) -> Vec<RecordBatch> {
        let n = rows.div_ceil(self.config.batch_size.max(1));
        (0..n).map(|_| self.next_batch()).collect()
    }
}

/// The time of the first generated bid: 2023-11-14T22:13:20Z.
pub const BID_BASE_TIME_MS: u64 = 1_700_000_000_000;

/// The Nexmark bid stream, from the `nexmark` crate's generator (the one RisingWave uses, after
/// the Beam/Flink Nexmark generator): `auction`, `bidder`, `price` (BIGINT), `channel`, `url`
/// (STRING), `dateTime` (TIMESTAMP(3)), `extra` (STRING), in batches. Every event is derived
/// from its number and the base time is fixed ([`BID_BASE_TIME_MS`]), so the stream is
/// deterministic; `first_event` chooses where it starts (the n-th bid).
///
/// # Examples
/// ```
/// use tally::datagen::NexmarkBids;
/// let mut bids = NexmarkBids::new(0, 1000);
/// let batch = bids.next_batch();
/// assert_eq!(batch.num_rows(), 1000);
/// assert_eq!(batch.schema().field(5).name(), "dateTime");
/// ```
#[derive(Debug)]
pub struct NexmarkBids {
    events: nexmark::EventGenerator,
    schema: SchemaRef,
    batch_size: usize,
}

impl NexmarkBids {
    /// Bids from event number `first_event` on, `batch_size` per batch.
    pub fn new(first_event: u64, batch_size: usize) -> Self {
        // `EventGenerator::new` (its `Default` does not advance), and a fixed base time instead
        // of the wall clock, so that the stream is the same on every run.
        let config = nexmark::config::NexmarkConfig {
            base_time: BID_BASE_TIME_MS,
            ..nexmark::config::NexmarkConfig::default()
        };
        let events = nexmark::EventGenerator::new(config)
            .with_offset(first_event)
            .with_type_filter(nexmark::event::EventType::Bid);
        Self {
            events,
            schema: Self::bid_schema(),
            batch_size: batch_size.max(1),
        }
    }

    /// The schema of Nexmark's `bid` table.
    pub fn bid_schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("auction", DataType::Int64, false),
            Field::new("bidder", DataType::Int64, false),
            Field::new("price", DataType::Int64, false),
            Field::new("channel", DataType::Utf8, false),
            Field::new("url", DataType::Utf8, false),
            Field::new(
                "dateTime",
                DataType::Timestamp(TimeUnit::Millisecond, None),
                false,
            ),
            Field::new("extra", DataType::Utf8, false),
        ]))
    }

    /// The schema of the batches.
    pub fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    /// The next `batch_size` bids.
    pub fn next_batch(&mut self) -> RecordBatch {
        let n = self.batch_size;
        let mut auction = Vec::with_capacity(n);
        let mut bidder = Vec::with_capacity(n);
        let mut price = Vec::with_capacity(n);
        let mut channel = Vec::with_capacity(n);
        let mut url = Vec::with_capacity(n);
        let mut time = Vec::with_capacity(n);
        let mut extra = Vec::with_capacity(n);
        while auction.len() < n {
            let Some(nexmark::event::Event::Bid(b)) = self.events.next() else {
                continue;
            };
            auction.push(b.auction as i64);
            bidder.push(b.bidder as i64);
            price.push(b.price as i64);
            channel.push(b.channel);
            url.push(b.url);
            time.push(b.date_time as i64);
            extra.push(b.extra);
        }
        let cols: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from(auction)),
            Arc::new(Int64Array::from(bidder)),
            Arc::new(Int64Array::from(price)),
            Arc::new(StringArray::from(channel)),
            Arc::new(StringArray::from(url)),
            Arc::new(TimestampMillisecondArray::from(time)),
            Arc::new(StringArray::from(extra)),
        ];
        RecordBatch::try_new(Arc::clone(&self.schema), cols).expect("bid schema")
    }
}

/// The first `total` rows of the batches `next` produces, the last batch cut to fit.
pub fn first_rows(
    total: u64,
    mut next: impl FnMut() -> RecordBatch,
) -> impl Iterator<Item = RecordBatch> {
    let mut left = total;
    std::iter::from_fn(move || {
        (left > 0).then(|| {
            let b = next();
            let n = (b.num_rows() as u64).min(left);
            left -= n;
            b.slice(0, n as usize)
        })
    })
}

/// The lower-case extension of `path` ("" without one).
pub fn extension(path: &std::path::Path) -> String {
    path.extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase)
        .unwrap_or_default()
}

/// Rows per Parquet row group in files this module writes: a multiple of the readers' batch
/// sizes (8192 by default), so that no batch spans two row groups' dictionaries; a 10M-row file
/// has 10 row groups for the row-group decoders. BENCHMARKS.md, "Tuning constants".
pub const ROW_GROUP_ROWS: usize = 1 << 20;

/// Writes `batches` (of `schema`) to `path`, as Parquet (`.parquet`) or an Arrow IPC file
/// (`.arrow`, `.ipc`, `.feather`), batch by batch so that memory stays bounded; `on_batch` gets the
/// rows written so far after each batch. The file appears whole or not at all: it is written
/// under a temporary name, synced and renamed. Parquet gets Snappy compression, statistics and
/// row groups of [`ROW_GROUP_ROWS`] rows. Returns the rows written.
///
/// # Errors
/// An unknown extension, and I/O errors (naming the path).
pub fn write_file(
    path: &std::path::Path,
    schema: SchemaRef,
    batches: impl IntoIterator<Item = RecordBatch>,
    mut on_batch: impl FnMut(u64),
) -> crate::Result<u64> {
    use crate::Error;
    let ext = extension(path);
    let io = |e: &dyn std::fmt::Display| Error::io(format!("{}: {e}", path.display()));
    enum Sink {
        Parquet(parquet::arrow::ArrowWriter<std::fs::File>),
        Arrow(arrow::ipc::writer::FileWriter<std::io::BufWriter<std::fs::File>>),
    }
    let tmp = path.with_extension(format!("{ext}.tmp"));
    let file = std::fs::File::create(&tmp).map_err(|e| io(&e))?;
    let mut sink = match ext.as_str() {
        "parquet" => {
            let props = parquet::file::properties::WriterProperties::builder()
                .set_compression(parquet::basic::Compression::SNAPPY)
                .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
                .build();
            Sink::Parquet(
                parquet::arrow::ArrowWriter::try_new(file, Arc::clone(&schema), Some(props))
                    .map_err(|e| io(&e))?,
            )
        }
        "arrow" | "ipc" | "feather" => Sink::Arrow(
            arrow::ipc::writer::FileWriter::try_new(std::io::BufWriter::new(file), &schema)
                .map_err(|e| io(&e))?,
        ),
        other => {
            let _ = std::fs::remove_file(&tmp);
            return Err(Error::invalid_input(format!(
                "{}: unknown extension '{other}' (use .parquet or .arrow)",
                path.display()
            )));
        }
    };
    let mut rows = 0u64;
    let result = (|| -> crate::Result<()> {
        for b in batches {
            match &mut sink {
                Sink::Parquet(w) => w.write(&b).map_err(|e| io(&e))?,
                Sink::Arrow(w) => w.write(&b).map_err(|e| io(&e))?,
            }
            rows += b.num_rows() as u64;
            on_batch(rows);
        }
        let file = match sink {
            Sink::Parquet(w) => w.into_inner().map_err(|e| io(&e))?,
            Sink::Arrow(mut w) => {
                w.finish().map_err(|e| io(&e))?;
                w.into_inner()
                    .map_err(|e| io(&e))?
                    .into_inner()
                    .map_err(|e| io(&e))?
            }
        };
        file.sync_all().map_err(|e| io(&e))?;
        std::fs::rename(&tmp, path).map_err(|e| io(&e))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map(|()| rows)
}
