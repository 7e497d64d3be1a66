//! The table of an insert-only argument's 12-byte pairs: hashbrown's while it is small, lines
//! once it is large.
//!
//! hashbrown's table probes a small table faster: its control bytes stay in the nearest caches,
//! and a group of them is matched at once. Once the pairs outgrow the caches, a [`LineTable`]
//! probes faster, in fewer bytes (BENCHMARKS.md, "DISTINCT pairs in cache lines"). A table
//! moves to lines when it reaches [`LINES_FROM`] pairs, and stays there.

use super::lines::{LineEntry, LineTable};
use super::pairs::PairTable;

/// Pairs from which a table keeps them in lines. Small in the unit tests, so that they reach it.
pub(super) const LINES_FROM: usize = if cfg!(test) { 1 << 8 } else { 1 << 19 };

/// Insert-only 12-byte pairs; see the module's documentation. Entries are addressed by slot,
/// which holds until the next insertion.
#[derive(Debug)]
pub(super) enum Packed<E> {
    /// Fewer than [`LINES_FROM`] pairs.
    Hashed(PairTable<E>),
    /// [`LINES_FROM`] pairs or more.
    Lines(LineTable<E>),
}

/// A table of 12-byte pairs, probed at one call site per kind in the accumulator's hot loop.
pub(super) trait Probe<E> {
    /// The slot of the pair `entry` (matched by id and value), whose hash is `hash`, inserted
    /// if absent, and whether it was inserted.
    fn find_or_insert(&mut self, hash: u64, entry: E) -> (usize, bool);
    /// The pair in slot `at`, to change anything but its id and value.
    fn get_mut(&mut self, at: usize) -> &mut E;
}

impl<E: LineEntry> Probe<E> for PairTable<E> {
    #[inline(always)]
    fn find_or_insert(&mut self, hash: u64, entry: E) -> (usize, bool) {
        PairTable::find_or_insert(self, hash, entry)
    }
    #[inline(always)]
    fn get_mut(&mut self, at: usize) -> &mut E {
        PairTable::get_mut(self, at)
    }
}

impl<E: LineEntry> Probe<E> for LineTable<E> {
    #[inline(always)]
    fn find_or_insert(&mut self, hash: u64, entry: E) -> (usize, bool) {
        LineTable::find_or_insert(self, hash, entry)
    }
    #[inline(always)]
    fn get_mut(&mut self, at: usize) -> &mut E {
        LineTable::get_mut(self, at)
    }
}

impl<E: LineEntry> Default for Packed<E> {
    fn default() -> Self {
        Self::Hashed(PairTable::default())
    }
}

impl<E: LineEntry> Packed<E> {
    /// The pairs held.
    pub fn len(&self) -> usize {
        match self {
            Self::Hashed(t) => t.len(),
            Self::Lines(t) => t.len(),
        }
    }

    /// Bytes held, from capacity.
    pub fn bytes(&self) -> usize {
        match self {
            Self::Hashed(t) => t.bytes(),
            Self::Lines(t) => t.bytes(),
        }
    }

    /// Forgets every pair, keeping the room.
    pub fn clear(&mut self) {
        match self {
            Self::Hashed(t) => t.clear(),
            Self::Lines(t) => t.clear(),
        }
    }

    /// Reads ahead the lines of the pairs whose hashes are `hashes`, where the pairs sit in
    /// lines ([`LineTable::touch`]).
    #[inline(always)]
    pub fn touch(&self, hashes: &[u64]) {
        if let Self::Lines(t) = self {
            let sink = hashes.iter().fold(0u8, |sink, &h| sink ^ t.touch(h));
            std::hint::black_box(sink);
        }
    }

    /// Moves the pairs to lines (once a hashed table holds [`LINES_FROM`]).
    #[cold]
    #[inline(never)]
    pub fn move_to_lines(&mut self) {
        if let Self::Hashed(t) = self {
            *self = Self::Lines(LineTable::from_pairs(t.len(), t.iter().copied()));
        }
    }

    /// Calls `f` with every pair held.
    pub fn for_each(&self, f: impl FnMut(&E)) {
        match self {
            Self::Hashed(t) => t.iter().for_each(f),
            Self::Lines(t) => t.iter().for_each(f),
        }
    }

    /// Replaces every pair by what `map` makes of it, dropping those it maps to None.
    pub fn rebuild(&mut self, map: impl FnMut(E) -> Option<E>) {
        match self {
            Self::Hashed(t) => t.rebuild(map),
            Self::Lines(t) => t.rebuild(map),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::pairs::{Bare, Entry, Pairs, TAG_FLAGS, TAG_IDS, Tagged, pair_hash};
    use super::super::{NO_ID, flag_pair};
    use super::*;
    use std::collections::HashSet;

    /// Pairs inserted past [`LINES_FROM`] move to lines, each found at its slot before and after;
    /// a renumbering keeps them there.
    #[test]
    fn pairs_move_to_lines_and_are_found_there() {
        let mut table = Packed::<Bare>::default();
        let mut model = HashSet::new();
        let mut rng = crate::test_rng::XorShift(0x6a09_e667_f3bc_c909u64);
        fn probe<T: Probe<Bare>>(t: &mut T, id: u32, value: u64) -> (Bare, bool) {
            let (at, inserted) = t.find_or_insert(pair_hash(id, value), Bare::new(id, value));
            (*t.get_mut(at), inserted)
        }
        for step in 0..4 * LINES_FROM {
            let (id, value) = (
                (rng.next() % 2) as u32,
                rng.next() % (2 * LINES_FROM as u64),
            );
            let (e, inserted) = match &mut table {
                Packed::Hashed(t) => probe(t, id, value),
                Packed::Lines(t) => probe(t, id, value),
            };
            if inserted && table.len() >= LINES_FROM {
                table.move_to_lines();
            }
            assert_eq!(inserted, model.insert((id, value)), "step {step}");
            assert_eq!((e.id(), e.value()), (id, value), "step {step}");
            assert_eq!(table.len(), model.len());
            assert_eq!(
                matches!(table, Packed::Lines(_)),
                model.len() >= LINES_FROM,
                "step {step}"
            );
        }
        table.rebuild(|e| Some(e.with_id(e.id() + 5)));
        let mut held = vec![];
        table.for_each(|e| held.push((e.id() - 5, e.value())));
        held.sort_unstable();
        let mut want: Vec<(u32, u64)> = model.into_iter().collect();
        want.sort_unstable();
        assert_eq!(held, want);
    }

    /// Tagged pairs: 12 bytes, group numbers and fresh ids at both ends of what they hold
    /// found again with their flags, through a renumbering and made flagged.
    #[test]
    fn tagged_pairs_keep_ids_and_flags() {
        assert_eq!(std::mem::size_of::<Tagged>(), 12);
        let ids = [0, 1, TAG_IDS - 1, NO_ID - 1, NO_ID - TAG_IDS];
        assert!(ids.iter().all(|&id| Tagged::fits(id)));
        assert!(
            !Tagged::fits(TAG_IDS) && !Tagged::fits(NO_ID - 1 - TAG_IDS) && !Tagged::fits(NO_ID)
        );
        // In hashbrown's table and in lines alike.
        for lines in [false, true] {
            let mut table = Packed::<Tagged>::default();
            if lines {
                table.move_to_lines();
            }
            let probe = |table: &mut Packed<Tagged>, id: u32, value: u64, gains: u32| {
                let (hash, entry) = (pair_hash(id, value), Tagged::new(id, value));
                match table {
                    Packed::Hashed(t) => flag_pair(t, hash, entry, gains),
                    Packed::Lines(t) => flag_pair(t, hash, entry, gains),
                }
            };
            for (i, &id) in ids.iter().enumerate() {
                for value in [0, 7, u64::MAX] {
                    let one = 1 << (i % TAG_FLAGS);
                    assert_eq!(probe(&mut table, id, value, one), (true, one));
                    assert_eq!(probe(&mut table, id, value, 0b1111), (false, 0b1111 & !one));
                    assert_eq!(probe(&mut table, id, value, 0b0101), (false, 0));
                }
            }
            let held = |t: &Packed<Tagged>| {
                let mut v: Vec<(u32, u64, i32)> = vec![];
                t.for_each(|p| v.push((p.id(), p.value(), p.count())));
                v.sort_unstable();
                v
            };
            let mut want: Vec<(u32, u64, i32)> = ids
                .iter()
                .flat_map(|&id| [0, 7, u64::MAX].map(|v| (id, v, 0b1111)))
                .collect();
            want.sort_unstable();
            assert_eq!(held(&table), want);
            for &(id, value, _) in &want {
                assert_eq!(
                    probe(&mut table, id, value, 0b1111),
                    (false, 0),
                    "({id}, {value})"
                );
            }
            assert_eq!(matches!(table, Packed::Lines(_)), lines);
            // Renumbered, each id to the other end of the ids: the flags stay.
            table.rebuild(|p| Some(p.with_id(NO_ID - 1 - p.id())));
            let mut moved: Vec<(u32, u64, i32)> = want
                .iter()
                .map(|&(id, v, c)| (NO_ID - 1 - id, v, c))
                .collect();
            moved.sort_unstable();
            assert_eq!(held(&table), moved);
            let before = held(&table);
            let mut pairs = Pairs::Tagged(table);
            pairs.untag();
            assert!(matches!(pairs, Pairs::Flagged(_)));
            let mut after = vec![];
            pairs.for_each(|id, value, count| after.push((id, value, count)));
            after.sort_unstable();
            assert_eq!(after, before);
        }
    }
}
