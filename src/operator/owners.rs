//! A split PARTIAL's local groups on several workers: one per (key, worker).
//!
//! Where a split-distinct PARTIAL's workers key their state by the query's keys alone
//! (`KeyedState::merge_buckets`), a bucket only says which worker a row goes to: the rows of a
//! key whose buckets one worker owns end in one group there, whatever their buckets and group
//! sets. So the local phase need not keep a group per (key, set, bucket): it keeps one per key
//! and worker, each row going to the slot of the worker that owns its key group (the one its
//! full key, buckets included, hashes to, as an unfolded row would be routed), and flushes each
//! slot straight into that worker's part.

use arrow::array::ArrayRef;
use tally_kernels::group_values::{BucketRoutes, NO_ROUTE};

use crate::error::{Error, Result};
use crate::operator::key_groups::KeyGroups;

/// No local group for this slot yet.
const NONE: u32 = u32::MAX;

/// The local group of slot `at`, (`prefix`, worker `w`), numbered next (`slots` grown to hold
/// it).
#[cold]
fn new_slot(
    slots: &mut Vec<u32>,
    prefixes: &mut Vec<u32>,
    workers: &mut Vec<u16>,
    prefix: u32,
    w: u16,
    at: usize,
) -> u32 {
    if at >= slots.len() {
        slots.resize(at + 1, NONE);
    }
    slots[at] = prefixes.len() as u32;
    prefixes.push(prefix);
    workers.push(w);
    slots[at]
}

/// The (key, worker) slots of a local phase (see the module docs), between two flushes.
#[derive(Debug)]
pub(crate) struct Owners {
    key_groups: KeyGroups,
    /// The rows' query keys and the workers their whole keys route them to: a key's worker is
    /// found once per (query key, set bucket, bucket value), and kept across flushes.
    routes: BucketRoutes,
    /// `slots[prefix * workers + worker]`: the local group of the query's key `prefix` (a
    /// prefix id of `routes`) bound for `worker`, or [`NONE`].
    slots: Vec<u32>,
    /// Per local group: its prefix id.
    prefixes: Vec<u32>,
    /// Per local group: the worker it is bound for.
    workers: Vec<u16>,
}

impl Owners {
    /// Slots for the workers of `key_groups`, over the keys `routes` routes (empty).
    ///
    /// # Errors
    /// More workers than a route can name.
    pub(crate) fn try_new(key_groups: KeyGroups, routes: BucketRoutes) -> Result<Self> {
        if key_groups.workers() >= usize::from(NO_ROUTE) {
            return Err(Error::internal(format!(
                "{} workers: more than a split's local phase can route to",
                key_groups.workers()
            )));
        }
        Ok(Self {
            key_groups,
            routes,
            slots: vec![],
            prefixes: vec![],
            workers: vec![],
        })
    }

    /// The local group of every row of the key columns `cols` (the query's keys, then the
    /// buckets), into `groups` (cleared first): its query key's slot for the worker owning the
    /// key group its whole key hashes to.
    ///
    /// # Errors
    /// Key columns of the wrong types.
    pub(crate) fn intern(&mut self, cols: &[ArrayRef], groups: &mut Vec<u32>) -> Result<()> {
        let kg = &self.key_groups;
        let p = kg.workers();
        let (slots, prefixes, workers) = (&mut self.slots, &mut self.prefixes, &mut self.workers);
        let slot_of = |prefix: u32, w: u16| {
            let at = prefix as usize * p + usize::from(w);
            match slots.get(at) {
                Some(&g) if g != NONE => g,
                _ => new_slot(slots, prefixes, workers, prefix, w, at),
            }
        };
        self.routes
            .route(cols, |h| kg.worker_of_hash(h) as u16, slot_of, groups)
            .map_err(|e| Error::internal(format!("local keys: {e}")))
    }

    /// Local groups since the last [`Owners::clear`].
    pub(crate) fn len(&self) -> usize {
        self.prefixes.len()
    }

    /// The query's key columns of local groups `groups`, one row per group.
    ///
    /// # Errors
    /// A group out of range.
    pub(crate) fn key_columns(&self, groups: &[u32]) -> Result<Vec<ArrayRef>> {
        let prefixes: Vec<u32> = groups.iter().map(|&g| self.prefixes[g as usize]).collect();
        self.routes
            .prefix_keys(&prefixes)
            .map_err(|e| Error::internal(format!("local keys: {e}")))
    }

    /// The hash of local group `g`'s query key (over the query's key columns alone).
    pub(crate) fn key_hash(&self, g: u32) -> u64 {
        self.routes.prefix_hash(self.prefixes[g as usize])
    }

    /// The local groups bound for each worker, in worker order.
    pub(crate) fn parts(&self) -> Vec<Vec<u32>> {
        let mut parts = vec![vec![]; self.key_groups.workers()];
        for (g, &w) in self.workers.iter().enumerate() {
            parts[usize::from(w)].push(g as u32);
        }
        parts
    }

    /// Forgets every local group, keeping the allocations and, unless it grew too large, the
    /// routes found.
    pub(crate) fn clear(&mut self) {
        if self.routes.full() {
            self.routes.clear();
            self.slots.clear();
        } else {
            let p = self.key_groups.workers();
            for (&prefix, &w) in self.prefixes.iter().zip(&self.workers) {
                self.slots[prefix as usize * p + usize::from(w)] = NONE;
            }
        }
        self.prefixes.clear();
        self.workers.clear();
    }

    /// Bytes held, from capacity.
    pub(crate) fn size(&self) -> usize {
        self.routes.size()
            + (self.slots.capacity() + self.prefixes.capacity()) * 4
            + self.workers.capacity() * 2
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int32Array, StringArray};
    use arrow::datatypes::DataType;
    use std::collections::HashMap;
    use std::sync::Arc;
    use tally_kernels::hash::hash_columns;

    /// Interns `cols` and checks every row's group: one per (query key, worker its whole key's
    /// hash routes it to) since the last clear (`seen`), numbered from the count of groups
    /// before in order of first row, with its query key's hash; then each worker's part lists
    /// exactly its groups.
    fn check_batch(
        owners: &mut Owners,
        kg: &KeyGroups,
        cols: &[ArrayRef],
        seen: &mut HashMap<(String, usize), u32>,
    ) {
        let before = owners.len() as u32;
        let mut whole = vec![];
        hash_columns(cols, &mut whole).unwrap();
        let mut alone = vec![];
        hash_columns(&cols[..1], &mut alone).unwrap();
        let mut groups = vec![];
        owners.intern(cols, &mut groups).unwrap();
        let days = cols[0].as_any().downcast_ref::<StringArray>().unwrap();
        let mut next = before;
        for (r, &g) in groups.iter().enumerate() {
            let w = kg.worker_of_hash(whole[r]);
            if g == next {
                next += 1;
            }
            assert!(g < next, "row {r}: group {g} before group {next}");
            let slot = (days.value(r).to_string(), w);
            assert_eq!(*seen.entry(slot).or_insert(g), g, "row {r}");
            assert_eq!(owners.workers[g as usize] as usize, w, "row {r}");
            assert_eq!(owners.key_hash(g), alone[r], "row {r}");
            let key = owners.key_columns(&[g]).unwrap();
            let key = key[0].as_any().downcast_ref::<StringArray>().unwrap();
            assert_eq!(key.value(0), days.value(r), "row {r}");
        }
        let parts = owners.parts();
        assert_eq!(parts.len(), kg.workers());
        for (w, part) in parts.iter().enumerate() {
            assert!(
                part.iter()
                    .all(|&g| owners.workers[g as usize] as usize == w)
            );
        }
        assert_eq!(parts.iter().map(Vec::len).sum::<usize>(), owners.len());
    }

    /// Each row goes to the local group of (its query key, the worker its whole key's hash
    /// routes it to), whatever its buckets, for mixed rows and for an Expand's group sets; a
    /// group's key columns and hash are its query key's; the parts list each worker's groups;
    /// after a clear, the routes kept, the groups start from 0 again and rows still go where
    /// their keys route them.
    #[test]
    fn rows_go_to_their_key_and_workers_slot() {
        let kg = KeyGroups::new(128, 3).unwrap();
        let table = BucketRoutes::try_new(&[DataType::Utf8], 2, 16).unwrap();
        let mut owners = Owners::try_new(kg.clone(), table).unwrap();
        let n = 200;
        let day: ArrayRef = Arc::new(StringArray::from_iter_values(
            (0..n).map(|i| ["a", "b", "c"][i % 3]),
        ));
        let bucket = |f: &dyn Fn(usize) -> Option<i32>| -> ArrayRef {
            Arc::new(Int32Array::from_iter((0..n).map(f)))
        };
        let mixed1 = bucket(&|i| (i % 2 == 0).then_some((i * 7 % 16) as i32));
        let mixed2 = bucket(&|i| (i % 4 == 1).then_some((i * 5 % 16) as i32));
        let set = bucket(&|i| Some((i * 11 % 16) as i32));
        let null = bucket(&|_| None);
        let batches = [
            vec![Arc::clone(&day), mixed1, mixed2],
            vec![Arc::clone(&day), Arc::clone(&set), Arc::clone(&null)],
            vec![Arc::clone(&day), Arc::clone(&null), set],
            vec![Arc::clone(&day), Arc::clone(&null), null],
        ];
        for round in 0..2 {
            let mut seen = HashMap::new();
            for cols in &batches {
                check_batch(&mut owners, &kg, cols, &mut seen);
            }
            assert_eq!(owners.len(), seen.len(), "round {round}");
            owners.clear();
            assert_eq!(owners.len(), 0);
        }
    }
}
