//! A split PARTIAL's state that merges its buckets ([`KeyedState::merge_buckets`]: one group
//! per key and worker), cut back into the groups of state keyed by every key for a snapshot
//! ([`KeyedState::export_cut`]), and merged again on restore ([`KeyedState::import`]).
//!
//! A hot key's group holds the DISTINCT entries of the buckets its worker owns; each entry's
//! bucket is its value's ([`tally_kernels::hash::bucket_array`], as the Calc computes the
//! bucket columns), so the entries of a DISTINCT call's set cut exactly into one row per
//! (set, bucket), the row state keyed by every key holds. What no bucket locates (the plain
//! calls' state, DISTINCT calls with the keys alone, the record count and input rows) goes on
//! one row of the group, its carrier: the keys alone's row (NULL buckets) on the worker that
//! owns it, otherwise one of the group's bucket rows, which its worker owns. The FINAL adds up
//! a key's rows (or takes their extreme) wherever they lie, and the rows' keys stay unique:
//! every bucket row and every keys-alone row belongs to one worker. A cold key's group, its
//! buckets NULL, is one row as it is.
//!
//! Exact for insert-only input ([`KeyedState::cuts_merged_state`]): with retractions a plain
//! call's state and record count would have to lie on the rows whose retractions they meet.

use std::collections::BTreeSet;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, GenericListArray, Int32Array, Int64Array, RecordBatch, UInt32Array,
    UInt64Array,
};
use arrow::buffer::OffsetBuffer;
use arrow::compute::{interleave, take};
use arrow::datatypes::{DataType, SchemaRef};
use tally_kernels::hash::{bucket_array, hash_columns_after};

use super::KeyedState;
use crate::error::{Error, Result};
use crate::operator::accumulators::Accumulators;
use crate::operator::key_groups::KeyGroups;

/// A bucketed DISTINCT slot: its bucket column, its lists, and the bucket of each entry of a
/// hot group (None for the others').
type SlotLists<'a> = Option<(usize, &'a GenericListArray<i32>, Vec<Option<i32>>)>;

/// One row of a cut: the hot group of row `i` of the export, under bucket `b` of bucket column
/// `c` (`at`; None: the keys alone's row), carrying the group's unlocated state or not.
struct CutRow {
    i: usize,
    at: Option<(usize, i32)>,
    carrier: bool,
}

/// The rows of a cut and where the export's columns lie.
struct Cut<'a> {
    rows: &'a [CutRow],
    /// Each slot's first state column in the export, and its number of them.
    first: &'a [usize],
    widths: &'a [usize],
    /// Each slot's set and argument ([`Accumulators::slot_sets`]).
    slot_sets: &'a [(Option<usize>, Option<usize>)],
    lists: &'a [SlotLists<'a>],
    query_keys: usize,
    bucket_columns: usize,
    bucket_count: u32,
}

impl KeyedState {
    /// Whether this state, merging a split PARTIAL's buckets, can be cut into the groups of
    /// state keyed by every key ([`KeyedState::export_cut`]): insert-only input, and every
    /// call's state either DISTINCT entries of one bucketed set or with the keys alone
    /// ([`crate::plan::BucketKeys::call_sets`]).
    pub(crate) fn cuts_merged_state(&self) -> bool {
        self.cut_slot_sets().is_some()
    }

    /// Each slot's set and argument ([`Accumulators::slot_sets`]) where the state can be cut.
    fn cut_slot_sets(&self) -> Option<Vec<(Option<usize>, Option<usize>)>> {
        let sets = self.plan.bucket_keys.as_ref()?.call_sets.as_ref()?;
        self.accs
            .slot_sets(sets)
            .filter(|_| !self.plan.has_retractions())
    }

    /// Takes the key groups and the worker this state is, one of several
    /// ([`KeyedState::export_cut`]).
    pub(crate) fn set_owner(&mut self, key_groups: &KeyGroups, worker: usize) {
        self.owner = Some((key_groups.clone(), worker));
    }

    /// This state keyed by the query's keys alone, its buckets merged
    /// ([`KeyedState::merge_buckets`]): its live groups exported and imported, each key's
    /// groups merging into one, `chunk` groups at a time. For state restored from a snapshot
    /// (keyed by every key), where the run merges the buckets; None where it already does, or
    /// cannot be cut again ([`KeyedState::cuts_merged_state`]) and so keeps its keying.
    ///
    /// # Errors
    /// As [`KeyedState::import`].
    pub(crate) fn merged(&self, chunk: usize) -> Result<Option<Self>> {
        let has_buckets = self.plan.bucket_keys.is_some();
        if self.merges_buckets() || !has_buckets || !self.cuts_merged_state() {
            return Ok(None);
        }
        self.rebuilt_as(true, chunk).map(Some)
    }

    /// The groups `ids` of state that merges its buckets as the rows state keyed by every key
    /// would hold (see the module docs), of `schema` ([`KeyedState::snapshot_schema`]), on the
    /// worker [`KeyedState::set_owner`] names (none named: one worker owning every key): the
    /// groups in the order of `ids`, a cold key's as it is, a hot key's cut into its rows (so
    /// that a restore on as many workers numbers the groups as they were). Other state as
    /// [`KeyedState::export`] gives it.
    ///
    /// # Errors
    /// State that cannot be cut ([`KeyedState::cuts_merged_state`]); a group its worker owns no
    /// row for (a bug).
    pub(crate) fn export_cut(&self, ids: &[u32], schema: &SchemaRef) -> Result<Vec<RecordBatch>> {
        let whole = self.export(ids, schema)?;
        let Some(b) = self
            .plan
            .bucket_keys
            .as_ref()
            .filter(|_| self.merges_buckets())
        else {
            return Ok(vec![whole]);
        };
        let slot_sets = self.cut_slot_sets().ok_or_else(|| {
            Error::invalid_input(
                "cannot snapshot a split-distinct PARTIAL whose state merges its buckets (a run without checkpoints): set the checkpoints before the run",
            )
        })?;
        // The hot groups: their rows in the export and their query keys' hashes.
        let all = self.groups.hashes();
        let hot_keys = self.plan.hot_keys();
        let hot: Vec<(usize, u64)> = ids
            .iter()
            .map(|&g| all[g as usize])
            .enumerate()
            .filter(|&(_, h)| hot_keys.is_none_or(|k| k.is_hot(Some(h))))
            .collect();
        if hot.is_empty() {
            return Ok(vec![whole]);
        }
        let k = self.plan.key_types.len();
        let widths = self.accs.slot_widths();
        // Each slot's first state column in the export.
        let first: Vec<usize> = widths
            .iter()
            .scan(k, |at, &w| {
                let here = *at;
                *at += w;
                Some(here)
            })
            .collect();
        let lists: Vec<SlotLists<'_>> = slot_sets
            .iter()
            .enumerate()
            .map(|(s, &(set, arg))| match (set, arg) {
                (Some(c), Some(_)) => {
                    let list = whole.column(first[s]).as_list::<i32>();
                    let values = list.values().as_struct().column(0);
                    let offsets = list.value_offsets();
                    let mut of_entry = vec![None; values.len()];
                    for &(i, _) in &hot {
                        let (from, to) = (offsets[i] as usize, offsets[i + 1] as usize);
                        let buckets = bucket_array(&values.slice(from, to - from), b.buckets)?;
                        for (e, bucket) in buckets.iter().enumerate() {
                            of_entry[from + e] = bucket;
                        }
                    }
                    Ok(Some((c, list, of_entry)))
                }
                _ => Ok(None),
            })
            .collect::<Result<_>>()?;
        let rows = self.cut_rows(&hot, &lists, b.columns, b.buckets)?;
        let cut = Cut {
            rows: &rows,
            first: &first,
            widths: &widths,
            slot_sets: &slot_sets,
            lists: &lists,
            query_keys: k - b.columns,
            bucket_columns: b.columns,
            bucket_count: b.buckets,
        };
        let cut = self.cut_columns(&whole, &cut)?;
        // The groups in order: runs of cold ones as exported, runs of hot ones as cut.
        let mut out = vec![];
        let (mut next, mut r) = (0, 0);
        let mut run = 0;
        while run < hot.len() {
            let start = hot[run].0;
            let mut end = run + 1;
            while end < hot.len() && hot[end].0 == hot[end - 1].0 + 1 {
                end += 1;
            }
            if start > next {
                out.push(whole.slice(next, start - next));
            }
            let last = hot[end - 1].0;
            let n = rows[r..].iter().take_while(|row| row.i <= last).count();
            out.push(cut.slice(r, n));
            (next, r, run) = (last + 1, r + n, end);
        }
        if next < whole.num_rows() {
            out.push(whole.slice(next, whole.num_rows() - next));
        }
        Ok(out)
    }

    /// The rows a cut makes of the hot groups `hot` (each its row in the export and its query
    /// keys' hash; see the module docs), with `lists` of the bucketed DISTINCT slots, over
    /// `columns` bucket columns of `buckets` buckets each.
    fn cut_rows(
        &self,
        hot: &[(usize, u64)],
        lists: &[SlotLists<'_>],
        columns: usize,
        buckets: u32,
    ) -> Result<Vec<CutRow>> {
        // Whether this worker owns the row `at` (None: the keys alone's) of the group whose
        // query keys hash to `h`.
        let mine = |h: u64, at: Option<(usize, i32)>| -> Result<bool> {
            let Some((kg, me)) = &self.owner else {
                return Ok(true);
            };
            let cols: Vec<ArrayRef> = (0..columns)
                .map(|c| -> ArrayRef {
                    Arc::new(Int32Array::from(vec![at.filter(|a| a.0 == c).map(|a| a.1)]))
                })
                .collect();
            let mut whole = vec![];
            hash_columns_after(&[h], &cols, &mut whole)?;
            Ok(kg.worker_of_hash(whole[0]) == *me)
        };
        let mut rows: Vec<CutRow> = Vec::with_capacity(hot.len());
        // Per bucket column, the buckets a group's entries lie in.
        let mut marked: Vec<Vec<bool>> = vec![vec![false; buckets as usize]; columns];
        for &(i, h) in hot {
            for (c, list, of_entry) in lists.iter().flatten() {
                let entries =
                    list.value_offsets()[i] as usize..list.value_offsets()[i + 1] as usize;
                for bucket in &of_entry[entries] {
                    let bucket = bucket.ok_or_else(|| {
                        Error::internal("a DISTINCT entry without a bucket (a NULL value)")
                    })?;
                    marked[*c][bucket as usize] = true;
                }
            }
            // The group's bucket rows, in (column, bucket) order; the marks cleared.
            let mut pieces: BTreeSet<(usize, i32)> = BTreeSet::new();
            for (c, marks) in marked.iter_mut().enumerate() {
                for (b, mark) in marks.iter_mut().enumerate().filter(|(_, m)| **m) {
                    pieces.insert((c, b as i32));
                    *mark = false;
                }
            }
            // What no bucket locates: on the keys alone's row where this worker owns it, else
            // on a bucket row it owns (each of its pieces, as its rows came to it).
            let carrier = if mine(h, None)? {
                None
            } else {
                let mut owned = None;
                for at in pieces
                    .iter()
                    .copied()
                    .chain((0..columns).flat_map(|c| (0..buckets as i32).map(move |x| (c, x))))
                {
                    if mine(h, Some(at))? {
                        owned = Some(at);
                        break;
                    }
                }
                Some(owned.ok_or_else(|| {
                    Error::internal("a merged group on a worker that owns none of its rows")
                })?)
            };
            if let Some(at) = carrier {
                pieces.insert(at);
            }
            rows.extend(pieces.into_iter().map(|at| CutRow {
                i,
                at: Some(at),
                carrier: carrier == Some(at),
            }));
            if carrier.is_none() {
                rows.push(CutRow {
                    i,
                    at: None,
                    carrier: true,
                });
            }
        }
        Ok(rows)
    }

    /// The batch of `cut`'s rows of the hot groups in `whole` (see [`KeyedState::export_cut`]).
    fn cut_columns(&self, whole: &RecordBatch, cut: &Cut<'_>) -> Result<RecordBatch> {
        let Cut {
            rows,
            first,
            widths,
            slot_sets,
            lists,
            query_keys: q,
            bucket_columns,
            bucket_count,
        } = *cut;
        let width = whole.num_columns();
        let source = UInt32Array::from_iter_values(rows.iter().map(|r| r.i as u32));
        let mut cols: Vec<ArrayRef> = Vec::with_capacity(width);
        for c in &whole.columns()[..q] {
            cols.push(take(c.as_ref(), &source, None)?);
        }
        for c in 0..bucket_columns {
            cols.push(Arc::new(Int32Array::from_iter(
                rows.iter().map(|r| r.at.filter(|a| a.0 == c).map(|a| a.1)),
            )));
        }
        // The state of a group without rows: what a row carries none of.
        let mut empty = Accumulators::try_new(&self.plan)?;
        empty.grow_plain(1)?;
        let empty = empty.state(&[0])?;
        // A carrier's state is its group's, any other row's that of no rows.
        let picks: Vec<(usize, usize)> = rows
            .iter()
            .map(|r| if r.carrier { (0, r.i) } else { (1, 0) })
            .collect();
        let mut at = 0;
        for (s, &(set, _)) in slot_sets.iter().enumerate() {
            let w = widths[s];
            match &lists[s] {
                Some((c, list, buckets)) => {
                    debug_assert_eq!(Some(*c), set);
                    cols.push(cut_lists(list, buckets, rows, *c, bucket_count)?);
                }
                None => {
                    for j in 0..w {
                        let from = [whole.column(first[s] + j).as_ref(), empty[at + j].as_ref()];
                        cols.push(interleave(&from, &picks)?);
                    }
                }
            }
            at += w;
        }
        // The record count and the input rows on the carrier, every row written when its
        // group was last.
        let count1: &Int64Array = whole.column(width - 3).as_primitive();
        cols.push(Arc::new(Int64Array::from_iter_values(
            rows.iter()
                .map(|r| if r.carrier { count1.value(r.i) } else { 0 }),
        )));
        cols.push(take(whole.column(width - 2).as_ref(), &source, None)?);
        let input_rows: &UInt64Array = whole.column(width - 1).as_primitive();
        cols.push(Arc::new(UInt64Array::from_iter_values(
            rows.iter()
                .map(|r| if r.carrier { input_rows.value(r.i) } else { 0 }),
        )));
        RecordBatch::try_new(whole.schema(), cols)
            .map_err(|e| Error::internal(format!("snapshot batch: {e}")))
    }
}

/// A bucketed DISTINCT slot's lists cut to `rows` (each hot group's rows side by side, `i`
/// its row in `list`), `of_entry` holding the bucket of each of their entries: a bucket row of
/// column `c` (of `buckets` buckets) takes its group's entries in its bucket, any other row
/// none. One pass over the entries, whatever the number of rows a group is cut into.
fn cut_lists(
    list: &GenericListArray<i32>,
    of_entry: &[Option<i32>],
    rows: &[CutRow],
    c: usize,
    buckets: u32,
) -> Result<ArrayRef> {
    let offsets = list.value_offsets();
    let entries = |i: usize| offsets[i] as usize..offsets[i + 1] as usize;
    // Each entry's row, or none.
    let mut dest: Vec<u32> = vec![u32::MAX; of_entry.len()];
    // A group's row of each bucket of column `c`, while its entries are placed.
    let mut row_of: Vec<u32> = vec![u32::MAX; buckets as usize];
    let of_c = |r: &CutRow| r.at.filter(|a| a.0 == c).map(|a| a.1 as usize);
    let mut start = 0;
    while start < rows.len() {
        let i = rows[start].i;
        let end = start + rows[start..].iter().take_while(|r| r.i == i).count();
        let group = &rows[start..end];
        for (k, r) in group.iter().enumerate() {
            if let Some(b) = of_c(r) {
                row_of[b] = (start + k) as u32;
            }
        }
        for e in entries(i) {
            if let Some(b) = of_entry[e] {
                dest[e] = row_of[b as usize];
            }
        }
        for b in group.iter().filter_map(of_c) {
            row_of[b] = u32::MAX;
        }
        start = end;
    }
    // The entries row by row, each row's in their order.
    let mut ends = vec![0i32; rows.len() + 1];
    for &at in dest.iter().filter(|&&at| at != u32::MAX) {
        ends[at as usize + 1] += 1;
    }
    for r in 0..rows.len() {
        ends[r + 1] = ends[r]
            .checked_add(ends[r + 1])
            .ok_or_else(|| Error::internal("a snapshot's DISTINCT list past 2^31 entries"))?;
    }
    let mut next: Vec<i32> = ends[..rows.len()].to_vec();
    let mut picks = vec![0u32; ends[rows.len()] as usize];
    for (e, &at) in dest.iter().enumerate() {
        if at != u32::MAX {
            picks[next[at as usize] as usize] = e as u32;
            next[at as usize] += 1;
        }
    }
    let values = take(list.values().as_ref(), &UInt32Array::from(picks), None)?;
    let DataType::List(field) = list.data_type() else {
        return Err(Error::internal(
            "a DISTINCT state column that is not a list",
        ));
    };
    Ok(Arc::new(GenericListArray::<i32>::try_new(
        Arc::clone(field),
        OffsetBuffer::new(ends.into()),
        values,
        None,
    )?))
}

#[cfg(test)]
mod tests;
