//! Interning several key columns packed into a few 64-bit words: fixed-width values by their
//! bits, strings by the id a per-column string table gives them.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, BooleanArray, PrimitiveArray};
use arrow_buffer::{BooleanBuffer, NullBuffer, ScalarBuffer};
use arrow_schema::{ArrowError, DataType};
use hashbrown::HashTable;

use super::bytes::BytesGroupValues;
use super::table::{GroupValues, check_ids, check_len, index_size};
use crate::bits::with_bits_type;
use crate::hash::{KeyNative, NULL_HASH, combine_hashes};

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
/// the row before (a dictionary's values once each). The table is probed by a hash of the packed
/// words, so it needs no row hashes ([`GroupValues::hashes_keys_itself`]): a new group's key hash
/// (the one [`crate::hash::hash_columns`] gives, for routing and key groups) is made from its
/// packed key, its strings' hashes taken from their tables.
#[derive(Debug)]
pub struct PackedGroupValues<const W: usize> {
    types: Vec<DataType>,
    slots: Vec<Slot>,
    strings: Vec<BytesGroupValues>,
    map: HashTable<u32>,
    keys: Vec<[u64; W]>,
    hashes: Vec<u64>,
    /// Scratch: the batch's packed keys, and one string column's ids.
    packed: Vec<[u64; W]>,
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
            ids: vec![],
        }
    }

    /// Adds the new group of `key`, whose key hash is `h`.
    fn insert(&mut self, key: [u64; W], h: u64) -> u32 {
        let g = self.keys.len() as u32;
        self.keys.push(key);
        self.hashes.push(h);
        let keys = &self.keys;
        self.map
            .insert_unique(probe_hash(&key), g, |&g| probe_hash(&keys[g as usize]));
        g
    }

    /// The hash [`crate::hash::hash_columns`] gives the row whose packed key is `key`: each
    /// column's value hash (a string's from its table, which hashed it when it was interned),
    /// folded in column order.
    fn key_hash(&self, key: &[u64; W], rs: &ahash::RandomState) -> u64 {
        let mut acc: Option<u64> = None;
        for (slot, dt) in self.slots.iter().zip(&self.types) {
            let h = match *slot {
                Slot::Str { at, table } => {
                    let id = (key[at.word] >> at.shift) as u32;
                    self.strings[table].hashes()[id as usize]
                }
                Slot::Fixed { null, .. } if key[null.word] >> null.shift & 1 == 1 => NULL_HASH,
                Slot::Fixed { at, bits, .. } => {
                    let b = (key[at.word] >> at.shift) & field_mask(bits);
                    value_hash(dt, b, rs)
                }
            };
            acc = Some(acc.map_or(h, |a| combine_hashes(a, h)));
        }
        acc.unwrap_or(0)
    }

    /// ORs column `c`'s part of each row's key into `self.packed`.
    fn pack_column(&mut self, c: usize, col: &ArrayRef) -> Result<(), ArrowError> {
        match self.slots[c] {
            Slot::Str { at, table } => {
                // Plain strings by runs (hashing only where the value changes); a dictionary
                // by its values, each hashed where the table looks it up (no row hashes).
                self.strings[table].intern(std::slice::from_ref(col), &[], &mut self.ids)?;
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

/// The hash the table is probed by: the packed words mixed (a multiply per word, then
/// murmur3's finalizer, so that every bit of the result depends on every word).
#[inline(always)]
fn probe_hash<const W: usize>(key: &[u64; W]) -> u64 {
    let mut x = 0x243f_6a88_85a3_08d3u64;
    for &w in key {
        x = (x ^ w).wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(31);
    }
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

/// The hash [`crate::hash::hash_array`] gives a non-NULL value of the fixed-width type `dt`
/// whose bits (as [`with_bits_type`] makes them) are `bits`.
fn value_hash(dt: &DataType, bits: u64, rs: &ahash::RandomState) -> u64 {
    if dt == &DataType::Boolean {
        return rs.hash_one(bits != 0);
    }
    with_bits_type!(
        dt,
        |_T, _to, from| from(bits).key_hash(rs),
        // `layout` packs no other fixed-width type.
        rs.hash_one(bits)
    )
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
        // No row hashes (`hashes_keys_itself`): each new group's key hash is made from its
        // packed key.
        let n = match cols.first() {
            Some(c) if hashes.is_empty() && cols.len() == self.types.len() => {
                if cols.iter().any(|col| col.len() != c.len()) {
                    return Err(ArrowError::InvalidArgumentError(
                        "key columns differ in length".to_string(),
                    ));
                }
                c.len()
            }
            _ => check_len(cols, hashes, self.types.len())?,
        };
        self.packed.clear();
        self.packed.resize(n, [0; W]);
        for (c, col) in cols.iter().enumerate() {
            self.pack_column(c, col)?;
        }
        groups.clear();
        groups.reserve(n);
        let rs = crate::hash::random_state();
        let packed = std::mem::take(&mut self.packed);
        // A row with the key of the row before takes its group without a probe: runs of one
        // key (a hot key, a time-ordered day, split's group set of the keys alone, whose
        // buckets are all NULL) cost a comparison of packed words. Packed words are equal
        // exactly when the keys are. The table is probed by a hash of the packed words, not
        // by the key hash, so that the rows need no key hash.
        let mut last: Option<([u64; W], u32)> = None;
        for (i, &key) in packed.iter().enumerate() {
            let g = match last {
                Some((k, g)) if k == key => g,
                _ => {
                    let keys = &self.keys;
                    match self
                        .map
                        .find(probe_hash(&key), |&g| keys[g as usize] == key)
                    {
                        Some(&g) => g,
                        None => {
                            let h = match hashes.get(i) {
                                Some(&h) => h,
                                None => self.key_hash(&key, &rs),
                            };
                            self.insert(key, h)
                        }
                    }
                }
            };
            last = Some((key, g));
            groups.push(g);
        }
        self.packed = packed;
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
            + self.keys.capacity() * 8 * W
            + self.strings.iter().map(GroupValues::size).sum::<usize>()
            + self.packed.capacity() * 8 * W
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
