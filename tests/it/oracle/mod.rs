//! The central invariant, checked against a row-at-a-time reference written here.
//!
//! Seeded random streams (insert-only, and changelogs with deletes and `-U/+U` updates; a hot key
//! holding about half the rows; NULL keys and values; FILTERs; DISTINCT) are pushed in random
//! batch sizes through `GroupAggregate` under many configurations. After every push, the result of
//! applying the emitted changelog must equal the reference's from-scratch GROUP BY over the input
//! rows whose mini-batch has fired; after `finish`, over all rows. With `-U` switched off the
//! changelog is applied as upserts by key.

mod one_phase;
mod parallel;
mod snapshot;
mod ttl;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use arrow::array::{
    ArrayRef, BooleanArray, DictionaryArray, Int8Array, Int64Array, RecordBatch, StringArray,
};
use arrow::datatypes::{DataType, Field, Int32Type, Schema, SchemaRef};
use datafusion_expr::{Expr, ExprFunctionExt, col, lit};
use rand::Rng;
use rand::rngs::StdRng;
use tally::aggregates::{avg, count, count_star, max, min, sum};

use crate::common::{Changes, format_changes};

/// One input row.
#[derive(Debug, Clone, PartialEq)]
struct Row {
    k: Option<String>,
    k2: i64,
    v: Option<i64>,
    u: Option<i64>,
    s: Option<String>,
    f: Option<bool>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum KeyType {
    Utf8,
    Dictionary,
    Int64,
}

#[derive(Debug, Clone, Copy)]
enum Keys {
    /// `GROUP BY k`
    One,
    /// `GROUP BY k, k2`
    Two,
    /// no GROUP BY
    Global,
}

fn random_row(rng: &mut StdRng, n_keys: usize) -> Row {
    let k = if rng.random_bool(0.05) {
        None
    } else if rng.random_bool(0.5) {
        Some("7".to_string()) // the hot key
    } else {
        Some(rng.random_range(0..n_keys as i64).to_string())
    };
    let opt = |rng: &mut StdRng, p: f64| rng.random_bool(1.0 - p);
    Row {
        k,
        k2: rng.random_range(0..3),
        v: opt(rng, 0.1).then(|| rng.random_range(-50..100)),
        u: opt(rng, 0.1).then(|| rng.random_range(0..15)),
        s: opt(rng, 0.1).then(|| ["x", "yy", "a", "zz", "m"][rng.random_range(0..5)].to_string()),
        f: opt(rng, 0.1).then(|| rng.random_bool(0.5)),
    }
}

/// A stream of (retract?, row): inserts, deletes of live rows, and -U/+U updates of live rows.
fn random_stream(
    rng: &mut StdRng,
    len: usize,
    retractions: bool,
    n_keys: usize,
) -> Vec<(bool, Row)> {
    // An update keeps the key: -U old, +U new.
    crate::common::changelog_stream(
        rng,
        len,
        retractions,
        |rng| random_row(rng, n_keys),
        |old, new| {
            new.k = old.k.clone();
            new.k2 = old.k2;
        },
    )
}

fn schema(key_type: KeyType, changelog: bool) -> SchemaRef {
    let mut fields = vec![];
    if changelog {
        fields.push(Field::new("op", DataType::Int8, false));
    }
    fields.push(Field::new(
        "k",
        match key_type {
            KeyType::Utf8 => DataType::Utf8,
            KeyType::Dictionary => {
                DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8))
            }
            KeyType::Int64 => DataType::Int64,
        },
        true,
    ));
    fields.extend([
        Field::new("k2", DataType::Int64, false),
        Field::new("v", DataType::Int64, true),
        Field::new("u", DataType::Int64, true),
        Field::new("s", DataType::Utf8, true),
        Field::new("f", DataType::Boolean, true),
    ]);
    Arc::new(Schema::new(fields))
}

fn to_batch(
    schema: &SchemaRef,
    key_type: KeyType,
    rows: &[(bool, Row)],
    update_ops: bool,
) -> RecordBatch {
    let mut cols: Vec<ArrayRef> = vec![];
    if schema.field(0).name() == "op" {
        // Retractions as -D or -U, accumulations as +I or +U: both spellings must behave alike.
        cols.push(Arc::new(Int8Array::from_iter_values(rows.iter().map(
            |(r, _)| match (*r, update_ops) {
                (false, false) => 0,
                (true, true) => 1,
                (false, true) => 2,
                (true, false) => 3,
            },
        ))));
    }
    let keys = rows.iter().map(|(_, r)| r.k.clone());
    cols.push(match key_type {
        KeyType::Utf8 => Arc::new(StringArray::from_iter(keys)),
        KeyType::Dictionary => Arc::new(
            keys.collect::<Vec<Option<String>>>()
                .iter()
                .map(|k| k.as_deref())
                .collect::<DictionaryArray<Int32Type>>(),
        ),
        KeyType::Int64 => Arc::new(Int64Array::from_iter(
            keys.map(|k| k.map(|k| k.parse::<i64>().unwrap())),
        )),
    });
    cols.push(Arc::new(Int64Array::from_iter_values(
        rows.iter().map(|(_, r)| r.k2),
    )));
    cols.push(Arc::new(Int64Array::from_iter(
        rows.iter().map(|(_, r)| r.v),
    )));
    cols.push(Arc::new(Int64Array::from_iter(
        rows.iter().map(|(_, r)| r.u),
    )));
    cols.push(Arc::new(StringArray::from_iter(
        rows.iter().map(|(_, r)| r.s.clone()),
    )));
    cols.push(Arc::new(BooleanArray::from_iter(
        rows.iter().map(|(_, r)| r.f),
    )));
    RecordBatch::try_new(schema.clone(), cols).unwrap()
}

fn key_exprs(keys: Keys) -> Vec<Expr> {
    match keys {
        Keys::One => vec![col("k")],
        Keys::Two => vec![col("k"), col("k2")],
        Keys::Global => vec![],
    }
}

fn aggregates() -> Vec<Expr> {
    vec![
        count_star(),
        count(col("v")),
        sum(col("v")),
        avg(col("v")),
        min(col("v")),
        max(col("v")),
        max(col("s")),
        min(col("s")).filter(col("f")).build().unwrap(),
        sum(col("v")).filter(col("f")).build().unwrap(),
        count(col("u")).distinct().build().unwrap(),
        count(col("u"))
            .distinct()
            .filter(col("v").gt(lit(0i64)))
            .build()
            .unwrap(),
        sum(col("u")).distinct().build().unwrap(),
        avg(col("u")).distinct().filter(col("f")).build().unwrap(),
        count_star().filter(col("v").lt(lit(0i64))).build().unwrap(),
    ]
}

fn opt<T: ToString>(v: Option<T>) -> String {
    v.map_or("null".to_string(), |v| v.to_string())
}

/// The reference: a from-scratch GROUP BY over the live rows, one formatted line per group.
fn reference(rows: &[(bool, Row)], keys: Keys) -> Vec<String> {
    // Live multiset per group key (retractions remove one equal row).
    let mut groups: BTreeMap<Vec<String>, Vec<Row>> = BTreeMap::new();
    for (retract, row) in rows {
        let key = match keys {
            Keys::One => vec![opt(row.k.clone())],
            Keys::Two => vec![opt(row.k.clone()), row.k2.to_string()],
            Keys::Global => vec![],
        };
        let g = groups.entry(key).or_default();
        if *retract {
            let i = g
                .iter()
                .position(|r| r == row)
                .expect("stream retracts a live row");
            g.swap_remove(i);
        } else {
            g.push(row.clone());
        }
    }
    let mut out = vec![];
    for (key, rows) in groups {
        if rows.is_empty() {
            continue; // deleted (retraction input) — insert-only groups never empty out
        }
        let vs: Vec<i64> = rows.iter().filter_map(|r| r.v).collect();
        let sum_v = (!vs.is_empty()).then(|| vs.iter().sum::<i64>());
        let avg_v = sum_v.map(|s| s / vs.len() as i64);
        let ss: Vec<&String> = rows.iter().filter_map(|r| r.s.as_ref()).collect();
        let fs: Vec<&String> = rows
            .iter()
            .filter(|r| r.f == Some(true))
            .filter_map(|r| r.s.as_ref())
            .collect();
        let fv: Vec<i64> = rows
            .iter()
            .filter(|r| r.f == Some(true))
            .filter_map(|r| r.v)
            .collect();
        let us: BTreeSet<i64> = rows.iter().filter_map(|r| r.u).collect();
        let us_pos: BTreeSet<i64> = rows
            .iter()
            .filter(|r| r.v.is_some_and(|v| v > 0))
            .filter_map(|r| r.u)
            .collect();
        let us_f: BTreeSet<i64> = rows
            .iter()
            .filter(|r| r.f == Some(true))
            .filter_map(|r| r.u)
            .collect();
        let mut vals = key;
        vals.extend([
            rows.len().to_string(),
            vs.len().to_string(),
            opt(sum_v),
            opt(avg_v),
            opt(vs.iter().min()),
            opt(vs.iter().max()),
            opt(ss.iter().max()),
            opt(fs.iter().min()),
            opt((!fv.is_empty()).then(|| fv.iter().sum::<i64>())),
            us.len().to_string(),
            us_pos.len().to_string(),
            opt((!us.is_empty()).then(|| us.iter().sum::<i64>())),
            opt((!us_f.is_empty()).then(|| us_f.iter().sum::<i64>() / us_f.len() as i64)),
            rows.iter()
                .filter(|r| r.v.is_some_and(|v| v < 0))
                .count()
                .to_string(),
        ]);
        out.push(format!("[{}]", vals.join(", ")));
    }
    out.sort();
    out
}

/// The changelog applied as upserts by key (for `-U`-less output).
#[derive(Default)]
struct Upserted(BTreeMap<String, String>);

impl Upserted {
    fn apply<B: Changes>(&mut self, batches: &[B], n_keys: usize) {
        for line in format_changes(batches) {
            let (kind, row) = line.split_at(2);
            let fields: Vec<&str> = row[1..row.len() - 1].split(", ").collect();
            let key = fields[..n_keys].join(", ");
            match kind {
                "+I" | "+U" => {
                    self.0.insert(key, row.to_string());
                }
                "-D" => {
                    assert_eq!(
                        self.0.remove(&key).as_deref(),
                        Some(row),
                        "-D of a row not there"
                    );
                }
                other => panic!("{other} in an upsert changelog"),
            }
        }
    }
    fn rows(&self) -> Vec<String> {
        let mut v: Vec<String> = self.0.values().cloned().collect();
        v.sort();
        v
    }
}

/// Group keys and key types the parallel tests cover.
const KEY_CASES: [(Keys, KeyType); 4] = [
    (Keys::One, KeyType::Utf8),
    (Keys::One, KeyType::Dictionary),
    (Keys::Two, KeyType::Int64),
    (Keys::Global, KeyType::Utf8),
];

/// The parallel aggregate of [`aggregates`] by `keys`, on a clock that stands still, spreading
/// even small batches over every worker and local phase.
fn parallel_aggregate(
    schema: &SchemaRef,
    keys: Keys,
    cfg: tally::Config,
    clock: &tally::clock::ManualClock,
) -> tally::ParallelAggregate {
    tally::GroupAggregate::builder(schema.clone())
        .group_by(key_exprs(keys))
        .aggregate(aggregates())
        .config(cfg)
        .clock(Arc::new(clock.clone()))
        .build_parallel()
        .unwrap()
        .with_min_slice_rows(1)
}
