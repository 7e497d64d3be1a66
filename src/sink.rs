//! Materializing a changelog into its final table.

use std::collections::BTreeMap;

use arrow::array::{ArrayRef, AsArray, Int8Array, RecordBatch};
use arrow::datatypes::{Int8Type, SchemaRef};
use arrow_row::{OwnedRow, RowConverter, SortField};

use crate::changelog::RowKind;
use crate::error::{Error, Result};

/// The op column of a changelog batch of `schema`.
fn changelog_ops<'a>(batch: &'a RecordBatch, schema: &SchemaRef) -> Result<&'a Int8Array> {
    if batch.schema().fields() != schema.fields() {
        return Err(Error::invalid_input("changelog batch of another schema"));
    }
    batch
        .column(0)
        .as_primitive_opt::<Int8Type>()
        .ok_or_else(|| Error::invalid_input("the op column is not Int8"))
}

/// The row kind of row `i`.
fn kind_at(ops: &Int8Array, i: usize) -> Result<RowKind> {
    RowKind::from_code(i64::from(ops.value(i)))
        .ok_or_else(|| Error::invalid_input(format!("bad op {}", ops.value(i))))
}

/// The table a changelog describes, keyed by the group keys: `+I`/`+U` set a key's row, `-D`
/// removes it, `-U` is checked against the row it retracts. Works with and without `-U` rows.
///
/// # Examples
/// ```
/// # use std::sync::Arc;
/// # use arrow::array::{Int8Array, Int64Array, RecordBatch, StringArray};
/// # use arrow::datatypes::{DataType, Field, Schema};
/// use tally::sink::FinalTable;
/// let schema = Arc::new(Schema::new(vec![
///     Field::new("op", DataType::Int8, false),
///     Field::new("k", DataType::Utf8, true),
///     Field::new("n", DataType::Int64, false),
/// ]));
/// let changes = RecordBatch::try_new(schema.clone(), vec![
///     Arc::new(Int8Array::from(vec![0, 0, 1, 2, 3])),
///     Arc::new(StringArray::from(vec!["b", "a", "b", "b", "a"])),
///     Arc::new(Int64Array::from(vec![1, 1, 1, 2, 1])),
/// ]).unwrap();
/// let mut table = FinalTable::try_new(schema, 1).unwrap();
/// table.apply(&changes).unwrap();
/// let result = table.to_batch().unwrap();
/// assert_eq!(result.num_rows(), 1); // b = 2; a was deleted
/// ```
pub struct FinalTable {
    schema: SchemaRef,
    keys: RowConverter,
    values: RowConverter,
    /// Key row bytes (empty for a global aggregate) → value row.
    rows: BTreeMap<Vec<u8>, OwnedRow>,
    n_keys: usize,
}

impl std::fmt::Debug for FinalTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FinalTable")
            .field("rows", &self.rows.len())
            .finish()
    }
}

impl FinalTable {
    /// A table for changelog batches of `schema` (`op` first, then `n_keys` key columns, then the
    /// values).
    ///
    /// # Errors
    /// When the schema is not of that shape.
    pub fn try_new(schema: SchemaRef, n_keys: usize) -> Result<Self> {
        let fields = schema.fields();
        if fields.is_empty() || fields.len() < 1 + n_keys {
            return Err(Error::invalid_input(
                "a changelog needs an op column and its keys",
            ));
        }
        let sort = |range: std::ops::Range<usize>| {
            RowConverter::new(
                fields[range]
                    .iter()
                    .map(|f| SortField::new(f.data_type().clone()))
                    .collect(),
            )
            .map_err(|e| Error::invalid_input(format!("cannot materialize: {e}")))
        };
        Ok(Self {
            keys: sort(1..1 + n_keys)?,
            values: sort(1 + n_keys..fields.len())?,
            schema,
            rows: BTreeMap::new(),
            n_keys,
        })
    }

    /// Applies one changelog batch.
    ///
    /// # Errors
    /// A batch of another schema, or a changelog that deletes or retracts a row that is not in
    /// the table.
    pub fn apply(&mut self, batch: &RecordBatch) -> Result<()> {
        let ops = changelog_ops(batch, &self.schema)?;
        let n = 1 + self.n_keys;
        let keys = (self.n_keys > 0)
            .then(|| self.keys.convert_columns(&batch.columns()[1..n]))
            .transpose()?;
        let values = self.values.convert_columns(&batch.columns()[n..])?;
        for i in 0..batch.num_rows() {
            let kind = kind_at(ops, i)?;
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

    /// The changelog schema the table takes.
    pub fn schema(&self) -> SchemaRef {
        std::sync::Arc::clone(&self.schema)
    }

    /// Rows in the table.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The table sorted by its keys, without the `op` column.
    ///
    /// # Errors
    /// When the rows cannot be decoded (a bug).
    pub fn to_batch(&self) -> Result<RecordBatch> {
        let mut cols: Vec<ArrayRef> = if self.n_keys > 0 {
            let parser = self.keys.parser();
            self.keys
                .convert_rows(self.rows.keys().map(|k| parser.parse(k)))?
        } else {
            vec![]
        };
        cols.extend(
            self.values
                .convert_rows(self.rows.values().map(|v| v.row()))?,
        );
        let schema = std::sync::Arc::new(arrow::datatypes::Schema::new(
            self.schema.fields()[1..].to_vec(),
        ));
        RecordBatch::try_new(schema, cols).map_err(|e| Error::internal(format!("final table: {e}")))
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
    /// A table for changelog batches of `schema` (`op` first).
    ///
    /// # Errors
    /// When a column type cannot be compared.
    pub fn try_new(schema: SchemaRef) -> Result<Self> {
        if schema.fields().len() < 2 {
            return Err(Error::invalid_input(
                "a changelog needs an op column and values",
            ));
        }
        let converter = RowConverter::new(
            schema.fields()[1..]
                .iter()
                .map(|f| SortField::new(f.data_type().clone()))
                .collect(),
        )
        .map_err(|e| Error::invalid_input(format!("cannot materialize: {e}")))?;
        Ok(Self {
            schema,
            converter,
            rows: BTreeMap::new(),
        })
    }

    /// Applies one changelog batch.
    ///
    /// # Errors
    /// A batch of another schema, or a retraction of a row that is not in the table.
    pub fn apply(&mut self, batch: &RecordBatch) -> Result<()> {
        let ops = changelog_ops(batch, &self.schema)?;
        let rows = self.converter.convert_columns(&batch.columns()[1..])?;
        for i in 0..batch.num_rows() {
            let kind = kind_at(ops, i)?;
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

    /// The rows sorted by all columns, each repeated by its multiplicity, without the `op`
    /// column.
    ///
    /// # Errors
    /// When the rows cannot be decoded (a bug).
    pub fn to_batch(&self) -> Result<RecordBatch> {
        let rows = self
            .rows
            .iter()
            .flat_map(|(r, &c)| std::iter::repeat_n(r.row(), c.max(0) as usize));
        let cols = self.converter.convert_rows(rows)?;
        let schema = std::sync::Arc::new(arrow::datatypes::Schema::new(
            self.schema.fields()[1..].to_vec(),
        ));
        RecordBatch::try_new(schema, cols).map_err(|e| Error::internal(format!("final table: {e}")))
    }
}
