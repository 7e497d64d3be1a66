//! The (group, value) pairs of a DISTINCT argument: one hash table of 16-byte entries.
//!
//! An entry holds the value's 64 bits, the id its group has in the table and a 32-bit counter;
//! with hashbrown's control byte a bucket is 17 bytes. Entries are addressed by bucket index,
//! which holds until the next insertion or removal.

use hashbrown::HashTable;

/// One (group, value) pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Pair {
    /// The value's bits, or its interned id.
    pub value: u64,
    /// The group's id in the table.
    pub id: u32,
    /// The owner's counter (or the index of its counters; see the accumulator).
    pub count: i32,
}

/// The hash of `value` under group id `id`: both mixed into 64 bits (the bits of a primitive
/// value are not hashed beforehand).
#[inline(always)]
pub(super) fn pair_hash(id: u32, value: u64) -> u64 {
    let mut x = value.wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ u64::from(id).wrapping_mul(0xc2b2_ae3d_27d4_eb4f);
    // murmur3's finalizer: every output bit depends on every input bit.
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

fn rehash(p: &Pair) -> u64 {
    pair_hash(p.id, p.value)
}

/// The table of pairs.
#[derive(Debug)]
pub(super) struct PairTable {
    table: HashTable<Pair>,
}

impl Default for PairTable {
    fn default() -> Self {
        Self {
            table: HashTable::with_capacity(64),
        }
    }
}

impl PairTable {
    /// The pairs held.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// Bytes held, from capacity: an entry and a control byte per bucket.
    pub fn bytes(&self) -> usize {
        self.table.num_buckets() * (std::mem::size_of::<Pair>() + 1)
    }

    /// Forgets every pair, keeping the buckets.
    pub fn clear(&mut self) {
        self.table.clear();
    }

    /// The bucket of the pair (id, value), whose [`pair_hash`] is `hash`, inserted with
    /// counter `count` if absent, and whether it was inserted.
    #[inline(always)]
    pub fn find_or_insert(&mut self, hash: u64, id: u32, value: u64, count: i32) -> (usize, bool) {
        match self
            .table
            .find_bucket_index(hash, |p| p.id == id && p.value == value)
        {
            Some(at) => (at, false),
            None => {
                let pair = Pair { value, id, count };
                let at = self.table.insert_unique(hash, pair, rehash).bucket_index();
                (at, true)
            }
        }
    }

    /// The pair in bucket `at` (as [`Self::find_or_insert`] gave it).
    #[inline(always)]
    pub fn get(&self, at: usize) -> &Pair {
        self.table.get_bucket(at).expect("a held pair's bucket")
    }

    /// The counter of the pair in bucket `at`.
    #[inline(always)]
    pub fn count_mut(&mut self, at: usize) -> &mut i32 {
        &mut self
            .table
            .get_bucket_mut(at)
            .expect("a held pair's bucket")
            .count
    }

    /// Removes the pair in bucket `at`.
    pub fn remove_at(&mut self, at: usize) {
        if let Ok(e) = self.table.get_bucket_entry(at) {
            e.remove();
        }
    }

    /// The pairs held.
    pub fn iter(&self) -> impl Iterator<Item = &Pair> {
        self.table.iter()
    }

    /// Replaces every pair by what `map` makes of it, dropping those it maps to None.
    pub fn rebuild(&mut self, mut map: impl FnMut(Pair) -> Option<Pair>) {
        let mut table = HashTable::with_capacity(self.table.len());
        for p in self.table.drain() {
            if let Some(p) = map(p) {
                table.insert_unique(rehash(&p), p, rehash);
            }
        }
        self.table = table;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// Random inserts, finds and removes against a map, through growth.
    #[test]
    fn the_table_holds_what_a_map_holds() {
        let mut rng = crate::test_rng::XorShift(0x2545_f491_4f6c_dd1du64);
        let mut rand = move || rng.next();
        let mut table = PairTable::default();
        let mut model: HashMap<(u32, u64), i32> = HashMap::new();
        for step in 0..60_000u32 {
            let value = rand() % 5_000;
            let id = (rand() % 3) as u32;
            let (at, inserted) = table.find_or_insert(pair_hash(id, value), id, value, step as i32);
            let pair = *table.get(at);
            assert_eq!((pair.id, pair.value), (id, value));
            match model.get(&(id, value)) {
                Some(&c) => {
                    assert!(!inserted);
                    assert_eq!(pair.count, c);
                    *table.count_mut(at) += 1;
                    model.insert((id, value), c + 1);
                }
                None => {
                    assert!(inserted);
                    model.insert((id, value), step as i32);
                }
            }
            if rand() % 3 == 0 {
                table.remove_at(at);
                model.remove(&(id, value));
            }
            assert_eq!(table.len(), model.len());
        }
        let mut held: Vec<(u32, u64, i32)> =
            table.iter().map(|p| (p.id, p.value, p.count)).collect();
        let mut want: Vec<(u32, u64, i32)> = model.iter().map(|(&(i, v), &c)| (i, v, c)).collect();
        held.sort_unstable();
        want.sort_unstable();
        assert_eq!(held, want);
        // Renumbered, a pair is found under its new id.
        table.rebuild(|p| (p.id != 1).then_some(Pair { id: p.id + 10, ..p }));
        want.retain(|w| w.0 != 1);
        for &(id, value, count) in &want {
            let (at, inserted) = table.find_or_insert(pair_hash(id + 10, value), id + 10, value, 0);
            assert!(!inserted);
            assert_eq!(table.get(at).count, count);
        }
        assert_eq!(table.len(), want.len());
    }
}
