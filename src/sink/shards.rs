//! The store behind the final tables ([`RowShards`]): entries keyed by the bytes of rows in
//! arrow-row form, cut into shards by the key's hash so that a batch's rows are applied to the
//! shards side by side on rayon's pool, and sorted by those bytes (the rows' order) when read.

use hashbrown::HashTable;
use hashbrown::hash_table::Entry;
use rayon::prelude::*;

use crate::error::{Error, Result};

/// Shards of a table: a power of two, enough for the pool's threads to share a batch evenly.
const SHARDS: usize = 16;

/// Batches of fewer rows are applied on the caller's thread, shard by shard as their rows come.
const PAR_ROWS: usize = 2_048;

/// Tables of fewer entries take every batch on the caller's thread: a small table stays in the
/// caches, where a change costs less than handing it to the pool (q16's final table at P = 2
/// was 7 % slower applied on the pool).
const PAR_MIN_ENTRIES: usize = 1 << 16;

/// Tables of at least this many entries are sorted on rayon's pool.
const PAR_SORT_ENTRIES: usize = 1 << 16;

/// An entry: a row's (or key's) bytes and what the table keeps for it.
pub(super) type RowEntry<V> = (Box<[u8]>, V);

/// Entries keyed by row bytes, in [`SHARDS`] hash tables chosen by the key's hash (bits 40 to
/// 43, which the tables' own probing, by the low bits and the top seven, leaves alone). A row's
/// bytes are hashed once: the hash picks the shard and finds the entry in it.
pub(super) struct RowShards<V> {
    shards: Vec<HashTable<RowEntry<V>>>,
    hasher: ahash::RandomState,
}

impl<V> Default for RowShards<V> {
    fn default() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| HashTable::new()).collect(),
            hasher: ahash::RandomState::new(),
        }
    }
}

/// Which shard a hash picks.
fn shard_of(hash: u64) -> usize {
    (hash >> 40) as usize & (SHARDS - 1)
}

impl<V: Send + Sync> RowShards<V> {
    /// Entries held.
    pub(super) fn len(&self) -> usize {
        self.shards.iter().map(HashTable::len).sum()
    }

    /// Whether no entry is held.
    pub(super) fn is_empty(&self) -> bool {
        self.shards.iter().all(HashTable::is_empty)
    }

    /// Every entry, in no order.
    pub(super) fn values(&self) -> impl Iterator<Item = &V> {
        self.shards.iter().flat_map(|s| s.iter().map(|(_, v)| v))
    }

    /// Applies `row`'s `n` rows (their bytes by index) in order: `apply(i, entry)` gets row
    /// `i` and its key's entry, found or vacant. The rows of one key are applied in their
    /// order; a batch of [`PAR_ROWS`] rows or more, to a table of [`PAR_MIN_ENTRIES`] or more,
    /// is applied shard by shard side by side on the pool.
    ///
    /// # Errors
    /// The error of the first row (by index) whose `apply` failed. The table is then left
    /// with some of the batch's rows applied (those before it, and on the pool others too).
    pub(super) fn apply<'r, K, A>(&mut self, n: usize, row: K, apply: A) -> Result<()>
    where
        K: Fn(usize) -> &'r [u8] + Sync,
        A: Fn(usize, Entry<'_, RowEntry<V>>) -> Result<()> + Sync,
    {
        let hasher = &self.hasher;
        let rehash = |e: &RowEntry<V>| hasher.hash_one(&e.0[..]);
        let hashes: Vec<u64> = (0..n).map(|i| hasher.hash_one(row(i))).collect();
        let entry_of = |table: &mut HashTable<RowEntry<V>>, i: usize| {
            let bytes = row(i);
            apply(i, table.entry(hashes[i], |e| &e.0[..] == bytes, rehash))
        };
        if n < PAR_ROWS || self.len() < PAR_MIN_ENTRIES {
            for (i, &h) in hashes.iter().enumerate() {
                entry_of(&mut self.shards[shard_of(h)], i)?;
            }
            return Ok(());
        }
        let mut rows_of: Vec<Vec<u32>> = (0..SHARDS)
            .map(|_| Vec::with_capacity(n / SHARDS * 2))
            .collect();
        for (i, &h) in hashes.iter().enumerate() {
            let i = u32::try_from(i).map_err(|_| Error::invalid_input("a batch of 2^32 rows"))?;
            rows_of[shard_of(h)].push(i);
        }
        let failed: Option<(usize, Error)> = self
            .shards
            .par_iter_mut()
            .zip(rows_of.par_iter())
            .filter_map(|(table, rows)| {
                rows.iter().find_map(|&i| {
                    let i = i as usize;
                    entry_of(table, i).err().map(|e| (i, e))
                })
            })
            .min_by_key(|(i, _)| *i);
        match failed {
            Some((_, e)) => Err(e),
            None => Ok(()),
        }
    }

    /// The entries in the order of their keys' bytes (the rows' order).
    ///
    /// Each entry is sorted by its first 32 bytes, read once into integers (zeros past a
    /// short key), and by all its bytes only where those tie: comparing keys' bytes follows a
    /// pointer into the table's heap, a cache miss per comparison over a large table (a final
    /// table of 5.3M rows took seconds to sort that way). Integers compare as the bytes do, and
    /// a key that ends within the 32 bytes ties only with keys it is a prefix of (or that are
    /// its prefix), which the bytes then order. The entries are returned as sorted, prefixes
    /// and all: copying them out into pairs would hold a second vector of millions beside it.
    pub(super) fn sorted(&self) -> Vec<Sorted<'_, V>> {
        let mut entries: Vec<Sorted<'_, V>> = Vec::with_capacity(self.len());
        entries.extend(self.shards.iter().flat_map(|s| {
            s.iter().map(|(k, v)| Sorted {
                prefix: prefix(k),
                key: &k[..],
                value: v,
            })
        }));
        let order = |a: &Sorted<'_, V>, b: &Sorted<'_, V>| {
            a.prefix.cmp(&b.prefix).then_with(|| a.key.cmp(b.key))
        };
        if entries.len() >= PAR_SORT_ENTRIES {
            entries.par_sort_unstable_by(order);
        } else {
            entries.sort_unstable_by(order);
        }
        entries
    }
}

/// An entry of [`RowShards::sorted`]: its key's bytes and value, and the prefix it sorted by.
pub(super) struct Sorted<'a, V> {
    prefix: Prefix,
    pub(super) key: &'a [u8],
    pub(super) value: &'a V,
}

/// The first [`PREFIX_BYTES`] bytes of a key as big-endian integers: they compare as the
/// bytes do.
type Prefix = [u128; 2];

/// The bytes of a key read ahead of its sort. A row's first columns take more than 16 bytes in
/// arrow-row form (an `Int64` takes 9): 32 bytes hold a key of an integer and a short string,
/// whose ties otherwise cost a comparison through both keys' boxes.
const PREFIX_BYTES: usize = 32;

/// The first [`PREFIX_BYTES`] bytes of `bytes`, zeros past its end.
fn prefix(bytes: &[u8]) -> Prefix {
    let mut head = [0u8; PREFIX_BYTES];
    let n = bytes.len().min(PREFIX_BYTES);
    head[..n].copy_from_slice(&bytes[..n]);
    let word = |i: usize| {
        let mut w = [0u8; 16];
        w.copy_from_slice(&head[i * 16..(i + 1) * 16]);
        u128::from_be_bytes(w)
    };
    [word(0), word(1)]
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use rand::{Rng, SeedableRng};

    use super::*;

    /// Random keys of 0 to 39 bytes over three byte values: long shared prefixes, zeros, keys
    /// that are others' prefixes.
    fn key(rng: &mut impl Rng) -> Vec<u8> {
        let len = rng.random_range(0..40);
        (0..len).map(|_| rng.random_range(0..3u8)).collect()
    }

    /// Whether row `i` of a batch is a retraction (one in four).
    fn retracts(i: usize) -> bool {
        i % 4 == 3
    }

    /// Counts each row of a batch in, or out (where it [`retracts`]): as a multiset does.
    fn count(table: &mut RowShards<i64>, rows: &[Vec<u8>]) -> Result<()> {
        table.apply(
            rows.len(),
            |i| &rows[i][..],
            |i, entry| {
                match (retracts(i), entry) {
                    (false, Entry::Occupied(mut e)) => e.get_mut().1 += 1,
                    (false, Entry::Vacant(e)) => {
                        e.insert((rows[i].clone().into_boxed_slice(), 1));
                    }
                    (true, Entry::Occupied(mut e)) if e.get().1 > 1 => e.get_mut().1 -= 1,
                    (true, Entry::Occupied(e)) => {
                        e.remove();
                    }
                    (true, Entry::Vacant(_)) => {
                        return Err(Error::invalid_input(format!("row {i}")));
                    }
                }
                Ok(())
            },
        )
    }

    /// Batches small and large (on the pool), counted in and out, hold what a map holds, and
    /// the first failing row's error is the one returned.
    #[test]
    fn shards_hold_what_a_map_holds() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let mut table = RowShards::<i64>::default();
        let mut model: BTreeMap<Vec<u8>, i64> = BTreeMap::new();
        // The large batch grows the table past the pool's threshold: the batches after it are
        // applied on the pool.
        for n in [
            0,
            1,
            300,
            PAR_ROWS,
            7,
            3 * PAR_MIN_ENTRIES,
            5_000,
            20_000,
            PAR_ROWS,
        ] {
            // A retraction takes a row held: one of the batches before, or the row just before.
            let held: Vec<Vec<u8>> = model.keys().cloned().collect();
            let mut rows: Vec<Vec<u8>> = vec![];
            for i in 0..n {
                let row = if retracts(i) {
                    match held.get(rng.random_range(0..held.len().max(1))) {
                        Some(k) if model.contains_key(k) && rng.random_bool(0.5) => k.clone(),
                        _ => rows[i - 1].clone(),
                    }
                } else {
                    key(&mut rng)
                };
                let c = model.entry(row.clone()).or_insert(0);
                *c += if retracts(i) { -1 } else { 1 };
                if *c == 0 {
                    model.remove(&row);
                }
                rows.push(row);
            }
            count(&mut table, &rows).unwrap();
            let got: Vec<(Vec<u8>, i64)> = table
                .sorted()
                .into_iter()
                .map(|e| (e.key.to_vec(), *e.value))
                .collect();
            let want: Vec<(Vec<u8>, i64)> = model.iter().map(|(k, &c)| (k.clone(), c)).collect();
            assert_eq!(got, want, "after a batch of {n}");
            assert_eq!(table.len(), model.len());
        }
        assert!(table.len() >= PAR_MIN_ENTRIES, "the pool's path was taken");
        // Retractions of rows never counted: the first one's error, on the pool or not.
        for n in [9, 2 * PAR_ROWS + 1] {
            let rows: Vec<Vec<u8>> = (0..n).map(|i| vec![9, (i % 251) as u8, 7, 7]).collect();
            let e = count(&mut table, &rows).unwrap_err().to_string();
            assert!(e.contains("row 3"), "{e}");
        }
    }

    /// Entries come out in their keys' byte order, as a plain sort of the bytes gives, for keys
    /// shorter and longer than the 32 bytes read ahead, keys that are others' prefixes, zero
    /// bytes, and tables sorted on the pool and off it.
    #[test]
    fn entries_sort_as_their_bytes() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(17);
        for n in [0, 1, 500, PAR_SORT_ENTRIES + 3] {
            let mut rows: Vec<Vec<u8>> = vec![];
            let mut seen = std::collections::HashSet::new();
            while rows.len() < n {
                // Every tenth key shares its first 32 bytes with others: ties the bytes order.
                let k = if rows.len().is_multiple_of(10) {
                    let mut k = vec![1u8; PREFIX_BYTES];
                    k.extend(key(&mut rng));
                    k
                } else {
                    key(&mut rng)
                };
                if seen.insert(k.clone()) {
                    rows.push(k);
                }
            }
            let mut table = RowShards::<usize>::default();
            table
                .apply(
                    n,
                    |i| &rows[i][..],
                    |i, entry| {
                        entry.or_insert((rows[i].clone().into_boxed_slice(), i));
                        Ok(())
                    },
                )
                .unwrap();
            let got: Vec<(&[u8], usize)> =
                table.sorted().iter().map(|e| (e.key, *e.value)).collect();
            let mut want: Vec<(&[u8], usize)> =
                rows.iter().enumerate().map(|(i, k)| (&k[..], i)).collect();
            want.sort();
            assert_eq!(got, want, "{n} entries");
        }
    }
}
