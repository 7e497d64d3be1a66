//! The values of a primitive DISTINCT argument as the 64 bits its entries key by: each value's
//! own bits (floats by their bits, as keys compare them), and back.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::*;
use arrow_array::{Array, ArrayRef, PrimitiveArray};
use arrow_schema::{ArrowError, DataType, TimeUnit};

/// Calls `$body` with `$t` bound to the Arrow primitive type of `$dt` (a type [`bits_type`]
/// accepts) and `$to` / `$from` its conversions to and from `u64`.
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
            DataType::Int8 => go!(Int8Type, i8, |v: i8| v as u64, |b: u64| b as i8),
            DataType::Int16 => go!(Int16Type, i16, |v: i16| v as u64, |b: u64| b as i16),
            DataType::Int32 => i32s!(Int32Type),
            DataType::Int64 => i64s!(Int64Type),
            DataType::UInt8 => go!(UInt8Type, u8, |v: u8| u64::from(v), |b: u64| b as u8),
            DataType::UInt16 => go!(UInt16Type, u16, |v: u16| u64::from(v), |b: u64| b as u16),
            DataType::UInt32 => go!(UInt32Type, u32, |v: u32| u64::from(v), |b: u64| b as u32),
            DataType::UInt64 => go!(UInt64Type, u64, |v: u64| v, |b: u64| b),
            DataType::Float32 => go!(
                Float32Type,
                f32,
                |v: f32| u64::from(v.to_bits()),
                |b: u64| f32::from_bits(b as u32)
            ),
            DataType::Float64 => go!(Float64Type, f64, |v: f64| v.to_bits(), f64::from_bits),
            DataType::Date32 => i32s!(Date32Type),
            DataType::Date64 => i64s!(Date64Type),
            DataType::Time32(TimeUnit::Second) => i32s!(Time32SecondType),
            DataType::Time32(TimeUnit::Millisecond) => i32s!(Time32MillisecondType),
            DataType::Time64(TimeUnit::Microsecond) => i64s!(Time64MicrosecondType),
            DataType::Time64(TimeUnit::Nanosecond) => i64s!(Time64NanosecondType),
            DataType::Timestamp(TimeUnit::Second, _) => i64s!(TimestampSecondType),
            DataType::Timestamp(TimeUnit::Millisecond, _) => i64s!(TimestampMillisecondType),
            DataType::Timestamp(TimeUnit::Microsecond, _) => i64s!(TimestampMicrosecondType),
            DataType::Timestamp(TimeUnit::Nanosecond, _) => i64s!(TimestampNanosecondType),
            _ => $otherwise,
        }
    }};
}

/// Whether values of `dt` are keyed by their own bits.
pub(super) fn bits_type(dt: &DataType) -> bool {
    with_bits_type!(
        dt,
        |T, _to, _from| {
            let _: std::marker::PhantomData<T> = std::marker::PhantomData;
            true
        },
        false
    )
}

/// The values of `array` (of a [`bits_type`]) as bits, into `out` (cleared first).
pub(super) fn to_bits(array: &dyn Array, out: &mut Vec<u64>) -> Result<(), ArrowError> {
    out.clear();
    with_bits_type!(
        array.data_type(),
        |T, to, _from| {
            let a = array.as_primitive_opt::<T>().ok_or_else(|| {
                ArrowError::InvalidArgumentError("DISTINCT argument of another type".into())
            })?;
            out.extend(a.values().iter().map(|&v| to(v)));
            Ok(())
        },
        Err(ArrowError::InvalidArgumentError(format!(
            "DISTINCT values of {} are not kept as bits",
            array.data_type()
        )))
    )
}

/// An array of type `dt` (a [`bits_type`]) holding the values whose bits are `bits`.
pub(super) fn from_bits(bits: &[u64], dt: &DataType) -> Result<ArrayRef, ArrowError> {
    with_bits_type!(
        dt,
        |T, _to, from| {
            let a = PrimitiveArray::<T>::from_iter_values(bits.iter().map(|&b| from(b)))
                .with_data_type(dt.clone());
            Ok(Arc::new(a) as ArrayRef)
        },
        Err(ArrowError::InvalidArgumentError(format!(
            "DISTINCT values of {dt} are not kept as bits"
        )))
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{Float64Array, Int8Array, TimestampMillisecondArray, UInt64Array};

    /// Values go to bits and back unchanged, signs, the float zeros and NaN payloads, and a
    /// timestamp's time zone included; other types are not kept as bits.
    #[test]
    fn values_round_trip_through_bits() {
        let arrays: Vec<ArrayRef> = vec![
            Arc::new(Int8Array::from(vec![-128, -1, 0, 127])),
            Arc::new(UInt64Array::from(vec![0, u64::MAX])),
            Arc::new(Float64Array::from(vec![
                0.0,
                -0.0,
                f64::NAN,
                f64::from_bits(0x7ff8_0000_0000_0001),
                -3.5,
            ])),
            Arc::new(
                TimestampMillisecondArray::from(vec![-1, 1_700_000_000_000])
                    .with_timezone("+02:00"),
            ),
        ];
        for a in arrays {
            assert!(bits_type(a.data_type()));
            let mut bits = vec![];
            to_bits(a.as_ref(), &mut bits).unwrap();
            let back = from_bits(&bits, a.data_type()).unwrap();
            assert_eq!(back.data_type(), a.data_type());
            assert_eq!(back.to_data().buffers(), a.to_data().buffers(), "{a:?}");
        }
        // -0.0 and 0.0 are two keys, as for group keys.
        let mut bits = vec![];
        to_bits(&Float64Array::from(vec![0.0, -0.0]), &mut bits).unwrap();
        assert_ne!(bits[0], bits[1]);
        assert!(!bits_type(&DataType::Utf8));
        assert!(!bits_type(&DataType::Decimal128(38, 2)));
    }
}
