//! `LocalGroupAggregate`: the stateless first phase of local-global aggregation.
//!
//! It folds the rows of one mini-batch slice into one accumulator row per key and emits them as
//! an insert-only Arrow batch, retractions included (counts may go negative), exactly as Flink's
//! `MiniBatchLocalGroupAggFunction`. A [`GroupAggregate`](crate::GroupAggregate) built with
//! [`GroupAggregate::try_new_global`](crate::GroupAggregate::try_new_global) merges such batches and emits the changelog.
//!
//! # The accumulator batch
//! One row per key of the slice: the group key columns (as in the query), then each aggregate's
//! state columns, named as Flink names accumulators (`sum$1`, `count$2`, `value$3` for MIN/MAX
//! over insert-only input, a `List<Struct<value, count>>` for MIN/MAX with retraction, and
//! `distinct$0` — a `List<Struct<value, count0, …>>` — shared by the DISTINCT calls on one
//! argument), then `count1$N` (N: the number of accumulator fields before it), the signed number
//! of input rows (Int64, never NULL). It is an ordinary record batch: Arrow IPC carries it to a
//! global phase elsewhere.

use std::sync::Arc;

use arrow::array::{ArrayRef, Int64Array, RecordBatch};
use arrow::datatypes::DataType;
use arrow::datatypes::SchemaRef;
use tally_kernels::accumulate::{Lanes, count_rows};
use tally_kernels::group_values::{BucketRoutes, GroupValues, new_group_values, same_array};

use crate::changelog::ChangeBatch;
use crate::error::{Error, Result};
use crate::operator::accumulators::Accumulators;
use crate::operator::key_groups::KeyGroups;
use crate::operator::keyed::{accumulator_schema, hash_keys, intern_hashed, key_table};
use crate::operator::local_ids::KeyTableId;
use crate::operator::owners::Owners;
use crate::plan::{AggregatePlan, CalcBatch};
use entry_routes::EntryRoutes;

mod entry_routes;
mod flush;

pub use flush::RETAINED_KEYS;
pub(crate) use flush::{FlushedPart, RetiredFlushes};

/// The local phase: folds rows into accumulator rows, one per key, and forgets them on flush.
#[derive(Debug)]
pub struct LocalGroupAggregate {
    plan: Arc<AggregatePlan>,
    groups: Box<dyn GroupValues>,
    state: Accumulators,
    count1: Vec<i64>,
    schema: SchemaRef,
    hashes: Vec<u64>,
    gids: Vec<u32>,
    /// Per group: the input rows it received since the last flush, kept only once a row
    /// retracted (until then they are `count1`, which counts the same rows).
    group_rows: Vec<u64>,
    /// Whether `count1` no longer counts the rows folded since the last flush (a retracting
    /// row or a delta row was folded): `group_rows` does.
    retracted: bool,
    /// The state column of a COUNT(*) without FILTER, which is `count1` (counted once, not
    /// twice: [`Accumulators::count_rows_elsewhere`]).
    count_star_column: Option<usize>,
    /// Lane copies of `count1` for counting into few groups.
    count_lanes: Lanes<i64>,
    /// How many of the plan's keys the groups are keyed by: all of them, or a split PARTIAL's
    /// keys before the buckets ([`LocalGroupAggregate::merge_buckets`]).
    state_keys: usize,
    /// Where a split PARTIAL's rows fold by key and worker on several workers: the (key,
    /// worker) slots, the local groups then (`groups` is not used).
    owners: Option<Owners>,
    /// Where a split PARTIAL's rows fold by key on several workers and a flush routes what was
    /// folded ([`entry_routes`]): the routes (`groups` holds the query's keys, `owners` is
    /// None).
    entry_routes: Option<EntryRoutes>,
    /// Where a split PARTIAL's rows fold by key on one worker: the key columns interned last
    /// since the flush, whose ids `gids` holds (`None` after a flush).
    last_keys: Option<Vec<ArrayRef>>,
    /// Whether the key table still holds keys of earlier mini-batches ([`RETAINED_KEYS`]):
    /// then the groups folded since the last flush are those with rows.
    retained: bool,
    /// The key table's identity, fresh each time it starts afresh: the ids a flush sends with
    /// a retained table's keys are ids in this table ([`crate::operator::local_ids`]).
    table: KeyTableId,
}

impl LocalGroupAggregate {
    /// A local phase for `plan`.
    ///
    /// # Errors
    /// When an accumulator cannot be built.
    pub fn try_new(plan: Arc<AggregatePlan>) -> Result<Self> {
        let mut state = Accumulators::try_new(&plan)?;
        let schema = accumulator_schema(&plan, &state);
        let count_star_column = state.count_rows_elsewhere();
        state.for_local_phase();
        let groups = key_table(&plan)?;
        Ok(Self {
            groups,
            state,
            count1: vec![],
            schema,
            hashes: vec![],
            gids: vec![],
            group_rows: vec![],
            retracted: false,
            count_star_column,
            count_lanes: Lanes::default(),
            state_keys: plan.key_types.len(),
            owners: None,
            entry_routes: None,
            last_keys: None,
            retained: false,
            table: KeyTableId::fresh(),
            plan,
        })
    }

    /// Folds a split PARTIAL's rows by the query's keys and the worker their buckets route
    /// them to (`Some` of the PARTIAL's key groups), or by every key again (`None`). For a
    /// PARTIAL whose workers' state merges its buckets (`KeyedState::merge_buckets`): the rows
    /// of a key bound for one worker, whatever their buckets and group sets, fold into one
    /// accumulator row instead of one per (set, bucket) ([`crate::operator::owners`]; with one
    /// worker, one row per key). Where its calls allow, the rows of a key fold into one group
    /// whatever their workers, and the flush routes each DISTINCT entry by its value's bucket
    /// ([`entry_routes`]): no route is looked up per row. Its rows carry NULL buckets. Keys
    /// whose buckets the bucketed table cannot take keep folding by every key on several
    /// workers. Nothing may be folded.
    ///
    /// # Errors
    /// Rows folded since the last flush; a key type that cannot be a key (a bug).
    pub(crate) fn merge_buckets(&mut self, key_groups: Option<&KeyGroups>) -> Result<()> {
        let all = self.plan.key_types.len();
        let (state_keys, owners, entry_routes) = match (key_groups, &self.plan.bucket_keys) {
            (Some(kg), Some(b)) if b.columns <= all => {
                let query_keys = all - b.columns;
                let int32 = self.plan.key_types[query_keys..]
                    .iter()
                    .all(|t| t == &DataType::Int32);
                if kg.workers() == 1 {
                    (query_keys, None, None)
                } else if let Some(routes) = int32
                    .then(|| {
                        EntryRoutes::try_new(
                            &self.plan,
                            b,
                            &self.state,
                            self.count_star_column,
                            kg.workers(),
                        )
                    })
                    .flatten()
                {
                    // On several workers, where what was folded routes by value: one group per
                    // key, routed at the flush.
                    (query_keys, None, Some(routes))
                } else if let Some(owners) = int32
                    .then(|| {
                        let routes = BucketRoutes::try_new(
                            &self.plan.key_types[..query_keys],
                            b.columns,
                            b.buckets,
                        );
                        routes
                            .ok()
                            .and_then(|r| Owners::try_new(kg.clone(), r).ok())
                    })
                    .flatten()
                {
                    // On several workers: (key, worker) slots over the bucketed keys' routes.
                    (query_keys, Some(owners), None)
                } else {
                    (all, None, None)
                }
            }
            _ => (all, None, None),
        };
        if state_keys == self.state_keys
            && owners.is_none()
            && self.owners.is_none()
            && entry_routes.is_some() == self.entry_routes.is_some()
        {
            return Ok(());
        }
        if self.keys() > 0 {
            return Err(Error::internal(
                "a local phase changed its keys with rows folded",
            ));
        }
        self.retained = false;
        self.table = KeyTableId::fresh();
        self.groups = if state_keys == all || owners.is_some() {
            key_table(&self.plan)?
        } else {
            new_group_values(&self.plan.key_types[..state_keys])
                .map_err(|e| Error::plan(format!("group keys: {e}")))?
        };
        self.state_keys = state_keys;
        self.owners = owners;
        self.entry_routes = entry_routes;
        self.last_keys = None;
        Ok(())
    }

    /// Takes `plan` (the same query, with other hot keys: [`AggregatePlan::with_hot_keys`])
    /// in place of its own, between flushes.
    ///
    /// # Errors
    /// Rows folded since the last flush (a bug: the caller checks).
    pub(crate) fn replace_plan(&mut self, plan: Arc<AggregatePlan>) -> Result<()> {
        if self.keys() > 0 {
            return Err(Error::internal(
                "a local phase changed its plan with rows folded",
            ));
        }
        self.plan = plan;
        Ok(())
    }

    /// Whether it folds a split PARTIAL's rows by the query's keys, whatever their buckets
    /// ([`LocalGroupAggregate::merge_buckets`]).
    pub(crate) fn merges_buckets(&self) -> bool {
        self.state_keys < self.plan.key_types.len()
    }

    /// Whether it folds a split PARTIAL's rows by the query's keys on several workers and routes
    /// each DISTINCT entry when it flushes ([`entry_routes`]).
    pub(crate) fn routes_at_flush(&self) -> bool {
        self.entry_routes.is_some()
    }

    /// Local groups in the key table: keys, or (key, worker) slots (with [`RETAINED_KEYS`],
    /// some of them from earlier mini-batches).
    fn len(&self) -> usize {
        self.owners
            .as_ref()
            .map_or_else(|| self.groups.len(), Owners::len)
    }

    /// The schema of the accumulator batches [`LocalGroupAggregate::flush`] emits.
    pub fn accumulator_schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    /// For each aggregate call in output order, the names of its accumulator columns in
    /// [`LocalGroupAggregate::accumulator_schema`].
    pub fn accumulator_names(&self) -> Vec<Vec<String>> {
        self.state.call_state_names()
    }

    /// Folds one record batch of the plan's record schema (its changelog column, if any, read
    /// as row kinds) into the accumulators.
    ///
    /// # Errors
    /// As [`LocalGroupAggregate::push_changes`]; a batch of another schema.
    pub fn push(&mut self, batch: &RecordBatch) -> Result<()> {
        let changes = self.plan.to_changes(batch)?;
        self.push_changes(&changes)
    }

    /// Folds one batch of changes into the accumulators.
    ///
    /// # Errors
    /// Rows of another schema, bad row kinds, an expression failing on the data.
    pub fn push_changes(&mut self, changes: &ChangeBatch) -> Result<()> {
        self.plan.check_input(changes)?;
        let n = changes.num_rows();
        if n == 0 {
            return Ok(());
        }
        let mut cb = self.plan.calc.evaluate(changes)?;
        // A split's cold keys go with the key alone; the query keys' hashes, where that looked
        // them up, are the groups' where they merge the buckets, and go on to the bucket
        // columns otherwise: no key is hashed twice.
        match self.plan.leave_cold(&mut cb)? {
            Some(prefix) => {
                let mut hashes = vec![];
                self.plan
                    .hash_from_lookup(prefix, &cb, self.state_keys, &mut hashes)?;
                self.intern_keys(&cb, &hashes, self.state_keys)?
            }
            None => self.intern(&cb)?,
        }
        self.fold_interned(&cb, 1)
    }

    /// Interns the keys of evaluated rows into `gids`, hashing them first unless the key table
    /// hashes the keys it keeps itself.
    fn intern(&mut self, cb: &CalcBatch) -> Result<()> {
        self.intern_keys(cb, &[], 0)
    }

    /// Interns the keys of evaluated rows into `gids`: with `hashes` (over the first `hashed`
    /// keys) where given and over the keys the groups are keyed by, otherwise hashing those,
    /// unless the key table hashes them itself.
    fn intern_keys(&mut self, cb: &CalcBatch, hashes: &[u64], hashed: usize) -> Result<()> {
        let keys = &cb.keys[..self.state_keys];
        if let Some(owners) = &mut self.owners {
            return owners.intern(&cb.keys, &mut self.gids);
        }
        if self.merges_buckets() {
            // An Expand's sets of one chunk share its key arrays: their rows' ids are those of
            // the set interned last, still in `gids`.
            let same = self.last_keys.as_ref().is_some_and(|last| {
                last.len() == keys.len()
                    && self.gids.len() == cb.num_rows
                    && last.iter().zip(keys).all(|(a, b)| same_array(a, b))
            });
            if same {
                return Ok(());
            }
            self.last_keys = Some(keys.to_vec());
        }
        let hashes: &[u64] = if hashes.len() == cb.num_rows && self.state_keys == hashed {
            hashes
        } else if self.groups.hashes_keys_itself() && !keys.is_empty() {
            &[]
        } else {
            hash_keys(keys, cb.num_rows, &mut self.hashes)?;
            &self.hashes
        };
        intern_hashed(self.groups.as_mut(), keys, hashes, &mut self.gids)
    }

    /// Folds delta rows ([`crate::operator::deltas`]): `rows` (insert-only, of the plan's input
    /// schema) each accumulated as they are, and `keys_delta[r]`, the change in live keys row
    /// `r` stands for, added to its key's record count.
    ///
    /// # Errors
    /// As [`LocalGroupAggregate::push_changes`]; a `keys_delta` of another length.
    pub(crate) fn push_deltas(&mut self, rows: &ChangeBatch, keys_delta: &[i64]) -> Result<()> {
        let n = self.check_delta_rows(rows, keys_delta)?;
        if n == 0 {
            return Ok(());
        }
        let cb = self.plan.evaluate(rows)?;
        self.intern(&cb)?;
        let total = self.len();
        self.count1.resize(total, 0);
        self.count_rows_apart(total);
        for (&g, &d) in self.gids.iter().zip(keys_delta) {
            self.count1[g as usize] += d;
            self.group_rows[g as usize] += 1;
        }
        self.state.apply(&cb, &self.gids, None, None, total)
    }

    /// The number of delta rows in `rows`, checked: rows of the plan's input, all inserts, and
    /// one change in live keys each in `keys_delta`.
    fn check_delta_rows(&self, rows: &ChangeBatch, keys_delta: &[i64]) -> Result<usize> {
        self.plan.check_input(rows)?;
        let n = rows.num_rows();
        if keys_delta.len() != n || rows.op.is_some() {
            return Err(Error::internal(
                "delta rows: one insert and one change in live keys per row",
            ));
        }
        Ok(n)
    }

    /// The accumulator batch of delta rows whose keys are each a row's own: a firing of a
    /// PARTIAL that holds one group per FINAL key. Each row becomes an accumulator row (its
    /// record count `keys_delta[r]`) with its key columns as they are, without a key table. A
    /// key that does come twice makes two rows, which a global phase merges as it would their
    /// sum. None for no rows. Nothing may be folded.
    ///
    /// # Errors
    /// As [`LocalGroupAggregate::push_deltas`]; rows folded before.
    pub(crate) fn deltas_as_groups(
        &mut self,
        rows: &ChangeBatch,
        keys_delta: &[i64],
    ) -> Result<Option<RecordBatch>> {
        let n = self.check_delta_rows(rows, keys_delta)?;
        if self.len() > 0 || self.owners.is_some() || self.state_keys != self.plan.key_types.len() {
            return Err(Error::internal(
                "delta rows taken as groups by a local phase that holds groups",
            ));
        }
        if n == 0 {
            return Ok(None);
        }
        let cb = self.plan.evaluate(rows)?;
        let groups: Vec<u32> = (0..n as u32).collect();
        self.state.apply(&cb, &groups, None, None, n)?;
        let batch = self.accumulator_batch(
            cb.keys.clone(),
            self.state.state(&groups)?,
            Arc::new(Int64Array::from(keys_delta.to_vec())),
        )?;
        // The accumulators start afresh, in the same allocations.
        self.state.clear(n);
        Ok(Some(batch))
    }

    /// From now until the flush, counts each group's rows in `group_rows` (of `total` groups),
    /// apart from `count1`, which they no longer equal.
    fn count_rows_apart(&mut self, total: usize) {
        if !self.retracted {
            // Until now `count1` counted the rows: each group's rows are its count.
            self.group_rows.clear();
            self.group_rows
                .extend(self.count1.iter().map(|&c| c as u64));
            self.retracted = true;
        }
        self.group_rows.resize(total, 0);
    }

    /// Whether [`LocalGroupAggregate::push_evaluated`] may be given rows without their key
    /// hashes (its key table hashes the keys it keeps itself).
    pub(crate) fn hashes_keys_itself(&self) -> bool {
        self.groups.hashes_keys_itself() || self.merges_buckets()
    }

    /// Folds rows already evaluated and hashed (`hashes[r]` is row `r`'s key hash; none at
    /// all where [`LocalGroupAggregate::hashes_keys_itself`]).
    pub(crate) fn push_evaluated(&mut self, cb: &CalcBatch, hashes: &[u64]) -> Result<()> {
        if cb.num_rows == 0 {
            return Ok(());
        }
        self.intern_keys(cb, hashes, cb.keys.len())?;
        self.fold_interned(cb, 1)
    }

    /// Folds an Expand's `sets` group sets of the same rows evaluated as one batch
    /// ([`crate::plan::Calc::evaluate_sets`]), each row counted once per set (as the sets'
    /// batches would be), where it routes what it folds when it flushes
    /// ([`LocalGroupAggregate::routes_at_flush`]: its groups are the query's keys, whatever the
    /// rows' sets and buckets, and its input is insert-only).
    ///
    /// # Errors
    /// A local phase that does not route at the flush, retracting rows (bugs); as
    /// [`LocalGroupAggregate::push_evaluated`].
    pub(crate) fn push_sets_evaluated(&mut self, cb: &CalcBatch, sets: usize) -> Result<()> {
        if self.entry_routes.is_none() || cb.retract.is_some() {
            return Err(Error::internal(
                "group sets folded as one batch by a local phase that routes rows",
            ));
        }
        if cb.num_rows == 0 {
            return Ok(());
        }
        self.intern_keys(cb, &[], 0)?;
        self.fold_interned(cb, i64::try_from(sets).unwrap_or(i64::MAX))
    }

    /// Folds evaluated rows whose groups are in `gids`, each insert-only row counted `weight`
    /// times in the record count (a retracting batch's rows once).
    fn fold_interned(&mut self, cb: &CalcBatch, weight: i64) -> Result<()> {
        let total = self.len();
        self.count1.resize(total, 0);
        match &cb.retract {
            Some(retract) if retract.count_set_bits() > 0 => {
                self.count_rows_apart(total);
                for (r, &g) in self.gids.iter().enumerate() {
                    self.count1[g as usize] += if retract.value(r) { -1 } else { 1 };
                    self.group_rows[g as usize] += 1;
                }
                let acc = !retract;
                self.state
                    .apply(cb, &self.gids, Some(&acc), Some(retract), total)?;
            }
            _ => {
                count_rows(
                    &self.gids,
                    None,
                    None,
                    &mut self.count1,
                    weight,
                    &mut self.count_lanes,
                );
                if self.retracted {
                    self.group_rows.resize(total, 0);
                    for &g in &self.gids {
                        self.group_rows[g as usize] += weight.unsigned_abs();
                    }
                }
                self.state.apply(cb, &self.gids, None, None, total)?;
            }
        }
        Ok(())
    }

    /// Keys folded since the last flush.
    pub fn keys(&self) -> usize {
        if self.retained {
            self.folded_keys()
        } else {
            self.len()
        }
    }

    /// Bytes held by the keys (those folded since the last flush, and those it retained) and
    /// their accumulators.
    pub fn size(&self) -> usize {
        self.groups.size()
            + self.owners.as_ref().map_or(0, Owners::size)
            + self.state.size()
            + (self.count1.capacity() + self.group_rows.capacity()) * 8
    }
}

#[cfg(test)]
mod tests;
