//! A split PARTIAL's local phase on several workers that routes what it folded when it
//! flushes, not row by row.
//!
//! Where the PARTIAL's workers key their state by the query's keys alone
//! (`KeyedState::merge_buckets`), a row of a bucketed group set goes to the worker its key and
//! bucket route it to, and its bucket is that of its DISTINCT argument's value. So where every
//! call of a bucketed set is a DISTINCT call over exactly the bucketed argument
//! ([`crate::plan::BucketKeys::call_sets`]), the local phase folds a key's rows whatever their
//! sets and buckets, as on one worker (one group per key, no route looked up per row), and a
//! flush routes each DISTINCT entry by its value's bucket, and the other calls' state (the set
//! of the keys alone, whose rows all go where the key's do) to that set's worker. Each worker
//! gets the entries and states it would have got from the rows routed one by one, in one
//! accumulator row per (key, worker). A MIN/MAX of a bucketed set without DISTINCT calls goes
//! with the keys alone too: the FINAL takes the extreme of its parts wherever they lie, so its
//! worker changes nothing but which PARTIAL row carries it. Only a row's count, the hidden record count of insert-only
//! input (which only the metrics and the adaptive local phase's hottest share read), lands
//! elsewhere: the rows that made no entry of their own (a value seen before in the mini-batch,
//! a NULL) are counted at the worker of the keys alone. Where only some keys are hot
//! ([`HotKeys`]), a cold key's entries go to the worker of the key alone too, as its rows that
//! go around the local phase do ([`crate::plan::BucketFill`]): one PARTIAL row for the key.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use arrow::array::Int64Array;
use arrow::datatypes::DataType;
use tally_kernels::group_values::{BucketedKeyHash, NO_ROUTE};
use tally_kernels::id_counts::count_ids;

use super::LocalGroupAggregate;
use super::flush::{Flushed, FlushedPart, RoutedFlush};
use crate::error::{Error, Result};
use crate::operator::accumulators::Accumulators;
use crate::operator::key_groups::KeyGroups;
use crate::plan::{AggregatePlan, BucketKeys, HotKeys};

/// The most routes kept across flushes ([`EntryRoutes`]'s blocks) before they are forgotten.
const MAX_KEPT_ROUTES: usize = 1 << 20;

/// The fewest entries of one key under one bucket column, in one flush, whose routes are kept
/// in a block (a worker per bucket, made once and kept across flushes). A key's fewer entries
/// are routed by their hashes: with many keys of few entries each (1,000 keys, some five
/// entries each per flush), blocks made and forgotten at every flush cost more than the
/// hashes (about 12 % of such a run in `perf`, BENCHMARKS.md, twenty-ninth pass).
const BLOCK_MIN_ENTRIES: u32 = 64;

/// How a local phase routes what it folded (see the module docs).
#[derive(Debug)]
pub(crate) struct EntryRoutes {
    key_hash: BucketedKeyHash,
    buckets: u32,
    /// Per accumulator slot ([`Accumulators::state`]'s order): the bucket column of its calls'
    /// group set (None: the keys alone's).
    slot_sets: Vec<Option<usize>>,
    /// The routes found, kept across flushes (a route depends on the key's hash alone): per
    /// (query key hash, bucket column), where its block of a worker per bucket starts in
    /// `routes` ([`NO_ROUTE`] until found).
    blocks: HashMap<(Option<u64>, usize), usize, ahash::RandomState>,
    routes: Vec<u16>,
    /// The keys spread by bucket (None: all); a cold key's entries go to its home worker.
    hot: Option<Arc<HotKeys>>,
}

impl EntryRoutes {
    /// The routes of `plan`'s accumulators `state` over `buckets`, or None where a flush cannot
    /// route them: changelog input (whose record counts must be exact), a `COUNT(*)` counted by
    /// the local phase itself (`count_star`), calls that do not route by value
    /// ([`crate::plan::BucketKeys::call_sets`], [`Accumulators::slot_sets`]), or a bucketed
    /// argument of a type other than Int32 and Int64 (whose buckets the kernels compute from
    /// the values alone).
    pub(super) fn try_new(
        plan: &AggregatePlan,
        buckets: &BucketKeys,
        state: &Accumulators,
        count_star: Option<usize>,
        workers: usize,
    ) -> Option<Self> {
        if plan.has_retractions() || count_star.is_some() || workers >= usize::from(NO_ROUTE) {
            return None;
        }
        let slots = state.slot_sets(buckets.call_sets.as_ref()?)?;
        let bucketable = |arg: usize| {
            plan.calc.args[arg]
                .data_type(&plan.input_schema)
                .is_ok_and(|t| matches!(t, DataType::Int32 | DataType::Int64))
        };
        if slots
            .iter()
            .any(|&(set, arg)| set.is_some() && !arg.is_some_and(bucketable))
        {
            return None;
        }
        Some(Self {
            key_hash: BucketedKeyHash::try_new(buckets.columns).ok()?,
            buckets: buckets.buckets,
            slot_sets: slots.into_iter().map(|(set, _)| set).collect(),
            blocks: HashMap::default(),
            routes: vec![],
            hot: buckets.hot.clone(),
        })
    }

    /// Before routing a slot's entries, `blocks` of whose keys have blocks: forgets the routes
    /// kept where those blocks could take them past [`MAX_KEPT_ROUTES`]. While a slot's entries
    /// are routed none is forgotten (the starts of its blocks stay valid), however many it makes.
    fn make_room(&mut self, blocks: usize) {
        let width = self.buckets as usize;
        if self.routes.len() + blocks * width > MAX_KEPT_ROUTES {
            self.blocks.clear();
            self.routes.clear();
        }
    }

    /// Appends to `at` the place ([`Places::of`]: key `g` of the `n` whose hashes are
    /// `prefixes`, None without key columns, on worker `w`) of each entry of bucket column `j`
    /// (of key `groups[i]`, its value's bucket `buckets[i]`). A cold key's entries go to its
    /// home worker. A hot key with enough entries is routed by its block of routes, found once;
    /// each bucket's route is computed the first time it comes. Other keys' entries are routed
    /// by their hashes.
    #[allow(clippy::too_many_arguments)]
    fn place(
        &mut self,
        groups: &[u32],
        buckets: &[i32],
        j: usize,
        prefixes: &[Option<u64>],
        places: &Places,
        kg: &KeyGroups,
        at: &mut Vec<u32>,
    ) {
        let n = prefixes.len();
        let prefix = |g: u32| prefixes[g as usize];
        let is_cold = |g: usize| !places.spread[g];
        let mut per_key = vec![0u32; n];
        if n == 1 {
            per_key[0] = groups.len() as u32;
        } else {
            for &g in groups {
                per_key[g as usize] += 1;
            }
        }
        for (g, e) in per_key.iter_mut().enumerate() {
            if is_cold(g) {
                // No block: a cold key's entries all go home.
                *e = 0;
            }
        }
        self.make_room(per_key.iter().filter(|&&e| e >= BLOCK_MIN_ENTRIES).count());
        if n == 1 && per_key[0] >= BLOCK_MIN_ENTRIES {
            // One key (a hot one): its block's routes, by bucket, give the places.
            let start = self.block(prefix(0), j);
            let block = &mut self.routes[start..start + self.buckets as usize];
            let (key_hash, prefix) = (&self.key_hash, prefix(0));
            // The key is spread (a cold key's entries take no block): its places by worker.
            let base = places.base[0];
            at.extend(buckets.iter().map(|&b| {
                // A bucket is in `0..buckets`: a DISTINCT value is never NULL.
                let r = &mut block[b as usize];
                if *r == NO_ROUTE {
                    *r = kg.worker_of_hash(key_hash.hash(prefix, Some((j, b)))) as u16;
                }
                base + u32::from(*r)
            }));
            return;
        }
        let mut block_of = vec![usize::MAX; n];
        for (&g, &b) in groups.iter().zip(buckets) {
            let gi = g as usize;
            let w = if is_cold(gi) {
                places.home[gi]
            } else if per_key[gi] < BLOCK_MIN_ENTRIES {
                kg.worker_of_hash(self.key_hash.hash(prefix(g), Some((j, b))))
            } else {
                if block_of[gi] == usize::MAX {
                    block_of[gi] = self.block(prefix(g), j);
                }
                let r = &mut self.routes[block_of[gi] + b as usize];
                if *r == NO_ROUTE {
                    *r = kg.worker_of_hash(self.key_hash.hash(prefix(g), Some((j, b)))) as u16;
                }
                usize::from(*r)
            };
            at.push(places.of(gi, w));
        }
    }

    /// Where the block of routes of the key hashing to `prefix` (None without key columns)
    /// with bucket column `j` set starts in `routes`, made if new.
    fn block(&mut self, prefix: Option<u64>, j: usize) -> usize {
        if let Some(&start) = self.blocks.get(&(prefix, j)) {
            return start;
        }
        let width = self.buckets as usize;
        let start = self.routes.len();
        self.routes.resize(start + width, NO_ROUTE);
        self.blocks.insert((prefix, j), start);
        start
    }
}

/// The places of a flush's rows and DISTINCT entries, numbered key by key: a cold key has one,
/// on its home worker (where its entries, its rows that made none and its plain state go); any
/// other key one per worker, where its entries' buckets route them. Only the places that get
/// something become output rows, so a flush costs in its keys and entries, not in its keys
/// times the workers.
struct Places {
    /// Each key's first place.
    base: Vec<u32>,
    /// Each key's home worker.
    home: Vec<usize>,
    /// Whether a key's entries go by their buckets (it is not cold).
    spread: Vec<bool>,
    /// The workers: a spread key's places.
    workers: usize,
    /// The places in all.
    len: usize,
}

impl Places {
    /// The places of keys whose home workers are `home`, those that `cold` marks (where it is
    /// not empty) cold, over `workers` workers.
    ///
    /// # Errors
    /// More places than `u32` numbers.
    fn new(home: Vec<usize>, cold: &[bool], workers: usize) -> Result<Self> {
        let spread: Vec<bool> = (0..home.len())
            .map(|g| !cold.get(g).copied().unwrap_or(false))
            .collect();
        let mut base = Vec::with_capacity(home.len());
        let mut len = 0usize;
        for &s in &spread {
            // Each base is below `len`, checked once at the end.
            base.push(len as u32);
            len += if s { workers } else { 1 };
        }
        if u32::try_from(len).is_err() {
            return Err(Error::internal(
                "a flush of more (key, worker) places than u32 holds",
            ));
        }
        Ok(Self {
            base,
            home,
            spread,
            workers,
            len,
        })
    }

    /// The place of key `g` on worker `w` (a cold key's only place, whatever `w`).
    fn of(&self, g: usize, w: usize) -> u32 {
        self.base[g] + if self.spread[g] { w as u32 } else { 0 }
    }

    /// The place of key `g` on its home worker.
    fn home_of(&self, g: usize) -> u32 {
        self.of(g, self.home[g])
    }

    /// Key `g`'s places, each with its worker.
    fn of_key(&self, g: usize) -> impl Iterator<Item = (usize, u32)> {
        let (first, count) = if self.spread[g] {
            (0, self.workers)
        } else {
            (self.home[g], 1)
        };
        let base = self.base[g];
        (0..count).map(move |i| (first + i, base + i as u32))
    }
}

impl LocalGroupAggregate {
    /// [`LocalGroupAggregate::flush_routed`] where the flush routes what was folded (see the
    /// module docs): one accumulator row per (key, worker) that gets anything, in worker
    /// order, then key order.
    pub(super) fn flush_entry_routed(&mut self, kg: &KeyGroups) -> Result<Option<RoutedFlush>> {
        let n = self.len();
        let rows = self.rows_per_group();
        if rows.iter().all(|&r| r == 0) {
            return Ok(None);
        }
        let Some(routes) = &mut self.entry_routes else {
            return Err(Error::internal("a flush by entry routes without them"));
        };
        let start = Instant::now();
        let p = kg.workers();
        let key_hashes = self.groups.hashes();
        let prefixes: Vec<Option<u64>> = (0..n)
            .map(|g| (self.state_keys > 0).then(|| key_hashes[g]))
            .collect();
        // The worker of each key's rows without a bucket (the keys alone's set, NULLs).
        let home: Vec<usize> = prefixes
            .iter()
            .map(|&prefix| kg.worker_of_hash(routes.key_hash.hash(prefix, None)))
            .collect();
        // The keys whose entries stay home with their rows (none where every key is hot).
        let cold: Vec<bool> = match &routes.hot {
            Some(hot) => prefixes.iter().map(|&p| !hot.is_hot(p)).collect(),
            None => vec![],
        };
        let places = Places::new(home, &cold, p)?;
        // Each DISTINCT entry's place ([`Places`]), and the entries of each place.
        let live = self.state.live_entries()?;
        let mut entries = vec![0u64; places.len];
        let mut at_places: Vec<Option<Vec<u32>>> = Vec::with_capacity(live.len());
        for (slot, entries_of) in live.iter().enumerate() {
            let Some(e) = entries_of else {
                at_places.push(None);
                continue;
            };
            let groups = &e.groups;
            let mut at: Vec<u32> = Vec::with_capacity(groups.len());
            match routes.slot_sets[slot] {
                Some(j) => {
                    let b = e.buckets(routes.buckets)?;
                    routes.place(groups, &b, j, &prefixes, &places, kg, &mut at);
                }
                None => at.extend(groups.iter().map(|&g| places.home_of(g as usize))),
            }
            count_ids(&at, &mut entries);
            at_places.push(Some(at));
        }
        // Rows per place: its entries, and at the key's home the rows that made none.
        let mut counts = entries;
        for g in 0..n {
            let made: u64 = places.of_key(g).map(|(_, at)| counts[at as usize]).sum();
            counts[places.home_of(g) as usize] += rows[g].saturating_sub(made);
        }
        // A plain slot's state travels in the key's row at its home, which the rows of a set
        // without DISTINCT calls give it (`BucketKeys::call_sets`); a key without one there
        // would lose that state.
        let plain_slots = live.iter().any(Option::is_none);
        if plain_slots && (0..n).any(|g| rows[g] > 0 && counts[places.home_of(g) as usize] == 0) {
            return Err(Error::internal(
                "a flush by entry routes found no row for a key's plain state",
            ));
        }
        // The hottest (key, worker)'s share of the rows, as a local phase routing every row
        // measures it: a hot key's rows spread over the workers by their buckets do not pin one
        // worker when the local phase steps aside (the adaptive local phase).
        let all: u64 = rows.iter().sum();
        let hot_share = counts.iter().copied().max().unwrap_or(0) as f64 / all.max(1) as f64;
        // The places that get anything are the output rows, worker by worker, then key by key.
        let mut by_worker: Vec<Vec<(u32, u32)>> = vec![vec![]; p];
        for g in 0..n {
            for (w, at) in places.of_key(g) {
                if counts[at as usize] > 0 {
                    by_worker[w].push((g as u32, at));
                }
            }
        }
        let mut row_of = vec![u32::MAX; places.len];
        let (mut groups, mut row_workers, mut row_places, mut bounds) =
            (vec![], vec![], vec![], vec![0]);
        for (w, rows_of) in by_worker.into_iter().enumerate() {
            for (g, at) in rows_of {
                row_of[at as usize] = groups.len() as u32;
                groups.push(g);
                row_workers.push(w);
                row_places.push(at);
            }
            bounds.push(groups.len());
        }
        let routing = start.elapsed();
        // Each entry's row: its place's, the place itself where places and rows are numbered
        // alike (one key, spread, every worker getting a row).
        let same = row_of.iter().enumerate().all(|(i, &r)| r as usize == i);
        let entry_rows: Vec<Option<Vec<u32>>> = if same {
            at_places
        } else {
            at_places
                .into_iter()
                .map(|at| Some(at?.iter().map(|&a| row_of[a as usize]).collect()))
                .collect()
        };
        // A plain slot's state is the key's at its home, an empty group's (group `n`) elsewhere.
        let empty = n as u32;
        let plain: Vec<u32> = groups
            .iter()
            .zip(&row_workers)
            .map(|(&g, &w)| {
                if w == places.home[g as usize] {
                    g
                } else {
                    empty
                }
            })
            .collect();
        self.state.grow_plain(n + 1)?;
        let row_counts: Vec<u64> = row_places.iter().map(|&at| counts[at as usize]).collect();
        let batch = self.accumulator_batch(
            self.groups.keys(&groups)?,
            self.state.state_placed(&plain, &live, &entry_rows)?,
            Arc::new(Int64Array::from_iter_values(
                row_counts.iter().map(|&c| c as i64),
            )),
        )?;
        let flush = Arc::new(Flushed {
            batch,
            hashes: groups.iter().map(|&g| key_hashes[g as usize]).collect(),
            hashed_keys: self.state_keys,
            rows: row_counts,
            local_ids: None,
        });
        let entries_out = self.state.distinct_entries() as u64;
        self.retained = false;
        self.forget_folded(n + 1);
        Ok(Some(RoutedFlush {
            parts: bounds
                .windows(2)
                .map(|w| FlushedPart::new(Arc::clone(&flush), w[0]..w[1]))
                .collect(),
            hot_share,
            routing,
            entries: entries_out,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cold key has one place, on its home worker, whatever worker is asked; any other key one
    /// per worker; the places are numbered key by key without gaps.
    #[test]
    fn cold_keys_have_one_place_and_the_others_one_per_worker() {
        let places = Places::new(vec![2, 0, 1], &[false, true, false], 3).unwrap();
        assert_eq!(places.len, 3 + 1 + 3);
        assert_eq!(
            (0..3).map(|w| places.of(0, w)).collect::<Vec<_>>(),
            [0, 1, 2]
        );
        assert_eq!(
            (0..3).map(|w| places.of(1, w)).collect::<Vec<_>>(),
            [3, 3, 3]
        );
        assert_eq!(
            (0..3).map(|w| places.of(2, w)).collect::<Vec<_>>(),
            [4, 5, 6]
        );
        assert_eq!(
            (0..3).map(|g| places.home_of(g)).collect::<Vec<_>>(),
            [2, 3, 5]
        );
        assert_eq!(places.of_key(1).collect::<Vec<_>>(), [(0, 3)]);
        assert_eq!(
            places.of_key(2).collect::<Vec<_>>(),
            [(0, 4), (1, 5), (2, 6)]
        );
        // Without cold keys (every key spread), each key has a place per worker.
        let all = Places::new(vec![1, 1], &[], 2).unwrap();
        assert_eq!(all.len, 4);
        assert_eq!(all.home_of(1), 3);
    }
}
