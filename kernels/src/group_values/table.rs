//! What every key table is: the [`GroupValues`] trait, the key types a table takes, and the
//! steps all tables share (checking their input, finding or inserting a key).

use arrow_array::ArrayRef;
use arrow_schema::{ArrowError, DataType};
use hashbrown::HashTable;

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

    /// Whether [`GroupValues::intern`] may be given no row hashes (an empty slice): the table
    /// then hashes each new group's key itself, as [`crate::hash::hash_columns`] would, and the
    /// caller saves hashing every row.
    fn hashes_keys_itself(&self) -> bool {
        false
    }

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

/// Whether `a` and `b` are the same array: the same `Arc`, or the same rows of the same
/// buffers (slices of one array at one offset, as an Expand's sets cut chunk by chunk are), so
/// that their rows' group ids are the same.
pub fn same_array(a: &ArrayRef, b: &ArrayRef) -> bool {
    std::sync::Arc::ptr_eq(a, b) || (a.len() == b.len() && a.to_data().ptr_eq(&b.to_data()))
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

pub(crate) fn check_len(
    cols: &[ArrayRef],
    hashes: &[u64],
    want_cols: usize,
) -> Result<usize, ArrowError> {
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

pub(crate) fn out_of_range(g: u32) -> ArrowError {
    ArrowError::InvalidArgumentError(format!("group id {g} out of range"))
}

/// The error of [`GroupValues::keys`] for the first of `groups` that is not below `len`, the
/// table's group count.
pub(crate) fn check_ids(groups: &[u32], len: usize) -> Result<(), ArrowError> {
    match groups.iter().find(|&&g| g as usize >= len) {
        Some(&g) => Err(out_of_range(g)),
        None => Ok(()),
    }
}

/// The group of a key whose hash is `h`: the one `eq` recognizes in `keys` among the groups of
/// that hash, or a new group (numbered by `hashes`, whose entry it appends) whose key `store`
/// adds to `keys`. The find-or-insert step of every key table.
#[inline(always)]
pub(crate) fn find_or_insert<K>(
    map: &mut HashTable<u32>,
    hashes: &mut Vec<u64>,
    h: u64,
    keys: &mut K,
    eq: impl Fn(&K, u32) -> bool,
    store: impl FnOnce(&mut K),
) -> u32 {
    if let Some(&g) = map.find(h, |&g| eq(keys, g)) {
        return g;
    }
    let g = hashes.len() as u32;
    store(keys);
    hashes.push(h);
    map.insert_unique(h, g, |&g| hashes[g as usize]);
    g
}

/// The bytes of a table's index: its hash table of group ids and each group's hash.
pub(crate) fn index_size(map: &HashTable<u32>, hashes: &Vec<u64>) -> usize {
    map.capacity() * (std::mem::size_of::<u32>() + 1) + hashes.capacity() * 8
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{Array, Int64Array};
    use std::sync::Arc;

    /// Slices of one array at one offset are the same array; another offset, length or array
    /// (even of equal values) is not.
    #[test]
    fn same_array_is_the_same_rows_of_the_same_buffers() {
        let a: ArrayRef = Arc::new(Int64Array::from_iter_values(0..100));
        let twin: ArrayRef = Arc::new(Int64Array::from_iter_values(0..100));
        assert!(same_array(&a, &a));
        assert!(same_array(&a.slice(10, 20), &a.slice(10, 20)));
        assert!(!same_array(&a.slice(10, 20), &a.slice(11, 20)));
        assert!(!same_array(&a.slice(10, 20), &a.slice(10, 21)));
        assert!(!same_array(&a, &twin));
        assert_eq!(a.len(), twin.len());
    }
}
