//! Helpers: input batches from compact rows, changelog formatting, and applying a changelog.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{ArrayRef, AsArray, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Int8Type, Schema, SchemaRef};
use arrow::util::display::{ArrayFormatter, FormatOptions};
use datafusion_expr::Expr;
use tally::changelog::ChangeBatch;
use tally::clock::ManualClock;
use tally::{Config, GroupAggregate};

/// `k` Utf8, `v` Int64, and optionally an `op` Utf8 changelog column first.
pub fn kv_schema(changelog: bool) -> SchemaRef {
    let mut fields = vec![];
    if changelog {
        fields.push(Field::new("op", DataType::Utf8, false));
    }
    fields.push(Field::new("k", DataType::Utf8, true));
    fields.push(Field::new("v", DataType::Int64, true));
    Arc::new(Schema::new(fields))
}

/// Rows like `"+I a 5"`, `"-D a 5"`, `"+I b null"` (op, key, value). Without a changelog column
/// the op must be `+I`.
pub fn kv_batch(schema: &SchemaRef, rows: &[&str]) -> RecordBatch {
    let changelog = schema.fields().len() == 3;
    let mut ops = vec![];
    let mut keys = vec![];
    let mut vals = vec![];
    for r in rows {
        let parts: Vec<&str> = r.split_whitespace().collect();
        assert_eq!(parts.len(), 3, "bad row {r}");
        ops.push(parts[0].to_string());
        keys.push(if parts[1] == "null" {
            None
        } else {
            Some(parts[1].to_string())
        });
        vals.push(if parts[2] == "null" {
            None
        } else {
            Some(parts[2].parse::<i64>().unwrap())
        });
    }
    let mut cols: Vec<ArrayRef> = vec![];
    if changelog {
        cols.push(Arc::new(StringArray::from(ops)));
    } else {
        assert!(ops.iter().all(|o| o == "+I"));
    }
    cols.push(Arc::new(StringArray::from(keys)));
    cols.push(Arc::new(Int64Array::from(vals)));
    RecordBatch::try_new(schema.clone(), cols).unwrap()
}

/// A batch of changes as the tests read it: a record batch whose first column is the op column
/// (as sinks and files hold a changelog), or an operator's [`ChangeBatch`].
pub trait Changes {
    fn with_op(&self) -> RecordBatch;
}

impl Changes for RecordBatch {
    fn with_op(&self) -> RecordBatch {
        self.clone()
    }
}

impl Changes for ChangeBatch {
    fn with_op(&self) -> RecordBatch {
        self.with_op_column().unwrap()
    }
}

/// Formats changelog batches as lines like `+I[a, 2, 10]`.
pub fn format_changes<B: Changes>(batches: &[B]) -> Vec<String> {
    let opts = FormatOptions::default().with_null("null");
    let mut out = vec![];
    for b in batches {
        let b = &b.with_op();
        let ops = b.column(0).as_primitive::<Int8Type>();
        let fmts: Vec<ArrayFormatter> = b.columns()[1..]
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &opts).unwrap())
            .collect();
        for r in 0..b.num_rows() {
            let kind = tally::changelog::RowKind::from_code(i64::from(ops.value(r))).unwrap();
            let vals: Vec<String> = fmts.iter().map(|f| f.value(r).to_string()).collect();
            out.push(format!("{kind}[{}]", vals.join(", ")));
        }
    }
    out
}

/// The multiset a changelog leaves: `+I`/`+U` add a row, `-U`/`-D` remove one. Panics when a
/// retraction removes a row that is not there (the changelog would be inconsistent).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Materialized(pub BTreeMap<String, i64>);

impl Materialized {
    pub fn apply<B: Changes>(&mut self, batches: &[B]) {
        self.apply_lines(&format_changes(batches));
    }

    /// Applies changelog lines as [`format_changes`] writes them.
    pub fn apply_lines(&mut self, lines: &[String]) {
        for line in lines {
            let (kind, row) = line.split_at(2);
            let row = row.to_string();
            match kind {
                "+I" | "+U" => *self.0.entry(row).or_insert(0) += 1,
                "-U" | "-D" => {
                    let c = self.0.get_mut(&row).unwrap_or_else(|| {
                        panic!("changelog retracts {row}, which is not in the result")
                    });
                    *c -= 1;
                    if *c == 0 {
                        self.0.remove(&row);
                    }
                }
                other => panic!("bad kind {other}"),
            }
        }
    }

    /// Rows as sorted strings (each repeated by its multiplicity).
    pub fn rows(&self) -> Vec<String> {
        let mut v = vec![];
        for (r, &c) in &self.0 {
            assert!(c > 0);
            for _ in 0..c {
                v.push(r.clone());
            }
        }
        v
    }
}

/// Mini-batch settings: `None` = off, `Some(size)` = on with that size and a 1 s latency.
pub fn config(mini_batch: Option<usize>, update_before: bool) -> Config {
    let mut pairs = vec![(
        "tally.exec.emit.update-before".to_string(),
        update_before.to_string(),
    )];
    if let Some(size) = mini_batch {
        pairs.push(("table.exec.mini-batch.enabled".into(), "true".into()));
        pairs.push(("table.exec.mini-batch.allow-latency".into(), "1 s".into()));
        pairs.push(("table.exec.mini-batch.size".into(), size.to_string()));
    }
    Config::from_pairs(pairs).unwrap()
}

/// Builds an aggregate over `schema` with a manual clock at 0.
pub fn build(
    schema: &SchemaRef,
    keys: Vec<Expr>,
    aggs: Vec<Expr>,
    config: Config,
) -> (GroupAggregate, ManualClock) {
    let clock = ManualClock::new(0);
    let agg = GroupAggregate::builder(schema.clone())
        .group_by(keys)
        .aggregate(aggs)
        .config(config)
        .clock(Arc::new(clock.clone()))
        .build()
        .unwrap();
    (agg, clock)
}

/// Pushes each row group as one batch and returns the formatted changes of each push (plus
/// `finish` as the last element).
pub fn run(agg: &mut GroupAggregate, schema: &SchemaRef, pushes: &[&[&str]]) -> Vec<Vec<String>> {
    let mut out = vec![];
    for rows in pushes {
        let b = kv_batch(schema, rows);
        out.push(format_changes(&agg.push(&b).unwrap()));
    }
    out.push(format_changes(&agg.finish().unwrap()));
    out
}

/// Pushes each group of rows as one batch and then calls `finish` (which fires a pending
/// mini-batch), returning the formatted changes of each push.
pub fn run_mini_batches(
    agg: &mut GroupAggregate,
    schema: &SchemaRef,
    pushes: &[&[&str]],
) -> Vec<Vec<String>> {
    pushes
        .iter()
        .map(|rows| {
            let b = kv_batch(schema, rows);
            let mut changes = agg.push(&b).unwrap();
            changes.extend(agg.finish().unwrap());
            format_changes(&changes)
        })
        .collect()
}

/// Runs `tally ARGS…` from the repository root; returns (exit code, stdout, stderr).
#[cfg(feature = "cli")]
pub fn tally_run<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> (i32, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tally"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

/// Runs `tally ARGS…`, which must succeed; returns its standard output.
#[cfg(feature = "cli")]
pub fn tally_ok<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> String {
    let (code, out, err) = tally_run(args);
    assert_eq!(code, 0, "{err}");
    out
}

/// Runs `tally sql ARGS…` from the repository root; returns (exit code, stdout, stderr).
#[cfg(feature = "cli")]
pub fn tally_command(args: &[&str]) -> (i32, String, String) {
    let mut all = vec!["sql"];
    all.extend(args);
    tally_run(&all)
}

#[cfg(feature = "cli")]
/// Reads a Parquet file of orders into its live (shop, amount, status, ts) rows, applying its
/// changelog.
pub fn live_orders(path: &str) -> Vec<(String, Option<i64>, String, i64)> {
    let file =
        std::fs::File::open(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(path)).unwrap();
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
        .unwrap()
        .build()
        .unwrap();
    let schema = arrow::array::RecordBatchReader::schema(&reader);
    let idx = |n: &str| schema.index_of(n).unwrap();
    let mut live: BTreeMap<i64, (String, Option<i64>, String, i64)> = BTreeMap::new();
    for b in reader {
        let b = b.unwrap();
        let op = b
            .column(idx("op"))
            .as_primitive::<arrow::datatypes::Int8Type>();
        let id = b
            .column(idx("order_id"))
            .as_primitive::<arrow::datatypes::Int64Type>();
        let shop = b.column(idx("shop")).as_string::<i32>();
        let amount = b
            .column(idx("amount"))
            .as_primitive::<arrow::datatypes::Int64Type>();
        let status = b.column(idx("status")).as_string::<i32>();
        let ts = b
            .column(idx("ts"))
            .as_primitive::<arrow::datatypes::TimestampMillisecondType>();
        for i in 0..b.num_rows() {
            let row = (
                shop.value(i).to_string(),
                arrow::array::Array::is_valid(amount, i).then(|| amount.value(i)),
                status.value(i).to_string(),
                ts.value(i),
            );
            match op.value(i) {
                0 | 2 => {
                    live.insert(id.value(i), row);
                }
                _ => {
                    assert_eq!(
                        live.remove(&id.value(i)),
                        Some(row),
                        "the recorded changelog retracts a live row"
                    );
                }
            }
        }
    }
    live.into_values().collect()
}

/// The final table of `data/orders_changelog.sql` (`day, paid_orders, shops`), as sorted CSV
/// lines, computed from the live rows without the engine.
#[cfg(feature = "cli")]
pub fn orders_changelog_expected() -> Vec<String> {
    let mut per_shop_day: BTreeMap<(String, String), i64> = BTreeMap::new();
    for (shop, _, status, ts) in live_orders("data/orders_changelog.parquet") {
        let day = chrono::DateTime::from_timestamp_millis(ts)
            .unwrap()
            .format("%Y-%m-%d")
            .to_string();
        *per_shop_day.entry((shop, day)).or_default() += i64::from(status == "PAID");
    }
    let mut expected: BTreeMap<(String, i64), i64> = BTreeMap::new();
    for ((_, day), paid) in per_shop_day {
        if paid >= 100 {
            *expected.entry((day, paid)).or_default() += 1;
        }
    }
    let mut expected: Vec<String> = expected
        .iter()
        .map(|((d, p), n)| format!("{d},{p},{n}"))
        .collect();
    expected.sort();
    expected
}

/// Runs a planned query over its source in batches of `batch` rows; returns its changelog lines
/// (as [`format_changes`] writes them) and what the run measured.
#[cfg(feature = "sql")]
pub fn run_query(
    query: &mut tally::sql::PlannedQuery,
    batch: usize,
) -> (Vec<String>, tally::run::RunStats) {
    let mut out: Vec<ChangeBatch> = vec![];
    let mut sink = |b: &ChangeBatch| {
        out.push(b.clone());
        Ok(())
    };
    let stats = query.job().run(batch, &mut sink, |_, _| {}).unwrap();
    (format_changes(&out), stats)
}

/// A seeded changelog stream of (retract?, row): inserts of `new_row()`, deletes of live rows,
/// and `-U`/`+U` updates of live rows (the new row keeps the old one's key through `rekey`).
/// Without `retractions`, inserts only.
pub fn changelog_stream<R: Clone>(
    rng: &mut rand::rngs::StdRng,
    len: usize,
    retractions: bool,
    mut new_row: impl FnMut(&mut rand::rngs::StdRng) -> R,
    rekey: impl Fn(&R, &mut R),
) -> Vec<(bool, R)> {
    use rand::Rng;
    let mut live: Vec<R> = vec![];
    let mut out = vec![];
    while out.len() < len {
        let r = rng.random_range(0..10);
        if retractions && !live.is_empty() && r < 2 {
            let i = rng.random_range(0..live.len());
            out.push((true, live.swap_remove(i)));
        } else if retractions && !live.is_empty() && r < 4 {
            let i = rng.random_range(0..live.len());
            let old = live.swap_remove(i);
            let mut new = new_row(rng);
            rekey(&old, &mut new);
            out.push((true, old));
            out.push((false, new.clone()));
            live.push(new);
        } else {
            let row = new_row(rng);
            live.push(row.clone());
            out.push((false, row));
        }
    }
    out
}

/// The options of a parallel aggregate run by `tally::run::Job`: P workers, one or two phases,
/// mini-batches of `size` rows (latency 1 h), on the pipelined runtime or not.
pub fn runtime_config(workers: usize, two_phase: bool, size: usize, pipelined: bool) -> Config {
    Config::from_pairs([
        (
            "table.exec.resource.default-parallelism",
            workers.to_string().as_str(),
        ),
        ("table.exec.mini-batch.enabled", "true"),
        ("table.exec.mini-batch.allow-latency", "1 h"),
        ("table.exec.mini-batch.size", size.to_string().as_str()),
        (
            "table.optimizer.agg-phase-strategy",
            if two_phase { "TWO_PHASE" } else { "ONE_PHASE" },
        ),
        (
            "tally.exec.pipelined",
            if pipelined { "true" } else { "false" },
        ),
    ])
    .unwrap()
}

/// The seed of a randomized oracle test: `default`, or, to soak the oracles with other inputs
/// and settings, `default` moved by the one in `TALLY_TEST_SEED` (an unsigned integer) times an
/// odd 64-bit constant, so that a soak seed does not give one case another case's default
/// seed (tests number their cases' seeds in a row). A failure's message names the test's own
/// seed; rerun with the same `TALLY_TEST_SEED` to see it again.
///
/// # Panics
/// When `TALLY_TEST_SEED` is set but not an unsigned integer.
pub fn test_seed(default: u64) -> u64 {
    match std::env::var("TALLY_TEST_SEED") {
        Ok(v) => {
            let n = v
                .trim()
                .parse::<u64>()
                .unwrap_or_else(|_| panic!("TALLY_TEST_SEED={v}: not an unsigned integer"));
            default.wrapping_add(n.wrapping_mul(0x9e37_79b9_7f4a_7c15))
        }
        Err(_) => default,
    }
}

/// Whether the oracles run under another seed ([`test_seed`]): their results are checked as
/// always, but not that the random settings took every path they take under the default seeds.
pub fn soaking() -> bool {
    std::env::var_os("TALLY_TEST_SEED").is_some()
}
