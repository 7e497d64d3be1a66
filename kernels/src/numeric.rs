//! COUNT, SUM, $SUM0 and AVG: accumulators that retract by arithmetic.
//!
//! SUM, $SUM0 and AVG are one accumulator, [`SumAccumulator`]: a running sum and a count of the
//! values in it per group, folded, retracted, merged and exported by one generic core. What
//! differs between them is a [`SumKind`]: how a value becomes a summand, how two sums add, and
//! what result a sum and a count give.
//!
//! Integer sums wrap on overflow, as Flink's do (Java `long`/`int` arithmetic): `SUM(INT)` is an
//! INT that wraps, and AVG of integers keeps its sum in a wrapping BIGINT and truncates the
//! quotient toward zero. Decimal sums are exact (256 bits) and NULL when they overflow the result
//! precision (`decimal.rs`).

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::*;
use arrow_array::{
    Array, ArrayRef, ArrowNativeTypeOp, ArrowPrimitiveType, Int64Array, PrimitiveArray,
};
use arrow_buffer::{BooleanBuffer, NullBuffer, ScalarBuffer};
use arrow_schema::{ArrowError, DataType};

use crate::accumulate::{
    Lanes, count_rows, every_row_then_nulls, for_each_null_row, for_each_row_in_lanes,
    for_each_row_then_nulls, for_each_selected, in_lanes, lane,
};
use crate::accumulator::{GroupsAccumulator, check_filter, grow, single_arg, state_arg};

/// `COUNT(*)` (every selected row) or `COUNT(x)` (selected non-NULL values).
#[derive(Debug)]
pub struct CountAccumulator {
    star: bool,
    counts: Vec<i64>,
    lanes: Lanes<i64>,
}

impl CountAccumulator {
    /// A COUNT(*) (`star`) or COUNT(x) accumulator.
    pub fn new(star: bool) -> Self {
        Self {
            star,
            counts: vec![],
            lanes: Lanes::default(),
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
        count_rows(
            groups,
            nulls.as_ref(),
            filter,
            &mut self.counts[..total_groups],
            delta,
            &mut self.lanes,
        );
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
    fn merge_at(
        &mut self,
        states: &[ArrayRef],
        offset: usize,
        groups: &[u32],
        total_groups: usize,
    ) -> Result<(), ArrowError> {
        let (vals, nulls) = state_arg::<Int64Type>(states, 0, offset, groups)?;
        grow(&mut self.counts, total_groups, 0);
        let counts = &mut self.counts;
        match nulls {
            None => {
                for (&g, &v) in groups.iter().zip(vals) {
                    counts[g as usize] += v;
                }
            }
            Some(nulls) => for_each_selected(groups, Some(&nulls), None, |i, g| {
                counts[g as usize] += vals[i]
            }),
        }
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
    fn counts_mut(&mut self, total_groups: usize) -> Option<&mut [i64]> {
        grow(&mut self.counts, total_groups, 0);
        Some(&mut self.counts[..total_groups])
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

/// What makes a sum-and-count accumulator SUM, $SUM0, AVG or a decimal one: the types, how a
/// value becomes a summand, how sums add (and subtract), and the result of a sum over `count`
/// values. The argument, state and result types are fixed when the kind is made.
pub trait SumKind: Send + Sync + std::fmt::Debug + 'static {
    /// The argument's array type.
    type Arg: ArrowPrimitiveType;
    /// The running sum's array type (the state column's).
    type Acc: ArrowPrimitiveType;
    /// The result's array type.
    type Out: ArrowPrimitiveType;
    /// The argument's data type.
    fn arg_type(&self) -> &DataType;
    /// The running sum's data type.
    fn state_type(&self) -> DataType;
    /// The result's data type.
    fn result_type(&self) -> DataType;
    /// A value as a summand.
    fn summand(
        v: <Self::Arg as ArrowPrimitiveType>::Native,
    ) -> <Self::Acc as ArrowPrimitiveType>::Native;
    /// `a + b` (wrapping for integers).
    fn add(
        a: <Self::Acc as ArrowPrimitiveType>::Native,
        b: <Self::Acc as ArrowPrimitiveType>::Native,
    ) -> <Self::Acc as ArrowPrimitiveType>::Native;
    /// `a - b` (wrapping for integers).
    fn sub(
        a: <Self::Acc as ArrowPrimitiveType>::Native,
        b: <Self::Acc as ArrowPrimitiveType>::Native,
    ) -> <Self::Acc as ArrowPrimitiveType>::Native;
    /// The result of a group whose sum is `sum` over `count` values; None is NULL.
    fn result(
        &self,
        sum: <Self::Acc as ArrowPrimitiveType>::Native,
        count: i64,
    ) -> Option<<Self::Out as ArrowPrimitiveType>::Native>;
}

/// SUM, $SUM0 and AVG: per group a running sum and a count of the values in it (the count makes
/// an empty group's SUM NULL after retractions too), the result given by the [`SumKind`].
pub struct SumAccumulator<K: SumKind> {
    kind: K,
    sums: Vec<<K::Acc as ArrowPrimitiveType>::Native>,
    counts: Vec<i64>,
    /// Lane copies of `sums` and `counts` for passes over few groups (integer sums only:
    /// they wrap, so they add in any order).
    lane_sums: Lanes<<K::Acc as ArrowPrimitiveType>::Native>,
    lane_counts: Lanes<i64>,
}

impl<K: SumKind> std::fmt::Debug for SumAccumulator<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SumAccumulator")
            .field("kind", &self.kind)
            .field("groups", &self.sums.len())
            .finish()
    }
}

impl<K: SumKind> SumAccumulator<K> {
    /// An accumulator of `kind`.
    pub fn new(kind: K) -> Self {
        Self {
            kind,
            sums: vec![],
            counts: vec![],
            lane_sums: Lanes::default(),
            lane_counts: Lanes::default(),
        }
    }

    /// The running sum of group `g` and its count of values.
    #[inline]
    fn get(&self, g: usize) -> (<K::Acc as ArrowPrimitiveType>::Native, i64) {
        (
            self.sums
                .get(g)
                .copied()
                .unwrap_or(<K::Acc as ArrowPrimitiveType>::Native::ZERO),
            self.counts.get(g).copied().unwrap_or(0),
        )
    }

    fn apply<const RETRACT: bool>(
        &mut self,
        values: &[ArrayRef],
        groups: &[u32],
        filter: Option<&BooleanBuffer>,
        total_groups: usize,
    ) -> Result<(), ArrowError> {
        check_filter(filter, groups)?;
        let v = single_arg(values, groups, self.kind.arg_type())?;
        let arr = v.as_primitive::<K::Arg>();
        grow(
            &mut self.sums,
            total_groups,
            <K::Acc as ArrowPrimitiveType>::Native::ZERO,
        );
        grow(&mut self.counts, total_groups, 0);
        let vals = arr.values();
        let zero = <K::Acc as ArrowPrimitiveType>::Native::ZERO;
        let rows = SelectedRows {
            groups,
            nulls: arr.nulls(),
            filter,
        };
        if K::Acc::DATA_TYPE.is_integer() && in_lanes(groups.len(), total_groups) {
            let sums = self.lane_sums.cells(total_groups, zero);
            let counts = self.lane_counts.cells(total_groups, 0);
            if every_row_then_nulls(groups.len(), rows.nulls, filter) {
                // Every row added (or taken) in its lane, NULL rows included.
                let counts = &mut counts[..sums.len()];
                for_each_row_in_lanes(groups, vals, |c, v| {
                    step::<K>(&mut sums[c], &mut counts[c], v, RETRACT);
                });
                if let Some(n) = rows.nulls.filter(|n| n.null_count() > 0) {
                    // The NULL rows' arbitrary values taken back (integer sums wrap).
                    for_each_null_row(groups, n, |i, g| {
                        let c = lane(i, g);
                        step::<K>(&mut sums[c], &mut counts[c], vals[i], !RETRACT);
                    });
                }
            } else {
                add_rows::<K, RETRACT>(&rows, vals, sums, counts, lane);
            }
            self.lane_sums
                .fold_into(&mut self.sums[..total_groups], zero, K::add);
            self.lane_counts
                .fold_into(&mut self.counts[..total_groups], 0, |a, b| a + b);
        } else {
            add_rows::<K, RETRACT>(&rows, vals, &mut self.sums, &mut self.counts, |_, g| {
                g as usize
            });
        }
        Ok(())
    }
}

/// Adds (or, when `take`, takes) summand `v` to a cell's sum and counts it in the cell's count.
#[inline(always)]
fn step<K: SumKind>(
    sum: &mut <K::Acc as ArrowPrimitiveType>::Native,
    count: &mut i64,
    v: <K::Arg as ArrowPrimitiveType>::Native,
    take: bool,
) {
    let x = K::summand(v);
    if take {
        *sum = K::sub(*sum, x);
        *count -= 1;
    } else {
        *sum = K::add(*sum, x);
        *count += 1;
    }
}

/// The rows a pass visits ([`for_each_selected`]).
struct SelectedRows<'a> {
    groups: &'a [u32],
    nulls: Option<&'a NullBuffer>,
    filter: Option<&'a BooleanBuffer>,
}

/// Adds (or with `RETRACT` takes) each selected row's summand of `vals` to its cell
/// `cell(row, group)` of `sums`, and counts it in `counts` (a group's cell, or its lane).
#[inline(always)]
fn add_rows<K: SumKind, const RETRACT: bool>(
    rows: &SelectedRows<'_>,
    vals: &[<K::Arg as ArrowPrimitiveType>::Native],
    sums: &mut [<K::Acc as ArrowPrimitiveType>::Native],
    counts: &mut [i64],
    cell: impl Fn(usize, u32) -> usize,
) {
    // Integer sums wrap, so a NULL row's arbitrary value added and taken back leaves them as
    // they were: with few NULLs, every row and then the NULL rows back.
    if K::Acc::DATA_TYPE.is_integer()
        && for_each_row_then_nulls(rows.groups, rows.nulls, rows.filter, |i, g, add| {
            let c = cell(i, g);
            step::<K>(&mut sums[c], &mut counts[c], vals[i], add == RETRACT);
        })
    {
        return;
    }
    for_each_selected(rows.groups, rows.nulls, rows.filter, |i, g| {
        let c = cell(i, g);
        step::<K>(&mut sums[c], &mut counts[c], vals[i], RETRACT);
    });
}

impl<K: SumKind> GroupsAccumulator for SumAccumulator<K> {
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
    fn merge_at(
        &mut self,
        states: &[ArrayRef],
        offset: usize,
        groups: &[u32],
        total_groups: usize,
    ) -> Result<(), ArrowError> {
        let (s, _) = state_arg::<K::Acc>(states, 0, offset, groups)?;
        let (c, _) = state_arg::<Int64Type>(states, 1, offset, groups)?;
        grow(
            &mut self.sums,
            total_groups,
            <K::Acc as ArrowPrimitiveType>::Native::ZERO,
        );
        grow(&mut self.counts, total_groups, 0);
        // The state columns are as long as `groups` (`state_arg`): zipped, only the groups'
        // cells are bounds-checked.
        for ((&g, &sum), &count) in groups.iter().zip(s).zip(c) {
            let g = g as usize;
            self.sums[g] = K::add(self.sums[g], sum);
            self.counts[g] += count;
        }
        Ok(())
    }
    fn evaluate(&self, groups: &[u32]) -> Result<ArrayRef, ArrowError> {
        // One pass for the values; the validity only where a result is NULL (a SUM or AVG over
        // no values), which is rare, and a $SUM0's never is.
        let mut any_null = false;
        let values: ScalarBuffer<_> = groups
            .iter()
            .map(|&g| {
                let (sum, count) = self.get(g as usize);
                self.kind.result(sum, count).unwrap_or_else(|| {
                    any_null = true;
                    <K::Out as ArrowPrimitiveType>::Native::ZERO
                })
            })
            .collect();
        let nulls = any_null.then(|| {
            NullBuffer::new(BooleanBuffer::collect_bool(groups.len(), |i| {
                let (sum, count) = self.get(groups[i] as usize);
                self.kind.result(sum, count).is_some()
            }))
        });
        Ok(Arc::new(
            PrimitiveArray::<K::Out>::new(values, nulls).with_data_type(self.kind.result_type()),
        ))
    }
    fn state(&self, groups: &[u32]) -> Result<Vec<ArrayRef>, ArrowError> {
        let sums: ScalarBuffer<_> = groups.iter().map(|&g| self.get(g as usize).0).collect();
        let sums = PrimitiveArray::<K::Acc>::new(sums, None).with_data_type(self.kind.state_type());
        let counts = Int64Array::from_iter_values(groups.iter().map(|&g| self.get(g as usize).1));
        Ok(vec![Arc::new(sums), Arc::new(counts)])
    }
    fn state_types(&self) -> Vec<DataType> {
        vec![self.kind.state_type(), DataType::Int64]
    }
    fn result_type(&self) -> DataType {
        self.kind.result_type()
    }
    fn reset(&mut self, groups: &[u32]) {
        for &g in groups {
            let g = g as usize;
            if g < self.sums.len() {
                self.sums[g] = <K::Acc as ArrowPrimitiveType>::Native::ZERO;
                self.counts[g] = 0;
            }
        }
    }
    fn size(&self) -> usize {
        self.sums.capacity() * std::mem::size_of::<<K::Acc as ArrowPrimitiveType>::Native>()
            + self.counts.capacity() * 8
    }
}

/// SUM (NULL for a group without values) or `$SUM0` (0 instead) over a primitive type: the sum
/// has the argument's type and wraps.
#[derive(Debug)]
pub struct Sum<T: ArrowPrimitiveType> {
    data_type: DataType,
    sum0: bool,
    _t: std::marker::PhantomData<fn() -> T>,
}

impl<T: ArrowPrimitiveType> Sum<T> {
    /// A SUM (`$SUM0` with `sum0`) over `data_type`.
    pub fn new(data_type: DataType, sum0: bool) -> Self {
        Self {
            data_type,
            sum0,
            _t: std::marker::PhantomData,
        }
    }
}

impl<T: ArrowPrimitiveType + std::fmt::Debug> SumKind for Sum<T> {
    type Arg = T;
    type Acc = T;
    type Out = T;
    fn arg_type(&self) -> &DataType {
        &self.data_type
    }
    fn state_type(&self) -> DataType {
        self.data_type.clone()
    }
    fn result_type(&self) -> DataType {
        self.data_type.clone()
    }
    #[inline(always)]
    fn summand(v: T::Native) -> T::Native {
        v
    }
    #[inline(always)]
    fn add(a: T::Native, b: T::Native) -> T::Native {
        a.add_wrapping(b)
    }
    #[inline(always)]
    fn sub(a: T::Native, b: T::Native) -> T::Native {
        a.sub_wrapping(b)
    }
    fn result(&self, sum: T::Native, count: i64) -> Option<T::Native> {
        (self.sum0 || count != 0).then_some(sum)
    }
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

/// `AVG(x)` over integers and floats: the argument's type, the sum in a wrapping BIGINT
/// (integers, quotient truncated) or a DOUBLE (floats).
#[derive(Debug)]
pub struct Avg<T: ArrowPrimitiveType> {
    data_type: DataType,
    _t: std::marker::PhantomData<fn() -> T>,
}

impl<T: ArrowPrimitiveType> Avg<T> {
    /// An AVG over `data_type`.
    pub fn new(data_type: DataType) -> Self {
        Self {
            data_type,
            _t: std::marker::PhantomData,
        }
    }
}

impl<T> SumKind for Avg<T>
where
    T: ArrowPrimitiveType + std::fmt::Debug,
    T::Native: AvgNative,
{
    type Arg = T;
    type Acc = <T::Native as AvgNative>::Sum;
    type Out = T;
    fn arg_type(&self) -> &DataType {
        &self.data_type
    }
    fn state_type(&self) -> DataType {
        Self::Acc::DATA_TYPE
    }
    fn result_type(&self) -> DataType {
        self.data_type.clone()
    }
    #[inline(always)]
    fn summand(v: T::Native) -> <Self::Acc as ArrowPrimitiveType>::Native {
        v.to_sum()
    }
    #[inline(always)]
    fn add(
        a: <Self::Acc as ArrowPrimitiveType>::Native,
        b: <Self::Acc as ArrowPrimitiveType>::Native,
    ) -> <Self::Acc as ArrowPrimitiveType>::Native {
        a.add_wrapping(b)
    }
    #[inline(always)]
    fn sub(
        a: <Self::Acc as ArrowPrimitiveType>::Native,
        b: <Self::Acc as ArrowPrimitiveType>::Native,
    ) -> <Self::Acc as ArrowPrimitiveType>::Native {
        a.sub_wrapping(b)
    }
    fn result(
        &self,
        sum: <Self::Acc as ArrowPrimitiveType>::Native,
        count: i64,
    ) -> Option<T::Native> {
        (count != 0).then(|| T::Native::mean(sum, count))
    }
}

#[cfg(test)]
mod tests;
