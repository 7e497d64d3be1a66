//! DECIMAL SUM, $SUM0 and AVG: the [`SumKind`]s whose running sum is exact (256 bits, a
//! `DECIMAL(76, s)` state column), so that overflow of the result precision is decided on the
//! whole sum, the same under every strategy.

use arrow_array::ArrowPrimitiveType;
use arrow_array::types::{Decimal128Type, Decimal256Type};
use arrow_buffer::i256;
use arrow_schema::{DECIMAL128_MAX_PRECISION, DECIMAL256_MAX_PRECISION, DataType};

use crate::numeric::SumKind;

/// The largest unscaled value of a decimal of `precision` digits (`10^precision - 1`).
fn decimal_max(precision: u8) -> i256 {
    i256::from_i128(10)
        .checked_pow(u32::from(precision))
        .map_or(i256::MAX, |p| p.wrapping_sub(i256::ONE))
}

/// Whether `v` fits `precision` digits.
fn fits(v: i256, max: i256) -> bool {
    v <= max && v >= max.wrapping_neg()
}

/// A decimal argument type, as an exact 256-bit summand, and the result type of its SUM.
pub trait DecimalArg: ArrowPrimitiveType {
    /// The type of the SUM of this type: `DECIMAL(38, s)` for `Decimal128`, `DECIMAL(76, s)` for
    /// `Decimal256` (the split-distinct rewrite's exact partial sums).
    type Sum: ArrowPrimitiveType;
    /// The SUM's precision.
    const SUM_PRECISION: u8;
    /// A value as a summand.
    fn wide(v: Self::Native) -> i256;
    /// A sum that fits [`Self::SUM_PRECISION`] digits as a result value.
    fn narrow(v: i256) -> <Self::Sum as ArrowPrimitiveType>::Native;
}

impl DecimalArg for Decimal128Type {
    type Sum = Decimal128Type;
    const SUM_PRECISION: u8 = DECIMAL128_MAX_PRECISION;
    #[inline(always)]
    fn wide(v: i128) -> i256 {
        i256::from_i128(v)
    }
    fn narrow(v: i256) -> i128 {
        v.as_i128()
    }
}

impl DecimalArg for Decimal256Type {
    type Sum = Decimal256Type;
    const SUM_PRECISION: u8 = DECIMAL256_MAX_PRECISION;
    #[inline(always)]
    fn wide(v: i256) -> i256 {
        v
    }
    fn narrow(v: i256) -> i256 {
        v
    }
}

/// `i256` sums: exact (2^63 values of 76 digits cannot overflow 256 bits; wrapping only ever
/// applies to Decimal256 arguments near their own limit).
macro_rules! wide_sum_ops {
    () => {
        #[inline(always)]
        fn add(a: i256, b: i256) -> i256 {
            a.wrapping_add(b)
        }
        #[inline(always)]
        fn sub(a: i256, b: i256) -> i256 {
            a.wrapping_sub(b)
        }
    };
}

/// `SUM(x)` and `$SUM0(x)` over DECIMAL: an exact 256-bit sum, its state a `DECIMAL(76, s)`.
///
/// Over `DECIMAL(p, s)` the result is a `DECIMAL(38, s)`, NULL when the exact sum does not fit
/// 38 digits: Flink's DECIMAL sum yields NULL on overflow of the result precision. Because the
/// state is exact, the result is the same whatever order, grouping or retractions produced the
/// sum, so every strategy agrees; a sum that overflowed and came back into range by retractions
/// is a value again. Over a `DECIMAL256` argument (the split-distinct rewrite casts its partial
/// sums to `DECIMAL(76, s)`) the result is a `DECIMAL(76, s)`.
#[derive(Debug)]
pub struct DecimalSum<T: DecimalArg> {
    input_type: DataType,
    scale: i8,
    max: i256,
    sum0: bool,
    _t: std::marker::PhantomData<fn() -> T>,
}

impl<T: DecimalArg> DecimalSum<T> {
    /// A SUM (`$SUM0` with `sum0`) over `input_type`, a decimal of scale `scale`.
    pub fn new(input_type: DataType, scale: i8, sum0: bool) -> Self {
        Self {
            input_type,
            scale,
            max: decimal_max(T::SUM_PRECISION),
            sum0,
            _t: std::marker::PhantomData,
        }
    }
}

impl<T: DecimalArg + std::fmt::Debug> SumKind for DecimalSum<T> {
    type Arg = T;
    type Acc = Decimal256Type;
    type Out = T::Sum;
    fn arg_type(&self) -> &DataType {
        &self.input_type
    }
    fn state_type(&self) -> DataType {
        DataType::Decimal256(DECIMAL256_MAX_PRECISION, self.scale)
    }
    fn result_type(&self) -> DataType {
        match T::SUM_PRECISION {
            DECIMAL128_MAX_PRECISION => DataType::Decimal128(T::SUM_PRECISION, self.scale),
            _ => DataType::Decimal256(T::SUM_PRECISION, self.scale),
        }
    }
    #[inline(always)]
    fn summand(v: T::Native) -> i256 {
        T::wide(v)
    }
    wide_sum_ops!();
    fn result(&self, sum: i256, count: i64) -> Option<<T::Sum as ArrowPrimitiveType>::Native> {
        ((self.sum0 || count != 0) && fits(sum, self.max)).then(|| T::narrow(sum))
    }
}

/// `AVG(x)` over `DECIMAL(p, s)`: the exact sum (a `DECIMAL(76, s)` state, as
/// [`DecimalSum`]'s) and the count; the result a `DECIMAL(38, max(6, s))` rounded half away from
/// zero (Java's HALF_UP), as in Flink. Flink keeps the sum as a `DECIMAL(38, s)`, which yields
/// NULL on overflow: the result is NULL when the exact sum does not fit 38 digits (or the mean
/// does not fit its result type).
#[derive(Debug)]
pub struct DecimalAvg {
    input_type: DataType,
    in_scale: i8,
    out_scale: i8,
    max: i256,
}

impl DecimalAvg {
    /// An AVG over `DECIMAL(precision, scale)`.
    pub fn new(precision: u8, scale: i8) -> Self {
        Self {
            input_type: DataType::Decimal128(precision, scale),
            in_scale: scale,
            out_scale: scale.max(6),
            max: decimal_max(DECIMAL128_MAX_PRECISION),
        }
    }
}

/// `value / count` rounded half away from zero (`count` is not zero).
fn div_half_up(value: i256, count: i256) -> i256 {
    let q = value.wrapping_div(count);
    let r = value.wrapping_rem(count);
    if r.wrapping_abs().wrapping_mul(i256::from_i128(2)) >= count.wrapping_abs() {
        if value.is_negative() != count.is_negative() {
            q.wrapping_sub(i256::ONE)
        } else {
            q.wrapping_add(i256::ONE)
        }
    } else {
        q
    }
}

impl SumKind for DecimalAvg {
    type Arg = Decimal128Type;
    type Acc = Decimal256Type;
    type Out = Decimal128Type;
    fn arg_type(&self) -> &DataType {
        &self.input_type
    }
    fn state_type(&self) -> DataType {
        DataType::Decimal256(DECIMAL256_MAX_PRECISION, self.in_scale)
    }
    fn result_type(&self) -> DataType {
        DataType::Decimal128(DECIMAL128_MAX_PRECISION, self.out_scale)
    }
    #[inline(always)]
    fn summand(v: i128) -> i256 {
        i256::from_i128(v)
    }
    wide_sum_ops!();
    fn result(&self, sum: i256, count: i64) -> Option<i128> {
        if count == 0 || !fits(sum, self.max) {
            return None;
        }
        // |sum| < 10^38 and the factor is at most 10^6: the product fits 256 bits.
        let factor = i256::from_i128(10i128.pow((self.out_scale - self.in_scale) as u32));
        let mean = div_half_up(sum.wrapping_mul(factor), i256::from_i128(i128::from(count)));
        fits(mean, self.max).then(|| mean.as_i128())
    }
}
