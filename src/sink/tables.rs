//! Materializing a changelog into the table it describes: keyed by the group keys
//! ([`FinalTable`]), as a multiset ([`MultisetTable`]), or whichever of the two a query's
//! changelog calls for ([`ResultTable`]).

use std::ops::Range;
use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch};
use arrow::datatypes::SchemaRef;
use arrow_row::{RowConverter, SortField};
use hashbrown::hash_table::Entry;
use rayon::prelude::*;

use crate::changelog::{ChangeBatch, RowKind};
use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};
use crate::sink::Sink;
use crate::sink::shards::{RowShards, Sorted};

/// The row kinds of `changes` (all `+I` when it has none), checked against `schema`.
fn kinds(changes: &ChangeBatch, schema: &SchemaRef) -> Result<Vec<RowKind>> {
    if changes.data.schema().fields() != schema.fields() {
        return Err(Error::invalid_input(format!(
            "changelog batch of another schema: {:?}, the table has {:?}",
            changes.data.schema(),
            schema
        )));
    }
    changes.row_kinds()
}

/// Rows decoded in pieces of this many, side by side on rayon's pool.
const DECODE_PIECE_ROWS: usize = 1 << 16;

/// The columns of `rows` (bytes `converter` made), in order.
fn decode<'a>(
    converter: &RowConverter,
    rows: impl Iterator<Item = &'a [u8]>,
) -> Result<Vec<ArrayRef>> {
    let parser = converter.parser();
    Ok(converter.convert_rows(rows.map(|r| parser.parse(r)))?)
}

/// Hands `f`, in order, the batches `decode` makes of the pieces of `n` sorted entries (at most
/// `piece_rows` each; one empty piece when there are none). Pieces are decoded a
/// window at a time, side by side on rayon's pool, and handed on before the next window: the
/// decoded table is never whole in memory.
fn for_each_piece(
    n: usize,
    piece_rows: usize,
    decode: impl Fn(Range<usize>) -> Result<RecordBatch> + Sync,
    mut f: impl FnMut(RecordBatch) -> Result<()>,
) -> Result<()> {
    let piece_rows = piece_rows.max(1);
    if n <= piece_rows {
        return f(decode(0..n)?);
    }
    let pieces: Vec<Range<usize>> = (0..n)
        .step_by(piece_rows)
        .map(|start| start..(start + piece_rows).min(n))
        .collect();
    let window = 2 * rayon::current_num_threads().max(1);
    for group in pieces.chunks(window) {
        let batches: Vec<RecordBatch> = group
            .par_iter()
            .map(|r| decode(r.clone()))
            .collect::<Result<_>>()?;
        for b in batches {
            f(b)?;
        }
    }
    Ok(())
}

/// The pieces a table's `for_each_sorted` hands on, joined into one batch of `schema`.
fn joined(
    schema: &SchemaRef,
    for_each_sorted: impl FnOnce(&mut dyn FnMut(RecordBatch) -> Result<()>) -> Result<()>,
) -> Result<RecordBatch> {
    let mut pieces = vec![];
    for_each_sorted(&mut |b| {
        pieces.push(b);
        Ok(())
    })?;
    if pieces.len() == 1 {
        return Ok(pieces.swap_remove(0));
    }
    arrow::compute::concat_batches(schema, &pieces)
        .map_err(|e| Error::internal(format!("final table: {e}")))
}

fn converter(schema: &SchemaRef, columns: &[usize]) -> Result<RowConverter> {
    RowConverter::new(
        columns
            .iter()
            .map(|&i| SortField::new(schema.field(i).data_type().clone()))
            .collect(),
    )
    .map_err(|e| Error::invalid_input(format!("cannot materialize: {e}")))
}

/// The table a changelog describes, keyed by the group keys: `+I`/`+U` set a key's row, `-D`
/// removes it, `-U` is checked against the row it retracts. Works with and without `-U` rows.
///
/// # Examples
/// ```
/// # use std::sync::Arc;
/// # use arrow::array::{Int8Array, Int64Array, RecordBatch, StringArray};
/// # use arrow::datatypes::{DataType, Field, Schema};
/// use tally::changelog::ChangeBatch;
/// use tally::sink::FinalTable;
/// let schema = Arc::new(Schema::new(vec![
///     Field::new("k", DataType::Utf8, true),
///     Field::new("n", DataType::Int64, false),
/// ]));
/// let rows = RecordBatch::try_new(schema.clone(), vec![
///     Arc::new(StringArray::from(vec!["b", "a", "b", "b", "a"])),
///     Arc::new(Int64Array::from(vec![1, 1, 1, 2, 1])),
/// ]).unwrap();
/// let kinds = Arc::new(Int8Array::from(vec![0, 0, 1, 2, 3])); // +I +I -U +U -D
/// let mut table = FinalTable::try_new(schema, &[0]).unwrap();
/// table.apply(&ChangeBatch::try_new(Some(kinds), rows).unwrap()).unwrap();
/// let result = table.to_batch().unwrap();
/// assert_eq!(result.num_rows(), 1); // b = 2; a was deleted
/// ```
pub struct FinalTable {
    schema: SchemaRef,
    key_columns: Vec<usize>,
    value_columns: Vec<usize>,
    keys: RowConverter,
    values: RowConverter,
    /// Key row bytes (empty for a global aggregate) → value row bytes, overwritten in place by
    /// the key's next row.
    rows: RowShards<Vec<u8>>,
}

impl std::fmt::Debug for FinalTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FinalTable")
            .field("rows", &self.rows.len())
            .finish()
    }
}

impl FinalTable {
    /// A table for changes of rows of `schema`, keyed by the columns `keys` (none for a global
    /// aggregate).
    ///
    /// # Errors
    /// A key column that is not in the schema (or named twice), or a column type that cannot
    /// be compared.
    pub fn try_new(schema: SchemaRef, keys: &[usize]) -> Result<Self> {
        let width = schema.fields().len();
        let mut seen = vec![false; width];
        for &k in keys {
            if k >= width || std::mem::replace(&mut seen[k], true) {
                return Err(Error::invalid_input(format!(
                    "key column {k} is not a column of the {width} of the changelog, or is named twice"
                )));
            }
        }
        let value_columns: Vec<usize> = (0..width).filter(|&i| !seen[i]).collect();
        Ok(Self {
            keys: converter(&schema, keys)?,
            values: converter(&schema, &value_columns)?,
            key_columns: keys.to_vec(),
            value_columns,
            schema,
            rows: RowShards::default(),
        })
    }

    /// Applies one batch of changes.
    ///
    /// # Errors
    /// A batch of another schema, or a changelog that deletes or retracts a row that is not in
    /// the table.
    pub fn apply(&mut self, changes: &ChangeBatch) -> Result<()> {
        let kinds = kinds(changes, &self.schema)?;
        let pick = |columns: &[usize]| -> Vec<ArrayRef> {
            columns
                .iter()
                .map(|&i| Arc::clone(changes.data.column(i)))
                .collect()
        };
        let keys = (!self.key_columns.is_empty())
            .then(|| self.keys.convert_columns(&pick(&self.key_columns)))
            .transpose()?;
        let values = self.values.convert_columns(&pick(&self.value_columns))?;
        let key = |i: usize| keys.as_ref().map_or(&[][..], |k| k.row(i).data());
        self.rows.apply(kinds.len(), key, |i, entry| {
            let value = values.row(i);
            match (kinds[i], entry) {
                (RowKind::Insert | RowKind::UpdateAfter, Entry::Occupied(mut held)) => {
                    let v = &mut held.get_mut().1;
                    v.clear();
                    v.extend_from_slice(value.data());
                }
                (RowKind::Insert | RowKind::UpdateAfter, Entry::Vacant(slot)) => {
                    slot.insert((key(i).into(), value.data().to_vec()));
                }
                (RowKind::UpdateBefore, Entry::Occupied(held))
                    if held.get().1[..] == *value.data() => {}
                (RowKind::UpdateBefore, _) => {
                    return Err(Error::invalid_input("-U of a row that is not in the table"));
                }
                (RowKind::Delete, Entry::Occupied(held)) => {
                    held.remove();
                }
                (RowKind::Delete, Entry::Vacant(_)) => {
                    return Err(Error::invalid_input("-D of a key that is not in the table"));
                }
            }
            Ok(())
        })
    }

    /// The schema of the rows.
    pub fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    /// Rows in the table.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The table sorted by its keys, in the schema's column order.
    ///
    /// # Errors
    /// When the rows cannot be decoded (a bug).
    pub fn to_batch(&self) -> Result<RecordBatch> {
        joined(&self.schema, |f| self.for_each_sorted(f))
    }

    /// Hands `f` the table sorted by its keys, in the schema's column order, in batches of at
    /// most 65,536 rows (one empty batch for an empty table), decoded a few at a time side by
    /// side on rayon's pool: a large table is written without being decoded whole.
    ///
    /// # Errors
    /// When the rows cannot be decoded (a bug), and `f`'s errors.
    pub fn for_each_sorted(&self, f: impl FnMut(RecordBatch) -> Result<()>) -> Result<()> {
        let rows = self.rows.sorted();
        for_each_piece(
            rows.len(),
            DECODE_PIECE_ROWS,
            |r| self.decode_rows(&rows[r]),
            f,
        )
    }

    fn decode_rows(&self, rows: &[Sorted<'_, Vec<u8>>]) -> Result<RecordBatch> {
        let keys = if self.key_columns.is_empty() {
            vec![]
        } else {
            decode(&self.keys, rows.iter().map(|e| e.key))?
        };
        let values = decode(&self.values, rows.iter().map(|e| &e.value[..]))?;
        let mut cols: Vec<Option<ArrayRef>> = vec![None; self.schema.fields().len()];
        for (&i, c) in self.key_columns.iter().zip(keys) {
            cols[i] = Some(c);
        }
        for (&i, c) in self.value_columns.iter().zip(values) {
            cols[i] = Some(c);
        }
        let cols = cols.into_iter().flatten().collect();
        RecordBatch::try_new(Arc::clone(&self.schema), cols)
            .map_err(|e| Error::internal(format!("final table: {e}")))
    }
}

/// The multiset a changelog describes: `+I`/`+U` add a row, `-U`/`-D` remove one equal row. This
/// is the result of any retract changelog (Flink's `toRetractStream` view), whatever its columns.
pub struct MultisetTable {
    schema: SchemaRef,
    converter: RowConverter,
    /// Row bytes → the row's multiplicity (above 0).
    rows: RowShards<i64>,
}

impl std::fmt::Debug for MultisetTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MultisetTable")
            .field("rows", &self.rows.len())
            .finish()
    }
}

impl MultisetTable {
    /// A table for changes of rows of `schema`.
    ///
    /// # Errors
    /// A schema without columns, or a column type that cannot be compared.
    pub fn try_new(schema: SchemaRef) -> Result<Self> {
        if schema.fields().is_empty() {
            return Err(Error::invalid_input("a changelog needs columns"));
        }
        let all: Vec<usize> = (0..schema.fields().len()).collect();
        Ok(Self {
            converter: converter(&schema, &all)?,
            schema,
            rows: RowShards::default(),
        })
    }

    /// Applies one batch of changes.
    ///
    /// # Errors
    /// A batch of another schema, or a retraction of a row that is not in the table.
    pub fn apply(&mut self, changes: &ChangeBatch) -> Result<()> {
        let kinds = kinds(changes, &self.schema)?;
        let rows = self.converter.convert_columns(changes.data.columns())?;
        let row = |i: usize| rows.row(i).data();
        self.rows.apply(kinds.len(), row, |i, entry| {
            let kind = kinds[i];
            match (kind.is_retract(), entry) {
                (false, Entry::Occupied(mut held)) => held.get_mut().1 += 1,
                (false, Entry::Vacant(slot)) => {
                    slot.insert((row(i).into(), 1));
                }
                (true, Entry::Occupied(mut held)) if held.get().1 > 1 => held.get_mut().1 -= 1,
                (true, Entry::Occupied(held)) => {
                    held.remove();
                }
                (true, Entry::Vacant(_)) => {
                    return Err(Error::invalid_input(format!(
                        "{kind} of a row that is not in the result"
                    )));
                }
            }
            Ok(())
        })
    }

    /// The schema of the rows.
    pub fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    /// Rows in the table, with multiplicity.
    pub fn len(&self) -> usize {
        self.rows.values().map(|&c| c as usize).sum()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The rows sorted by all columns, each repeated by its multiplicity.
    ///
    /// # Errors
    /// When the rows cannot be decoded (a bug).
    pub fn to_batch(&self) -> Result<RecordBatch> {
        joined(&self.schema, |f| self.for_each_sorted(f))
    }

    /// Hands `f` the rows sorted by all columns, each repeated by its multiplicity, in batches
    /// that each hold at most 65,536 distinct rows (one empty batch for an empty table),
    /// decoded a few at a time side by side on rayon's pool.
    ///
    /// # Errors
    /// When the rows cannot be decoded (a bug), and `f`'s errors.
    pub fn for_each_sorted(&self, f: impl FnMut(RecordBatch) -> Result<()>) -> Result<()> {
        let rows = self.rows.sorted();
        let decode_rows = |r: Range<usize>| {
            let rows = rows[r]
                .iter()
                .flat_map(|e| std::iter::repeat_n(e.key, (*e.value).max(0) as usize));
            let cols = decode(&self.converter, rows)?;
            RecordBatch::try_new(Arc::clone(&self.schema), cols)
                .map_err(|e| Error::internal(format!("final table: {e}")))
        };
        for_each_piece(rows.len(), DECODE_PIECE_ROWS, decode_rows, f)
    }
}

/// The final table of a query's changelog, by the changelog's shape: with `-U` rows (or an
/// insert-only result) the multiset of its rows; without them, upserts by the group keys (the
/// changelog's `+U` replaces its key's row).
#[derive(Debug)]
pub enum ResultTable {
    /// A retract changelog (or an insert-only result).
    Multiset(MultisetTable),
    /// An upsert changelog keyed by the group keys.
    Upsert(FinalTable),
}

impl ResultTable {
    /// The table for a changelog of rows of `schema`; `upsert_keys` are the key columns when the
    /// changelog has no `-U` rows (None when it has, or is insert-only).
    ///
    /// # Errors
    /// As [`FinalTable::try_new`] and [`MultisetTable::try_new`].
    pub fn try_new(schema: SchemaRef, upsert_keys: Option<&[usize]>) -> Result<Self> {
        Ok(match upsert_keys {
            Some(keys) => ResultTable::Upsert(FinalTable::try_new(schema, keys)?),
            None => ResultTable::Multiset(MultisetTable::try_new(schema)?),
        })
    }

    /// Applies one batch of changes.
    ///
    /// # Errors
    /// As [`FinalTable::apply`] and [`MultisetTable::apply`].
    pub fn apply(&mut self, changes: &ChangeBatch) -> Result<()> {
        match self {
            ResultTable::Multiset(t) => t.apply(changes),
            ResultTable::Upsert(t) => t.apply(changes),
        }
    }

    /// Loads the table a checkpoint holds (as [`Sink::checkpoint`] saved it) into this empty
    /// table.
    ///
    /// # Errors
    /// A checkpoint without a table (written by a changelog sink), and as [`ResultTable::apply`].
    pub fn restore(&mut self, chk: &Checkpoint) -> Result<()> {
        let rows = chk.entry(TABLE_ENTRY).map_err(|_| {
            Error::invalid_input(
                "the checkpoint was written with --emit changelog; resume with --emit changelog and the same --output",
            )
        })?;
        for b in rows {
            self.apply(&ChangeBatch::inserts(b.clone()))?;
        }
        Ok(())
    }

    /// The table so far, sorted (by the keys, or by every column).
    ///
    /// # Errors
    /// When the rows cannot be decoded (a bug).
    pub fn to_batch(&self) -> Result<RecordBatch> {
        match self {
            ResultTable::Multiset(t) => t.to_batch(),
            ResultTable::Upsert(t) => t.to_batch(),
        }
    }

    /// Hands `f` the table so far, sorted, in batches ([`FinalTable::for_each_sorted`],
    /// [`MultisetTable::for_each_sorted`]): what [`ResultTable::to_batch`] returns, cut into
    /// pieces, and never decoded whole.
    ///
    /// # Errors
    /// When the rows cannot be decoded (a bug), and `f`'s errors.
    pub fn for_each_sorted(&self, f: impl FnMut(RecordBatch) -> Result<()>) -> Result<()> {
        match self {
            ResultTable::Multiset(t) => t.for_each_sorted(f),
            ResultTable::Upsert(t) => t.for_each_sorted(f),
        }
    }

    /// The schema of the table's rows.
    pub fn schema(&self) -> SchemaRef {
        match self {
            ResultTable::Multiset(t) => t.schema(),
            ResultTable::Upsert(t) => t.schema(),
        }
    }
}

/// The checkpoint entry that holds a final table.
const TABLE_ENTRY: &str = "sink";

impl Sink for ResultTable {
    fn write(&mut self, changes: &ChangeBatch) -> Result<()> {
        self.apply(changes)
    }

    fn checkpoint(&mut self) -> Result<Checkpoint> {
        let current = self.to_batch()?;
        let mut chk = Checkpoint::default();
        chk.entries
            .push((TABLE_ENTRY.into(), current.schema(), vec![current]));
        Ok(chk)
    }
}

#[cfg(test)]
mod tests;
