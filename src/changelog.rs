//! Changelog row kinds and the `op` column.
//!
//! Row kinds are Flink's, with Flink's byte values: `+I` = 0 (insert), `-U` = 1 (update before),
//! `+U` = 2 (update after), `-D` = 3 (delete). In Arrow they are an `Int8` column named `op`;
//! text formats print `+I`, `-U`, `+U`, `-D`. `+I`/`+U` accumulate, `-U`/`-D` retract.

use arrow::array::{Array, ArrayRef, AsArray, Int8Array};
use arrow::buffer::BooleanBuffer;
use arrow::datatypes::{DataType, Int64Type};

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

/// Reads an `op` column (integer codes 0..=3 or the short strings) into Int8 codes.
///
/// # Errors
/// A NULL, an unknown code or string, an unsupported type; the message names the row.
pub fn op_codes(op: &ArrayRef) -> Result<ArrayRef> {
    let n = op.len();
    if op.null_count() > 0 {
        let row = (0..n).find(|&i| op.is_null(i)).unwrap_or(0);
        return Err(Error::invalid_input(format!(
            "changelog column has a NULL op at row {row}"
        )));
    }
    let dt = op.data_type();
    if dt.is_integer() {
        let wide = arrow::compute::cast(op, &DataType::Int64)?;
        let codes = wide.as_primitive::<Int64Type>().values();
        if let Some((row, c)) = codes
            .iter()
            .enumerate()
            .find(|(_, c)| !(0..=3).contains(*c))
        {
            return Err(bad_code(row, &c.to_string()));
        }
        return Ok(if dt == &DataType::Int8 {
            std::sync::Arc::clone(op)
        } else {
            std::sync::Arc::new(Int8Array::from_iter_values(codes.iter().map(|&c| c as i8)))
        });
    }
    if !op_type_supported(dt) {
        return Err(Error::invalid_input(format!(
            "changelog column has type {dt}; expected Int8 codes 0..3 or the strings +I/-U/+U/-D"
        )));
    }
    let strings = arrow::compute::cast(op, &DataType::Utf8)?;
    let strings = strings.as_string::<i32>();
    let mut codes = Vec::with_capacity(n);
    for i in 0..n {
        let s = strings.value(i);
        let kind = RowKind::parse(s).ok_or_else(|| bad_code(i, &format!("'{s}'")))?;
        codes.push(kind.code());
    }
    Ok(std::sync::Arc::new(Int8Array::from(codes)))
}

/// Reads an `op` column (as [`op_codes`]) into a bitmap of retracting rows (`-U`, `-D`: the odd
/// codes).
///
/// # Errors
/// As [`op_codes`].
pub fn retract_mask(op: &ArrayRef) -> Result<BooleanBuffer> {
    let codes = op_codes(op)?;
    let codes = codes.as_primitive::<arrow::datatypes::Int8Type>().values();
    Ok(BooleanBuffer::collect_bool(codes.len(), |i| {
        codes[i] & 1 == 1
    }))
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
