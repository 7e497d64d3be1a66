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
use arrow_array::{
    Array, ArrayRef, ArrowPrimitiveType, DictionaryArray, PrimitiveArray, StringArray,
};
use arrow_buffer::{ArrowNativeType, BooleanBufferBuilder, NullBuffer, OffsetBuffer, ScalarBuffer};
use arrow_row::{RowConverter, Rows, SortField};
use arrow_schema::{ArrowError, DataType, TimeUnit};
use hashbrown::HashTable;

use crate::hash::KeyNative;

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

/// One string key column (Utf8, LargeUtf8, Utf8View or a dictionary of those): every key's
/// bytes in one buffer.
#[derive(Debug)]
pub struct BytesGroupValues {
    data_type: DataType,
    map: HashTable<u32>,
    bytes: Vec<u8>,
    /// `offsets[g]..offsets[g + 1]` are group `g`'s bytes.
    offsets: Vec<usize>,
    hashes: Vec<u64>,
    null_group: Option<u32>,
    /// Per-batch cache of dictionary value index → group id.
    dict_cache: Vec<u32>,
}

impl BytesGroupValues {
    /// An empty table for keys of `data_type`.
    pub fn new(data_type: DataType) -> Self {
        Self {
            data_type,
            map: HashTable::with_capacity(128),
            bytes: Vec::with_capacity(1024),
            offsets: vec![0],
            hashes: Vec::with_capacity(128),
            null_group: None,
            dict_cache: vec![],
        }
    }

    fn null_group(&mut self) -> u32 {
        match self.null_group {
            Some(g) => g,
            None => {
                let g = self.hashes.len() as u32;
                self.offsets.push(self.bytes.len());
                self.hashes.push(crate::hash::NULL_HASH);
                self.null_group = Some(g);
                g
            }
        }
    }

    #[inline(always)]
    fn intern_one(&mut self, v: &[u8], h: u64) -> u32 {
        let bytes = &self.bytes;
        let offsets = &self.offsets;
        let null_group = self.null_group;
        let found = self.map.find(h, |&g| {
            let g = g as usize;
            &bytes[offsets[g]..offsets[g + 1]] == v && Some(g as u32) != null_group
        });
        match found {
            Some(&g) => g,
            None => {
                let g = self.hashes.len() as u32;
                self.bytes.extend_from_slice(v);
                self.offsets.push(self.bytes.len());
                self.hashes.push(h);
                let hs = &self.hashes;
                self.map.insert_unique(h, g, |&g| hs[g as usize]);
                g
            }
        }
    }

    fn intern_strings<'a>(
        &mut self,
        len: usize,
        nulls: Option<&NullBuffer>,
        value: impl Fn(usize) -> &'a [u8],
        hashes: &[u64],
        groups: &mut Vec<u32>,
    ) {
        let nulls = nulls.filter(|n| n.null_count() > 0);
        for (i, &h) in hashes.iter().enumerate().take(len) {
            let g = if nulls.is_some_and(|n| n.is_null(i)) {
                self.null_group()
            } else {
                self.intern_one(value(i), h)
            };
            groups.push(g);
        }
    }

    fn intern_dictionary<K: ArrowDictionaryKeyType>(
        &mut self,
        dict: &DictionaryArray<K>,
        hashes: &[u64],
        groups: &mut Vec<u32>,
    ) -> Result<(), ArrowError> {
        let values = dict.values();
        let string_at = string_accessor(values.as_ref())?;
        let value_nulls = values.logical_nulls();
        let keys = dict.keys();
        let key_nulls = keys.nulls().filter(|n| n.null_count() > 0);
        let mut cache = std::mem::take(&mut self.dict_cache);
        cache.clear();
        cache.resize(values.len(), u32::MAX);
        for (i, k) in keys.values().iter().enumerate() {
            if key_nulls.is_some_and(|n| n.is_null(i)) {
                groups.push(self.null_group());
                continue;
            }
            let k = k.as_usize();
            let mut g = cache[k];
            if g == u32::MAX {
                g = if value_nulls.as_ref().is_some_and(|n| n.is_null(k)) {
                    self.null_group()
                } else {
                    // The row's hash is the hash of the dictionary value it points at.
                    self.intern_one(string_at(k), hashes[i])
                };
                cache[k] = g;
            }
            groups.push(g);
        }
        self.dict_cache = cache;
        Ok(())
    }
}

/// A by-index accessor to the bytes of a string array.
type StringAt<'a> = Box<dyn Fn(usize) -> &'a [u8] + 'a>;

/// A by-index accessor to the bytes of any string array (used once per distinct dictionary value,
/// not per row).
fn string_accessor<'a>(a: &'a dyn Array) -> Result<StringAt<'a>, ArrowError> {
    Ok(match a.data_type() {
        DataType::Utf8 => {
            let a = a.as_string::<i32>();
            Box::new(move |i| a.value(i).as_bytes())
        }
        DataType::LargeUtf8 => {
            let a = a.as_string::<i64>();
            Box::new(move |i| a.value(i).as_bytes())
        }
        DataType::Utf8View => {
            let a = a.as_string_view();
            Box::new(move |i| a.value(i).as_bytes())
        }
        other => {
            return Err(ArrowError::InvalidArgumentError(format!(
                "expected a string array, got {other}"
            )));
        }
    })
}

impl GroupValues for BytesGroupValues {
    fn intern(
        &mut self,
        cols: &[ArrayRef],
        hashes: &[u64],
        groups: &mut Vec<u32>,
    ) -> Result<(), ArrowError> {
        let n = check_len(cols, hashes, 1)?;
        groups.clear();
        groups.reserve(n);
        let col = &cols[0];
        match col.data_type() {
            DataType::Utf8 => {
                let a = col.as_string::<i32>();
                self.intern_strings(n, a.nulls(), |i| a.value(i).as_bytes(), hashes, groups);
            }
            DataType::LargeUtf8 => {
                let a = col.as_string::<i64>();
                self.intern_strings(n, a.nulls(), |i| a.value(i).as_bytes(), hashes, groups);
            }
            DataType::Utf8View => {
                let a = col.as_string_view();
                self.intern_strings(n, a.nulls(), |i| a.value(i).as_bytes(), hashes, groups);
            }
            DataType::Dictionary(k, _) => {
                macro_rules! dict {
                    ($t:ty) => {
                        self.intern_dictionary(col.as_dictionary::<$t>(), hashes, groups)?
                    };
                }
                match k.as_ref() {
                    DataType::Int8 => dict!(Int8Type),
                    DataType::Int16 => dict!(Int16Type),
                    DataType::Int32 => dict!(Int32Type),
                    DataType::Int64 => dict!(Int64Type),
                    DataType::UInt8 => dict!(UInt8Type),
                    DataType::UInt16 => dict!(UInt16Type),
                    DataType::UInt32 => dict!(UInt32Type),
                    DataType::UInt64 => dict!(UInt64Type),
                    other => {
                        return Err(ArrowError::InvalidArgumentError(format!(
                            "unexpected dictionary key type {other}"
                        )));
                    }
                }
            }
            other => {
                return Err(ArrowError::InvalidArgumentError(format!(
                    "unexpected key type {other}"
                )));
            }
        }
        Ok(())
    }

    fn len(&self) -> usize {
        self.hashes.len()
    }

    fn size(&self) -> usize {
        self.map.capacity() * (std::mem::size_of::<u32>() + 1)
            + self.bytes.capacity()
            + self.offsets.capacity() * std::mem::size_of::<usize>()
            + self.hashes.capacity() * 8
            + self.dict_cache.capacity() * 4
    }

    fn clear(&mut self) {
        self.map.clear();
        self.bytes.clear();
        self.offsets.clear();
        self.offsets.push(0);
        self.hashes.clear();
        self.null_group = None;
    }

    fn hashes(&self) -> &[u64] {
        &self.hashes
    }

    fn keys(&self, groups: &[u32]) -> Result<Vec<ArrayRef>, ArrowError> {
        let mut offsets = Vec::with_capacity(groups.len() + 1);
        offsets.push(0i32);
        let mut data = Vec::new();
        let mut valid = BooleanBufferBuilder::new(groups.len());
        for &g in groups {
            let gi = g as usize;
            if gi + 1 >= self.offsets.len() {
                return Err(out_of_range(g));
            }
            data.extend_from_slice(&self.bytes[self.offsets[gi]..self.offsets[gi + 1]]);
            let len = i32::try_from(data.len()).map_err(|_| {
                ArrowError::ComputeError("key bytes exceed the Utf8 offset range".into())
            })?;
            offsets.push(len);
            valid.append(Some(g) != self.null_group);
        }
        let nulls = self.null_group.map(|_| NullBuffer::new(valid.finish()));
        // The bytes came from valid UTF-8 strings.
        let arr = StringArray::try_new(
            OffsetBuffer::new(ScalarBuffer::from(offsets)),
            data.into(),
            nulls,
        )?;
        let arr: ArrayRef = Arc::new(arr);
        let out = if &self.data_type == arr.data_type() {
            arr
        } else {
            arrow_cast::cast(&arr, &self.data_type)?
        };
        Ok(vec![out])
    }
}

/// Any key columns, encoded with arrow-row into comparable byte rows.
pub struct RowGroupValues {
    types: Vec<DataType>,
    converter: RowConverter,
    map: HashTable<u32>,
    rows: Rows,
    hashes: Vec<u64>,
}

impl std::fmt::Debug for RowGroupValues {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RowGroupValues")
            .field("groups", &self.hashes.len())
            .finish()
    }
}

impl RowGroupValues {
    /// An empty table for keys of the given types.
    ///
    /// # Errors
    /// When arrow-row cannot encode one of the types.
    pub fn try_new(types: &[DataType]) -> Result<Self, ArrowError> {
        for dt in types {
            if !key_type_supported(dt) {
                return Err(ArrowError::NotYetImplemented(format!(
                    "a group key of type {dt} is not supported"
                )));
            }
        }
        let converter =
            RowConverter::new(types.iter().map(|t| SortField::new(t.clone())).collect())?;
        let rows = converter.empty_rows(128, 4096);
        Ok(Self {
            types: types.to_vec(),
            converter,
            map: HashTable::with_capacity(128),
            rows,
            hashes: Vec::with_capacity(128),
        })
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

impl GroupValues for RowGroupValues {
    fn intern(
        &mut self,
        cols: &[ArrayRef],
        hashes: &[u64],
        groups: &mut Vec<u32>,
    ) -> Result<(), ArrowError> {
        check_len(cols, hashes, self.types.len())?;
        let batch_rows = self.converter.convert_columns(cols)?;
        groups.clear();
        groups.reserve(hashes.len());
        for (i, &h) in hashes.iter().enumerate() {
            let row = batch_rows.row(i);
            let stored = &self.rows;
            let g = match self.map.find(h, |&g| stored.row(g as usize) == row) {
                Some(&g) => g,
                None => {
                    let g = self.hashes.len() as u32;
                    self.rows.push(row);
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
        self.hashes.len()
    }

    fn size(&self) -> usize {
        self.map.capacity() * (std::mem::size_of::<u32>() + 1)
            + self.rows.size()
            + self.hashes.capacity() * 8
            + self.converter.size()
    }

    fn clear(&mut self) {
        self.map.clear();
        self.rows.clear();
        self.hashes.clear();
    }

    fn hashes(&self) -> &[u64] {
        &self.hashes
    }

    fn keys(&self, groups: &[u32]) -> Result<Vec<ArrayRef>, ArrowError> {
        if let Some(&g) = groups.iter().find(|&&g| g as usize >= self.hashes.len()) {
            return Err(out_of_range(g));
        }
        let cols = self
            .converter
            .convert_rows(groups.iter().map(|&g| self.rows.row(g as usize)))?;
        // arrow-row decodes dictionaries to their value type; give back the declared types.
        cols.into_iter()
            .zip(&self.types)
            .map(|(c, t)| {
                if c.data_type() == t {
                    Ok(c)
                } else {
                    arrow_cast::cast(&c, t)
                }
            })
            .collect()
    }
}
