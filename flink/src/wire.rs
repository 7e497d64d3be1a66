//! The column batch format between the Java operator and Rust: rows cross JNI as one byte array
//! per batch, column by column, never row by row.
//!
//! Little-endian throughout:
//!
//! ```text
//! "TLY1"                      magic
//! u32 rows, u32 columns
//! u8 kinds                    0: all inserts; 1: followed by `rows` bytes, Flink's RowKind
//!                             byte values (0 +I, 1 -U, 2 +U, 3 -D)
//! per column:
//!   u8 type                   see `Type`: 1 BOOLEAN, 2 TINYINT, 3 SMALLINT, 4 INT, 5 BIGINT,
//!                             6 FLOAT, 7 DOUBLE, 8 STRING, 9 TIMESTAMP (then u8 precision
//!                             0, 3, 6 or 9), 10 DECIMAL (then u8 precision, u8 scale), 11 DATE
//!   u8 nulls                  0: no NULL; 1: followed by `rows` bytes, 1 valid, 0 NULL;
//!                             2: a column the query never reads, not sent (all NULL, no
//!                             values follow)
//!   values                    BOOLEAN, TINYINT: 1 byte a row; SMALLINT: 2; INT, FLOAT, DATE
//!                             (days since 1970-01-01): 4; BIGINT, DOUBLE: 8; DECIMAL: 16, the
//!                             unscaled value; TIMESTAMP: 8, seconds, milliseconds, micro- or
//!                             nanoseconds (by its precision) since 1970-01-01 00:00, no zone;
//!                             STRING: `rows + 1` u32 offsets from 0, then the UTF-8 bytes they
//!                             index. A NULL's value bytes are ignored.
//! ```
//!
//! `org.tally.flink.ColumnBatch` writes and reads the same bytes on the Java side.

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, Date32Array, Decimal128Array, Float32Array,
    Float64Array, Int8Array, Int16Array, Int32Array, Int64Array, RecordBatch, StringArray,
    TimestampMicrosecondArray, TimestampMillisecondArray, TimestampNanosecondArray,
    TimestampSecondArray,
};
use arrow::buffer::{Buffer, NullBuffer, OffsetBuffer, ScalarBuffer};
use arrow::datatypes::{
    DataType, Date32Type, Decimal128Type, Float32Type, Float64Type, Int8Type, Int16Type, Int32Type,
    Int64Type, SchemaRef, TimeUnit,
};
use tally::changelog::{ChangeBatch, RowKind, op_array};
use tally::{Error, Result};

const MAGIC: &[u8; 4] = b"TLY1";

/// The column types that cross JNI, with their wire tags. Their names are those of Tally's SQL
/// (`CREATE TABLE`), which are Flink SQL's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Type {
    /// `BOOLEAN`.
    Boolean,
    /// `TINYINT`.
    TinyInt,
    /// `SMALLINT`.
    SmallInt,
    /// `INT`.
    Int,
    /// `BIGINT`.
    BigInt,
    /// `FLOAT`.
    Float,
    /// `DOUBLE`.
    Double,
    /// `STRING`.
    String,
    /// `TIMESTAMP(p)`, without a time zone, counted in the unit its precision needs: seconds
    /// (p = 0), milliseconds (1 to 3), microseconds (4 to 6) or nanoseconds (7 to 9).
    Timestamp(TimeUnit),
    /// `DECIMAL(precision, scale)`: 128-bit unscaled values.
    Decimal(u8, i8),
    /// `DATE`: days since 1970-01-01.
    Date,
}

/// What the types that cross are, for messages.
const TYPE_NAMES: &str = "BOOLEAN, TINYINT, SMALLINT, INT, BIGINT, FLOAT, DOUBLE, STRING, \
    DECIMAL(p, s), DATE, TIMESTAMP(p) without a time zone";

impl Type {
    /// The type's SQL name (`BIGINT`, `DECIMAL(38, 2)`, `TIMESTAMP(6)`, …).
    pub fn name(self) -> String {
        tally::sql::sql_type_name(&self.arrow()).unwrap_or_else(|| format!("{self:?}"))
    }

    /// The type SQL calls `name`, as Tally's `CREATE TABLE` reads it (case-insensitive;
    /// `VARCHAR` is `STRING`, `TIMESTAMP` is `TIMESTAMP(6)`).
    ///
    /// # Errors
    /// A type the operator does not carry, named with the ones it does.
    pub fn parse(name: &str) -> Result<Type> {
        tally::sql::parse_sql_type(name)
            .ok()
            .and_then(|dt| Type::of(&dt))
            .ok_or_else(|| {
                Error::plan(format!(
                    "type '{name}' cannot cross into the Tally operator ({TYPE_NAMES})"
                ))
            })
    }

    /// The wire tag.
    fn tag(self) -> u8 {
        match self {
            Type::Boolean => 1,
            Type::TinyInt => 2,
            Type::SmallInt => 3,
            Type::Int => 4,
            Type::BigInt => 5,
            Type::Float => 6,
            Type::Double => 7,
            Type::String => 8,
            Type::Timestamp(_) => 9,
            Type::Decimal(..) => 10,
            Type::Date => 11,
        }
    }

    /// Writes the tag and the type's parameters (a timestamp's precision, a decimal's
    /// precision and scale).
    fn put(self, out: &mut Vec<u8>) {
        out.push(self.tag());
        match self {
            Type::Timestamp(unit) => out.push(match unit {
                TimeUnit::Second => 0,
                TimeUnit::Millisecond => 3,
                TimeUnit::Microsecond => 6,
                TimeUnit::Nanosecond => 9,
            }),
            Type::Decimal(p, s) => out.extend([p, s as u8]),
            _ => {}
        }
    }

    /// Reads what [`Type::put`] wrote.
    fn read(r: &mut Reader<'_>, column: &str) -> Result<Type> {
        let tag = r.u8("a column type")?;
        Ok(match tag {
            1 => Type::Boolean,
            2 => Type::TinyInt,
            3 => Type::SmallInt,
            4 => Type::Int,
            5 => Type::BigInt,
            6 => Type::Float,
            7 => Type::Double,
            8 => Type::String,
            9 => Type::Timestamp(match r.u8("a timestamp precision")? {
                0 => TimeUnit::Second,
                1..=3 => TimeUnit::Millisecond,
                4..=6 => TimeUnit::Microsecond,
                7..=9 => TimeUnit::Nanosecond,
                p => return Err(bad(format_args!("column '{column}' has TIMESTAMP({p})"))),
            }),
            10 => Type::Decimal(r.u8("a decimal precision")?, r.u8("a decimal scale")? as i8),
            11 => Type::Date,
            _ => return Err(bad(format_args!("column '{column}' has type tag {tag}"))),
        })
    }

    /// The type of an Arrow column, if it crosses (strings of any Arrow layout cross as
    /// `STRING`).
    pub fn of(dt: &DataType) -> Option<Type> {
        Some(match dt {
            DataType::Boolean => Type::Boolean,
            DataType::Int8 => Type::TinyInt,
            DataType::Int16 => Type::SmallInt,
            DataType::Int32 => Type::Int,
            DataType::Int64 => Type::BigInt,
            DataType::Float32 => Type::Float,
            DataType::Float64 => Type::Double,
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => Type::String,
            DataType::Dictionary(_, v) if Type::of(v) == Some(Type::String) => Type::String,
            DataType::Timestamp(unit, None) => Type::Timestamp(*unit),
            DataType::Decimal128(p, s) if *s >= 0 => Type::Decimal(*p, *s),
            DataType::Date32 => Type::Date,
            _ => return None,
        })
    }

    /// The Arrow type a column of this type is decoded as.
    pub fn arrow(self) -> DataType {
        match self {
            Type::Boolean => DataType::Boolean,
            Type::TinyInt => DataType::Int8,
            Type::SmallInt => DataType::Int16,
            Type::Int => DataType::Int32,
            Type::BigInt => DataType::Int64,
            Type::Float => DataType::Float32,
            Type::Double => DataType::Float64,
            Type::String => DataType::Utf8,
            Type::Timestamp(unit) => DataType::Timestamp(unit, None),
            Type::Decimal(p, s) => DataType::Decimal128(p, s),
            Type::Date => DataType::Date32,
        }
    }
}

fn bad(what: impl std::fmt::Display) -> Error {
    Error::invalid_input(format!(
        "malformed column batch from the Java operator: {what}"
    ))
}

struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        if self.bytes.len() < n {
            return Err(bad(format_args!(
                "{what} needs {n} bytes, {} are left",
                self.bytes.len()
            )));
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    fn u8(&mut self, what: &str) -> Result<u8> {
        Ok(self.take(1, what)?[0])
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
}

fn sized(rows: usize, width: usize, what: &str) -> Result<usize> {
    rows.checked_mul(width)
        .ok_or_else(|| bad(format_args!("{what}: {rows} rows overflow")))
}

fn scalars<T: arrow::datatypes::ArrowNativeType, const W: usize>(
    bytes: &[u8],
    from: impl Fn([u8; W]) -> T,
) -> ScalarBuffer<T> {
    bytes
        .chunks_exact(W)
        .map(|c| from(c.try_into().unwrap_or([0; W])))
        .collect::<Vec<T>>()
        .into()
}

/// Decodes one column batch of `schema` (names and types as declared; a column's type must
/// match). Returns the rows and, where the batch carries them, their row kinds.
///
/// # Errors
/// Bytes that do not form a batch of `schema`: a clear message naming what is wrong.
pub fn decode(bytes: &[u8], schema: &SchemaRef) -> Result<ChangeBatch> {
    let mut r = Reader { bytes };
    if r.take(4, "the magic")? != MAGIC {
        return Err(bad("it does not start with TLY1"));
    }
    let rows = r.u32("the row count")? as usize;
    let columns = r.u32("the column count")? as usize;
    if columns != schema.fields().len() {
        return Err(bad(format_args!(
            "{columns} columns where the input declares {}",
            schema.fields().len()
        )));
    }
    let op = match r.u8("the kinds flag")? {
        0 => None,
        1 => {
            let codes = r.take(rows, "the row kinds")?;
            let kinds = codes
                .iter()
                .map(|&c| {
                    RowKind::from_code(i64::from(c))
                        .ok_or_else(|| bad(format_args!("row kind {c} (0 to 3 are Flink's)")))
                })
                .collect::<Result<Vec<_>>>()?;
            Some(op_array(&kinds))
        }
        f => return Err(bad(format_args!("kinds flag {f}"))),
    };
    let mut arrays: Vec<ArrayRef> = Vec::with_capacity(columns);
    for field in schema.fields() {
        let name = field.name();
        let ty = Type::read(&mut r, name)?;
        let want = Type::of(field.data_type());
        if want != Some(ty) {
            return Err(bad(format_args!(
                "column '{name}' arrives as {} where the input declares {}",
                ty.name(),
                field.data_type()
            )));
        }
        let nulls = match r.u8("a nulls flag")? {
            2 if field.is_nullable() => {
                arrays.push(arrow::array::new_null_array(field.data_type(), rows));
                continue;
            }
            0 => None,
            1 => {
                let valid = r.take(rows, "a validity")?;
                Some(NullBuffer::from(
                    valid.iter().map(|&v| v != 0).collect::<Vec<_>>(),
                ))
            }
            f => return Err(bad(format_args!("column '{name}' has nulls flag {f}"))),
        };
        if nulls.as_ref().is_some_and(|n| n.null_count() > 0) && !field.is_nullable() {
            return Err(Error::invalid_input(format!(
                "column '{name}' is declared NOT NULL but a row holds NULL"
            )));
        }
        let array: ArrayRef = match ty {
            Type::Boolean => {
                let v = r.take(rows, name)?;
                let values: arrow::buffer::BooleanBuffer = v.iter().map(|&b| b != 0).collect();
                Arc::new(BooleanArray::new(values, nulls))
            }
            Type::TinyInt => {
                let v = r.take(rows, name)?;
                Arc::new(Int8Array::new(scalars(v, i8::from_le_bytes), nulls))
            }
            Type::SmallInt => {
                let v = r.take(sized(rows, 2, name)?, name)?;
                Arc::new(Int16Array::new(scalars(v, i16::from_le_bytes), nulls))
            }
            Type::Int => {
                let v = r.take(sized(rows, 4, name)?, name)?;
                Arc::new(Int32Array::new(scalars(v, i32::from_le_bytes), nulls))
            }
            Type::BigInt => {
                let v = r.take(sized(rows, 8, name)?, name)?;
                Arc::new(Int64Array::new(scalars(v, i64::from_le_bytes), nulls))
            }
            Type::Float => {
                let v = r.take(sized(rows, 4, name)?, name)?;
                Arc::new(Float32Array::new(scalars(v, f32::from_le_bytes), nulls))
            }
            Type::Double => {
                let v = r.take(sized(rows, 8, name)?, name)?;
                Arc::new(Float64Array::new(scalars(v, f64::from_le_bytes), nulls))
            }
            Type::Timestamp(unit) => {
                let v = r.take(sized(rows, 8, name)?, name)?;
                let v = scalars(v, i64::from_le_bytes);
                match unit {
                    TimeUnit::Second => Arc::new(TimestampSecondArray::new(v, nulls)),
                    TimeUnit::Millisecond => Arc::new(TimestampMillisecondArray::new(v, nulls)),
                    TimeUnit::Microsecond => Arc::new(TimestampMicrosecondArray::new(v, nulls)),
                    TimeUnit::Nanosecond => Arc::new(TimestampNanosecondArray::new(v, nulls)),
                }
            }
            Type::Decimal(p, s) => {
                let v = r.take(sized(rows, 16, name)?, name)?;
                let array = Decimal128Array::new(scalars(v, i128::from_le_bytes), nulls)
                    .with_precision_and_scale(p, s)
                    .map_err(|e| bad(format_args!("column '{name}': {e}")))?;
                array.validate_decimal_precision(p).map_err(|e| {
                    bad(format_args!(
                        "column '{name}' holds a value beyond DECIMAL({p}, {s}): {e}"
                    ))
                })?;
                Arc::new(array)
            }
            Type::Date => {
                let v = r.take(sized(rows, 4, name)?, name)?;
                Arc::new(Date32Array::new(scalars(v, i32::from_le_bytes), nulls))
            }
            Type::String => {
                let raw = r.take(sized(rows + 1, 4, name)?, name)?;
                let offsets: ScalarBuffer<i32> = scalars(raw, u32::from_le_bytes)
                    .iter()
                    .map(|&o| i32::try_from(o).unwrap_or(-1))
                    .collect::<Vec<_>>()
                    .into();
                if offsets[0] != 0 || offsets.windows(2).any(|w| w[1] < w[0]) {
                    return Err(bad(format_args!(
                        "column '{name}' has string offsets that do not grow from 0"
                    )));
                }
                let len = offsets[rows] as usize;
                let data = r.take(len, name)?;
                let array = StringArray::try_new(
                    OffsetBuffer::new(offsets),
                    Buffer::from(data.to_vec()),
                    nulls,
                )
                .map_err(|e| bad(format_args!("column '{name}': {e}")))?;
                Arc::new(array)
            }
        };
        arrays.push(array);
    }
    if !r.bytes.is_empty() {
        return Err(bad(format_args!(
            "{} bytes after the last column",
            r.bytes.len()
        )));
    }
    let options = arrow::array::RecordBatchOptions::new().with_row_count(Some(rows));
    let data =
        RecordBatch::try_new_with_options(Arc::clone(schema), arrays, &options).map_err(bad)?;
    ChangeBatch::try_new(op, data)
}

fn put_values<T: arrow::datatypes::ArrowPrimitiveType, const W: usize>(
    out: &mut Vec<u8>,
    a: &dyn Array,
    to: impl Fn(T::Native) -> [u8; W],
) {
    for v in a.as_primitive::<T>().values() {
        out.extend_from_slice(&to(*v));
    }
}

/// Encodes changes for the Java operator: the rows' columns and their kinds.
///
/// # Errors
/// A column of a type that does not cross (the plan checks the output's types up front).
pub fn encode(changes: &ChangeBatch) -> Result<Vec<u8>> {
    let data = &changes.data;
    let rows = data.num_rows();
    let mut out = Vec::with_capacity(16 + rows * 8 * data.num_columns().max(1));
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(rows as u32).to_le_bytes());
    out.extend_from_slice(&(data.num_columns() as u32).to_le_bytes());
    if changes.op.is_some() {
        out.push(1);
        out.extend(changes.row_kinds()?.iter().map(|k| k.code() as u8));
    } else {
        out.push(0);
    }
    for (field, column) in data.schema().fields().iter().zip(data.columns()) {
        let ty = Type::of(column.data_type()).ok_or_else(|| {
            Error::plan(format!(
                "result column '{}' of type {} cannot cross into Flink ({})",
                field.name(),
                column.data_type(),
                TYPE_NAMES
            ))
        })?;
        let column = if ty == Type::String && column.data_type() != &DataType::Utf8 {
            arrow::compute::cast(column, &DataType::Utf8).map_err(Error::from)?
        } else {
            Arc::clone(column)
        };
        ty.put(&mut out);
        match column.logical_nulls() {
            Some(n) if n.null_count() > 0 => {
                out.push(1);
                out.extend(n.iter().map(u8::from));
            }
            _ => out.push(0),
        }
        let a = column.as_ref();
        match ty {
            Type::Boolean => out.extend(a.as_boolean().values().iter().map(u8::from)),
            Type::TinyInt => put_values::<Int8Type, 1>(&mut out, a, i8::to_le_bytes),
            Type::SmallInt => put_values::<Int16Type, 2>(&mut out, a, i16::to_le_bytes),
            Type::Int => put_values::<Int32Type, 4>(&mut out, a, i32::to_le_bytes),
            Type::BigInt => put_values::<Int64Type, 8>(&mut out, a, i64::to_le_bytes),
            Type::Float => put_values::<Float32Type, 4>(&mut out, a, f32::to_le_bytes),
            Type::Double => put_values::<Float64Type, 8>(&mut out, a, f64::to_le_bytes),
            Type::Timestamp(_) => {
                // Every unit's values are i64s: the unit travels in the type.
                let v = a.to_data();
                for t in v.buffer::<i64>(0).iter().take(rows) {
                    out.extend_from_slice(&t.to_le_bytes());
                }
            }
            Type::Decimal(..) => put_values::<Decimal128Type, 16>(&mut out, a, i128::to_le_bytes),
            Type::Date => put_values::<Date32Type, 4>(&mut out, a, i32::to_le_bytes),
            Type::String => {
                let s = a.as_string::<i32>();
                let offsets = s.value_offsets();
                let base = offsets[0];
                for o in offsets {
                    out.extend_from_slice(&((o - base) as u32).to_le_bytes());
                }
                let end = offsets[rows] as usize;
                out.extend_from_slice(&s.value_data()[base as usize..end]);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
