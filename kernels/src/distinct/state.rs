//! The state of a DISTINCT argument as a column: one list of `{value, count0, …}` entries per
//! group, what a local phase flushes, a snapshot holds and [`DistinctAccumulator::merge`] reads.

use std::borrow::Cow;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{Array, ArrayRef, Int64Array};
use arrow_schema::{ArrowError, DataType, Field, Fields};
use hashbrown::HashMap;

use super::bits::{from_bits, from_bits_owned};
use super::lines::for_each_pair;
use super::pairs::Pairs;
use super::{DistinctAccumulator, Values, insert_only};
use crate::accumulator::entry_lists;
use crate::hash::{bucket_array, bucket_natives};
use crate::id_counts::count_ids;

impl DistinctAccumulator {
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

    /// The distinct map of each of `groups` (one list of entries per group). A group listed
    /// once has its entries in the table's order, or, only where the order of the values can
    /// change a result (a floating-point sum), in the order of the values' bits (primitives)
    /// or ids (others), so that the outcome does not depend on the table's history; where
    /// some group is listed twice, every list is in that order.
    ///
    /// # Errors
    /// When the state cannot be built.
    pub fn state(&self, groups: &[u32]) -> Result<ArrayRef, ArrowError> {
        if let Some(slots) = group_slots(groups) {
            return self.state_of_slots(&slots, groups.len());
        }
        // Position of each requested group in the output.
        let mut slot: HashMap<u32, usize> = HashMap::with_capacity(groups.len());
        for (i, &g) in groups.iter().enumerate() {
            slot.entry(g).or_insert(i);
        }
        // Each requested group's (value, counter) pairs.
        let mut per_slot: Vec<Vec<(u64, i64)>> = vec![vec![]; groups.len()];
        self.pairs.for_each(|id, value, count| {
            if let Some(&s) = self.live_group(id).and_then(|g| slot.get(&g)) {
                per_slot[s].push((value, self.counter_of(id, value, count)));
            }
        });
        let mut offsets = vec![0i32];
        let (mut bits, mut counters) = (vec![], vec![]);
        for (i, &g) in groups.iter().enumerate() {
            // A group asked for twice repeats its entries.
            let s = slot[&g];
            if s == i {
                per_slot[s].sort_unstable();
            }
            bits.extend(per_slot[s].iter().map(|p| p.0));
            counters.extend(per_slot[s].iter().map(|p| p.1));
            offsets.push(bits.len() as i32);
        }
        self.lists(bits, self.listed_counts(counters), offsets)
    }

    /// [`Self::state`] of `groups` cut into runs of `chunk` groups, one column per run (a
    /// snapshot's chunks). Where each group is listed once, the table is read twice whatever
    /// the runs (once to count each run's entries, once to place them), not once per run.
    ///
    /// # Errors
    /// When the state cannot be built.
    pub fn state_chunks(&self, groups: &[u32], chunk: usize) -> Result<Vec<ArrayRef>, ArrowError> {
        let chunk = chunk.max(1);
        let runs = groups.len().div_ceil(chunk);
        let Some(slots) = group_slots(groups) else {
            return groups.chunks(chunk).map(|c| self.state(c)).collect();
        };
        if runs <= 1 {
            // One run (or none): the walk of `state`, without finding the slots again.
            return groups
                .chunks(chunk)
                .map(|c| self.state_of_slots(&slots, c.len()))
                .collect();
        }
        let run_of = |g: u32| -> Option<(usize, u32)> {
            let row = *slots.get(g as usize).filter(|&&row| row != u32::MAX)? as usize;
            Some((row / chunk, (row % chunk) as u32))
        };
        // Where each run's entries start.
        let mut starts = vec![0usize; runs + 1];
        self.pairs.for_each(|id, _, _| {
            if let Some((run, _)) = self.live_group(id).and_then(run_of) {
                starts[run + 1] += 1;
            }
        });
        for k in 0..runs {
            starts[k + 1] += starts[k];
        }
        let n = starts[runs];
        let (mut rows, mut bits, mut counters) = (vec![0u32; n], vec![0u64; n], vec![0i64; n]);
        let mut next = starts.clone();
        self.pairs.for_each(|id, value, count| {
            if let Some((run, row)) = self.live_group(id).and_then(run_of) {
                let at = next[run];
                next[run] += 1;
                (rows[at], bits[at], counters[at]) =
                    (row, value, self.counter_of(id, value, count));
            }
        });
        (0..runs)
            .map(|k| {
                let r = starts[k]..starts[k + 1];
                let in_run = chunk.min(groups.len() - k * chunk);
                self.lists_in_rows(
                    in_run,
                    rows[r.clone()].into(),
                    bits[r.clone()].into(),
                    counters[r].into(),
                )
            })
            .collect()
    }

    /// Every live entry, read in one pass over the table: its group, its value (one array of
    /// the argument's type) and its counters. A split PARTIAL's local phase routes each entry
    /// by its value's bucket from these, and has them listed by [`Self::state_placed`].
    ///
    /// # Errors
    /// When the values cannot be built.
    pub fn live_entries(&self) -> Result<LiveEntries, ArrowError> {
        let (groups, bits, counters) = self.entries_where(Some);
        let values = match &self.values {
            // Built only when asked for ([`LiveEntries::values`]): a flush routes entries of
            // 32- and 64-bit integers by their bits alone.
            Values::Bits => EntryValues::Bits(self.arg_type.clone()),
            Values::Interned { .. } => EntryValues::Built(self.values_of(&bits)?),
        };
        Ok(LiveEntries {
            values,
            groups,
            bits,
            counters,
        })
    }

    /// The state of output rows `0..rows` (one list per row): entry `i` of `entries` (as
    /// [`Self::live_entries`] gave them, the table unchanged since) in row `row_of[i]`, whatever
    /// its group; a row's entries ordered as [`Self::state`] orders a group's. No pass over the
    /// table.
    ///
    /// # Errors
    /// Not one row per entry, a row past `rows`; when the state cannot be built.
    pub fn state_placed(
        &self,
        entries: &LiveEntries,
        rows: usize,
        row_of: &[u32],
    ) -> Result<ArrayRef, ArrowError> {
        if row_of.len() != entries.groups.len() || row_of.iter().any(|&r| r as usize >= rows) {
            return Err(ArrowError::InvalidArgumentError(format!(
                "DISTINCT entries placed: {} rows for {} entries, or a row past {rows}",
                row_of.len(),
                entries.groups.len()
            )));
        }
        self.lists_in_rows(
            rows,
            row_of.into(),
            entries.bits[..].into(),
            entries.counters[..].into(),
        )
    }

    /// [`Self::state`] of `rows` groups, each listed once, group `g` in output row `slots[g]`
    /// (`u32::MAX`, or past the end: not listed): each live entry's row, value and counter read
    /// in one pass over the table, then placed by row ([`Self::lists_in_rows`]), without a map
    /// or a list per group. A local phase's flush lists groups `0..n`, ordered by worker; a
    /// snapshot, its live groups a chunk at a time.
    fn state_of_slots(&self, slots: &[u32], rows: usize) -> Result<ArrayRef, ArrowError> {
        let (row_of, bits, counters) = self.entries_where(|g| {
            slots
                .get(g as usize)
                .copied()
                .filter(|&row| row != u32::MAX)
        });
        self.lists_in_rows(rows, row_of.into(), bits.into(), counters.into())
    }

    /// In one pass over the table, each live entry whose group `at` gives a place (None: left
    /// out): that place, its value's bits and its [`Self::counter_of`].
    fn entries_where(&self, at: impl Fn(u32) -> Option<u32>) -> (Vec<u32>, Vec<u64>, Vec<i64>) {
        let n = self.pairs.len();
        let (mut places, mut bits, mut counters) = (
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
        );
        self.pairs.for_each(|id, value, count| {
            if let Some(place) = self.live_group(id).and_then(&at) {
                places.push(place);
                bits.push(value);
                counters.push(self.counter_of(id, value, count));
            }
        });
        (places, bits, counters)
    }

    /// The lists of output rows `0..rows`: entry `i` (its value's `bits[i]` and its
    /// [`Self::counter_of`], `counters[i]`) in row `row_of[i]` (each below `rows`), in the
    /// entries' order within a row, each row's sorted by value (as [`Self::state`] orders them)
    /// only where the order of the values can change a result (a floating-point sum), so that
    /// the outcome does not depend on the table's history. Entries given owned are freed once
    /// placed (a snapshot's export would otherwise hold them beside their placed copies and the
    /// lists), and in one row they are the lists' own, not copied.
    fn lists_in_rows(
        &self,
        rows: usize,
        row_of: Cow<'_, [u32]>,
        bits: Cow<'_, [u64]>,
        counters: Cow<'_, [i64]>,
    ) -> Result<ArrayRef, ArrowError> {
        let mut per_row = vec![0u64; rows];
        if rows == 1 {
            per_row[0] = row_of.len() as u64;
        } else {
            count_ids(&row_of, &mut per_row);
        }
        let mut offsets = Vec::with_capacity(rows + 1);
        offsets.push(0i32);
        for &c in &per_row {
            // Entries fit i32 offsets: the list column's own type.
            offsets.push(offsets[offsets.len() - 1] + c as i32);
        }
        let (mut bits, mut counters) = if rows == 1 {
            drop(row_of);
            // A walk reserves room for every pair of the table: the list keeps only its own.
            let (mut bits, mut counters) = (bits.into_owned(), counters.into_owned());
            bits.shrink_to_fit();
            counters.shrink_to_fit();
            (bits, counters)
        } else {
            let entries = Unplaced {
                bits: &bits,
                counters: &counters,
                rows: &row_of,
            };
            let placed = entries.placed(&offsets);
            drop((row_of, bits, counters));
            placed
        };
        if self.order_matters {
            for s in offsets.windows(2) {
                let (from, to) = (s[0] as usize, s[1] as usize);
                let mut row: Vec<(u64, i64)> = bits[from..to]
                    .iter()
                    .copied()
                    .zip(counters[from..to].iter().copied())
                    .collect();
                row.sort_unstable();
                for (i, (b, c)) in row.into_iter().enumerate() {
                    (bits[from + i], counters[from + i]) = (b, c);
                }
            }
        }
        self.lists(bits, self.listed_counts(counters), offsets)
    }

    /// Each aggregate's counters of entries whose [`Self::counter_of`] are `counters`, a column
    /// per aggregate: an aggregate's count (a bare pair's: 1) with one aggregate; with flags, 1
    /// for an aggregate that has seen the pair and 0 for one that has not; with counters, the
    /// aggregate's of the pair's counters. How to read them is chosen once per aggregate, not
    /// per entry, so that flags become a shift and a mask the compiler vectorizes.
    fn listed_counts(&self, counters: Vec<i64>) -> Vec<Vec<i64>> {
        let k = self.inners.len();
        if k == 1 {
            return vec![counters];
        }
        (0..k)
            .map(|j| match &self.pairs {
                Pairs::Flagged(_) | Pairs::Tagged(_) => {
                    counters.iter().map(|&c| (c >> j) & 1).collect()
                }
                _ => counters
                    .iter()
                    .map(|&c| self.counts[c as usize * k + j])
                    .collect(),
            })
            .collect()
    }

    /// Merges distinct states (as produced by [`Self::state`]) into `groups`, row by row, with
    /// Flink's counter merge: aggregate `i` gains a value when its counter goes from ≤ 0 to > 0
    /// and loses it when it goes from > 0 to ≤ 0.
    ///
    /// # Errors
    /// When `state` is not a distinct state of this argument type, or holds a negative counter
    /// for an accumulator built for insert-only input.
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
        if !matches!(self.pairs, Pairs::Counted(_))
            && counters
                .iter()
                .any(|c| c.values()[start..end].iter().any(|&n| n < 0))
        {
            return Err(insert_only());
        }
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
        let mut flips = std::mem::take(&mut self.flips);
        flips.clear(k);
        // Without counts: which aggregates each entry's counters take it into, a column at a time.
        let mut gained = std::mem::take(&mut self.selected);
        gained.clear();
        gained.resize(m, 0);
        if !matches!(self.pairs, Pairs::Counted(_)) {
            for (i, col) in counters.iter().enumerate() {
                let col = &col.values()[start..end];
                gained
                    .iter_mut()
                    .zip(col)
                    .for_each(|(g, &c)| *g |= u32::from(c > 0) << i);
            }
        }
        for_each_pair!(self, &flat_groups, &bits, 0..m, |r, hash| {
            self.add(
                flat_groups[r],
                bits[r],
                hash,
                |i| Some(counters[i].value(start + r)),
                gained[r],
                |i, before, after| {
                    if before <= 0 && after > 0 {
                        flips.gain(i, r);
                    } else if before > 0 && after <= 0 {
                        flips.loss(i, r);
                    }
                },
            );
        });
        self.selected = gained;
        self.bits = bits;
        let applied = self.apply_flips(&flips, &values, &flat_groups, total_groups);
        self.flips = flips;
        applied?;
        Ok(())
    }

    /// The values of entries from their `bits` (the values' bits, or their ids in the value
    /// table), as one array of the argument's type.
    fn values_of(&self, bits: &[u64]) -> Result<ArrayRef, ArrowError> {
        match &self.values {
            Values::Bits => from_bits(bits, &self.arg_type),
            Values::Interned { table, .. } => {
                let vids: Vec<u32> = bits.iter().map(|&b| b as u32).collect();
                Ok(table.keys(&vids)?.remove(0))
            }
        }
    }

    /// The list column of entries: values from their `bits` (whose buffer the values take
    /// where they are the bits themselves: a snapshot holds no second copy of them), the
    /// counters `cols`, cut by `offsets`.
    pub(super) fn lists(
        &self,
        bits: Vec<u64>,
        cols: Vec<Vec<i64>>,
        offsets: Vec<i32>,
    ) -> Result<ArrayRef, ArrowError> {
        let values = match &self.values {
            Values::Bits => from_bits_owned(bits, &self.arg_type)?,
            Values::Interned { .. } => self.values_of(&bits)?,
        };
        let mut columns: Vec<ArrayRef> = vec![values];
        columns.extend(
            cols.into_iter()
                .map(|c| Arc::new(Int64Array::from(c)) as ArrayRef),
        );
        entry_lists(self.entry_fields(), columns, offsets)
    }
}

/// The live entries of a DISTINCT accumulator, in the table's order
/// ([`DistinctAccumulator::live_entries`]).
#[derive(Debug)]
pub struct LiveEntries {
    /// Each entry's group.
    pub groups: Vec<u32>,
    values: EntryValues,
    bits: Vec<u64>,
    counters: Vec<i64>,
}

/// The values of [`LiveEntries`]: their bits alone (values of this type), or an array built.
#[derive(Debug)]
enum EntryValues {
    Bits(DataType),
    Built(ArrayRef),
}

impl LiveEntries {
    /// Each entry's value: one array of the argument's type.
    ///
    /// # Errors
    /// When the array cannot be built.
    pub fn values(&self) -> Result<ArrayRef, ArrowError> {
        match &self.values {
            EntryValues::Bits(dt) => from_bits(&self.bits, dt),
            EntryValues::Built(values) => Ok(Arc::clone(values)),
        }
    }

    /// Each entry's split-distinct bucket of `buckets`, as [`bucket_array`] gives it for
    /// [`LiveEntries::values`]: 32- and 64-bit integers are bucketed from their bits, without
    /// the array.
    ///
    /// # Errors
    /// When `buckets` is 0, or the values cannot be hashed.
    pub fn buckets(&self, buckets: u32) -> Result<Vec<i32>, ArrowError> {
        match &self.values {
            EntryValues::Bits(DataType::Int64) => {
                bucket_natives(self.bits.iter().map(|&b| b as i64), buckets)
            }
            EntryValues::Bits(DataType::Int32) => {
                bucket_natives(self.bits.iter().map(|&b| b as i32), buckets)
            }
            _ => Ok(bucket_array(&self.values()?, buckets)?.values().to_vec()),
        }
    }
}

/// Entries to place by row: each one's value bits, [`DistinctAccumulator::counter_of`] and row.
struct Unplaced<'a> {
    bits: &'a [u64],
    counters: &'a [i64],
    rows: &'a [u32],
}

impl Unplaced<'_> {
    /// The entries' bits and counters placed by row, each row from its start in `offsets`
    /// (`offsets.len() - 1` rows, at least two), a row's in the entries' order.
    fn placed(&self, offsets: &[i32]) -> (Vec<u64>, Vec<i64>) {
        let n = self.rows.len();
        let mut out = (vec![0u64; n], vec![0i64; n]);
        match offsets.len() - 1 {
            2 => self.place_few::<2>(offsets, &mut out),
            3 => self.place_few::<3>(offsets, &mut out),
            4 => self.place_few::<4>(offsets, &mut out),
            _ => self.place_many(offsets, &mut out),
        }
        out
    }

    /// `R` rows (2 to 4: the dispatch in [`Unplaced::placed`]) in one pass: an entry's place is picked from the rows'
    /// next places by masks rather than by an index, so that the places stay in registers (a
    /// store and a load per entry, of a row's count in memory, would wait on each other where
    /// consecutive entries share a row), and no entry takes a branch.
    fn place_few<const R: usize>(&self, offsets: &[i32], out: &mut (Vec<u64>, Vec<i64>)) {
        let mut next = [0usize; R];
        for (s, at) in next.iter_mut().enumerate() {
            *at = offsets[s] as usize;
        }
        for ((&b, &c), &r) in self.bits.iter().zip(self.counters).zip(self.rows) {
            let mut at = 0;
            for (s, place) in next.iter_mut().enumerate() {
                let hit = usize::from(r as usize == s);
                at |= *place & hit.wrapping_neg();
                *place += hit;
            }
            (out.0[at], out.1[at]) = (b, c);
        }
    }

    /// Any number of rows, each row's next place kept in memory.
    fn place_many(&self, offsets: &[i32], out: &mut (Vec<u64>, Vec<i64>)) {
        let mut next: Vec<usize> = offsets.iter().map(|&o| o as usize).collect();
        for ((&b, &c), &r) in self.bits.iter().zip(self.counters).zip(self.rows) {
            let at = &mut next[r as usize];
            (out.0[*at], out.1[*at]) = (b, c);
            *at += 1;
        }
    }
}

/// Where each of `groups` is listed once, the output row of each group id (`slots[g]`, for
/// ids up to the largest listed; `u32::MAX` for one not listed); `None` otherwise.
fn group_slots(groups: &[u32]) -> Option<Vec<u32>> {
    let len = groups.iter().max().map_or(0, |&g| g as usize + 1);
    let mut slots = vec![u32::MAX; len];
    for (i, &g) in groups.iter().enumerate() {
        let slot = &mut slots[g as usize];
        if *slot != u32::MAX {
            return None;
        }
        *slot = i as u32;
    }
    Some(slots)
}
