//! Interning one string key column: every key's bytes in one buffer, no allocation per group.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, StringArray};
use arrow_buffer::{ArrowNativeType, BooleanBuffer, NullBuffer, OffsetBuffer, ScalarBuffer};
use arrow_schema::{ArrowError, DataType};
use hashbrown::HashTable;

use super::table::{GroupValues, check_len, find_or_insert, index_size, out_of_range};

mod dictionary;

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
        // The offsets first (which sizes the bytes, copied once into a buffer of their size),
        // then the bytes a run of consecutive groups at a time: one copy per run, as a flush
        // of a kept key table lists most of its groups in order.
        let mut offsets = Vec::with_capacity(groups.len() + 1);
        offsets.push(0i32);
        let mut total = 0usize;
        for &g in groups {
            let gi = g as usize;
            if gi + 1 >= self.offsets.len() {
                return Err(out_of_range(g));
            }
            total += self.offsets[gi + 1] - self.offsets[gi];
            // Checked below: a total past the Utf8 offset range is an error.
            offsets.push(total as i32);
        }
        if i32::try_from(total).is_err() {
            return Err(ArrowError::ComputeError(
                "key bytes exceed the Utf8 offset range".into(),
            ));
        }
        let mut data = Vec::with_capacity(total);
        let mut from = 0;
        while from < groups.len() {
            let first = groups[from] as usize;
            let mut to = from + 1;
            while to < groups.len() && groups[to] as usize == first + (to - from) {
                to += 1;
            }
            // In range: every group was checked above.
            data.extend_from_slice(
                &self.bytes[self.offsets[first]..self.offsets[first + to - from]],
            );
            from = to;
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
