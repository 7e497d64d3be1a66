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
//! One table per argument (`pairs.rs`) holds an entry per live (group, value) pair: the value's
//! 64 bits, the group's id in the table and, as the input calls for (`Pairs`), a 32-bit counter
//! (16 bytes). With retractions the counter is the aggregate's own (a counter that outgrows 32
//! bits moves to a side map) or, with several sharing aggregates, the index of their 64-bit
//! counters. Insert-only input needs no counts, since a counter only ever grows: the 32 bits flag
//! which of several aggregates have seen the pair; with up to four the flags share a word with
//! the group's id (12 bytes, while the ids fit it), and with one aggregate the entry has no
//! counter at all (12 bytes). The 64 bits are a primitive value's own bits or, for other types
//! (strings, say), the id the value was interned under once ([`crate::group_values`]). A row of
//! a primitive argument so costs one probe of one table, whose entry holds everything the row
//! updates. An emptied group's pairs are dropped in O(1) by giving the group a fresh id; the
//! pairs left under old ids are purged once they are half the table.
//!
//! The 12-byte pairs of insert-only input sit in hashbrown's table while it is small and move to
//! one of cache lines of five once it outgrows the caches (`packed.rs`, `lines.rs`), where a run
//! of rows has its lines read ahead before it is probed.

use std::sync::Arc;

use arrow_array::ArrayRef;
use arrow_schema::{ArrowError, DataType};
use hashbrown::HashMap;

use crate::accumulator::GroupsAccumulator;
use crate::aggregates::{AggregateKind, new_accumulator};
use crate::group_values::{GroupValues, new_group_values};
use crate::hash::hash_columns;

mod bits;
mod flips;
mod input;
mod lines;
mod packed;
mod pairs;
mod state;

pub use state::LiveEntries;

use bits::{bits_type, to_bits};
use flips::Flips;
use packed::{LINES_FROM, Packed, Probe};
use pairs::{
    Bare, MAX_FLAGGED, Pair, PairTable, Pairs, SPILLED, TAG_FLAGS, TAG_IDS, Tagged, count_at,
    set_count,
};

/// No group has this id: the top of the id space, below which fresh ids are counted down.
const NO_ID: u32 = u32::MAX;

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
    pairs: Pairs,
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
    /// Scratch: per row of the batch at hand, the aggregates that take it (bit `i`: aggregate
    /// `i`'s FILTER selects it and its value is not NULL; in a merge, its counter is past 0).
    selected: Vec<u32>,
    /// Whether this is a local phase's, whose inner aggregates are never read
    /// ([`Self::for_local_phase`]).
    local: bool,
    /// Scratch: the rows of the batch at hand whose value its group gained or lost, per
    /// aggregate ([`Self::apply_flips`]).
    flips: Flips,
}

impl std::fmt::Debug for DistinctAccumulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DistinctAccumulator")
            .field("arg_type", &self.arg_type)
            .field("entries", &self.pairs.len())
            .field("inners", &self.inners)
            .finish()
    }
}

/// Finds or inserts the tagged pair `entry` (whose hash is `hash`) and flags the aggregates of
/// `gains` on it: whether it was inserted, and the aggregates it had not flagged yet.
#[inline(always)]
fn flag_pair(table: &mut impl Probe<Tagged>, hash: u64, entry: Tagged, gains: u32) -> (bool, u32) {
    let (at, inserted) = table.find_or_insert(hash, entry);
    (inserted, table.get_mut(at).flag(gains))
}

/// The group whose id is `id`: a fresh id's owner, or the group of that number.
fn owner(owners: &[u32], id: u32) -> u32 {
    owners.get((NO_ID - 1 - id) as usize).copied().unwrap_or(id)
}

impl DistinctAccumulator {
    /// DISTINCT aggregates `kinds` over one argument of type `arg_type`. `retractable`: whether
    /// the input may retract (as in [`new_accumulator`]); without it the pairs need no counts
    /// (`Pairs`) and a retraction is an error.
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
            pairs: if retractable || kinds.len() > MAX_FLAGGED {
                Pairs::Counted(PairTable::default())
            } else if kinds.len() == 1 {
                Pairs::Bare(Packed::default())
            } else if kinds.len() <= TAG_FLAGS {
                Pairs::Tagged(Packed::default())
            } else {
                Pairs::Flagged(PairTable::default())
            },
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
            selected: vec![],
            local: false,
            flips: Flips::default(),
        })
    }

    /// Makes this the DISTINCT of a local phase, whose state is only ever read by flushes
    /// ([`Self::state`]): its inner aggregates are no longer updated, since their results are
    /// never asked for. Its few aggregates' pairs stay flagged in 16 bytes rather than tagged:
    /// a local table holds one mini-batch's pairs, and the tags' few instructions more a pair
    /// buy no memory worth having there.
    pub fn for_local_phase(&mut self) {
        self.local = true;
        self.pairs.untag();
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
        if total > TAG_IDS as usize {
            // The new groups' numbers are past a tagged pair's ids.
            self.pairs.untag();
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

    /// What a listed pair's counter stands for: one aggregate's count (a bare pair's: 1), with
    /// several the index of their counters or their flags (`listed_counts` reads it).
    fn counter_of(&self, id: u32, value: u64, count: i32) -> i64 {
        match (&self.pairs, self.inners.len(), count) {
            (Pairs::Counted(_), 1, SPILLED) => self.wide[&(id, value)],
            (Pairs::Counted(_) | Pairs::Bare(_), 1, c) => i64::from(c),
            (_, _, c) => i64::from(c as u32),
        }
    }

    /// Adds `deltas(i)` to aggregate `i`'s counter of the pair `(group, value)`, whose
    /// [`pair_hash`](pairs::pair_hash) is `hash`, for every `i` it selects (None: not selected),
    /// creating the pair and dropping it once every counter is 0; `seen(i, before, after)`
    /// hears of each change. Without counts (insert-only input)
    /// only the aggregates in `gains` count (bit `i`: `delta(i)` is past 0), and `seen` hears of
    /// each counter that leaves 0.
    #[inline(always)]
    fn add(
        &mut self,
        group: u32,
        value: u64,
        hash: u64,
        delta: impl Fn(usize) -> Option<i64>,
        gains: u32,
        mut seen: impl FnMut(usize, i64, i64),
    ) {
        let k = self.inners.len();
        let id = self.ids[group as usize];
        // Each kind of pair probes at its own call site: one probe shared by flagged and counted
        // pairs cost q15 (two-phase, P = 1) 3.7 % more instructions.
        let table = match &mut self.pairs {
            Pairs::Bare(packed) => {
                if gains == 0 {
                    return;
                }
                let entry = Bare::new(id, value);
                let (inserted, full) = match packed {
                    Packed::Hashed(t) => {
                        let inserted = t.find_or_insert(hash, entry).1;
                        (inserted, inserted && t.len() >= LINES_FROM)
                    }
                    Packed::Lines(t) => (t.find_or_insert(hash, entry).1, false),
                };
                if inserted {
                    self.pairs_of[group as usize] += 1;
                    seen(0, 0, 1);
                }
                if full {
                    packed.move_to_lines();
                }
                return;
            }
            Pairs::Tagged(packed) => {
                if gains == 0 {
                    return;
                }
                let entry = Tagged::new(id, value);
                let (inserted, mut new, full) = match packed {
                    Packed::Hashed(t) => {
                        let (inserted, new) = flag_pair(t, hash, entry, gains);
                        (inserted, new, inserted && t.len() >= LINES_FROM)
                    }
                    Packed::Lines(t) => {
                        let (inserted, new) = flag_pair(t, hash, entry, gains);
                        (inserted, new, false)
                    }
                };
                if inserted {
                    self.pairs_of[group as usize] += 1;
                }
                while new != 0 {
                    seen(new.trailing_zeros() as usize, 0, 1);
                    new &= new - 1;
                }
                if full {
                    packed.move_to_lines();
                }
                return;
            }
            Pairs::Flagged(table) => {
                if gains == 0 {
                    return;
                }
                let (pos, inserted) = table.find_or_insert(
                    hash,
                    Pair {
                        value,
                        id,
                        count: 0,
                    },
                );
                if inserted {
                    self.pairs_of[group as usize] += 1;
                }
                let flags = table.count_mut(pos);
                let mut new = gains & !(*flags as u32);
                *flags |= new as i32;
                while new != 0 {
                    seen(new.trailing_zeros() as usize, 0, 1);
                    new &= new - 1;
                }
                return;
            }
            Pairs::Counted(table) => table,
        };
        let (pos, inserted) = table.find_or_insert(
            hash,
            Pair {
                value,
                id,
                count: 0,
            },
        );
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
                *table.count_mut(pos) = c as u32 as i32;
            }
        }
        let empty = if k == 1 {
            let before = count_at(table, &self.wide, pos, id, value);
            match delta(0) {
                Some(d) => {
                    let after = before + d;
                    set_count(table, &mut self.wide, pos, id, value, after);
                    seen(0, before, after);
                    after == 0
                }
                None => before == 0,
            }
        } else {
            let c = table.get(pos).count as u32 as usize;
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
            table.remove_at(pos);
            self.pairs_of[group as usize] -= 1;
        }
    }

    /// The fresh id the next emptied group takes.
    fn next_fresh_id(&self) -> u32 {
        NO_ID - 1 - self.owners.len() as u32
    }

    /// Keeps only the pairs under current ids, and gives every group its own number as id
    /// again (no fresh ids left).
    fn purge(&mut self) {
        let (ids, owners) = (&self.ids, &self.owners);
        let mut old_wide = std::mem::take(&mut self.wide);
        let wide = &mut self.wide;
        let counted = matches!(self.pairs, Pairs::Counted(_));
        self.pairs.rebuild(|id, value, count| {
            let g = owner(owners, id);
            if ids.get(g as usize) != Some(&id) {
                return None;
            }
            if counted
                && count == SPILLED
                && let Some(c) = old_wide.remove(&(id, value))
            {
                wide.insert((g, value), c);
            }
            Some(g)
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
        self.pairs.len()
    }

    /// The number of aggregates sharing the map.
    pub fn num_aggregates(&self) -> usize {
        self.inners.len()
    }

    /// The result type of aggregate `i`.
    pub fn result_type(&self, i: usize) -> DataType {
        self.inners[i].result_type()
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
        self.pairs.clear();
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
            let tagged_full =
                matches!(self.pairs, Pairs::Tagged(_)) && !Tagged::fits(self.next_fresh_id());
            if self.ids.len() + self.owners.len() + 1 >= NO_ID as usize || tagged_full {
                self.purge();
            }
            self.stale += self.pairs_of[g] as usize;
            self.pairs_of[g] = 0;
            self.ids[g] = self.next_fresh_id();
            self.owners.push(g as u32);
        }
        if self.stale >= PURGE_MIN_STALE && self.stale * 2 >= self.pairs.len() {
            self.purge();
        }
        for a in &mut self.inners {
            a.reset(groups);
        }
    }

    /// Bytes held, from capacity: the table (17 or 13 bytes a bucket), each group's id and pair count,
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
        self.pairs.bytes()
            + (self.ids.capacity() + self.owners.capacity() + self.pairs_of.capacity()) * 4
            + self.wide.capacity() * (std::mem::size_of::<((u32, u64), i64)>() + 1)
            + self.counts.capacity() * 8
            + self.free.capacity() * 4
            + self.bits.capacity() * 8
            + self.selected.capacity() * 4
            + self.flips.size()
            + values
            + self.inners.iter().map(|a| a.size()).sum::<usize>()
    }
}

/// The error of a retraction into pairs kept without counts.
fn insert_only() -> ArrowError {
    ArrowError::InvalidArgumentError(
        "DISTINCT over insert-only input cannot retract; build it retractable".into(),
    )
}

#[cfg(test)]
mod tests;
