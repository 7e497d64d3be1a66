//! The one loop every accumulator runs: visit the rows that count.
//!
//! A row counts when its value is not NULL and the filter (if any) selects it. Which of the four
//! (nulls × filter) cases applies is decided once per batch; the selected rows are then walked
//! with bit iterators that read validity 64 bits at a time, or, for state that takes an update
//! back exactly and a column with few NULLs, every row is visited and the NULL rows taken back.

use arrow_buffer::{BooleanBuffer, NullBuffer};

/// Calls `f(row, group)` for every row `row` whose value is valid in `nulls` and that `filter`
/// selects, in row order. `groups[row]` is the row's group id.
///
/// `nulls` and `filter`, when given, must be as long as `groups`.
#[inline(always)]
pub fn for_each_selected<F: FnMut(usize, u32)>(
    groups: &[u32],
    nulls: Option<&NullBuffer>,
    filter: Option<&BooleanBuffer>,
    mut f: F,
) {
    let nulls = nulls.filter(|n| n.null_count() > 0);
    match (nulls, filter) {
        (None, None) => {
            for (i, &g) in groups.iter().enumerate() {
                f(i, g);
            }
        }
        (Some(n), None) => {
            for i in n.inner().set_indices() {
                f(i, groups[i]);
            }
        }
        (None, Some(sel)) => {
            for i in sel.set_indices() {
                f(i, groups[i]);
            }
        }
        (Some(n), Some(sel)) => {
            let both = n.inner() & sel;
            for i in both.set_indices() {
                f(i, groups[i]);
            }
        }
    }
}

/// At most one row in this many NULL (and no filter): a pass over state that takes an update
/// back exactly visits every row and then takes the NULL rows back
/// ([`for_each_row_then_nulls`]) instead of walking the validity's set bits.
pub const SPARSE_NULLS: usize = 8;

/// Whether a pass over `len` rows may visit every row and then take the NULL rows back, as
/// [`for_each_row_then_nulls`] does: no `filter`, and at most one row in [`SPARSE_NULLS`] NULL
/// in `nulls` (none counts).
#[inline]
pub fn every_row_then_nulls(
    len: usize,
    nulls: Option<&NullBuffer>,
    filter: Option<&BooleanBuffer>,
) -> bool {
    filter.is_none() && nulls.is_none_or(|n| n.null_count() * SPARSE_NULLS <= len)
}

/// For state that takes an update back exactly (wrapping integer sums, counts): where `nulls`
/// marks few rows NULL (at most one in [`SPARSE_NULLS`]) and there is no `filter`, calls
/// `f(row, group, true)` for every row and then `f(row, group, false)` for each NULL row, and
/// returns true; the state ends as if [`for_each_selected`] had visited the valid rows, without
/// a bit walk over nearly every row. Otherwise visits nothing and returns false.
#[inline(always)]
pub fn for_each_row_then_nulls<F: FnMut(usize, u32, bool)>(
    groups: &[u32],
    nulls: Option<&NullBuffer>,
    filter: Option<&BooleanBuffer>,
    mut f: F,
) -> bool {
    let Some(n) = nulls.filter(|n| n.null_count() > 0) else {
        return false;
    };
    if !every_row_then_nulls(groups.len(), Some(n), filter) {
        return false;
    }
    for (i, &g) in groups.iter().enumerate() {
        f(i, g, true);
    }
    for_each_null_row(groups, n, |i, g| f(i, g, false));
    true
}

/// Calls `f(row, group)` for every row that `nulls` marks NULL, in row order (`nulls` as long
/// as `groups`): the rows a pass over every row takes back.
#[inline(always)]
pub fn for_each_null_row<F: FnMut(usize, u32)>(groups: &[u32], nulls: &NullBuffer, mut f: F) {
    for i in (!nulls.inner()).set_indices() {
        f(i, groups[i]);
    }
}

/// The number of rows [`for_each_selected`] would visit.
pub fn count_selected(
    len: usize,
    nulls: Option<&NullBuffer>,
    filter: Option<&BooleanBuffer>,
) -> usize {
    let nulls = nulls.filter(|n| n.null_count() > 0);
    match (nulls, filter) {
        (None, None) => len,
        (Some(n), None) => len - n.null_count(),
        (None, Some(sel)) => sel.count_set_bits(),
        (Some(n), Some(sel)) => (n.inner() & sel).count_set_bits(),
    }
}

/// Copies of the state cells per group in a pass over few groups. Rows of one group that follow
/// each other update the same cell, each update waiting for the one before through memory: under
/// a hot key (half the rows on one group) a pass runs at the latency of a store and a load per
/// row. With few groups, row `r` updates copy `r % LANES` of its group's cell instead, and the
/// copies are folded into the state after the pass. Only for state that adds in any order
/// (counts, wrapping integer sums), so that the result is the same bit for bit.
pub const LANES: usize = 4;

/// The most groups a pass runs in lanes for: 1,024 groups of 4 lanes of 8 bytes stay in the
/// L1/L2 caches. A 10M-row pass with half its rows on one of 200 groups counted in 9.7 ms in one
/// cell per group and 4.0 ms in lanes (BENCHMARKS.md, "The runtime and the
/// single-core path, fourth pass").
pub const MAX_LANED_GROUPS: usize = 1024;

/// Whether a pass of `rows` rows over `groups` groups runs in lanes: few groups, and rows enough
/// to pay for folding every group's lanes.
#[inline]
pub fn in_lanes(rows: usize, groups: usize) -> bool {
    groups <= MAX_LANED_GROUPS && rows >= groups * LANES
}

/// The lane cell of row `row` of group `g` in a [`Lanes`] column.
#[inline(always)]
pub fn lane(row: usize, g: u32) -> usize {
    g as usize * LANES + (row & (LANES - 1))
}

/// The lane copies of one per-group column ([`LANES`] cells a group), all zero between passes.
#[derive(Debug, Default)]
pub struct Lanes<T> {
    cells: Vec<T>,
}

impl<T: Copy> Lanes<T> {
    /// The cells of `groups` groups (index them with [`lane`]), all equal to `zero`.
    pub fn cells(&mut self, groups: usize, zero: T) -> &mut [T] {
        if self.cells.len() < groups * LANES {
            self.cells.resize(groups * LANES, zero);
        }
        &mut self.cells[..groups * LANES]
    }

    /// Folds the cells of the first `into.len()` groups into `into` with `add` and sets them to
    /// `zero` again.
    pub fn fold_into(&mut self, into: &mut [T], zero: T, add: impl Fn(T, T) -> T) {
        for (cell, copies) in into.iter_mut().zip(self.cells.chunks_exact_mut(LANES)) {
            for c in copies {
                *cell = add(*cell, *c);
                *c = zero;
            }
        }
    }
}

/// The one group of every row, where `groups` holds one group only (None where it holds
/// several, or none). Rows are compared a block at a time, so a batch of mixed groups is
/// usually told apart in its first block.
#[inline]
pub fn only_group(groups: &[u32]) -> Option<u32> {
    let &first = groups.first()?;
    groups
        .chunks(64)
        .all(|block| block.iter().fold(0, |acc, &g| acc | (g ^ first)) == 0)
        .then_some(first)
}

/// Calls `f(cell, value)` for every row with its lane cell ([`lane`]) and its value in `values`
/// (as long as `groups`), [`LANES`] rows at a time, each into its own lane: no row index to
/// mask, and the groups and values read in step.
#[inline(always)]
pub fn for_each_row_in_lanes<T: Copy>(groups: &[u32], values: &[T], mut f: impl FnMut(usize, T)) {
    let (groups, values) = (groups.chunks_exact(LANES), values.chunks_exact(LANES));
    let (group_rest, value_rest) = (groups.remainder(), values.remainder());
    for (g, v) in groups.zip(values) {
        for j in 0..LANES {
            f(g[j] as usize * LANES + j, v[j]);
        }
    }
    for (j, (&g, &v)) in group_rest.iter().zip(value_rest).enumerate() {
        f(g as usize * LANES + j, v);
    }
}

/// `counts[g] += delta` for the group `g` of every row [`for_each_selected`] visits, in lanes
/// (`lanes`) when there are few groups ([`in_lanes`]); `counts` covers every group. Where every
/// row is of one group (one key, or a hot key's batch) the selected rows are counted from the
/// bitmaps alone.
pub fn count_rows(
    groups: &[u32],
    nulls: Option<&NullBuffer>,
    filter: Option<&BooleanBuffer>,
    counts: &mut [i64],
    delta: i64,
    lanes: &mut Lanes<i64>,
) {
    let only = match counts {
        [_] => Some(0),
        _ => only_group(groups),
    };
    if let Some(g) = only {
        counts[g as usize] += delta * count_selected(groups.len(), nulls, filter) as i64;
    } else if in_lanes(groups.len(), counts.len()) {
        let cells = lanes.cells(counts.len(), 0);
        if nulls.is_none_or(|n| n.null_count() == 0) && filter.is_none() {
            // The groups stand in for values: only the lane cells are read.
            for_each_row_in_lanes(groups, groups, |c, _| cells[c] += delta);
        } else {
            for_each_selected(groups, nulls, filter, |r, g| cells[lane(r, g)] += delta);
        }
        lanes.fold_into(counts, 0, |a, b| a + b);
    } else {
        for_each_selected(groups, nulls, filter, |_, g| counts[g as usize] += delta);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_rng::XorShift;

    /// The rows visited are those both bitmaps select, in order, with their groups: over
    /// bitmaps of long runs of valid rows (whole words of set bits) and scattered NULLs, sliced
    /// at an offset inside a word, with lengths that leave a partial last word.
    #[test]
    fn the_rows_visited_are_the_selected_ones() {
        let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
        for case in 0..40 {
            let len = 1 + rng.below(700) as usize;
            let offset = rng.below(130) as usize;
            let total = offset + len;
            // Runs of valid rows, broken now and then: NULLs rare in some cases, common in others.
            let null_rate = [2u64, 50, 500][case % 3];
            let valid: Vec<bool> = (0..total).map(|_| rng.below(1000) >= null_rate).collect();
            let picked: Vec<bool> = (0..total).map(|_| rng.below(10) < 8).collect();
            let nulls = NullBuffer::from(valid.clone()).slice(offset, len);
            let filter = BooleanBuffer::from(picked.clone()).slice(offset, len);
            let groups: Vec<u32> = (0..len).map(|_| rng.below(5) as u32).collect();
            for (n, f) in [
                (Some(&nulls), None),
                (None, Some(&filter)),
                (Some(&nulls), Some(&filter)),
                (None, None),
            ] {
                let want: Vec<(usize, u32)> = (0..len)
                    .filter(|&r| {
                        (n.is_none() || valid[offset + r]) && (f.is_none() || picked[offset + r])
                    })
                    .map(|r| (r, groups[r]))
                    .collect();
                let mut got = vec![];
                for_each_selected(&groups, n, f, |r, g| got.push((r, g)));
                assert_eq!(got, want, "case {case}: {len} rows at offset {offset}");
                assert_eq!(count_selected(len, n, f), want.len());
            }
        }
    }

    /// Counting in lanes gives what one cell per group gives, over few and many groups, with
    /// the lanes reused pass after pass and the group count changing.
    #[test]
    fn counts_in_lanes_are_the_plain_counts() {
        let mut lanes = Lanes::default();
        for (groups, rows) in [
            (3usize, 100usize),
            (3, 103),
            (7, 30),
            (200, 5000),
            (5, 7),
            (1, 64),
            (2000, 9000),
            (1, 300),
        ] {
            let ids: Vec<u32> = (0..rows)
                .map(|r| {
                    if r % 3 == 0 {
                        0
                    } else {
                        ((r * 7919) % groups) as u32
                    }
                })
                .collect();
            let mut want = vec![0i64; groups];
            for &g in &ids {
                want[g as usize] += 2;
            }
            let mut got = vec![0i64; groups];
            count_rows(&ids, None, None, &mut got, 2, &mut lanes);
            count_rows(&ids, None, None, &mut got, -1, &mut lanes);
            count_rows(&ids, None, None, &mut got, 1, &mut lanes);
            assert_eq!(got, want, "{groups} groups, {rows} rows");
        }
    }

    /// A batch is of one group only where every row is, whatever block the odd row is in.
    #[test]
    fn one_group_is_told_from_several() {
        assert_eq!(only_group(&[]), None);
        assert_eq!(only_group(&[5]), Some(5));
        for len in [2, 63, 64, 65, 200] {
            let mut ids = vec![3u32; len];
            assert_eq!(only_group(&ids), Some(3), "{len} rows");
            for odd in [0, len / 2, len - 1] {
                ids[odd] = 4;
                assert_eq!(only_group(&ids), None, "{len} rows, row {odd} apart");
                ids[odd] = 3;
            }
        }
    }

    /// With NULLs and a filter, over one group, over several, and over several of which the
    /// batch holds one (all but its last row, or all), the counts are those of the rows both
    /// select.
    #[test]
    fn counts_skip_null_and_filtered_rows() {
        let mut lanes = Lanes::default();
        let rows = 200;
        let nulls = NullBuffer::from((0..rows).map(|r| r % 5 != 0).collect::<Vec<_>>());
        let filter = BooleanBuffer::from((0..rows).map(|r| r % 3 != 1).collect::<Vec<_>>());
        let spread = |groups: usize| (0..rows).map(|r| (r % groups) as u32).collect::<Vec<_>>();
        let mut nearly_one = vec![4u32; rows];
        nearly_one[rows - 1] = 2;
        for (groups, ids) in [
            (1usize, spread(1)),
            (7, spread(7)),
            (7, vec![4; rows]),
            (7, nearly_one),
        ] {
            for (n, f) in [
                (None, None),
                (Some(&nulls), None),
                (None, Some(&filter)),
                (Some(&nulls), Some(&filter)),
            ] {
                let mut want = vec![0i64; groups];
                for (r, &g) in ids.iter().enumerate() {
                    if n.is_none_or(|n| n.is_valid(r)) && f.is_none_or(|f| f.value(r)) {
                        want[g as usize] += 3;
                    }
                }
                let mut got = vec![0i64; groups];
                count_rows(&ids, n, f, &mut got, 3, &mut lanes);
                assert_eq!(
                    got,
                    want,
                    "{groups} groups, nulls {}, filter {}",
                    n.is_some(),
                    f.is_some()
                );
            }
        }
    }
}
