//! The (group, value) pairs of a DISTINCT argument: one table of 16- or 12-byte entries.
//!
//! A [`Pair`] holds the value's 64 bits, the id its group has in the table and a 32-bit counter
//! (16 bytes; with hashbrown's control byte a bucket is 17); a [`Bare`] pair, for an insert-only
//! argument with one aggregate, holds only the value and the id (12 bytes, 13 a bucket): that it
//! is held says all there is to count; a [`Tagged`] pair, for an insert-only argument with a few
//! aggregates, holds the value and one word of the id and the aggregates' flags (12 bytes too),
//! while the ids fit the word. [`Pairs`] is the table an argument keeps, of the kind its input
//! calls for: hashbrown's for 16-byte pairs, for 12-byte ones a [`Packed`] table (hashbrown's
//! while small, cache lines once large). Entries are addressed by bucket (or slot) index, which
//! holds until the next insertion or removal.

use hashbrown::{HashMap, HashTable};

use super::NO_ID;
use super::lines::LineEntry;
use super::packed::Packed;

/// A 32-bit counter of one aggregate that lives in `DistinctAccumulator::wide`.
pub(super) const SPILLED: i32 = i32::MIN;

/// The most aggregates over insert-only input whose pairs are flagged ([`Pairs::Flagged`]):
/// one bit each in an entry's counter.
pub(super) const MAX_FLAGGED: usize = 32;

/// The most aggregates over insert-only input whose flags a [`Tagged`] pair holds.
pub(super) const TAG_FLAGS: usize = 4;

/// The ids a [`Tagged`] pair holds: group numbers below this, and as many fresh ids (counted
/// down from `NO_ID - 1`). Small in the unit tests, so that they reach it.
pub(super) const TAG_IDS: u32 = if cfg!(test) {
    (1 << 6) - 1
} else {
    (1 << (31 - TAG_FLAGS)) - 1
};

/// An entry of a [`PairTable`]: a (group id, value) pair and what it counts.
pub(super) trait Entry: Copy {
    /// The group's id in the table.
    fn id(&self) -> u32;
    /// The value's bits, or its interned id.
    fn value(&self) -> u64;
    /// The entry's 32-bit counter (a bare pair's: 1; a tagged pair's: its flags).
    fn count(&self) -> i32;
    /// The same entry under group id `id`.
    fn with_id(self, id: u32) -> Self;
    /// Whether `other` is the same (group id, value) pair.
    #[inline(always)]
    fn same_pair(&self, other: &Self) -> bool {
        self.id() == other.id() && self.value() == other.value()
    }
}

/// One (group, value) pair with a counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Pair {
    /// The value's bits, or its interned id.
    pub value: u64,
    /// The group's id in the table.
    pub id: u32,
    /// The owner's counter (or what stands for its counters; see the accumulator).
    pub count: i32,
}

impl Entry for Pair {
    #[inline(always)]
    fn id(&self) -> u32 {
        self.id
    }
    #[inline(always)]
    fn value(&self) -> u64 {
        self.value
    }
    #[inline(always)]
    fn count(&self) -> i32 {
        self.count
    }
    fn with_id(self, id: u32) -> Self {
        Self { id, ..self }
    }
}

/// One (group, value) pair without a counter, packed into 12 bytes.
#[derive(Debug, Clone, Copy)]
#[repr(C, packed(4))]
pub(super) struct Bare {
    value: u64,
    id: u32,
}

impl Bare {
    /// The pair (id, value).
    #[inline(always)]
    pub fn new(id: u32, value: u64) -> Self {
        Self { value, id }
    }
}

impl LineEntry for Bare {
    const VACANT: Self = Self { value: 0, id: 0 };
}

impl Entry for Bare {
    #[inline(always)]
    fn id(&self) -> u32 {
        self.id
    }
    #[inline(always)]
    fn value(&self) -> u64 {
        self.value
    }
    #[inline(always)]
    fn count(&self) -> i32 {
        1
    }
    fn with_id(self, id: u32) -> Self {
        Self::new(id, self.value())
    }
}

/// One (group, value) pair of an insert-only argument with a few aggregates, packed into 12
/// bytes: the value, and one word whose top [`TAG_FLAGS`] bits flag the aggregates that have
/// seen the pair (bit `i`: aggregate `i`) and whose other bits hold the group id plus
/// `TAG_IDS + 1` (wrapping): a group number below [`TAG_IDS`] lands above `TAG_IDS`, and a fresh
/// id `NO_ID - 1 - i` with `i` below it lands below ([`Tagged::fits`]).
#[derive(Debug, Clone, Copy)]
#[repr(C, packed(4))]
pub(super) struct Tagged {
    value: u64,
    word: u32,
}

/// Where a [`Tagged`] word's flags start.
const TAG_SHIFT: u32 = u32::BITS - TAG_FLAGS as u32;

/// A [`Tagged`] word's id bits.
const TAG_ID_MASK: u32 = (1 << TAG_SHIFT) - 1;

// Group numbers land in `TAG_IDS + 1..=2 * TAG_IDS`, fresh ids in `0..TAG_IDS`: both in the
// id bits.
const _: () = assert!(2 * TAG_IDS <= TAG_ID_MASK);

impl Tagged {
    /// Whether a tagged pair can hold group id `id`.
    #[inline(always)]
    pub fn fits(id: u32) -> bool {
        id < TAG_IDS || (NO_ID - 1).wrapping_sub(id) < TAG_IDS
    }

    /// The pair (id, value), no aggregate flagged; `id` must [`Tagged::fits`].
    #[inline(always)]
    pub fn new(id: u32, value: u64) -> Self {
        debug_assert!(Self::fits(id), "id {id} in a tagged pair");
        Self {
            value,
            word: id.wrapping_add(TAG_IDS + 1),
        }
    }

    /// The aggregates that have seen the pair (bit `i`: aggregate `i`).
    #[inline(always)]
    fn flags(&self) -> u32 {
        self.word >> TAG_SHIFT
    }

    /// Flags the aggregates of `gains` (bit `i`: aggregate `i`, below [`TAG_FLAGS`]) and
    /// returns those it had not flagged yet.
    #[inline(always)]
    pub fn flag(&mut self, gains: u32) -> u32 {
        let new = gains & !self.flags();
        self.word |= new << TAG_SHIFT;
        new
    }
}

impl LineEntry for Tagged {
    const VACANT: Self = Self { value: 0, word: 0 };
}

impl Entry for Tagged {
    #[inline(always)]
    fn id(&self) -> u32 {
        (self.word & TAG_ID_MASK).wrapping_sub(TAG_IDS + 1)
    }
    #[inline(always)]
    fn value(&self) -> u64 {
        self.value
    }
    #[inline(always)]
    fn count(&self) -> i32 {
        self.flags() as i32
    }
    fn with_id(self, id: u32) -> Self {
        let fresh = Self::new(id, self.value());
        Self {
            word: fresh.word | (self.flags() << TAG_SHIFT),
            ..fresh
        }
    }
    #[inline(always)]
    fn same_pair(&self, other: &Self) -> bool {
        (self.word ^ other.word) & TAG_ID_MASK == 0 && self.value() == other.value()
    }
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

fn rehash<E: Entry>(e: &E) -> u64 {
    pair_hash(e.id(), e.value())
}

/// The table of pairs.
#[derive(Debug)]
pub(super) struct PairTable<E> {
    table: HashTable<E>,
}

impl<E: Entry> Default for PairTable<E> {
    fn default() -> Self {
        Self {
            table: HashTable::with_capacity(64),
        }
    }
}

impl<E: Entry> PairTable<E> {
    /// The pairs held.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// Bytes held, from capacity: an entry and a control byte per bucket.
    pub fn bytes(&self) -> usize {
        self.table.num_buckets() * (std::mem::size_of::<E>() + 1)
    }

    /// Forgets every pair, keeping the buckets.
    pub fn clear(&mut self) {
        self.table.clear();
    }

    /// The bucket of the pair `entry` (matched by id and value), whose [`pair_hash`] is `hash`,
    /// inserted if absent, and whether it was inserted.
    #[inline(always)]
    pub fn find_or_insert(&mut self, hash: u64, entry: E) -> (usize, bool) {
        match self.table.find_bucket_index(hash, |p| p.same_pair(&entry)) {
            Some(at) => (at, false),
            None => {
                let at = self.table.insert_unique(hash, entry, rehash).bucket_index();
                (at, true)
            }
        }
    }

    /// The pair in bucket `at` (as [`Self::find_or_insert`] gave it).
    #[inline(always)]
    pub fn get(&self, at: usize) -> &E {
        self.table.get_bucket(at).expect("a held pair's bucket")
    }

    /// The pair in bucket `at`, to change anything but its id and value.
    #[inline(always)]
    pub fn get_mut(&mut self, at: usize) -> &mut E {
        self.table.get_bucket_mut(at).expect("a held pair's bucket")
    }

    /// Removes the pair in bucket `at`.
    pub fn remove_at(&mut self, at: usize) {
        if let Ok(e) = self.table.get_bucket_entry(at) {
            e.remove();
        }
    }

    /// The pairs held.
    pub fn iter(&self) -> impl Iterator<Item = &E> {
        self.table.iter()
    }

    /// Replaces every pair by what `map` makes of it, dropping those it maps to None.
    pub fn rebuild(&mut self, mut map: impl FnMut(E) -> Option<E>) {
        let len = self.table.len();
        *self = Self::from_pairs(len, self.table.drain().filter_map(&mut map));
    }

    /// A table of `pairs`, all distinct, room made for `len` of them.
    pub fn from_pairs(len: usize, pairs: impl Iterator<Item = E>) -> Self {
        let mut table = HashTable::with_capacity(len);
        for p in pairs {
            table.insert_unique(rehash(&p), p, rehash);
        }
        PairTable { table }
    }
}

impl PairTable<Pair> {
    /// The counter of the pair in bucket `at`.
    #[inline(always)]
    pub fn count_mut(&mut self, at: usize) -> &mut i32 {
        &mut self
            .table
            .get_bucket_mut(at)
            .expect("a held pair's bucket")
            .count
    }
}

/// The pairs of an argument and what their entries count, chosen by the input and the number
/// of sharing aggregates.
pub(super) enum Pairs {
    /// Input with retractions (or more than [`MAX_FLAGGED`] aggregates): each aggregate's
    /// counter of the pair. With one aggregate the entry's counter is its own (or [`SPILLED`]);
    /// with several, the index of their counters in `DistinctAccumulator::counts`.
    Counted(PairTable<Pair>),
    /// Insert-only input, several aggregates: a counter only grows, so all that matters is
    /// whether it is past 0; the entry's counter flags the aggregates that have seen the pair
    /// (bit `i`: aggregate `i`).
    Flagged(PairTable<Pair>),
    /// As [`Pairs::Flagged`], with at most [`TAG_FLAGS`] aggregates, in 12-byte entries while
    /// every id [`Tagged::fits`] ([`Pairs::untag`] makes it flagged).
    Tagged(Packed<Tagged>),
    /// Insert-only input, one aggregate: a pair is held once it has been seen, and that is all.
    Bare(Packed<Bare>),
}

impl Pairs {
    /// The pairs held.
    pub fn len(&self) -> usize {
        match self {
            Self::Counted(t) | Self::Flagged(t) => t.len(),
            Self::Bare(t) => t.len(),
            Self::Tagged(t) => t.len(),
        }
    }

    /// Whether the pairs sit in lines, whose probes [`Self::touch`] reads ahead.
    pub fn in_lines(&self) -> bool {
        matches!(
            self,
            Self::Bare(Packed::Lines(_)) | Self::Tagged(Packed::Lines(_))
        )
    }

    /// Reads ahead the lines of the pairs whose hashes are `hashes`, where the pairs sit in
    /// lines ([`Packed::touch`]).
    #[inline(always)]
    pub fn touch(&self, hashes: &[u64]) {
        match self {
            Self::Bare(t) => t.touch(hashes),
            Self::Tagged(t) => t.touch(hashes),
            Self::Counted(_) | Self::Flagged(_) => {}
        }
    }

    /// Bytes held, from capacity.
    pub fn bytes(&self) -> usize {
        match self {
            Self::Counted(t) | Self::Flagged(t) => t.bytes(),
            Self::Bare(t) => t.bytes(),
            Self::Tagged(t) => t.bytes(),
        }
    }

    /// Forgets every pair, keeping the buckets.
    pub fn clear(&mut self) {
        match self {
            Self::Counted(t) | Self::Flagged(t) => t.clear(),
            Self::Bare(t) => t.clear(),
            Self::Tagged(t) => t.clear(),
        }
    }

    /// Calls `f(id, value, counter)` for every pair held.
    pub fn for_each(&self, mut f: impl FnMut(u32, u64, i32)) {
        fn each<E: Entry>(f: &mut impl FnMut(u32, u64, i32)) -> impl FnMut(&E) {
            |e: &E| f(e.id(), e.value(), e.count())
        }
        match self {
            Self::Counted(t) | Self::Flagged(t) => t.iter().for_each(each(&mut f)),
            Self::Bare(t) => t.for_each(each(&mut f)),
            Self::Tagged(t) => t.for_each(each(&mut f)),
        }
    }

    /// Moves every pair to the id `map(id, value, counter)` gives it, dropping those it maps to
    /// None.
    pub fn rebuild(&mut self, mut map: impl FnMut(u32, u64, i32) -> Option<u32>) {
        fn moved<E: Entry>(
            map: &mut impl FnMut(u32, u64, i32) -> Option<u32>,
        ) -> impl FnMut(E) -> Option<E> {
            |e: E| map(e.id(), e.value(), e.count()).map(|id| e.with_id(id))
        }
        match self {
            Self::Counted(t) | Self::Flagged(t) => t.rebuild(moved(&mut map)),
            Self::Bare(t) => t.rebuild(moved(&mut map)),
            Self::Tagged(t) => t.rebuild(moved(&mut map)),
        }
    }

    /// A tagged table made flagged (16-byte entries, any id), for ids a tagged pair cannot
    /// hold; any other table stays as it is.
    pub fn untag(&mut self) {
        if let Self::Tagged(t) = self {
            let mut pairs = Vec::with_capacity(t.len());
            t.for_each(|e| {
                pairs.push(Pair {
                    value: e.value(),
                    id: e.id(),
                    count: e.count(),
                })
            });
            *self = Self::Flagged(PairTable::from_pairs(pairs.len(), pairs.into_iter()));
        }
    }
}

/// One aggregate's counter held in bucket `at` by the pair (id, value) of a counted table.
#[inline(always)]
pub(super) fn count_at(
    table: &PairTable<Pair>,
    wide: &HashMap<(u32, u64), i64>,
    at: usize,
    id: u32,
    value: u64,
) -> i64 {
    match table.get(at).count {
        SPILLED => wide[&(id, value)],
        c => i64::from(c),
    }
}

/// Sets one aggregate's counter of the pair (id, value) in bucket `at` of a counted table.
#[inline(always)]
pub(super) fn set_count(
    table: &mut PairTable<Pair>,
    wide: &mut HashMap<(u32, u64), i64>,
    at: usize,
    id: u32,
    value: u64,
    count: i64,
) {
    let slot = table.count_mut(at);
    match i32::try_from(count) {
        Ok(c) if c != SPILLED => {
            if *slot == SPILLED {
                wide.remove(&(id, value));
            }
            *slot = c;
        }
        _ => {
            *slot = SPILLED;
            wide.insert((id, value), count);
        }
    }
}

/// The tables' set tests: the (id, value) of the pairs `held`, sorted, asserted equal to the
/// `model` set's, and returned.
#[cfg(test)]
pub(super) fn assert_holds<'a>(
    held: impl Iterator<Item = &'a Bare>,
    model: &std::collections::HashSet<(u32, u64)>,
) -> Vec<(u32, u64)> {
    let mut held: Vec<(u32, u64)> = held.map(|p| (p.id(), p.value())).collect();
    let mut want: Vec<(u32, u64)> = model.iter().copied().collect();
    held.sort_unstable();
    want.sort_unstable();
    assert_eq!(held, want);
    want
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
            let (at, inserted) = table.find_or_insert(
                pair_hash(id, value),
                Pair {
                    value,
                    id,
                    count: step as i32,
                },
            );
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
            let pair = Pair {
                value,
                id: id + 10,
                count: 0,
            };
            let (at, inserted) = table.find_or_insert(pair_hash(id + 10, value), pair);
            assert!(!inserted);
            assert_eq!(table.get(at).count, count);
        }
        assert_eq!(table.len(), want.len());
    }

    /// Bare pairs: random inserts, finds and removes against a set, through growth and a
    /// renumbering; 12 bytes an entry.
    #[test]
    fn bare_pairs_are_a_set() {
        assert_eq!(std::mem::size_of::<Bare>(), 12);
        let mut rng = crate::test_rng::XorShift(0x5851_f42d_4c95_7f2du64);
        let mut rand = move || rng.next();
        let mut table = PairTable::<Bare>::default();
        let mut model: std::collections::HashSet<(u32, u64)> = Default::default();
        for _ in 0..60_000u32 {
            let (id, value) = ((rand() % 3) as u32, rand() % 5_000 + (1 << 40));
            let (at, inserted) = table.find_or_insert(pair_hash(id, value), Bare::new(id, value));
            let pair = *table.get(at);
            assert_eq!((pair.id(), pair.value(), pair.count()), (id, value, 1));
            assert_eq!(inserted, model.insert((id, value)));
            if rand() % 3 == 0 {
                table.remove_at(at);
                model.remove(&(id, value));
            }
            assert_eq!(table.len(), model.len());
        }
        let mut want = assert_holds(table.iter(), &model);
        table.rebuild(|p| (p.id() != 2).then(|| p.with_id(p.id() + 7)));
        want.retain(|w| w.0 != 2);
        for &(id, value) in &want {
            let (_, inserted) =
                table.find_or_insert(pair_hash(id + 7, value), Bare::new(id + 7, value));
            assert!(!inserted);
        }
        assert_eq!(table.len(), want.len());
        assert_eq!(table.bytes(), table.table.num_buckets() * 13);
    }
}
