//! The query's own keys in front of a split-distinct PARTIAL's bucket columns: interned once
//! for the group sets of an Expand that share their arrays (or cut them at other rows), a single
//! string by runs; and what
//! the two tables over such keys ([`super::BucketedGroupValues`], [`super::BucketRoutes`])
//! share: their shape's checks and a key's hash.

use arrow_array::cast::AsArray;
use arrow_array::types::Int32Type;
use arrow_array::{Array, ArrayRef, Int32Array};
use arrow_buffer::Buffer;
use arrow_schema::{ArrowError, DataType};

use super::bucketed::MAX_BUCKET_COLUMNS;
use super::bytes::BytesGroupValues;
use super::new_group_values;
use super::table::{GroupValues, same_array};
use crate::hash::{NULL_HASH, combine_hashes};

/// The table of a key's prefix columns, with the ids of the columns interned last.
#[derive(Debug)]
pub(super) struct PrefixKeys {
    table: Prefix,
    columns: usize,
    /// The prefix columns interned last and their ids (the group sets of an Expand share them).
    last: Vec<ArrayRef>,
    ids: Vec<u32>,
    hashes: Vec<u64>,
    /// The ids of a run of rows of the arrays the last columns were cut from.
    cut: Option<Cut>,
}

/// The ids of rows `from..from + ids.len()` of the buffers of some prefix columns: where an
/// Expand's sets go whole, a mini-batch ends in each set's batch at other rows than in the set
/// before it, so the pieces of one batch differ, but their rows are found here.
#[derive(Debug)]
struct Cut {
    /// Per column, its buffers (held, so that no other array takes their addresses).
    buffers: Vec<Vec<Buffer>>,
    from: usize,
    ids: Vec<u32>,
}

/// The most rows a [`Cut`] keeps ids for.
const MAX_CUT_ROWS: usize = 1 << 20;

/// Where the rows of columns `cols` lie: their buffers and their first row among them, for
/// columns without NULLs of a primitive or string type, all starting at the same row.
fn cut_of(cols: &[ArrayRef]) -> Option<(Vec<Vec<Buffer>>, usize)> {
    let mut row = None;
    let mut buffers = Vec::with_capacity(cols.len());
    for col in cols {
        let d = col.to_data();
        if d.nulls().is_some() || !d.child_data().is_empty() {
            return None;
        }
        let width = match d.data_type() {
            DataType::Utf8 => 4,
            DataType::LargeUtf8 => 8,
            dt => dt.primitive_width()?,
        };
        let first = d.buffers().first()?;
        let at = d.offset() + first.ptr_offset() / width;
        if *row.get_or_insert(at) != at {
            return None;
        }
        buffers.push(d.buffers().to_vec());
    }
    Some((buffers, row?))
}

/// Whether two columns' buffers are the same allocations.
fn same_buffers(a: &[Vec<Buffer>], b: &[Vec<Buffer>]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(a, b)| {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.data_ptr() == y.data_ptr())
        })
}

/// The table itself.
#[derive(Debug)]
enum Prefix {
    /// No prefix columns: every row has prefix 0.
    None,
    /// One string column, interned by runs (hashed only where a row differs from the one
    /// before: a day costs a comparison per row).
    Strings(BytesGroupValues),
    /// Any other columns, hashed.
    Keys(Box<dyn GroupValues>),
}

impl PrefixKeys {
    /// A table for prefix columns of `types`.
    ///
    /// # Errors
    /// A type that cannot be a key.
    pub(super) fn try_new(types: &[DataType]) -> Result<Self, ArrowError> {
        Ok(Self {
            table: match types {
                [] => Prefix::None,
                [dt @ (DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View)] => {
                    Prefix::Strings(BytesGroupValues::new(dt.clone()))
                }
                _ => Prefix::Keys(new_group_values(types)?),
            },
            columns: types.len(),
            last: vec![],
            ids: vec![],
            hashes: vec![],
            cut: None,
        })
    }

    /// How many prefix columns a key has.
    pub(super) fn columns(&self) -> usize {
        self.columns
    }

    fn table(&self) -> Option<&dyn GroupValues> {
        match &self.table {
            Prefix::None => None,
            Prefix::Strings(t) => Some(t),
            Prefix::Keys(t) => Some(t.as_ref()),
        }
    }

    /// Distinct prefixes interned since the last `clear` (1 without prefix columns, as every
    /// row has prefix 0).
    pub(super) fn len(&self) -> usize {
        self.table().map_or(1, GroupValues::len)
    }

    /// The hash of prefix `p`'s values, as [`crate::hash::hash_columns`] gives it over the
    /// prefix columns alone (`None` without prefix columns).
    pub(super) fn hash(&self, p: u32) -> Option<u64> {
        self.table().map(|table| table.hashes()[p as usize])
    }

    /// The prefix columns of prefix ids `ids`, one row per id (none without prefix columns).
    ///
    /// # Errors
    /// An id out of range.
    pub(super) fn keys(&self, ids: &[u32]) -> Result<Vec<ArrayRef>, ArrowError> {
        match self.table() {
            Some(table) => table.keys(ids),
            None => Ok(vec![]),
        }
    }

    /// Interns `n` rows of the prefix columns `cols`, whose ids [`PrefixKeys::take_ids`] then
    /// gives, unless they are the very arrays interned last (since the last `clear`;
    /// [`same_array`]) or rows of the arrays those were cut from whose ids are kept ([`Cut`]).
    ///
    /// # Errors
    /// Columns of other types.
    pub(super) fn intern(&mut self, cols: &[ArrayRef], n: usize) -> Result<(), ArrowError> {
        if matches!(self.table, Prefix::None) {
            self.ids.clear();
            self.ids.resize(n, 0);
            return Ok(());
        }
        let same = self.last.len() == cols.len()
            && self.ids.len() == n
            && self.last.iter().zip(cols).all(|(a, b)| same_array(a, b));
        if same {
            return Ok(());
        }
        self.last.clear();
        let here = cut_of(cols).filter(|_| cols.iter().all(|c| c.len() == n));
        if let (Some((buffers, row)), Some(cut)) = (&here, &self.cut)
            && same_buffers(&cut.buffers, buffers)
            && *row >= cut.from
            && row + n <= cut.from + cut.ids.len()
        {
            self.ids.clear();
            self.ids
                .extend_from_slice(&cut.ids[row - cut.from..row - cut.from + n]);
            self.last.extend(cols.iter().cloned());
            return Ok(());
        }
        let by_runs = match &mut self.table {
            Prefix::Strings(t) => t.intern_runs(&cols[0], &mut self.ids)?,
            _ => false,
        };
        if !by_runs {
            crate::hash::hash_columns(cols, &mut self.hashes)?;
            match &mut self.table {
                Prefix::Strings(t) => t.intern(cols, &self.hashes, &mut self.ids)?,
                Prefix::Keys(t) => t.intern(cols, &self.hashes, &mut self.ids)?,
                Prefix::None => {}
            }
        }
        self.last.extend(cols.iter().cloned());
        if let Some((buffers, row)) = here {
            match &mut self.cut {
                // The next rows of the same arrays: the run grows.
                Some(cut)
                    if same_buffers(&cut.buffers, &buffers)
                        && row == cut.from + cut.ids.len()
                        && cut.ids.len() + n <= MAX_CUT_ROWS =>
                {
                    cut.ids.extend_from_slice(&self.ids);
                }
                _ => {
                    self.cut = Some(Cut {
                        buffers,
                        from: row,
                        ids: self.ids.clone(),
                    });
                }
            }
        }
        Ok(())
    }

    /// The ids of the rows interned last.
    pub(super) fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// The ids of the rows interned last, lent out while the caller also needs `&mut self`'s
    /// owner; [`PrefixKeys::put_ids`] gives them back.
    pub(super) fn take_ids(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.ids)
    }

    /// Gives back the ids [`PrefixKeys::take_ids`] lent.
    pub(super) fn put_ids(&mut self, ids: Vec<u32>) {
        self.ids = ids;
    }

    /// Forgets every prefix (ids start from 0 again).
    pub(super) fn clear(&mut self) {
        match &mut self.table {
            Prefix::None => {}
            Prefix::Strings(t) => t.clear(),
            Prefix::Keys(t) => t.clear(),
        }
        // The ids of the last columns are gone with the table.
        self.last.clear();
        self.ids.clear();
        self.cut = None;
    }

    /// Bytes held, from capacity.
    pub(super) fn size(&self) -> usize {
        self.table().map_or(0, GroupValues::size)
            + self.ids.capacity() * 4
            + self.hashes.capacity() * 8
            + self.cut.as_ref().map_or(0, |c| c.ids.capacity() * 4)
    }
}

/// The hash [`crate::hash::hash_columns`] gives a bucketed key: the prefix's hash (`None`
/// without prefix columns), with each bucket's hash folded in (`values[j]` where bit `j` of
/// `set` is on, NULL otherwise).
pub(super) fn bucketed_key_hash(
    prefix: Option<u64>,
    set: u32,
    values: &[i32],
    hasher: &ahash::RandomState,
) -> u64 {
    let mut h = prefix;
    for (j, &v) in values.iter().enumerate() {
        let c = if set & (1 << j) != 0 {
            hasher.hash_one(v)
        } else {
            NULL_HASH
        };
        h = Some(h.map_or(c, |a| combine_hashes(a, c)));
    }
    h.unwrap_or(0)
}

/// Checks the shape of bucketed keys: 1 to [`MAX_BUCKET_COLUMNS`] bucket columns, some buckets.
///
/// # Errors
/// Any other shape.
pub(super) fn check_buckets(bucket_columns: usize, buckets: u32) -> Result<(), ArrowError> {
    if bucket_columns == 0 || bucket_columns > MAX_BUCKET_COLUMNS || buckets == 0 {
        return Err(ArrowError::InvalidArgumentError(format!(
            "bucketed keys need 1 to {MAX_BUCKET_COLUMNS} bucket columns and some buckets, got {bucket_columns} columns of {buckets} buckets"
        )));
    }
    Ok(())
}

/// Bucketed key columns `cols` cut into the `prefix` columns and the Int32 bucket columns
/// after them (`m` of them), with their length.
///
/// # Errors
/// Another number of columns, columns of different lengths, a bucket column not Int32.
pub(super) fn split_columns(
    cols: &[ArrayRef],
    prefix: usize,
    m: usize,
) -> Result<(&[ArrayRef], Vec<&Int32Array>, usize), ArrowError> {
    let want = prefix + m;
    if cols.len() != want {
        return Err(ArrowError::InvalidArgumentError(format!(
            "expected {want} key columns, got {}",
            cols.len()
        )));
    }
    let n = cols[0].len();
    if cols.iter().any(|c| c.len() != n) {
        return Err(ArrowError::InvalidArgumentError(
            "key columns differ in length".to_string(),
        ));
    }
    let (prefix_cols, bucket_cols) = cols.split_at(prefix);
    let buckets = bucket_cols
        .iter()
        .enumerate()
        .map(|(j, c)| {
            c.as_primitive_opt::<Int32Type>().ok_or_else(|| {
                ArrowError::InvalidArgumentError(format!(
                    "bucket column {j} is {}, not Int32",
                    c.data_type()
                ))
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((prefix_cols, buckets, n))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{Int64Array, StringArray};

    use super::*;

    /// The ids of pieces of one batch cut at other rows than the pieces interned before them
    /// (an Expand's sets cut by a mini-batch) are the ids of their values, for a string prefix
    /// and for two columns; an array of other values at the same rows is interned, not taken
    /// for the first; after a clear the ids start again.
    #[test]
    fn pieces_cut_at_other_rows_keep_their_values_ids() {
        let n = 300;
        let day: ArrayRef = Arc::new(StringArray::from_iter_values(
            (0..n).map(|i| ["a", "b", "c", "d"][i * 7 % 4]),
        ));
        let other: ArrayRef = Arc::new(StringArray::from_iter_values(
            (0..n).map(|i| ["e", "a", "f"][i % 3]),
        ));
        let shop: ArrayRef = Arc::new(Int64Array::from_iter_values((0..n as i64).map(|i| i % 5)));
        for types in [vec![DataType::Utf8], vec![DataType::Utf8, DataType::Int64]] {
            let two = types.len() == 2;
            let cols = |day: &ArrayRef, from: usize, len: usize| -> Vec<ArrayRef> {
                let mut c = vec![day.slice(from, len)];
                if two {
                    c.push(shop.slice(from, len));
                }
                c
            };
            let mut keys = PrefixKeys::try_new(&types).unwrap();
            // The ids each row's values must have: as the table gives them one row at a time.
            let want = |keys: &mut PrefixKeys, day: &ArrayRef, from: usize, len: usize| {
                let mut ids = vec![];
                for r in from..from + len {
                    let mut fresh = PrefixKeys::try_new(&types).unwrap();
                    std::mem::swap(&mut fresh.table, &mut keys.table);
                    fresh.intern(&cols(day, r, 1), 1).unwrap();
                    ids.push(fresh.ids()[0]);
                    std::mem::swap(&mut fresh.table, &mut keys.table);
                }
                ids
            };
            for round in 0..2 {
                // The first set in pieces of 100, the second in pieces cut elsewhere.
                for (from, len) in [
                    (0, 100),
                    (100, 100),
                    (200, 100),
                    (0, 37),
                    (37, 150),
                    (187, 113),
                ] {
                    keys.intern(&cols(&day, from, len), len).unwrap();
                    let got = keys.ids().to_vec();
                    assert_eq!(
                        got,
                        want(&mut keys, &day, from, len),
                        "round {round} {from}+{len}"
                    );
                }
                for (from, len) in [(37, 150), (0, 300)] {
                    keys.intern(&cols(&other, from, len), len).unwrap();
                    let got = keys.ids().to_vec();
                    assert_eq!(
                        got,
                        want(&mut keys, &other, from, len),
                        "other {from}+{len}"
                    );
                }
                keys.clear();
                assert_eq!(keys.len(), 0);
            }
        }
    }
}
