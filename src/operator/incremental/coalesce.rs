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

use arrow::array::AsArray;
use arrow::array::{Array, ArrayRef, Int8Array, RecordBatch};
use arrow::compute::interleave;
use arrow::datatypes::{Int8Type, SchemaRef};
use arrow::row::{RowConverter, Rows, SortField};
use hashbrown::HashTable;

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
    /// A row holding the key (to compare keys).
    at: (u32, u32),
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
    converter: RowConverter,
    size: usize,
    emit_update_before: bool,
    held: Vec<ChangeBatch>,
    /// The held batches' keys, as rows.
    held_keys: Vec<Rows>,
    /// Changes held, a key and firing counting one.
    records: usize,
    /// Changes taken and handed on since the last decision, counted as `records`.
    measured: (usize, usize),
    /// Changes left to hand on as they come (none: merging).
    passing: usize,
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
        let fields = output.fields()[..keys]
            .iter()
            .map(|f| SortField::new(f.data_type().clone()))
            .collect();
        let converter = RowConverter::new(fields)
            .map_err(|e| Error::internal(format!("a FINAL's key rows: {e}")))?;
        Ok(Self {
            output,
            keys,
            converter,
            size: size.max(1),
            emit_update_before,
            held: vec![],
            held_keys: vec![],
            records: 0,
            measured: (0, 0),
            passing: 0,
        })
    }

    /// Takes the changes of one firing read through; hands on the merged changes of all held
    /// ones once they count the mini-batch size.
    ///
    /// # Errors
    /// As [`Coalescer::flush`].
    pub(super) fn push(&mut self, changes: ChangeBatch) -> Result<Option<ChangeBatch>> {
        let n = changes.num_rows();
        if n == 0 {
            return Ok(None);
        }
        let befores = match &changes.op {
            Some(op) => op
                .as_primitive_opt::<Int8Type>()
                .ok_or_else(|| Error::internal("row kinds that are not Int8 codes"))?
                .values()
                .iter()
                .filter(|&&c| c == RowKind::UpdateBefore.code())
                .count(),
            None => 0,
        };
        let records = n - befores;
        if self.passing > 0 {
            self.passing = self.passing.saturating_sub(records);
            return Ok(Some(changes));
        }
        let keys = self
            .converter
            .convert_columns(&changes.data.columns()[..self.keys])
            .map_err(|e| Error::internal(format!("a FINAL's key rows: {e}")))?;
        self.held.push(changes);
        self.held_keys.push(keys);
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
        let keys = std::mem::take(&mut self.held_keys);
        let taken = std::mem::take(&mut self.records);
        let nets = self.nets(&held, &keys)?;
        let merged = self.merged(&held, &nets)?;
        let kept = merged.as_ref().map_or(0, |m| {
            m.row_kinds().map_or(m.num_rows(), |k| {
                k.iter().filter(|&&k| k != RowKind::UpdateBefore).count()
            })
        });
        self.measure(taken, kept);
        Ok(merged)
    }

    /// Each key's first and last value over the held batches, in the order the keys first
    /// changed.
    fn nets(&self, held: &[ChangeBatch], keys: &[Rows]) -> Result<Vec<Net>> {
        let state = ahash::RandomState::with_seeds(7, 11, 13, 17);
        let mut table: HashTable<u32> = HashTable::new();
        let mut nets: Vec<Net> = vec![];
        for (b, (batch, rows)) in held.iter().zip(keys).enumerate() {
            let kinds = batch.row_kinds()?;
            for (r, kind) in kinds.into_iter().enumerate() {
                let key = rows.row(r);
                let hash = state.hash_one(key.as_ref());
                let at = (b as u32, r as u32);
                let found = table.find(hash, |&i| {
                    let (hb, hr) = nets[i as usize].at;
                    keys[hb as usize].row(hr as usize) == key
                });
                let i = match found {
                    Some(&i) => i as usize,
                    None => {
                        let i = nets.len();
                        let first =
                            matches!(kind, RowKind::UpdateBefore | RowKind::Delete).then_some(at);
                        nets.push(Net {
                            at,
                            first,
                            existed: kind != RowKind::Insert,
                            last: first,
                            gone: None,
                            merged: false,
                        });
                        table.insert_unique(hash, i as u32, |&j| {
                            let (hb, hr) = nets[j as usize].at;
                            state.hash_one(keys[hb as usize].row(hr as usize).as_ref())
                        });
                        i
                    }
                };
                nets[i].merged |= nets[i].at.0 != at.0;
                match kind {
                    RowKind::Insert | RowKind::UpdateAfter => nets[i].last = Some(at),
                    RowKind::Delete => (nets[i].last, nets[i].gone) = (None, Some(at)),
                    RowKind::UpdateBefore => {}
                }
            }
        }
        Ok(nets)
    }

    /// The changes from each key's first value to its last.
    fn merged(&self, held: &[ChangeBatch], nets: &[Net]) -> Result<Option<ChangeBatch>> {
        // Keys that more than one firing updated may have come back to their first value:
        // their old and new rows are compared column by column.
        let both: Vec<&Net> = nets
            .iter()
            .filter(|n| n.merged && n.first.is_some() && n.last.is_some())
            .collect();
        let pick = |at: &mut dyn Iterator<Item = (u32, u32)>| -> Result<Vec<ArrayRef>> {
            let at: Vec<(usize, usize)> = at.map(|(b, r)| (b as usize, r as usize)).collect();
            (0..self.output.fields().len())
                .map(|c| {
                    let columns: Vec<&dyn Array> =
                        held.iter().map(|h| h.data.column(c).as_ref()).collect();
                    Ok(interleave(&columns, &at)?)
                })
                .collect()
        };
        let changed = {
            let olds = pick(&mut both.iter().filter_map(|n| n.first))?;
            let news = pick(&mut both.iter().filter_map(|n| n.last))?;
            changed_rows(&olds[self.keys..], &news[self.keys..])?
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
        let columns = pick(&mut rows.into_iter())?;
        let data = RecordBatch::try_new(Arc::clone(&self.output), columns)
            .map_err(|e| Error::internal(format!("a FINAL's merged changes: {e}")))?;
        let op: ArrayRef = Arc::new(Int8Array::from(kinds));
        Ok(Some(ChangeBatch::try_new(Some(op), data)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int64Array, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};

    fn output() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("k", DataType::Utf8, true),
            Field::new("n", DataType::Int64, false),
        ]))
    }

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

    fn shown(b: Option<ChangeBatch>) -> Vec<String> {
        let Some(b) = b else { return vec![] };
        let kinds = b.row_kinds().unwrap();
        let k = b.data.column(0).as_string::<i32>();
        let n = b
            .data
            .column(1)
            .as_primitive::<arrow::datatypes::Int64Type>();
        (0..b.num_rows())
            .map(|i| format!("{}[{}, {}]", kinds[i].short(), k.value(i), n.value(i)))
            .collect()
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
        assert!(held.push(first).unwrap().is_none());
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
        assert!(held.push(second).unwrap().is_none());
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
        assert!(held.push(two).unwrap().is_none());
        let third = changes(&[(Insert, "c", 1)]);
        assert_eq!(
            shown(held.push(third).unwrap()),
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
        assert!(held.push(rows).unwrap().is_none());
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
            handed += other_keys.push(b).unwrap().map_or(0, |b| b.num_rows());
        }
        // Every change kept: merging stopped; the next change goes on at once.
        assert_eq!(handed, MEASURED_WINDOWS * 2);
        assert_eq!(other_keys.passing, PASS_WINDOWS * 2);
        let next = other_keys.push(changes(&[(Insert, "x", 1)])).unwrap();
        assert_eq!(shown(next), ["+I[x, 1]"]);
        let mut same_keys = Coalescer::try_new(output(), 1, 2, true).unwrap();
        for i in 0..MEASURED_WINDOWS * 4 {
            let b = changes(&[
                (UpdateBefore, "a", i as i64),
                (UpdateAfter, "a", i as i64 + 1),
            ]);
            same_keys.push(b).unwrap();
        }
        assert_eq!(same_keys.passing, 0);
    }
}
