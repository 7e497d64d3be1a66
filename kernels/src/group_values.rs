//! Key interning: group-key columns → dense `u32` group ids.
//!
//! A [`GroupValues`] table maps each distinct key (a tuple of column values, NULL being a value
//! like any other) to a group id. Ids are dense, start at 0 and are never reused, so every
//! accumulator can keep its state in flat vectors indexed by group id. The table never stores
//! aggregate state.
//!
//! The caller hashes the key columns once per row with [`crate::hash::hash_columns`] and passes
//! the hashes in; the tables store each group's hash so that growing never rehashes a key.
//!
//! [`new_group_values`] picks the implementation:
//! * no key columns (a global aggregate): every row is group 0;
//! * one primitive, decimal or temporal column: [`PrimitiveGroupValues`], values in a `Vec`;
//! * one string column (Utf8, LargeUtf8, Utf8View, or a dictionary of strings):
//!   [`BytesGroupValues`], all key bytes in one buffer (no allocation per group);
//! * several columns (or a boolean) of fixed-width types of at most 64 bits and strings, whose
//!   values, string ids and NULL flags fit two or four 64-bit words: [`PackedGroupValues`], one
//!   `[u64; W]` per key;
//! * anything else (decimals among several columns, more than four words): [`RowGroupValues`],
//!   keys encoded with arrow-row.
//!
//! A split-distinct PARTIAL's local phase, whose keys end in bucket columns, takes a
//! [`BucketedGroupValues`] instead (chosen by the planner, not by the types); where its workers merge
//! their buckets, it needs only each row's query key and worker: [`BucketRoutes`].

use arrow_array::types::*;
use arrow_schema::{ArrowError, DataType, TimeUnit};

mod bucketed;
mod bytes;
mod packed;
mod prefix;
mod primitive;
mod routes;
mod rows;
mod table;

pub use bucketed::{BucketedGroupValues, MAX_BLOCK_ENTRIES, MAX_BUCKET_COLUMNS};
pub use bytes::BytesGroupValues;
pub use packed::PackedGroupValues;
pub use primitive::{NoKeyGroupValues, PrimitiveGroupValues};
pub use routes::{BucketRoutes, BucketedKeyHash, NO_ROUTE};
pub use rows::RowGroupValues;
pub use table::{GroupValues, key_type_supported, same_array};

/// Builds the group table for keys of the given types.
///
/// # Errors
/// When a type cannot be a group key.
pub fn new_group_values(types: &[DataType]) -> Result<Box<dyn GroupValues>, ArrowError> {
    macro_rules! prim {
        ($t:ty, $dt:expr) => {
            Box::new(PrimitiveGroupValues::<$t>::new($dt.clone()))
        };
    }
    Ok(match types {
        [] => Box::new(NoKeyGroupValues::default()),
        [dt] => match dt {
            DataType::Int8 => prim!(Int8Type, dt),
            DataType::Int16 => prim!(Int16Type, dt),
            DataType::Int32 => prim!(Int32Type, dt),
            DataType::Int64 => prim!(Int64Type, dt),
            DataType::UInt8 => prim!(UInt8Type, dt),
            DataType::UInt16 => prim!(UInt16Type, dt),
            DataType::UInt32 => prim!(UInt32Type, dt),
            DataType::UInt64 => prim!(UInt64Type, dt),
            DataType::Float32 => prim!(Float32Type, dt),
            DataType::Float64 => prim!(Float64Type, dt),
            DataType::Decimal128(_, _) => prim!(Decimal128Type, dt),
            DataType::Decimal256(_, _) => prim!(Decimal256Type, dt),
            DataType::Date32 => prim!(Date32Type, dt),
            DataType::Date64 => prim!(Date64Type, dt),
            DataType::Time32(TimeUnit::Second) => prim!(Time32SecondType, dt),
            DataType::Time32(TimeUnit::Millisecond) => prim!(Time32MillisecondType, dt),
            DataType::Time64(TimeUnit::Microsecond) => prim!(Time64MicrosecondType, dt),
            DataType::Time64(TimeUnit::Nanosecond) => prim!(Time64NanosecondType, dt),
            DataType::Timestamp(TimeUnit::Second, _) => prim!(TimestampSecondType, dt),
            DataType::Timestamp(TimeUnit::Millisecond, _) => prim!(TimestampMillisecondType, dt),
            DataType::Timestamp(TimeUnit::Microsecond, _) => prim!(TimestampMicrosecondType, dt),
            DataType::Timestamp(TimeUnit::Nanosecond, _) => prim!(TimestampNanosecondType, dt),
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => {
                Box::new(BytesGroupValues::new(dt.clone()))
            }
            DataType::Dictionary(k, v)
                if k.is_dictionary_key_type()
                    && matches!(
                        v.as_ref(),
                        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
                    ) =>
            {
                Box::new(BytesGroupValues::new(dt.clone()))
            }
            _ => packed_or_rows(types)?,
        },
        _ => packed_or_rows(types)?,
    })
}

/// Keys that pack into at most four 64-bit words go to a [`PackedGroupValues`], the rest to
/// arrow-row.
fn packed_or_rows(types: &[DataType]) -> Result<Box<dyn GroupValues>, ArrowError> {
    Ok(match packed::new_packed(types) {
        Some(packed) => packed,
        None => Box::new(RowGroupValues::try_new(types)?),
    })
}
