//! One table of the primitive key and value types of at most 64 bits, with each type's value
//! as 64 bits and back (floats by their bits, as keys compare them): used where values are kept
//! or packed as bits (DISTINCT entries, packed group keys).

/// Calls `$body` with `$t` bound to the Arrow primitive type of `$dt` and `$to` / `$from` its
/// conversions to and from `u64` (signed values sign-extended, and truncated back), or evaluates
/// `$otherwise` for a type that is not a primitive of at most 64 bits.
macro_rules! with_bits_type {
    ($dt:expr, |$t:ident, $to:ident, $from:ident| $body:expr, $otherwise:expr) => {{
        macro_rules! go {
            ($ty:ty, $native:ty, $tobits:expr, $frombits:expr) => {{
                type $t = $ty;
                let $to = $tobits;
                let $from = $frombits;
                $body
            }};
        }
        // Signed natives of 32 and 64 bits: sign-extended to 64 bits and truncated back.
        macro_rules! i32s {
            ($ty:ty) => {
                go!($ty, i32, |v: i32| v as u64, |b: u64| b as i32)
            };
        }
        macro_rules! i64s {
            ($ty:ty) => {
                go!($ty, i64, |v: i64| v as u64, |b: u64| b as i64)
            };
        }
        match $dt {
            arrow_schema::DataType::Int8 => go!(
                arrow_array::types::Int8Type,
                i8,
                |v: i8| v as u64,
                |b: u64| b as i8
            ),
            arrow_schema::DataType::Int16 => go!(
                arrow_array::types::Int16Type,
                i16,
                |v: i16| v as u64,
                |b: u64| b as i16
            ),
            arrow_schema::DataType::Int32 => i32s!(arrow_array::types::Int32Type),
            arrow_schema::DataType::Int64 => i64s!(arrow_array::types::Int64Type),
            arrow_schema::DataType::UInt8 => go!(
                arrow_array::types::UInt8Type,
                u8,
                |v: u8| u64::from(v),
                |b: u64| b as u8
            ),
            arrow_schema::DataType::UInt16 => go!(
                arrow_array::types::UInt16Type,
                u16,
                |v: u16| u64::from(v),
                |b: u64| b as u16
            ),
            arrow_schema::DataType::UInt32 => go!(
                arrow_array::types::UInt32Type,
                u32,
                |v: u32| u64::from(v),
                |b: u64| b as u32
            ),
            arrow_schema::DataType::UInt64 => {
                go!(arrow_array::types::UInt64Type, u64, |v: u64| v, |b: u64| b)
            }
            arrow_schema::DataType::Float32 => go!(
                arrow_array::types::Float32Type,
                f32,
                |v: f32| u64::from(v.to_bits()),
                |b: u64| f32::from_bits(b as u32)
            ),
            arrow_schema::DataType::Float64 => go!(
                arrow_array::types::Float64Type,
                f64,
                |v: f64| v.to_bits(),
                f64::from_bits
            ),
            arrow_schema::DataType::Date32 => i32s!(arrow_array::types::Date32Type),
            arrow_schema::DataType::Date64 => i64s!(arrow_array::types::Date64Type),
            arrow_schema::DataType::Time32(arrow_schema::TimeUnit::Second) => {
                i32s!(arrow_array::types::Time32SecondType)
            }
            arrow_schema::DataType::Time32(arrow_schema::TimeUnit::Millisecond) => {
                i32s!(arrow_array::types::Time32MillisecondType)
            }
            arrow_schema::DataType::Time64(arrow_schema::TimeUnit::Microsecond) => {
                i64s!(arrow_array::types::Time64MicrosecondType)
            }
            arrow_schema::DataType::Time64(arrow_schema::TimeUnit::Nanosecond) => {
                i64s!(arrow_array::types::Time64NanosecondType)
            }
            arrow_schema::DataType::Timestamp(arrow_schema::TimeUnit::Second, _) => {
                i64s!(arrow_array::types::TimestampSecondType)
            }
            arrow_schema::DataType::Timestamp(arrow_schema::TimeUnit::Millisecond, _) => {
                i64s!(arrow_array::types::TimestampMillisecondType)
            }
            arrow_schema::DataType::Timestamp(arrow_schema::TimeUnit::Microsecond, _) => {
                i64s!(arrow_array::types::TimestampMicrosecondType)
            }
            arrow_schema::DataType::Timestamp(arrow_schema::TimeUnit::Nanosecond, _) => {
                i64s!(arrow_array::types::TimestampNanosecondType)
            }
            _ => $otherwise,
        }
    }};
}

pub(crate) use with_bits_type;
