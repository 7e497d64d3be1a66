//! MIN/MAX with retraction: per group, a value → multiplicity multiset and its cached extreme
//! (Flink's `MaxWithRetractAggFunction`).

use std::cmp::Ordering;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{Array, ArrayRef, Int64Array};
use arrow_buffer::BooleanBuffer;
use arrow_schema::{ArrowError, DataType, Field, Fields};
use hashbrown::HashMap;

use super::{OrdValue, wins};
use crate::accumulate::for_each_selected;
use crate::accumulator::{
    GroupsAccumulator, check_filter, column_rows, entry_lists, grow, single_arg,
};

/// MIN/MAX with retraction: a value → multiplicity multiset per group.
///
/// Each group keeps a hash map of its values' multiplicities and a cached extreme. Accumulating a
/// value can only improve the extreme, so it updates the cache in O(1); only when the extreme's
/// multiplicity drops to zero does the group rescan its map, once per call (batch), at the end of
/// the call. So a row costs one hash-map update, and a rescan is paid per batch that removes a
/// group's extreme, not per row.
#[derive(Debug)]
pub struct MinMaxRetractAccumulator<K: OrdValue> {
    data_type: DataType,
    is_max: bool,
    maps: Vec<HashMap<K, i64>>,
    /// The extreme among values with a positive multiplicity (valid when not stale).
    extreme: Vec<Option<K>>,
    /// Groups whose extreme was removed in the current call.
    stale: Vec<u32>,
    is_stale: Vec<bool>,
    /// Entries across all maps, for [`GroupsAccumulator::size`].
    entries: usize,
}

impl<K: OrdValue> MinMaxRetractAccumulator<K> {
    /// A retractable MIN (or MAX with `is_max`) over `data_type`.
    pub fn new(data_type: DataType, is_max: bool) -> Self {
        Self {
            data_type,
            is_max,
            maps: vec![],
            extreme: vec![],
            stale: vec![],
            is_stale: vec![],
            entries: 0,
        }
    }

    fn grow_to(&mut self, total_groups: usize) {
        grow(&mut self.maps, total_groups, HashMap::new());
        grow(&mut self.extreme, total_groups, None);
        grow(&mut self.is_stale, total_groups, false);
    }

    /// Adds `delta` to the multiplicity of row `i` of `arr` in group `g`.
    #[inline]
    fn add(&mut self, g: usize, arr: K::Array<'_>, i: usize, delta: i64) {
        let map = &mut self.maps[g];
        let (before, after) = match K::lookup(map, arr, i) {
            Some(c) => {
                let before = *c;
                *c += delta;
                let after = *c;
                if after == 0 {
                    K::remove_at(map, arr, i);
                    self.entries -= 1;
                }
                (before, after)
            }
            None => {
                if delta != 0 {
                    map.insert(K::own(arr, i), delta);
                    self.entries += 1;
                }
                (0, delta)
            }
        };
        if before <= 0 && after > 0 {
            if !self.is_stale[g] {
                let better = match &self.extreme[g] {
                    None => true,
                    Some(e) => K::cmp_at(arr, i, e) == wins(self.is_max),
                };
                if better {
                    self.extreme[g] = Some(K::own(arr, i));
                }
            }
        } else if before > 0
            && after <= 0
            && !self.is_stale[g]
            && self.extreme[g]
                .as_ref()
                .is_some_and(|e| K::cmp_at(arr, i, e) == Ordering::Equal)
        {
            self.is_stale[g] = true;
            self.stale.push(g as u32);
        }
    }

    /// Recomputes the extreme of every group whose extreme was removed.
    fn refresh(&mut self) {
        for g in std::mem::take(&mut self.stale) {
            let g = g as usize;
            let present = self.maps[g].iter().filter(|(_, c)| **c > 0).map(|(k, _)| k);
            let best = if self.is_max {
                present.max()
            } else {
                present.min()
            };
            self.extreme[g] = best.cloned();
            self.is_stale[g] = false;
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
        let v = single_arg(values, groups, &self.data_type)?;
        let arr = K::downcast(v)?;
        self.grow_to(total_groups);
        for_each_selected(groups, K::nulls(arr), filter, |i, g| {
            self.add(g as usize, arr, i, delta);
        });
        self.refresh();
        Ok(())
    }

    fn entry_fields(&self) -> Fields {
        Fields::from(vec![
            Field::new("value", self.data_type.clone(), false),
            Field::new("count", DataType::Int64, false),
        ])
    }
}

impl<K: OrdValue> GroupsAccumulator for MinMaxRetractAccumulator<K> {
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
        let states = column_rows(states, offset, groups.len())?;
        let [state] = &states[..] else {
            return Err(ArrowError::InvalidArgumentError("bad MIN/MAX state".into()));
        };
        let list = state
            .as_list_opt::<i32>()
            .ok_or_else(|| ArrowError::InvalidArgumentError("bad MIN/MAX state".into()))?;
        if list.len() != groups.len() {
            return Err(ArrowError::InvalidArgumentError(
                "state and group ids differ in length".into(),
            ));
        }
        let entries = list.values().as_struct();
        let values = K::downcast(entries.column(0))?;
        let counts = entries
            .column(1)
            .as_primitive_opt::<Int64Type>()
            .ok_or_else(|| ArrowError::InvalidArgumentError("bad MIN/MAX state".into()))?;
        self.grow_to(total_groups);
        let offsets = list.value_offsets();
        for (i, &g) in groups.iter().enumerate() {
            for j in offsets[i] as usize..offsets[i + 1] as usize {
                self.add(g as usize, values, j, counts.value(j));
            }
        }
        self.refresh();
        Ok(())
    }
    fn evaluate(&self, groups: &[u32]) -> Result<ArrayRef, ArrowError> {
        K::build(
            groups
                .iter()
                .map(|&g| self.extreme.get(g as usize).and_then(Option::as_ref)),
            &self.data_type,
        )
    }
    fn state(&self, groups: &[u32]) -> Result<Vec<ArrayRef>, ArrowError> {
        let mut offsets = Vec::with_capacity(groups.len() + 1);
        offsets.push(0i32);
        let mut keys: Vec<&K> = vec![];
        let mut counts: Vec<i64> = vec![];
        let mut entries: Vec<(&K, i64)> = vec![];
        for &g in groups {
            if let Some(map) = self.maps.get(g as usize) {
                // Sorted, so that a state is the same whatever the hash map's order.
                entries.clear();
                entries.extend(map.iter().map(|(k, c)| (k, *c)));
                entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
                for &(k, c) in &entries {
                    keys.push(k);
                    counts.push(c);
                }
            }
            offsets.push(keys.len() as i32);
        }
        let values = K::build(keys.into_iter().map(Some), &self.data_type)?;
        let columns = vec![values, Arc::new(Int64Array::from(counts)) as ArrayRef];
        Ok(vec![entry_lists(self.entry_fields(), columns, offsets)?])
    }
    fn state_types(&self) -> Vec<DataType> {
        vec![DataType::List(Arc::new(Field::new_struct(
            "item",
            self.entry_fields(),
            false,
        )))]
    }
    fn result_type(&self) -> DataType {
        self.data_type.clone()
    }
    fn reset(&mut self, groups: &[u32]) {
        for &g in groups {
            let g = g as usize;
            if let Some(m) = self.maps.get_mut(g) {
                self.entries -= m.len();
                *m = HashMap::new();
                self.extreme[g] = None;
            }
        }
    }
    fn size(&self) -> usize {
        let per_entry = std::mem::size_of::<K>() + 8 + 1;
        self.maps.capacity() * std::mem::size_of::<HashMap<K, i64>>()
            + self
                .maps
                .iter()
                .map(|m| m.capacity() * per_entry)
                .sum::<usize>()
            + self.extreme.capacity() * std::mem::size_of::<Option<K>>()
            + self.is_stale.capacity()
    }
}
