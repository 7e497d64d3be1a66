//! MIN and MAX.
//!
//! Over insert-only input a group keeps only its extreme value ([`MinMaxAccumulator`]; for a
//! primitive type a native and a flag per group, [`PrimMinMaxAccumulator`]). With
//! retractions the extreme can be taken away, so a group keeps a value → multiplicity multiset
//! ([`MinMaxRetractAccumulator`], like Flink's `MaxWithRetractAggFunction`): the result is the
//! greatest (least) value whose multiplicity is positive, NULL when there is none. Multiplicities
//! may go negative (a retraction that precedes its accumulation, in a local phase) and cancel
//! when the accumulation arrives. Unlike Flink, values with a negative multiplicity never become
//! the result; that only differs on inconsistent input (docs/semantics.md, "Where Tally differs from Flink").
//! Where the argument only moves the extreme's way across the changelog (a split-distinct
//! FINAL's MIN/MAX over insert-only input), the retractions are ignored and a group keeps its
//! extreme alone ([`MonotonicAccumulator`], Flink's monotonicity shortcut).
//!
//! Floats are ordered by IEEE total order (`-0.0 < 0.0`, NaN greatest), strings by their UTF-8
//! bytes. Booleans, dictionaries and the other string types are cast to `UInt8` / `Utf8` by the
//! factory before they get here.

use std::cmp::Ordering;
use std::fmt::Debug;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::*;
use arrow_array::{
    Array, ArrayRef, ArrowNativeTypeOp, ArrowPrimitiveType, PrimitiveArray, StringArray,
};
use arrow_buffer::{BooleanBuffer, NullBuffer, ToByteSlice};
use arrow_schema::{ArrowError, DataType, TimeUnit};
use hashbrown::HashMap;

mod monotonic;
mod primitive;
mod retract;

pub use monotonic::MonotonicAccumulator;
pub use primitive::PrimMinMaxAccumulator;
pub use retract::MinMaxRetractAccumulator;

use crate::accumulate::for_each_selected;
use crate::accumulator::grow;
use crate::accumulator::{GroupsAccumulator, check_filter, column_rows, single_arg};

/// A value MIN/MAX can hold: ordered, owned, readable from and writable to an Arrow array.
pub trait OrdValue: Ord + Hash + Clone + Send + Sync + Debug + 'static {
    /// The typed array the values are read from.
    type Array<'a>: Copy;
    /// Views `a` as [`Self::Array`].
    ///
    /// # Errors
    /// When `a` has another type.
    fn downcast(a: &ArrayRef) -> Result<Self::Array<'_>, ArrowError>;
    /// The array's validity.
    fn nulls<'a>(a: Self::Array<'a>) -> Option<&'a NullBuffer>;
    /// Compares row `i` of `a` with `other`.
    fn cmp_at(a: Self::Array<'_>, i: usize, other: &Self) -> Ordering;
    /// An owned copy of row `i`.
    fn own(a: Self::Array<'_>, i: usize) -> Self;
    /// The multiplicity of row `i`'s value in `map`.
    #[inline(always)]
    fn lookup<'m>(
        map: &'m mut HashMap<Self, i64>,
        a: Self::Array<'_>,
        i: usize,
    ) -> Option<&'m mut i64> {
        map.get_mut(&Self::own(a, i))
    }
    /// Removes row `i`'s value from `map`.
    #[inline(always)]
    fn remove_at(map: &mut HashMap<Self, i64>, a: Self::Array<'_>, i: usize) {
        map.remove(&Self::own(a, i));
    }
    /// Builds an array of `data_type` from optional values.
    ///
    /// # Errors
    /// When `data_type` does not fit the values.
    fn build<'a>(
        values: impl Iterator<Item = Option<&'a Self>>,
        data_type: &DataType,
    ) -> Result<ArrayRef, ArrowError>;
}

/// A primitive native value ordered by Arrow's total order.
pub struct PrimKey<T: ArrowPrimitiveType>(pub T::Native);

impl<T: ArrowPrimitiveType> Clone for PrimKey<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T: ArrowPrimitiveType> Copy for PrimKey<T> {}
impl<T: ArrowPrimitiveType> Debug for PrimKey<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

impl<T: ArrowPrimitiveType> PartialEq for PrimKey<T> {
    fn eq(&self, other: &Self) -> bool {
        self.0.is_eq(other.0)
    }
}
impl<T: ArrowPrimitiveType> Eq for PrimKey<T> {}
impl<T: ArrowPrimitiveType> PartialOrd for PrimKey<T> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<T: ArrowPrimitiveType> Hash for PrimKey<T> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // Equality is total-order equality, i.e. bit equality: hash the bits.
        std::slice::from_ref(&self.0).to_byte_slice().hash(state);
    }
}
impl<T: ArrowPrimitiveType> Ord for PrimKey<T> {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.compare(other.0)
    }
}

impl<T: ArrowPrimitiveType + Debug> OrdValue for PrimKey<T> {
    type Array<'a> = &'a PrimitiveArray<T>;
    fn downcast(a: &ArrayRef) -> Result<Self::Array<'_>, ArrowError> {
        a.as_primitive_opt::<T>()
            .ok_or_else(|| ArrowError::InvalidArgumentError("unexpected MIN/MAX type".into()))
    }
    fn nulls<'a>(a: Self::Array<'a>) -> Option<&'a NullBuffer> {
        a.nulls()
    }
    #[inline(always)]
    fn cmp_at(a: Self::Array<'_>, i: usize, other: &Self) -> Ordering {
        a.values()[i].compare(other.0)
    }
    #[inline(always)]
    fn own(a: Self::Array<'_>, i: usize) -> Self {
        PrimKey(a.values()[i])
    }
    fn build<'a>(
        values: impl Iterator<Item = Option<&'a Self>>,
        data_type: &DataType,
    ) -> Result<ArrayRef, ArrowError> {
        let arr: PrimitiveArray<T> = values.map(|v| v.map(|v| v.0)).collect();
        Ok(Arc::new(arr.with_data_type(data_type.clone())))
    }
}

impl OrdValue for Box<str> {
    type Array<'a> = &'a StringArray;
    // Look up by `&str`, so that only new values allocate.
    #[inline(always)]
    fn lookup<'m>(
        map: &'m mut HashMap<Self, i64>,
        a: Self::Array<'_>,
        i: usize,
    ) -> Option<&'m mut i64> {
        map.get_mut(a.value(i))
    }
    #[inline(always)]
    fn remove_at(map: &mut HashMap<Self, i64>, a: Self::Array<'_>, i: usize) {
        map.remove(a.value(i));
    }
    fn downcast(a: &ArrayRef) -> Result<Self::Array<'_>, ArrowError> {
        a.as_string_opt::<i32>()
            .ok_or_else(|| ArrowError::InvalidArgumentError("unexpected MIN/MAX type".into()))
    }
    fn nulls<'a>(a: Self::Array<'a>) -> Option<&'a NullBuffer> {
        a.nulls()
    }
    #[inline(always)]
    fn cmp_at(a: Self::Array<'_>, i: usize, other: &Self) -> Ordering {
        a.value(i).cmp(other)
    }
    fn own(a: Self::Array<'_>, i: usize) -> Self {
        a.value(i).into()
    }
    fn build<'a>(
        values: impl Iterator<Item = Option<&'a Self>>,
        _data_type: &DataType,
    ) -> Result<ArrayRef, ArrowError> {
        let arr: StringArray = values.map(|v| v.map(|s| &**s)).collect();
        Ok(Arc::new(arr))
    }
}

/// The ordering that wins: `Greater` for MAX, `Less` for MIN.
#[inline(always)]
fn wins(is_max: bool) -> Ordering {
    if is_max {
        Ordering::Greater
    } else {
        Ordering::Less
    }
}

/// An insert-only MIN/MAX: the fold its `update` and `merge_at` share ([`update_by_fold`],
/// [`merge_by_fold`]).
trait Fold {
    /// The argument's type (the state's and the result's too).
    fn arg_type(&self) -> &DataType;
    /// Takes the rows of `v` that `filter` selects (NULLs skipped) into their groups.
    fn fold(
        &mut self,
        v: &ArrayRef,
        groups: &[u32],
        filter: Option<&BooleanBuffer>,
        total_groups: usize,
    ) -> Result<(), ArrowError>;
}

/// [`GroupsAccumulator::update`] of an insert-only MIN/MAX.
fn update_by_fold(
    acc: &mut impl Fold,
    values: &[ArrayRef],
    groups: &[u32],
    filter: Option<&BooleanBuffer>,
    total_groups: usize,
) -> Result<(), ArrowError> {
    check_filter(filter, groups)?;
    let v = single_arg(values, groups, acc.arg_type())?;
    acc.fold(v, groups, filter, total_groups)
}

/// [`GroupsAccumulator::merge_at`] of an insert-only MIN/MAX: its state is its result column.
fn merge_by_fold(
    acc: &mut impl Fold,
    states: &[ArrayRef],
    offset: usize,
    groups: &[u32],
    total_groups: usize,
) -> Result<(), ArrowError> {
    let states = column_rows(states, offset, groups.len())?;
    let v = single_arg(&states, groups, acc.arg_type())?;
    acc.fold(v, groups, None, total_groups)
}

/// [`GroupsAccumulator::retract`] of an insert-only MIN/MAX: refused.
fn refuse_retract() -> Result<(), ArrowError> {
    Err(ArrowError::InvalidArgumentError(
        "MIN/MAX over insert-only input cannot retract; build it retractable".to_string(),
    ))
}

/// MIN/MAX over insert-only input: each group keeps its extreme value.
#[derive(Debug)]
pub struct MinMaxAccumulator<K: OrdValue> {
    data_type: DataType,
    is_max: bool,
    values: Vec<Option<K>>,
}

impl<K: OrdValue> MinMaxAccumulator<K> {
    /// A MIN (or MAX with `is_max`) over `data_type`.
    pub fn new(data_type: DataType, is_max: bool) -> Self {
        Self {
            data_type,
            is_max,
            values: vec![],
        }
    }
}

impl<K: OrdValue> Fold for MinMaxAccumulator<K> {
    fn arg_type(&self) -> &DataType {
        &self.data_type
    }
    fn fold(
        &mut self,
        v: &ArrayRef,
        groups: &[u32],
        filter: Option<&BooleanBuffer>,
        total_groups: usize,
    ) -> Result<(), ArrowError> {
        let arr = K::downcast(v)?;
        grow(&mut self.values, total_groups, None);
        let want = wins(self.is_max);
        let values = &mut self.values;
        for_each_selected(groups, K::nulls(arr), filter, |i, g| {
            let slot = &mut values[g as usize];
            match slot {
                Some(cur) if K::cmp_at(arr, i, cur) != want => {}
                _ => *slot = Some(K::own(arr, i)),
            }
        });
        Ok(())
    }
}

impl<K: OrdValue> GroupsAccumulator for MinMaxAccumulator<K> {
    fn update(
        &mut self,
        values: &[ArrayRef],
        groups: &[u32],
        filter: Option<&BooleanBuffer>,
        total_groups: usize,
    ) -> Result<(), ArrowError> {
        update_by_fold(self, values, groups, filter, total_groups)
    }
    fn retract(
        &mut self,
        _values: &[ArrayRef],
        _groups: &[u32],
        _filter: Option<&BooleanBuffer>,
        _total_groups: usize,
    ) -> Result<(), ArrowError> {
        refuse_retract()
    }
    fn merge_at(
        &mut self,
        states: &[ArrayRef],
        offset: usize,
        groups: &[u32],
        total_groups: usize,
    ) -> Result<(), ArrowError> {
        merge_by_fold(self, states, offset, groups, total_groups)
    }
    fn evaluate(&self, groups: &[u32]) -> Result<ArrayRef, ArrowError> {
        K::build(
            groups
                .iter()
                .map(|&g| self.values.get(g as usize).and_then(|v| v.as_ref())),
            &self.data_type,
        )
    }
    fn state(&self, groups: &[u32]) -> Result<Vec<ArrayRef>, ArrowError> {
        Ok(vec![self.evaluate(groups)?])
    }
    fn state_types(&self) -> Vec<DataType> {
        vec![self.data_type.clone()]
    }
    fn result_type(&self) -> DataType {
        self.data_type.clone()
    }
    fn reset(&mut self, groups: &[u32]) {
        for &g in groups {
            if let Some(v) = self.values.get_mut(g as usize) {
                *v = None;
            }
        }
    }
    fn size(&self) -> usize {
        self.values.capacity() * std::mem::size_of::<Option<K>>()
    }
}

/// The MIN/MAX accumulator for `$dt`: `$prim` with the type `$t` standing for the primitive
/// array type, or `$string` for strings.
macro_rules! dispatch_min_max {
    ($dt:expr, |$t:ident| $prim:expr, $string:expr) => {{
        macro_rules! p {
            ($ty:ty) => {{
                type $t = $ty;
                Box::new($prim) as Box<dyn GroupsAccumulator>
            }};
        }
        Ok(match $dt {
            DataType::Int8 => p!(Int8Type),
            DataType::Int16 => p!(Int16Type),
            DataType::Int32 => p!(Int32Type),
            DataType::Int64 => p!(Int64Type),
            DataType::UInt8 => p!(UInt8Type),
            DataType::UInt16 => p!(UInt16Type),
            DataType::UInt32 => p!(UInt32Type),
            DataType::UInt64 => p!(UInt64Type),
            DataType::Float32 => p!(Float32Type),
            DataType::Float64 => p!(Float64Type),
            DataType::Decimal128(_, _) => p!(Decimal128Type),
            DataType::Date32 => p!(Date32Type),
            DataType::Date64 => p!(Date64Type),
            DataType::Time32(TimeUnit::Second) => p!(Time32SecondType),
            DataType::Time32(TimeUnit::Millisecond) => p!(Time32MillisecondType),
            DataType::Time64(TimeUnit::Microsecond) => p!(Time64MicrosecondType),
            DataType::Time64(TimeUnit::Nanosecond) => p!(Time64NanosecondType),
            DataType::Timestamp(TimeUnit::Second, _) => p!(TimestampSecondType),
            DataType::Timestamp(TimeUnit::Millisecond, _) => p!(TimestampMillisecondType),
            DataType::Timestamp(TimeUnit::Microsecond, _) => p!(TimestampMicrosecondType),
            DataType::Timestamp(TimeUnit::Nanosecond, _) => p!(TimestampNanosecondType),
            DataType::Utf8 => Box::new($string) as Box<dyn GroupsAccumulator>,
            other => {
                return Err(ArrowError::NotYetImplemented(format!(
                    "MIN/MAX does not support type {other}"
                )));
            }
        })
    }};
}

/// Builds an insert-only MIN/MAX over `dt` (already cast to a supported type).
pub(crate) fn new_min_max(
    dt: &DataType,
    is_max: bool,
) -> Result<Box<dyn GroupsAccumulator>, ArrowError> {
    dispatch_min_max!(
        dt,
        |T| PrimMinMaxAccumulator::<T>::new(dt.clone(), is_max),
        MinMaxAccumulator::<Box<str>>::new(dt.clone(), is_max)
    )
}

/// Builds a retractable MIN/MAX over `dt` (already cast to a supported type).
pub(crate) fn new_min_max_retract(
    dt: &DataType,
    is_max: bool,
) -> Result<Box<dyn GroupsAccumulator>, ArrowError> {
    dispatch_min_max!(
        dt,
        |T| MinMaxRetractAccumulator::<PrimKey<T>>::new(dt.clone(), is_max),
        MinMaxRetractAccumulator::<Box<str>>::new(dt.clone(), is_max)
    )
}
