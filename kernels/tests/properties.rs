//! Property tests for `tally-kernels`.
//!
//! Every kernel is driven with seeded random input and compared with a naive row-at-a-time model
//! written here in plain Rust (`i128`, `f64`, `BTreeMap`). Inputs are built as longer arrays and
//! sliced (non-zero offsets, filters sliced likewise), and include NULLs, all-NULL batches,
//! empty batches, dictionaries with duplicate and NULL values, and type extremes.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::*;
use arrow_array::{
    Array, ArrayRef, BooleanArray, Date32Array, Decimal128Array, DictionaryArray, Float32Array,
    Float64Array, Int8Array, Int16Array, Int32Array, Int64Array, LargeStringArray, StringArray,
    StringViewArray, TimestampMillisecondArray, UInt8Array, UInt16Array, UInt32Array, UInt64Array,
};
use arrow_buffer::{BooleanBuffer, NullBuffer, i256};
use arrow_schema::{DataType, TimeUnit};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use tally_kernels::accumulate::{count_selected, for_each_selected};
use tally_kernels::accumulator::GroupsAccumulator;
use tally_kernels::aggregates::{AggregateKind, new_accumulator, result_type};
use tally_kernels::distinct::DistinctAccumulator;
use tally_kernels::group_values::new_group_values;
use tally_kernels::hash::hash_columns;

use AggregateKind::{Avg, Count, CountStar, Max, Min, Sum, Sum0};

// ------------------------------------------------------------------------------------------------
// Scalars and types
// ------------------------------------------------------------------------------------------------

/// One value of any tested type. Integers of every width, decimals (unscaled), dates and
/// timestamps are `I`; floats are `F` (an `f32` is stored exactly as an `f64`), ordered and
/// compared by IEEE total order, i.e. by bit pattern.
#[derive(Clone, Debug)]
enum S {
    I(i128),
    F(f64),
    Str(String),
    B(bool),
}

impl S {
    fn rank(&self) -> u8 {
        match self {
            S::I(_) => 0,
            S::F(_) => 1,
            S::Str(_) => 2,
            S::B(_) => 3,
        }
    }
    fn int(&self) -> i128 {
        match self {
            S::I(v) => *v,
            other => panic!("not an integer: {other:?}"),
        }
    }
    fn float(&self) -> f64 {
        match self {
            S::F(v) => *v,
            other => panic!("not a float: {other:?}"),
        }
    }
    fn str(&self) -> &str {
        match self {
            S::Str(v) => v,
            other => panic!("not a string: {other:?}"),
        }
    }
    fn bool(&self) -> bool {
        match self {
            S::B(v) => *v,
            other => panic!("not a boolean: {other:?}"),
        }
    }
}

impl Ord for S {
    fn cmp(&self, other: &Self) -> Ordering {
        match (self, other) {
            (S::I(a), S::I(b)) => a.cmp(b),
            (S::F(a), S::F(b)) => a.total_cmp(b),
            (S::Str(a), S::Str(b)) => a.as_bytes().cmp(b.as_bytes()),
            (S::B(a), S::B(b)) => a.cmp(b),
            _ => self.rank().cmp(&other.rank()),
        }
    }
}
impl PartialOrd for S {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl PartialEq for S {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for S {}

/// The tested argument / key types.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Ty {
    I8,
    I16,
    I32,
    I64,
    U8,
    U16,
    U32,
    U64,
    F32,
    F64,
    Dec(u8, i8),
    Date32,
    TsMs,
    Utf8,
    LargeUtf8,
    Utf8View,
    /// `Dictionary(Int32, Utf8)`.
    Dict,
    Bool,
}

const ALL_TYPES: &[Ty] = &[
    Ty::I8,
    Ty::I16,
    Ty::I32,
    Ty::I64,
    Ty::U8,
    Ty::U16,
    Ty::U32,
    Ty::U64,
    Ty::F32,
    Ty::F64,
    Ty::Dec(10, 2),
    Ty::Dec(12, 3),
    Ty::Dec(18, 7),
    // Sums of these overflow 38 digits: SUM and AVG are then NULL.
    Ty::Dec(38, 2),
    Ty::Date32,
    Ty::TsMs,
    Ty::Utf8,
    Ty::LargeUtf8,
    Ty::Utf8View,
    Ty::Dict,
    Ty::Bool,
];

impl Ty {
    fn dt(self) -> DataType {
        match self {
            Ty::I8 => DataType::Int8,
            Ty::I16 => DataType::Int16,
            Ty::I32 => DataType::Int32,
            Ty::I64 => DataType::Int64,
            Ty::U8 => DataType::UInt8,
            Ty::U16 => DataType::UInt16,
            Ty::U32 => DataType::UInt32,
            Ty::U64 => DataType::UInt64,
            Ty::F32 => DataType::Float32,
            Ty::F64 => DataType::Float64,
            Ty::Dec(p, s) => DataType::Decimal128(p, s),
            Ty::Date32 => DataType::Date32,
            Ty::TsMs => DataType::Timestamp(TimeUnit::Millisecond, None),
            Ty::Utf8 => DataType::Utf8,
            Ty::LargeUtf8 => DataType::LargeUtf8,
            Ty::Utf8View => DataType::Utf8View,
            Ty::Dict => DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)),
            Ty::Bool => DataType::Boolean,
        }
    }

    /// `(bits, signed)` of an integer type.
    fn int_width(self) -> Option<(u32, bool)> {
        Some(match self {
            Ty::I8 => (8, true),
            Ty::I16 => (16, true),
            Ty::I32 => (32, true),
            Ty::I64 => (64, true),
            Ty::U8 => (8, false),
            Ty::U16 => (16, false),
            Ty::U32 => (32, false),
            Ty::U64 => (64, false),
            _ => return None,
        })
    }

    fn is_float(self) -> bool {
        matches!(self, Ty::F32 | Ty::F64)
    }

    fn is_numeric(self) -> bool {
        self.int_width().is_some() || self.is_float() || matches!(self, Ty::Dec(..))
    }

    /// The values rows are drawn from (few, so that keys and values repeat). `arith`: values for
    /// SUM/AVG, where floats are small integers (exact in any order, no NaN or -0.0).
    fn pool(self, arith: bool) -> Vec<S> {
        fn ints(v: &[i128]) -> Vec<S> {
            v.iter().map(|&x| S::I(x)).collect()
        }
        fn floats(v: &[f64], f32: bool) -> Vec<S> {
            v.iter()
                .map(|&x| S::F(if f32 { f64::from(x as f32) } else { x }))
                .collect()
        }
        match self {
            Ty::I8 => ints(&[-128, -127, -5, -1, 0, 1, 3, 64, 126, 127]),
            Ty::I16 => ints(&[i16::MIN.into(), -300, -1, 0, 1, 7, 1000, i16::MAX.into()]),
            Ty::I32 => ints(&[
                i32::MIN.into(),
                -70_000,
                -1,
                0,
                1,
                7,
                123_456,
                i32::MAX.into(),
            ]),
            Ty::I64 => ints(&[
                i64::MIN.into(),
                -(1 << 40),
                -1,
                0,
                1,
                7,
                1 << 40,
                i64::MAX.into(),
            ]),
            Ty::U8 => ints(&[0, 1, 2, 100, 200, 254, 255]),
            Ty::U16 => ints(&[0, 1, 2, 1000, 40_000, 65_535]),
            Ty::U32 => ints(&[0, 1, 2, 70_000, 3_000_000_000, u32::MAX.into()]),
            Ty::U64 => ints(&[
                0,
                1,
                2,
                1 << 40,
                1 << 63,
                (u64::MAX - 1).into(),
                u64::MAX.into(),
            ]),
            Ty::F32 | Ty::F64 if arith => floats(
                &[
                    -100.0, -7.0, -3.0, -1.0, 0.0, 1.0, 2.0, 3.0, 10.0, 55.0, 100.0,
                ],
                self == Ty::F32,
            ),
            Ty::F32 | Ty::F64 => floats(
                &[
                    f64::NEG_INFINITY,
                    -1e30,
                    -2.25,
                    -0.0,
                    0.0,
                    1.5,
                    3.0,
                    1e30,
                    f64::INFINITY,
                    f64::NAN,
                ],
                self == Ty::F32,
            ),
            Ty::Dec(38, _) => {
                // Two halves of 10^38 overflow by one; a half and a half less one do not.
                let max = 10i128.pow(38) - 1;
                let half = 5 * 10i128.pow(37);
                ints(&[-max, -half, -(half - 1), -1, 0, 1, 49, half - 1, half, max])
            }
            Ty::Dec(p, _) => {
                let max = 10i128.pow(u32::from(p)) - 1;
                ints(&[
                    -max,
                    -10_000_001,
                    -12_345,
                    -150,
                    -3,
                    -1,
                    0,
                    1,
                    5,
                    49,
                    50,
                    12_345,
                    max,
                ])
            }
            Ty::Date32 => ints(&[-719_162, -1, 0, 1, 18_000, 19_500, 2_932_896]),
            Ty::TsMs => ints(&[
                i64::MIN.into(),
                -1,
                0,
                1,
                1_700_000_000_000,
                i64::MAX.into(),
            ]),
            Ty::Utf8 | Ty::LargeUtf8 | Ty::Utf8View | Ty::Dict => [
                "",
                "a",
                "A",
                "ab",
                "b",
                "é",
                "zzz",
                "\u{0}",
                "a string longer than twelve bytes",
                "a string longer than twelve bytez",
                "ünïcödé, also long enough",
            ]
            .iter()
            .map(|s| S::Str((*s).to_string()))
            .collect(),
            Ty::Bool => vec![S::B(false), S::B(true)],
        }
    }
}

// ------------------------------------------------------------------------------------------------
// Building arrays from scalars and reading them back
// ------------------------------------------------------------------------------------------------

/// An array of `ty` holding `vals`. Dictionaries get a random layout: duplicate values, unused
/// values, and NULLs both as NULL keys and as keys pointing at a NULL value.
fn build(ty: Ty, vals: &[Option<S>], rng: &mut StdRng) -> ArrayRef {
    macro_rules! prim {
        ($arr:ty, $native:ty) => {
            Arc::new(
                vals.iter()
                    .map(|v| v.as_ref().map(|s| s.int() as $native))
                    .collect::<$arr>(),
            )
        };
    }
    match ty {
        Ty::I8 => prim!(Int8Array, i8),
        Ty::I16 => prim!(Int16Array, i16),
        Ty::I32 => prim!(Int32Array, i32),
        Ty::I64 => prim!(Int64Array, i64),
        Ty::U8 => prim!(UInt8Array, u8),
        Ty::U16 => prim!(UInt16Array, u16),
        Ty::U32 => prim!(UInt32Array, u32),
        Ty::U64 => prim!(UInt64Array, u64),
        Ty::Date32 => prim!(Date32Array, i32),
        Ty::TsMs => prim!(TimestampMillisecondArray, i64),
        Ty::Dec(p, s) => Arc::new(
            vals.iter()
                .map(|v| v.as_ref().map(S::int))
                .collect::<Decimal128Array>()
                .with_precision_and_scale(p, s)
                .unwrap(),
        ),
        Ty::F32 => Arc::new(
            vals.iter()
                .map(|v| v.as_ref().map(|s| s.float() as f32))
                .collect::<Float32Array>(),
        ),
        Ty::F64 => Arc::new(
            vals.iter()
                .map(|v| v.as_ref().map(S::float))
                .collect::<Float64Array>(),
        ),
        Ty::Utf8 => Arc::new(
            vals.iter()
                .map(|v| v.as_ref().map(S::str))
                .collect::<StringArray>(),
        ),
        Ty::LargeUtf8 => Arc::new(
            vals.iter()
                .map(|v| v.as_ref().map(S::str))
                .collect::<LargeStringArray>(),
        ),
        Ty::Utf8View => Arc::new(
            vals.iter()
                .map(|v| v.as_ref().map(S::str))
                .collect::<StringViewArray>(),
        ),
        Ty::Bool => Arc::new(
            vals.iter()
                .map(|v| v.as_ref().map(S::bool))
                .collect::<BooleanArray>(),
        ),
        Ty::Dict => build_dict(vals, rng),
    }
}

fn build_dict(vals: &[Option<S>], rng: &mut StdRng) -> ArrayRef {
    let distinct: BTreeSet<&str> = vals.iter().flatten().map(S::str).collect();
    let mut dict: Vec<Option<&str>> = vec![];
    for s in distinct {
        dict.push(Some(s));
        if rng.random_bool(0.3) {
            dict.push(Some(s));
        }
    }
    if rng.random_bool(0.5) {
        dict.push(None);
    }
    if rng.random_bool(0.5) {
        dict.push(Some("unused dictionary value"));
    }
    dict.shuffle(rng);
    let keys: Int32Array = vals
        .iter()
        .map(|v| {
            let at: Vec<usize> = (0..dict.len())
                .filter(|&j| dict[j] == v.as_ref().map(S::str))
                .collect();
            match v {
                Some(_) => Some(at[rng.random_range(0..at.len())] as i32),
                None if !at.is_empty() && rng.random_bool(0.5) => {
                    Some(at[rng.random_range(0..at.len())] as i32)
                }
                None => None,
            }
        })
        .collect();
    let values: StringArray = dict.into_iter().collect();
    Arc::new(DictionaryArray::<Int32Type>::try_new(keys, Arc::new(values)).unwrap())
}

/// `vals` as an array of `ty` that is a slice (mostly at a non-zero offset) of a longer one.
fn build_sliced(ty: Ty, vals: &[Option<S>], rng: &mut StdRng) -> ArrayRef {
    let pool = ty.pool(false);
    let pre = if rng.random_bool(0.8) {
        rng.random_range(1..9)
    } else {
        0
    };
    let post = rng.random_range(0..4);
    let mut full = gen_vals(&pool, pre, 0.3, rng);
    full.extend(vals.iter().cloned());
    full.extend(gen_vals(&pool, post, 0.3, rng));
    let arr = build(ty, &full, rng).slice(pre, vals.len());
    assert_eq!(arr.len(), vals.len());
    arr
}

/// `bits` as a filter sliced (mostly at a non-zero offset) out of a longer buffer.
fn sliced_filter(bits: &[bool], rng: &mut StdRng) -> BooleanBuffer {
    let pre = if rng.random_bool(0.8) {
        rng.random_range(1..70)
    } else {
        0
    };
    let post = rng.random_range(0..5);
    let mut full: Vec<bool> = (0..pre).map(|_| rng.random_bool(0.5)).collect();
    full.extend_from_slice(bits);
    full.extend((0..post).map(|_| rng.random_bool(0.5)));
    let b = BooleanBuffer::from_iter(full).slice(pre, bits.len());
    assert_eq!(b.iter().collect::<Vec<_>>(), bits);
    b
}

/// The rows of `a` as scalars (dictionaries read through their values).
fn to_scalars(a: &ArrayRef) -> Vec<Option<S>> {
    macro_rules! prim {
        ($t:ty, $f:expr) => {{
            let a = a.as_primitive::<$t>();
            (0..a.len())
                .map(|i| a.is_valid(i).then(|| $f(a.value(i))))
                .collect()
        }};
    }
    match a.data_type() {
        DataType::Int8 => prim!(Int8Type, |v: i8| S::I(v.into())),
        DataType::Int16 => prim!(Int16Type, |v: i16| S::I(v.into())),
        DataType::Int32 => prim!(Int32Type, |v: i32| S::I(v.into())),
        DataType::Int64 => prim!(Int64Type, |v: i64| S::I(v.into())),
        DataType::UInt8 => prim!(UInt8Type, |v: u8| S::I(v.into())),
        DataType::UInt16 => prim!(UInt16Type, |v: u16| S::I(v.into())),
        DataType::UInt32 => prim!(UInt32Type, |v: u32| S::I(v.into())),
        DataType::UInt64 => prim!(UInt64Type, |v: u64| S::I(v.into())),
        DataType::Float32 => prim!(Float32Type, |v: f32| S::F(v.into())),
        DataType::Float64 => prim!(Float64Type, S::F),
        DataType::Decimal128(_, _) => prim!(Decimal128Type, S::I),
        DataType::Date32 => prim!(Date32Type, |v: i32| S::I(v.into())),
        DataType::Timestamp(TimeUnit::Millisecond, None) => {
            prim!(TimestampMillisecondType, |v: i64| S::I(v.into()))
        }
        DataType::Utf8 => a
            .as_string::<i32>()
            .iter()
            .map(|v| v.map(|s| S::Str(s.to_string())))
            .collect(),
        DataType::LargeUtf8 => a
            .as_string::<i64>()
            .iter()
            .map(|v| v.map(|s| S::Str(s.to_string())))
            .collect(),
        DataType::Utf8View => a
            .as_string_view()
            .iter()
            .map(|v| v.map(|s| S::Str(s.to_string())))
            .collect(),
        DataType::Boolean => a.as_boolean().iter().map(|v| v.map(S::B)).collect(),
        DataType::Dictionary(_, v) => to_scalars(&arrow_cast::cast(a, v).unwrap()),
        other => panic!("to_scalars: unexpected type {other}"),
    }
}

// ------------------------------------------------------------------------------------------------
// Random input
// ------------------------------------------------------------------------------------------------

const MAX_GROUPS: usize = 24;

fn gen_vals(pool: &[S], n: usize, null_rate: f64, rng: &mut StdRng) -> Vec<Option<S>> {
    (0..n)
        .map(|_| {
            if rng.random_bool(null_rate) {
                None
            } else {
                Some(pool[rng.random_range(0..pool.len())].clone())
            }
        })
        .collect()
}

/// Mostly some NULLs, sometimes none, sometimes all.
fn null_rate(rng: &mut StdRng) -> f64 {
    match rng.random_range(0..10) {
        0..=2 => 0.0,
        3..=8 => 0.25,
        _ => 1.0,
    }
}

/// Empty batches included.
fn batch_len(rng: &mut StdRng) -> usize {
    if rng.random_bool(0.1) {
        0
    } else {
        rng.random_range(1..=120)
    }
}

/// No filter, an all-false/all-true filter, or a random one.
fn gen_filter(n: usize, rng: &mut StdRng) -> Option<Vec<bool>> {
    match rng.random_range(0..5) {
        0 | 1 => None,
        2 => {
            let b = rng.random_bool(0.5);
            Some(vec![b; n])
        }
        _ => Some((0..n).map(|_| rng.random_bool(0.6)).collect()),
    }
}

fn selected(filter: Option<&Vec<bool>>, i: usize) -> bool {
    filter.is_none_or(|f| f[i])
}

/// One batch of rows for a plain accumulator.
#[derive(Clone, Debug)]
struct Batch {
    groups: Vec<u32>,
    vals: Vec<Option<S>>,
    filter: Option<Vec<bool>>,
}

impl Batch {
    fn random(pool: &[S], total: usize, rng: &mut StdRng) -> Self {
        let n = if total == 0 { 0 } else { batch_len(rng) };
        let rate = null_rate(rng);
        Batch {
            groups: (0..n).map(|_| rng.random_range(0..total) as u32).collect(),
            vals: gen_vals(pool, n, rate, rng),
            filter: gen_filter(n, rng),
        }
    }

    /// A batch of `rows`, in random order, plus a few unselected decoy rows.
    fn of_rows(rows: Vec<(u32, Option<S>)>, pool: &[S], total: usize, rng: &mut StdRng) -> Self {
        let mut items: Vec<(u32, Option<S>, bool)> =
            rows.into_iter().map(|(g, v)| (g, v, true)).collect();
        if total > 0 {
            for _ in 0..rng.random_range(0..4) {
                let v = gen_vals(pool, 1, 0.3, rng).remove(0);
                items.push((rng.random_range(0..total) as u32, v, false));
            }
        }
        items.shuffle(rng);
        let with_filter = items.iter().any(|r| !r.2) || rng.random_bool(0.3);
        Batch {
            groups: items.iter().map(|r| r.0).collect(),
            vals: items.iter().map(|r| r.1.clone()).collect(),
            filter: with_filter.then(|| items.iter().map(|r| r.2).collect()),
        }
    }

    fn selected_rows(&self) -> Vec<(u32, Option<S>)> {
        (0..self.groups.len())
            .filter(|&i| selected(self.filter.as_ref(), i))
            .map(|i| (self.groups[i], self.vals[i].clone()))
            .collect()
    }

    /// Fresh (differently sliced) arrays for the batch.
    fn arrays(&self, ty: Ty, rng: &mut StdRng) -> (ArrayRef, Option<BooleanBuffer>) {
        let arr = build_sliced(ty, &self.vals, rng);
        let filter = self.filter.as_ref().map(|f| sliced_filter(f, rng));
        (arr, filter)
    }
}

/// Removes each element with probability `p` and returns the removed ones.
fn take_random<T>(v: &mut Vec<T>, p: f64, rng: &mut StdRng) -> Vec<T> {
    let mut taken = vec![];
    let mut kept = vec![];
    for x in v.drain(..) {
        if rng.random_bool(p) {
            taken.push(x);
        } else {
            kept.push(x);
        }
    }
    *v = kept;
    taken
}

/// A few random group ids below `total`, duplicates allowed.
fn random_ids(total: usize, rng: &mut StdRng) -> Vec<u32> {
    if total == 0 {
        return vec![];
    }
    (0..rng.random_range(0..=2 * total))
        .map(|_| rng.random_range(0..total) as u32)
        .collect()
}

// ------------------------------------------------------------------------------------------------
// The naive model
// ------------------------------------------------------------------------------------------------

/// A group's rows: how many were selected, and the multiset of their non-NULL values.
#[derive(Clone, Debug, Default)]
struct Bag {
    rows: i64,
    vals: BTreeMap<S, i64>,
}

impl Bag {
    fn add(&mut self, v: &Option<S>, delta: i64) {
        self.rows += delta;
        if let Some(v) = v {
            let c = self.vals.entry(v.clone()).or_insert(0);
            *c += delta;
            if *c == 0 {
                self.vals.remove(v);
            }
        }
    }
}

/// `v` wrapped into a `bits`-wide (two's complement when `signed`) integer.
fn wrap_int(v: i128, bits: u32, signed: bool) -> i128 {
    let m = 1i128 << bits;
    let r = v.rem_euclid(m);
    if signed && r >= m / 2 { r - m } else { r }
}

/// The exact sum of a bag of decimals.
fn exact_sum(bag: &Bag) -> i256 {
    bag.vals
        .iter()
        .map(|(v, c)| i256::from_i128(v.int()) * i256::from_i128(i128::from(*c)))
        .fold(i256::ZERO, |a, b| a + b)
}

/// Whether an unscaled decimal fits 38 digits.
fn fits_decimal38(v: i256) -> bool {
    let max = i256::from_i128(10i128.pow(38) - 1);
    v <= max && v >= -max
}

/// `n / d` rounded half away from zero (Java's HALF_UP), over 256 bits.
fn div_round_half_away_256(n: i256, d: i256) -> i256 {
    let (q, r) = (n / d, n % d);
    if r.wrapping_abs() * i256::from_i128(2) >= d.wrapping_abs() {
        q + if n.is_negative() == d.is_negative() {
            i256::ONE
        } else {
            i256::MINUS_ONE
        }
    } else {
        q
    }
}

/// The expected result of `kind` over a group's bag, row at a time.
fn naive(kind: AggregateKind, ty: Ty, bag: &Bag) -> Option<S> {
    let n: i64 = bag.vals.values().sum();
    let positive = || bag.vals.iter().filter(|(_, c)| **c > 0).map(|(v, _)| v);
    match kind {
        CountStar => Some(S::I(bag.rows.into())),
        Count => Some(S::I(n.into())),
        Sum | Sum0 => {
            if n == 0 {
                return (kind == Sum0).then(|| if ty.is_float() { S::F(0.0) } else { S::I(0) });
            }
            Some(match ty {
                Ty::F32 => S::F(f64::from(
                    bag.vals
                        .iter()
                        .map(|(v, c)| v.float() * *c as f64)
                        .sum::<f64>() as f32,
                )),
                Ty::F64 => S::F(bag.vals.iter().map(|(v, c)| v.float() * *c as f64).sum()),
                Ty::Dec(..) => {
                    // DECIMAL(38, s): NULL when the exact sum does not fit 38 digits.
                    let s = exact_sum(bag);
                    return fits_decimal38(s).then(|| S::I(s.as_i128()));
                }
                _ => {
                    let (bits, signed) = ty.int_width().unwrap();
                    let s: i128 = bag.vals.iter().map(|(v, c)| v.int() * i128::from(*c)).sum();
                    S::I(wrap_int(s, bits, signed))
                }
            })
        }
        Avg => {
            if n == 0 {
                return None;
            }
            Some(match ty {
                Ty::F32 | Ty::F64 => {
                    let s: f64 = bag.vals.iter().map(|(v, c)| v.float() * *c as f64).sum();
                    let mean = s / n as f64;
                    S::F(if ty == Ty::F32 {
                        f64::from(mean as f32)
                    } else {
                        mean
                    })
                }
                Ty::Dec(_, scale) => {
                    // NULL when the sum or the mean does not fit 38 digits.
                    let s = exact_sum(bag);
                    if !fits_decimal38(s) {
                        return None;
                    }
                    let out_scale = scale.max(6);
                    let factor = i256::from_i128(10i128.pow((out_scale - scale) as u32));
                    let mean = div_round_half_away_256(s * factor, i256::from_i128(n.into()));
                    return fits_decimal38(mean).then(|| S::I(mean.as_i128()));
                }
                _ => {
                    let (bits, signed) = ty.int_width().unwrap();
                    // Each value as a (wrapping) i64, summed with wrapping.
                    let s: i128 = bag
                        .vals
                        .iter()
                        .map(|(v, c)| i128::from(v.int() as i64) * i128::from(*c))
                        .sum();
                    let s = wrap_int(s, 64, true) as i64;
                    S::I(wrap_int(s.wrapping_div(n).into(), bits, signed))
                }
            })
        }
        Min => positive().next().cloned(),
        Max => positive().next_back().cloned(),
    }
}

fn supports(kind: AggregateKind, ty: Ty) -> bool {
    match kind {
        CountStar | Count | Min | Max => true,
        Sum | Sum0 | Avg => ty.is_numeric(),
    }
}

fn is_arith(kind: AggregateKind) -> bool {
    matches!(kind, Sum | Sum0 | Avg)
}

/// Every (type, kind, retractable) the accumulator tests run.
fn combos() -> Vec<(Ty, AggregateKind, bool)> {
    let mut out = vec![];
    for &ty in ALL_TYPES {
        for kind in [CountStar, Count, Sum, Sum0, Avg, Min, Max] {
            if !supports(kind, ty) {
                continue;
            }
            out.push((ty, kind, false));
            if matches!(kind, Min | Max) {
                out.push((ty, kind, true));
            }
        }
    }
    out
}

fn make_acc(kind: AggregateKind, ty: Ty, retractable: bool) -> Box<dyn GroupsAccumulator> {
    let dt = ty.dt();
    let arg = (kind != CountStar || ty == Ty::I8).then_some(&dt);
    let acc = new_accumulator(kind, arg, retractable).unwrap();
    assert_eq!(acc.result_type(), result_type(kind, Some(&dt)).unwrap());
    acc
}

fn can_retract(kind: AggregateKind, retractable: bool) -> bool {
    retractable || !matches!(kind, Min | Max)
}

/// Evaluates every group below `total` and a random id list, and compares with the model.
fn check_eval(
    acc: &dyn GroupsAccumulator,
    model: &[Bag],
    kind: AggregateKind,
    ty: Ty,
    total: usize,
    rng: &mut StdRng,
    ctx: &str,
) {
    let want_type = result_type(kind, Some(&ty.dt())).unwrap();
    let all: Vec<u32> = (0..total as u32).collect();
    for ids in [all, random_ids(total, rng), vec![]] {
        let got = acc.evaluate(&ids).unwrap();
        assert_eq!(got.data_type(), &want_type, "{ctx}: result type");
        let want: Vec<Option<S>> = ids
            .iter()
            .map(|&g| naive(kind, ty, &model[g as usize]))
            .collect();
        assert_eq!(to_scalars(&got), want, "{ctx}: evaluate({ids:?})");
    }
}

fn combo_seed(base: u64, i: usize) -> u64 {
    base ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

// ------------------------------------------------------------------------------------------------
// Hashing
// ------------------------------------------------------------------------------------------------

/// Key layouts tested, single and multi-column.
fn key_layouts() -> Vec<Vec<Ty>> {
    let mut out: Vec<Vec<Ty>> = ALL_TYPES.iter().map(|&t| vec![t]).collect();
    out.extend([
        vec![Ty::I64, Ty::Utf8],
        vec![Ty::Utf8, Ty::I64, Ty::Bool],
        vec![Ty::Dict, Ty::F64],
        vec![Ty::LargeUtf8, Ty::Utf8View, Ty::Date32],
        vec![Ty::Dec(10, 2), Ty::TsMs],
        vec![Ty::I8, Ty::U64, Ty::F32],
        vec![Ty::Bool, Ty::Bool],
        // Wider keys: three or four 64-bit words packed, and more than four (arrow-row).
        vec![Ty::I64, Ty::I64],
        vec![Ty::I64, Ty::U64, Ty::Utf8, Ty::Bool],
        vec![Ty::I64, Ty::F64, Ty::I64, Ty::U64, Ty::TsMs],
    ]);
    out
}

/// A batch of keys: one value vector per column, with the arrays (sliced).
fn random_keys(tys: &[Ty], rng: &mut StdRng) -> (Vec<Vec<Option<S>>>, Vec<ArrayRef>) {
    let n = batch_len(rng);
    let vals: Vec<Vec<Option<S>>> = tys
        .iter()
        .map(|t| {
            let rate = null_rate(rng);
            gen_vals(&t.pool(false), n, rate, rng)
        })
        .collect();
    let arrays = tys
        .iter()
        .zip(&vals)
        .map(|(&t, v)| build_sliced(t, v, rng))
        .collect();
    (vals, arrays)
}

fn row_key(vals: &[Vec<Option<S>>], i: usize) -> Vec<Option<S>> {
    vals.iter().map(|c| c[i].clone()).collect()
}

#[test]
fn hash_equal_keys_give_equal_hashes() {
    for (li, tys) in key_layouts().into_iter().enumerate() {
        let mut rng = StdRng::seed_from_u64(combo_seed(11, li));
        let mut seen: BTreeMap<Vec<Option<S>>, u64> = BTreeMap::new();
        let mut hashes = vec![7u64; 3];
        for b in 0..8 {
            let (vals, arrays) = random_keys(&tys, &mut rng);
            let n = arrays[0].len();
            hash_columns(&arrays, &mut hashes).unwrap();
            assert_eq!(hashes.len(), n, "{tys:?} batch {b}: one hash per row");
            for (i, &h) in hashes.iter().enumerate() {
                let key = row_key(&vals, i);
                let prev = *seen.entry(key.clone()).or_insert(h);
                assert_eq!(prev, h, "{tys:?} batch {b}: key {key:?} hashed differently");
            }
        }
        // Not a requirement, but a hash that maps many keys to one value would hide bugs.
        let distinct: BTreeSet<u64> = seen.values().copied().collect();
        assert!(
            distinct.len() * 10 >= seen.len() * 9,
            "{tys:?}: {} keys but only {} hashes",
            seen.len(),
            distinct.len()
        );
    }
}

#[test]
fn hash_dictionary_equals_plain_utf8() {
    let mut rng = StdRng::seed_from_u64(12);
    let pool = Ty::Utf8.pool(false);
    let int_pool = Ty::I64.pool(false);
    for _ in 0..30 {
        let n = batch_len(&mut rng);
        let rate = null_rate(&mut rng);
        let vals = gen_vals(&pool, n, rate, &mut rng);
        let ints = gen_vals(&int_pool, n, 0.2, &mut rng);
        let plain = build_sliced(Ty::Utf8, &vals, &mut rng);
        let dict = build_sliced(Ty::Dict, &vals, &mut rng);
        let other = build_sliced(Ty::I64, &ints, &mut rng);
        let (mut hp, mut hd) = (vec![], vec![1, 2, 3]);
        hash_columns(std::slice::from_ref(&plain), &mut hp).unwrap();
        hash_columns(std::slice::from_ref(&dict), &mut hd).unwrap();
        assert_eq!(hp.len(), n);
        assert_eq!(hp, hd, "dictionary vs plain: {vals:?}");
        hash_columns(&[other.clone(), plain.clone()], &mut hp).unwrap();
        hash_columns(&[other.clone(), dict.clone()], &mut hd).unwrap();
        assert_eq!(hp, hd, "(Int64, dictionary) vs (Int64, plain)");
        hash_columns(&[dict, other.clone()], &mut hd).unwrap();
        hash_columns(&[plain, other], &mut hp).unwrap();
        assert_eq!(hp, hd, "(dictionary, Int64) vs (plain, Int64)");
    }
}

#[test]
fn hash_columns_shape() {
    let a: ArrayRef = Arc::new(Int32Array::from(vec![1, 2, 3]));
    let b: ArrayRef = Arc::new(Int32Array::from(vec![1, 2]));
    let mut out = vec![9; 10];
    hash_columns(std::slice::from_ref(&a), &mut out).unwrap();
    assert_eq!(out.len(), 3);
    assert!(
        hash_columns(&[a.clone(), b], &mut out).is_err(),
        "columns of different lengths"
    );
    hash_columns(&[a.slice(3, 0)], &mut out).unwrap();
    assert!(out.is_empty(), "an empty batch gives no hashes");
    // Column order matters for multi-column keys: (1, 2) and (2, 1) should (almost surely) differ.
    let x: ArrayRef = Arc::new(Int32Array::from(vec![1, 2]));
    let y: ArrayRef = Arc::new(Int32Array::from(vec![2, 1]));
    hash_columns(&[x.clone(), y.clone()], &mut out).unwrap();
    assert_ne!(out[0], out[1]);
    // The first column's hashes known beforehand: the same hashes as all columns at once.
    let mut first = vec![];
    hash_columns(std::slice::from_ref(&x), &mut first).unwrap();
    let mut after = vec![];
    tally_kernels::hash::hash_columns_after(&first, std::slice::from_ref(&y), &mut after).unwrap();
    assert_eq!(after, out);
    assert!(
        tally_kernels::hash::hash_columns_after(&first, &[a], &mut after).is_err(),
        "columns of different lengths"
    );
}

// ------------------------------------------------------------------------------------------------
// Interning
// ------------------------------------------------------------------------------------------------

/// Compares a key column with the values it should hold, as arrays (dictionaries compared through
/// their values) and as scalars.
fn assert_key_column(got: &ArrayRef, ty: Ty, want: &[Option<S>], rng: &mut StdRng, ctx: &str) {
    assert_eq!(got.data_type(), &ty.dt(), "{ctx}: key type");
    assert_eq!(got.len(), want.len(), "{ctx}: key length");
    let expected = build(ty, want, rng);
    if ty == Ty::Dict {
        let got = arrow_cast::cast(got, &DataType::Utf8).unwrap();
        let expected = arrow_cast::cast(&expected, &DataType::Utf8).unwrap();
        assert_eq!(&got, &expected, "{ctx}: keys as arrays");
    } else {
        assert_eq!(got, &expected, "{ctx}: keys as arrays");
    }
    assert_eq!(to_scalars(got), want, "{ctx}: keys as values");
}

fn check_interning(tys: &[Ty], seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let dts: Vec<DataType> = tys.iter().map(|t| t.dt()).collect();
    let mut table = new_group_values(&dts).unwrap();
    assert!(table.is_empty());
    let mut ids: BTreeMap<Vec<Option<S>>, u32> = BTreeMap::new();
    let mut by_id: Vec<Vec<Option<S>>> = vec![];
    let (mut hashes, mut groups) = (vec![], vec![5u32; 4]);
    let mut last_size = table.size();
    for b in 0..10 {
        let ctx = format!("keys {tys:?} seed {seed} batch {b}");
        if b == 5 {
            // `clear` forgets every group but keeps the allocations: ids restart at 0.
            table.clear();
            ids.clear();
            by_id.clear();
            assert!(table.is_empty(), "{ctx}: cleared");
        }
        let (vals, arrays) = random_keys(tys, &mut rng);
        let n = arrays[0].len();
        hash_columns(&arrays, &mut hashes).unwrap();
        // A table that hashes its keys itself is given no row hashes every other batch: its
        // groups and their hashes are the same.
        let given: &[u64] = if table.hashes_keys_itself() && b % 2 == 1 {
            &[]
        } else {
            &hashes
        };
        table.intern(&arrays, given, &mut groups).unwrap();
        assert_eq!(groups.len(), n, "{ctx}: one id per row");
        assert_eq!(
            table.hashes().len(),
            table.len(),
            "{ctx}: one hash per group"
        );
        for (i, &g) in groups.iter().enumerate() {
            assert_eq!(
                table.hashes()[g as usize],
                hashes[i],
                "{ctx}: row {i}'s group hash"
            );
        }
        for (i, &g) in groups.iter().enumerate() {
            let key = row_key(&vals, i);
            let want = *ids.entry(key.clone()).or_insert_with(|| {
                by_id.push(key.clone());
                (by_id.len() - 1) as u32
            });
            assert_eq!(g, want, "{ctx}: row {i} key {key:?}");
        }
        assert_eq!(table.len(), by_id.len(), "{ctx}: len");
        assert_eq!(table.is_empty(), by_id.is_empty(), "{ctx}: is_empty");
        let size = table.size();
        assert!(
            size >= last_size,
            "{ctx}: size shrank from {last_size} to {size}"
        );
        assert!(by_id.is_empty() || size > 0, "{ctx}: size 0 with groups");
        last_size = size;

        // Round trip: every id, shuffled, plus a random list with duplicates.
        let mut all: Vec<u32> = (0..by_id.len() as u32).collect();
        all.shuffle(&mut rng);
        for list in [all, random_ids(by_id.len(), &mut rng)] {
            let keys = table.keys(&list).unwrap();
            assert_eq!(keys.len(), tys.len(), "{ctx}: key column count");
            for (c, (&ty, col)) in tys.iter().zip(&keys).enumerate() {
                let want: Vec<Option<S>> =
                    list.iter().map(|&g| by_id[g as usize][c].clone()).collect();
                assert_key_column(col, ty, &want, &mut rng, &format!("{ctx} column {c}"));
            }
        }
        assert!(
            table.keys(&[by_id.len() as u32]).is_err(),
            "{ctx}: keys of an id out of range"
        );
    }
}

#[test]
fn interning_single_column_round_trips() {
    for (i, &ty) in ALL_TYPES.iter().enumerate() {
        check_interning(&[ty], combo_seed(21, i));
        check_interning(&[ty], combo_seed(22, i));
    }
}

#[test]
fn interning_multi_column_round_trips() {
    for (i, tys) in key_layouts()
        .into_iter()
        .enumerate()
        .filter(|(_, t)| t.len() > 1)
    {
        check_interning(&tys, combo_seed(23, i));
        check_interning(&tys, combo_seed(24, i));
    }
}

#[test]
fn interning_special_floats_by_bit_pattern() {
    // -0.0 and 0.0 are different keys, NaN equals itself; NULL is a key of its own.
    for ty in [Ty::F32, Ty::F64] {
        for multi in [false, true] {
            let mut rng = StdRng::seed_from_u64(25);
            let vals: Vec<Option<S>> = [
                Some(-0.0),
                Some(0.0),
                Some(f64::NAN),
                None,
                Some(0.0),
                Some(f64::NAN),
                Some(-0.0),
                None,
            ]
            .into_iter()
            .map(|v| v.map(S::F))
            .collect();
            let mut cols = vec![build_sliced(ty, &vals, &mut rng)];
            let mut types = vec![ty.dt()];
            if multi {
                cols.push(Arc::new(BooleanArray::from(vec![true; 8])));
                types.push(DataType::Boolean);
            }
            let mut table = new_group_values(&types).unwrap();
            let (mut h, mut g) = (vec![], vec![]);
            hash_columns(&cols, &mut h).unwrap();
            table.intern(&cols, &h, &mut g).unwrap();
            assert_eq!(g, vec![0, 1, 2, 3, 1, 2, 0, 3], "{ty:?} multi {multi}");
            let keys = table.keys(&[0, 1, 2, 3]).unwrap();
            assert_key_column(
                &keys[0],
                ty,
                &vals[..4],
                &mut rng,
                &format!("{ty:?} multi {multi}"),
            );
        }
    }
}

#[test]
fn interning_without_keys_is_one_group() {
    let mut table = new_group_values(&[]).unwrap();
    let mut groups = vec![3];
    table.intern(&[], &[], &mut groups).unwrap();
    assert!(groups.is_empty());
    assert_eq!(table.len(), 0, "an empty batch creates no group");
    table.intern(&[], &[1, 2, 3], &mut groups).unwrap();
    assert_eq!(groups, vec![0, 0, 0]);
    assert_eq!(table.len(), 1);
    assert!(table.keys(&[0, 0]).unwrap().is_empty());
    assert!(table.keys(&[1]).is_err());
}

// ------------------------------------------------------------------------------------------------
// Accumulators: update / retract / filter / reset against the model
// ------------------------------------------------------------------------------------------------

#[test]
fn for_each_selected_visits_valid_selected_rows() {
    let mut rng = StdRng::seed_from_u64(71);
    for round in 0..300 {
        let n = batch_len(&mut rng);
        let groups: Vec<u32> = (0..n).map(|_| rng.random_range(0..50)).collect();
        let rate = null_rate(&mut rng);
        let valid: Vec<bool> = (0..n).map(|_| !rng.random_bool(rate)).collect();
        let nulls = rng
            .random_bool(0.8)
            .then(|| NullBuffer::new(sliced_filter(&valid, &mut rng)));
        let filter = gen_filter(n, &mut rng);
        let filter_buf = filter.as_ref().map(|f| sliced_filter(f, &mut rng));
        let mut seen = vec![];
        for_each_selected(&groups, nulls.as_ref(), filter_buf.as_ref(), |i, g| {
            seen.push((i, g))
        });
        let want: Vec<(usize, u32)> = (0..n)
            .filter(|&i| (nulls.is_none() || valid[i]) && selected(filter.as_ref(), i))
            .map(|i| (i, groups[i]))
            .collect();
        assert_eq!(seen, want, "round {round}");
        assert_eq!(
            count_selected(n, nulls.as_ref(), filter_buf.as_ref()),
            want.len(),
            "round {round}"
        );
    }
}

#[test]
fn result_types_follow_the_spec() {
    let dec = DataType::Decimal128(10, 2);
    let dict = Ty::Dict.dt();
    let cases: Vec<(AggregateKind, Option<DataType>, DataType)> = vec![
        (CountStar, None, DataType::Int64),
        (Count, Some(DataType::Utf8), DataType::Int64),
        (Sum, Some(DataType::Int8), DataType::Int8),
        (Sum0, Some(DataType::UInt32), DataType::UInt32),
        (Sum, Some(DataType::Float32), DataType::Float32),
        (Sum, Some(dec.clone()), DataType::Decimal128(38, 2)),
        (
            Sum0,
            Some(DataType::Decimal128(5, 0)),
            DataType::Decimal128(38, 0),
        ),
        (Avg, Some(DataType::Int32), DataType::Int32),
        (Avg, Some(DataType::UInt64), DataType::UInt64),
        (Avg, Some(DataType::Float32), DataType::Float32),
        (Avg, Some(DataType::Float64), DataType::Float64),
        (Avg, Some(dec.clone()), DataType::Decimal128(38, 6)),
        (
            Avg,
            Some(DataType::Decimal128(20, 8)),
            DataType::Decimal128(38, 8),
        ),
        (Min, Some(dict.clone()), DataType::Utf8),
        (Max, Some(DataType::Boolean), DataType::Boolean),
        (Max, Some(DataType::LargeUtf8), DataType::LargeUtf8),
        (Min, Some(DataType::Utf8View), DataType::Utf8View),
        (Min, Some(dec.clone()), dec.clone()),
        (Max, Some(Ty::TsMs.dt()), Ty::TsMs.dt()),
    ];
    for (kind, arg, want) in cases {
        assert_eq!(
            result_type(kind, arg.as_ref()).unwrap(),
            want,
            "{kind:?}({arg:?})"
        );
        for retractable in [false, true] {
            let acc = new_accumulator(kind, arg.as_ref(), retractable).unwrap();
            assert_eq!(acc.result_type(), want, "{kind:?}({arg:?}) accumulator");
        }
    }
    for (kind, arg) in [
        (Sum, Some(DataType::Utf8)),
        (Avg, Some(DataType::Boolean)),
        (Sum0, Some(DataType::Date32)),
        (Avg, Some(dict)),
        (Sum, None),
        (Min, None),
    ] {
        assert!(
            result_type(kind, arg.as_ref()).is_err(),
            "{kind:?}({arg:?})"
        );
        assert!(
            new_accumulator(kind, arg.as_ref(), false).is_err(),
            "{kind:?}({arg:?})"
        );
    }
    assert!(DistinctAccumulator::try_new(&DataType::Int32, &[CountStar], true).is_err());
    assert!(DistinctAccumulator::try_new(&DataType::Int32, &[], true).is_err());
}

/// Random updates, retractions of earlier rows, resets and update-then-retract round trips on one
/// accumulator, checked against the model after every step.
fn check_accumulator(ty: Ty, kind: AggregateKind, retractable: bool, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let pool = ty.pool(is_arith(kind));
    let mut acc = make_acc(kind, ty, retractable);
    let retracts = can_retract(kind, retractable);
    let mut model: Vec<Bag> = vec![];
    let mut applied: Vec<(u32, Option<S>)> = vec![];
    let mut total = 0usize;
    for step in 0..14 {
        let ctx = format!("{kind:?}({ty:?}) retractable={retractable} seed={seed} step={step}");
        let op = rng.random_range(0..10);
        match op {
            6 | 7 if retracts => {
                // Retract earlier rows; retractable MIN/MAX also take rows they never saw (their
                // multiplicities go negative and must never make a result).
                let batch = if matches!(kind, Min | Max) && rng.random_bool(0.3) {
                    Batch::random(&pool, total, &mut rng)
                } else {
                    let rows = take_random(&mut applied, 0.4, &mut rng);
                    Batch::of_rows(rows, &pool, total, &mut rng)
                };
                let (arr, filter) = batch.arrays(ty, &mut rng);
                acc.retract(&[arr], &batch.groups, filter.as_ref(), total)
                    .unwrap();
                for (g, v) in batch.selected_rows() {
                    model[g as usize].add(&v, -1);
                }
            }
            8 => {
                let reset = random_ids(total, &mut rng);
                acc.reset(&reset);
                for &g in &reset {
                    model[g as usize] = Bag::default();
                }
                applied.retain(|(g, _)| !reset.contains(g));
            }
            9 if retracts => {
                // An update and a retraction of the same rows restore the earlier results.
                let all: Vec<u32> = (0..total as u32).collect();
                let before = acc.evaluate(&all).unwrap();
                let batch = Batch::random(&pool, total, &mut rng);
                let (arr, filter) = batch.arrays(ty, &mut rng);
                acc.update(&[arr], &batch.groups, filter.as_ref(), total)
                    .unwrap();
                let (arr, filter) = batch.arrays(ty, &mut rng);
                acc.retract(&[arr], &batch.groups, filter.as_ref(), total)
                    .unwrap();
                let after = acc.evaluate(&all).unwrap();
                assert_eq!(
                    to_scalars(&after),
                    to_scalars(&before),
                    "{ctx}: update+retract"
                );
            }
            _ => {
                if rng.random_bool(0.5) || total == 0 {
                    total = total.max(rng.random_range(1..=MAX_GROUPS));
                    model.resize(total, Bag::default());
                }
                let batch = Batch::random(&pool, total, &mut rng);
                let (arr, filter) = batch.arrays(ty, &mut rng);
                acc.update(&[arr], &batch.groups, filter.as_ref(), total)
                    .unwrap();
                for (g, v) in batch.selected_rows() {
                    model[g as usize].add(&v, 1);
                    applied.push((g, v));
                }
            }
        }
        check_eval(acc.as_ref(), &model, kind, ty, total, &mut rng, &ctx);
        assert!(total == 0 || acc.size() > 0, "{ctx}: size 0 with state");
    }
    if !retracts {
        let arr = build(ty, &[pool.first().cloned()], &mut rng);
        assert!(
            acc.retract(&[arr], &[0], None, total.max(1)).is_err(),
            "{kind:?}({ty:?}): insert-only MIN/MAX must refuse to retract"
        );
    }
}

#[test]
fn accumulators_match_naive_model() {
    for (i, (ty, kind, retractable)) in combos().into_iter().enumerate() {
        check_accumulator(ty, kind, retractable, combo_seed(31, i));
        check_accumulator(ty, kind, retractable, combo_seed(32, i));
        check_accumulator(ty, kind, retractable, combo_seed(33, i));
    }
}

#[test]
fn all_null_and_empty_batches() {
    for (i, (ty, kind, retractable)) in combos().into_iter().enumerate() {
        let mut rng = StdRng::seed_from_u64(combo_seed(34, i));
        let ctx = format!("{kind:?}({ty:?}) retractable={retractable}");
        let mut acc = make_acc(kind, ty, retractable);
        let empty = build_sliced(ty, &[], &mut rng);
        acc.update(std::slice::from_ref(&empty), &[], None, 0)
            .unwrap();
        acc.update(&[empty], &[], Some(&BooleanBuffer::new_set(0)), 2)
            .unwrap();
        let nulls = vec![None; 5];
        let arr = build_sliced(ty, &nulls, &mut rng);
        acc.update(std::slice::from_ref(&arr), &[0, 1, 0, 1, 2], None, 4)
            .unwrap();
        let filter = sliced_filter(&[true, false, true, true, false], &mut rng);
        acc.update(&[arr], &[3, 3, 3, 0, 3], Some(&filter), 4)
            .unwrap();
        let got = to_scalars(&acc.evaluate(&[0, 1, 2, 3]).unwrap());
        let want: Vec<Option<S>> = match kind {
            CountStar => [3, 2, 1, 2].map(|c| Some(S::I(c))).to_vec(),
            Count => vec![Some(S::I(0)); 4],
            Sum0 if ty.is_float() => vec![Some(S::F(0.0)); 4],
            Sum0 => vec![Some(S::I(0)); 4],
            _ => vec![None; 4],
        };
        assert_eq!(got, want, "{ctx}: all-NULL input");
        // The same through a merge of the state.
        let mut other = make_acc(kind, ty, retractable);
        let state = acc.state(&[2, 0, 1, 3, 3]).unwrap();
        let state: Vec<ArrayRef> = state.iter().map(|a| a.slice(1, 3)).collect();
        other.merge(&state, &[4, 5, 4], 6).unwrap();
        let got = to_scalars(&other.evaluate(&[4, 5, 0]).unwrap());
        let want: Vec<Option<S>> = match kind {
            CountStar => [5, 2, 0].map(|c| Some(S::I(c))).to_vec(),
            _ => want[..3].to_vec(),
        };
        assert_eq!(got, want, "{ctx}: merged all-NULL state");
    }
}

// ------------------------------------------------------------------------------------------------
// Merge
// ------------------------------------------------------------------------------------------------

/// A partial accumulator's own group ids: every global group has one or two local ids (so a merge
/// may fold several partial groups into one target group), in shuffled order.
struct LocalIds {
    of_global: Vec<Vec<u32>>,
    global: Vec<u32>,
}

impl LocalIds {
    fn new(total: usize, rng: &mut StdRng) -> Self {
        let mut global: Vec<u32> = (0..total as u32).collect();
        global.extend((0..total as u32).filter(|_| rng.random_bool(0.3)));
        global.shuffle(rng);
        let mut of_global = vec![vec![]; total];
        for (l, &g) in global.iter().enumerate() {
            of_global[g as usize].push(l as u32);
        }
        LocalIds { of_global, global }
    }

    fn len(&self) -> usize {
        self.global.len()
    }

    /// A local id of each global group in `groups`.
    fn map(&self, groups: &[u32], rng: &mut StdRng) -> Vec<u32> {
        groups
            .iter()
            .map(|&g| {
                let ls = &self.of_global[g as usize];
                ls[rng.random_range(0..ls.len())]
            })
            .collect()
    }

    /// Every local id (shuffled), with random ids before and after it: the ids to take the state
    /// of, where the state is then sliced to `range`; and the target group of each sliced row.
    fn merge_plan(&self, rng: &mut StdRng) -> (Vec<u32>, std::ops::Range<usize>, Vec<u32>) {
        let mut ids: Vec<u32> = (0..self.len() as u32).collect();
        ids.shuffle(rng);
        let mut padded = random_ids(self.len(), rng);
        let start = padded.len();
        padded.extend(&ids);
        padded.extend(random_ids(self.len(), rng));
        let map = ids.iter().map(|&l| self.global[l as usize]).collect();
        (padded, start..start + ids.len(), map)
    }
}

/// Rows spread over a target accumulator and one or two partial ones (with their own group ids);
/// merging the partials' states into the target must equal one accumulator that saw all rows.
fn check_merge(ty: Ty, kind: AggregateKind, retractable: bool, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let pool = ty.pool(is_arith(kind));
    let total = rng.random_range(1..=MAX_GROUPS);
    let retracts = can_retract(kind, retractable);
    let mut whole = make_acc(kind, ty, retractable);
    let mut target = make_acc(kind, ty, retractable);
    let mut parts: Vec<(Box<dyn GroupsAccumulator>, LocalIds)> = (0..rng.random_range(1..=2))
        .map(|_| {
            (
                make_acc(kind, ty, retractable),
                LocalIds::new(total, &mut rng),
            )
        })
        .collect();
    let mut model = vec![Bag::default(); total];
    let mut applied: Vec<(u32, Option<S>)> = vec![];
    let ctx = format!("merge {kind:?}({ty:?}) retractable={retractable} seed={seed}");

    for _ in 0..8 {
        let op = rng.random_range(0..10);
        if op == 9 {
            let g = rng.random_range(0..total) as u32;
            whole.reset(&[g]);
            target.reset(&[g]);
            for (p, local) in &mut parts {
                p.reset(&local.of_global[g as usize]);
            }
            model[g as usize] = Bag::default();
            applied.retain(|r| r.0 != g);
            continue;
        }
        let retract = retracts && op >= 6 && !applied.is_empty();
        let batch = if retract {
            let rows = take_random(&mut applied, 0.4, &mut rng);
            Batch::of_rows(rows, &pool, total, &mut rng)
        } else {
            Batch::random(&pool, total, &mut rng)
        };
        let dest = rng.random_range(0..=parts.len());
        let (arr, filter) = batch.arrays(ty, &mut rng);
        let (arr2, filter2) = batch.arrays(ty, &mut rng);
        let (acc, groups, acc_total) = if dest == 0 {
            (&mut target, batch.groups.clone(), total)
        } else {
            let (p, local) = &mut parts[dest - 1];
            (p, local.map(&batch.groups, &mut rng), local.len())
        };
        if retract {
            whole
                .retract(&[arr], &batch.groups, filter.as_ref(), total)
                .unwrap();
            acc.retract(&[arr2], &groups, filter2.as_ref(), acc_total)
                .unwrap();
        } else {
            whole
                .update(&[arr], &batch.groups, filter.as_ref(), total)
                .unwrap();
            acc.update(&[arr2], &groups, filter2.as_ref(), acc_total)
                .unwrap();
        }
        for (g, v) in batch.selected_rows() {
            model[g as usize].add(&v, if retract { -1 } else { 1 });
            if !retract {
                applied.push((g, v));
            }
        }
    }

    for (p, local) in &parts {
        let (padded, range, map) = local.merge_plan(&mut rng);
        let state = p.state(&padded).unwrap();
        let types = p.state_types();
        assert_eq!(state.len(), types.len(), "{ctx}: state columns");
        for (col, t) in state.iter().zip(&types) {
            assert_eq!(col.data_type(), t, "{ctx}: state type");
            assert_eq!(col.len(), padded.len(), "{ctx}: state length");
        }
        let state: Vec<ArrayRef> = state
            .iter()
            .map(|a| a.slice(range.start, range.len()))
            .collect();
        target.merge(&state, &map, total).unwrap();
    }
    let all: Vec<u32> = (0..total as u32).collect();
    assert_eq!(
        to_scalars(&target.evaluate(&all).unwrap()),
        to_scalars(&whole.evaluate(&all).unwrap()),
        "{ctx}: merged vs whole"
    );
    check_eval(target.as_ref(), &model, kind, ty, total, &mut rng, &ctx);

    // The merged state keeps working: more rows, and retractions of earlier ones.
    for _ in 0..3 {
        let retract = retracts && rng.random_bool(0.5) && !applied.is_empty();
        let batch = if retract {
            let rows = take_random(&mut applied, 0.5, &mut rng);
            Batch::of_rows(rows, &pool, total, &mut rng)
        } else {
            Batch::random(&pool, total, &mut rng)
        };
        for acc in [&mut target, &mut whole] {
            let (arr, filter) = batch.arrays(ty, &mut rng);
            if retract {
                acc.retract(&[arr], &batch.groups, filter.as_ref(), total)
                    .unwrap();
            } else {
                acc.update(&[arr], &batch.groups, filter.as_ref(), total)
                    .unwrap();
            }
        }
        for (g, v) in batch.selected_rows() {
            model[g as usize].add(&v, if retract { -1 } else { 1 });
            if !retract {
                applied.push((g, v));
            }
        }
        check_eval(target.as_ref(), &model, kind, ty, total, &mut rng, &ctx);
        check_eval(whole.as_ref(), &model, kind, ty, total, &mut rng, &ctx);
    }
}

#[test]
fn merge_equals_single_accumulator() {
    for (i, (ty, kind, retractable)) in combos().into_iter().enumerate() {
        check_merge(ty, kind, retractable, combo_seed(41, i));
        check_merge(ty, kind, retractable, combo_seed(42, i));
        check_merge(ty, kind, retractable, combo_seed(43, i));
    }
}

// ------------------------------------------------------------------------------------------------
// DISTINCT
// ------------------------------------------------------------------------------------------------

/// The DISTINCT setups tested: argument type, value pool kind (arithmetic or not), aggregates.
fn distinct_combos() -> Vec<(Ty, bool, Vec<AggregateKind>)> {
    vec![
        (Ty::I32, true, vec![Count, Sum, Avg, Count]),
        (Ty::I32, false, vec![Min, Max, Count]),
        (Ty::I8, true, vec![Sum, Avg, Sum0]),
        (Ty::I64, true, vec![Sum, Avg, Count]),
        (Ty::U64, true, vec![Sum, Avg]),
        (Ty::F64, true, vec![Count, Sum, Avg]),
        (Ty::F32, true, vec![Avg, Sum0]),
        (Ty::F64, false, vec![Count, Min, Max]),
        (Ty::Dec(10, 2), true, vec![Sum, Avg, Count]),
        (Ty::Dec(18, 7), true, vec![Avg, Sum0]),
        (Ty::Utf8, false, vec![Count, Min, Max]),
        (Ty::Dict, false, vec![Count, Max, Min, Count]),
        (Ty::LargeUtf8, false, vec![Count, Min]),
        (Ty::Utf8View, false, vec![Max, Count]),
        (Ty::Bool, false, vec![Count, Max, Min]),
        (Ty::Date32, false, vec![Count, Min, Max]),
        // One aggregate: insert-only pairs are bare.
        (Ty::I64, true, vec![Count]),
        (Ty::F64, true, vec![Sum]),
        (Ty::Utf8, false, vec![Count]),
    ]
}

/// Per group: value → one counter per aggregate.
type DModel = Vec<BTreeMap<S, Vec<i64>>>;

/// A batch of rows for a DISTINCT accumulator: one filter per aggregate.
#[derive(Clone, Debug)]
struct DBatch {
    groups: Vec<u32>,
    vals: Vec<Option<S>>,
    filters: Vec<Option<Vec<bool>>>,
}

/// A row as the model keeps it: group, value, and which aggregates selected it.
type DRow = (u32, Option<S>, Vec<bool>);

impl DBatch {
    fn random(pool: &[S], k: usize, total: usize, rng: &mut StdRng) -> Self {
        let b = Batch::random(pool, total, rng);
        let n = b.groups.len();
        DBatch {
            groups: b.groups,
            vals: b.vals,
            filters: (0..k).map(|_| gen_filter(n, rng)).collect(),
        }
    }

    /// `rows` with their selections (or fresh random selections with `fresh`), plus decoy rows no
    /// aggregate selects.
    fn of_rows(
        rows: Vec<DRow>,
        pool: &[S],
        k: usize,
        total: usize,
        fresh: bool,
        rng: &mut StdRng,
    ) -> Self {
        let mut items = rows;
        if fresh {
            for r in &mut items {
                r.2 = (0..k).map(|_| rng.random_bool(0.5)).collect();
            }
        }
        let decoys = if total > 0 { rng.random_range(0..3) } else { 0 };
        for _ in 0..decoys {
            let v = gen_vals(pool, 1, 0.3, rng).remove(0);
            items.push((rng.random_range(0..total) as u32, v, vec![false; k]));
        }
        items.shuffle(rng);
        let filters = (0..k)
            .map(|i| {
                let bits: Vec<bool> = items.iter().map(|r| r.2[i]).collect();
                let all = bits.iter().all(|&b| b);
                (!all || rng.random_bool(0.5)).then_some(bits)
            })
            .collect();
        DBatch {
            groups: items.iter().map(|r| r.0).collect(),
            vals: items.iter().map(|r| r.1.clone()).collect(),
            filters,
        }
    }

    fn rows(&self) -> Vec<DRow> {
        (0..self.groups.len())
            .map(|r| {
                let sel = self
                    .filters
                    .iter()
                    .map(|f| selected(f.as_ref(), r))
                    .collect();
                (self.groups[r], self.vals[r].clone(), sel)
            })
            .collect()
    }

    fn apply(
        &self,
        acc: &mut DistinctAccumulator,
        groups: &[u32],
        ty: Ty,
        total: usize,
        delta: i64,
        rng: &mut StdRng,
    ) {
        let arr = build_sliced(ty, &self.vals, rng);
        let filters: Vec<Option<BooleanBuffer>> = self
            .filters
            .iter()
            .map(|f| f.as_ref().map(|f| sliced_filter(f, rng)))
            .collect();
        let refs: Vec<Option<&BooleanBuffer>> = filters.iter().map(Option::as_ref).collect();
        acc.apply(&arr, groups, &refs, total, delta).unwrap();
    }
}

fn d_model_apply(model: &mut DModel, rows: &[DRow], delta: i64) {
    for (g, v, sel) in rows {
        let Some(v) = v else { continue };
        let counters = model[*g as usize]
            .entry(v.clone())
            .or_insert_with(|| vec![0; sel.len()]);
        for (c, &s) in counters.iter_mut().zip(sel) {
            if s {
                *c += delta;
            }
        }
    }
}

fn check_distinct_eval(
    acc: &DistinctAccumulator,
    model: &DModel,
    ty: Ty,
    kinds: &[AggregateKind],
    rng: &mut StdRng,
    ctx: &str,
) {
    let total = model.len();
    let all: Vec<u32> = (0..total as u32).collect();
    for ids in [all, random_ids(total, rng)] {
        let got = acc.evaluate(&ids).unwrap();
        assert_eq!(got.len(), kinds.len(), "{ctx}: one result per aggregate");
        for (i, (arr, &kind)) in got.iter().zip(kinds).enumerate() {
            assert_eq!(
                arr.data_type(),
                &result_type(kind, Some(&ty.dt())).unwrap(),
                "{ctx}"
            );
            assert_eq!(arr.data_type(), &acc.result_type(i), "{ctx}");
            let want: Vec<Option<S>> = ids
                .iter()
                .map(|&g| {
                    let bag = Bag {
                        rows: 0,
                        vals: model[g as usize]
                            .iter()
                            .filter(|(_, c)| c[i] > 0)
                            .map(|(v, _)| (v.clone(), 1))
                            .collect(),
                    };
                    naive(kind, ty, &bag)
                })
                .collect();
            assert_eq!(
                to_scalars(arr),
                want,
                "{ctx}: aggregate {i} {kind:?} over {ids:?}"
            );
        }
    }
}

fn check_distinct(ty: Ty, arith: bool, kinds: &[AggregateKind], seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let pool = ty.pool(arith);
    let k = kinds.len();
    let retractable = rng.random_bool(0.5) || kinds.iter().any(|k| matches!(k, Min | Max));
    let mut acc = DistinctAccumulator::try_new(&ty.dt(), kinds, retractable).unwrap();
    assert_eq!(acc.num_aggregates(), k);
    let mut model: DModel = vec![];
    let mut applied: Vec<DRow> = vec![];
    let mut total = 0usize;
    for step in 0..14 {
        let ctx = format!("DISTINCT {kinds:?}({ty:?}) seed={seed} step={step}");
        let mut choice = rng.random_range(0..10);
        if !retractable && matches!(choice, 6 | 7 | 9) {
            // Insert-only: a retraction is refused and changes nothing; insert instead.
            if total > 0 {
                let batch = DBatch::random(&pool, k, total, &mut rng);
                let arr = build_sliced(ty, &batch.vals, &mut rng);
                let err = acc
                    .apply(&arr, &batch.groups, &vec![None; k], total, -1)
                    .unwrap_err();
                assert!(err.to_string().contains("cannot retract"), "{ctx}: {err}");
            }
            choice = 0;
        }
        match choice {
            6 | 7 => {
                let fresh = rng.random_bool(0.25);
                let rows = take_random(&mut applied, 0.4, &mut rng);
                let batch = DBatch::of_rows(rows, &pool, k, total, fresh, &mut rng);
                batch.apply(&mut acc, &batch.groups, ty, total, -1, &mut rng);
                d_model_apply(&mut model, &batch.rows(), -1);
            }
            8 => {
                let reset = random_ids(total, &mut rng);
                acc.reset(&reset);
                for &g in &reset {
                    model[g as usize].clear();
                }
                applied.retain(|r| !reset.contains(&r.0));
            }
            9 => {
                let before = acc
                    .evaluate(&(0..total as u32).collect::<Vec<_>>())
                    .unwrap();
                let batch = DBatch::random(&pool, k, total, &mut rng);
                batch.apply(&mut acc, &batch.groups, ty, total, 1, &mut rng);
                batch.apply(&mut acc, &batch.groups, ty, total, -1, &mut rng);
                let after = acc
                    .evaluate(&(0..total as u32).collect::<Vec<_>>())
                    .unwrap();
                for (a, b) in after.iter().zip(&before) {
                    assert_eq!(to_scalars(a), to_scalars(b), "{ctx}: accumulate+retract");
                }
            }
            _ => {
                if rng.random_bool(0.5) || total == 0 {
                    total = total.max(rng.random_range(1..=MAX_GROUPS));
                    model.resize(total, BTreeMap::new());
                }
                let batch = DBatch::random(&pool, k, total, &mut rng);
                batch.apply(&mut acc, &batch.groups, ty, total, 1, &mut rng);
                let rows = batch.rows();
                d_model_apply(&mut model, &rows, 1);
                applied.extend(rows);
            }
        }
        check_distinct_eval(&acc, &model, ty, kinds, &mut rng, &ctx);
        assert!(acc.size() > 0, "{ctx}: size");
    }
}

#[test]
fn distinct_matches_naive_model() {
    for (i, (ty, arith, kinds)) in distinct_combos().into_iter().enumerate() {
        check_distinct(ty, arith, &kinds, combo_seed(51, i));
        check_distinct(ty, arith, &kinds, combo_seed(52, i));
        check_distinct(ty, arith, &kinds, combo_seed(53, i));
    }
}

fn check_distinct_merge(ty: Ty, arith: bool, kinds: &[AggregateKind], seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let pool = ty.pool(arith);
    let k = kinds.len();
    let total = rng.random_range(1..=MAX_GROUPS);
    let dt = ty.dt();
    // Insert-only input half the time: pairs kept without counts, merged the same.
    let retractable = rng.random_bool(0.5);
    let mk = || DistinctAccumulator::try_new(&dt, kinds, retractable).unwrap();
    let (mut whole, mut target, mut part) = (mk(), mk(), mk());
    let local = LocalIds::new(total, &mut rng);
    let mut model: DModel = vec![BTreeMap::new(); total];
    let mut applied: Vec<DRow> = vec![];
    let ctx = format!("DISTINCT merge {kinds:?}({ty:?}) retractable={retractable} seed={seed}");
    // One random step on `whole` and on `target` or `part`: accumulate, retract earlier rows
    // (wherever they went), or reset a group everywhere.
    let step = |whole: &mut DistinctAccumulator,
                target: &mut DistinctAccumulator,
                mut part: Option<&mut DistinctAccumulator>,
                model: &mut DModel,
                applied: &mut Vec<DRow>,
                rng: &mut StdRng| {
        if rng.random_bool(0.1) {
            let g = rng.random_range(0..total) as u32;
            whole.reset(&[g]);
            target.reset(&[g]);
            if let Some(p) = part.as_mut() {
                p.reset(&local.of_global[g as usize]);
            }
            model[g as usize].clear();
            applied.retain(|r| r.0 != g);
            return;
        }
        let retract = retractable && rng.random_bool(0.35) && !applied.is_empty();
        let (batch, delta) = if retract {
            let rows = take_random(applied, 0.4, rng);
            (DBatch::of_rows(rows, &pool, k, total, false, rng), -1)
        } else {
            (DBatch::random(&pool, k, total, rng), 1)
        };
        batch.apply(whole, &batch.groups, ty, total, delta, rng);
        match part {
            Some(p) if rng.random_bool(0.5) => {
                let groups = local.map(&batch.groups, rng);
                batch.apply(p, &groups, ty, local.len(), delta, rng);
            }
            _ => batch.apply(target, &batch.groups, ty, total, delta, rng),
        }
        let rows = batch.rows();
        d_model_apply(model, &rows, delta);
        if !retract {
            applied.extend(rows);
        }
    };
    // Two rounds, as a local phase runs mini-batches: steps, then `part` merged into `target`;
    // between them `part` is cleared (forgets everything, keeps its allocations).
    for round in 0..2 {
        if round == 1 {
            part.clear(local.len());
            assert_eq!(part.entries(), 0, "{ctx}: cleared");
        }
        for _ in 0..8 {
            step(
                &mut whole,
                &mut target,
                Some(&mut part),
                &mut model,
                &mut applied,
                &mut rng,
            );
        }
        let (padded, range, map) = local.merge_plan(&mut rng);
        let state = part.state(&padded).unwrap();
        assert_eq!(state.data_type(), &part.state_type(), "{ctx}: state type");
        assert_eq!(state.len(), padded.len(), "{ctx}: state length");
        let state = state.slice(range.start, range.len());
        target.merge(&state, &map, total).unwrap();
    }
    let all: Vec<u32> = (0..total as u32).collect();
    for (a, b) in target
        .evaluate(&all)
        .unwrap()
        .iter()
        .zip(&whole.evaluate(&all).unwrap())
    {
        assert_eq!(to_scalars(a), to_scalars(b), "{ctx}: merged vs whole");
    }
    check_distinct_eval(&target, &model, ty, kinds, &mut rng, &ctx);
    for _ in 0..3 {
        step(
            &mut whole,
            &mut target,
            None,
            &mut model,
            &mut applied,
            &mut rng,
        );
        check_distinct_eval(&target, &model, ty, kinds, &mut rng, &ctx);
        check_distinct_eval(&whole, &model, ty, kinds, &mut rng, &ctx);
    }
}

#[test]
fn distinct_merge_equals_single_accumulator() {
    for (i, (ty, arith, kinds)) in distinct_combos().into_iter().enumerate() {
        check_distinct_merge(ty, arith, &kinds, combo_seed(61, i));
        check_distinct_merge(ty, arith, &kinds, combo_seed(62, i));
        check_distinct_merge(ty, arith, &kinds, combo_seed(63, i));
    }
}

#[test]
fn buckets_are_in_range_equal_for_equal_values_and_null_for_null() {
    use tally_kernels::hash::bucket_array;
    let mut rng = StdRng::seed_from_u64(91);
    for ty in [Ty::I64, Ty::Utf8, Ty::F64, Ty::Bool] {
        let pool = ty.pool(false);
        let vals = gen_vals(&pool, 500, 0.1, &mut rng);
        let arr = build(ty, &vals, &mut rng);
        for buckets in [1u32, 7, 1024] {
            let b = bucket_array(&arr, buckets).unwrap();
            assert_eq!(b.len(), vals.len());
            let mut seen: BTreeMap<S, i32> = BTreeMap::new();
            for (i, v) in vals.iter().enumerate() {
                match v {
                    None => assert!(b.is_null(i), "{ty:?}: NULL value, bucket {:?}", b.value(i)),
                    Some(v) => {
                        let x = b.value(i);
                        assert!((0..buckets as i32).contains(&x), "{ty:?}: bucket {x}");
                        assert_eq!(*seen.entry(v.clone()).or_insert(x), x, "{ty:?}: {v:?}");
                    }
                }
            }
            if buckets == 1024 && ty != Ty::Bool {
                let distinct: BTreeSet<i32> = seen.values().copied().collect();
                assert!(
                    distinct.len() > seen.len().min(1024) / 4,
                    "{ty:?}: buckets spread"
                );
            }
        }
    }
    assert!(bucket_array(&(Arc::new(Int64Array::from(vec![1])) as ArrayRef), 0).is_err());
}

/// DECIMAL SUM at the edge of 38 digits: NULL exactly when the exact sum does not fit, whatever
/// the order, the split into partial states, or retractions that bring it back into range.
#[test]
fn decimal_sum_is_null_exactly_when_it_overflows_38_digits() {
    let dt = DataType::Decimal128(38, 2);
    let half = 5 * 10i128.pow(37);
    let arr = |v: &[i128]| -> ArrayRef {
        Arc::new(
            Decimal128Array::from(v.to_vec())
                .with_precision_and_scale(38, 2)
                .unwrap(),
        )
    };
    let result = |acc: &dyn GroupsAccumulator| -> Option<i128> {
        let r = acc.evaluate(&[0]).unwrap();
        let r = r.as_primitive::<Decimal128Type>();
        r.is_valid(0).then(|| r.value(0))
    };
    let mut sum = new_accumulator(Sum, Some(&dt), false).unwrap();
    sum.update(&[arr(&[half, half - 1])], &[0, 0], None, 1)
        .unwrap();
    assert_eq!(result(sum.as_ref()), Some(10i128.pow(38) - 1));
    sum.update(&[arr(&[1])], &[0], None, 1).unwrap();
    assert_eq!(result(sum.as_ref()), None, "10^38 overflows");
    // Far past i128 and back: the state is exact.
    sum.update(&[arr(&[half; 8])], &[0; 8], None, 1).unwrap();
    assert_eq!(result(sum.as_ref()), None);
    sum.retract(&[arr(&[half; 8])], &[0; 8], None, 1).unwrap();
    sum.retract(&[arr(&[half])], &[0], None, 1).unwrap();
    assert_eq!(result(sum.as_ref()), Some(half));
    // Two partial states in range whose merge is not.
    let mut parts = vec![];
    for v in [half, half] {
        let mut p = new_accumulator(Sum, Some(&dt), false).unwrap();
        p.update(&[arr(&[v])], &[0], None, 1).unwrap();
        assert_eq!(result(p.as_ref()), Some(v));
        parts.push(p.state(&[0]).unwrap());
    }
    let mut merged = new_accumulator(Sum, Some(&dt), false).unwrap();
    for state in &parts {
        merged.merge(state, &[0], 1).unwrap();
    }
    assert_eq!(result(merged.as_ref()), None);
    // AVG: NULL with its overflowing sum, a value again once the sum fits.
    let mut avg = new_accumulator(Avg, Some(&dt), false).unwrap();
    avg.update(&[arr(&[half, half, -half])], &[0, 0, 0], None, 1)
        .unwrap();
    assert_eq!(result(avg.as_ref()), None);
    avg.retract(&[arr(&[half])], &[0], None, 1).unwrap();
    // (half - half) / 2 = 0 at scale 6.
    assert_eq!(result(avg.as_ref()), Some(0));
    // The split-distinct sum over the DECIMAL(76, s) state type is exact too.
    let wide = DataType::Decimal256(76, 2);
    assert_eq!(result_type(Sum, Some(&wide)).unwrap(), wide);
    let mut wide_sum = new_accumulator(Sum0, Some(&wide), false).unwrap();
    let values: arrow_array::Decimal256Array = [half, half, half]
        .iter()
        .map(|&v| Some(i256::from_i128(v)))
        .collect::<arrow_array::Decimal256Array>()
        .with_precision_and_scale(76, 2)
        .unwrap();
    wide_sum
        .update(&[Arc::new(values)], &[0, 0, 0], None, 1)
        .unwrap();
    let r = wide_sum.evaluate(&[0]).unwrap();
    assert_eq!(
        r.as_primitive::<Decimal256Type>().value(0),
        i256::from_i128(half) * i256::from_i128(3)
    );
}
