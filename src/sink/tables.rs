//! Materializing a changelog into the table it describes: keyed by the group keys
//! ([`FinalTable`]), as a multiset ([`MultisetTable`]), or whichever of the two a query's
//! changelog calls for ([`ResultTable`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch};
use arrow::datatypes::SchemaRef;
use arrow_row::{OwnedRow, RowConverter, SortField};

use crate::changelog::{ChangeBatch, RowKind};
use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};
use crate::sink::Sink;

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
    /// Key row bytes (empty for a global aggregate) → value row.
    rows: BTreeMap<Vec<u8>, OwnedRow>,
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
            rows: BTreeMap::new(),
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
        for (i, kind) in kinds.into_iter().enumerate() {
            let key = keys.as_ref().map_or(&[][..], |k| k.row(i).data()).to_vec();
            match kind {
                RowKind::Insert | RowKind::UpdateAfter => {
                    self.rows.insert(key, values.row(i).owned());
                }
                RowKind::UpdateBefore => match self.rows.get(&key) {
                    Some(v) if v.row() == values.row(i) => {}
                    _ => return Err(Error::invalid_input("-U of a row that is not in the table")),
                },
                RowKind::Delete => {
                    if self.rows.remove(&key).is_none() {
                        return Err(Error::invalid_input("-D of a key that is not in the table"));
                    }
                }
            }
        }
        Ok(())
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
        let keys = if self.key_columns.is_empty() {
            vec![]
        } else {
            let parser = self.keys.parser();
            self.keys
                .convert_rows(self.rows.keys().map(|k| parser.parse(k)))?
        };
        let values = self
            .values
            .convert_rows(self.rows.values().map(|v| v.row()))?;
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
    rows: BTreeMap<OwnedRow, i64>,
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
            rows: BTreeMap::new(),
        })
    }

    /// Applies one batch of changes.
    ///
    /// # Errors
    /// A batch of another schema, or a retraction of a row that is not in the table.
    pub fn apply(&mut self, changes: &ChangeBatch) -> Result<()> {
        let kinds = kinds(changes, &self.schema)?;
        let rows = self.converter.convert_columns(changes.data.columns())?;
        for (i, kind) in kinds.into_iter().enumerate() {
            let row = rows.row(i).owned();
            if kind.is_retract() {
                match self.rows.get_mut(&row) {
                    Some(c) => {
                        *c -= 1;
                        if *c == 0 {
                            self.rows.remove(&row);
                        }
                    }
                    None => {
                        return Err(Error::invalid_input(format!(
                            "{kind} of a row that is not in the result"
                        )));
                    }
                }
            } else {
                *self.rows.entry(row).or_insert(0) += 1;
            }
        }
        Ok(())
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
        let rows = self
            .rows
            .iter()
            .flat_map(|(r, &c)| std::iter::repeat_n(r.row(), c.max(0) as usize));
        let cols = self.converter.convert_rows(rows)?;
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
