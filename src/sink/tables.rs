//! Materializing a changelog into the table it describes: keyed by the group keys
//! ([`FinalTable`]), as a multiset ([`MultisetTable`]), or whichever of the two a query's
//! changelog calls for ([`ResultTable`]).

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, RecordBatch};
use arrow::datatypes::SchemaRef;
use arrow_row::{RowConverter, SortField};
use hashbrown::hash_table::Entry;
use rayon::prelude::*;

use crate::changelog::{ChangeBatch, RowKind};
use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};
use crate::sink::Sink;
use crate::sink::shards::RowShards;

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

/// The columns of `rows` (bytes `converter` made), in order: decoded in pieces on the pool
/// and joined, where they are many.
fn decode(converter: &RowConverter, rows: &[&[u8]]) -> Result<Vec<ArrayRef>> {
    let piece = |rows: &[&[u8]]| -> Result<Vec<ArrayRef>> {
        let parser = converter.parser();
        Ok(converter.convert_rows(rows.iter().map(|r| parser.parse(r)))?)
    };
    if rows.len() <= DECODE_PIECE_ROWS {
        return piece(rows);
    }
    let pieces: Vec<Vec<ArrayRef>> = rows
        .par_chunks(DECODE_PIECE_ROWS)
        .map(piece)
        .collect::<Result<_>>()?;
    (0..pieces[0].len())
        .map(|c| {
            let column: Vec<&dyn Array> = pieces.iter().map(|p| p[c].as_ref()).collect();
            Ok(arrow::compute::concat(&column)?)
        })
        .collect()
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
        let rows = self.rows.sorted();
        let keys = if self.key_columns.is_empty() {
            vec![]
        } else {
            let keys: Vec<&[u8]> = rows.iter().map(|(k, _)| *k).collect();
            decode(&self.keys, &keys)?
        };
        let values: Vec<&[u8]> = rows.iter().map(|(_, v)| &v[..]).collect();
        let values = decode(&self.values, &values)?;
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
        let mut rows: Vec<&[u8]> = Vec::with_capacity(self.len());
        rows.extend(
            self.rows
                .sorted()
                .into_iter()
                .flat_map(|(r, &c)| std::iter::repeat_n(r, c.max(0) as usize)),
        );
        let cols = decode(&self.converter, &rows)?;
        RecordBatch::try_new(Arc::clone(&self.schema), cols)
            .map_err(|e| Error::internal(format!("final table: {e}")))
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
mod tests {
    use std::collections::BTreeMap;

    use arrow::array::{Array, Int8Array, Int64Array, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};

    use super::*;

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("k", DataType::Utf8, true),
            Field::new("n", DataType::Int64, true),
        ]))
    }

    /// Changes of `(kind, k, n)` rows.
    fn changes(rows: &[(RowKind, Option<&str>, Option<i64>)]) -> ChangeBatch {
        let data = RecordBatch::try_new(
            schema(),
            vec![
                Arc::new(StringArray::from_iter(rows.iter().map(|r| r.1))),
                Arc::new(Int64Array::from_iter(rows.iter().map(|r| r.2))),
            ],
        )
        .unwrap();
        let kinds = Int8Array::from_iter_values(rows.iter().map(|r| r.0 as i8));
        ChangeBatch::try_new(Some(Arc::new(kinds)), data).unwrap()
    }

    /// `(k, n)` rows of a table's batch, in its order.
    fn rows_of(batch: &RecordBatch) -> Vec<(Option<String>, Option<i64>)> {
        let k = batch
            .column(0)
            .as_any()
            .downcast_ref::<StringArray>()
            .unwrap();
        let n = batch
            .column(1)
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap();
        (0..batch.num_rows())
            .map(|i| {
                (
                    (!k.is_null(i)).then(|| k.value(i).to_string()),
                    (!n.is_null(i)).then(|| n.value(i)),
                )
            })
            .collect()
    }

    /// A seeded changelog of inserts and retractions of rows already in the table (NULLs among
    /// them, rows repeated) gives the multiset a count per row gives, sorted as the rows sort.
    #[test]
    fn a_multiset_counts_each_row_and_sorts_them() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |m: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % m
        };
        let names = [None, Some("a"), Some("b"), Some("ab"), Some("")];
        let mut table = MultisetTable::try_new(schema()).unwrap();
        let mut model: BTreeMap<(Option<String>, Option<i64>), i64> = BTreeMap::new();
        for _ in 0..40 {
            let mut batch = vec![];
            for _ in 0..next(30) {
                let held: Vec<_> = model
                    .iter()
                    .filter(|e| *e.1 > 0)
                    .map(|e| e.0.clone())
                    .collect();
                if !held.is_empty() && next(3) == 0 {
                    let (k, n) = held[next(held.len() as u64) as usize].clone();
                    *model.get_mut(&(k.clone(), n)).unwrap() -= 1;
                    let kind = [RowKind::UpdateBefore, RowKind::Delete][next(2) as usize];
                    batch.push((kind, k, n));
                } else {
                    let k = names[next(5) as usize].map(str::to_string);
                    let n = (next(6) > 0).then(|| next(4) as i64 - 1);
                    *model.entry((k.clone(), n)).or_insert(0) += 1;
                    let kind = [RowKind::Insert, RowKind::UpdateAfter][next(2) as usize];
                    batch.push((kind, k, n));
                }
            }
            let rows: Vec<_> = batch
                .iter()
                .map(|(r, k, n)| (*r, k.as_deref(), *n))
                .collect();
            table.apply(&changes(&rows)).unwrap();
        }
        // The model's order is the rows' order: NULLs first, then by value.
        let expected: Vec<_> = model
            .iter()
            .flat_map(|(row, &c)| std::iter::repeat_n(row.clone(), c as usize))
            .collect();
        assert!(expected.len() > 50, "{}", expected.len());
        assert_eq!(table.len(), expected.len());
        assert_eq!(rows_of(&table.to_batch().unwrap()), expected);
        // A row retracted as often as it was added is gone: retracting it again is an error,
        // as is retracting a row never added.
        let once = [
            (RowKind::Insert, Some("zz"), Some(1)),
            (RowKind::Delete, Some("zz"), Some(1)),
        ];
        table.apply(&changes(&once)).unwrap();
        for never in [Some("zz"), Some("yy")] {
            let e = table
                .apply(&changes(&[(RowKind::Delete, never, Some(1))]))
                .unwrap_err();
            assert!(e.to_string().contains("not in the result"), "{e}");
        }
    }

    /// An upsert table keeps each key's last row, checks a `-U` against it, and sorts by key.
    #[test]
    fn a_final_table_keeps_each_keys_last_row() {
        use RowKind::{Delete, Insert, UpdateAfter, UpdateBefore};
        let mut table = FinalTable::try_new(schema(), &[0]).unwrap();
        table
            .apply(&changes(&[
                (Insert, Some("b"), Some(1)),
                (Insert, None, Some(5)),
                (Insert, Some("a"), None),
                (UpdateBefore, Some("b"), Some(1)),
                (UpdateAfter, Some("b"), Some(22)),
                (UpdateAfter, Some("a"), Some(3)),
                (Insert, Some("c"), Some(4)),
                (Delete, Some("c"), Some(4)),
            ]))
            .unwrap();
        assert_eq!(
            rows_of(&table.to_batch().unwrap()),
            [
                (None, Some(5)),
                (Some("a".into()), Some(3)),
                (Some("b".into()), Some(22))
            ]
        );
        for (bad, why) in [
            ((UpdateBefore, Some("b"), Some(1)), "-U of a row"),
            ((UpdateBefore, Some("q"), Some(1)), "-U of a row"),
            ((Delete, Some("q"), None), "-D of a key"),
        ] {
            let e = table.apply(&changes(&[bad])).unwrap_err().to_string();
            assert!(e.contains(why), "{e}");
        }
    }

    /// Tables of more rows than a decoded piece, filled on the pool (batches past its
    /// threshold) and read back in pieces: every row once, in order, the same for the keyed
    /// table and the multiset (each row once).
    #[test]
    fn large_tables_apply_and_decode_in_pieces() {
        let n = DECODE_PIECE_ROWS + 4_321;
        let names: Vec<String> = (0..n).map(|i| format!("k{:07}", (i * 7_919) % n)).collect();
        let rows: Vec<(RowKind, Option<&str>, Option<i64>)> = names
            .iter()
            .enumerate()
            .map(|(i, k)| {
                (
                    RowKind::Insert,
                    Some(k.as_str()),
                    (i % 9 != 0).then_some(i as i64),
                )
            })
            .collect();
        let mut keyed = FinalTable::try_new(schema(), &[0]).unwrap();
        let mut multiset = MultisetTable::try_new(schema()).unwrap();
        for part in rows.chunks(10_000) {
            keyed.apply(&changes(part)).unwrap();
            multiset.apply(&changes(part)).unwrap();
        }
        let mut want: Vec<(Option<String>, Option<i64>)> = rows
            .iter()
            .map(|r| (r.1.map(str::to_string), r.2))
            .collect();
        want.sort();
        assert_eq!(rows_of(&keyed.to_batch().unwrap()), want);
        assert_eq!(rows_of(&multiset.to_batch().unwrap()), want);
    }
}
