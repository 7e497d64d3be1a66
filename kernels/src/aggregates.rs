//! The built-in aggregate functions: their kinds, their result types (Flink's), and the
//! accumulator each one builds over an argument type.

use arrow_array::ArrayRef;
use arrow_array::types::*;
use arrow_buffer::BooleanBuffer;
use arrow_schema::{ArrowError, DataType};

use crate::accumulator::GroupsAccumulator;
use crate::decimal::{DecimalAvg, DecimalSum};
use crate::min_max::{MonotonicAccumulator, new_min_max, new_min_max_retract};
use crate::numeric::{Avg, CountAccumulator, Sum, SumAccumulator};

/// The built-in aggregate functions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AggregateKind {
    /// `COUNT(*)`: rows, NULLs included.
    CountStar,
    /// `COUNT(x)`: non-NULL values.
    Count,
    /// `SUM(x)`: NULL when the group has no non-NULL value.
    Sum,
    /// `$SUM0(x)`: like SUM but 0 when empty.
    Sum0,
    /// `AVG(x)`.
    Avg,
    /// `MIN(x)`.
    Min,
    /// `MAX(x)`.
    Max,
}

impl AggregateKind {
    /// The name Flink prints for the function.
    pub fn name(self) -> &'static str {
        match self {
            AggregateKind::CountStar | AggregateKind::Count => "COUNT",
            AggregateKind::Sum => "SUM",
            AggregateKind::Sum0 => "$SUM0",
            AggregateKind::Avg => "AVG",
            AggregateKind::Min => "MIN",
            AggregateKind::Max => "MAX",
        }
    }
}

/// Whether `dt` is a numeric type SUM and AVG accept.
fn is_numeric(dt: &DataType) -> bool {
    matches!(
        dt,
        DataType::Int8
            | DataType::Int16
            | DataType::Int32
            | DataType::Int64
            | DataType::UInt8
            | DataType::UInt16
            | DataType::UInt32
            | DataType::UInt64
            | DataType::Float32
            | DataType::Float64
            | DataType::Decimal128(_, _)
    )
}

/// Whether MIN/MAX accept `dt` (after the casts [`min_max_input_type`] applies).
fn is_orderable(dt: &DataType) -> bool {
    is_numeric(dt)
        || matches!(
            dt,
            DataType::Boolean
                | DataType::Utf8
                | DataType::LargeUtf8
                | DataType::Utf8View
                | DataType::Date32
                | DataType::Date64
                | DataType::Time32(_)
                | DataType::Time64(_)
                | DataType::Timestamp(_, _)
        )
        || matches!(dt, DataType::Dictionary(_, v) if is_orderable(v))
}

/// The type a MIN/MAX result has: the argument's, or a dictionary's value type.
fn min_max_result_type(dt: &DataType) -> DataType {
    match dt {
        DataType::Dictionary(_, v) => min_max_result_type(v),
        other => other.clone(),
    }
}

/// The type MIN/MAX work on internally: strings as Utf8, booleans as UInt8.
fn min_max_input_type(dt: &DataType) -> DataType {
    match min_max_result_type(dt) {
        DataType::LargeUtf8 | DataType::Utf8View => DataType::Utf8,
        DataType::Boolean => DataType::UInt8,
        other => other,
    }
}

/// The result type of `kind` over an argument of type `arg` (None for `COUNT(*)`), following
/// Flink: COUNT is BIGINT; SUM keeps the argument type (DECIMAL(38, s) for decimals, NULL when
/// the sum overflows 38 digits; DECIMAL(76, s) over a DECIMAL256); AVG of an
/// integer is that integer type, of FLOAT/DOUBLE that type, of DECIMAL(p, s) DECIMAL(38, max(6, s));
/// MIN/MAX keep the argument type.
///
/// # Errors
/// When the function does not accept the type.
pub fn result_type(kind: AggregateKind, arg: Option<&DataType>) -> Result<DataType, ArrowError> {
    let unsupported = |dt: &DataType| {
        ArrowError::NotYetImplemented(format!("{} does not support type {dt}", kind.name()))
    };
    match (kind, arg) {
        (AggregateKind::CountStar, _) | (AggregateKind::Count, Some(_)) => Ok(DataType::Int64),
        (_, None) => Err(ArrowError::InvalidArgumentError(format!(
            "{} takes one argument",
            kind.name()
        ))),
        (AggregateKind::Sum | AggregateKind::Sum0, Some(dt)) => match dt {
            DataType::Decimal128(_, s) => Ok(DataType::Decimal128(38, *s)),
            // The split-distinct rewrite sums partial decimal sums exactly, as DECIMAL(76, s).
            DataType::Decimal256(_, s) => Ok(DataType::Decimal256(76, *s)),
            dt if is_numeric(dt) => Ok(dt.clone()),
            dt => Err(unsupported(dt)),
        },
        (AggregateKind::Avg, Some(dt)) => match dt {
            DataType::Decimal128(_, s) => Ok(DataType::Decimal128(38, (*s).max(6))),
            dt if is_numeric(dt) => Ok(dt.clone()),
            dt => Err(unsupported(dt)),
        },
        (AggregateKind::Min | AggregateKind::Max, Some(dt)) => {
            if is_orderable(dt) {
                Ok(min_max_result_type(dt))
            } else {
                Err(unsupported(dt))
            }
        }
    }
}

/// Builds the accumulator for `kind` over an argument of type `arg` (None for `COUNT(*)`).
/// `retractable` selects MIN/MAX with a value multiset (needed when the input has retractions);
/// the other functions always retract.
///
/// # Errors
/// When the function does not accept the type.
pub fn new_accumulator(
    kind: AggregateKind,
    arg: Option<&DataType>,
    retractable: bool,
) -> Result<Box<dyn GroupsAccumulator>, ArrowError> {
    let out = result_type(kind, arg)?;
    Ok(match (kind, arg) {
        (AggregateKind::CountStar, _) => Box::new(CountAccumulator::new(true)),
        (AggregateKind::Count, _) => Box::new(CountAccumulator::new(false)),
        (AggregateKind::Sum, Some(dt)) => new_sum(dt, false)?,
        (AggregateKind::Sum0, Some(dt)) => new_sum(dt, true)?,
        (AggregateKind::Avg, Some(dt)) => new_avg(dt)?,
        (AggregateKind::Min | AggregateKind::Max, Some(dt)) => {
            let is_max = kind == AggregateKind::Max;
            let inner_type = min_max_input_type(dt);
            let inner = if retractable {
                new_min_max_retract(&inner_type, is_max)?
            } else {
                new_min_max(&inner_type, is_max)?
            };
            if &inner_type == dt {
                inner
            } else {
                Box::new(CastAccumulator {
                    input: inner_type,
                    output: out,
                    inner,
                })
            }
        }
        (_, None) => unreachable!("result_type rejects a missing argument"),
    })
}

/// Builds a MIN or MAX (`kind`) over an argument of type `arg` for a changelog in which the
/// argument only moves the extreme's way (a MAX's grows, a MIN's shrinks): it ignores
/// retractions and keeps one value a group ([`crate::min_max::MonotonicAccumulator`]).
///
/// # Errors
/// When `kind` is not MIN or MAX, or MIN/MAX does not accept the type.
pub fn new_monotonic_min_max(
    kind: AggregateKind,
    arg: &DataType,
) -> Result<Box<dyn GroupsAccumulator>, ArrowError> {
    if !matches!(kind, AggregateKind::Min | AggregateKind::Max) {
        return Err(ArrowError::InvalidArgumentError(format!(
            "{} has no monotonic form (only MIN and MAX)",
            kind.name()
        )));
    }
    let inner = new_accumulator(kind, Some(arg), false)?;
    Ok(Box::new(MonotonicAccumulator::new(inner)))
}

/// Casts arguments to the type the inner accumulator works on, and results back.
#[derive(Debug)]
struct CastAccumulator {
    input: DataType,
    output: DataType,
    inner: Box<dyn GroupsAccumulator>,
}

impl CastAccumulator {
    fn cast_in(&self, values: &[ArrayRef]) -> Result<Vec<ArrayRef>, ArrowError> {
        values
            .iter()
            .map(|v| arrow_cast::cast(v, &self.input))
            .collect()
    }
}

impl GroupsAccumulator for CastAccumulator {
    fn update(
        &mut self,
        values: &[ArrayRef],
        groups: &[u32],
        filter: Option<&BooleanBuffer>,
        total_groups: usize,
    ) -> Result<(), ArrowError> {
        let v = self.cast_in(values)?;
        self.inner.update(&v, groups, filter, total_groups)
    }
    fn retract(
        &mut self,
        values: &[ArrayRef],
        groups: &[u32],
        filter: Option<&BooleanBuffer>,
        total_groups: usize,
    ) -> Result<(), ArrowError> {
        let v = self.cast_in(values)?;
        self.inner.retract(&v, groups, filter, total_groups)
    }
    fn merge_at(
        &mut self,
        states: &[ArrayRef],
        offset: usize,
        groups: &[u32],
        total_groups: usize,
    ) -> Result<(), ArrowError> {
        self.inner.merge_at(states, offset, groups, total_groups)
    }
    fn evaluate(&self, groups: &[u32]) -> Result<ArrayRef, ArrowError> {
        arrow_cast::cast(&self.inner.evaluate(groups)?, &self.output)
    }
    fn state(&self, groups: &[u32]) -> Result<Vec<ArrayRef>, ArrowError> {
        self.inner.state(groups)
    }
    fn state_types(&self) -> Vec<DataType> {
        self.inner.state_types()
    }
    fn result_type(&self) -> DataType {
        self.output.clone()
    }
    fn reset(&mut self, groups: &[u32]) {
        self.inner.reset(groups);
    }
    fn size(&self) -> usize {
        self.inner.size()
    }
}

/// Builds SUM (or `$SUM0` with `sum0`) over `dt`.
fn new_sum(dt: &DataType, sum0: bool) -> Result<Box<dyn GroupsAccumulator>, ArrowError> {
    macro_rules! sum {
        ($t:ty) => {
            Box::new(SumAccumulator::new(Sum::<$t>::new(dt.clone(), sum0)))
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
        DataType::Decimal128(_, s) => Box::new(SumAccumulator::new(
            DecimalSum::<Decimal128Type>::new(dt.clone(), *s, sum0),
        )),
        DataType::Decimal256(_, s) => Box::new(SumAccumulator::new(
            DecimalSum::<Decimal256Type>::new(dt.clone(), *s, sum0),
        )),
        other => {
            return Err(ArrowError::NotYetImplemented(format!(
                "SUM does not support type {other}"
            )));
        }
    })
}

/// Builds AVG over `dt`.
fn new_avg(dt: &DataType) -> Result<Box<dyn GroupsAccumulator>, ArrowError> {
    macro_rules! avg {
        ($t:ty) => {
            Box::new(SumAccumulator::new(Avg::<$t>::new(dt.clone())))
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
        DataType::Decimal128(p, s) => Box::new(SumAccumulator::new(DecimalAvg::new(*p, *s))),
        other => {
            return Err(ArrowError::NotYetImplemented(format!(
                "AVG does not support type {other}"
            )));
        }
    })
}
