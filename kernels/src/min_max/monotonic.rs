//! MIN/MAX over a changelog whose argument only moves one way: Flink's monotonicity shortcut.
//!
//! Where a MAX's argument only grows (a MIN's only shrinks) across its changelog, as the
//! PARTIAL results a split-distinct FINAL takes over insert-only input do, an update's `-U old`
//! is always followed by a `+U new` that dominates it. Flink then plans the non-retract
//! function, whose retract does nothing (`MaxAggFunction`, "retract is a no-op"): a group keeps
//! only its extreme, not the multiset of values a retractable MIN/MAX needs
//! ([`super::MinMaxRetractAccumulator`]).

use arrow_array::ArrayRef;
use arrow_buffer::BooleanBuffer;
use arrow_schema::{ArrowError, DataType};

use crate::accumulator::{GroupsAccumulator, check_filter};

/// An insert-only MIN/MAX (`inner`) that takes retractions and ignores them.
#[derive(Debug)]
pub struct MonotonicAccumulator {
    inner: Box<dyn GroupsAccumulator>,
}

impl MonotonicAccumulator {
    /// Wraps `inner`, an insert-only MIN/MAX.
    pub fn new(inner: Box<dyn GroupsAccumulator>) -> Self {
        Self { inner }
    }
}

impl GroupsAccumulator for MonotonicAccumulator {
    fn update(
        &mut self,
        values: &[ArrayRef],
        groups: &[u32],
        filter: Option<&BooleanBuffer>,
        total_groups: usize,
    ) -> Result<(), ArrowError> {
        self.inner.update(values, groups, filter, total_groups)
    }

    /// Ignores the rows: the value they take back is dominated by the one that follows.
    fn retract(
        &mut self,
        values: &[ArrayRef],
        groups: &[u32],
        filter: Option<&BooleanBuffer>,
        _total_groups: usize,
    ) -> Result<(), ArrowError> {
        check_filter(filter, groups)?;
        match values {
            [v] if v.len() == groups.len() => Ok(()),
            _ => Err(ArrowError::InvalidArgumentError(
                "MIN/MAX retracts one argument as long as the group ids".to_string(),
            )),
        }
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
        self.inner.evaluate(groups)
    }

    fn state(&self, groups: &[u32]) -> Result<Vec<ArrayRef>, ArrowError> {
        self.inner.state(groups)
    }

    fn state_types(&self) -> Vec<DataType> {
        self.inner.state_types()
    }

    fn result_type(&self) -> DataType {
        self.inner.result_type()
    }

    fn reset(&mut self, groups: &[u32]) {
        self.inner.reset(groups);
    }

    fn size(&self) -> usize {
        self.inner.size()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::cast::AsArray;
    use arrow_array::types::Int64Type;
    use arrow_array::{Array, Int64Array, StringArray};

    use crate::aggregates::{AggregateKind, new_accumulator, new_monotonic_min_max};

    use super::*;

    /// A PARTIAL's changelog of growing maxima: the monotonic MAX ignores the `-U`s and ends
    /// where a retractable one does, keeping one value a group; a decrease (which a growing
    /// argument never makes) shows the difference: the monotonic MAX keeps the greater value.
    #[test]
    fn ignores_retractions_of_dominated_values() {
        let ints = |v: &[i64]| -> Vec<ArrayRef> { vec![Arc::new(Int64Array::from(v.to_vec()))] };
        let mut mono = new_monotonic_min_max(AggregateKind::Max, &DataType::Int64).unwrap();
        let mut retract =
            new_accumulator(AggregateKind::Max, Some(&DataType::Int64), true).unwrap();
        for acc in [&mut mono, &mut retract] {
            // +I 3 (group 0), +I 5 (group 1); -U 3 / +U 7 (group 0); -U 5 / +U 9 (group 1).
            acc.update(&ints(&[3, 5]), &[0, 1], None, 2).unwrap();
            acc.retract(&ints(&[3]), &[0], None, 2).unwrap();
            acc.update(&ints(&[7]), &[0], None, 2).unwrap();
            acc.retract(&ints(&[5]), &[1], None, 2).unwrap();
            acc.update(&ints(&[9]), &[1], None, 2).unwrap();
        }
        let result = |acc: &dyn GroupsAccumulator| -> Vec<i64> {
            acc.evaluate(&[0, 1])
                .unwrap()
                .as_primitive::<Int64Type>()
                .values()
                .to_vec()
        };
        assert_eq!(result(mono.as_ref()), vec![7, 9]);
        assert_eq!(result(retract.as_ref()), vec![7, 9]);
        // One state column of one value a group, not the retractable value lists.
        assert_eq!(mono.state_types(), vec![DataType::Int64]);
        // A decrease: the retractable MAX follows it, the monotonic one keeps 7.
        for acc in [&mut mono, &mut retract] {
            acc.retract(&ints(&[7]), &[0], None, 2).unwrap();
            acc.update(&ints(&[4]), &[0], None, 2).unwrap();
        }
        assert_eq!(result(mono.as_ref()), vec![7, 9]);
        assert_eq!(result(retract.as_ref()), vec![4, 9]);
    }

    /// Strings go through the factory's cast, and a MIN keeps the least value.
    #[test]
    fn a_monotonic_min_over_strings() {
        let strs = |v: &[&str]| -> Vec<ArrayRef> { vec![Arc::new(StringArray::from(v.to_vec()))] };
        let mut min = new_monotonic_min_max(AggregateKind::Min, &DataType::Utf8).unwrap();
        min.update(&strs(&["m", "k"]), &[0, 0], None, 1).unwrap();
        min.retract(&strs(&["k"]), &[0], None, 1).unwrap();
        min.update(&strs(&["c"]), &[0], None, 1).unwrap();
        let out = min.evaluate(&[0]).unwrap();
        assert_eq!(out.as_string::<i32>().value(0), "c");
        assert!(min.retract(&strs(&["a", "b"]), &[0], None, 1).is_err());
        assert!(new_monotonic_min_max(AggregateKind::Sum, &DataType::Int64).is_err());
        assert_eq!(out.len(), 1);
    }
}
