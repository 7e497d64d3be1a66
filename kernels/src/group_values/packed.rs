//! Interning several key columns packed into a few 64-bit words: fixed-width values by their
//! bits, strings by the id a per-column string table gives them.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, BooleanArray, PrimitiveArray};
use arrow_buffer::{BooleanBuffer, NullBuffer, ScalarBuffer};
use arrow_schema::{ArrowError, DataType};
use hashbrown::HashTable;

use super::bytes::BytesGroupValues;
use super::table::{GroupValues, check_ids, check_len, find_or_insert, index_size};
use crate::bits::with_bits_type;

/// A bit position in a packed key: a word and the shift inside it.
#[derive(Debug, Clone, Copy)]
struct At {
    word: usize,
    shift: u32,
}

/// How one key column sits in the packed key.
#[derive(Debug, Clone, Copy)]
enum Slot {
    /// A fixed-width value of `bits` bits at `at`, its NULL flag at bit `null`.
    Fixed { at: At, bits: u32, null: At },
    /// A string's id in string table `table` (NULL has an id of its own), 32 bits at `at`.
    Str { at: At, table: usize },
}

/// Places fields of at most 64 bits in 64-bit words, each inside one word (first fit, in
/// order); [`new_packed`] takes layouts of at most four words.
struct Layout {
    used: Vec<u32>,
}

impl Layout {
    fn place(&mut self, bits: u32) -> At {
        let word = match self.used.iter().position(|&u| u + bits <= 64) {
            Some(w) => w,
            None => {
                self.used.push(0);
                self.used.len() - 1
            }
        };
        let shift = self.used[word];
        self.used[word] += bits;
        At { word, shift }
    }
}

/// The words keys of `types` pack into (their slots, string tables and word count), or `None`
/// for a type that cannot be packed.
fn layout(types: &[DataType]) -> Option<(Vec<Slot>, Vec<BytesGroupValues>, usize)> {
    let mut words = Layout { used: vec![] };
    let mut slots = vec![];
    let mut strings = vec![];
    for dt in types {
        if let Some(bits) = fixed_bits(dt) {
            slots.push(Slot::Fixed {
                at: words.place(bits),
                bits,
                null: At { word: 0, shift: 0 },
            });
        } else if is_string(dt) {
            slots.push(Slot::Str {
                at: words.place(32),
                table: strings.len(),
            });
            strings.push(BytesGroupValues::new(dt.clone()));
        } else {
            return None;
        }
    }
    // The NULL flags after every value.
    for slot in &mut slots {
        if let Slot::Fixed { null, .. } = slot {
            *null = words.place(1);
        }
    }
    Some((slots, strings, words.used.len()))
}

/// The width in bits of a fixed-width key type that can be packed, if it is one.
fn fixed_bits(dt: &DataType) -> Option<u32> {
    Some(match dt {
        DataType::Boolean => 1,
        DataType::Int8 | DataType::UInt8 => 8,
        DataType::Int16 | DataType::UInt16 => 16,
        DataType::Int32
        | DataType::UInt32
        | DataType::Float32
        | DataType::Date32
        | DataType::Time32(_) => 32,
        DataType::Int64
        | DataType::UInt64
        | DataType::Float64
        | DataType::Date64
        | DataType::Time64(_)
        | DataType::Timestamp(_, _) => 64,
        _ => return None,
    })
}

fn is_string(dt: &DataType) -> bool {
    match dt {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => true,
        DataType::Dictionary(k, v) => k.is_dictionary_key_type() && is_string(v),
        _ => false,
    }
}

/// Several key columns of fixed-width types (at most 64 bits each) and strings, whose values,
/// string ids and NULL flags fit `W` 64-bit words together: each key is a `[u64; W]`, compared
/// word by word, where arrow-row would encode and compare bytes. A string column's ids come from
/// a [`BytesGroupValues`] of its own, which hashes a row's string only where it differs from
/// the row before (a dictionary's values once each).
#[derive(Debug)]
pub struct PackedGroupValues<const W: usize> {
    types: Vec<DataType>,
    slots: Vec<Slot>,
    strings: Vec<BytesGroupValues>,
    map: HashTable<u32>,
    keys: Vec<[u64; W]>,
    hashes: Vec<u64>,
    /// Scratch: the batch's packed keys, one string column's hashes and ids.
    packed: Vec<[u64; W]>,
    column_hashes: Vec<u64>,
    ids: Vec<u32>,
}

/// A table for keys of `types` packed into the fewest words they fit, 2 or 4, or `None` when
/// they do not fit 4 (a type wider than 64 bits, a decimal, or too many columns).
pub(crate) fn new_packed(types: &[DataType]) -> Option<Box<dyn GroupValues>> {
    let (slots, strings, words) = layout(types)?;
    Some(match words {
        0..=2 => Box::new(PackedGroupValues::<2>::with(types, slots, strings)),
        3 | 4 => Box::new(PackedGroupValues::<4>::with(types, slots, strings)),
        _ => return None,
    })
}

impl<const W: usize> PackedGroupValues<W> {
    fn with(types: &[DataType], slots: Vec<Slot>, strings: Vec<BytesGroupValues>) -> Self {
        Self {
            types: types.to_vec(),
            slots,
            strings,
            map: HashTable::with_capacity(128),
            keys: Vec::with_capacity(128),
            hashes: Vec::with_capacity(128),
            packed: vec![],
            column_hashes: vec![],
            ids: vec![],
        }
    }

    /// ORs column `c`'s part of each row's key into `self.packed`.
    fn pack_column(&mut self, c: usize, col: &ArrayRef) -> Result<(), ArrowError> {
        match self.slots[c] {
            Slot::Str { at, table } => {
                // Plain strings by runs (hashing only where the value changes); a dictionary
                // through its values' hashes, once per value.
                if !self.strings[table].intern_runs(col, &mut self.ids)? {
                    crate::hash::hash_columns(std::slice::from_ref(col), &mut self.column_hashes)?;
                    self.strings[table].intern(
                        std::slice::from_ref(col),
                        &self.column_hashes,
                        &mut self.ids,
                    )?;
                }
                for (p, &id) in self.packed.iter_mut().zip(&self.ids) {
                    p[at.word] |= u64::from(id) << at.shift;
                }
            }
            Slot::Fixed { at, bits, null } => {
                if col.data_type() != &self.types[c] {
                    return Err(ArrowError::InvalidArgumentError(format!(
                        "key column {c} is {}, not {}",
                        col.data_type(),
                        self.types[c]
                    )));
                }
                if let Some(b) = col.as_boolean_opt() {
                    pack_values(&mut self.packed, b.nulls(), at, null, |i| {
                        u64::from(b.value(i))
                    });
                } else {
                    let mask = field_mask(bits);
                    with_bits_type!(
                        col.data_type(),
                        |T, to, _from| {
                            let a = col.as_primitive::<T>();
                            let values = a.values();
                            pack_values(&mut self.packed, a.nulls(), at, null, |i| {
                                to(values[i]) & mask
                            });
                        },
                        return Err(not_packed(col.data_type()))
                    );
                }
            }
        }
        Ok(())
    }

    /// Column `c` of the keys of `groups`.
    fn column(&self, c: usize, groups: &[u32]) -> Result<ArrayRef, ArrowError> {
        match self.slots[c] {
            Slot::Str { at, table } => {
                let ids: Vec<u32> = groups
                    .iter()
                    .map(|&g| (self.keys[g as usize][at.word] >> at.shift) as u32)
                    .collect();
                let mut cols = self.strings[table].keys(&ids)?;
                cols.pop()
                    .ok_or_else(|| ArrowError::InvalidArgumentError("no string keys".into()))
            }
            Slot::Fixed { at, bits, null } => {
                let mask = field_mask(bits);
                let key = |g: u32| &self.keys[g as usize];
                let nulls = NullBuffer::new(BooleanBuffer::collect_bool(groups.len(), |i| {
                    (key(groups[i])[null.word] >> null.shift) & 1 == 0
                }));
                let nulls = (nulls.null_count() > 0).then_some(nulls);
                let bits_of = |i: usize| (key(groups[i])[at.word] >> at.shift) & mask;
                if self.types[c] == DataType::Boolean {
                    let values = BooleanBuffer::collect_bool(groups.len(), |i| bits_of(i) == 1);
                    return Ok(Arc::new(BooleanArray::new(values, nulls)));
                }
                let dt = &self.types[c];
                with_bits_type!(
                    dt,
                    |T, _to, from| {
                        let values: ScalarBuffer<_> =
                            (0..groups.len()).map(|i| from(bits_of(i))).collect();
                        Ok(Arc::new(
                            PrimitiveArray::<T>::new(values, nulls).with_data_type(dt.clone()),
                        ))
                    },
                    Err(not_packed(dt))
                )
            }
        }
    }
}

/// ORs each row's value bits (at `at`) and its NULL flag (bit `null`, set when NULL) into
/// `packed`; a NULL's value bits stay 0, so that all NULLs of a column are one key.
#[inline(always)]
fn pack_values<const W: usize>(
    packed: &mut [[u64; W]],
    nulls: Option<&NullBuffer>,
    at: At,
    null: At,
    value: impl Fn(usize) -> u64,
) {
    match nulls.filter(|n| n.null_count() > 0) {
        None => {
            for (i, p) in packed.iter_mut().enumerate() {
                p[at.word] |= value(i) << at.shift;
            }
        }
        Some(n) => {
            for (i, p) in packed.iter_mut().enumerate() {
                if n.is_valid(i) {
                    p[at.word] |= value(i) << at.shift;
                } else {
                    p[null.word] |= 1 << null.shift;
                }
            }
        }
    }
}

/// The low `bits` bits.
fn field_mask(bits: u32) -> u64 {
    if bits == 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    }
}

fn not_packed(dt: &DataType) -> ArrowError {
    ArrowError::InvalidArgumentError(format!("{dt} is not a packed key type"))
}

impl<const W: usize> GroupValues for PackedGroupValues<W> {
    fn intern(
        &mut self,
        cols: &[ArrayRef],
        hashes: &[u64],
        groups: &mut Vec<u32>,
    ) -> Result<(), ArrowError> {
        let n = check_len(cols, hashes, self.types.len())?;
        self.packed.clear();
        self.packed.resize(n, [0; W]);
        for (c, col) in cols.iter().enumerate() {
            self.pack_column(c, col)?;
        }
        groups.clear();
        groups.reserve(n);
        // A row with the key of the row before takes its group without a probe: runs of one
        // key (a hot key, a time-ordered day, split's group set of the keys alone, whose
        // buckets are all NULL) cost a comparison of packed words. Packed words are equal
        // exactly when the keys are.
        let mut last: Option<([u64; W], u32)> = None;
        for (&key, &h) in self.packed.iter().zip(hashes) {
            let g = match last {
                Some((k, g)) if k == key => g,
                _ => find_or_insert(
                    &mut self.map,
                    &mut self.hashes,
                    h,
                    &mut self.keys,
                    |keys, g| keys[g as usize] == key,
                    |keys| keys.push(key),
                ),
            };
            last = Some((key, g));
            groups.push(g);
        }
        Ok(())
    }

    fn len(&self) -> usize {
        self.hashes.len()
    }

    fn size(&self) -> usize {
        index_size(&self.map, &self.hashes)
            + self.keys.capacity() * 8 * W
            + self.strings.iter().map(GroupValues::size).sum::<usize>()
            + self.packed.capacity() * 8 * W
            + self.column_hashes.capacity() * 8
            + self.ids.capacity() * 4
    }

    fn clear(&mut self) {
        self.map.clear();
        self.keys.clear();
        self.hashes.clear();
        for s in &mut self.strings {
            s.clear();
        }
    }

    fn hashes(&self) -> &[u64] {
        &self.hashes
    }

    fn keys(&self, groups: &[u32]) -> Result<Vec<ArrayRef>, ArrowError> {
        check_ids(groups, self.keys.len())?;
        (0..self.types.len())
            .map(|c| self.column(c, groups))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{Int32Array, Int64Array, StringArray};

    /// A column of another type than the table's is an error, and changes nothing.
    #[test]
    fn columns_of_another_type_are_refused() {
        let types = [DataType::Int32, DataType::Utf8];
        let mut table = new_packed(&types).unwrap();
        let strings: ArrayRef = Arc::new(StringArray::from(vec!["a", "b"]));
        let wrong: Vec<ArrayRef> = vec![Arc::new(Int64Array::from(vec![1, 2])), strings.clone()];
        let right: Vec<ArrayRef> = vec![Arc::new(Int32Array::from(vec![1, 2])), strings];
        let (mut hashes, mut groups) = (vec![], vec![]);
        crate::hash::hash_columns(&wrong, &mut hashes).unwrap();
        let err = table.intern(&wrong, &hashes, &mut groups).unwrap_err();
        assert!(
            err.to_string().contains("key column 0 is Int64, not Int32"),
            "{err}"
        );
        assert!(table.is_empty());
        crate::hash::hash_columns(&right, &mut hashes).unwrap();
        table.intern(&right, &hashes, &mut groups).unwrap();
        assert_eq!(groups, vec![0, 1]);
        // Two 64-bit values and their NULL flags need three words: a four-word table.
        assert!(new_packed(&[DataType::Int64, DataType::Int64]).is_some());
        // Five need six: arrow-row's.
        assert!(new_packed(&vec![DataType::Int64; 5]).is_none());
        assert!(new_packed(&[DataType::Decimal128(10, 2), DataType::Int8]).is_none());
    }
}
