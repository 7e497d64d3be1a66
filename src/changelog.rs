//! Changelogs: row kinds, and [`ChangeBatch`], the one form in which changes travel.
//!
//! Row kinds are Flink's, with Flink's byte values: `+I` = 0 (insert), `-U` = 1 (update before),
//! `+U` = 2 (update after), `-D` = 3 (delete); `+I`/`+U` accumulate, `-U`/`-D` retract. Between
//! sources, operators, stages and sinks a changelog is a [`ChangeBatch`]: the rows, and their
//! row kinds as `Int8` codes beside them. In files and in record batches with an `op` column
//! (what a library caller may hand over, what the writers write) the kinds are a column named
//! `op`, holding the codes or, in text formats, `+I`, `-U`, `+U`, `-D`.

use arrow::array::{Array, ArrayRef, AsArray, Int8Array, RecordBatch};
use arrow::buffer::BooleanBuffer;
use arrow::datatypes::{
    DataType, Int8Type, Int16Type, Int32Type, Int64Type, UInt8Type, UInt16Type, UInt32Type,
    UInt64Type,
};

use crate::error::{Error, Result};

/// The default name of the changelog column, in input and output.
pub const OP_COLUMN: &str = "op";

/// A changelog row kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(i8)]
pub enum RowKind {
    /// `+I`
    Insert = 0,
    /// `-U`
    UpdateBefore = 1,
    /// `+U`
    UpdateAfter = 2,
    /// `-D`
    Delete = 3,
}

impl RowKind {
    /// Flink's byte value.
    pub fn code(self) -> i8 {
        self as i8
    }

    /// The kind with Flink's byte value `code`.
    pub fn from_code(code: i64) -> Option<Self> {
        Some(match code {
            0 => RowKind::Insert,
            1 => RowKind::UpdateBefore,
            2 => RowKind::UpdateAfter,
            3 => RowKind::Delete,
            _ => return None,
        })
    }

    /// The short string (`+I`, `-U`, `+U`, `-D`).
    pub fn short(self) -> &'static str {
        match self {
            RowKind::Insert => "+I",
            RowKind::UpdateBefore => "-U",
            RowKind::UpdateAfter => "+U",
            RowKind::Delete => "-D",
        }
    }

    /// Parses the short string (`+I`, `-U`, `+U`, `-D`) or Flink's long names.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s.trim() {
            "+I" | "INSERT" => RowKind::Insert,
            "-U" | "UPDATE_BEFORE" => RowKind::UpdateBefore,
            "+U" | "UPDATE_AFTER" => RowKind::UpdateAfter,
            "-D" | "DELETE" => RowKind::Delete,
            _ => return None,
        })
    }

    /// Whether the kind retracts (`-U`, `-D`).
    pub fn is_retract(self) -> bool {
        matches!(self, RowKind::UpdateBefore | RowKind::Delete)
    }
}

impl std::fmt::Display for RowKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.short())
    }
}

/// Whether an `op` column of this type can be read.
pub fn op_type_supported(dt: &DataType) -> bool {
    dt.is_integer()
        || matches!(
            dt,
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
        )
        || matches!(dt, DataType::Dictionary(_, v) if op_type_supported(v))
}

/// Reads an `op` column (integer codes 0..=3, the short strings, or the codes as text, plain or
/// dictionary-encoded) into Int8 codes.
///
/// # Errors
/// A NULL, an unknown code or string (an integer outside 0..=3 of any width, e.g. a UInt64 above
/// `i64::MAX`, is one), an unsupported type; the message names the row.
pub fn op_codes(op: &ArrayRef) -> Result<ArrayRef> {
    let n = op.len();
    if op.logical_null_count() > 0 {
        let nulls = op.logical_nulls();
        let row = (0..n)
            .find(|&i| nulls.as_ref().is_some_and(|b| b.is_null(i)))
            .unwrap_or(0);
        return Err(Error::invalid_input(format!(
            "changelog column has a NULL op at row {row}"
        )));
    }
    let dt = op.data_type();
    if let DataType::Dictionary(_, values) = dt {
        if !op_type_supported(values) {
            return Err(unsupported_type(dt));
        }
        // The values the keys point at, one per row, then read as a plain column.
        let plain = arrow::compute::cast(op, values)?;
        return op_codes(&plain);
    }
    if dt.is_integer() {
        if dt == &DataType::Int8 {
            let codes = op.as_primitive::<Int8Type>().values();
            if let Some((row, c)) = codes
                .iter()
                .enumerate()
                .find(|(_, c)| !(0..=3).contains(*c))
            {
                return Err(bad_code(row, &c.to_string()));
            }
            return Ok(std::sync::Arc::clone(op));
        }
        // Every code is checked at its own width: no cast that could turn a code out of range
        // (a UInt64 above i64::MAX) into a NULL read as +I.
        let codes = integer_codes(op)?;
        return Ok(std::sync::Arc::new(Int8Array::from(codes)));
    }
    if !op_type_supported(dt) {
        return Err(unsupported_type(dt));
    }
    let strings = arrow::compute::cast(op, &DataType::Utf8)?;
    let strings = strings.as_string::<i32>();
    let mut codes = Vec::with_capacity(n);
    for i in 0..n {
        let s = strings.value(i);
        // The short strings, Flink's long names, or a code written as text (a CSV file's op
        // column is read as text: `0` to `3`).
        let kind = RowKind::parse(s)
            .or_else(|| match s.trim() {
                "0" | "1" | "2" | "3" => s.trim().parse().ok().and_then(RowKind::from_code),
                _ => None,
            })
            .ok_or_else(|| bad_code(i, &format!("'{s}'")))?;
        codes.push(kind.code());
    }
    Ok(std::sync::Arc::new(Int8Array::from(codes)))
}

/// The codes of an integer `op` column of any width, each checked to be in 0..=3.
fn integer_codes(op: &ArrayRef) -> Result<Vec<i8>> {
    macro_rules! codes {
        ($t:ty) => {{
            let a = op.as_primitive::<$t>();
            let mut out = Vec::with_capacity(a.len());
            for (row, &c) in a.values().iter().enumerate() {
                match i8::try_from(c).ok().filter(|c| (0..=3).contains(c)) {
                    Some(c) => out.push(c),
                    None => return Err(bad_code(row, &c.to_string())),
                }
            }
            out
        }};
    }
    Ok(match op.data_type() {
        DataType::Int8 => codes!(Int8Type),
        DataType::Int16 => codes!(Int16Type),
        DataType::Int32 => codes!(Int32Type),
        DataType::Int64 => codes!(Int64Type),
        DataType::UInt8 => codes!(UInt8Type),
        DataType::UInt16 => codes!(UInt16Type),
        DataType::UInt32 => codes!(UInt32Type),
        DataType::UInt64 => codes!(UInt64Type),
        other => return Err(unsupported_type(other)),
    })
}

fn unsupported_type(dt: &DataType) -> Error {
    Error::invalid_input(format!(
        "changelog column has type {dt}; expected Int8 codes 0..3 or the strings +I/-U/+U/-D"
    ))
}

/// Rows and, for a changelog, their row kinds (`Int8` codes 0..3): the form in which changes
/// travel from sources through operators and stages to sinks.
///
/// # Examples
/// ```
/// use std::sync::Arc;
/// use arrow::array::{Int8Array, Int64Array, RecordBatch, StringArray};
/// use arrow::datatypes::{DataType, Field, Schema};
/// use tally::changelog::ChangeBatch;
///
/// let rows = RecordBatch::try_new(
///     Arc::new(Schema::new(vec![Field::new("k", DataType::Utf8, true)])),
///     vec![Arc::new(StringArray::from(vec!["a", "a"]))],
/// ).unwrap();
/// let changes = ChangeBatch::try_new(Some(Arc::new(Int8Array::from(vec![0, 3]))), rows).unwrap();
/// let with_op = changes.with_op_column().unwrap(); // op, k
/// assert_eq!(with_op.num_columns(), 2);
/// ```
#[derive(Debug, Clone)]
pub struct ChangeBatch {
    /// Row kinds; `None` means every row is an insert.
    pub op: Option<ArrayRef>,
    /// The rows.
    pub data: RecordBatch,
}

impl ChangeBatch {
    /// Rows that are all inserts.
    pub fn inserts(data: RecordBatch) -> Self {
        Self { op: None, data }
    }

    /// Rows and their row kinds, checked: `Int8` codes 0..=3, no NULL, one per row.
    ///
    /// # Errors
    /// Kinds that are not that, naming the row.
    pub fn try_new(op: Option<ArrayRef>, data: RecordBatch) -> Result<Self> {
        if let Some(op) = &op {
            if op.len() != data.num_rows() {
                return Err(Error::invalid_input(format!(
                    "{} row kinds for {} rows",
                    op.len(),
                    data.num_rows()
                )));
            }
            if op.data_type() != &DataType::Int8 {
                return Err(Error::invalid_input(format!(
                    "row kinds of type {}; expected Int8 codes 0..3",
                    op.data_type()
                )));
            }
            op_codes(op)?;
        }
        Ok(Self { op, data })
    }

    /// Rows in the batch.
    pub fn num_rows(&self) -> usize {
        self.data.num_rows()
    }

    /// Rows `offset..offset + len`, zero-copy.
    pub fn slice(&self, offset: usize, len: usize) -> Self {
        Self {
            op: self.op.as_ref().map(|o| o.slice(offset, len)),
            data: self.data.slice(offset, len),
        }
    }

    /// The retracting rows (`-U`, `-D`: the odd codes), when the batch has row kinds.
    ///
    /// # Errors
    /// Row kinds that are not non-NULL `Int8` codes 0..=3 (naming the row).
    pub fn retract_mask(&self) -> Result<Option<BooleanBuffer>> {
        let Some(op) = &self.op else {
            return Ok(None);
        };
        let codes = op_codes(op)?;
        let codes = codes.as_primitive::<Int8Type>().values();
        Ok(Some(BooleanBuffer::collect_bool(codes.len(), |i| {
            codes[i] & 1 == 1
        })))
    }

    /// Each row's kind (all `+I` when the batch has none).
    ///
    /// # Errors
    /// Row kinds that are not non-NULL `Int8` codes 0..=3 (naming the row).
    pub fn row_kinds(&self) -> Result<Vec<RowKind>> {
        let Some(op) = &self.op else {
            return Ok(vec![RowKind::Insert; self.num_rows()]);
        };
        let codes = op_codes(op)?;
        let codes = codes.as_primitive::<Int8Type>().values();
        codes
            .iter()
            .enumerate()
            .map(|(row, &c)| {
                RowKind::from_code(i64::from(c)).ok_or_else(|| bad_code(row, &c.to_string()))
            })
            .collect()
    }

    /// The batch with an `op` column first (all `+I` when it has no kinds), as a record batch
    /// of a changelog is written.
    ///
    /// # Errors
    /// Row kinds that do not fit the rows (a bug).
    pub fn with_op_column(&self) -> Result<RecordBatch> {
        let op = self
            .op
            .clone()
            .unwrap_or_else(|| std::sync::Arc::new(Int8Array::from(vec![0i8; self.num_rows()])));
        let mut fields = vec![std::sync::Arc::new(arrow::datatypes::Field::new(
            OP_COLUMN,
            DataType::Int8,
            false,
        ))];
        fields.extend(self.data.schema().fields().iter().cloned());
        let mut cols = vec![op];
        cols.extend(self.data.columns().iter().cloned());
        Ok(RecordBatch::try_new(
            std::sync::Arc::new(arrow::datatypes::Schema::new(fields)),
            cols,
        )?)
    }
}

fn bad_code(row: usize, code: &str) -> Error {
    Error::invalid_input(format!(
        "bad changelog op {code} at row {row} (expected 0..3 or +I, -U, +U, -D)"
    ))
}

/// An `Int8` op column from row kinds.
pub fn op_array(kinds: &[RowKind]) -> ArrayRef {
    std::sync::Arc::new(Int8Array::from_iter_values(kinds.iter().map(|k| k.code())))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{DictionaryArray, Int8Array, StringArray, UInt64Array};
    use arrow::datatypes::Int32Type;

    use super::*;

    fn codes(op: ArrayRef) -> Result<Vec<i8>> {
        let c = op_codes(&op)?;
        Ok(c.as_primitive::<Int8Type>().values().to_vec())
    }

    #[test]
    fn integer_codes_of_every_width_are_checked_strictly() {
        assert_eq!(
            codes(Arc::new(UInt64Array::from(vec![0, 3, 1]))).unwrap(),
            vec![0, 3, 1]
        );
        // Above i64::MAX: an error naming the row, not a NULL read as +I.
        let e = codes(Arc::new(UInt64Array::from(vec![0, u64::MAX])))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("row 1") && e.contains(&u64::MAX.to_string()),
            "{e}"
        );
        let e = codes(Arc::new(Int8Array::from(vec![2, -1])))
            .unwrap_err()
            .to_string();
        assert!(e.contains("row 1") && e.contains("-1"), "{e}");
        let e = codes(Arc::new(arrow::array::Int64Array::from(vec![
            Some(1),
            None,
        ])))
        .unwrap_err()
        .to_string();
        assert!(e.contains("NULL op at row 1"), "{e}");
    }

    #[test]
    fn dictionary_columns_are_read_by_their_values() {
        let keys = arrow::array::Int32Array::from(vec![1, 0, 1, 2]);
        let ints = DictionaryArray::<Int32Type>::try_new(
            keys.clone(),
            Arc::new(Int8Array::from(vec![3, 0, 2])),
        )
        .unwrap();
        assert_eq!(codes(Arc::new(ints)).unwrap(), vec![0, 3, 0, 2]);
        let strings = DictionaryArray::<Int32Type>::try_new(
            keys.clone(),
            Arc::new(StringArray::from(vec!["-D", "+I", "-U"])),
        )
        .unwrap();
        assert_eq!(codes(Arc::new(strings)).unwrap(), vec![0, 3, 0, 1]);
        let bad = DictionaryArray::<Int32Type>::try_new(
            keys,
            Arc::new(arrow::array::UInt64Array::from(vec![0, 1, 9])),
        )
        .unwrap();
        let e = codes(Arc::new(bad)).unwrap_err().to_string();
        assert!(e.contains("bad changelog op 9 at row 3"), "{e}");
        // A NULL value behind a valid key is a NULL op.
        let null_value = DictionaryArray::<Int32Type>::try_new(
            arrow::array::Int32Array::from(vec![0, 1]),
            Arc::new(Int8Array::from(vec![Some(0), None])),
        )
        .unwrap();
        let e = codes(Arc::new(null_value)).unwrap_err().to_string();
        assert!(e.contains("NULL op at row 1"), "{e}");
    }

    /// Codes written as text (a CSV file's op column) read as the codes; other text is an error
    /// naming the row.
    #[test]
    fn codes_as_text_are_codes() {
        let text = StringArray::from(vec!["0", " 3", "+U", "1", "2"]);
        assert_eq!(codes(Arc::new(text)).unwrap(), vec![0, 3, 2, 1, 2]);
        for bad in ["4", "-1", "00x", ""] {
            let e = codes(Arc::new(StringArray::from(vec!["0", bad])))
                .unwrap_err()
                .to_string();
            assert!(e.contains("at row 1"), "{bad:?}: {e}");
        }
    }
}
