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
//! One table per argument holds an entry per live (group, value) pair: the value as 64 bits (a
//! primitive value's own bits; for other types, strings say, the id the value was interned
//! under once, [`crate::group_values`]), the group, its epoch and the counter (with several
//! sharing aggregates, the index of their counters). A row of a primitive argument so costs one
//! probe of one table, the entry holding everything it updates. A deleted group's entries are
//! invalidated in O(1) by bumping the group's epoch; stale entries are reset when the same pair
//! comes back.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::*;
use arrow_array::{Array, ArrayRef, Int64Array};
use arrow_buffer::{BooleanBuffer, BooleanBufferBuilder};
use arrow_schema::{ArrowError, DataType, Field, Fields};
use hashbrown::{HashMap, HashTable};

use crate::accumulator::GroupsAccumulator;
use crate::accumulator::{entry_lists, grow};
use crate::aggregates::{AggregateKind, new_accumulator};
use crate::group_values::{GroupValues, new_group_values};
use crate::hash::hash_columns;

mod bits;

use bits::{bits_type, from_bits, to_bits};

/// One live (group, value) pair.
#[derive(Debug, Clone, Copy)]
struct Entry {
    /// The value's bits, or its interned id.
    value: u64,
    /// The counter of the only aggregate, or with several the index of their counters in
    /// `DistinctAccumulator::counts`.
    count: i64,
    group: u32,
    /// The group's epoch when the entry was last written; an older one means the group was
    /// emptied since, and the counters are 0.
    epoch: u32,
}

/// The hash of a (group, value) pair: both mixed into 64 bits (the value bits of a primitive
/// argument are not hashed beforehand).
#[inline(always)]
fn pair_hash(group: u32, value: u64) -> u64 {
    let mut x = value.wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ u64::from(group).wrapping_mul(0xc2b2_ae3d_27d4_eb4f);
    // murmur3's finalizer: every output bit depends on every input bit.
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

/// How the values of the argument become an entry's 64 bits.
enum Values {
    /// A primitive of at most 64 bits: its bits (floats by their bits, as keys compare them).
    Bits,
    /// Anything else: interned once into value ids.
    Interned {
        table: Box<dyn GroupValues>,
        /// Scratch: row hashes of the batch at hand.
        hashes: Vec<u64>,
        /// Scratch: value ids of the batch at hand.
        vids: Vec<u32>,
    },
}

/// The DISTINCT aggregates over one argument, with their shared (group, value) → counters table.
pub struct DistinctAccumulator {
    arg_type: DataType,
    values: Values,
    table: HashTable<Entry>,
    /// With several aggregates, `counts[c * k + i]`: aggregate `i`'s counter of the entry
    /// whose `count` is `c`.
    counts: Vec<i64>,
    /// Free counter slots (several aggregates).
    free: Vec<u32>,
    group_epoch: Vec<u32>,
    inners: Vec<Box<dyn GroupsAccumulator>>,
    /// Whether the order in which an inner aggregate sees the values can change its result (a
    /// sum of floating-point values).
    order_matters: bool,
    /// Scratch: the values of the batch at hand as entry bits.
    bits: Vec<u64>,
}

impl std::fmt::Debug for DistinctAccumulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DistinctAccumulator")
            .field("arg_type", &self.arg_type)
            .field("entries", &self.table.len())
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
        let values = if bits_type(arg_type) {
            Values::Bits
        } else {
            Values::Interned {
                table: new_group_values(std::slice::from_ref(arg_type))?,
                hashes: vec![],
                vids: vec![],
            }
        };
        Ok(Self {
            arg_type: arg_type.clone(),
            values,
            table: HashTable::with_capacity(64),
            counts: vec![],
            free: vec![],
            group_epoch: vec![],
            inners,
            order_matters: arg_type.is_floating()
                && kinds.iter().any(|k| {
                    matches!(
                        k,
                        AggregateKind::Sum | AggregateKind::Sum0 | AggregateKind::Avg
                    )
                }),
            bits: vec![],
        })
    }

    /// The values of `array` as entry bits, into `self.bits` (interning them if need be).
    fn load_bits(&mut self, array: &ArrayRef) -> Result<(), ArrowError> {
        match &mut self.values {
            Values::Bits => to_bits(array.as_ref(), &mut self.bits),
            Values::Interned {
                table,
                hashes,
                vids,
            } => {
                let cols = [Arc::clone(array)];
                hash_columns(&cols, hashes)?;
                table.intern(&cols, hashes, vids)?;
                self.bits.clear();
                self.bits.extend(vids.iter().map(|&v| u64::from(v)));
                Ok(())
            }
        }
    }

    /// Adds `deltas(i)` to aggregate `i`'s counter of the pair `(group, value)` for every `i`
    /// it selects (None: not selected), creating the entry (or renewing a stale one) and
    /// dropping it once every counter is 0; `seen(i, before, after)` hears of each change.
    #[inline(always)]
    fn add(
        &mut self,
        group: u32,
        value: u64,
        delta: impl Fn(usize) -> Option<i64>,
        mut seen: impl FnMut(usize, i64, i64),
    ) {
        let k = self.inners.len();
        let epoch = self.group_epoch[group as usize];
        let h = pair_hash(group, value);
        let eq = |e: &Entry| e.group == group && e.value == value;
        let entry = match self.table.find_mut(h, eq) {
            Some(e) => {
                if e.epoch != epoch {
                    e.epoch = epoch;
                    if k == 1 {
                        e.count = 0;
                    } else {
                        let c = e.count as usize;
                        self.counts[c * k..(c + 1) * k].fill(0);
                    }
                }
                e
            }
            None => {
                let count = if k == 1 {
                    0
                } else {
                    let c = match self.free.pop() {
                        Some(c) => {
                            let c = c as usize;
                            self.counts[c * k..(c + 1) * k].fill(0);
                            c
                        }
                        None => {
                            self.counts.extend(std::iter::repeat_n(0, k));
                            self.counts.len() / k - 1
                        }
                    };
                    c as i64
                };
                let entry = Entry {
                    value,
                    count,
                    group,
                    epoch,
                };
                self.table
                    .insert_unique(h, entry, |e| pair_hash(e.group, e.value))
                    .into_mut()
            }
        };
        let empty = if k == 1 {
            if let Some(d) = delta(0) {
                let before = entry.count;
                entry.count += d;
                seen(0, before, entry.count);
            }
            entry.count == 0
        } else {
            let c = entry.count as usize;
            let counters = &mut self.counts[c * k..(c + 1) * k];
            for (i, counter) in counters.iter_mut().enumerate() {
                if let Some(d) = delta(i) {
                    let before = *counter;
                    *counter += d;
                    seen(i, before, *counter);
                }
            }
            counters.iter().all(|&n| n == 0)
        };
        if empty {
            if k > 1 {
                self.free.push(entry.count as u32);
            }
            if let Ok(e) = self.table.find_entry(h, eq) {
                e.remove();
            }
        }
    }

    /// The (group, value) entries held (live ones, and stale ones of emptied groups until
    /// they are reused or compacted away).
    pub fn entries(&self) -> usize {
        self.table.len()
    }

    /// The number of aggregates sharing the map.
    pub fn num_aggregates(&self) -> usize {
        self.inners.len()
    }

    /// The result type of aggregate `i`.
    pub fn result_type(&self, i: usize) -> DataType {
        self.inners[i].result_type()
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
        // No row selected by any aggregate (a split's Expand hands every set's rows to every
        // call, most of them filtered out whole): nothing to convert, intern or count.
        if !filters.is_empty()
            && filters
                .iter()
                .all(|f| f.is_some_and(|f| f.count_set_bits() == 0))
        {
            return Ok(());
        }
        let n = groups.len();
        self.load_bits(arg)?;
        let bits = std::mem::take(&mut self.bits);
        let nulls = arg.logical_nulls();
        let mut flips: Vec<BooleanBufferBuilder> = (0..k)
            .map(|_| {
                let mut b = BooleanBufferBuilder::new(n);
                b.append_n(n, false);
                b
            })
            .collect();
        let mut any_flip = vec![false; k];
        let unfiltered = filters.iter().all(Option::is_none);
        for (r, &g) in groups.iter().enumerate() {
            if nulls.as_ref().is_some_and(|nb| nb.is_null(r)) {
                continue;
            }
            let selected = |i: usize| filters[i].is_none_or(|f| f.value(r));
            if !unfiltered && !(0..k).any(selected) {
                continue;
            }
            self.add(
                g,
                bits[r],
                |i| selected(i).then_some(delta),
                |i, before, after| {
                    if (delta > 0 && before == 0 && after == 1)
                        || (delta < 0 && before == 1 && after == 0)
                    {
                        flips[i].set_bit(r, true);
                        any_flip[i] = true;
                    }
                },
            );
        }
        self.bits = bits;
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
        self.load_bits(&values)?;
        let bits = std::mem::take(&mut self.bits);
        let mk = || {
            let mut b = BooleanBufferBuilder::new(m);
            b.append_n(m, false);
            b
        };
        let mut gains: Vec<BooleanBufferBuilder> = (0..k).map(|_| mk()).collect();
        let mut losses: Vec<BooleanBufferBuilder> = (0..k).map(|_| mk()).collect();
        for (r, &g) in flat_groups.iter().enumerate() {
            self.add(
                g,
                bits[r],
                |i| Some(counters[i].value(start + r)),
                |i, before, after| {
                    if before <= 0 && after > 0 {
                        gains[i].set_bit(r, true);
                    } else if before > 0 && after <= 0 {
                        losses[i].set_bit(r, true);
                    }
                },
            );
        }
        self.bits = bits;
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

    /// The distinct map of each of `groups` (one list of entries per group), in the order of
    /// the values' bits (primitives) or ids (others), so that it does not depend on the table's
    /// history; for groups `0..n` in order (a local phase's flush) only where the order can
    /// change a result (a floating-point sum), in the table's order otherwise.
    ///
    /// # Errors
    /// When the state cannot be built.
    pub fn state(&self, groups: &[u32]) -> Result<ArrayRef, ArrowError> {
        if groups.iter().enumerate().all(|(i, &g)| g as usize == i) {
            return self.state_of_first(groups.len());
        }
        let k = self.inners.len();
        // Position of each requested group in the output.
        let mut slot: HashMap<u32, usize> = HashMap::with_capacity(groups.len());
        for (i, &g) in groups.iter().enumerate() {
            slot.entry(g).or_insert(i);
        }
        let mut per_slot: Vec<Vec<(u64, usize)>> = vec![vec![]; groups.len()];
        let mut found: Vec<Entry> = vec![];
        for e in &self.table {
            if self.group_epoch.get(e.group as usize) != Some(&e.epoch) {
                continue;
            }
            if let Some(&s) = slot.get(&e.group) {
                per_slot[s].push((e.value, found.len()));
                found.push(*e);
            }
        }
        let mut offsets = vec![0i32];
        let mut bits = vec![];
        let mut cols: Vec<Vec<i64>> = vec![vec![]; k];
        for (i, &g) in groups.iter().enumerate() {
            // A group asked for twice repeats its entries.
            let s = slot[&g];
            if s == i {
                per_slot[s].sort_unstable();
            }
            for &(value, at) in &per_slot[s] {
                bits.push(value);
                let e = &found[at];
                for (j, col) in cols.iter_mut().enumerate() {
                    col.push(if k == 1 {
                        e.count
                    } else {
                        self.counts[e.count as usize * k + j]
                    });
                }
            }
            offsets.push(bits.len() as i32);
        }
        self.lists(&bits, cols, offsets)
    }

    /// [`Self::state`] of groups `0..n` in order (a local phase's flush): the live entries
    /// placed by group in one counting pass, without a map or a list per group, and sorted by
    /// value (as [`Self::state`] orders them) only where the order of the values can change a
    /// result (a floating-point sum), so that the outcome does not depend on the table's history.
    fn state_of_first(&self, n: usize) -> Result<ArrayRef, ArrowError> {
        let k = self.inners.len();
        let live = |e: &&Entry| {
            (e.group as usize) < n && self.group_epoch.get(e.group as usize) == Some(&e.epoch)
        };
        let mut offsets = vec![0i32; n + 1];
        for e in self.table.iter().filter(live) {
            offsets[e.group as usize + 1] += 1;
        }
        for g in 0..n {
            offsets[g + 1] += offsets[g];
        }
        let total = offsets[n] as usize;
        let mut placed: Vec<(u64, i64)> = vec![(0, 0); total];
        let mut next: Vec<usize> = offsets[..n].iter().map(|&o| o as usize).collect();
        for e in self.table.iter().filter(live) {
            let at = &mut next[e.group as usize];
            placed[*at] = (e.value, e.count);
            *at += 1;
        }
        if self.order_matters {
            for g in 0..n {
                placed[offsets[g] as usize..offsets[g + 1] as usize].sort_unstable();
            }
        }
        let bits: Vec<u64> = placed.iter().map(|p| p.0).collect();
        let cols: Vec<Vec<i64>> = (0..k)
            .map(|j| {
                placed
                    .iter()
                    .map(|&(_, c)| {
                        if k == 1 {
                            c
                        } else {
                            self.counts[c as usize * k + j]
                        }
                    })
                    .collect()
            })
            .collect();
        self.lists(&bits, cols, offsets)
    }

    /// The list column of entries: values from their `bits`, the counters `cols`, cut by
    /// `offsets`.
    fn lists(
        &self,
        bits: &[u64],
        cols: Vec<Vec<i64>>,
        offsets: Vec<i32>,
    ) -> Result<ArrayRef, ArrowError> {
        let values = match &self.values {
            Values::Bits => from_bits(bits, &self.arg_type)?,
            Values::Interned { table, .. } => {
                let vids: Vec<u32> = bits.iter().map(|&b| b as u32).collect();
                table.keys(&vids)?.remove(0)
            }
        };
        let mut columns: Vec<ArrayRef> = vec![values];
        columns.extend(
            cols.into_iter()
                .map(|c| Arc::new(Int64Array::from(c)) as ArrayRef),
        );
        entry_lists(self.entry_fields(), columns, offsets)
    }

    /// Forgets every entry of groups `0..groups` and resets their inner aggregates, keeping the
    /// allocations: a local phase starts each mini-batch so, without growing its table again.
    pub fn clear(&mut self, groups: usize) {
        self.table.clear();
        self.counts.clear();
        self.free.clear();
        if let Values::Interned { table, .. } = &mut self.values {
            table.clear();
        }
        let all: Vec<u32> = (0..groups as u32).collect();
        for a in &mut self.inners {
            a.reset(&all);
        }
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

    /// Bytes held, from capacity: the table (an entry and its control byte per bucket), the
    /// counters of several aggregates, the interned values, the inner aggregates.
    pub fn size(&self) -> usize {
        let values = match &self.values {
            Values::Bits => 0,
            Values::Interned {
                table,
                hashes,
                vids,
            } => table.size() + hashes.capacity() * 8 + vids.capacity() * 4,
        };
        self.table.capacity() * (std::mem::size_of::<Entry>() + 1)
            + self.counts.capacity() * 8
            + self.free.capacity() * 4
            + self.group_epoch.capacity() * 4
            + self.bits.capacity() * 8
            + values
            + self.inners.iter().map(|a| a.size()).sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{Float64Array, Int64Array, ListArray, StructArray};

    /// The values of group 0's list in a state.
    fn listed(state: &ArrayRef) -> ArrayRef {
        let lists = state.as_any().downcast_ref::<ListArray>().unwrap();
        let entries = lists.value(0);
        let entries = entries.as_any().downcast_ref::<StructArray>().unwrap();
        Arc::clone(entries.column(0))
    }

    /// A local phase's flush (groups `0..n`) lists a floating-point SUM's values by their bits
    /// whatever order they came in, so that the merge adds them in one order; a COUNT's values
    /// come in the table's order, the same set.
    #[test]
    fn a_flush_orders_values_where_the_order_can_change_a_sum() {
        // `before` values first, then cleared (the table keeps its grown capacity, so its
        // order differs from a fresh table's), then `arg`.
        let state_after = |kind: AggregateKind, before: usize, arg: ArrayRef| {
            let mut acc = DistinctAccumulator::try_new(arg.data_type(), &[kind], true).unwrap();
            let filler = arrow_cast::cast(
                &(Arc::new(Int64Array::from_iter_values(0..before as i64)) as ArrayRef),
                arg.data_type(),
            )
            .unwrap();
            acc.apply(&filler, &vec![0; before], &[None], 1, 1).unwrap();
            acc.clear(1);
            acc.apply(&arg, &vec![0; arg.len()], &[None], 1, 1).unwrap();
            listed(&acc.state(&[0]).unwrap())
        };
        let floats = |v: Vec<f64>| Arc::new(Float64Array::from(v)) as ArrayRef;
        let values: Vec<f64> = (0..40).map(|i| f64::from(i) * 1.5e15 - 7.0).collect();
        let mut reversed = values.clone();
        reversed.reverse();
        let a = state_after(AggregateKind::Sum, 0, floats(values.clone()));
        let b = state_after(AggregateKind::Sum, 5000, floats(reversed));
        assert_eq!(&a, &b);
        let ints = |v: Vec<i64>| Arc::new(Int64Array::from(v)) as ArrayRef;
        let mut a: Vec<i64> = state_after(AggregateKind::Count, 5000, ints((0..100).collect()))
            .as_primitive::<Int64Type>()
            .values()
            .to_vec();
        a.sort_unstable();
        assert_eq!(a, (0..100).collect::<Vec<i64>>());
    }
}
