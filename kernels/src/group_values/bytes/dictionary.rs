//! Interning a dictionary column of strings: by a cache of each value's group, kept while
//! batches share the dictionary, or row by row when the dictionary is far larger than the batch.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::*;
use arrow_array::{Array, ArrayRef, DictionaryArray};
use arrow_buffer::ArrowNativeType;
use arrow_schema::{ArrowError, DataType};

use super::BytesGroupValues;
use crate::group_values::same_array;

/// The most values of a dictionary with more values than the batch has rows that a cache is
/// made over (4 bytes each, kept for the dictionary's later batches, emptied at a clear); a
/// larger one's rows are interned one by one.
const MAX_CACHED_VALUES: usize = 1 << 16;

impl BytesGroupValues {
    /// [`Self::intern_dictionary`] of a dictionary column of any key type.
    pub(super) fn intern_dictionary_any(
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
            .is_some_and(|held| same_array(held, values));
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
