//! COUNT, SUM, $SUM0 and AVG: accumulators that retract by arithmetic.
//!
//! Integer sums wrap on overflow, as Flink's do (Java `long`/`int` arithmetic): `SUM(INT)` is an
//! INT that wraps, and AVG of integers keeps its sum in a wrapping BIGINT and truncates the
//! quotient toward zero.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::*;
use arrow_array::{
    Array, ArrayRef, ArrowNativeTypeOp, ArrowPrimitiveType, Int64Array, PrimitiveArray,
};
use arrow_buffer::{BooleanBuffer, NullBuffer, ScalarBuffer, i256};
use arrow_schema::{ArrowError, DECIMAL128_MAX_PRECISION, DECIMAL256_MAX_PRECISION, DataType};

use crate::accumulate::for_each_selected;
use crate::accumulator::{GroupsAccumulator, check_filter, single_arg};

/// Grows `v` to `n` entries of `fill`.
#[inline]
pub(crate) fn grow<T: Clone>(v: &mut Vec<T>, n: usize, fill: T) {
    if v.len() < n {
        v.resize(n, fill);
    }
}

/// Validity for `groups` where `valid(g)` says whether group `g` has a value.
pub(crate) fn nulls_for(groups: &[u32], valid: impl Fn(usize) -> bool) -> Option<NullBuffer> {
    let b = BooleanBuffer::collect_bool(groups.len(), |i| valid(groups[i] as usize));
    let n = NullBuffer::new(b);
    (n.null_count() > 0).then_some(n)
}

fn state_arg<'a, T: ArrowPrimitiveType>(
    states: &'a [ArrayRef],
    i: usize,
    groups: &[u32],
) -> Result<&'a PrimitiveArray<T>, ArrowError> {
    let a = states
        .get(i)
        .and_then(|a| a.as_primitive_opt::<T>())
        .ok_or_else(|| ArrowError::InvalidArgumentError(format!("bad state column {i}")))?;
    if a.len() != groups.len() {
        return Err(ArrowError::InvalidArgumentError(
            "state and group ids differ in length".to_string(),
        ));
    }
    Ok(a)
}

/// `COUNT(*)` (every selected row) or `COUNT(x)` (selected non-NULL values).
#[derive(Debug)]
pub struct CountAccumulator {
    star: bool,
    counts: Vec<i64>,
}

impl CountAccumulator {
    /// A COUNT(*) (`star`) or COUNT(x) accumulator.
    pub fn new(star: bool) -> Self {
        Self {
            star,
            counts: vec![],
        }
    }

    fn apply(
        &mut self,
        values: &[ArrayRef],
        groups: &[u32],
        filter: Option<&BooleanBuffer>,
        total_groups: usize,
        delta: i64,
    ) -> Result<(), ArrowError> {
        check_filter(filter, groups)?;
        grow(&mut self.counts, total_groups, 0);
        let nulls = if self.star {
            None
        } else {
            let [v] = values else {
                return Err(ArrowError::InvalidArgumentError(
                    "COUNT(x) takes one argument".to_string(),
                ));
            };
            if v.len() != groups.len() {
                return Err(ArrowError::InvalidArgumentError(
                    "argument and group ids differ in length".to_string(),
                ));
            }
            v.logical_nulls()
        };
        let counts = &mut self.counts;
        for_each_selected(groups, nulls.as_ref(), filter, |_, g| {
            counts[g as usize] += delta;
        });
        Ok(())
    }
}

impl GroupsAccumulator for CountAccumulator {
    fn update(
        &mut self,
        values: &[ArrayRef],
        groups: &[u32],
        filter: Option<&BooleanBuffer>,
        total_groups: usize,
    ) -> Result<(), ArrowError> {
        self.apply(values, groups, filter, total_groups, 1)
    }
    fn retract(
        &mut self,
        values: &[ArrayRef],
        groups: &[u32],
        filter: Option<&BooleanBuffer>,
        total_groups: usize,
    ) -> Result<(), ArrowError> {
        self.apply(values, groups, filter, total_groups, -1)
    }
    fn merge(
        &mut self,
        states: &[ArrayRef],
        groups: &[u32],
        total_groups: usize,
    ) -> Result<(), ArrowError> {
        let c = state_arg::<Int64Type>(states, 0, groups)?;
        grow(&mut self.counts, total_groups, 0);
        let counts = &mut self.counts;
        let vals = c.values();
        for_each_selected(groups, c.nulls(), None, |i, g| {
            counts[g as usize] += vals[i]
        });
        Ok(())
    }
    fn evaluate(&self, groups: &[u32]) -> Result<ArrayRef, ArrowError> {
        Ok(Arc::new(Int64Array::from_iter_values(groups.iter().map(
            |&g| self.counts.get(g as usize).copied().unwrap_or(0),
        ))))
    }
    fn state(&self, groups: &[u32]) -> Result<Vec<ArrayRef>, ArrowError> {
        Ok(vec![self.evaluate(groups)?])
    }
    fn state_types(&self) -> Vec<DataType> {
        vec![DataType::Int64]
    }
    fn result_type(&self) -> DataType {
        DataType::Int64
    }
    fn reset(&mut self, groups: &[u32]) {
        for &g in groups {
            if let Some(c) = self.counts.get_mut(g as usize) {
                *c = 0;
            }
        }
    }
    fn size(&self) -> usize {
        self.counts.capacity() * 8
    }
}

/// `SUM(x)` and `$SUM0(x)`: a wrapping sum and a count of the values in it.
///
/// SUM is NULL while the count is 0 (no value, or all retracted), which gives Flink's NULL for an
/// empty group both for insert-only input and with retractions; `$SUM0` is never NULL.
#[derive(Debug)]
pub struct SumAccumulator<T: ArrowPrimitiveType> {
    input_type: DataType,
    output_type: DataType,
    sum0: bool,
    sums: Vec<T::Native>,
    counts: Vec<i64>,
}

impl<T: ArrowPrimitiveType> SumAccumulator<T> {
    /// A sum over `input_type` values giving `output_type` (same native type).
    pub fn new(input_type: DataType, output_type: DataType, sum0: bool) -> Self {
        Self {
            input_type,
            output_type,
            sum0,
            sums: vec![],
            counts: vec![],
        }
    }

    fn apply<const RETRACT: bool>(
        &mut self,
        values: &[ArrayRef],
        groups: &[u32],
        filter: Option<&BooleanBuffer>,
        total_groups: usize,
    ) -> Result<(), ArrowError> {
        check_filter(filter, groups)?;
        let v = single_arg(values, groups, &self.input_type)?;
        let arr = v.as_primitive::<T>();
        grow(&mut self.sums, total_groups, T::Native::ZERO);
        grow(&mut self.counts, total_groups, 0);
        let vals = arr.values();
        let sums = &mut self.sums;
        let counts = &mut self.counts;
        for_each_selected(groups, arr.nulls(), filter, |i, g| {
            let g = g as usize;
            if RETRACT {
                sums[g] = sums[g].sub_wrapping(vals[i]);
                counts[g] -= 1;
            } else {
                sums[g] = sums[g].add_wrapping(vals[i]);
                counts[g] += 1;
            }
        });
        Ok(())
    }
}

impl<T: ArrowPrimitiveType + std::fmt::Debug> GroupsAccumulator for SumAccumulator<T> {
    fn update(
        &mut self,
        values: &[ArrayRef],
        groups: &[u32],
        filter: Option<&BooleanBuffer>,
        total_groups: usize,
    ) -> Result<(), ArrowError> {
        self.apply::<false>(values, groups, filter, total_groups)
    }
    fn retract(
        &mut self,
        values: &[ArrayRef],
        groups: &[u32],
        filter: Option<&BooleanBuffer>,
        total_groups: usize,
    ) -> Result<(), ArrowError> {
        self.apply::<true>(values, groups, filter, total_groups)
    }
    fn merge(
        &mut self,
        states: &[ArrayRef],
        groups: &[u32],
        total_groups: usize,
    ) -> Result<(), ArrowError> {
        let s = state_arg::<T>(states, 0, groups)?;
        let c = state_arg::<Int64Type>(states, 1, groups)?;
        grow(&mut self.sums, total_groups, T::Native::ZERO);
        grow(&mut self.counts, total_groups, 0);
        let (sv, cv) = (s.values(), c.values());
        let sums = &mut self.sums;
        let counts = &mut self.counts;
        for_each_selected(groups, None, None, |i, g| {
            let g = g as usize;
            sums[g] = sums[g].add_wrapping(sv[i]);
            counts[g] += cv[i];
        });
        Ok(())
    }
    fn evaluate(&self, groups: &[u32]) -> Result<ArrayRef, ArrowError> {
        let values: ScalarBuffer<T::Native> = groups
            .iter()
            .map(|&g| {
                self.sums
                    .get(g as usize)
                    .copied()
                    .unwrap_or(T::Native::ZERO)
            })
            .collect();
        let nulls = if self.sum0 {
            None
        } else {
            nulls_for(groups, |g| self.counts.get(g).is_some_and(|&c| c != 0))
        };
        Ok(Arc::new(
            PrimitiveArray::<T>::new(values, nulls).with_data_type(self.output_type.clone()),
        ))
    }
    fn state(&self, groups: &[u32]) -> Result<Vec<ArrayRef>, ArrowError> {
        let values: ScalarBuffer<T::Native> = groups
            .iter()
            .map(|&g| {
                self.sums
                    .get(g as usize)
                    .copied()
                    .unwrap_or(T::Native::ZERO)
            })
            .collect();
        let sums = PrimitiveArray::<T>::new(values, None).with_data_type(self.output_type.clone());
        let counts = Int64Array::from_iter_values(
            groups
                .iter()
                .map(|&g| self.counts.get(g as usize).copied().unwrap_or(0)),
        );
        Ok(vec![Arc::new(sums), Arc::new(counts)])
    }
    fn state_types(&self) -> Vec<DataType> {
        vec![self.output_type.clone(), DataType::Int64]
    }
    fn result_type(&self) -> DataType {
        self.output_type.clone()
    }
    fn reset(&mut self, groups: &[u32]) {
        for &g in groups {
            let g = g as usize;
            if g < self.sums.len() {
                self.sums[g] = T::Native::ZERO;
                self.counts[g] = 0;
            }
        }
    }
    fn size(&self) -> usize {
        self.sums.capacity() * std::mem::size_of::<T::Native>() + self.counts.capacity() * 8
    }
}

/// The largest unscaled value of a decimal of `precision` digits (`10^precision - 1`).
fn decimal_max(precision: u8) -> i256 {
    i256::from_i128(10)
        .checked_pow(u32::from(precision))
        .map_or(i256::MAX, |p| p.wrapping_sub(i256::ONE))
}

/// A decimal value as an exact 256-bit summand.
trait WideDecimal: Copy {
    fn wide(self) -> i256;
}

impl WideDecimal for i128 {
    #[inline(always)]
    fn wide(self) -> i256 {
        i256::from_i128(self)
    }
}

impl WideDecimal for i256 {
    #[inline(always)]
    fn wide(self) -> i256 {
        self
    }
}

/// `SUM(x)` and `$SUM0(x)` over DECIMAL: an exact 256-bit sum and a count of the values in it.
///
/// Over `DECIMAL(p, s)` the result is a `DECIMAL(38, s)`, NULL when the exact sum does not fit
/// 38 digits: Flink's DECIMAL sum yields NULL on overflow of the result precision. Because the
/// state is exact (2^63 values of 38 digits cannot overflow 256 bits), the result is the same
/// whatever order, grouping or retractions produced the sum, so every strategy agrees; a sum
/// that overflowed and came back into range by retractions is a value again. Over a
/// `DECIMAL256` argument (the split-distinct rewrite casts its partial sums to
/// `DECIMAL(76, s)`, the state type) the result is a `DECIMAL(76, s)`.
#[derive(Debug)]
pub struct DecimalSumAccumulator {
    input_type: DataType,
    output_type: DataType,
    /// The largest unscaled result (`10^precision - 1` of the result type).
    max: i256,
    scale: i8,
    sum0: bool,
    sums: Vec<i256>,
    counts: Vec<i64>,
}

impl DecimalSumAccumulator {
    /// A sum over `input_type` (`Decimal128` or `Decimal256`).
    ///
    /// # Errors
    /// Any other type.
    pub fn try_new(input_type: &DataType, sum0: bool) -> Result<Self, ArrowError> {
        let (precision, scale) = match input_type {
            DataType::Decimal128(_, s) => (DECIMAL128_MAX_PRECISION, *s),
            DataType::Decimal256(_, s) => (DECIMAL256_MAX_PRECISION, *s),
            other => {
                return Err(ArrowError::InvalidArgumentError(format!(
                    "a decimal sum over {other}"
                )));
            }
        };
        let output_type = match input_type {
            DataType::Decimal128(..) => DataType::Decimal128(precision, scale),
            _ => DataType::Decimal256(precision, scale),
        };
        Ok(Self {
            input_type: input_type.clone(),
            output_type,
            max: decimal_max(precision),
            scale,
            sum0,
            sums: vec![],
            counts: vec![],
        })
    }

    /// The state type of the sum: `DECIMAL(76, s)`.
    fn state_type(&self) -> DataType {
        DataType::Decimal256(DECIMAL256_MAX_PRECISION, self.scale)
    }

    fn apply<T, const RETRACT: bool>(
        &mut self,
        values: &[ArrayRef],
        groups: &[u32],
        filter: Option<&BooleanBuffer>,
        total_groups: usize,
    ) -> Result<(), ArrowError>
    where
        T: ArrowPrimitiveType,
        T::Native: WideDecimal,
    {
        check_filter(filter, groups)?;
        let v = single_arg(values, groups, &self.input_type)?;
        let arr = v.as_primitive::<T>();
        grow(&mut self.sums, total_groups, i256::ZERO);
        grow(&mut self.counts, total_groups, 0);
        let vals = arr.values();
        let sums = &mut self.sums;
        let counts = &mut self.counts;
        for_each_selected(groups, arr.nulls(), filter, |i, g| {
            let g = g as usize;
            let x = vals[i].wide();
            if RETRACT {
                sums[g] = sums[g].wrapping_sub(x);
                counts[g] -= 1;
            } else {
                sums[g] = sums[g].wrapping_add(x);
                counts[g] += 1;
            }
        });
        Ok(())
    }

    fn apply_any<const RETRACT: bool>(
        &mut self,
        values: &[ArrayRef],
        groups: &[u32],
        filter: Option<&BooleanBuffer>,
        total_groups: usize,
    ) -> Result<(), ArrowError> {
        if matches!(self.input_type, DataType::Decimal128(..)) {
            self.apply::<Decimal128Type, RETRACT>(values, groups, filter, total_groups)
        } else {
            self.apply::<Decimal256Type, RETRACT>(values, groups, filter, total_groups)
        }
    }

    /// The exact sum of group `g` and its count of values.
    fn get(&self, g: usize) -> (i256, i64) {
        (
            self.sums.get(g).copied().unwrap_or(i256::ZERO),
            self.counts.get(g).copied().unwrap_or(0),
        )
    }

    /// Whether `v` fits the result precision.
    fn fits(&self, v: i256) -> bool {
        v <= self.max && v >= self.max.wrapping_neg()
    }
}

impl GroupsAccumulator for DecimalSumAccumulator {
    fn update(
        &mut self,
        values: &[ArrayRef],
        groups: &[u32],
        filter: Option<&BooleanBuffer>,
        total_groups: usize,
    ) -> Result<(), ArrowError> {
        self.apply_any::<false>(values, groups, filter, total_groups)
    }
    fn retract(
        &mut self,
        values: &[ArrayRef],
        groups: &[u32],
        filter: Option<&BooleanBuffer>,
        total_groups: usize,
    ) -> Result<(), ArrowError> {
        self.apply_any::<true>(values, groups, filter, total_groups)
    }
    fn merge(
        &mut self,
        states: &[ArrayRef],
        groups: &[u32],
        total_groups: usize,
    ) -> Result<(), ArrowError> {
        let s = state_arg::<Decimal256Type>(states, 0, groups)?;
        let c = state_arg::<Int64Type>(states, 1, groups)?;
        grow(&mut self.sums, total_groups, i256::ZERO);
        grow(&mut self.counts, total_groups, 0);
        let (sv, cv) = (s.values(), c.values());
        let sums = &mut self.sums;
        let counts = &mut self.counts;
        for_each_selected(groups, None, None, |i, g| {
            let g = g as usize;
            sums[g] = sums[g].wrapping_add(sv[i]);
            counts[g] += cv[i];
        });
        Ok(())
    }
    fn evaluate(&self, groups: &[u32]) -> Result<ArrayRef, ArrowError> {
        let valid = |g: usize| {
            let (s, c) = self.get(g);
            (self.sum0 || c != 0) && self.fits(s)
        };
        let nulls = nulls_for(groups, valid);
        Ok(match self.output_type {
            DataType::Decimal128(..) => {
                let values: ScalarBuffer<i128> = groups
                    .iter()
                    .map(|&g| self.get(g as usize).0.to_i128().unwrap_or(0))
                    .collect();
                Arc::new(
                    PrimitiveArray::<Decimal128Type>::new(values, nulls)
                        .with_data_type(self.output_type.clone()),
                )
            }
            _ => {
                let values: ScalarBuffer<i256> =
                    groups.iter().map(|&g| self.get(g as usize).0).collect();
                Arc::new(
                    PrimitiveArray::<Decimal256Type>::new(values, nulls)
                        .with_data_type(self.output_type.clone()),
                )
            }
        })
    }
    fn state(&self, groups: &[u32]) -> Result<Vec<ArrayRef>, ArrowError> {
        let sums: ScalarBuffer<i256> = groups.iter().map(|&g| self.get(g as usize).0).collect();
        let sums =
            PrimitiveArray::<Decimal256Type>::new(sums, None).with_data_type(self.state_type());
        let counts = Int64Array::from_iter_values(groups.iter().map(|&g| self.get(g as usize).1));
        Ok(vec![Arc::new(sums), Arc::new(counts)])
    }
    fn state_types(&self) -> Vec<DataType> {
        vec![self.state_type(), DataType::Int64]
    }
    fn result_type(&self) -> DataType {
        self.output_type.clone()
    }
    fn reset(&mut self, groups: &[u32]) {
        for &g in groups {
            let g = g as usize;
            if g < self.sums.len() {
                self.sums[g] = i256::ZERO;
                self.counts[g] = 0;
            }
        }
    }
    fn size(&self) -> usize {
        self.sums.capacity() * std::mem::size_of::<i256>() + self.counts.capacity() * 8
    }
}

/// Builds SUM (or `$SUM0` with `sum0`) over `dt`.
pub(crate) fn new_sum(dt: &DataType, sum0: bool) -> Result<Box<dyn GroupsAccumulator>, ArrowError> {
    macro_rules! sum {
        ($t:ty) => {
            Box::new(SumAccumulator::<$t>::new(dt.clone(), dt.clone(), sum0))
        };
    }
    Ok(match dt {
        DataType::Int8 => sum!(Int8Type),
        DataType::Int16 => sum!(Int16Type),
        DataType::Int32 => sum!(Int32Type),
        DataType::Int64 => sum!(Int64Type),
        DataType::UInt8 => sum!(UInt8Type),
        DataType::UInt16 => sum!(UInt16Type),
        DataType::UInt32 => sum!(UInt32Type),
        DataType::UInt64 => sum!(UInt64Type),
        DataType::Float32 => sum!(Float32Type),
        DataType::Float64 => sum!(Float64Type),
        DataType::Decimal128(..) | DataType::Decimal256(..) => {
            Box::new(DecimalSumAccumulator::try_new(dt, sum0)?)
        }
        other => {
            return Err(ArrowError::NotYetImplemented(format!(
                "SUM does not support type {other}"
            )));
        }
    })
}

/// A native type AVG accepts: how it adds into the running sum and how the mean comes back.
pub trait AvgNative: Copy + Send + Sync + std::fmt::Debug + 'static {
    /// The sum's Arrow type (BIGINT for integers, DOUBLE for floats, as in Flink).
    type Sum: ArrowPrimitiveType;
    /// The value as a summand.
    fn to_sum(self) -> <Self::Sum as ArrowPrimitiveType>::Native;
    /// `sum / count`, truncated toward zero for integers; `count` is never 0.
    fn mean(sum: <Self::Sum as ArrowPrimitiveType>::Native, count: i64) -> Self;
}

macro_rules! avg_int {
    ($($t:ty),*) => {$(
        impl AvgNative for $t {
            type Sum = Int64Type;
            #[inline(always)]
            fn to_sum(self) -> i64 { self as i64 }
            #[inline(always)]
            fn mean(sum: i64, count: i64) -> Self { sum.wrapping_div(count) as $t }
        }
    )*};
}
avg_int!(i8, i16, i32, i64, u8, u16, u32, u64);

impl AvgNative for f32 {
    type Sum = Float64Type;
    fn to_sum(self) -> f64 {
        f64::from(self)
    }
    fn mean(sum: f64, count: i64) -> Self {
        (sum / count as f64) as f32
    }
}

impl AvgNative for f64 {
    type Sum = Float64Type;
    fn to_sum(self) -> f64 {
        self
    }
    fn mean(sum: f64, count: i64) -> Self {
        sum / count as f64
    }
}

/// `AVG(x)` over integers and floats: a running sum and a count of non-NULL values.
#[derive(Debug)]
pub struct AvgAccumulator<T: ArrowPrimitiveType>
where
    T::Native: AvgNative,
{
    data_type: DataType,
    sums: Vec<<<T::Native as AvgNative>::Sum as ArrowPrimitiveType>::Native>,
    counts: Vec<i64>,
}

type SumOf<T> =
    <<<T as ArrowPrimitiveType>::Native as AvgNative>::Sum as ArrowPrimitiveType>::Native;

impl<T: ArrowPrimitiveType> AvgAccumulator<T>
where
    T::Native: AvgNative,
{
    /// An AVG over values of `data_type`.
    pub fn new(data_type: DataType) -> Self {
        Self {
            data_type,
            sums: vec![],
            counts: vec![],
        }
    }

    fn apply<const RETRACT: bool>(
        &mut self,
        values: &[ArrayRef],
        groups: &[u32],
        filter: Option<&BooleanBuffer>,
        total_groups: usize,
    ) -> Result<(), ArrowError> {
        check_filter(filter, groups)?;
        let v = single_arg(values, groups, &self.data_type)?;
        let arr = v.as_primitive::<T>();
        grow(&mut self.sums, total_groups, SumOf::<T>::ZERO);
        grow(&mut self.counts, total_groups, 0);
        let vals = arr.values();
        let sums = &mut self.sums;
        let counts = &mut self.counts;
        for_each_selected(groups, arr.nulls(), filter, |i, g| {
            let g = g as usize;
            let x = vals[i].to_sum();
            if RETRACT {
                sums[g] = sums[g].sub_wrapping(x);
                counts[g] -= 1;
            } else {
                sums[g] = sums[g].add_wrapping(x);
                counts[g] += 1;
            }
        });
        Ok(())
    }
}

impl<T: ArrowPrimitiveType + std::fmt::Debug> GroupsAccumulator for AvgAccumulator<T>
where
    T::Native: AvgNative,
{
    fn update(
        &mut self,
        values: &[ArrayRef],
        groups: &[u32],
        filter: Option<&BooleanBuffer>,
        total_groups: usize,
    ) -> Result<(), ArrowError> {
        self.apply::<false>(values, groups, filter, total_groups)
    }
    fn retract(
        &mut self,
        values: &[ArrayRef],
        groups: &[u32],
        filter: Option<&BooleanBuffer>,
        total_groups: usize,
    ) -> Result<(), ArrowError> {
        self.apply::<true>(values, groups, filter, total_groups)
    }
    fn merge(
        &mut self,
        states: &[ArrayRef],
        groups: &[u32],
        total_groups: usize,
    ) -> Result<(), ArrowError> {
        let s = state_arg::<<T::Native as AvgNative>::Sum>(states, 0, groups)?;
        let c = state_arg::<Int64Type>(states, 1, groups)?;
        grow(&mut self.sums, total_groups, SumOf::<T>::ZERO);
        grow(&mut self.counts, total_groups, 0);
        let (sv, cv) = (s.values(), c.values());
        let sums = &mut self.sums;
        let counts = &mut self.counts;
        for_each_selected(groups, None, None, |i, g| {
            let g = g as usize;
            sums[g] = sums[g].add_wrapping(sv[i]);
            counts[g] += cv[i];
        });
        Ok(())
    }
    fn evaluate(&self, groups: &[u32]) -> Result<ArrayRef, ArrowError> {
        let values: ScalarBuffer<T::Native> = groups
            .iter()
            .map(|&g| {
                let g = g as usize;
                match self.counts.get(g) {
                    Some(&c) if c != 0 => T::Native::mean(self.sums[g], c),
                    _ => T::Native::mean(SumOf::<T>::ZERO, 1),
                }
            })
            .collect();
        let nulls = nulls_for(groups, |g| self.counts.get(g).is_some_and(|&c| c != 0));
        Ok(Arc::new(
            PrimitiveArray::<T>::new(values, nulls).with_data_type(self.data_type.clone()),
        ))
    }
    fn state(&self, groups: &[u32]) -> Result<Vec<ArrayRef>, ArrowError> {
        let sums: PrimitiveArray<<T::Native as AvgNative>::Sum> = PrimitiveArray::new(
            groups
                .iter()
                .map(|&g| {
                    self.sums
                        .get(g as usize)
                        .copied()
                        .unwrap_or(SumOf::<T>::ZERO)
                })
                .collect(),
            None,
        );
        let counts = Int64Array::from_iter_values(
            groups
                .iter()
                .map(|&g| self.counts.get(g as usize).copied().unwrap_or(0)),
        );
        Ok(vec![Arc::new(sums), Arc::new(counts)])
    }
    fn state_types(&self) -> Vec<DataType> {
        vec![<T::Native as AvgNative>::Sum::DATA_TYPE, DataType::Int64]
    }
    fn result_type(&self) -> DataType {
        self.data_type.clone()
    }
    fn reset(&mut self, groups: &[u32]) {
        for &g in groups {
            let g = g as usize;
            if g < self.sums.len() {
                self.sums[g] = SumOf::<T>::ZERO;
                self.counts[g] = 0;
            }
        }
    }
    fn size(&self) -> usize {
        self.sums.capacity() * std::mem::size_of::<SumOf<T>>() + self.counts.capacity() * 8
    }
}

/// `AVG(x)` over `DECIMAL(p, s)`: the exact sum of [`DecimalSumAccumulator`] (its state, a
/// `DECIMAL(76, s)`, and the count), the result a `DECIMAL(38, max(6, s))` rounded half away
/// from zero (Java's HALF_UP), as in Flink. Flink keeps the sum as a `DECIMAL(38, s)`, which
/// yields NULL on overflow: the result is NULL when the exact sum does not fit 38 digits (or the
/// mean does not fit its result type).
#[derive(Debug)]
pub struct DecimalAvgAccumulator {
    in_scale: i8,
    out_scale: i8,
    sums: DecimalSumAccumulator,
}

impl DecimalAvgAccumulator {
    /// An AVG over `DECIMAL(precision, scale)`.
    pub fn new(precision: u8, scale: i8) -> Self {
        let sums = DecimalSumAccumulator {
            input_type: DataType::Decimal128(precision, scale),
            output_type: DataType::Decimal128(DECIMAL128_MAX_PRECISION, scale),
            max: decimal_max(DECIMAL128_MAX_PRECISION),
            scale,
            sum0: false,
            sums: vec![],
            counts: vec![],
        };
        Self {
            sums,
            in_scale: scale,
            out_scale: scale.max(6),
        }
    }

    /// The mean of group `g` at the result scale, if it has one that fits.
    fn mean(&self, g: usize) -> Option<i128> {
        let (sum, count) = self.sums.get(g);
        if count == 0 || !self.sums.fits(sum) {
            return None;
        }
        // |sum| < 10^38 and the factor is at most 10^6: the product fits 256 bits.
        let factor = i256::from_i128(10i128.pow((self.out_scale - self.in_scale) as u32));
        let mean = div_half_up(sum.wrapping_mul(factor), i256::from_i128(i128::from(count)));
        self.sums.fits(mean).then(|| mean.as_i128())
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

impl GroupsAccumulator for DecimalAvgAccumulator {
    fn update(
        &mut self,
        values: &[ArrayRef],
        groups: &[u32],
        filter: Option<&BooleanBuffer>,
        total_groups: usize,
    ) -> Result<(), ArrowError> {
        self.sums.update(values, groups, filter, total_groups)
    }
    fn retract(
        &mut self,
        values: &[ArrayRef],
        groups: &[u32],
        filter: Option<&BooleanBuffer>,
        total_groups: usize,
    ) -> Result<(), ArrowError> {
        self.sums.retract(values, groups, filter, total_groups)
    }
    fn merge(
        &mut self,
        states: &[ArrayRef],
        groups: &[u32],
        total_groups: usize,
    ) -> Result<(), ArrowError> {
        self.sums.merge(states, groups, total_groups)
    }
    fn evaluate(&self, groups: &[u32]) -> Result<ArrayRef, ArrowError> {
        let means: Vec<Option<i128>> = groups.iter().map(|&g| self.mean(g as usize)).collect();
        let valid = NullBuffer::new(BooleanBuffer::collect_bool(means.len(), |i| {
            means[i].is_some()
        }));
        let nulls = (valid.null_count() > 0).then_some(valid);
        let values: ScalarBuffer<i128> = means.iter().map(|m| m.unwrap_or(0)).collect();
        Ok(Arc::new(
            PrimitiveArray::<Decimal128Type>::new(values, nulls).with_data_type(self.result_type()),
        ))
    }
    fn state(&self, groups: &[u32]) -> Result<Vec<ArrayRef>, ArrowError> {
        self.sums.state(groups)
    }
    fn state_types(&self) -> Vec<DataType> {
        self.sums.state_types()
    }
    fn result_type(&self) -> DataType {
        DataType::Decimal128(DECIMAL128_MAX_PRECISION, self.out_scale)
    }
    fn reset(&mut self, groups: &[u32]) {
        self.sums.reset(groups);
    }
    fn size(&self) -> usize {
        self.sums.size()
    }
}

/// Builds AVG over `dt`.
pub(crate) fn new_avg(dt: &DataType) -> Result<Box<dyn GroupsAccumulator>, ArrowError> {
    macro_rules! avg {
        ($t:ty) => {
            Box::new(AvgAccumulator::<$t>::new(dt.clone()))
        };
    }
    Ok(match dt {
        DataType::Int8 => avg!(Int8Type),
        DataType::Int16 => avg!(Int16Type),
        DataType::Int32 => avg!(Int32Type),
        DataType::Int64 => avg!(Int64Type),
        DataType::UInt8 => avg!(UInt8Type),
        DataType::UInt16 => avg!(UInt16Type),
        DataType::UInt32 => avg!(UInt32Type),
        DataType::UInt64 => avg!(UInt64Type),
        DataType::Float32 => avg!(Float32Type),
        DataType::Float64 => avg!(Float64Type),
        DataType::Decimal128(p, s) => Box::new(DecimalAvgAccumulator::new(*p, *s)),
        other => {
            return Err(ArrowError::NotYetImplemented(format!(
                "AVG does not support type {other}"
            )));
        }
    })
}
