//! Input for the property tests: arrays built from scalars (as slices of longer ones, filters
//! likewise; dictionaries with duplicate and NULL values) and read back, random values with NULLs,
//! all-NULL and empty batches, filters, keys, and a partial accumulator's group ids.

use std::collections::BTreeSet;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::*;
use arrow_array::{
    Array, ArrayRef, BooleanArray, Date32Array, Decimal128Array, DictionaryArray, Float32Array,
    Float64Array, Int8Array, Int16Array, Int32Array, Int64Array, LargeStringArray, StringArray,
    StringViewArray, TimestampMillisecondArray, UInt8Array, UInt16Array, UInt32Array, UInt64Array,
};
use arrow_buffer::BooleanBuffer;
use arrow_schema::{DataType, TimeUnit};
use rand::Rng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;

use super::{ALL_TYPES, S, Ty};

// ------------------------------------------------------------------------------------------------
// Building arrays from scalars and reading them back
// ------------------------------------------------------------------------------------------------

/// An array of `ty` holding `vals`. Dictionaries get a random layout: duplicate values, unused
/// values, and NULLs both as NULL keys and as keys pointing at a NULL value.
pub fn build(ty: Ty, vals: &[Option<S>], rng: &mut StdRng) -> ArrayRef {
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
pub fn build_sliced(ty: Ty, vals: &[Option<S>], rng: &mut StdRng) -> ArrayRef {
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
pub fn sliced_filter(bits: &[bool], rng: &mut StdRng) -> BooleanBuffer {
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
pub fn to_scalars(a: &ArrayRef) -> Vec<Option<S>> {
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

pub const MAX_GROUPS: usize = 24;

pub fn gen_vals(pool: &[S], n: usize, null_rate: f64, rng: &mut StdRng) -> Vec<Option<S>> {
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
pub fn null_rate(rng: &mut StdRng) -> f64 {
    match rng.random_range(0..10) {
        0..=2 => 0.0,
        3..=8 => 0.25,
        _ => 1.0,
    }
}

/// Empty batches included.
pub fn batch_len(rng: &mut StdRng) -> usize {
    if rng.random_bool(0.1) {
        0
    } else {
        rng.random_range(1..=120)
    }
}

/// No filter, an all-false/all-true filter, or a random one.
pub fn gen_filter(n: usize, rng: &mut StdRng) -> Option<Vec<bool>> {
    match rng.random_range(0..5) {
        0 | 1 => None,
        2 => {
            let b = rng.random_bool(0.5);
            Some(vec![b; n])
        }
        _ => Some((0..n).map(|_| rng.random_bool(0.6)).collect()),
    }
}

pub fn selected(filter: Option<&Vec<bool>>, i: usize) -> bool {
    filter.is_none_or(|f| f[i])
}

/// One batch of rows for a plain accumulator.
#[derive(Clone, Debug)]
pub struct Batch {
    pub groups: Vec<u32>,
    pub vals: Vec<Option<S>>,
    pub filter: Option<Vec<bool>>,
}

impl Batch {
    pub fn random(pool: &[S], total: usize, rng: &mut StdRng) -> Self {
        let n = if total == 0 { 0 } else { batch_len(rng) };
        let rate = null_rate(rng);
        Batch {
            groups: (0..n).map(|_| rng.random_range(0..total) as u32).collect(),
            vals: gen_vals(pool, n, rate, rng),
            filter: gen_filter(n, rng),
        }
    }

    /// A batch of `rows`, in random order, plus a few unselected decoy rows.
    pub fn of_rows(
        rows: Vec<(u32, Option<S>)>,
        pool: &[S],
        total: usize,
        rng: &mut StdRng,
    ) -> Self {
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

    pub fn selected_rows(&self) -> Vec<(u32, Option<S>)> {
        (0..self.groups.len())
            .filter(|&i| selected(self.filter.as_ref(), i))
            .map(|i| (self.groups[i], self.vals[i].clone()))
            .collect()
    }

    /// Fresh (differently sliced) arrays for the batch.
    pub fn arrays(&self, ty: Ty, rng: &mut StdRng) -> (ArrayRef, Option<BooleanBuffer>) {
        let arr = build_sliced(ty, &self.vals, rng);
        let filter = self.filter.as_ref().map(|f| sliced_filter(f, rng));
        (arr, filter)
    }
}

/// Removes each element with probability `p` and returns the removed ones.
pub fn take_random<T>(v: &mut Vec<T>, p: f64, rng: &mut StdRng) -> Vec<T> {
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
pub fn random_ids(total: usize, rng: &mut StdRng) -> Vec<u32> {
    if total == 0 {
        return vec![];
    }
    (0..rng.random_range(0..=2 * total))
        .map(|_| rng.random_range(0..total) as u32)
        .collect()
}

pub fn combo_seed(base: u64, i: usize) -> u64 {
    base ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

// ------------------------------------------------------------------------------------------------
// Keys
// ------------------------------------------------------------------------------------------------

/// Key layouts tested, single and multi-column.
pub fn key_layouts() -> Vec<Vec<Ty>> {
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
pub fn random_keys(tys: &[Ty], rng: &mut StdRng) -> (Vec<Vec<Option<S>>>, Vec<ArrayRef>) {
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

pub fn row_key(vals: &[Vec<Option<S>>], i: usize) -> Vec<Option<S>> {
    vals.iter().map(|c| c[i].clone()).collect()
}

// ------------------------------------------------------------------------------------------------
// Partial accumulators' group ids
// ------------------------------------------------------------------------------------------------

/// A partial accumulator's own group ids: every global group has one or two local ids (so a merge
/// may fold several partial groups into one target group), in shuffled order.
pub struct LocalIds {
    pub of_global: Vec<Vec<u32>>,
    pub global: Vec<u32>,
}

impl LocalIds {
    pub fn new(total: usize, rng: &mut StdRng) -> Self {
        let mut global: Vec<u32> = (0..total as u32).collect();
        global.extend((0..total as u32).filter(|_| rng.random_bool(0.3)));
        global.shuffle(rng);
        let mut of_global = vec![vec![]; total];
        for (l, &g) in global.iter().enumerate() {
            of_global[g as usize].push(l as u32);
        }
        LocalIds { of_global, global }
    }

    pub fn len(&self) -> usize {
        self.global.len()
    }

    /// A local id of each global group in `groups`.
    pub fn map(&self, groups: &[u32], rng: &mut StdRng) -> Vec<u32> {
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
    pub fn merge_plan(&self, rng: &mut StdRng) -> (Vec<u32>, std::ops::Range<usize>, Vec<u32>) {
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
