//! Vectorized hashing of group-key columns.
//!
//! Every row's key is hashed exactly once, into one `u64`, by [`hash_columns`]. The same hash
//! serves the group table ([`crate::group_values`]) and, in the parallel engine, the choice of
//! worker: the partitioner takes its bits from the high end ([`partition_of`]) while hashbrown
//! takes the bucket from the low end and its tag from the top seven bits, so the two stay
//! independent enough for a worker's table to spread its keys.
//!
//! Hashes are deterministic across runs and processes (fixed seeds), which keeps partitioning,
//! and therefore replays, reproducible.

use std::hash::{BuildHasher, Hash};

use ahash::RandomState;
use arrow_array::cast::AsArray;
use arrow_array::types::*;
use arrow_array::{Array, ArrayRef, ArrowPrimitiveType, DictionaryArray, PrimitiveArray};
use arrow_buffer::ArrowNativeType;
use arrow_schema::{ArrowError, DataType, TimeUnit};

/// The fixed hasher every key hash is built with.
pub fn random_state() -> RandomState {
    RandomState::with_seeds(
        0x243f_6a88_85a3_08d3,
        0x1319_8a2e_0370_7344,
        0xa409_3822_299f_31d0,
        0x082e_fa98_ec4e_6c89,
    )
}

/// The hash given to a NULL key value.
pub const NULL_HASH: u64 = 0x9e37_79b9_7f4a_7c15;

/// A native value that can be a key: hashed and compared by its bit pattern.
///
/// Floats are compared by their bits, as arrow-row does: `-0.0` and `0.0` are different keys, and
/// NaNs with different payloads are different keys. That keeps every interning path (the
/// single-column fast paths and the arrow-row path) in agreement on what one group is.
pub trait KeyNative: Copy + Send + Sync + 'static {
    /// Hashes the value.
    fn key_hash(self, rs: &RandomState) -> u64;
    /// Bit equality.
    fn key_eq(self, other: Self) -> bool;
}

macro_rules! key_native_int {
    ($($t:ty),*) => {$(
        impl KeyNative for $t {
            #[inline(always)]
            fn key_hash(self, rs: &RandomState) -> u64 { rs.hash_one(self) }
            #[inline(always)]
            fn key_eq(self, other: Self) -> bool { self == other }
        }
    )*};
}
key_native_int!(
    i8,
    i16,
    i32,
    i64,
    u8,
    u16,
    u32,
    u64,
    i128,
    arrow_buffer::i256
);

impl KeyNative for f32 {
    #[inline(always)]
    fn key_hash(self, rs: &RandomState) -> u64 {
        rs.hash_one(self.to_bits())
    }
    #[inline(always)]
    fn key_eq(self, other: Self) -> bool {
        self.to_bits() == other.to_bits()
    }
}

impl KeyNative for f64 {
    #[inline(always)]
    fn key_hash(self, rs: &RandomState) -> u64 {
        rs.hash_one(self.to_bits())
    }
    #[inline(always)]
    fn key_eq(self, other: Self) -> bool {
        self.to_bits() == other.to_bits()
    }
}

/// Folds one column's hash into the running hash of a row.
#[inline(always)]
pub fn combine_hashes(acc: u64, col: u64) -> u64 {
    // A multiply-xorshift mix: order-sensitive, cheap, and well spread in every bit.
    let x = (acc ^ col.rotate_left(29)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    x ^ (x >> 32)
}

/// Picks a partition in `0..n` from a row hash, using the hash's high bits
/// (a multiply-shift range reduction, so no modulo and no bias towards low bits).
#[inline(always)]
pub fn partition_of(hash: u64, n: usize) -> usize {
    ((u128::from(hash.rotate_left(17)) * n as u128) >> 64) as usize
}

/// Hashes the rows of `cols` into `out` (cleared first): one `u64` per row.
///
/// With no columns every row hashes to the same value (a global aggregate).
///
/// # Errors
/// When a column's type cannot be a group key, or the columns differ in length.
pub fn hash_columns(cols: &[ArrayRef], out: &mut Vec<u64>) -> Result<(), ArrowError> {
    let rs = random_state();
    out.clear();
    let Some(first) = cols.first() else {
        return Ok(());
    };
    let n = first.len();
    if cols.iter().any(|c| c.len() != n) {
        return Err(ArrowError::InvalidArgumentError(
            "key columns differ in length".to_string(),
        ));
    }
    // The first column's hashes are written as they come (no zero-filling first), the others
    // folded into them.
    out.reserve(n);
    hash_array(first.as_ref(), &rs, HashOut::Write(out))?;
    for col in &cols[1..] {
        hash_array(col.as_ref(), &rs, HashOut::Fold(out))?;
    }
    Ok(())
}

/// [`hash_columns`] of `first` then `rest`, where `first`'s hashes are already known
/// (`first_hashes`, one per row, as [`hash_columns`] gives them for `first` alone): they are
/// copied, and `rest` folded into them. The result equals `hash_columns` of all the columns.
///
/// # Errors
/// As [`hash_columns`].
pub fn hash_columns_after(
    first_hashes: &[u64],
    rest: &[ArrayRef],
    out: &mut Vec<u64>,
) -> Result<(), ArrowError> {
    let n = first_hashes.len();
    if rest.iter().any(|c| c.len() != n) {
        return Err(ArrowError::InvalidArgumentError(
            "key columns differ in length".to_string(),
        ));
    }
    let rs = random_state();
    out.clear();
    out.extend_from_slice(first_hashes);
    for col in rest {
        hash_array(col.as_ref(), &rs, HashOut::Fold(out))?;
    }
    Ok(())
}

/// Where [`hash_array`] puts an array's hashes.
#[derive(Debug)]
pub enum HashOut<'a> {
    /// Appended to this vector, one per row (the first key column).
    Write(&'a mut Vec<u64>),
    /// Folded into these hashes, one per row (each further key column).
    Fold(&'a mut [u64]),
}

/// The split-distinct bucket of every row of `array`: `MOD(hash(x), buckets)` in `0..buckets`,
/// NULL for a NULL value (which so lands in the NULL bucket). Equal values always share a bucket;
/// the hash is the one group keys use, its high bits spread by a multiply so that the bucket does
/// not follow the exchange's partition choice.
///
/// # Errors
/// When the type cannot be hashed (not a group-key type), or `buckets` is 0.
pub fn bucket_array(
    array: &ArrayRef,
    buckets: u32,
) -> Result<PrimitiveArray<Int32Type>, ArrowError> {
    if buckets == 0 {
        return Err(ArrowError::InvalidArgumentError(
            "the number of buckets must be positive".to_string(),
        ));
    }
    let n = u64::from(buckets);
    let values = match array.data_type() {
        // The common arguments hashed and bucketed in one pass (the value under a NULL is
        // bucketed too: it is never read).
        DataType::Int64 => bucket_natives(
            array.as_primitive::<Int64Type>().values().iter().copied(),
            buckets,
        )?,
        DataType::Int32 => bucket_natives(
            array.as_primitive::<Int32Type>().values().iter().copied(),
            buckets,
        )?,
        _ => {
            let mut hashes = Vec::new();
            hash_columns(std::slice::from_ref(array), &mut hashes)?;
            bucket_hashes(hashes.into_iter(), n)
        }
    };
    Ok(PrimitiveArray::new(values.into(), array.logical_nulls()))
}

/// The bucket of each of `values` (none NULL), as [`bucket_array`] gives it for an array of
/// them, without the array: for values held in another form (a DISTINCT table's entries, kept
/// as bits).
///
/// # Errors
/// When `buckets` is 0.
pub fn bucket_natives<T: KeyNative>(
    values: impl Iterator<Item = T>,
    buckets: u32,
) -> Result<Vec<i32>, ArrowError> {
    if buckets == 0 {
        return Err(ArrowError::InvalidArgumentError(
            "the number of buckets must be positive".to_string(),
        ));
    }
    let rs = random_state();
    Ok(bucket_hashes(
        values.map(|v| v.key_hash(&rs)),
        u64::from(buckets),
    ))
}

/// The bucket of each hash in `0..buckets`: its high bits spread by a multiply, then the
/// remainder.
#[inline(always)]
fn bucket_hashes(hashes: impl Iterator<Item = u64>, buckets: u64) -> Vec<i32> {
    let spread = |h: u64| h.wrapping_mul(0x2545_f491_4f6c_dd1d);
    if buckets.is_power_of_two() {
        // The same buckets as `%`, without a 64-bit division per row (Flink's default of 1024
        // buckets is a power of two).
        let mask = buckets - 1;
        hashes.map(|h| (spread(h) & mask) as i32).collect()
    } else {
        hashes.map(|h| (spread(h) % buckets) as i32).collect()
    }
}

/// Hashes one array into `out`: appended to a vector, or folded into hashes already there.
pub fn hash_array(array: &dyn Array, rs: &RandomState, out: HashOut<'_>) -> Result<(), ArrowError> {
    let n = array.len();
    if let HashOut::Fold(s) = &out
        && s.len() != n
    {
        return Err(ArrowError::InvalidArgumentError(
            "key columns differ in length".to_string(),
        ));
    }
    macro_rules! prim {
        ($t:ty) => {
            hash_primitive::<$t>(array.as_primitive::<$t>(), rs, out)
        };
    }
    match array.data_type() {
        DataType::Int8 => prim!(Int8Type),
        DataType::Int16 => prim!(Int16Type),
        DataType::Int32 => prim!(Int32Type),
        DataType::Int64 => prim!(Int64Type),
        DataType::UInt8 => prim!(UInt8Type),
        DataType::UInt16 => prim!(UInt16Type),
        DataType::UInt32 => prim!(UInt32Type),
        DataType::UInt64 => prim!(UInt64Type),
        DataType::Float32 => prim!(Float32Type),
        DataType::Float64 => prim!(Float64Type),
        DataType::Decimal128(_, _) => prim!(Decimal128Type),
        DataType::Decimal256(_, _) => prim!(Decimal256Type),
        DataType::Date32 => prim!(Date32Type),
        DataType::Date64 => prim!(Date64Type),
        DataType::Time32(TimeUnit::Second) => prim!(Time32SecondType),
        DataType::Time32(TimeUnit::Millisecond) => prim!(Time32MillisecondType),
        DataType::Time64(TimeUnit::Microsecond) => prim!(Time64MicrosecondType),
        DataType::Time64(TimeUnit::Nanosecond) => prim!(Time64NanosecondType),
        DataType::Timestamp(TimeUnit::Second, _) => prim!(TimestampSecondType),
        DataType::Timestamp(TimeUnit::Millisecond, _) => prim!(TimestampMillisecondType),
        DataType::Timestamp(TimeUnit::Microsecond, _) => prim!(TimestampMicrosecondType),
        DataType::Timestamp(TimeUnit::Nanosecond, _) => prim!(TimestampNanosecondType),
        DataType::Boolean => {
            let a = array.as_boolean();
            let t = rs.hash_one(true);
            let f = rs.hash_one(false);
            write_hashes(out, n, a.nulls(), |i| if a.value(i) { t } else { f });
            Ok(())
        }
        DataType::Utf8 => {
            let a = array.as_string::<i32>();
            write_hashes(out, n, a.nulls(), |i| hash_bytes(rs, a.value(i).as_bytes()));
            Ok(())
        }
        DataType::LargeUtf8 => {
            let a = array.as_string::<i64>();
            write_hashes(out, n, a.nulls(), |i| hash_bytes(rs, a.value(i).as_bytes()));
            Ok(())
        }
        DataType::Utf8View => {
            let a = array.as_string_view();
            write_hashes(out, n, a.nulls(), |i| hash_bytes(rs, a.value(i).as_bytes()));
            Ok(())
        }
        DataType::Dictionary(k, _) => match k.as_ref() {
            DataType::Int8 => hash_dictionary(array.as_dictionary::<Int8Type>(), rs, out),
            DataType::Int16 => hash_dictionary(array.as_dictionary::<Int16Type>(), rs, out),
            DataType::Int32 => hash_dictionary(array.as_dictionary::<Int32Type>(), rs, out),
            DataType::Int64 => hash_dictionary(array.as_dictionary::<Int64Type>(), rs, out),
            DataType::UInt8 => hash_dictionary(array.as_dictionary::<UInt8Type>(), rs, out),
            DataType::UInt16 => hash_dictionary(array.as_dictionary::<UInt16Type>(), rs, out),
            DataType::UInt32 => hash_dictionary(array.as_dictionary::<UInt32Type>(), rs, out),
            DataType::UInt64 => hash_dictionary(array.as_dictionary::<UInt64Type>(), rs, out),
            other => Err(unsupported_key(other)),
        },
        other => Err(unsupported_key(other)),
    }
}

fn unsupported_key(dt: &DataType) -> ArrowError {
    ArrowError::NotYetImplemented(format!("a group key of type {dt} is not supported"))
}

/// Hashes a byte string (the hash of a string key).
#[inline(always)]
pub fn hash_bytes(rs: &RandomState, bytes: &[u8]) -> u64 {
    let mut h = rs.build_hasher();
    bytes.hash(&mut h);
    std::hash::Hasher::finish(&h)
}

#[inline(always)]
fn write_hashes(
    out: HashOut<'_>,
    n: usize,
    nulls: Option<&arrow_buffer::NullBuffer>,
    f: impl Fn(usize) -> u64,
) {
    match (out, nulls.filter(|n| n.null_count() > 0)) {
        (HashOut::Write(v), None) => v.extend((0..n).map(f)),
        (HashOut::Write(v), Some(nulls)) => {
            v.extend((0..n).map(|i| if nulls.is_valid(i) { f(i) } else { NULL_HASH }))
        }
        (HashOut::Fold(s), None) => s
            .iter_mut()
            .enumerate()
            .for_each(|(i, h)| *h = combine_hashes(*h, f(i))),
        (HashOut::Fold(s), Some(nulls)) => s.iter_mut().enumerate().for_each(|(i, h)| {
            let v = if nulls.is_valid(i) { f(i) } else { NULL_HASH };
            *h = combine_hashes(*h, v);
        }),
    }
}

fn hash_primitive<T>(
    a: &PrimitiveArray<T>,
    rs: &RandomState,
    out: HashOut<'_>,
) -> Result<(), ArrowError>
where
    T: ArrowPrimitiveType,
    T::Native: KeyNative,
{
    let values = a.values();
    write_hashes(out, a.len(), a.nulls(), |i| values[i].key_hash(rs));
    Ok(())
}

fn hash_dictionary<K: ArrowDictionaryKeyType>(
    a: &DictionaryArray<K>,
    rs: &RandomState,
    out: HashOut<'_>,
) -> Result<(), ArrowError> {
    let values = a.values();
    if values.len() > a.len() {
        // More values than rows (a batch's share of a large dictionary): hash the rows' values.
        let flat = arrow_select::take::take(values.as_ref(), a.keys(), None)?;
        return hash_array(flat.as_ref(), rs, out);
    }
    // Hash each dictionary value once, then gather per row.
    let mut value_hashes = Vec::with_capacity(values.len());
    hash_array(values.as_ref(), rs, HashOut::Write(&mut value_hashes))?;
    let keys = a.keys();
    let key_values = keys.values();
    // A row is NULL when its key is NULL or the value it points at is NULL; the value hashes
    // already carry NULL_HASH for the latter.
    write_hashes(out, a.len(), keys.nulls(), |i| {
        value_hashes[key_values[i].as_usize()]
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{Int32Array, Int64Array};

    use super::*;

    /// The one-pass buckets of Int64 and Int32 values are the buckets of their key hashes, as
    /// every other type's are (a checkpoint of a split run keeps them), for a power of two of
    /// buckets and another; a NULL stays NULL.
    #[test]
    fn one_pass_buckets_are_the_key_hashes_buckets() {
        let mut rng = crate::test_rng::XorShift(0x9e37_79b9_7f4a_7c15);
        let raw: Vec<u64> = (0..2_000).map(|_| rng.next()).collect();
        let valid = |i: usize| !raw[i].is_multiple_of(7);
        let int64: ArrayRef = Arc::new(Int64Array::from_iter(
            (0..raw.len()).map(|i| valid(i).then_some(raw[i] as i64 % 50_000)),
        ));
        let int32: ArrayRef = Arc::new(Int32Array::from_iter(
            (0..raw.len()).map(|i| valid(i).then_some((raw[i] >> 7) as i32)),
        ));
        for array in [int64, int32] {
            let mut hashes = vec![];
            hash_columns(std::slice::from_ref(&array), &mut hashes).unwrap();
            for buckets in [1024u32, 1000] {
                let want = bucket_hashes(hashes.iter().copied(), u64::from(buckets));
                let got = bucket_array(&array, buckets).unwrap();
                for (i, &w) in want.iter().enumerate() {
                    assert_eq!(got.is_valid(i), valid(i), "row {i}");
                    if valid(i) {
                        assert_eq!(got.value(i), w, "row {i} of {buckets} buckets");
                    }
                }
            }
        }
    }
}
