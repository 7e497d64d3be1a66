//! The cold keys' changes of one PARTIAL worker, held and merged per key as the FINAL's
//! mini-batch would merge them.
//!
//! Read through, a cold key's changelog is cut at its PARTIAL worker's firings. A worker that
//! fires often (its mini-batch counts every row and DISTINCT entry it takes) would then emit an
//! update of each key it touched at every firing, where the FINAL, merging them, fires once its
//! own mini-batch holds `table.exec.mini-batch.size` delta rows (one per key and PARTIAL firing)
//! and emits one update per key. [`Coalescer`] does that for the changes read through: it holds
//! them until they count that many (a change of one key at one firing counts one, as its delta
//! row would), or until the worker's epoch ends by the latency trigger or the input ends, and
//! then hands on, per key, in the order the keys first changed, the change from the value the
//! key had before the first held change to the value after the last: `+I`, `-U`/`+U`, `-D`, or
//! nothing where it ended as it began.
//!
//! Merging costs a key lookup and a copy per change; where it leaves more than half of the
//! changes (each firing touching other keys: Nexmark q16's 10,000 channels), it is not worth
//! it, and the changes go on as they come: after [`MEASURED_WINDOWS`] mini-batches, a coalescer
//! that kept more than [`MERGE_PAYS_BELOW`] of its changes hands them on as they come, and
//! measures again after [`PASS_WINDOWS`] mini-batches' worth. The choice depends only on the
//! changes, so the changelog is the same on every run.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Int8Array, RecordBatch};
use arrow::compute::interleave;
use arrow::datatypes::{DataType, Int8Type, SchemaRef};
use tally_kernels::group_values::{GroupValues, new_group_values};

use crate::changelog::{ChangeBatch, RowKind};
use crate::error::{Error, Result};
use crate::operator::mini_batch::changed_rows;

/// Mini-batches a coalescer merges before it decides whether merging pays.
const MEASURED_WINDOWS: usize = 4;

/// The share of its changes a coalescer may keep for merging to pay: above it, they go on as
/// they come.
const MERGE_PAYS_BELOW: f64 = 0.5;

/// Mini-batches' worth of changes a coalescer hands on as they come before it measures again.
const PASS_WINDOWS: usize = 256;

/// One key's held changes: where its first value (before the first held change) and its last
/// value (after the last) lie, as (batch, row) of the held batches.
#[derive(Debug, Clone, Copy)]
struct Net {
    /// The held batch (firing) that changed the key first.
    since: u32,
    /// The value before the first change: the old row of a first `-U` or `-D`.
    first: Option<(u32, u32)>,
    /// Whether the key had a value before the first change (its first row was no `+I`; without
    /// `-U` rows an update is a `+U` alone, and the old value is not known).
    existed: bool,
    /// The value after the last change; `None` where the last was a `-D`.
    last: Option<(u32, u32)>,
    /// The last `-D` row.
    gone: Option<(u32, u32)>,
    /// Whether more than one held batch (firing) changed the key: only then can its last value
    /// be its first (a firing's changes read through change what they show).
    merged: bool,
}

/// Holds a worker's changes read through and merges them per key (see the module docs).
#[derive(Debug)]
pub(super) struct Coalescer {
    output: SchemaRef,
    /// The key columns: the first of the output.
    keys: usize,
    /// The held changes' keys, interned in the order they first changed (a local phase's key
    /// table), forgotten at each flush.
    table: Box<dyn GroupValues>,
    size: usize,
    emit_update_before: bool,
    held: Vec<ChangeBatch>,
    /// Per held batch, each row's key id in `table`.
    held_ids: Vec<Vec<u32>>,
    /// Changes held, a key and firing counting one.
    records: usize,
    /// Changes taken and handed on since the last decision, counted as `records`.
    measured: (usize, usize),
    /// Changes left to hand on as they come (none: merging).
    passing: usize,
}

/// The changes `batch` holds, a key's change counting one: its rows less its `-U` rows (each
/// goes with the `+U` after it).
fn changes_in(batch: &ChangeBatch) -> Result<usize> {
    let befores = match &batch.op {
        Some(op) => op
            .as_primitive_opt::<Int8Type>()
            .ok_or_else(|| Error::internal("row kinds that are not Int8 codes"))?
            .values()
            .iter()
            .filter(|&&c| c == RowKind::UpdateBefore.code())
            .count(),
        None => 0,
    };
    Ok(batch.num_rows() - befores)
}

impl Coalescer {
    /// Holds changes of `output` (its first `keys` columns the key) until they count `size`.
    ///
    /// # Errors
    /// Key types the row format cannot take (a bug: they were group keys).
    pub(super) fn try_new(
        output: SchemaRef,
        keys: usize,
        size: usize,
        emit_update_before: bool,
    ) -> Result<Self> {
        let types: Vec<DataType> = output.fields()[..keys]
            .iter()
            .map(|f| f.data_type().clone())
            .collect();
        let table = new_group_values(&types)
            .map_err(|e| Error::internal(format!("a FINAL's key table: {e}")))?;
        Ok(Self {
            output,
            keys,
            table,
            size: size.max(1),
            emit_update_before,
            held: vec![],
            held_ids: vec![],
            records: 0,
            measured: (0, 0),
            passing: 0,
        })
    }

    /// Takes the changes of one firing read through, with the hash of each row's key
    /// (`hashes`, as [`tally_kernels::hash::hash_columns`] gives them over the key columns);
    /// hands on the merged changes of all held ones once they count the mini-batch size.
    ///
    /// # Errors
    /// As [`Coalescer::flush`], and keys of other types than the output's (a bug).
    pub(super) fn push(
        &mut self,
        changes: ChangeBatch,
        hashes: &[u64],
    ) -> Result<Option<ChangeBatch>> {
        if changes.num_rows() == 0 {
            return Ok(None);
        }
        let records = changes_in(&changes)?;
        if self.passing > 0 {
            self.passing = self.passing.saturating_sub(records);
            return Ok(Some(changes));
        }
        let mut ids = vec![];
        self.table
            .intern(&changes.data.columns()[..self.keys], hashes, &mut ids)
            .map_err(|e| Error::internal(format!("a FINAL's key table: {e}")))?;
        self.held.push(changes);
        self.held_ids.push(ids);
        self.records += records;
        if self.records >= self.size {
            return self.flush();
        }
        Ok(None)
    }

    /// Counts a merge of `taken` changes into `kept`, and once [`MEASURED_WINDOWS`] mini-batches
    /// were measured, decides whether the next changes go on as they come.
    fn measure(&mut self, taken: usize, kept: usize) {
        self.measured.0 += taken;
        self.measured.1 += kept;
        let (taken, kept) = self.measured;
        if taken >= MEASURED_WINDOWS * self.size {
            if kept as f64 > MERGE_PAYS_BELOW * taken as f64 {
                self.passing = PASS_WINDOWS * self.size;
            }
            self.measured = (0, 0);
        }
    }

    /// Hands on the merged changes of every held one (none where none are held, or where every
    /// key ended as it began).
    ///
    /// # Errors
    /// Held rows of another schema, or row kinds that are not codes (bugs).
    pub(super) fn flush(&mut self) -> Result<Option<ChangeBatch>> {
        if self.held.is_empty() {
            return Ok(None);
        }
        let held = std::mem::take(&mut self.held);
        let ids = std::mem::take(&mut self.held_ids);
        let taken = std::mem::take(&mut self.records);
        let nets = self.nets(&held, &ids)?;
        self.table.clear();
        let merged = self.merged(&held, &nets)?;
        let kept = merged.as_ref().map_or(Ok(0), changes_in)?;
        self.measure(taken, kept);
        Ok(merged)
    }

    /// Each key's first and last value over the held batches (`ids`: each row's key id), in
    /// the order the keys first changed (a key table need not number keys in row order: one
    /// over dictionaries numbers a batch's values first).
    fn nets(&self, held: &[ChangeBatch], ids: &[Vec<u32>]) -> Result<Vec<Net>> {
        let mut nets: Vec<Option<Net>> = vec![None; self.table.len()];
        let mut order: Vec<u32> = Vec::with_capacity(nets.len());
        for (b, (batch, ids)) in held.iter().zip(ids).enumerate() {
            let b = b as u32;
            for (r, (kind, &id)) in batch.row_kinds()?.into_iter().zip(ids).enumerate() {
                let at = (b, r as u32);
                let net = nets
                    .get_mut(id as usize)
                    .ok_or_else(|| Error::internal("a key id past the key table"))?
                    .get_or_insert_with(|| {
                        order.push(id);
                        let first =
                            matches!(kind, RowKind::UpdateBefore | RowKind::Delete).then_some(at);
                        Net {
                            since: b,
                            first,
                            existed: kind != RowKind::Insert,
                            last: first,
                            gone: None,
                            merged: false,
                        }
                    });
                net.merged |= net.since != b;
                match kind {
                    RowKind::Insert | RowKind::UpdateAfter => net.last = Some(at),
                    RowKind::Delete => (net.last, net.gone) = (None, Some(at)),
                    RowKind::UpdateBefore => {}
                }
            }
        }
        Ok(order
            .into_iter()
            .filter_map(|id| nets[id as usize])
            .collect())
    }

    /// The changes from each key's first value to its last.
    fn merged(&self, held: &[ChangeBatch], nets: &[Net]) -> Result<Option<ChangeBatch>> {
        // Keys that more than one firing updated may have come back to their first value:
        // their old and new rows are compared column by column.
        let both: Vec<&Net> = nets
            .iter()
            .filter(|n| n.merged && n.first.is_some() && n.last.is_some())
            .collect();
        // The rows at `at` of the held batches' columns `cols`.
        let pick = |at: &mut dyn Iterator<Item = (u32, u32)>,
                    cols: std::ops::Range<usize>|
         -> Result<Vec<ArrayRef>> {
            let at: Vec<(usize, usize)> = at.map(|(b, r)| (b as usize, r as usize)).collect();
            cols.map(|c| {
                let columns: Vec<&dyn Array> =
                    held.iter().map(|h| h.data.column(c).as_ref()).collect();
                Ok(interleave(&columns, &at)?)
            })
            .collect()
        };
        let changed = {
            // A key's old and new rows share its keys: only the other columns are compared.
            let values = self.keys..self.output.fields().len();
            let olds = pick(&mut both.iter().filter_map(|n| n.first), values.clone())?;
            let news = pick(&mut both.iter().filter_map(|n| n.last), values)?;
            changed_rows(&olds, &news)?
        };
        let mut rows: Vec<(u32, u32)> = vec![];
        let mut kinds: Vec<i8> = vec![];
        let mut pair = 0;
        for net in nets {
            match (net.first, net.last) {
                (None, Some(new)) => {
                    rows.push(new);
                    kinds.push(if net.existed {
                        RowKind::UpdateAfter.code()
                    } else {
                        RowKind::Insert.code()
                    });
                }
                (Some(old), None) => {
                    rows.push(old);
                    kinds.push(RowKind::Delete.code());
                }
                (None, None) if net.existed => {
                    if let Some(gone) = net.gone {
                        rows.push(gone);
                        kinds.push(RowKind::Delete.code());
                    }
                }
                (Some(old), Some(new)) => {
                    let kept = !net.merged || changed.value(pair);
                    pair += usize::from(net.merged);
                    if kept && self.emit_update_before {
                        rows.push(old);
                        kinds.push(RowKind::UpdateBefore.code());
                    }
                    if kept {
                        rows.push(new);
                        kinds.push(RowKind::UpdateAfter.code());
                    }
                }
                (None, None) => {}
            }
        }
        if rows.is_empty() {
            return Ok(None);
        }
        let columns = pick(&mut rows.into_iter(), 0..self.output.fields().len())?;
        let data = RecordBatch::try_new(Arc::clone(&self.output), columns)
            .map_err(|e| Error::internal(format!("a FINAL's merged changes: {e}")))?;
        let op: ArrayRef = Arc::new(Int8Array::from(kinds));
        Ok(Some(ChangeBatch::try_new(Some(op), data)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operator::read_through::tests::{output, rows};
    use arrow::array::{Int64Array, StringArray};

    fn changes(rows: &[(RowKind, &str, i64)]) -> ChangeBatch {
        let data = RecordBatch::try_new(
            output(),
            vec![
                Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.1))),
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.2))),
            ],
        )
        .unwrap();
        let codes: Vec<i8> = rows.iter().map(|r| r.0.code()).collect();
        ChangeBatch::try_new(Some(Arc::new(Int8Array::from(codes))), data).unwrap()
    }

    /// Pushes `changes` with their keys' hashes, as the cut gives them.
    fn push(held: &mut Coalescer, changes: ChangeBatch) -> Option<ChangeBatch> {
        let mut hashes = vec![];
        tally_kernels::hash::hash_columns(&changes.data.columns()[..1], &mut hashes).unwrap();
        held.push(changes, &hashes).unwrap()
    }

    fn shown(b: Option<ChangeBatch>) -> Vec<String> {
        b.as_ref().map(rows).unwrap_or_default()
    }

    /// Held changes merge per key, in the order the keys first changed, into the change from
    /// the value before the first to the value after the last: an insert then updates is one
    /// insert, updates back to the old value are nothing, an insert then a delete is nothing,
    /// updates then a delete are one delete of the old value. They are handed on once they
    /// count the size (a key's change at one firing counting one), or at a flush.
    #[test]
    fn held_changes_merge_per_key_from_first_to_last() {
        use RowKind::*;
        let mut held = Coalescer::try_new(output(), 1, 100, true).unwrap();
        let first = changes(&[
            (Insert, "a", 1),
            (UpdateBefore, "b", 2),
            (UpdateAfter, "b", 3),
            (Insert, "c", 1),
            (UpdateBefore, "d", 4),
            (UpdateAfter, "d", 6),
            (UpdateBefore, "e", 7),
            (UpdateAfter, "e", 8),
        ]);
        assert!(push(&mut held, first).is_none());
        let second = changes(&[
            (UpdateBefore, "a", 1),
            (UpdateAfter, "a", 5),
            (Delete, "c", 1),
            (UpdateBefore, "b", 3),
            (UpdateAfter, "b", 2),
            (Delete, "d", 6),
            (UpdateBefore, "e", 8),
            (UpdateAfter, "e", 9),
        ]);
        assert!(push(&mut held, second).is_none());
        assert_eq!(
            shown(held.flush().unwrap()),
            ["+I[a, 5]", "-D[d, 4]", "-U[e, 7]", "+U[e, 9]"]
        );
        assert!(held.flush().unwrap().is_none());
        // Due at the size: three keys' changes, the pair of one counting one.
        let mut held = Coalescer::try_new(output(), 1, 3, true).unwrap();
        let two = changes(&[
            (Insert, "a", 1),
            (UpdateBefore, "b", 1),
            (UpdateAfter, "b", 2),
        ]);
        assert!(push(&mut held, two).is_none());
        let third = changes(&[(Insert, "c", 1)]);
        assert_eq!(
            shown(push(&mut held, third)),
            ["+I[a, 1]", "-U[b, 1]", "+U[b, 2]", "+I[c, 1]"]
        );
    }

    /// Without `-U` rows (an upsert consumer) an update is a `+U` alone: a key first seen
    /// so stays an update, a `-D` after it deletes the row it carries.
    #[test]
    fn without_update_before_a_first_update_stays_an_update() {
        use RowKind::*;
        let mut held = Coalescer::try_new(output(), 1, 100, false).unwrap();
        let rows = changes(&[
            (UpdateAfter, "a", 2),
            (UpdateAfter, "a", 3),
            (UpdateAfter, "b", 5),
            (Delete, "b", 5),
            (Insert, "c", 1),
            (UpdateAfter, "c", 2),
        ]);
        assert!(push(&mut held, rows).is_none());
        assert_eq!(
            shown(held.flush().unwrap()),
            ["+U[a, 3]", "-D[b, 5]", "+I[c, 2]"]
        );
    }

    /// Where merging keeps more than half of the changes (each firing touching other keys), the
    /// coalescer hands them on as they come after measuring a few mini-batches, and measures
    /// again later; where it keeps few (the same keys at every firing), it goes on merging.
    #[test]
    fn merging_stops_where_it_keeps_most_changes() {
        use RowKind::*;
        let mut other_keys = Coalescer::try_new(output(), 1, 2, true).unwrap();
        let mut handed = 0;
        for i in 0..MEASURED_WINDOWS * 2 {
            let key = format!("k{i}");
            let b = changes(&[(Insert, &key, 1)]);
            handed += push(&mut other_keys, b).map_or(0, |b| b.num_rows());
        }
        // Every change kept: merging stopped; the next change goes on at once.
        assert_eq!(handed, MEASURED_WINDOWS * 2);
        assert_eq!(other_keys.passing, PASS_WINDOWS * 2);
        let next = push(&mut other_keys, changes(&[(Insert, "x", 1)]));
        assert_eq!(shown(next), ["+I[x, 1]"]);
        let mut same_keys = Coalescer::try_new(output(), 1, 2, true).unwrap();
        for i in 0..MEASURED_WINDOWS * 4 {
            let b = changes(&[
                (UpdateBefore, "a", i as i64),
                (UpdateAfter, "a", i as i64 + 1),
            ]);
            push(&mut same_keys, b);
        }
        assert_eq!(same_keys.passing, 0);
    }
}
