//! DISTINCT aggregates: one value → count map per group, shared by every DISTINCT aggregate over
//! the same argument.
//!
//! Each sharing aggregate `i` has its own counter per (group, value): rows that pass aggregate
//! `i`'s FILTER add to it (accumulate) or take from it (retract). The inner aggregate (COUNT, SUM,
//! AVG, …) sees a value when its counter goes 0 → 1 and loses it when it goes 1 → 0, exactly as
//! Flink's `DistinctAggCodeGen` with retraction input; insert-only input is the special case
//! where counters only grow. Counters are not floored at 0, so a retraction that precedes its
//! accumulation (possible in a local phase) cancels out when the accumulation arrives.
//!
//! NULL values are skipped: every inner function ignores NULLs, so they cannot change a result.
//!
//! Distinct values are interned once ([`crate::group_values`]) into value ids; the map is keyed
//! by `(group id, value id)`. A deleted group's entries are invalidated in O(1) by bumping the
//! group's epoch; stale entries are reused when the same pair comes back.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{Array, ArrayRef, GenericListArray, Int64Array, StructArray};
use arrow_buffer::{BooleanBuffer, BooleanBufferBuilder, OffsetBuffer, ScalarBuffer};
use arrow_schema::{ArrowError, DataType, Field, Fields};
use hashbrown::HashMap;

use crate::accumulator::GroupsAccumulator;
use crate::accumulator::grow;
use crate::aggregates::{AggregateKind, new_accumulator};
use crate::group_values::{GroupValues, new_group_values};
use crate::hash::hash_columns;

/// The DISTINCT aggregates over one argument, with their shared value → counters map.
pub struct DistinctAccumulator {
    arg_type: DataType,
    values: Box<dyn GroupValues>,
    /// `(group << 32) | value id` → entry index.
    map: HashMap<u64, u32>,
    /// `counts[entry * k + i]`: aggregate `i`'s counter.
    counts: Vec<i64>,
    /// The group epoch each entry was written in.
    entry_epoch: Vec<u32>,
    /// The map key each entry belongs to (for state and reuse).
    entry_key: Vec<u64>,
    free: Vec<u32>,
    group_epoch: Vec<u32>,
    inners: Vec<Box<dyn GroupsAccumulator>>,
    /// Scratch: row hashes and value ids of the batch at hand.
    hashes: Vec<u64>,
    vids: Vec<u32>,
}

impl std::fmt::Debug for DistinctAccumulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DistinctAccumulator")
            .field("arg_type", &self.arg_type)
            .field("entries", &self.map.len())
            .field("inners", &self.inners)
            .finish()
    }
}

impl DistinctAccumulator {
    /// DISTINCT aggregates `kinds` over one argument of type `arg_type`. `retractable` as in
    /// [`new_accumulator`].
    ///
    /// # Errors
    /// When the type cannot be a distinct key or an inner function does not accept it.
    pub fn try_new(
        arg_type: &DataType,
        kinds: &[AggregateKind],
        retractable: bool,
    ) -> Result<Self, ArrowError> {
        if kinds.is_empty() || kinds.contains(&AggregateKind::CountStar) {
            return Err(ArrowError::InvalidArgumentError(
                "DISTINCT needs aggregates over an argument".into(),
            ));
        }
        let inners = kinds
            .iter()
            .map(|&k| new_accumulator(k, Some(arg_type), retractable))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            arg_type: arg_type.clone(),
            values: new_group_values(std::slice::from_ref(arg_type))?,
            map: HashMap::new(),
            counts: vec![],
            entry_epoch: vec![],
            entry_key: vec![],
            free: vec![],
            group_epoch: vec![],
            inners,
            hashes: vec![],
            vids: vec![],
        })
    }

    /// The number of aggregates sharing the map.
    pub fn num_aggregates(&self) -> usize {
        self.inners.len()
    }

    /// The result type of aggregate `i`.
    pub fn result_type(&self, i: usize) -> DataType {
        self.inners[i].result_type()
    }

    /// Finds or creates the entry of `key` in the current epoch of its group.
    fn entry(&mut self, key: u64, epoch: u32) -> usize {
        let k = self.inners.len();
        if let Some(&e) = self.map.get(&key) {
            let e = e as usize;
            if self.entry_epoch[e] != epoch {
                self.entry_epoch[e] = epoch;
                self.counts[e * k..(e + 1) * k].fill(0);
            }
            return e;
        }
        let e = match self.free.pop() {
            Some(e) => {
                let e = e as usize;
                self.entry_epoch[e] = epoch;
                self.entry_key[e] = key;
                self.counts[e * k..(e + 1) * k].fill(0);
                e
            }
            None => {
                self.entry_epoch.push(epoch);
                self.entry_key.push(key);
                self.counts.extend(std::iter::repeat_n(0, k));
                self.entry_epoch.len() - 1
            }
        };
        self.map.insert(key, e as u32);
        e
    }

    fn release_if_empty(&mut self, e: usize) {
        let k = self.inners.len();
        if self.counts[e * k..(e + 1) * k].iter().all(|&c| c == 0) {
            self.map.remove(&self.entry_key[e]);
            self.free.push(e as u32);
        }
    }

    /// Adds `delta` per selected row (accumulate with +1, retract with −1). `filters[i]` selects
    /// the rows of aggregate `i` (None: all rows).
    ///
    /// # Errors
    /// When the argument's type or length is wrong.
    pub fn apply(
        &mut self,
        arg: &ArrayRef,
        groups: &[u32],
        filters: &[Option<&BooleanBuffer>],
        total_groups: usize,
        delta: i64,
    ) -> Result<(), ArrowError> {
        let k = self.inners.len();
        if filters.len() != k {
            return Err(ArrowError::InvalidArgumentError(format!(
                "expected {k} filters, got {}",
                filters.len()
            )));
        }
        if arg.data_type() != &self.arg_type || arg.len() != groups.len() {
            return Err(ArrowError::InvalidArgumentError(format!(
                "DISTINCT expected {} rows of {}, got {} rows of {}",
                groups.len(),
                self.arg_type,
                arg.len(),
                arg.data_type()
            )));
        }
        if filters.iter().flatten().any(|f| f.len() != groups.len()) {
            return Err(ArrowError::InvalidArgumentError(
                "filter and group ids differ in length".into(),
            ));
        }
        grow(&mut self.group_epoch, total_groups, 0);
        let n = groups.len();
        let cols = [Arc::clone(arg)];
        hash_columns(&cols, &mut self.hashes)?;
        let mut vids = std::mem::take(&mut self.vids);
        self.values.intern(&cols, &self.hashes, &mut vids)?;
        let nulls = arg.logical_nulls();
        let mut flips: Vec<BooleanBufferBuilder> = (0..k)
            .map(|_| {
                let mut b = BooleanBufferBuilder::new(n);
                b.append_n(n, false);
                b
            })
            .collect();
        let mut any_flip = vec![false; k];
        for (r, &g) in groups.iter().enumerate() {
            if nulls.as_ref().is_some_and(|nb| nb.is_null(r)) {
                continue;
            }
            let selected = |i: usize| filters[i].is_none_or(|f| f.value(r));
            if !(0..k).any(selected) {
                continue;
            }
            let key = (u64::from(g) << 32) | u64::from(vids[r]);
            let e = self.entry(key, self.group_epoch[g as usize]);
            for i in 0..k {
                if !selected(i) {
                    continue;
                }
                let c = &mut self.counts[e * k + i];
                let before = *c;
                *c += delta;
                if (delta > 0 && *c == 1 && before == 0) || (delta < 0 && before == 1 && *c == 0) {
                    flips[i].set_bit(r, true);
                    any_flip[i] = true;
                }
            }
            self.release_if_empty(e);
        }
        self.vids = vids;
        let arg_slice = std::slice::from_ref(arg);
        for (i, mut flip) in flips.into_iter().enumerate() {
            if !any_flip[i] {
                continue;
            }
            let mask = flip.finish();
            if delta > 0 {
                self.inners[i].update(arg_slice, groups, Some(&mask), total_groups)?;
            } else {
                self.inners[i].retract(arg_slice, groups, Some(&mask), total_groups)?;
            }
        }
        Ok(())
    }

    /// Merges distinct states (as produced by [`Self::state`]) into `groups`, row by row, with
    /// Flink's counter merge: aggregate `i` gains a value when its counter goes from ≤ 0 to > 0
    /// and loses it when it goes from > 0 to ≤ 0.
    ///
    /// # Errors
    /// When `state` is not a distinct state of this argument type.
    pub fn merge(
        &mut self,
        state: &ArrayRef,
        groups: &[u32],
        total_groups: usize,
    ) -> Result<(), ArrowError> {
        let k = self.inners.len();
        let bad = || ArrowError::InvalidArgumentError("bad DISTINCT state".into());
        let list = state.as_list_opt::<i32>().ok_or_else(bad)?;
        if list.len() != groups.len() {
            return Err(bad());
        }
        let entries = list.values().as_struct_opt().ok_or_else(bad)?;
        if entries.num_columns() != k + 1 {
            return Err(bad());
        }
        let values = entries.column(0);
        let counters = (0..k)
            .map(|i| {
                entries
                    .column(i + 1)
                    .as_primitive_opt::<Int64Type>()
                    .ok_or_else(bad)
            })
            .collect::<Result<Vec<_>, _>>()?;
        // One flattened row per (group, value) entry.
        let offsets = list.value_offsets();
        let start = offsets[0] as usize;
        let end = offsets[groups.len()] as usize;
        let values = values.slice(start, end - start);
        let mut flat_groups = Vec::with_capacity(end - start);
        for (i, &g) in groups.iter().enumerate() {
            let len = (offsets[i + 1] - offsets[i]) as usize;
            flat_groups.extend(std::iter::repeat_n(g, len));
        }
        grow(&mut self.group_epoch, total_groups, 0);
        let m = flat_groups.len();
        let cols = [Arc::clone(&values)];
        hash_columns(&cols, &mut self.hashes)?;
        let mut vids = std::mem::take(&mut self.vids);
        self.values.intern(&cols, &self.hashes, &mut vids)?;
        let mk = || {
            let mut b = BooleanBufferBuilder::new(m);
            b.append_n(m, false);
            b
        };
        let mut gains: Vec<BooleanBufferBuilder> = (0..k).map(|_| mk()).collect();
        let mut losses: Vec<BooleanBufferBuilder> = (0..k).map(|_| mk()).collect();
        for (r, &g) in flat_groups.iter().enumerate() {
            let key = (u64::from(g) << 32) | u64::from(vids[r]);
            let e = self.entry(key, self.group_epoch[g as usize]);
            for i in 0..k {
                let other = counters[i].value(start + r);
                let c = &mut self.counts[e * k + i];
                let before = *c;
                *c += other;
                if before <= 0 && *c > 0 {
                    gains[i].set_bit(r, true);
                } else if before > 0 && *c <= 0 {
                    losses[i].set_bit(r, true);
                }
            }
            self.release_if_empty(e);
        }
        self.vids = vids;
        let arg_slice = std::slice::from_ref(&values);
        for i in 0..k {
            let gain = gains[i].finish();
            let loss = losses[i].finish();
            if gain.count_set_bits() > 0 {
                self.inners[i].update(arg_slice, &flat_groups, Some(&gain), total_groups)?;
            }
            if loss.count_set_bits() > 0 {
                self.inners[i].retract(arg_slice, &flat_groups, Some(&loss), total_groups)?;
            }
        }
        Ok(())
    }

    /// The result of every sharing aggregate for `groups`: one array per aggregate.
    ///
    /// # Errors
    /// As [`GroupsAccumulator::evaluate`].
    pub fn evaluate(&self, groups: &[u32]) -> Result<Vec<ArrayRef>, ArrowError> {
        self.inners.iter().map(|a| a.evaluate(groups)).collect()
    }

    fn entry_fields(&self) -> Fields {
        let mut fields = vec![Field::new("value", self.arg_type.clone(), false)];
        for i in 0..self.inners.len() {
            fields.push(Field::new(format!("count{i}"), DataType::Int64, false));
        }
        Fields::from(fields)
    }

    /// The type of [`Self::state`]: a list of `{value, count0, …}` entries per group.
    pub fn state_type(&self) -> DataType {
        DataType::List(Arc::new(Field::new_struct(
            "item",
            self.entry_fields(),
            false,
        )))
    }

    /// The distinct map of each of `groups` (one list of entries per group), in value-id order.
    ///
    /// # Errors
    /// When the state cannot be built.
    pub fn state(&self, groups: &[u32]) -> Result<ArrayRef, ArrowError> {
        let k = self.inners.len();
        // Position of each requested group in the output.
        let mut slot: HashMap<u32, usize> = HashMap::with_capacity(groups.len());
        for (i, &g) in groups.iter().enumerate() {
            slot.entry(g).or_insert(i);
        }
        let mut per_slot: Vec<Vec<(u32, usize)>> = vec![vec![]; groups.len()];
        for (&key, &e) in &self.map {
            let g = (key >> 32) as u32;
            let e = e as usize;
            if self.group_epoch.get(g as usize) != Some(&self.entry_epoch[e]) {
                continue;
            }
            if let Some(&s) = slot.get(&g) {
                per_slot[s].push((key as u32, e));
            }
        }
        let mut offsets = vec![0i32];
        let mut vids = vec![];
        let mut cols: Vec<Vec<i64>> = vec![vec![]; k];
        for (i, &g) in groups.iter().enumerate() {
            // A group asked for twice repeats its entries.
            let s = slot[&g];
            if s == i {
                per_slot[s].sort_unstable();
            }
            for &(vid, e) in &per_slot[s] {
                vids.push(vid);
                for (j, col) in cols.iter_mut().enumerate() {
                    col.push(self.counts[e * k + j]);
                }
            }
            offsets.push(vids.len() as i32);
        }
        let values = self.values.keys(&vids)?.remove(0);
        let mut columns: Vec<ArrayRef> = vec![values];
        columns.extend(
            cols.into_iter()
                .map(|c| Arc::new(Int64Array::from(c)) as ArrayRef),
        );
        let entries = StructArray::try_new(self.entry_fields(), columns, None)?;
        let list = GenericListArray::<i32>::try_new(
            Arc::new(Field::new_struct("item", self.entry_fields(), false)),
            OffsetBuffer::new(ScalarBuffer::from(offsets)),
            Arc::new(entries),
            None,
        )?;
        Ok(Arc::new(list))
    }

    /// Empties `groups`: their entries become stale and the inner aggregates reset.
    pub fn reset(&mut self, groups: &[u32]) {
        for &g in groups {
            if let Some(e) = self.group_epoch.get_mut(g as usize) {
                *e = e.wrapping_add(1);
            }
        }
        for a in &mut self.inners {
            a.reset(groups);
        }
    }

    /// Bytes held, from capacity.
    pub fn size(&self) -> usize {
        self.values.size()
            + self.map.capacity() * (8 + 4 + 1)
            + self.counts.capacity() * 8
            + self.entry_epoch.capacity() * 4
            + self.entry_key.capacity() * 8
            + self.free.capacity() * 4
            + self.group_epoch.capacity() * 4
            + self.hashes.capacity() * 8
            + self.vids.capacity() * 4
            + self.inners.iter().map(|a| a.size()).sum::<usize>()
    }
}
