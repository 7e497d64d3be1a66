//! A local phase's key ids, as a global phase learns them: the global phase interns a
//! flushed key once and then finds its group by the key's id in the local phase's table.
//!
//! A local phase whose small key table outlives its flushes ([`super::local::RETAINED_KEYS`])
//! flushes the same keys under the same ids mini-batch after mini-batch. Each such flush
//! carries, per accumulator row, the key's id in that table ([`LocalIds`]), and the table's
//! [`KeyTableId`], fresh each time a key table starts afresh. A global phase ([`KnownIds`])
//! keeps, per table, the group each id interned into, and takes a flush whose ids it all knows
//! without hashing or comparing its keys: one array read per row instead of a probe of its
//! group table, which is most of a global phase's work where the keys are few and the
//! mini-batches short (the global phase runs on its own worker, so this work is what keeps a
//! query from scaling with the workers).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

/// The identity of a local phase's key table: unique in the process, fresh each time a table
/// starts afresh (made, cleared, or replaced), so that an id of one table never names a key of
/// another.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct KeyTableId(u64);

impl KeyTableId {
    /// A table identity no other table has had.
    pub(crate) fn fresh() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        Self(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

/// The key ids of a flush's accumulator rows in the local phase's key table.
#[derive(Debug, Clone)]
pub(crate) struct LocalIds {
    pub(crate) table: KeyTableId,
    /// Per row, its key's id in `table`.
    pub(crate) ids: Vec<u32>,
}

/// The most key tables a global phase knows ids of (one per local phase that sends it rows,
/// so Flink's default max parallelism, 128, twice over); past this, the table heard from least
/// recently is forgotten, and its rows are interned again.
const MAX_TABLES: usize = 256;

/// No group known for an id.
const UNKNOWN: u32 = u32::MAX;

/// A global phase's groups of local phases' key ids, learnt as their rows were interned. The
/// global phase forgets them when its own group ids change (its group table rebuilt or
/// replaced).
#[derive(Debug, Default)]
pub(crate) struct KnownIds {
    /// Per table: when it was last heard from (a count of the flushes looked up or learnt), and
    /// the group of each id (or [`UNKNOWN`]). Looked up once per part a worker receives, so
    /// hashed with ahash rather than SipHash.
    tables: HashMap<KeyTableId, (u64, Vec<u32>), ahash::RandomState>,
    heard: u64,
}

impl KnownIds {
    /// Fills `gids` with the groups of `ids` (of `table`) and returns true, where every one is
    /// known; otherwise returns false (`gids` then holds nothing of use).
    pub(crate) fn find(&mut self, table: KeyTableId, ids: &[u32], gids: &mut Vec<u32>) -> bool {
        self.heard += 1;
        let Some((heard, groups)) = self.tables.get_mut(&table) else {
            return false;
        };
        *heard = self.heard;
        gids.clear();
        let mut known = true;
        gids.extend(ids.iter().map(|&id| {
            let g = groups.get(id as usize).copied().unwrap_or(UNKNOWN);
            known &= g != UNKNOWN;
            g
        }));
        known
    }

    /// Records that `ids` (of `table`) interned into `gids` (row by row).
    pub(crate) fn learn(&mut self, table: KeyTableId, ids: &[u32], gids: &[u32]) {
        if !self.tables.contains_key(&table) && self.tables.len() == MAX_TABLES {
            let oldest = self
                .tables
                .iter()
                .min_by_key(|(_, (heard, _))| *heard)
                .map(|(&t, _)| t);
            if let Some(t) = oldest {
                self.tables.remove(&t);
            }
        }
        self.heard += 1;
        let (heard, groups) = self.tables.entry(table).or_default();
        *heard = self.heard;
        for (&id, &g) in ids.iter().zip(gids) {
            let id = id as usize;
            if id >= groups.len() {
                groups.resize(id + 1, UNKNOWN);
            }
            groups[id] = g;
        }
    }

    /// Bytes held.
    pub(crate) fn size(&self) -> usize {
        self.tables
            .values()
            .map(|(_, g)| g.capacity() * 4 + 16)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ids are found only once learnt, per table: another table's same ids are not, and a
    /// flush with one new id is not found whole.
    #[test]
    fn ids_are_known_per_table_once_learnt() {
        let (a, b) = (KeyTableId::fresh(), KeyTableId::fresh());
        assert_ne!(a, b);
        let mut known = KnownIds::default();
        let mut gids = vec![];
        assert!(!known.find(a, &[0, 1], &mut gids));
        known.learn(a, &[0, 2], &[7, 9]);
        assert!(known.find(a, &[2, 0, 2], &mut gids));
        assert_eq!(gids, [9, 7, 9]);
        assert!(!known.find(a, &[0, 1], &mut gids), "id 1 was never learnt");
        assert!(!known.find(a, &[0, 3], &mut gids), "past the ids learnt");
        assert!(!known.find(b, &[0], &mut gids), "another table");
        known.learn(b, &[0], &[3]);
        assert!(known.find(b, &[0], &mut gids));
        assert_eq!(gids, [3]);
        assert!(known.find(a, &[0], &mut gids));
        assert_eq!(gids, [7]);
    }

    /// Past [`MAX_TABLES`] tables the one heard from least recently is forgotten.
    #[test]
    fn the_table_heard_from_least_recently_is_forgotten() {
        let mut known = KnownIds::default();
        let tables: Vec<KeyTableId> = (0..=MAX_TABLES).map(|_| KeyTableId::fresh()).collect();
        let mut gids = vec![];
        for (g, &t) in tables[..MAX_TABLES].iter().enumerate() {
            known.learn(t, &[0], &[g as u32]);
        }
        // The first table is heard from again, so the second is the one forgotten.
        assert!(known.find(tables[0], &[0], &mut gids));
        known.learn(tables[MAX_TABLES], &[0], &[99]);
        assert!(!known.find(tables[1], &[0], &mut gids));
        assert!(known.find(tables[0], &[0], &mut gids));
        assert_eq!(gids, [0]);
        assert!(known.find(tables[MAX_TABLES], &[0], &mut gids));
        assert_eq!(gids, [99]);
    }
}
