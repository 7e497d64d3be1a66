//! Interning one string key column: every key's bytes in one buffer, no allocation per group.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::*;
use arrow_array::{Array, ArrayRef, DictionaryArray, StringArray};
use arrow_buffer::{ArrowNativeType, BooleanBuffer, NullBuffer, OffsetBuffer, ScalarBuffer};
use arrow_schema::{ArrowError, DataType};
use hashbrown::HashTable;

use super::table::{GroupValues, check_len, find_or_insert, index_size, out_of_range};

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
    /// Dictionary value index → group id, for the values of `dict_values`.
    dict_cache: Vec<u32>,
    /// The dictionary values `dict_cache` is over (held, so that their buffers cannot be
    /// another dictionary's later): batches of one Parquet column chunk share them, and the
    /// cache is kept from batch to batch until another dictionary comes; a clear empties it
    /// (a local phase clears its table at every flush), and its memory is kept.
    dict_values: Option<ArrayRef>,
    /// Whether the table was cleared since `dict_cache` last took a group: its entries are
    /// then emptied before it is read.
    dict_cache_stale: bool,
}

/// The most values of a dictionary with more values than the batch has rows that a cache is
/// made over (4 bytes each, kept for the dictionary's later batches, emptied at a clear); a
/// larger one's rows are interned one by one.
const MAX_CACHED_VALUES: usize = 1 << 16;

/// Whether `offsets` (a block of [`RUN_BLOCK`]) are `from + len`, `from + 2 len`, and so on:
/// rows of `len` bytes each, one after the other. Every offset is compared (no early exit), so
/// that the loop vectorizes.
fn steps_of<O: ArrowNativeType>(offsets: &[O], from: usize, len: usize) -> bool {
    let Ok(block) = <&[O; RUN_BLOCK]>::try_from(offsets) else {
        return false;
    };
    (0..RUN_BLOCK).fold(true, |ok, k| {
        ok & (block[k].as_usize() == from + (k + 1) * len)
    })
}

/// Rows a run of one string value goes on row by row before it is followed by blocks.
const LONG_RUN: usize = 16;
/// Rows of a long run compared at once.
const RUN_BLOCK: usize = 64;

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
            dict_values: None,
            dict_cache_stale: false,
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
        let null_group = self.null_group;
        let mut keys = (&mut self.bytes, &mut self.offsets);
        find_or_insert(
            &mut self.map,
            &mut self.hashes,
            h,
            &mut keys,
            |(bytes, offsets), g| {
                let g = g as usize;
                same_bytes(&bytes[offsets[g]..offsets[g + 1]], v) && Some(g as u32) != null_group
            },
            |(bytes, offsets)| {
                bytes.extend_from_slice(v);
                offsets.push(bytes.len());
            },
        )
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
        // A row with the hash and bytes of the last non-NULL row takes its group without a
        // probe: runs of one key (a hot key, a time-ordered day) cost a comparison.
        let mut last: Option<(u64, &[u8], u32)> = None;
        for (i, &h) in hashes.iter().enumerate().take(len) {
            let g = if nulls.is_some_and(|n| n.is_null(i)) {
                self.null_group()
            } else {
                let v = value(i);
                match last {
                    Some((lh, lv, g)) if lh == h && same_bytes(lv, v) => g,
                    _ => {
                        let g = self.intern_one(v, h);
                        last = Some((h, v, g));
                        g
                    }
                }
            };
            groups.push(g);
        }
    }

    /// Interns a column of plain strings without hashes from the caller: a row equal to the
    /// row before it takes its group, and only the others are hashed (with the key hash, so
    /// that the groups are those [`GroupValues::intern`] gives) and looked up. For a column
    /// that is part of a larger key, whose row hashes cover the other columns too; sorted or
    /// time-derived strings (a day) then cost a comparison per row. Returns `false` (and does
    /// nothing) for a column that is not plain strings (a dictionary).
    pub(super) fn intern_runs(
        &mut self,
        col: &ArrayRef,
        groups: &mut Vec<u32>,
    ) -> Result<bool, ArrowError> {
        match col.data_type() {
            DataType::Utf8 if col.null_count() == 0 => {
                let a = col.as_string::<i32>();
                self.intern_offsets_by_runs(a.value_offsets(), a.value_data(), groups);
            }
            DataType::LargeUtf8 if col.null_count() == 0 => {
                let a = col.as_string::<i64>();
                self.intern_offsets_by_runs(a.value_offsets(), a.value_data(), groups);
            }
            DataType::Utf8 => {
                let a = col.as_string::<i32>();
                self.intern_by_runs(a.len(), a.nulls(), |i| a.value(i).as_bytes(), groups);
            }
            DataType::LargeUtf8 => {
                let a = col.as_string::<i64>();
                self.intern_by_runs(a.len(), a.nulls(), |i| a.value(i).as_bytes(), groups);
            }
            DataType::Utf8View => {
                let a = col.as_string_view();
                self.intern_by_runs(a.len(), a.nulls(), |i| a.value(i).as_bytes(), groups);
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// [`Self::intern_by_runs`] of strings without NULLs, read straight from their offsets, a
    /// run at a time: a row continues the run when it ends one run value's length after the
    /// previous row and its bytes are the value's; the run's rows then take its group at once.
    fn intern_offsets_by_runs<O: ArrowNativeType>(
        &mut self,
        offsets: &[O],
        data: &[u8],
        groups: &mut Vec<u32>,
    ) {
        let rs = crate::hash::random_state();
        let n = offsets.len().saturating_sub(1);
        groups.clear();
        groups.reserve(n);
        let at = |i: usize| offsets[i].as_usize();
        let mut last: Option<(&[u8], u32)> = None;
        let mut i = 0;
        while i < n {
            let (start, len) = (at(i), at(i + 1) - at(i));
            let v = &data[start..start + len];
            let g = match last {
                Some((lv, g)) if same_bytes(lv, v) => g,
                _ => self.intern_one(v, crate::hash::hash_bytes(&rs, v)),
            };
            last = Some((v, g));
            // The run goes on while the next row has its length and its bytes: row by row,
            // and once it is long, a block of rows at a time (their offsets a step of `len`
            // apart, their bytes each a repeat of the value before: one comparison of the
            // block's bytes with themselves shifted by one value).
            let mut end = i + 1;
            let mut next = start + len;
            while end < n && at(end + 1) - next == len && same_bytes(&data[next..next + len], v) {
                next += len;
                end += 1;
                if end - i == LONG_RUN {
                    // A long run: blocks of rows while they continue it (then row by row again
                    // to its end).
                    while end + RUN_BLOCK <= n
                        && steps_of(&offsets[end + 1..=end + RUN_BLOCK], next, len)
                        && data[next..next + RUN_BLOCK * len]
                            == data[next - len..next + (RUN_BLOCK - 1) * len]
                    {
                        next += RUN_BLOCK * len;
                        end += RUN_BLOCK;
                    }
                }
            }
            if end == i + 1 {
                groups.push(g);
            } else {
                groups.resize(groups.len() + (end - i), g);
            }
            i = end;
        }
    }

    fn intern_by_runs<'a>(
        &mut self,
        len: usize,
        nulls: Option<&NullBuffer>,
        value: impl Fn(usize) -> &'a [u8],
        groups: &mut Vec<u32>,
    ) {
        let rs = crate::hash::random_state();
        let nulls = nulls.filter(|n| n.null_count() > 0);
        groups.clear();
        groups.reserve(len);
        // The previous row's value (None: NULL) and group.
        let mut last: Option<(Option<&[u8]>, u32)> = None;
        for i in 0..len {
            let v = (!nulls.is_some_and(|n| n.is_null(i))).then(|| value(i));
            let g = match last {
                Some((lv, g)) if same_value(lv, v) => g,
                _ => match v {
                    None => self.null_group(),
                    Some(v) => self.intern_one(v, crate::hash::hash_bytes(&rs, v)),
                },
            };
            last = Some((v, g));
            groups.push(g);
        }
    }

    /// Interns a dictionary column; `hash(row, value)` is the hash of the row's value (the
    /// caller's row hash, or the value hashed here).
    fn intern_dictionary<K: ArrowDictionaryKeyType>(
        &mut self,
        dict: &DictionaryArray<K>,
        hash: impl Fn(usize, &[u8]) -> u64,
        groups: &mut Vec<u32>,
    ) -> Result<(), ArrowError> {
        let values = dict.values();
        let same = self
            .dict_values
            .as_ref()
            .is_some_and(|held| super::table::same_array(held, values));
        if !same && values.len() > dict.len().max(MAX_CACHED_VALUES) {
            // Far more values than rows (a batch's share of a large dictionary): a cache over
            // the values would cost more than it saves; each row's value is interned as it
            // comes.
            return match values.data_type() {
                DataType::Utf8 => {
                    let a = values.as_string::<i32>();
                    self.intern_dictionary_rows(dict, |k| a.value(k).as_bytes(), &hash, groups);
                    Ok(())
                }
                DataType::LargeUtf8 => {
                    let a = values.as_string::<i64>();
                    self.intern_dictionary_rows(dict, |k| a.value(k).as_bytes(), &hash, groups);
                    Ok(())
                }
                DataType::Utf8View => {
                    let a = values.as_string_view();
                    self.intern_dictionary_rows(dict, |k| a.value(k).as_bytes(), &hash, groups);
                    Ok(())
                }
                other => Err(ArrowError::InvalidArgumentError(format!(
                    "expected a dictionary of strings, got values of {other}"
                ))),
            };
        }
        let string_at = string_accessor(values.as_ref())?;
        let value_nulls = values.logical_nulls();
        let keys = dict.keys();
        let key_nulls = keys.nulls().filter(|n| n.null_count() > 0);
        // Each dictionary value's group, found at the first row pointing at it. The cache has a
        // power-of-two length and keys are masked into it: the keys are valid indices of the
        // values, so the mask changes none and the per-row lookup needs no bounds check. The
        // groups of the values met in earlier batches of the same dictionary since the last
        // clear are still there.
        let mut cache = std::mem::take(&mut self.dict_cache);
        let slots = values.len().next_power_of_two();
        let mask = slots - 1;
        let same = same && cache.len() == slots;
        let kept = same && !self.dict_cache_stale;
        if !same {
            cache.clear();
            cache.resize(slots, u32::MAX);
            self.dict_values = Some(Arc::clone(values));
        } else if !kept {
            cache.fill(u32::MAX);
        }
        self.dict_cache_stale = false;
        let kv = keys.values();
        let start = groups.len();
        if kept && key_nulls.is_none() {
            // Every row's value met before (the common case once a dictionary has been seen):
            // a gather, with no branch per row. A key the cache does not hold (or out of its
            // range) reads as a miss, and the pass below interns the batch instead.
            groups.extend(
                kv.iter()
                    .map(|k| cache.get(k.as_usize()).copied().unwrap_or(u32::MAX)),
            );
            let missed = groups[start..]
                .iter()
                .fold(false, |missed, &g| missed | (g == u32::MAX));
            if !missed {
                self.dict_cache = cache;
                return Ok(());
            }
        }
        // Each value's group, interned at the first row that points at it (its hash is the
        // row's, the hash of the value), and the NULL group at the first NULL row, so that
        // groups are numbered in order of first appearance; rows take their group in the same
        // pass.
        groups.resize(start + kv.len(), 0);
        // A value met for the first time: its group, kept in the cache.
        let miss = |this: &mut Self, cache: &mut [u32], i: usize, k: usize| {
            let g = if value_nulls.as_ref().is_some_and(|n| n.is_null(k)) {
                this.null_group()
            } else {
                let v = string_at(k);
                this.intern_one(v, hash(i, v))
            };
            cache[k] = g;
            g
        };
        let out = &mut groups[start..];
        match key_nulls {
            // No NULL keys (the common case): no validity test per row.
            None => {
                for (i, (k, out)) in kv.iter().zip(out).enumerate() {
                    let k = k.as_usize() & mask;
                    let cached = cache[k];
                    *out = if cached != u32::MAX {
                        cached
                    } else {
                        miss(self, &mut cache, i, k)
                    };
                }
            }
            Some(key_nulls) => {
                let mut null = u32::MAX;
                for (i, (k, out)) in kv.iter().zip(out).enumerate() {
                    let k = k.as_usize() & mask;
                    *out = if key_nulls.is_null(i) {
                        if null == u32::MAX {
                            null = self.null_group();
                        }
                        null
                    } else {
                        let cached = cache[k];
                        if cached != u32::MAX {
                            cached
                        } else {
                            miss(self, &mut cache, i, k)
                        }
                    };
                }
            }
        }
        self.dict_cache = cache;
        Ok(())
    }
}

/// Whether two values (None: NULL) are the same: short strings, as keys mostly are (a day, a
/// code), by two overlapping word loads each instead of a call to `memcmp`.
#[inline(always)]
fn same_value(a: Option<&[u8]>, b: Option<&[u8]>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => same_bytes(a, b),
        (None, None) => true,
        _ => false,
    }
}

/// Whether two byte strings are equal (see [`same_value`]).
#[inline(always)]
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    let n = a.len();
    if n != b.len() {
        return false;
    }
    let word = |s: &[u8], at: usize| u64::from_le_bytes(s[at..at + 8].try_into().unwrap_or([0; 8]));
    let half = |s: &[u8], at: usize| u32::from_le_bytes(s[at..at + 4].try_into().unwrap_or([0; 4]));
    match n {
        8..=16 => word(a, 0) == word(b, 0) && word(a, n - 8) == word(b, n - 8),
        4..=7 => half(a, 0) == half(b, 0) && half(a, n - 4) == half(b, n - 4),
        _ => a == b,
    }
}

impl BytesGroupValues {
    /// [`Self::intern_dictionary`] of a dictionary column of any key type.
    fn intern_dictionary_any(
        &mut self,
        col: &ArrayRef,
        hash: impl Fn(usize, &[u8]) -> u64,
        groups: &mut Vec<u32>,
    ) -> Result<(), ArrowError> {
        let DataType::Dictionary(k, _) = col.data_type() else {
            return Err(ArrowError::InvalidArgumentError(format!(
                "unexpected key type {}",
                col.data_type()
            )));
        };
        macro_rules! dict {
            ($t:ty) => {
                self.intern_dictionary(col.as_dictionary::<$t>(), hash, groups)
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
            other => Err(ArrowError::InvalidArgumentError(format!(
                "unexpected dictionary key type {other}"
            ))),
        }
    }

    /// Interns each row of `dict` by the value its key points at (`value(key)`), without a
    /// cache over the dictionary's values.
    fn intern_dictionary_rows<'a, K: ArrowDictionaryKeyType>(
        &mut self,
        dict: &DictionaryArray<K>,
        value: impl Fn(usize) -> &'a [u8],
        hash: impl Fn(usize, &[u8]) -> u64,
        groups: &mut Vec<u32>,
    ) {
        let value_nulls = dict.values().logical_nulls();
        let keys = dict.keys();
        let key_nulls = keys.nulls().filter(|n| n.null_count() > 0);
        for (i, k) in keys.values().iter().enumerate() {
            let k = k.as_usize();
            let null = key_nulls.is_some_and(|n| n.is_null(i))
                || value_nulls.as_ref().is_some_and(|n| n.is_null(k));
            groups.push(if null {
                self.null_group()
            } else {
                let v = value(k);
                self.intern_one(v, hash(i, v))
            });
        }
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
        if hashes.is_empty()
            && let [col] = cols
            && !col.is_empty()
        {
            // No row hashes (`hashes_keys_itself`): plain strings by runs, a dictionary by its
            // values, each hashed here where it is looked up.
            if self.intern_runs(col, groups)? {
                return Ok(());
            }
            groups.clear();
            groups.reserve(col.len());
            let rs = crate::hash::random_state();
            let hash = |_: usize, v: &[u8]| crate::hash::hash_bytes(&rs, v);
            return self.intern_dictionary_any(col, hash, groups);
        }
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
            DataType::Dictionary(_, _) => {
                self.intern_dictionary_any(col, |i, _| hashes[i], groups)?;
            }
            other => {
                return Err(ArrowError::InvalidArgumentError(format!(
                    "unexpected key type {other}"
                )));
            }
        }
        Ok(())
    }

    fn hashes_keys_itself(&self) -> bool {
        true
    }

    fn len(&self) -> usize {
        self.hashes.len()
    }

    fn size(&self) -> usize {
        index_size(&self.map, &self.hashes)
            + self.bytes.capacity()
            + self.offsets.capacity() * std::mem::size_of::<usize>()
            + self.dict_cache.capacity() * 4
    }

    fn clear(&mut self) {
        self.map.clear();
        self.bytes.clear();
        self.offsets.clear();
        self.offsets.push(0);
        self.hashes.clear();
        self.null_group = None;
        self.dict_cache_stale = true;
    }

    fn hashes(&self) -> &[u64] {
        &self.hashes
    }

    fn keys(&self, groups: &[u32]) -> Result<Vec<ArrayRef>, ArrowError> {
        // The bytes are counted first, so that they are copied once into a buffer of their
        // size (growing it as they come copied them again at each doubling).
        let mut total = 0usize;
        for &g in groups {
            let gi = g as usize;
            if gi + 1 >= self.offsets.len() {
                return Err(out_of_range(g));
            }
            total += self.offsets[gi + 1] - self.offsets[gi];
        }
        if i32::try_from(total).is_err() {
            return Err(ArrowError::ComputeError(
                "key bytes exceed the Utf8 offset range".into(),
            ));
        }
        let mut offsets = Vec::with_capacity(groups.len() + 1);
        offsets.push(0i32);
        let mut data = Vec::with_capacity(total);
        for &g in groups {
            let gi = g as usize;
            data.extend_from_slice(&self.bytes[self.offsets[gi]..self.offsets[gi + 1]]);
            // At most `total`, which fits.
            offsets.push(data.len() as i32);
        }
        let nulls = self.null_group.map(|null| {
            NullBuffer::new(BooleanBuffer::collect_bool(groups.len(), |i| {
                groups[i] != null
            }))
        });
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

#[cfg(test)]
mod tests;
