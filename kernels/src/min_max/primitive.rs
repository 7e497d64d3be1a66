//! MIN and MAX of a primitive type over insert-only input: each group's extreme in a flat vector
//! of natives, with a flag saying whether the group has one.

use arrow_array::{Array, ArrayRef, ArrowNativeTypeOp, ArrowPrimitiveType, PrimitiveArray};
use arrow_buffer::BooleanBuffer;
use arrow_schema::{ArrowError, DataType};

use super::{Fold, OrdValue, PrimKey, merge_by_fold, refuse_retract, update_by_fold, wins};
use crate::accumulate::for_each_selected;
use crate::accumulator::{GroupsAccumulator, grow};

/// MIN/MAX of a primitive type over insert-only input. A group's extreme is a native value
/// (8 bytes for a 64-bit type, where an `Option` took 16) and a `seen` flag, and a row's update
/// is a comparison and two stores, with no branch on whether the group had a value.
#[derive(Debug)]
pub struct PrimMinMaxAccumulator<T: ArrowPrimitiveType> {
    data_type: DataType,
    is_max: bool,
    values: Vec<T::Native>,
    /// Whether each group has a value (its result is NULL otherwise).
    seen: Vec<bool>,
}

impl<T: ArrowPrimitiveType> PrimMinMaxAccumulator<T> {
    /// A MIN (or MAX with `is_max`) over `data_type`, whose arrays are `T`'s.
    pub fn new(data_type: DataType, is_max: bool) -> Self {
        Self {
            data_type,
            is_max,
            values: vec![],
            seen: vec![],
        }
    }
}

impl<T: ArrowPrimitiveType + std::fmt::Debug> Fold for PrimMinMaxAccumulator<T> {
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
        let arr = PrimKey::<T>::downcast(v)?;
        grow(&mut self.values, total_groups, T::Native::default());
        grow(&mut self.seen, total_groups, false);
        let want = wins(self.is_max);
        let (values, seen) = (&mut self.values, &mut self.seen);
        let input = arr.values();
        let take = |i: usize, g: u32| {
            let g = g as usize;
            let v = input[i];
            let cur = values[g];
            values[g] = if !seen[g] || v.compare(cur) == want {
                v
            } else {
                cur
            };
            seen[g] = true;
        };
        for_each_selected(groups, arr.nulls(), filter, take);
        Ok(())
    }
}

impl<T: ArrowPrimitiveType + std::fmt::Debug> GroupsAccumulator for PrimMinMaxAccumulator<T> {
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
        let arr: PrimitiveArray<T> = groups
            .iter()
            .map(|&g| {
                let g = g as usize;
                self.seen
                    .get(g)
                    .copied()
                    .unwrap_or(false)
                    .then(|| self.values[g])
            })
            .collect();
        Ok(std::sync::Arc::new(
            arr.with_data_type(self.data_type.clone()),
        ))
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
            if let Some(s) = self.seen.get_mut(g as usize) {
                *s = false;
            }
        }
    }
    fn size(&self) -> usize {
        self.values.capacity() * std::mem::size_of::<T::Native>() + self.seen.capacity()
    }
}
