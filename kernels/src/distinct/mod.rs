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
//! One table per argument ([`pairs`]) holds a 16-byte entry per live (group, value) pair: the
//! value's 64 bits, the group's id in the table and a 32-bit counter (with several sharing
//! aggregates, the index of their 64-bit counters; a counter that outgrows 32 bits moves to a
//! side map). The 64 bits are a primitive value's own bits or, for other types (strings, say),
//! the id the value was interned under once ([`crate::group_values`]). A row of a primitive
//! argument so costs one probe of one table, whose entry holds everything the row updates. An
//! emptied group's pairs are dropped in O(1) by giving the group a fresh id; the pairs left
//! under old ids are purged once they are half the table.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::*;
use arrow_array::{Array, ArrayRef, Int64Array};
use arrow_buffer::{BooleanBuffer, BooleanBufferBuilder};
use arrow_schema::{ArrowError, DataType, Field, Fields};
use hashbrown::HashMap;

use crate::accumulator::GroupsAccumulator;
use crate::accumulator::entry_lists;
use crate::aggregates::{AggregateKind, new_accumulator};
use crate::group_values::{GroupValues, new_group_values};
use crate::hash::hash_columns;

mod bits;
mod pairs;

use bits::{bits_type, from_bits, to_bits};
use pairs::{Pair, PairTable, pair_hash};

/// No group has this id: the top of the id space, below which fresh ids are counted down.
const NO_ID: u32 = u32::MAX;

/// A 32-bit counter of one aggregate that lives in `DistinctAccumulator::wide`.
const SPILLED: i32 = i32::MIN;

/// Pairs under old ids are purged once they are at least this many (and half the table).
const PURGE_MIN_STALE: usize = 4096;

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
    table: PairTable,
    /// Each group's id in the table: its own number until it is emptied, then a fresh id,
    /// counted down from the top of the id space.
    ids: Vec<u32>,
    /// The group of each fresh id: `owners[i]` for id `NO_ID - 1 - i`.
    owners: Vec<u32>,
    /// The pairs each group holds under its current id.
    pairs_of: Vec<u32>,
    /// Pairs held under ids no longer current (of emptied groups), until purged.
    stale: usize,
    /// One aggregate's counters that do not fit 32 bits, by (id, value).
    wide: HashMap<(u32, u64), i64>,
    /// With several aggregates, `counts[c * k + i]`: aggregate `i`'s counter of the pair
    /// whose entry's counter is `c`.
    counts: Vec<i64>,
    /// Free counter slots (several aggregates).
    free: Vec<u32>,
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

/// The group whose id is `id`: a fresh id's owner, or the group of that number.
fn owner(owners: &[u32], id: u32) -> u32 {
    owners.get((NO_ID - 1 - id) as usize).copied().unwrap_or(id)
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
            table: PairTable::default(),
            ids: vec![],
            owners: vec![],
            pairs_of: vec![],
            stale: 0,
            wide: HashMap::new(),
            counts: vec![],
            free: vec![],
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

    /// Makes room for groups `0..total`: each new group's id is its number.
    fn grow_groups(&mut self, total: usize) -> Result<(), ArrowError> {
        if total <= self.ids.len() {
            return Ok(());
        }
        if total + self.owners.len() >= NO_ID as usize {
            if total >= NO_ID as usize {
                return Err(ArrowError::InvalidArgumentError(format!(
                    "DISTINCT over {total} groups: at most {} are supported",
                    NO_ID - 1
                )));
            }
            // The groups' numbers would reach the fresh ids.
            self.purge();
        }
        let from = self.ids.len() as u32;
        self.ids.extend(from..total as u32);
        self.pairs_of.resize(total, 0);
        Ok(())
    }

    /// The group of a pair's `id` if the id is the group's current one (its pairs are live).
    fn live_group(&self, id: u32) -> Option<u32> {
        let g = owner(&self.owners, id);
        (self.ids.get(g as usize) == Some(&id)).then_some(g)
    }

    /// The counter of one aggregate held in bucket `at` by the pair (id, value).
    #[inline(always)]
    fn count_at(&self, at: usize, id: u32, value: u64) -> i64 {
        match self.table.get(at).count {
            SPILLED => self.wide[&(id, value)],
            c => i64::from(c),
        }
    }

    /// Sets one aggregate's counter of the pair (id, value) in bucket `at`.
    #[inline(always)]
    fn set_count(&mut self, at: usize, id: u32, value: u64, count: i64) {
        let slot = self.table.count_mut(at);
        match i32::try_from(count) {
            Ok(c) if c != SPILLED => {
                if *slot == SPILLED {
                    self.wide.remove(&(id, value));
                }
                *slot = c;
            }
            _ => {
                *slot = SPILLED;
                self.wide.insert((id, value), count);
            }
        }
    }

    /// The counter a listed pair holds: one aggregate's count, or with several the index of
    /// their counters.
    fn counter_of(&self, s: &Pair) -> i64 {
        match (self.inners.len(), s.count) {
            (1, SPILLED) => self.wide[&(s.id, s.value)],
            (1, c) => i64::from(c),
            (_, c) => i64::from(c as u32),
        }
    }

    /// Adds `deltas(i)` to aggregate `i`'s counter of the pair `(group, value)` for every `i`
    /// it selects (None: not selected), creating the pair and dropping it once every counter
    /// is 0; `seen(i, before, after)` hears of each change.
    #[inline(always)]
    fn add(
        &mut self,
        group: u32,
        value: u64,
        delta: impl Fn(usize) -> Option<i64>,
        mut seen: impl FnMut(usize, i64, i64),
    ) {
        let k = self.inners.len();
        let id = self.ids[group as usize];
        let (pos, inserted) = self
            .table
            .find_or_insert(pair_hash(id, value), id, value, 0);
        if inserted {
            self.pairs_of[group as usize] += 1;
            if k > 1 {
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
                *self.table.count_mut(pos) = c as u32 as i32;
            }
        }
        let empty = if k == 1 {
            let before = self.count_at(pos, id, value);
            match delta(0) {
                Some(d) => {
                    let after = before + d;
                    self.set_count(pos, id, value, after);
                    seen(0, before, after);
                    after == 0
                }
                None => before == 0,
            }
        } else {
            let c = self.table.get(pos).count as u32 as usize;
            let counters = &mut self.counts[c * k..(c + 1) * k];
            for (i, counter) in counters.iter_mut().enumerate() {
                if let Some(d) = delta(i) {
                    let before = *counter;
                    *counter += d;
                    seen(i, before, *counter);
                }
            }
            let empty = counters.iter().all(|&n| n == 0);
            if empty {
                self.free.push(c as u32);
            }
            empty
        };
        if empty {
            self.table.remove_at(pos);
            self.pairs_of[group as usize] -= 1;
        }
    }

    /// Keeps only the pairs under current ids, and gives every group its own number as id
    /// again (no fresh ids left).
    fn purge(&mut self) {
        let (ids, owners) = (&self.ids, &self.owners);
        let mut old_wide = std::mem::take(&mut self.wide);
        let wide = &mut self.wide;
        self.table.rebuild(|p| {
            let g = owner(owners, p.id);
            if ids.get(g as usize) != Some(&p.id) {
                return None;
            }
            if p.count == SPILLED
                && let Some(c) = old_wide.remove(&(p.id, p.value))
            {
                wide.insert((g, p.value), c);
            }
            Some(Pair { id: g, ..p })
        });
        for (g, id) in self.ids.iter_mut().enumerate() {
            *id = g as u32;
        }
        self.owners.clear();
        self.stale = 0;
    }

    /// The (group, value) pairs held: live ones, and those of emptied groups until they are
    /// purged.
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
        self.grow_groups(total_groups)?;
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
        self.grow_groups(total_groups)?;
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
        // Each requested group's (value, counter) pairs.
        let mut per_slot: Vec<Vec<(u64, i64)>> = vec![vec![]; groups.len()];
        for e in self.table.iter() {
            if let Some(&s) = self.live_group(e.id).and_then(|g| slot.get(&g)) {
                per_slot[s].push((e.value, self.counter_of(e)));
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
            for &(value, c) in &per_slot[s] {
                bits.push(value);
                for (j, col) in cols.iter_mut().enumerate() {
                    col.push(if k == 1 {
                        c
                    } else {
                        self.counts[c as usize * k + j]
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
        let live = |e: &Pair| self.live_group(e.id).filter(|&g| (g as usize) < n);
        let mut offsets = vec![0i32; n + 1];
        for g in self.table.iter().filter_map(live) {
            offsets[g as usize + 1] += 1;
        }
        for g in 0..n {
            offsets[g + 1] += offsets[g];
        }
        let total = offsets[n] as usize;
        let mut placed: Vec<(u64, i64)> = vec![(0, 0); total];
        let mut next: Vec<usize> = offsets[..n].iter().map(|&o| o as usize).collect();
        for e in self.table.iter() {
            if let Some(g) = live(e) {
                let at = &mut next[g as usize];
                placed[*at] = (e.value, self.counter_of(e));
                *at += 1;
            }
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
        self.wide.clear();
        for (g, id) in self.ids.iter_mut().enumerate() {
            *id = g as u32;
        }
        self.owners.clear();
        self.pairs_of.fill(0);
        self.stale = 0;
        if let Values::Interned { table, .. } = &mut self.values {
            table.clear();
        }
        let all: Vec<u32> = (0..groups as u32).collect();
        for a in &mut self.inners {
            a.reset(&all);
        }
    }

    /// Empties `groups`: each one holding pairs takes a fresh id (its pairs under the old one
    /// are left for a purge) and the inner aggregates reset.
    pub fn reset(&mut self, groups: &[u32]) {
        for &g in groups {
            let g = g as usize;
            if self.pairs_of.get(g).is_none_or(|&n| n == 0) {
                continue;
            }
            if self.ids.len() + self.owners.len() + 1 >= NO_ID as usize {
                self.purge();
            }
            self.stale += self.pairs_of[g] as usize;
            self.pairs_of[g] = 0;
            self.ids[g] = NO_ID - 1 - self.owners.len() as u32;
            self.owners.push(g as u32);
        }
        if self.stale >= PURGE_MIN_STALE && self.stale * 2 >= self.table.len() {
            self.purge();
        }
        for a in &mut self.inners {
            a.reset(groups);
        }
    }

    /// Bytes held, from capacity: the table (17 bytes a bucket), each group's id and pair count,
    /// the counters of several aggregates and those past 32 bits, the interned values, the
    /// inner aggregates, the scratch.
    pub fn size(&self) -> usize {
        let values = match &self.values {
            Values::Bits => 0,
            Values::Interned {
                table,
                hashes,
                vids,
            } => table.size() + hashes.capacity() * 8 + vids.capacity() * 4,
        };
        self.table.bytes()
            + (self.ids.capacity() + self.owners.capacity() + self.pairs_of.capacity()) * 4
            + self.wide.capacity() * (std::mem::size_of::<((u32, u64), i64)>() + 1)
            + self.counts.capacity() * 8
            + self.free.capacity() * 4
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

    /// The counters of group `g` in a state, by value.
    fn counters(state: &ArrayRef, g: usize) -> Vec<(i64, i64)> {
        let lists = state.as_any().downcast_ref::<ListArray>().unwrap();
        let entries = lists.value(g);
        let entries = entries.as_any().downcast_ref::<StructArray>().unwrap();
        let values = entries.column(0).as_primitive::<Int64Type>();
        let counts = entries.column(1).as_primitive::<Int64Type>();
        let mut out: Vec<(i64, i64)> = values
            .values()
            .iter()
            .copied()
            .zip(counts.values().iter().copied())
            .collect();
        out.sort_unstable();
        out
    }

    /// A counter past 32 bits moves to the side map and back, and survives a purge.
    #[test]
    fn counters_past_32_bits_are_exact() {
        let mut acc =
            DistinctAccumulator::try_new(&DataType::Int64, &[AggregateKind::Count], true).unwrap();
        let one = |acc: &DistinctAccumulator, g: u32, value: u64, count: i64| {
            acc.lists(&[value], vec![vec![count]], vec![0, 1])
                .map(|s| (s, g))
        };
        let merge = |acc: &mut DistinctAccumulator, g: u32, value: u64, count: i64| {
            let (state, g) = one(acc, g, value, count).unwrap();
            acc.merge(&state, &[g], 3).unwrap();
        };
        let count_of = |acc: &DistinctAccumulator, g: u32| {
            acc.evaluate(&[g]).unwrap()[0]
                .as_primitive::<Int64Type>()
                .value(0)
        };
        merge(&mut acc, 0, 7, 3_000_000_000);
        merge(&mut acc, 0, 7, 1_000_000_000);
        assert_eq!(
            counters(&acc.state(&[0]).unwrap(), 0),
            vec![(7, 4_000_000_000)]
        );
        assert_eq!(count_of(&acc, 0), 1);
        // Many pairs of other groups emptied: a purge renumbers, the wide counter stays.
        let values: ArrayRef = Arc::new(Int64Array::from_iter_values(0..20_000));
        acc.apply(&values, &vec![1; 20_000], &[None], 3, 1).unwrap();
        acc.reset(&[1]);
        assert!(acc.entries() < 100, "purged: {} pairs left", acc.entries());
        assert_eq!(
            counters(&acc.state(&[0, 1]).unwrap(), 0),
            vec![(7, 4_000_000_000)]
        );
        merge(&mut acc, 0, 7, -3_999_999_999);
        assert_eq!(counters(&acc.state(&[0]).unwrap(), 0), vec![(7, 1)]);
        assert!(acc.wide.is_empty());
        assert_eq!(count_of(&acc, 0), 1);
        merge(&mut acc, 0, 7, -1);
        assert_eq!(count_of(&acc, 0), 0);
        assert_eq!(acc.entries(), 0);
        // Below the 32-bit range too.
        merge(&mut acc, 2, 9, -5_000_000_000);
        assert_eq!(
            counters(&acc.state(&[2]).unwrap(), 0),
            vec![(9, -5_000_000_000)]
        );
    }

    /// Groups emptied and filled again, round after round: each round's values only, and the
    /// pairs of emptied groups purged so that the table does not grow with the rounds.
    #[test]
    fn emptied_groups_start_afresh_and_their_pairs_are_purged() {
        let mut acc =
            DistinctAccumulator::try_new(&DataType::Int64, &[AggregateKind::Count], true).unwrap();
        let groups = 50u32;
        let mut most = 0;
        // The first round each group holds values of.
        let mut first = vec![0i64; groups as usize];
        for round in 0..40i64 {
            // Group g holds values round*1000 + 0..(100 + g), some twice.
            let mut gids = vec![];
            let mut vals = vec![];
            for g in 0..groups {
                for v in 0..(100 + i64::from(g)) {
                    gids.push(g);
                    vals.push(round * 1000 + v);
                    if v % 7 == 0 {
                        gids.push(g);
                        vals.push(round * 1000 + v);
                    }
                }
            }
            let arr: ArrayRef = Arc::new(Int64Array::from(vals));
            acc.apply(&arr, &gids, &[None], groups as usize, 1).unwrap();
            let all: Vec<u32> = (0..groups).collect();
            let counts = acc.evaluate(&all).unwrap();
            let counts = counts[0].as_primitive::<Int64Type>();
            for (g, &from) in first.iter().enumerate() {
                let rounds = round - from + 1;
                assert_eq!(counts.value(g), rounds * (100 + g as i64), "round {round}");
            }
            let state = acc.state(&all).unwrap();
            for g in [0, 17, 49] {
                let listed = counters(&state, g);
                assert_eq!(
                    listed.len() as i64,
                    (round - first[g] + 1) * (100 + g as i64)
                );
                assert_eq!(listed[0], (first[g] * 1000, 2));
                assert_eq!(listed[1], (first[g] * 1000 + 1, 1));
            }
            most = most.max(acc.entries());
            // Odd groups emptied now, even ones every other round.
            let emptied: Vec<u32> = (0..groups)
                .filter(|g| g % 2 == 1 || round % 2 == 0)
                .collect();
            acc.reset(&emptied);
            for &g in &emptied {
                first[g as usize] = round + 1;
            }
        }
        let live = (0..groups as usize).map(|g| 100 + g).sum::<usize>();
        assert!(
            most <= 2 * live + PURGE_MIN_STALE,
            "{most} pairs held at most"
        );
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
