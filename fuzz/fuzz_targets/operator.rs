//! A random changelog pushed through `GroupAggregate` (`build()`) or `ParallelAggregate`
//! (`build_parallel()`) under a random configuration, in random batch splits, then finished.
//!
//! The input is `op` (Int8 codes, invalid ones included, or absent), `k` (a nullable string key),
//! `k2` (a nullable int key) and `v` (a nullable BIGINT, often near `i64::MIN`/`i64::MAX`); the
//! query is `SELECT <keys>, COUNT(*), COUNT(v), SUM(v), MIN(v), MAX(v), AVG(v),
//! COUNT(DISTINCT v), SUM(v) FILTER (WHERE v > 0) GROUP BY <keys>` (keys: `k`, `k, k2` or none).
//!
//! Besides "no panic", for insert-only input without TTL: no error, every `-U`/`-D` retracts the
//! row the table holds for its key, and the table the changelog materializes equals the
//! aggregates computed directly from the input rows (SUM and AVG's sum wrap on overflow, as
//! Flink's BIGINT does; AVG truncates).
#![no_main]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use arbitrary::Arbitrary;
use arrow::array::{
    Array, ArrayRef, AsArray, Int8Array, Int32Array, Int64Array, RecordBatch, StringArray,
};
use arrow::datatypes::{DataType, Field, Int8Type, Int32Type, Int64Type, Schema, SchemaRef};
use datafusion_expr::{ExprFunctionExt, col, lit};
use libfuzzer_sys::fuzz_target;
use tally::Config;
use tally::changelog::ChangeBatch;
use tally::clock::ManualClock;
use tally::config::AggPhaseStrategy;
use tally::aggregates::{avg, count, count_star, max, min, sum};
use tally::{GroupAggregate, Result};

#[derive(Arbitrary, Debug)]
enum Val {
    Null,
    Small(i8),
    NearMax(u8),
    NearMin(u8),
    Any(i64),
}

impl Val {
    fn get(&self) -> Option<i64> {
        match self {
            Val::Null => None,
            Val::Small(v) => Some(i64::from(*v)),
            Val::NearMax(d) => Some(i64::MAX - i64::from(*d)),
            Val::NearMin(d) => Some(i64::MIN + i64::from(*d)),
            Val::Any(v) => Some(*v),
        }
    }
}

#[derive(Arbitrary, Debug)]
struct Row {
    op: i8,
    k: Option<u8>,
    k2: Option<u8>,
    v: Val,
}

impl Row {
    fn k(&self) -> Option<String> {
        // A few keys, the empty string among them (distinct from NULL).
        self.k.map(|k| match k % 6 {
            0 => String::new(),
            n => format!("k{n}"),
        })
    }
    fn k2(&self) -> Option<i32> {
        self.k2.map(|k| i32::from(k % 3) - 1)
    }
}

#[derive(Arbitrary, Debug)]
struct Setup {
    parallel: bool,
    parallelism: u8,
    min_slice_rows: u8,
    mini_batch: bool,
    mini_batch_size: u8,
    latency_ms: u8,
    strategy: u8,
    ttl_ms: Option<u8>,
    emit_update_before: bool,
    adaptive: bool,
    adaptive_threshold: u8,
    adaptive_min_rows: u8,
    adaptive_probe_interval: u8,
    /// Modulo 3: 0, the op column is absent; 1, all `+I` codes; 2, the rows' own codes.
    ops: u8,
    /// 0: GROUP BY k; 1: GROUP BY k, k2; 2: no GROUP BY.
    keys: u8,
}

#[derive(Arbitrary, Debug)]
struct Input {
    setup: Setup,
    rows: Vec<Row>,
    /// Batch lengths (cycled) and clock steps between batches.
    splits: Vec<(u8, u8, bool)>,
}

enum Op {
    Single(GroupAggregate),
    Parallel(tally::ParallelAggregate),
}

/// The changes as record batches with the op column first, as the checks below read them.
fn with_op(changes: Result<Vec<ChangeBatch>>) -> Result<Vec<RecordBatch>> {
    changes?.iter().map(ChangeBatch::with_op_column).collect()
}

impl Op {
    fn push(&mut self, b: &RecordBatch) -> Result<Vec<RecordBatch>> {
        with_op(match self {
            Op::Single(a) => a.push(b),
            Op::Parallel(a) => a.push(b),
        })
    }
    fn poll(&mut self) -> Result<Vec<RecordBatch>> {
        with_op(match self {
            Op::Single(a) => a.poll(),
            Op::Parallel(a) => a.poll(),
        })
    }
    fn finish(&mut self) -> Result<Vec<RecordBatch>> {
        with_op(match self {
            Op::Single(a) => a.finish(),
            Op::Parallel(a) => a.finish(),
        })
    }
}

fn config(s: &Setup) -> Config {
    let mut c = Config::default();
    c.mini_batch_enabled = s.mini_batch;
    // Size 0 and latency 0 are invalid with mini-batch on: build() must refuse them.
    c.mini_batch_size = i64::from(s.mini_batch_size % 9);
    c.mini_batch_allow_latency = Duration::from_millis(u64::from(s.latency_ms % 50));
    c.agg_phase_strategy = match s.strategy % 3 {
        0 => AggPhaseStrategy::Auto,
        1 => AggPhaseStrategy::OnePhase,
        _ => AggPhaseStrategy::TwoPhase,
    };
    c.state_ttl = Duration::from_millis(s.ttl_ms.map_or(0, |t| 1 + u64::from(t)));
    c.parallelism = 1 + usize::from(s.parallelism % 3);
    c.emit_update_before = s.emit_update_before;
    c.adaptive_local = s.adaptive;
    c.adaptive_threshold = (1.0 + f64::from(s.adaptive_threshold)) / 256.0;
    c.adaptive_min_rows = 1 + u64::from(s.adaptive_min_rows % 16);
    c.adaptive_probe_interval = 1 + u64::from(s.adaptive_probe_interval % 16);
    c
}

/// Group key as read back from a changelog row.
type Key = Vec<(Option<String>, Option<i32>)>;
/// COUNT(*), COUNT(v), SUM(v), MIN(v), MAX(v), AVG(v), COUNT(DISTINCT v), SUM(v) FILTER (v > 0).
type Values = (
    i64,
    i64,
    Option<i64>,
    Option<i64>,
    Option<i64>,
    Option<i64>,
    i64,
    Option<i64>,
);

fn expected(rows: &[Row], keys: u8) -> BTreeMap<Key, Values> {
    #[derive(Default)]
    struct Acc {
        n: i64,
        nv: i64,
        sum: Option<i64>,
        min: Option<i64>,
        max: Option<i64>,
        distinct: BTreeSet<i64>,
        pos: Option<i64>,
    }
    let mut accs: BTreeMap<Key, Acc> = BTreeMap::new();
    for r in rows {
        let a = accs.entry(key_of(r.k(), r.k2(), keys)).or_default();
        a.n += 1;
        if let Some(v) = r.v.get() {
            a.nv += 1;
            a.sum = Some(a.sum.unwrap_or(0).wrapping_add(v));
            a.min = Some(a.min.map_or(v, |m| m.min(v)));
            a.max = Some(a.max.map_or(v, |m| m.max(v)));
            a.distinct.insert(v);
            if v > 0 {
                a.pos = Some(a.pos.unwrap_or(0).wrapping_add(v));
            }
        }
    }
    accs.into_iter()
        .map(|(k, a)| {
            let avg = a.sum.map(|s| s.wrapping_div(a.nv));
            let values = (
                a.n,
                a.nv,
                a.sum,
                a.min,
                a.max,
                avg,
                a.distinct.len() as i64,
                a.pos,
            );
            (k, values)
        })
        .collect()
}

fn key_of(k: Option<String>, k2: Option<i32>, keys: u8) -> Key {
    match keys {
        0 => vec![(k, None)],
        1 => vec![(k, None), (None, k2)],
        _ => vec![],
    }
}

fn int(c: &ArrayRef, i: usize) -> Option<i64> {
    let c = c
        .as_primitive_opt::<Int64Type>()
        .unwrap_or_else(|| panic!("expected BIGINT, got {}", c.data_type()));
    c.is_valid(i).then(|| c.value(i))
}

/// Applies a changelog to the table; checks that retractions retract what the table holds.
fn apply(table: &mut BTreeMap<Key, Values>, b: &RecordBatch, keys: u8) {
    let n_keys = match keys {
        0 => 1,
        1 => 2,
        _ => 0,
    };
    let ops = b.column(0).as_primitive::<Int8Type>();
    for i in 0..b.num_rows() {
        let k = match keys {
            0 | 1 => {
                let s = b.column(1).as_string::<i32>();
                let k = s.is_valid(i).then(|| s.value(i).to_string());
                let k2 = (keys == 1).then(|| {
                    let c = b.column(2).as_primitive::<Int32Type>();
                    c.is_valid(i).then(|| c.value(i))
                });
                key_of(k, k2.flatten(), keys)
            }
            _ => vec![],
        };
        let c = |j: usize| b.column(1 + n_keys + j);
        let count_of = |j: usize| int(c(j), i).expect("COUNT is never NULL");
        let values: Values = (
            count_of(0),
            count_of(1),
            int(c(2), i),
            int(c(3), i),
            int(c(4), i),
            int(c(5), i),
            count_of(6),
            int(c(7), i),
        );
        match ops.value(i) {
            0 | 2 => {
                table.insert(k, values);
            }
            1 | 3 => {
                let old = table.remove(&k);
                assert_eq!(
                    old,
                    Some(values),
                    "retraction of {k:?} does not match the table"
                );
            }
            other => panic!("bad op {other} in the output"),
        }
    }
}

fn input_batch(rows: &[Row], schema: &SchemaRef, ops: u8) -> RecordBatch {
    let mut cols: Vec<ArrayRef> = vec![];
    if ops != 0 {
        cols.push(Arc::new(Int8Array::from_iter_values(
            rows.iter().map(|r| if ops == 1 { 0 } else { r.op }),
        )));
    }
    cols.push(Arc::new(StringArray::from_iter(rows.iter().map(Row::k))));
    cols.push(Arc::new(Int32Array::from_iter(rows.iter().map(Row::k2))));
    cols.push(Arc::new(Int64Array::from_iter(
        rows.iter().map(|r| r.v.get()),
    )));
    RecordBatch::try_new(Arc::clone(schema), cols).expect("input batch")
}

fuzz_target!(|input: Input| {
    let Input {
        setup,
        rows,
        splits,
    } = input;
    if rows.len() > 512 {
        return;
    }
    let mut fields = vec![];
    if setup.ops % 3 != 0 {
        fields.push(Field::new("op", DataType::Int8, false));
    }
    fields.push(Field::new("k", DataType::Utf8, true));
    fields.push(Field::new("k2", DataType::Int32, true));
    fields.push(Field::new("v", DataType::Int64, true));
    let schema: SchemaRef = Arc::new(Schema::new(fields));
    let keys = setup.keys % 3;
    let group_by = match keys {
        0 => vec![col("k")],
        1 => vec![col("k"), col("k2")],
        _ => vec![],
    };
    let aggregates = vec![
        count_star().alias("n"),
        count(col("v")).alias("nv"),
        sum(col("v")).alias("s"),
        min(col("v")).alias("lo"),
        max(col("v")).alias("hi"),
        avg(col("v")).alias("mean"),
        count(col("v")).distinct().build().unwrap().alias("dv"),
        sum(col("v"))
            .filter(col("v").gt(lit(0i64)))
            .build()
            .unwrap()
            .alias("pos"),
    ];
    let config = config(&setup);
    let clock = ManualClock::new(1_000);
    let builder = GroupAggregate::builder(Arc::clone(&schema))
        .group_by(group_by)
        .aggregate(aggregates)
        .config(config.clone())
        .clock(Arc::new(clock.clone()));
    let built = if setup.parallel {
        builder
            .build_parallel()
            .map(|a| Op::Parallel(a.with_min_slice_rows(1 + usize::from(setup.min_slice_rows % 4))))
    } else {
        builder.build().map(Op::Single)
    };
    let Ok(mut op) = built else {
        return;
    };
    let ops = setup.ops % 3;
    let insert_only = (ops <= 1 || rows.iter().all(|r| r.op == 0)) && setup.ttl_ms.is_none();
    let mut out = vec![];
    let mut failed = false;
    let mut at = 0;
    let mut step = 0;
    while at < rows.len() {
        let (len, advance, poll) = splits
            .get(step % splits.len().max(1))
            .copied()
            .unwrap_or((255, 0, false));
        step += 1;
        // A length of 0 pushes an empty batch before a one-row batch.
        let len = usize::from(len) % 64;
        let mut lens = vec![len.max(1).min(rows.len() - at)];
        if len == 0 {
            lens.insert(0, 0);
        }
        clock.advance_ms(i64::from(advance));
        for len in lens {
            let batch = input_batch(&rows[at..at + len], &schema, ops);
            at += len;
            match op.push(&batch) {
                Ok(b) => out.extend(b),
                Err(e) => {
                    assert!(!insert_only, "insert-only push failed: {e}");
                    failed = true;
                }
            }
        }
        if poll {
            match op.poll() {
                Ok(b) => out.extend(b),
                Err(e) => {
                    assert!(!insert_only, "insert-only poll failed: {e}");
                    failed = true;
                }
            }
        }
    }
    match op.finish() {
        Ok(b) => out.extend(b),
        Err(e) => {
            assert!(!insert_only, "insert-only finish failed: {e}");
            failed = true;
        }
    }
    if let Op::Parallel(p) = &op {
        let _ = p.metrics();
    }
    if !insert_only || failed {
        return;
    }
    let mut table = BTreeMap::new();
    for b in &out {
        apply(&mut table, b, keys);
    }
    assert_eq!(table, expected(&rows, keys), "config: {config:?}");
});
