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
use arrow_buffer::{BooleanBuffer, NullBuffer, ScalarBuffer};
use arrow_schema::{ArrowError, DataType};

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
        DataType::Decimal128(_, s) => Box::new(SumAccumulator::<Decimal128Type>::new(
            dt.clone(),
            DataType::Decimal128(38, *s),
            sum0,
        )),
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

/// `AVG(x)` over `DECIMAL(p, s)`: the sum is a `DECIMAL(38, s)`, the result a
/// `DECIMAL(38, max(6, s))` rounded half away from zero (Java's HALF_UP), as in Flink.
#[derive(Debug)]
pub struct DecimalAvgAccumulator {
    input_type: DataType,
    in_scale: i8,
    out_scale: i8,
    sums: SumAccumulator<Decimal128Type>,
}

impl DecimalAvgAccumulator {
    /// An AVG over `DECIMAL(precision, scale)`.
    pub fn new(precision: u8, scale: i8) -> Self {
        let input_type = DataType::Decimal128(precision, scale);
        Self {
            sums: SumAccumulator::new(input_type.clone(), DataType::Decimal128(38, scale), false),
            input_type,
            in_scale: scale,
            out_scale: scale.max(6),
        }
    }
}

/// `value / count` rounded half away from zero.
fn div_half_up(value: i128, count: i128) -> i128 {
    let q = value / count;
    let r = value % count;
    if r.unsigned_abs() * 2 >= count.unsigned_abs() {
        if (value < 0) != (count < 0) {
            q - 1
        } else {
            q + 1
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
        let factor = 10i128.pow((self.out_scale - self.in_scale) as u32);
        let mut values = Vec::with_capacity(groups.len());
        for &g in groups {
            let g = g as usize;
            let v = match self.sums.counts.get(g) {
                Some(&c) if c != 0 => {
                    let scaled = self.sums.sums[g].checked_mul(factor).ok_or_else(|| {
                        ArrowError::ComputeError(format!(
                            "AVG over {} overflows DECIMAL(38, {})",
                            self.input_type, self.out_scale
                        ))
                    })?;
                    div_half_up(scaled, i128::from(c))
                }
                _ => 0,
            };
            values.push(v);
        }
        let nulls = nulls_for(groups, |g| self.sums.counts.get(g).is_some_and(|&c| c != 0));
        Ok(Arc::new(
            PrimitiveArray::<Decimal128Type>::new(ScalarBuffer::from(values), nulls)
                .with_data_type(self.result_type()),
        ))
    }
    fn state(&self, groups: &[u32]) -> Result<Vec<ArrayRef>, ArrowError> {
        self.sums.state(groups)
    }
    fn state_types(&self) -> Vec<DataType> {
        self.sums.state_types()
    }
    fn result_type(&self) -> DataType {
        DataType::Decimal128(38, self.out_scale)
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
