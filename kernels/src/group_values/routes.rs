//! Where a split-distinct PARTIAL's rows go, without interning their whole keys.
//!
//! A split PARTIAL whose workers merge their buckets needs, per row of bucketed keys (the
//! query's keys, then one Int32 bucket column per bucketed DISTINCT argument), only two things:
//! its prefix (the query's key) and the worker its whole key's hash routes it to. Both are found
//! here without a group per (prefix, bucket): the prefix is interned once for the group sets of
//! an Expand that share its arrays (a string by runs), and the route of a key whose buckets are
//! all NULL, or all but one, is kept by position in a block per (prefix, set bucket), so a row
//! costs a load once its bucket was routed. Blocks and prefixes stay until [`BucketRoutes::clear`]
//! (the caller clears when [`BucketRoutes::full`] says so, not at every mini-batch), so the
//! sets of one chunk of rows intern its prefixes once even where a mini-batch ends between
//! them, and a prefix seen before is found rather than inserted again. Any other key (several
//! buckets set, a value outside `0..buckets`, or no room left for a block) has its hash
//! computed for the row.

use arrow_array::{Array, ArrayRef, Int32Array};
use arrow_schema::{ArrowError, DataType};

use super::bucketed::{MAX_BLOCK_ENTRIES, MAX_BUCKET_COLUMNS};
use super::prefix::{PrefixKeys, bucketed_key_hash, check_buckets, split_columns};
use crate::hash::random_state;

/// No route yet (in a block); also the one route a caller's function may not give.
pub const NO_ROUTE: u16 = u16::MAX;

/// No block (in `block_of`).
const NO_BLOCK: u32 = u32::MAX;

/// No group kept yet for a bucket (in `kept`).
const NO_GROUP: u32 = u32::MAX;

/// The most prefixes kept before [`BucketRoutes::full`] asks for a clear.
const MAX_PREFIXES: usize = 1 << 16;

/// The length of the run of `p` that starts `ids` (at least 1 where `ids[0]` is `p`): its first
/// sixteen ids one by one (most runs are short where the prefixes alternate), then sixteen at a
/// time without a branch per id.
#[inline]
fn run_len(ids: &[u32], p: u32) -> usize {
    let head = ids.len().min(16);
    if let Some(len) = ids[..head].iter().position(|&q| q != p) {
        return len;
    }
    let mut len = head;
    for chunk in ids[head..].chunks(16) {
        if chunk.iter().fold(true, |same, &q| same & (q == p)) {
            len += chunk.len();
        } else {
            return len + chunk.iter().position(|&q| q != p).unwrap_or(chunk.len());
        }
    }
    len
}

/// Routes of bucketed keys, cached per (prefix, set bucket, bucket value); see the module docs.
#[derive(Debug)]
pub struct BucketRoutes {
    prefix: PrefixKeys,
    /// Bucket columns.
    m: usize,
    /// Bucket values `0..buckets` have their place in a block.
    buckets: u32,
    /// Per (prefix, slot), at `prefix * (m + 1) + slot`: where its block starts in `routes`.
    /// Slot 0: every bucket NULL (a block of one); slot 1 + j: only bucket j set (a block of
    /// `buckets`).
    block_of: Vec<u32>,
    routes: Vec<u16>,
    /// Scratch of [`BucketRoutes::group_set`]: a run's group per bucket value.
    kept: Vec<u32>,
    key_hash: BucketedKeyHash,
}

/// The hashes of bucketed keys with at most one bucket set, as [`crate::hash::hash_columns`]
/// gives them over the whole key, from the hash of its prefix: what routes a split PARTIAL's
/// row (the hash [`BucketRoutes::route`] hands its `route_of`), found for a bucket without a
/// row (a local phase that folds a key's rows whatever their buckets routes its DISTINCT
/// entries by their values' buckets when it flushes).
#[derive(Debug, Clone)]
pub struct BucketedKeyHash {
    /// Bucket columns.
    m: usize,
    hasher: ahash::RandomState,
}

impl BucketedKeyHash {
    /// Hashes of keys with `bucket_columns` bucket columns after the prefix.
    ///
    /// # Errors
    /// No bucket column, or more than [`MAX_BUCKET_COLUMNS`].
    pub fn try_new(bucket_columns: usize) -> Result<Self, ArrowError> {
        check_buckets(bucket_columns, 1)?;
        Ok(Self {
            m: bucket_columns,
            hasher: random_state(),
        })
    }

    /// The hash of a key whose prefix hashes to `prefix` (None without prefix columns) with
    /// bucket column `j` holding `b` and the others NULL (`Some((j, b))`), or every bucket
    /// NULL (None).
    #[inline]
    pub fn hash(&self, prefix: Option<u64>, bucket: Option<(usize, i32)>) -> u64 {
        let mut values = [0i32; MAX_BUCKET_COLUMNS];
        let set = bucket.map_or(0, |(j, b)| {
            values[j] = b;
            1 << j
        });
        self.hash_set(prefix, set, &values[..self.m])
    }

    /// The hash of a key whose prefix hashes to `prefix` with bucket column `j` holding
    /// `values[j]` where bit `j` of `set` is on, NULL otherwise (`values` has one value per
    /// bucket column).
    #[inline]
    fn hash_set(&self, prefix: Option<u64>, set: u32, values: &[i32]) -> u64 {
        bucketed_key_hash(prefix, set, values, &self.hasher)
    }
}

impl BucketRoutes {
    /// Routes for keys of `prefix` types followed by `bucket_columns` Int32 columns whose values
    /// are mostly in `0..buckets`.
    ///
    /// # Errors
    /// A prefix type that cannot be a key, no bucket column or more than
    /// [`MAX_BUCKET_COLUMNS`], no buckets.
    pub fn try_new(
        prefix: &[DataType],
        bucket_columns: usize,
        buckets: u32,
    ) -> Result<Self, ArrowError> {
        check_buckets(bucket_columns, buckets)?;
        Ok(Self {
            prefix: PrefixKeys::try_new(prefix)?,
            m: bucket_columns,
            buckets,
            block_of: vec![],
            routes: vec![],
            kept: vec![],
            key_hash: BucketedKeyHash::try_new(bucket_columns)?,
        })
    }

    /// Gives every row of the key columns `cols` (the prefix columns, then the bucket columns)
    /// the group `group_of(prefix id, route)` names, into `groups` (cleared first), where the
    /// route is the one `route_of` gives the hash [`crate::hash::hash_columns`] gives the row's
    /// whole key. `route_of` must be the same function on every call until a
    /// [`BucketRoutes::clear`], and never give [`NO_ROUTE`]. `group_of` must give the same
    /// group for the same (prefix id, route) throughout the call: it is called for the first
    /// row of each (prefix, route) in row order, and for other rows only where its group is not
    /// kept (inlined: it should be a lookup). The rows' prefix ids are then
    /// [`BucketRoutes::prefix_ids`].
    ///
    /// # Errors
    /// Another number of key columns, columns of different lengths, a bucket column that is
    /// not Int32, prefix columns of other types than the table's.
    pub fn route(
        &mut self,
        cols: &[ArrayRef],
        route_of: impl Fn(u64) -> u16,
        mut group_of: impl FnMut(u32, u16) -> u32,
        groups: &mut Vec<u32>,
    ) -> Result<(), ArrowError> {
        let (prefix_cols, buckets, n) = split_columns(cols, self.prefix.columns(), self.m)?;
        self.prefix.intern(prefix_cols, n)?;
        let ids = self.prefix.take_ids();
        groups.clear();
        groups.reserve(n);
        let none_null = |b: &&Int32Array| b.null_count() == 0;
        let all_null = |b: &&Int32Array| b.null_count() == n;
        let set: Vec<usize> = (0..self.m).filter(|&j| none_null(&buckets[j])).collect();
        if set.len() <= 1 && buckets.iter().all(|b| none_null(b) || all_null(b)) {
            // Every row has the same buckets set (an Expand's group set): at most one varies.
            let j = set.first().copied();
            self.group_set(&ids, j, &buckets, &route_of, &mut group_of, groups);
        } else {
            let mut values = [0i32; MAX_BUCKET_COLUMNS];
            let values = &mut values[..self.m];
            for (r, &p) in ids.iter().enumerate() {
                let mut set = 0u32;
                for (j, b) in buckets.iter().enumerate() {
                    values[j] = if b.is_valid(r) {
                        set |= 1 << j;
                        b.value(r)
                    } else {
                        0
                    };
                }
                let h = self.key_hash.hash_set(self.prefix.hash(p), set, values);
                groups.push(group_of(p, route_of(h)));
            }
        }
        self.prefix.put_ids(ids);
        Ok(())
    }

    /// The groups of rows with prefixes `ids` whose only bucket set is column `j` (or none),
    /// pushed onto `groups`: per run of one prefix, each row's route read from its (prefix,
    /// `j`) block (routed first where the block has none yet), and its group. A run of at least
    /// as many rows as there are buckets keeps each bucket's group as it finds it, so that most
    /// of its rows cost one load.
    fn group_set(
        &mut self,
        ids: &[u32],
        j: Option<usize>,
        buckets: &[&Int32Array],
        route_of: &impl Fn(u64) -> u16,
        group_of: &mut impl FnMut(u32, u16) -> u32,
        groups: &mut Vec<u32>,
    ) {
        let mut from = 0;
        while from < ids.len() {
            let p = ids[from];
            let len = run_len(&ids[from..], p);
            let run = from..from + len;
            from += len;
            let Some(j) = j else {
                // Every bucket NULL: one route per prefix (a block of one holds it).
                let route = match self.block(p, 0, route_of) {
                    Some(start) => self.routes[start],
                    None => self.route_of_key(p, None, route_of),
                };
                let g = group_of(p, route);
                groups.extend(std::iter::repeat_n(g, len));
                continue;
            };
            let values = &buckets[j].values()[run];
            let Some(start) = self.block(p, 1 + j, route_of) else {
                for &v in values {
                    groups.push(group_of(p, self.route_of_key(p, Some((j, v)), route_of)));
                }
                continue;
            };
            let width = self.buckets as usize;
            if len >= width {
                // Each bucket's group, once found (`NO_GROUP` until then).
                let mut kept = std::mem::take(&mut self.kept);
                kept.clear();
                kept.resize(width, NO_GROUP);
                groups.extend(values.iter().map(|&v| {
                    let b = v as u32 as usize;
                    match kept.get(b) {
                        Some(&g) if g != NO_GROUP => g,
                        _ => {
                            let g = group_of(p, self.route_in_block(p, (j, v), start, route_of));
                            if let Some(k) = kept.get_mut(b) {
                                *k = g;
                            }
                            g
                        }
                    }
                }));
                self.kept = kept;
                continue;
            }
            for &v in values {
                groups.push(group_of(p, self.route_in_block(p, (j, v), start, route_of)));
            }
        }
    }

    /// The route of prefix `p` with only bucket `j` set to `v`, read from the prefix's block
    /// (which starts at `start`), routed first where the block has none for `v` yet.
    #[inline]
    fn route_in_block(
        &mut self,
        p: u32,
        (j, v): (usize, i32),
        start: usize,
        route_of: &impl Fn(u64) -> u16,
    ) -> u16 {
        // `v as u32` puts a negative bucket past the block too.
        let b = v as u32 as usize;
        match self.routes.get(start + b) {
            Some(&route) if b < self.buckets as usize && route != NO_ROUTE => route,
            _ => self.new_route(p, (j, v), start, route_of),
        }
    }

    /// The route of prefix `p` with only bucket `j` set to `v`, kept in the prefix's block
    /// (which starts at `start`) where `v` has a place in it.
    #[cold]
    fn new_route(
        &mut self,
        p: u32,
        (j, v): (usize, i32),
        start: usize,
        route_of: &impl Fn(u64) -> u16,
    ) -> u16 {
        let route = self.route_of_key(p, Some((j, v)), route_of);
        if (v as u32) < self.buckets {
            self.routes[start + v as usize] = route;
        }
        route
    }

    /// The route of prefix `p` with only bucket `j` set to `v` (`Some((j, v))`), or with every
    /// bucket NULL (`None`).
    #[inline]
    fn route_of_key(
        &self,
        p: u32,
        bucket: Option<(usize, i32)>,
        route_of: &impl Fn(u64) -> u16,
    ) -> u16 {
        route_of(self.key_hash.hash(self.prefix.hash(p), bucket))
    }

    /// The block of `slot` under prefix `p` (see `block_of`), made if it is new and there is
    /// room (None: there is not). A new block of one (every bucket NULL) holds its route; a
    /// new block of buckets holds [`NO_ROUTE`] until its rows are routed.
    fn block(&mut self, p: u32, slot: usize, route_of: &impl Fn(u64) -> u16) -> Option<usize> {
        let at = p as usize * (self.m + 1) + slot;
        if at >= self.block_of.len() {
            self.block_of.resize(at + 1, NO_BLOCK);
        }
        if self.block_of[at] != NO_BLOCK {
            return Some(self.block_of[at] as usize);
        }
        let start = self.routes.len();
        if slot == 0 {
            if start + 1 > MAX_BLOCK_ENTRIES {
                return None;
            }
            let route = self.route_of_key(p, None, route_of);
            self.routes.push(route);
        } else {
            if start + self.buckets as usize > MAX_BLOCK_ENTRIES {
                return None;
            }
            self.routes.resize(start + self.buckets as usize, NO_ROUTE);
        }
        self.block_of[at] = start as u32;
        Some(start)
    }

    /// The prefix ids of the rows routed last: the id of each row's prefix columns' values
    /// ([`BucketRoutes::prefix_keys`]), until the next [`BucketRoutes::clear`].
    pub fn prefix_ids(&self) -> &[u32] {
        self.prefix.ids()
    }

    /// Distinct prefixes since the last [`BucketRoutes::clear`] (1 without prefix columns).
    pub fn prefixes(&self) -> usize {
        self.prefix.len()
    }

    /// The prefix columns of prefix ids `ids`, one row per id (none without prefix columns).
    ///
    /// # Errors
    /// An id out of range.
    pub fn prefix_keys(&self, ids: &[u32]) -> Result<Vec<ArrayRef>, ArrowError> {
        self.prefix.keys(ids)
    }

    /// The hash of prefix `p`'s values, as [`crate::hash::hash_columns`] gives it over the
    /// prefix columns alone (0 without prefix columns, as a key without columns hashes).
    pub fn prefix_hash(&self, p: u32) -> u64 {
        self.prefix.hash(p).unwrap_or(0)
    }

    /// Whether the table should be cleared before it routes more: it keeps more prefixes than
    /// it is worth keeping. (Blocks only stop being made when there is no room for one: the
    /// rows of a prefix without one are routed by their hash, which costs a few more
    /// instructions than a load, while a cleared table interns every prefix anew.)
    pub fn full(&self) -> bool {
        self.prefix.len() > MAX_PREFIXES
    }

    /// Forgets every prefix and route (prefix ids start from 0 again).
    pub fn clear(&mut self) {
        self.prefix.clear();
        self.block_of.clear();
        self.routes.clear();
    }

    /// Bytes held, from capacity.
    pub fn size(&self) -> usize {
        self.prefix.size()
            + self.block_of.capacity() * 4
            + self.routes.capacity() * 2
            + self.kept.capacity() * 4
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::StringArray;
    use arrow_array::cast::AsArray;

    use super::*;
    use crate::hash::hash_columns;

    /// Every row's route is the one its whole key's hash gives, for an Expand's group sets
    /// (one bucket set or none) and for mixed rows, after a clear too; the prefix ids are the
    /// prefixes' and their hashes the prefix columns' own.
    #[test]
    fn a_row_routes_as_its_whole_key_hashes() {
        let route_of = |h: u64| (h % 7) as u16;
        let mut table = BucketRoutes::try_new(&[DataType::Utf8], 2, 16).unwrap();
        let n = 300;
        let day: ArrayRef = Arc::new(StringArray::from_iter_values(
            (0..n).map(|i| ["a", "b", "c"][i / 100]),
        ));
        let bucket = |f: &dyn Fn(usize) -> Option<i32>| -> ArrayRef {
            Arc::new(Int32Array::from_iter((0..n).map(f)))
        };
        let null = bucket(&|_| None);
        let b1 = bucket(&|i| Some((i * 7 % 20) as i32 - 2));
        let mixed = bucket(&|i| (i % 3 != 0).then_some((i % 16) as i32));
        let batches = [
            vec![Arc::clone(&day), Arc::clone(&b1), Arc::clone(&null)],
            vec![Arc::clone(&day), Arc::clone(&null), Arc::clone(&null)],
            vec![Arc::clone(&day), Arc::clone(&null), Arc::clone(&b1)],
            vec![Arc::clone(&day), Arc::clone(&b1), Arc::clone(&mixed)],
        ];
        let mut alone = vec![];
        hash_columns(std::slice::from_ref(&day), &mut alone).unwrap();
        // The route as the group: the same function for the whole test.
        let as_group = |_: u32, route: u16| u32::from(route);
        let mut routes = vec![];
        for round in 0..2 {
            for cols in &batches {
                let mut whole = vec![];
                hash_columns(cols, &mut whole).unwrap();
                table.route(cols, route_of, as_group, &mut routes).unwrap();
                assert_eq!(routes.len(), n);
                for r in 0..n {
                    assert_eq!(
                        routes[r],
                        u32::from(route_of(whole[r])),
                        "round {round}, row {r}"
                    );
                    let p = table.prefix_ids()[r];
                    assert_eq!(table.prefix_hash(p), alone[r]);
                }
            }
            assert_eq!(table.prefixes(), 3);
            let keys = table.prefix_keys(&[0, 1, 2]).unwrap();
            let keys = keys[0].as_string::<i32>();
            assert_eq!(keys.iter().flatten().collect::<Vec<_>>(), ["a", "b", "c"]);
            assert!(!table.full());
            table.clear();
        }
        // Blocks so wide that only one fits: the other prefixes' rows are hashed one by one.
        let mut wide = BucketRoutes::try_new(&[DataType::Utf8], 2, 600_000).unwrap();
        let cols = &batches[0];
        let mut whole = vec![];
        hash_columns(cols, &mut whole).unwrap();
        wide.route(cols, route_of, as_group, &mut routes).unwrap();
        assert!((0..n).all(|r| routes[r] == u32::from(route_of(whole[r]))));
        assert!(!wide.full());
        let wrong: Vec<ArrayRef> = vec![Arc::clone(&day), Arc::clone(&day), null];
        let err = table
            .route(&wrong, route_of, as_group, &mut routes)
            .unwrap_err();
        assert!(err.to_string().contains("not Int32"), "{err}");
    }

    /// A run's length, for runs ending before, at and after a chunk of sixteen ends.
    #[test]
    fn run_len_counts_the_first_run() {
        for len in [1, 2, 15, 16, 17, 31, 32, 33, 50] {
            let mut ids = vec![7u32; len];
            assert_eq!(run_len(&ids, 7), len);
            ids.extend([8, 7, 7]);
            assert_eq!(run_len(&ids, 7), len);
        }
    }

    /// A caller that numbers each (prefix, route) as it is first asked for it gets, for every
    /// row, the number of its (prefix, route), numbered in the order the rows first show each:
    /// with runs longer than the buckets (each bucket's group kept for the run), shorter runs,
    /// and buckets out of range.
    #[test]
    fn groups_are_numbered_in_row_order() {
        let route_of = |h: u64| (h % 5) as u16;
        let buckets = 8;
        let n = 400;
        // Runs of 40 rows, then runs of 3 (shorter than the buckets), of four prefixes.
        let prefix_of = |i: usize| if i < 200 { (i / 40) % 4 } else { (i / 3) % 4 };
        let day: ArrayRef = Arc::new(StringArray::from_iter_values(
            (0..n).map(|i| ["a", "b", "c", "d"][prefix_of(i)]),
        ));
        let bucket: ArrayRef = Arc::new(Int32Array::from_iter_values(
            (0..n).map(|i| (i * 5 % 11) as i32 - 1),
        ));
        let null: ArrayRef = Arc::new(Int32Array::from_iter((0..n).map(|_| None::<i32>)));
        let cols = vec![Arc::clone(&day), bucket, null];
        let mut whole = vec![];
        hash_columns(&cols, &mut whole).unwrap();
        let mut table = BucketRoutes::try_new(&[DataType::Utf8], 2, buckets).unwrap();
        for round in 0..2 {
            let mut numbered: std::collections::HashMap<(u32, u16), u32> = Default::default();
            let mut calls = 0;
            let mut group_of = |p: u32, route: u16| {
                calls += 1;
                let next = numbered.len() as u32;
                *numbered.entry((p, route)).or_insert(next)
            };
            let mut groups = vec![];
            table
                .route(&cols, route_of, &mut group_of, &mut groups)
                .unwrap();
            let mut expected: std::collections::HashMap<(u32, u16), u32> = Default::default();
            for r in 0..n {
                let key = (table.prefix_ids()[r], route_of(whole[r]));
                let next = expected.len() as u32;
                let g = *expected.entry(key).or_insert(next);
                assert_eq!(groups[r], g, "round {round}, row {r}");
            }
            // The long runs asked once per (run, bucket), not once per row.
            assert!(calls < n, "round {round}: {calls} calls for {n} rows");
        }
    }
}
