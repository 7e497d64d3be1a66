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
//! * anything else (several columns, booleans): [`RowGroupValues`], keys encoded with arrow-row.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::*;
use arrow_array::{Array, ArrayRef, ArrowPrimitiveType, PrimitiveArray};
use arrow_buffer::{NullBuffer, ScalarBuffer};
use arrow_schema::{ArrowError, DataType, TimeUnit};
use hashbrown::HashTable;

use crate::hash::KeyNative;

mod bytes;
mod rows;

pub use bytes::BytesGroupValues;
pub use rows::RowGroupValues;

/// Interns group keys into dense group ids.
pub trait GroupValues: Send + Sync + std::fmt::Debug {
    /// Interns every row of `cols` and writes its group id to `groups` (cleared first).
    /// `hashes` holds one hash per row from [`crate::hash::hash_columns`] over the same columns.
    ///
    /// # Errors
    /// When the columns do not have the types this table was made for.
    fn intern(
        &mut self,
        cols: &[ArrayRef],
        hashes: &[u64],
        groups: &mut Vec<u32>,
    ) -> Result<(), ArrowError>;

    /// The number of groups interned so far.
    fn len(&self) -> usize;

    /// Whether no group has been interned.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes held, from capacity.
    fn size(&self) -> usize;

    /// Forgets every group, keeping the allocations (a local phase reuses its table every
    /// mini-batch).
    fn clear(&mut self);

    /// Each group's hash, by group id: the row hash its key was first interned with.
    fn hashes(&self) -> &[u64];

    /// The key columns of the given groups, one row per id, in the key types the table was made
    /// for.
    ///
    /// # Errors
    /// When an id is out of range.
    fn keys(&self, groups: &[u32]) -> Result<Vec<ArrayRef>, ArrowError>;
}

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
            _ => Box::new(RowGroupValues::try_new(types)?),
        },
        _ => Box::new(RowGroupValues::try_new(types)?),
    })
}

fn check_len(cols: &[ArrayRef], hashes: &[u64], want_cols: usize) -> Result<usize, ArrowError> {
    if cols.len() != want_cols {
        return Err(ArrowError::InvalidArgumentError(format!(
            "expected {want_cols} key columns, got {}",
            cols.len()
        )));
    }
    let n = cols.first().map_or(hashes.len(), |c| c.len());
    if hashes.len() != n || cols.iter().any(|c| c.len() != n) {
        return Err(ArrowError::InvalidArgumentError(
            "key columns and hashes differ in length".to_string(),
        ));
    }
    Ok(n)
}

fn out_of_range(g: u32) -> ArrowError {
    ArrowError::InvalidArgumentError(format!("group id {g} out of range"))
}

/// A global aggregate's table: one group, id 0, with no key columns.
#[derive(Debug, Default)]
pub struct NoKeyGroupValues {
    seen: bool,
}

impl GroupValues for NoKeyGroupValues {
    fn intern(
        &mut self,
        cols: &[ArrayRef],
        hashes: &[u64],
        groups: &mut Vec<u32>,
    ) -> Result<(), ArrowError> {
        check_len(cols, hashes, 0)?;
        groups.clear();
        groups.resize(hashes.len(), 0);
        self.seen |= !hashes.is_empty();
        Ok(())
    }
    fn len(&self) -> usize {
        usize::from(self.seen)
    }
    fn size(&self) -> usize {
        0
    }
    fn clear(&mut self) {
        self.seen = false;
    }
    fn hashes(&self) -> &[u64] {
        // Rows without keys all hash to 0 (see `hash_columns`).
        if self.seen { &[0] } else { &[] }
    }
    fn keys(&self, groups: &[u32]) -> Result<Vec<ArrayRef>, ArrowError> {
        if let Some(&g) = groups.iter().find(|&&g| g != 0) {
            return Err(out_of_range(g));
        }
        Ok(vec![])
    }
}

/// One primitive key column: values in a `Vec`, a `HashTable` of group ids.
#[derive(Debug)]
pub struct PrimitiveGroupValues<T: ArrowPrimitiveType> {
    data_type: DataType,
    map: HashTable<u32>,
    values: Vec<T::Native>,
    hashes: Vec<u64>,
    null_group: Option<u32>,
}

impl<T: ArrowPrimitiveType> PrimitiveGroupValues<T>
where
    T::Native: KeyNative,
{
    /// An empty table for keys of `data_type` (which must be `T`'s type, parameters included).
    pub fn new(data_type: DataType) -> Self {
        Self {
            data_type,
            map: HashTable::with_capacity(128),
            values: Vec::with_capacity(128),
            hashes: Vec::with_capacity(128),
            null_group: None,
        }
    }
}

impl<T: ArrowPrimitiveType + std::fmt::Debug> GroupValues for PrimitiveGroupValues<T>
where
    T::Native: KeyNative,
{
    fn intern(
        &mut self,
        cols: &[ArrayRef],
        hashes: &[u64],
        groups: &mut Vec<u32>,
    ) -> Result<(), ArrowError> {
        check_len(cols, hashes, 1)?;
        let arr = cols[0]
            .as_primitive_opt::<T>()
            .ok_or_else(|| ArrowError::InvalidArgumentError("unexpected key type".into()))?;
        groups.clear();
        groups.reserve(arr.len());
        let values = arr.values();
        let nulls = arr.nulls().filter(|n| n.null_count() > 0);
        for (i, &h) in hashes.iter().enumerate() {
            if nulls.is_some_and(|n| n.is_null(i)) {
                let g = match self.null_group {
                    Some(g) => g,
                    None => {
                        let g = self.values.len() as u32;
                        self.values.push(T::Native::default());
                        self.hashes.push(h);
                        self.null_group = Some(g);
                        g
                    }
                };
                groups.push(g);
                continue;
            }
            let v = values[i];
            let stored = &self.values;
            let null_group = self.null_group;
            let found = self.map.find(h, |&g| {
                stored[g as usize].key_eq(v) && Some(g) != null_group
            });
            let g = match found {
                Some(&g) => g,
                None => {
                    let g = self.values.len() as u32;
                    self.values.push(v);
                    self.hashes.push(h);
                    let hs = &self.hashes;
                    self.map.insert_unique(h, g, |&g| hs[g as usize]);
                    g
                }
            };
            groups.push(g);
        }
        Ok(())
    }

    fn len(&self) -> usize {
        self.values.len()
    }

    fn size(&self) -> usize {
        self.map.capacity() * (std::mem::size_of::<u32>() + 1)
            + self.values.capacity() * std::mem::size_of::<T::Native>()
            + self.hashes.capacity() * 8
    }

    fn clear(&mut self) {
        self.map.clear();
        self.values.clear();
        self.hashes.clear();
        self.null_group = None;
    }

    fn hashes(&self) -> &[u64] {
        &self.hashes
    }

    fn keys(&self, groups: &[u32]) -> Result<Vec<ArrayRef>, ArrowError> {
        let mut out = Vec::with_capacity(groups.len());
        for &g in groups {
            out.push(*self.values.get(g as usize).ok_or_else(|| out_of_range(g))?);
        }
        let nulls = self.null_group.map(|ng| {
            NullBuffer::new(arrow_buffer::BooleanBuffer::collect_bool(
                groups.len(),
                |i| groups[i] != ng,
            ))
        });
        let arr = PrimitiveArray::<T>::new(ScalarBuffer::from(out), nulls)
            .with_data_type(self.data_type.clone());
        Ok(vec![Arc::new(arr)])
    }
}

/// Whether a column of this type can be a group key.
pub fn key_type_supported(dt: &DataType) -> bool {
    match dt {
        DataType::Int8
        | DataType::Int16
        | DataType::Int32
        | DataType::Int64
        | DataType::UInt8
        | DataType::UInt16
        | DataType::UInt32
        | DataType::UInt64
        | DataType::Float32
        | DataType::Float64
        | DataType::Decimal128(_, _)
        | DataType::Decimal256(_, _)
        | DataType::Boolean
        | DataType::Utf8
        | DataType::LargeUtf8
        | DataType::Utf8View
        | DataType::Date32
        | DataType::Date64
        | DataType::Time32(_)
        | DataType::Time64(_)
        | DataType::Timestamp(_, _) => true,
        DataType::Dictionary(k, v) => k.is_dictionary_key_type() && key_type_supported(v),
        _ => false,
    }
}
