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
use arrow_array::{Array, ArrayRef};
use arrow_buffer::{BooleanBuffer, BooleanBufferBuilder};
use arrow_schema::{ArrowError, DataType};
use hashbrown::HashMap;

use crate::accumulator::GroupsAccumulator;
use crate::aggregates::{AggregateKind, new_accumulator};
use crate::group_values::{GroupValues, new_group_values};
use crate::hash::hash_columns;

mod bits;
mod pairs;
mod state;

use bits::{bits_type, to_bits};
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
    /// Whether this is a local phase's, whose inner aggregates are never read
    /// ([`Self::for_local_phase`]).
    local: bool,
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
            local: false,
        })
    }

    /// Makes this the DISTINCT of a local phase, whose state is only ever read by flushes
    /// ([`Self::state`]): its inner aggregates are no longer updated, since their results are
    /// never asked for.
    pub fn for_local_phase(&mut self) {
        self.local = true;
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
        if self.local {
            // A local phase's inner aggregates are never read: the rows only count.
            self.add_rows(
                &bits,
                nulls.as_ref(),
                groups,
                filters,
                delta,
                |_, _, _, _| {},
            );
            self.bits = bits;
            return Ok(());
        }
        let mut flips: Vec<BooleanBufferBuilder> = (0..k)
            .map(|_| {
                let mut b = BooleanBufferBuilder::new(n);
                b.append_n(n, false);
                b
            })
            .collect();
        let mut any_flip = vec![false; k];
        self.add_rows(
            &bits,
            nulls.as_ref(),
            groups,
            filters,
            delta,
            |r, i, before, after| {
                if (delta > 0 && before == 0 && after == 1)
                    || (delta < 0 && before == 1 && after == 0)
                {
                    flips[i].set_bit(r, true);
                    any_flip[i] = true;
                }
            },
        );
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

    /// Adds `delta` for each non-NULL row to the counters of the aggregates whose filters
    /// select it; `seen(row, i, before, after)` hears of each change.
    #[inline(always)]
    fn add_rows(
        &mut self,
        bits: &[u64],
        nulls: Option<&arrow_buffer::NullBuffer>,
        groups: &[u32],
        filters: &[Option<&BooleanBuffer>],
        delta: i64,
        mut seen: impl FnMut(usize, usize, i64, i64),
    ) {
        let k = self.inners.len();
        let unfiltered = filters.iter().all(Option::is_none);
        for (r, &g) in groups.iter().enumerate() {
            if nulls.is_some_and(|nb| nb.is_null(r)) {
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
                |i, before, after| seen(r, i, before, after),
            );
        }
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
mod tests;
