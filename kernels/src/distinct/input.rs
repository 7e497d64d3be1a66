//! A batch of input rows into the counters ([`DistinctAccumulator::apply`]): each aggregate's
//! FILTER picks its rows, and a row whose counter reaches or leaves 0 goes on to that aggregate.

use arrow_array::{Array, ArrayRef};
use arrow_buffer::BooleanBuffer;
use arrow_schema::ArrowError;

use super::lines::for_each_pair;
use super::pairs::{MAX_FLAGGED, Pairs, pair_hash};
use super::{DistinctAccumulator, insert_only};

impl DistinctAccumulator {
    /// Adds `delta` per selected row (accumulate with +1, retract with −1). `filters[i]` selects
    /// the rows of aggregate `i` (None: all rows).
    ///
    /// # Errors
    /// When the argument's type or length is wrong, or a retraction of an accumulator built
    /// for insert-only input.
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
        if delta < 0 && !matches!(self.pairs, Pairs::Counted(_)) {
            return Err(insert_only());
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
        let mut flips = std::mem::take(&mut self.flips);
        flips.clear(k);
        self.add_rows(
            &bits,
            nulls.as_ref(),
            groups,
            filters,
            delta,
            |r, i, before, after| {
                if delta > 0 && before == 0 && after == 1 {
                    flips.gain(i, r);
                } else if delta < 0 && before == 1 && after == 0 {
                    flips.loss(i, r);
                }
            },
        );
        self.bits = bits;
        let applied = self.apply_flips(&flips, arg, groups, total_groups);
        self.flips = flips;
        applied?;
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
        // The gains of a row every aggregate takes (none to count past a word's bits).
        let all = match k {
            1..=MAX_FLAGGED if delta > 0 => u32::MAX >> (u32::BITS as usize - k),
            _ => 0,
        };
        if filters.iter().all(Option::is_none) {
            let valid = |r: &usize| nulls.is_none_or(|nb| nb.is_valid(*r));
            let rows = (0..groups.len()).filter(valid);
            for_each_pair!(self, groups, bits, rows, |r, hash| {
                let delta = |_| Some(delta);
                self.add(groups[r], bits[r], hash, delta, all, |i, b, a| {
                    seen(r, i, b, a)
                });
            });
            return;
        }
        if k > MAX_FLAGGED {
            for (r, &g) in groups.iter().enumerate() {
                let selected = |i: usize| filters[i].is_none_or(|f| f.value(r));
                if nulls.is_some_and(|nb| nb.is_null(r)) || !(0..k).any(selected) {
                    continue;
                }
                // Counted: more aggregates than a word's bits have no gains.
                let delta = |i| selected(i).then_some(delta);
                let hash = pair_hash(self.ids[g as usize], bits[r]);
                self.add(g, bits[r], hash, delta, 0, |i, b, a| seen(r, i, b, a));
            }
            return;
        }
        // Each row's aggregates as one word, from the FILTERs' set bits: a row no aggregate
        // takes costs one load.
        let mut selected = std::mem::take(&mut self.selected);
        selected.clear();
        selected.resize(groups.len(), 0);
        for (i, filter) in filters.iter().enumerate() {
            match filter {
                // Each bit of each word of the FILTER moved to its row, in a pass the compiler
                // vectorizes (walking the set bits takes a branch and a dependent step a row).
                Some(f) => {
                    let words = f.bit_chunks();
                    let words = words.iter().chain(std::iter::once(words.remainder_bits()));
                    for (word, rows) in words.zip(selected.chunks_mut(64)) {
                        or_bits(word, rows, i);
                    }
                }
                None => selected.iter_mut().for_each(|s| *s |= 1 << i),
            }
        }
        if let Some(nb) = nulls {
            nb.inner()
                .iter()
                .zip(&mut selected)
                .for_each(|(valid, s)| *s = if valid { *s } else { 0 });
        }
        let rows = (0..groups.len()).filter(|&r| selected[r] != 0);
        for_each_pair!(self, groups, bits, rows, |r, hash| {
            let s = selected[r];
            let delta = |i: usize| (s >> i & 1 == 1).then_some(delta);
            self.add(groups[r], bits[r], hash, delta, s & all, |i, b, a| {
                seen(r, i, b, a)
            });
        });
        self.selected = selected;
    }
}

/// `rows[j] |= 1 << i` for each set bit `j` of `word` (`rows`: at most 64), branch-free.
fn or_bits(word: u64, rows: &mut [u32], i: usize) {
    match <&mut [u32; 64]>::try_from(&mut *rows) {
        // A whole word's rows: the same loop, of a length the compiler knows, vectorized.
        Ok(rows) => spread_bits(word, rows, i),
        Err(_) => spread_bits(word, rows, i),
    }
}

#[inline(always)]
fn spread_bits(word: u64, rows: &mut [u32], i: usize) {
    for (j, s) in rows.iter_mut().enumerate() {
        *s |= ((word >> j) as u32 & 1) << i;
    }
}
