//! A table of 12-byte pairs of an insert-only argument, five to a cache line.
//!
//! Once the pairs outgrow the caches, a probe of hashbrown's table misses twice (its control
//! bytes and its entry sit apart), and each miss waits for the one before: whether a row's pair
//! was there decides a branch the next row's probe sits behind. A [`LineTable`] keeps a pair in
//! the 64-byte line its hash picks (or, when that line is full, in the next one with room), so a
//! probe reads one line; and the accumulator's loops ([`for_each_pair`]) take the rows a run of
//! [`RUN`] at a time: the run's hashes first, then a read of each one's line
//! ([`LineTable::touch`], no branch between the reads, so that the lines are fetched together),
//! then the probes.
//!
//! Pairs are never removed one by one (the input is insert-only): a full line stays full, so a
//! pair sits in the first line from its hash's on that was not full when it came, and a probe
//! that reaches a line that is not full has seen every line the pair could be in.

use super::pairs::{Entry, Pairs, pair_hash};

/// Pairs a line holds.
const LINE_PAIRS: usize = 5;

/// The fill past which the table grows: at most 17 pairs in 20 slots.
const MAX_FILL: (usize, usize) = (17, 20);

/// An entry a [`LineTable`] holds: 12 bytes, so that five and the line's count fill 64.
pub(super) trait LineEntry: Entry {
    /// What an unused slot holds (never read as a pair).
    const VACANT: Self;
}

/// One cache line of pairs.
#[derive(Debug, Clone, Copy)]
#[repr(C, align(64))]
struct Line<E> {
    /// The pairs held, in `pairs[..len]`.
    pairs: [E; LINE_PAIRS],
    /// Pairs held.
    len: u8,
}

impl<E: LineEntry> Line<E> {
    const EMPTY: Self = Self {
        pairs: [E::VACANT; LINE_PAIRS],
        len: 0,
    };
}

/// Insert-only pairs in cache lines; see the module's documentation. Entries are addressed as
/// `line * LINE_PAIRS + slot`, which holds until the table grows.
#[derive(Debug)]
pub(super) struct LineTable<E> {
    lines: Vec<Line<E>>,
    /// Pairs held.
    len: usize,
}

impl<E: LineEntry> Default for LineTable<E> {
    fn default() -> Self {
        Self::with_lines(16)
    }
}

impl<E: LineEntry> LineTable<E> {
    fn with_lines(n: usize) -> Self {
        debug_assert_eq!(std::mem::size_of::<Line<E>>(), 64);
        Self {
            lines: vec![Line::EMPTY; n.max(1)],
            len: 0,
        }
    }

    /// The pairs held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Bytes held, from capacity.
    pub fn bytes(&self) -> usize {
        self.lines.len() * std::mem::size_of::<Line<E>>()
    }

    /// Forgets every pair, keeping the lines.
    pub fn clear(&mut self) {
        self.lines.fill(Line::EMPTY);
        self.len = 0;
    }

    /// The line a hash picks: its high 32 bits scaled to the lines.
    #[inline(always)]
    fn home(&self, hash: u64) -> usize {
        (((hash >> 32) * self.lines.len() as u64) >> 32) as usize
    }

    /// Reads the line of `hash`, so that a probe of it soon after finds the line cached; the
    /// value is of no use but to keep the read (fold it into [`std::hint::black_box`]).
    #[inline(always)]
    pub fn touch(&self, hash: u64) -> u8 {
        self.lines[self.home(hash)].len
    }

    /// The slot of the pair `entry` (matched by id and value), whose hash is `hash`, inserted if
    /// absent, and whether it was inserted.
    #[inline(always)]
    pub fn find_or_insert(&mut self, hash: u64, entry: E) -> (usize, bool) {
        let n = self.lines.len();
        let room = (self.len + 1) * MAX_FILL.1 <= n * LINE_PAIRS * MAX_FILL.0;
        let mut at = self.home(hash);
        loop {
            let line = &mut self.lines[at];
            let len = usize::from(line.len);
            // Every slot compared, without a branch, and those past `len` masked off.
            let hits = line.pairs.iter().enumerate().fold(0u32, |hits, (s, p)| {
                hits | u32::from(p.same_pair(&entry)) << s
            }) & ((1 << len) - 1);
            if hits != 0 {
                return (at * LINE_PAIRS + hits.trailing_zeros() as usize, false);
            }
            if len < LINE_PAIRS {
                // Not full: every line the pair could be in has been seen, and it is absent.
                if !room {
                    self.grow();
                    return (self.insert_new(hash, entry), true);
                }
                line.pairs[len] = entry;
                line.len += 1;
                self.len += 1;
                return (at * LINE_PAIRS + len, true);
            }
            at = if at + 1 == n { 0 } else { at + 1 };
        }
    }

    /// Inserts `entry`, known absent, and returns its slot; the table has room.
    fn insert_new(&mut self, hash: u64, entry: E) -> usize {
        let mut at = self.home(hash);
        loop {
            let line = &mut self.lines[at];
            let len = usize::from(line.len);
            if len < LINE_PAIRS {
                line.pairs[len] = entry;
                line.len += 1;
                self.len += 1;
                return at * LINE_PAIRS + len;
            }
            at = if at + 1 == self.lines.len() {
                0
            } else {
                at + 1
            };
        }
    }

    /// A table of `pairs`, all distinct, room made for `len` of them.
    pub fn from_pairs(len: usize, pairs: impl Iterator<Item = E>) -> Self {
        let mut table = Self::with_lines(len * MAX_FILL.1 / (LINE_PAIRS * MAX_FILL.0) * 3 / 2);
        table.insert_all(pairs);
        table
    }

    /// Half as many lines again, every pair moved: the old lines read in order, each pair
    /// placed from its new home on. A home scales with the table ([`Self::home`]), so the
    /// pairs come about in the order of their new homes: the writes stream through the new
    /// lines, and no line needs reading ahead ([`Self::insert_all`]'s runs cost more here than
    /// they save). Out of line, so that the probes it sits behind stay as they were compiled.
    #[cold]
    #[inline(never)]
    fn grow(&mut self) {
        let lines = self.lines.len() + self.lines.len().div_ceil(2);
        let mut table = Self::with_lines(lines);
        for line in &self.lines {
            for e in &line.pairs[..usize::from(line.len)] {
                table.insert_new(rehash(e), *e);
            }
        }
        *self = table;
    }

    /// The pair in slot `at` (as [`Self::find_or_insert`] gave it).
    #[cfg(test)]
    pub fn get(&self, at: usize) -> &E {
        &self.lines[at / LINE_PAIRS].pairs[at % LINE_PAIRS]
    }

    /// The pair in slot `at`, to change anything but its id and value.
    #[inline(always)]
    pub fn get_mut(&mut self, at: usize) -> &mut E {
        &mut self.lines[at / LINE_PAIRS].pairs[at % LINE_PAIRS]
    }

    /// The pairs held.
    pub fn iter(&self) -> impl Iterator<Item = &E> {
        self.lines
            .iter()
            .flat_map(|l| l.pairs[..usize::from(l.len)].iter())
    }

    /// Replaces every pair by what `map` makes of it, dropping those it maps to None.
    pub fn rebuild(&mut self, map: impl FnMut(E) -> Option<E>) {
        let lines = self.lines.len();
        *self = self.rebuilt(lines, map);
    }

    /// A table of `lines` lines (more if the pairs need them) holding what `map` makes of
    /// every pair.
    fn rebuilt(&self, lines: usize, map: impl FnMut(E) -> Option<E>) -> Self {
        let need = (self.len * MAX_FILL.1).div_ceil(LINE_PAIRS * MAX_FILL.0);
        let mut table = Self::with_lines(lines.max(need));
        table.insert_all(self.iter().copied().filter_map(map));
        table
    }

    /// Inserts `pairs`, all distinct and absent, for which the table has room: a run at a
    /// time, their lines touched first.
    fn insert_all(&mut self, pairs: impl Iterator<Item = E>) {
        let mut run: Vec<(u64, E)> = Vec::with_capacity(RUN);
        let flush = |table: &mut Self, run: &mut Vec<(u64, E)>| {
            let sink = run.iter().fold(0u8, |sink, &(h, _)| sink ^ table.touch(h));
            std::hint::black_box(sink);
            for (hash, e) in run.drain(..) {
                table.insert_new(hash, e);
            }
        };
        for e in pairs {
            run.push((rehash(&e), e));
            if run.len() == RUN {
                flush(self, &mut run);
            }
        }
        flush(self, &mut run);
    }
}

/// Rows whose lines a loop touches before it probes them.
pub(super) const RUN: usize = 16;

/// Runs `$body` for each row `$r` of `$rows` (ascending) with `$hash` the [`pair_hash`] of its
/// pair (`$acc.ids[$groups[$r]]`, `$bits[$r]`): in [`Runs`] where `$acc`'s pairs sit in lines,
/// row by row otherwise (a table in the caches gains nothing from the runs, which only add work
/// there). A macro, so that each loop has the body inline: passed as a closure to a function
/// of its own, the body was not inlined and cost a call a row. Row by row, the rows go through
/// `for_each`, whose closure (the body) is inlined into the iterator's own loop, so that a
/// filtered range's `next` costs no call a row either.
macro_rules! for_each_pair {
    ($acc:ident, $groups:expr, $bits:expr, $rows:expr, |$r:ident, $hash:ident| $body:block) => {
        let mut rows = $rows;
        if $acc.pairs.in_lines() {
            let mut runs = $crate::distinct::lines::Runs::default();
            while runs.next(&$acc.pairs, &$acc.ids, $groups, $bits, &mut rows) {
                for ($r, $hash) in runs.iter() $body
            }
        } else {
            rows.for_each(|$r| {
                let $hash = $crate::distinct::pairs::pair_hash(
                    $acc.ids[$groups[$r] as usize],
                    $bits[$r],
                );
                $body
            });
        }
    };
}
pub(super) use for_each_pair;

/// Rows with the hashes of their pairs, a run of up to [`RUN`] at a time, whose lines are read
/// ahead ([`Pairs::touch`]), so that a run's lines are fetched together rather than each when
/// its probe waits for it ([`for_each_pair`] uses it where the pairs sit in lines).
pub(super) struct Runs {
    rows: [usize; RUN],
    hashes: [u64; RUN],
    len: usize,
}

impl Default for Runs {
    fn default() -> Self {
        Self {
            rows: [0; RUN],
            hashes: [0; RUN],
            len: 0,
        }
    }
}

impl Runs {
    /// Takes the next run from `rows`: each row's pair is (`ids[groups[row]]`, `bits[row]`).
    /// False once `rows` is spent.
    #[inline(always)]
    pub fn next(
        &mut self,
        pairs: &Pairs,
        ids: &[u32],
        groups: &[u32],
        bits: &[u64],
        rows: &mut impl Iterator<Item = usize>,
    ) -> bool {
        self.len = 0;
        for r in rows.take(RUN) {
            self.rows[self.len] = r;
            self.hashes[self.len] = pair_hash(ids[groups[r] as usize], bits[r]);
            self.len += 1;
        }
        pairs.touch(&self.hashes[..self.len]);
        self.len > 0
    }

    /// The run's rows and their pairs' hashes.
    #[inline(always)]
    pub fn iter(&self) -> impl Iterator<Item = (usize, u64)> + '_ {
        self.rows[..self.len]
            .iter()
            .copied()
            .zip(self.hashes[..self.len].iter().copied())
    }
}

fn rehash<E: Entry>(e: &E) -> u64 {
    pair_hash(e.id(), e.value())
}

#[cfg(test)]
mod tests {
    use super::super::pairs::{Bare, assert_holds, pair_hash};
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn a_line_is_one_cache_line() {
        assert_eq!(std::mem::size_of::<Line<Bare>>(), 64);
        assert_eq!(std::mem::align_of::<Line<Bare>>(), 64);
    }

    /// Random inserts and finds against a set, through growth, a renumbering and a clear; with
    /// the pairs crowded onto a sixteenth of the lines (runs of full lines), and onto the last
    /// sixteenth (runs that wrap to the first line).
    #[test]
    fn the_table_holds_what_a_set_holds() {
        let mut rng = crate::test_rng::XorShift(0x9e37_79b9_7f4a_7c15u64);
        let mut rand = move || rng.next();
        for crowd in [None, Some(0), Some(15)] {
            let mut table = LineTable::<Bare>::default();
            let mut model: HashSet<(u32, u64)> = HashSet::new();
            let mut steps = 0;
            while steps < 40_000 {
                let (id, value) = ((rand() % 3) as u32, rand() % 20_000);
                if crowd.is_some_and(|c| pair_hash(id, value) >> 60 != c) {
                    continue;
                }
                steps += 1;
                let (at, inserted) =
                    table.find_or_insert(pair_hash(id, value), Bare::new(id, value));
                assert_eq!((table.get(at).id(), table.get(at).value()), (id, value));
                assert_eq!(inserted, model.insert((id, value)), "({id}, {value})");
                assert_eq!(table.len(), model.len());
            }
            let mut want = assert_holds(table.iter(), &model);
            assert!(table.len() * MAX_FILL.1 <= table.lines.len() * LINE_PAIRS * MAX_FILL.0);
            table.rebuild(|p| (p.id() != 2).then(|| p.with_id(p.id() + 7)));
            want.retain(|w| w.0 != 2);
            for &(id, value) in &want {
                let (at, inserted) =
                    table.find_or_insert(pair_hash(id + 7, value), Bare::new(id + 7, value));
                assert!(!inserted);
                assert_eq!(table.get(at).id(), id + 7);
            }
            assert_eq!(table.len(), want.len());
            let bytes = table.bytes();
            table.clear();
            assert_eq!(
                (table.len(), table.iter().count(), table.bytes()),
                (0, 0, bytes)
            );
            let (_, inserted) = table.find_or_insert(pair_hash(0, 1), Bare::new(0, 1));
            assert!(inserted);
        }
    }
}
