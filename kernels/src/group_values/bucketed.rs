//! The keys of a split-distinct PARTIAL aggregate: the query's own keys (the prefix), then one
//! Int32 bucket column per bucketed DISTINCT argument.
//!
//! A split PARTIAL sees every input row once per group set of its Expand, each time with one
//! bucket set (in `0..buckets`) and the others NULL, or all of them NULL. As packed words, each
//! set's rows would be hashed and probed anew; here the prefix is interned once for the sets
//! that share its columns (a string by runs), and a key whose buckets are all NULL, or all but
//! one, finds its group by position: a block per (prefix, set bucket) holds the group id of every
//! bucket value. Any other key (several buckets set, a value outside `0..buckets`, or more
//! blocks than [`MAX_BLOCK_ENTRIES`]) goes to a hash table; which of the two holds a key depends
//! on the key alone (and on whether its block exists, which only a `clear` undoes), so no key is
//! in both. The table hashes only the keys it keeps (the prefix's hash with the buckets' folded
//! in, as [`crate::hash::hash_columns`] would), so its caller need not hash the rows.

use std::sync::Arc;

use arrow_array::{Array, ArrayRef, Int32Array};
use arrow_buffer::{BooleanBuffer, NullBuffer};
use arrow_schema::{ArrowError, DataType};
use hashbrown::HashTable;

use super::prefix::{PrefixKeys, bucketed_key_hash, check_buckets, split_columns};
use super::table::{GroupValues, check_ids, index_size};
use crate::hash::random_state;

/// No group (in a block) and no block (in `block_of`).
const NONE: u32 = u32::MAX;

/// The most bucket columns a table takes (a key's NULL flags fit a `u32`, its values a fixed
/// array).
pub const MAX_BUCKET_COLUMNS: usize = 8;

/// The most block entries (group ids by position) a table holds until cleared: 4 MiB of them.
/// Keys whose block would exceed it are hashed instead.
pub const MAX_BLOCK_ENTRIES: usize = 1 << 20;

/// Keys of prefix columns (any key types) followed by Int32 bucket columns.
#[derive(Debug)]
pub struct BucketedGroupValues {
    /// The prefix's table.
    prefix: PrefixKeys,
    /// Bucket columns.
    m: usize,
    /// Bucket values `0..buckets` have their place in a block.
    buckets: u32,
    /// Per group: its prefix id, which buckets are set (bit j: column j), and the m values
    /// (0 where NULL).
    group_prefix: Vec<u32>,
    group_set: Vec<u32>,
    group_values: Vec<i32>,
    /// Per group: the row hash it was interned with.
    hashes: Vec<u64>,
    /// Per (prefix, slot), at `prefix * (m + 1) + slot`: where its block starts in `blocks`.
    /// Slot 0: every bucket NULL (a block of one); slot 1 + j: only bucket j set (a block of
    /// `buckets`).
    block_of: Vec<u32>,
    blocks: Vec<u32>,
    /// The keys not in blocks, by row hash.
    map: HashTable<u32>,
    hasher: ahash::RandomState,
}

/// Which bucket columns of a batch are set: all rows, none, or it varies.
#[derive(Clone, Copy, PartialEq)]
enum Cover {
    All,
    None,
    Some,
}

impl BucketedGroupValues {
    /// A table for keys of `prefix` types followed by `bucket_columns` Int32 columns whose
    /// values are mostly in `0..buckets`.
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
            group_prefix: vec![],
            group_set: vec![],
            group_values: vec![],
            hashes: vec![],
            block_of: vec![],
            blocks: vec![],
            map: HashTable::new(),
            hasher: random_state(),
        })
    }

    /// Each group's prefix id: the id of its prefix columns' values in the prefix's own table
    /// ([`BucketedGroupValues::prefix_keys`]), until the next `clear`.
    pub fn group_prefixes(&self) -> &[u32] {
        &self.group_prefix
    }

    /// The prefix columns of prefix ids `ids`, one row per id (none without prefix columns).
    ///
    /// # Errors
    /// An id out of range.
    pub fn prefix_keys(&self, ids: &[u32]) -> Result<Vec<ArrayRef>, ArrowError> {
        self.prefix.keys(ids)
    }

    /// The hash of prefix `p`'s values, as [`crate::hash::hash_columns`] gives it over the prefix
    /// columns alone (0 without prefix columns, as a key without columns hashes).
    pub fn prefix_hash(&self, p: u32) -> u64 {
        self.prefix.hash(p).unwrap_or(0)
    }

    /// The block of `slot` under prefix `p`, made if there is room (None: there is not).
    #[inline(always)]
    fn block(&mut self, p: u32, slot: usize) -> Option<usize> {
        let at = p as usize * (self.m + 1) + slot;
        if at >= self.block_of.len() {
            self.block_of.resize(at + 1, NONE);
        }
        match self.block_of[at] {
            NONE => {
                let width = if slot == 0 { 1 } else { self.buckets as usize };
                if self.blocks.len() + width > MAX_BLOCK_ENTRIES {
                    return None;
                }
                let start = self.blocks.len();
                self.blocks.resize(start + width, NONE);
                self.block_of[at] = start as u32;
                Some(start)
            }
            start => Some(start as usize),
        }
    }

    /// The hash [`crate::hash::hash_columns`] gives the key (p, set, values).
    fn key_hash(&self, p: u32, set: u32, values: &[i32]) -> u64 {
        bucketed_key_hash(self.prefix.hash(p), set, values, &self.hasher)
    }

    /// A new group of key (p, set, values) whose row hash is `h`.
    fn push_group(&mut self, p: u32, set: u32, values: &[i32], h: u64) -> u32 {
        let g = self.hashes.len() as u32;
        self.group_prefix.push(p);
        self.group_set.push(set);
        self.group_values.extend_from_slice(values);
        self.hashes.push(h);
        g
    }

    /// The group of key (p, set, values) with row hash `h` (None: the table hashes the key
    /// where it needs the hash), found or made.
    #[inline(always)]
    fn find(&mut self, p: u32, set: u32, values: &[i32], h: Option<u64>) -> u32 {
        // Its place in a block, if it has one.
        let slot = match set {
            0 => Some((0, 0)),
            s if s.is_power_of_two() => {
                let j = s.trailing_zeros() as usize;
                let v = values[j];
                (v >= 0 && (v as u32) < self.buckets).then_some((1 + j, v as usize))
            }
            _ => None,
        };
        if let Some((slot, v)) = slot
            && let Some(start) = self.block(p, slot)
        {
            let g = self.blocks[start + v];
            if g != NONE {
                return g;
            }
            let h = h.unwrap_or_else(|| self.key_hash(p, set, values));
            let g = self.push_group(p, set, values, h);
            self.blocks[start + v] = g;
            return g;
        }
        let h = h.unwrap_or_else(|| self.key_hash(p, set, values));
        let m = self.m;
        let (gp, gs, gv) = (&self.group_prefix, &self.group_set, &self.group_values);
        let eq = |g: &u32| {
            let g = *g as usize;
            gp[g] == p && gs[g] == set && gv[g * m..(g + 1) * m] == *values
        };
        if let Some(&g) = self.map.find(h, eq) {
            return g;
        }
        let g = self.push_group(p, set, values, h);
        let hashes = &self.hashes;
        self.map.insert_unique(h, g, |&g| hashes[g as usize]);
        g
    }

    /// The groups of `n` rows that all have prefix `p` and only bucket column `j` set (or none),
    /// into `groups`: with no bucket set, one group; with bucket `j`, a load per row from the
    /// block of (`p`, `j`), and a row whose bucket has no group yet (or lies outside the block)
    /// found or made. `false` (and nothing done) when (`p`, `j`) has no block and there is no
    /// room for one.
    fn intern_one_prefix(
        &mut self,
        p: u32,
        n: usize,
        j: Option<usize>,
        buckets: &[&Int32Array],
        hash: impl Fn(usize) -> Option<u64>,
        groups: &mut Vec<u32>,
    ) -> bool {
        let mut values = [0i32; MAX_BUCKET_COLUMNS];
        let values = &mut values[..self.m];
        let Some(j) = j else {
            let g = self.find(p, 0, values, hash(0));
            groups.resize(n, g);
            return true;
        };
        let Some(start) = self.block(p, 1 + j) else {
            return false;
        };
        let column = buckets[j].values();
        let b = self.buckets;
        for (r, &v) in column.iter().enumerate() {
            // `v as u32` puts a negative bucket past the block too.
            let g = if (v as u32) < b {
                self.blocks[start + v as usize]
            } else {
                NONE
            };
            groups.push(if g != NONE {
                g
            } else {
                values[j] = v;
                self.find(p, 1 << j, values, hash(r))
            });
        }
        true
    }
}

impl GroupValues for BucketedGroupValues {
    fn intern(
        &mut self,
        cols: &[ArrayRef],
        hashes: &[u64],
        groups: &mut Vec<u32>,
    ) -> Result<(), ArrowError> {
        let (prefix_cols, buckets, n) = split_columns(cols, self.prefix.columns(), self.m)?;
        if !(hashes.is_empty() || hashes.len() == n) {
            return Err(ArrowError::InvalidArgumentError(
                "key columns and hashes differ in length".to_string(),
            ));
        }
        // Row hashes given, or none (`hashes_keys_itself`).
        let hash = |r: usize| hashes.get(r).copied();
        self.prefix.intern(prefix_cols, n)?;
        let prefix_ids = self.prefix.take_ids();
        groups.clear();
        groups.reserve(n);
        let cover: Vec<Cover> = buckets
            .iter()
            .map(|b| match b.null_count() {
                0 => Cover::All,
                k if k == n => Cover::None,
                _ => Cover::Some,
            })
            .collect();
        let set_columns: Vec<usize> = (0..self.m).filter(|&j| cover[j] == Cover::All).collect();
        let mut values = [0i32; MAX_BUCKET_COLUMNS];
        let values = &mut values[..self.m];
        if cover.iter().all(|&c| c != Cover::Some) && set_columns.len() <= 1 {
            // Every row has the same buckets set (an Expand's group set): at most one value
            // varies.
            let set: u32 = set_columns.iter().map(|&j| 1u32 << j).sum();
            // One prefix in every row (a run of one day): the rows' groups by whole slices.
            let one_prefix = prefix_ids
                .first()
                .copied()
                .filter(|&p0| prefix_ids.iter().all(|&p| p == p0));
            if let Some(p) = one_prefix
                && self.intern_one_prefix(
                    p,
                    n,
                    set_columns.first().copied(),
                    &buckets,
                    hash,
                    groups,
                )
            {
                self.prefix.put_ids(prefix_ids);
                return Ok(());
            }
            match set_columns.first() {
                None => {
                    // Every bucket NULL: one group per prefix, the last one's kept for runs.
                    let mut last: Option<(u32, u32)> = None;
                    for (r, &p) in prefix_ids.iter().enumerate() {
                        let g = match last {
                            Some((lp, g)) if lp == p => g,
                            _ => self.find(p, 0, values, hash(r)),
                        };
                        last = Some((p, g));
                        groups.push(g);
                    }
                }
                Some(&j) => {
                    let column = buckets[j].values();
                    // The block of the prefix of the row before, while the prefix stays (a run
                    // of one day): a row in it costs a load.
                    let mut run: Option<(u32, usize)> = None;
                    for (r, (&p, &v)) in prefix_ids.iter().zip(column.iter()).enumerate() {
                        if let Some((rp, start)) = run
                            && rp == p
                            && v >= 0
                            && (v as u32) < self.buckets
                        {
                            let g = self.blocks[start + v as usize];
                            if g != NONE {
                                groups.push(g);
                                continue;
                            }
                        }
                        values[j] = v;
                        groups.push(self.find(p, set, values, hash(r)));
                        run = self
                            .block_of
                            .get(p as usize * (self.m + 1) + 1 + j)
                            .and_then(|&start| (start != NONE).then_some((p, start as usize)));
                    }
                }
            }
        } else {
            for (r, &p) in prefix_ids.iter().enumerate() {
                let mut set = 0u32;
                for (j, b) in buckets.iter().enumerate() {
                    if b.is_valid(r) {
                        set |= 1 << j;
                        values[j] = b.value(r);
                    } else {
                        values[j] = 0;
                    }
                }
                groups.push(self.find(p, set, values, hash(r)));
            }
        }
        self.prefix.put_ids(prefix_ids);
        Ok(())
    }

    fn len(&self) -> usize {
        self.hashes.len()
    }

    fn hashes_keys_itself(&self) -> bool {
        true
    }

    fn size(&self) -> usize {
        index_size(&self.map, &self.hashes)
            + self.prefix.size()
            + (self.group_prefix.capacity() + self.group_set.capacity()) * 4
            + self.group_values.capacity() * 4
            + (self.block_of.capacity() + self.blocks.capacity()) * 4
    }

    fn clear(&mut self) {
        self.prefix.clear();
        self.group_prefix.clear();
        self.group_set.clear();
        self.group_values.clear();
        self.hashes.clear();
        self.block_of.clear();
        self.blocks.clear();
        self.map.clear();
    }

    fn hashes(&self) -> &[u64] {
        &self.hashes
    }

    fn keys(&self, groups: &[u32]) -> Result<Vec<ArrayRef>, ArrowError> {
        check_ids(groups, self.hashes.len())?;
        let ids: Vec<u32> = groups
            .iter()
            .map(|&g| self.group_prefix[g as usize])
            .collect();
        let mut cols = self.prefix.keys(&ids)?;
        for j in 0..self.m {
            let set = BooleanBuffer::collect_bool(groups.len(), |i| {
                self.group_set[groups[i] as usize] & (1 << j) != 0
            });
            let nulls = NullBuffer::new(set);
            let values: Vec<i32> = groups
                .iter()
                .map(|&g| self.group_values[g as usize * self.m + j])
                .collect();
            cols.push(Arc::new(Int32Array::new(
                values.into(),
                (nulls.null_count() > 0).then_some(nulls),
            )));
        }
        Ok(cols)
    }
}

#[cfg(test)]
mod tests;
