//! Shared by the kernel property tests: every kernel is driven with seeded random input and
//! compared with a naive row-at-a-time model written here in plain Rust (`i128`, `f64`,
//! `BTreeMap`).

// Each test binary uses only some of these helpers.
#![allow(dead_code)]

use std::cmp::Ordering;
use std::collections::BTreeMap;

use arrow_buffer::i256;
use arrow_schema::{DataType, TimeUnit};
use tally_kernels::aggregates::AggregateKind;

use AggregateKind::{Avg, Count, CountStar, Max, Min, Sum, Sum0};

mod input;
pub use input::*;

// ------------------------------------------------------------------------------------------------
// Scalars and types
// ------------------------------------------------------------------------------------------------

/// One value of any tested type. Integers of every width, decimals (unscaled), dates and
/// timestamps are `I`; floats are `F` (an `f32` is stored exactly as an `f64`), ordered and
/// compared by IEEE total order, i.e. by bit pattern.
#[derive(Clone, Debug)]
pub enum S {
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
    pub fn int(&self) -> i128 {
        match self {
            S::I(v) => *v,
            other => panic!("not an integer: {other:?}"),
        }
    }
    pub fn float(&self) -> f64 {
        match self {
            S::F(v) => *v,
            other => panic!("not a float: {other:?}"),
        }
    }
    pub fn str(&self) -> &str {
        match self {
            S::Str(v) => v,
            other => panic!("not a string: {other:?}"),
        }
    }
    pub fn bool(&self) -> bool {
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
pub enum Ty {
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

pub const ALL_TYPES: &[Ty] = &[
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
    pub fn dt(self) -> DataType {
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
    pub fn int_width(self) -> Option<(u32, bool)> {
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

    pub fn is_float(self) -> bool {
        matches!(self, Ty::F32 | Ty::F64)
    }

    pub fn is_numeric(self) -> bool {
        self.int_width().is_some() || self.is_float() || matches!(self, Ty::Dec(..))
    }

    /// The values rows are drawn from (few, so that keys and values repeat). `arith`: values for
    /// SUM/AVG, where floats are small integers (exact in any order, no NaN or -0.0).
    pub fn pool(self, arith: bool) -> Vec<S> {
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
// The naive model
// ------------------------------------------------------------------------------------------------

/// A group's rows: how many were selected, and the multiset of their non-NULL values.
#[derive(Clone, Debug, Default)]
pub struct Bag {
    pub rows: i64,
    pub vals: BTreeMap<S, i64>,
}

impl Bag {
    pub fn add(&mut self, v: &Option<S>, delta: i64) {
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
pub fn naive(kind: AggregateKind, ty: Ty, bag: &Bag) -> Option<S> {
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
