//! The values of a primitive DISTINCT argument as the 64 bits its entries key by: each value's
//! own bits (floats by their bits, as keys compare them), and back.

use std::sync::Arc;

use arrow_array::cast::AsArray;

use arrow_array::{Array, ArrayRef, PrimitiveArray};
use arrow_schema::{ArrowError, DataType};

use crate::bits::with_bits_type;

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

/// [`from_bits`] of bits the caller gives up: for 64-bit types the array takes their buffer as
/// it is (a value's bits are its own), for narrower ones the values are written over it.
pub(super) fn from_bits_owned(bits: Vec<u64>, dt: &DataType) -> Result<ArrayRef, ArrowError> {
    with_bits_type!(
        dt,
        |T, _to, from| {
            let values: Vec<_> = bits.into_iter().map(from).collect();
            let a = PrimitiveArray::<T>::from(values).with_data_type(dt.clone());
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
            let at = bits.as_ptr() as usize;
            let owned = from_bits_owned(bits, a.data_type()).unwrap();
            assert_eq!(owned.data_type(), a.data_type());
            assert_eq!(owned.to_data().buffers(), a.to_data().buffers(), "{a:?}");
            if a.data_type().primitive_width() == Some(8) {
                // 64-bit values keep the bits' buffer.
                assert_eq!(owned.to_data().buffers()[0].as_ptr() as usize, at, "{a:?}");
            }
        }
        // -0.0 and 0.0 are two keys, as for group keys.
        let mut bits = vec![];
        to_bits(&Float64Array::from(vec![0.0, -0.0]), &mut bits).unwrap();
        assert_ne!(bits[0], bits[1]);
        assert!(!bits_type(&DataType::Utf8));
        assert!(!bits_type(&DataType::Decimal128(38, 2)));
    }
}
