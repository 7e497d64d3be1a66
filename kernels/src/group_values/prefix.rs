//! The query's own keys in front of a split-distinct PARTIAL's bucket columns: interned once
//! for the group sets of an Expand that share their arrays (or cut them at other rows), a single
//! string by runs; and what the two tables over such keys ([`super::BucketedGroupValues`],
//! [`super::BucketRoutes`]) share: their shape's checks and a key's hash.

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
/// Expand's sets go whole, or chunk by chunk, a mini-batch may end in a set's chunk at other rows
/// than in the set before it, so the pieces differ, but their rows are found here.
#[derive(Debug)]
struct Cut {
    /// Per column, where its rows lie.
    columns: Vec<Rows>,
    from: usize,
    ids: Vec<u32>,
}

/// Where a column's rows lie: its buffers (held, so that no other array takes their addresses)
/// and, for a dictionary, its values' buffers and where the values start in them (the same keys
/// over other values are other rows).
#[derive(Debug)]
struct Rows {
    buffers: Vec<Buffer>,
    values: Vec<Buffer>,
    at: Vec<usize>,
}

impl Rows {
    fn same(&self, other: &Rows) -> bool {
        fn same(a: &[Buffer], b: &[Buffer]) -> bool {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.data_ptr() == y.data_ptr())
        }
        same(&self.buffers, &other.buffers)
            && same(&self.values, &other.values)
            && self.at == other.at
    }
}

/// The most rows a [`Cut`] keeps ids for.
const MAX_CUT_ROWS: usize = 1 << 20;

/// The byte width of one row in the first buffer of a column of type `dt` (its values, its
/// offsets, or a dictionary's keys), for columns a [`Cut`] may read.
fn row_width(dt: &DataType) -> Option<usize> {
    match dt {
        DataType::Utf8 => Some(4),
        DataType::LargeUtf8 => Some(8),
        DataType::Dictionary(key, _) => key.primitive_width(),
        dt => dt.primitive_width(),
    }
}

/// Where the rows of columns `cols` lie: per column its [`Rows`], and their first row among
/// their buffers, for columns without NULLs of a primitive or string type or dictionaries of
/// them, all starting at the same row.
fn cut_of(cols: &[ArrayRef]) -> Option<(Vec<Rows>, usize)> {
    let mut row = None;
    let mut columns = Vec::with_capacity(cols.len());
    for col in cols {
        let d = col.to_data();
        if d.nulls().is_some() {
            return None;
        }
        let width = row_width(d.data_type())?;
        let (values, at) = match d.child_data() {
            [] => (vec![], vec![]),
            [v] if matches!(d.data_type(), DataType::Dictionary(..))
                && v.child_data().is_empty()
                && v.nulls().is_none() =>
            {
                let mut at: Vec<usize> = v.buffers().iter().map(Buffer::ptr_offset).collect();
                at.extend([v.offset(), v.len()]);
                (v.buffers().to_vec(), at)
            }
            _ => return None,
        };
        let first = d.buffers().first()?;
        let start = d.offset() + first.ptr_offset() / width;
        if *row.get_or_insert(start) != start {
            return None;
        }
        columns.push(Rows {
            buffers: d.buffers().to_vec(),
            values,
            at,
        });
    }
    Some((columns, row?))
}

/// Whether two sets of columns' rows lie in the same buffers.
fn same_rows(a: &[Rows], b: &[Rows]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(a, b)| a.same(b))
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
        if let (Some((columns, row)), Some(cut)) = (&here, &self.cut)
            && same_rows(&cut.columns, columns)
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
        if let Some((columns, row)) = here {
            match &mut self.cut {
                // The next rows of the same arrays: the run grows.
                Some(cut)
                    if same_rows(&cut.columns, &columns)
                        && row == cut.from + cut.ids.len()
                        && cut.ids.len() + n <= MAX_CUT_ROWS =>
                {
                    cut.ids.extend_from_slice(&self.ids);
                }
                _ => {
                    self.cut = Some(Cut {
                        columns,
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

    use arrow_array::{DictionaryArray, Int32Array, Int64Array, StringArray};

    use super::*;

    /// The ids of pieces of one batch cut at other rows than the pieces interned before them
    /// (an Expand's sets cut by a mini-batch) are the ids of their values: for a string prefix,
    /// a string and an integer, a dictionary and a string. Columns of other values at the same
    /// rows (other strings; the same dictionary keys over other values) are interned, not taken
    /// for the first; after a clear the ids start again.
    #[test]
    fn pieces_cut_at_other_rows_keep_their_values_ids() {
        let n = 300;
        let strings = |f: &dyn Fn(usize) -> &'static str| -> ArrayRef {
            Arc::new(StringArray::from_iter_values((0..n).map(f)))
        };
        let day = strings(&|i| ["a", "b", "c", "d"][i * 7 % 4]);
        let other_day = strings(&|i| ["e", "a", "f"][i % 3]);
        let shop: ArrayRef = Arc::new(Int64Array::from_iter_values((0..n as i64).map(|i| i % 5)));
        let keys = Int32Array::from_iter_values((0..n as i32).map(|i| i % 3));
        let dictionary = |values: [&str; 3]| -> ArrayRef {
            let values = Arc::new(StringArray::from_iter_values(values));
            Arc::new(DictionaryArray::try_new(keys.clone(), values).unwrap())
        };
        let channel = dictionary(["web", "app", "api"]);
        let other_channel = dictionary(["app", "tv", "web"]);
        let dict = DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8));
        let cases: [(Vec<DataType>, Vec<ArrayRef>, Vec<ArrayRef>); 3] = [
            (
                vec![DataType::Utf8],
                vec![day.clone()],
                vec![other_day.clone()],
            ),
            (
                vec![DataType::Utf8, DataType::Int64],
                vec![day.clone(), shop.clone()],
                vec![other_day.clone(), shop.clone()],
            ),
            (
                vec![dict, DataType::Utf8],
                vec![channel, day.clone()],
                vec![other_channel, day.clone()],
            ),
        ];
        for (types, first, second) in cases {
            let slice = |arrays: &[ArrayRef], from: usize, len: usize| -> Vec<ArrayRef> {
                arrays.iter().map(|a| a.slice(from, len)).collect()
            };
            let mut table = PrefixKeys::try_new(&types).unwrap();
            // The ids each row's values must have: as the table gives them one row at a time.
            let want = |table: &mut PrefixKeys, arrays: &[ArrayRef], from: usize, len: usize| {
                let mut ids = vec![];
                for r in from..from + len {
                    let mut fresh = PrefixKeys::try_new(&types).unwrap();
                    std::mem::swap(&mut fresh.table, &mut table.table);
                    fresh.intern(&slice(arrays, r, 1), 1).unwrap();
                    ids.push(fresh.ids()[0]);
                    std::mem::swap(&mut fresh.table, &mut table.table);
                }
                ids
            };
            for round in 0..2 {
                // The first set in pieces of 100, the next cut elsewhere; then other values.
                let pieces = [
                    (0, 100),
                    (100, 100),
                    (200, 100),
                    (0, 37),
                    (37, 150),
                    (187, 113),
                ];
                for (arrays, pieces) in [(&first, &pieces[..]), (&second, &[(37, 150), (0, 300)])] {
                    for &(from, len) in pieces {
                        table.intern(&slice(arrays, from, len), len).unwrap();
                        let got = table.ids().to_vec();
                        let ctx = format!("{types:?} round {round} {from}+{len}");
                        assert_eq!(got, want(&mut table, arrays, from, len), "{ctx}");
                    }
                }
                table.clear();
                assert_eq!(table.len(), 0);
            }
        }
    }
}
