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
use std::time::{Duration, Instant};

use arrow::array::{ArrayRef, Int64Array, RecordBatch};
use arrow::datatypes::DataType;
use arrow::datatypes::SchemaRef;
use tally_kernels::accumulate::{Lanes, count_rows};
use tally_kernels::group_values::{BucketRoutes, GroupValues, new_group_values, same_array};

use crate::changelog::ChangeBatch;
use crate::error::{Error, Result};
use crate::operator::accumulators::Accumulators;
use crate::operator::exchange::partition;
use crate::operator::key_groups::KeyGroups;
use crate::operator::keyed::{accumulator_schema, hash_keys, intern_hashed, key_table};
use crate::operator::owners::Owners;
use crate::plan::{AggregatePlan, CalcBatch};

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
    /// Where a split PARTIAL's rows fold by key on one worker: the key columns interned last
    /// since the flush, whose ids `gids` holds (`None` after a flush).
    last_keys: Option<Vec<ArrayRef>>,
    /// Whether the key table still holds keys of earlier mini-batches ([`RETAINED_KEYS`]):
    /// then the groups folded since the last flush are those with rows.
    retained: bool,
}

/// The most keys a local phase keeps in its key table across a flush (their accumulators
/// reset), so that the next mini-batch finds them again instead of interning them afresh (a
/// dictionary's values, for one, each hashed and inserted again): a flush then sends only the
/// groups that got rows. A larger table is cleared, as the local phase keeps no state; so is
/// one of which the mini-batch flushed fewer than half the keys (they do not come back), and
/// one with DISTINCT accumulators (whose lists are built fastest for every group of the
/// table).
pub const RETAINED_KEYS: usize = 4096;

/// A flushed accumulator batch with, per row, its key's hash and the input rows it folds.
#[derive(Debug)]
pub(crate) struct Flushed {
    pub(crate) batch: RecordBatch,
    pub(crate) hashes: Vec<u64>,
    /// How many of the first key columns `hashes` are over: all of them, or a split
    /// PARTIAL's keys before the buckets where the local phase merged them
    /// ([`LocalGroupAggregate::merge_buckets`]).
    pub(crate) hashed_keys: usize,
    pub(crate) rows: Vec<u64>,
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
            last_keys: None,
            retained: false,
            plan,
        })
    }

    /// Folds a split PARTIAL's rows by the query's keys and the worker their buckets route
    /// them to (`Some` of the PARTIAL's key groups), or by every key again (`None`). For a
    /// PARTIAL whose workers' state merges its buckets (`KeyedState::merge_buckets`): the rows
    /// of a key bound for one worker, whatever their buckets and group sets, fold into one
    /// accumulator row instead of one per (set, bucket) ([`crate::operator::owners`]; with one
    /// worker, one row per key). Its rows carry NULL buckets. Keys whose buckets the bucketed
    /// table cannot take keep folding by every key on several workers. Nothing may be folded.
    ///
    /// # Errors
    /// Rows folded since the last flush; a key type that cannot be a key (a bug).
    pub(crate) fn merge_buckets(&mut self, key_groups: Option<&KeyGroups>) -> Result<()> {
        let all = self.plan.key_types.len();
        let (state_keys, owners) = match (key_groups, self.plan.bucket_keys) {
            (Some(kg), Some(b)) if b.columns <= all => {
                let query_keys = all - b.columns;
                let int32 = self.plan.key_types[query_keys..]
                    .iter()
                    .all(|t| t == &DataType::Int32);
                if kg.workers() == 1 {
                    (query_keys, None)
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
                    (query_keys, Some(owners))
                } else {
                    (all, None)
                }
            }
            _ => (all, None),
        };
        if state_keys == self.state_keys && owners.is_none() && self.owners.is_none() {
            return Ok(());
        }
        if self.keys() > 0 {
            return Err(Error::internal(
                "a local phase changed its keys with rows folded",
            ));
        }
        self.retained = false;
        self.groups = if state_keys == all || owners.is_some() {
            key_table(&self.plan)?
        } else {
            new_group_values(&self.plan.key_types[..state_keys])
                .map_err(|e| Error::plan(format!("group keys: {e}")))?
        };
        self.state_keys = state_keys;
        self.owners = owners;
        self.last_keys = None;
        Ok(())
    }

    /// Whether it folds a split PARTIAL's rows by the query's keys, whatever their buckets
    /// ([`LocalGroupAggregate::merge_buckets`]).
    pub(crate) fn merges_buckets(&self) -> bool {
        self.state_keys < self.plan.key_types.len()
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
        let cb = self.plan.calc.evaluate(changes)?;
        self.intern(&cb)?;
        self.fold_interned(&cb)
    }

    /// Interns the keys of evaluated rows into `gids`, hashing them first unless the key table
    /// hashes the keys it keeps itself.
    fn intern(&mut self, cb: &CalcBatch) -> Result<()> {
        self.intern_keys(cb, &[])
    }

    /// Interns the keys of evaluated rows into `gids`: with `hashes` (over every key) where
    /// given, otherwise hashing the keys the groups are keyed by, unless the key table hashes
    /// them itself.
    fn intern_keys(&mut self, cb: &CalcBatch, hashes: &[u64]) -> Result<()> {
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
        let hashes: &[u64] = if !hashes.is_empty() && self.state_keys == cb.keys.len() {
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
        self.plan.check_input(rows)?;
        let n = rows.num_rows();
        if keys_delta.len() != n || rows.op.is_some() {
            return Err(Error::internal(
                "delta rows: one insert and one change in live keys per row",
            ));
        }
        if n == 0 {
            return Ok(());
        }
        let cb = self.plan.calc.evaluate(rows)?;
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
        self.intern_keys(cb, hashes)?;
        self.fold_interned(cb)
    }

    /// Folds evaluated rows whose groups are in `gids`.
    fn fold_interned(&mut self, cb: &CalcBatch) -> Result<()> {
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
                    1,
                    &mut self.count_lanes,
                );
                if self.retracted {
                    self.group_rows.resize(total, 0);
                    for &g in &self.gids {
                        self.group_rows[g as usize] += 1;
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
            self.rows_per_group().iter().filter(|&&r| r > 0).count()
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

    /// Emits one accumulator row per key folded since the last flush (None if there was none)
    /// and starts afresh.
    ///
    /// # Errors
    /// When the state cannot be represented (a bug).
    pub fn flush(&mut self) -> Result<Option<RecordBatch>> {
        Ok(self.flush_parts()?.map(|f| f.batch))
    }

    /// [`LocalGroupAggregate::flush`] cut by key group, for a host that routes by key group
    /// itself (Flink): one accumulator batch per key group of `key_groups` that holds keys, in
    /// key group order, each with its key group. Built once with its rows ordered by key group
    /// and sliced, from the hashes the local phase keeps (`LocalGroupAggregate::flush_routed`
    /// with a worker per key group).
    ///
    /// # Errors
    /// As [`LocalGroupAggregate::flush`]; no key group, or too many.
    pub fn flush_by_key_group(&mut self, key_groups: usize) -> Result<Vec<(usize, RecordBatch)>> {
        let kg = KeyGroups::new(key_groups, key_groups)?;
        let Some(flushed) = self.flush_routed(&kg)? else {
            return Ok(vec![]);
        };
        Ok(flushed
            .parts
            .into_iter()
            .enumerate()
            .filter(|(_, p)| p.batch.num_rows() > 0)
            .map(|(g, p)| (g, p.batch))
            .collect())
    }

    /// [`LocalGroupAggregate::flush`], with each row's key hash and input row count.
    pub(crate) fn flush_parts(&mut self) -> Result<Option<Flushed>> {
        let n = self.len() as u32;
        let rows = self.rows_per_group();
        let parts = self.folded_only(vec![(0..n).collect()], &rows);
        Ok(self
            .flush_in_parts(parts, &rows)?
            .and_then(|parts| parts.into_iter().next()))
    }

    /// `parts` without the groups that got no rows since the last flush, where the key table
    /// retained keys of earlier mini-batches (otherwise every group got some).
    fn folded_only(&self, parts: Vec<Vec<u32>>, rows: &[u64]) -> Vec<Vec<u32>> {
        if !self.retained {
            return parts;
        }
        parts
            .into_iter()
            .map(|ids| ids.into_iter().filter(|&g| rows[g as usize] > 0).collect())
            .collect()
    }

    /// Flushes straight into one part per worker (the owner of each key's key group, in
    /// worker order; a part may be empty): the accumulator batch is built once with its rows
    /// ordered by worker and sliced, instead of built whole and gathered per worker. Also
    /// returns the hottest key's share of the rows folded. `None` when nothing was folded.
    ///
    /// # Errors
    /// As [`LocalGroupAggregate::flush`].
    pub(crate) fn flush_routed(&mut self, kg: &KeyGroups) -> Result<Option<RoutedFlush>> {
        let n = self.len();
        let rows = self.rows_per_group();
        if rows.iter().all(|&r| r == 0) {
            return Ok(None);
        }
        let top = rows.iter().copied().max().unwrap_or(0);
        let all: u64 = rows.iter().sum();
        let hot_share = top as f64 / all.max(1) as f64;
        let start = Instant::now();
        let parts = if kg.workers() == 1 {
            vec![(0..n as u32).collect()]
        } else if let Some(owners) = &self.owners {
            owners.parts()
        } else {
            partition(self.groups.hashes(), kg)
        };
        let parts = self.folded_only(parts, &rows);
        let routing = start.elapsed();
        let entries = self.state.distinct_entries() as u64;
        let parts = self.flush_in_parts(parts, &rows)?.unwrap_or_default();
        Ok(Some(RoutedFlush {
            parts,
            hot_share,
            routing,
            entries,
        }))
    }

    /// Each group's input rows since the last flush (0 for a retained key that got none).
    fn rows_per_group(&self) -> Vec<u64> {
        let n = self.len();
        let mut rows: Vec<u64> = if self.retracted {
            self.group_rows[..n].to_vec()
        } else {
            self.count1.iter().map(|&c| c as u64).collect()
        };
        rows.resize(n, 0);
        rows
    }

    /// Flushes the groups of each part (together, every group once) as one [`Flushed`] per
    /// part, from one accumulator batch whose rows run part after part, and starts afresh;
    /// `rows` are [`LocalGroupAggregate::rows_per_group`].
    fn flush_in_parts(
        &mut self,
        parts: Vec<Vec<u32>>,
        rows: &[u64],
    ) -> Result<Option<Vec<Flushed>>> {
        let n = self.len();
        let order: Vec<u32> = parts.concat();
        if order.is_empty() {
            return Ok(None);
        }
        // A (key, worker) slot's key and hash are its query key's.
        let key_hashes = self.groups.hashes();
        let hash_of = |g: u32| match &self.owners {
            Some(owners) => owners.key_hash(g),
            None => key_hashes[g as usize],
        };
        let mut cols: Vec<ArrayRef> = match &self.owners {
            Some(owners) => owners.key_columns(&order)?,
            None => self.groups.keys(&order)?,
        };
        for t in &self.plan.key_types[self.state_keys..] {
            cols.push(arrow::array::new_null_array(t, order.len()));
        }
        let keys = cols.len();
        cols.extend(self.state.state(&order)?);
        let count1: ArrayRef = Arc::new(Int64Array::from_iter_values(
            order.iter().map(|&g| self.count1[g as usize]),
        ));
        if let Some(c) = self.count_star_column {
            cols[keys + c] = Arc::clone(&count1);
        }
        cols.push(count1);
        let batch = RecordBatch::try_new(Arc::clone(&self.schema), cols)
            .map_err(|e| Error::internal(format!("accumulator batch: {e}")))?;
        let mut offset = 0;
        let flushed = parts
            .iter()
            .map(|ids| {
                let part = Flushed {
                    batch: batch.slice(offset, ids.len()),
                    hashes: ids.iter().map(|&g| hash_of(g)).collect(),
                    hashed_keys: self.state_keys,
                    rows: ids.iter().map(|&g| rows[g as usize]).collect(),
                };
                offset += ids.len();
                part
            })
            .collect();
        // A small plain key table keeps its keys (their accumulators reset below) while most
        // of them come back in each mini-batch; the others start from group 0 again.
        self.retained = n <= RETAINED_KEYS
            && 2 * order.len() >= n
            && self.owners.is_none()
            && !self.merges_buckets()
            && !self.state.has_distinct();
        if !self.retained {
            self.groups.clear();
        }
        if let Some(owners) = &mut self.owners {
            owners.clear();
        }
        self.last_keys = None;
        self.count1.clear();
        self.group_rows.clear();
        self.retracted = false;
        // Every group's accumulators start afresh, in the same allocations.
        self.state.clear(n);
        Ok(Some(flushed))
    }
}

/// A local phase's flush routed to the workers ([`LocalGroupAggregate::flush_routed`]).
#[derive(Debug)]
pub(crate) struct RoutedFlush {
    /// One part per worker, in worker order (possibly empty).
    pub(crate) parts: Vec<Flushed>,
    /// The hottest key's share of the rows folded (for the adaptive local phase).
    pub(crate) hot_share: f64,
    /// The time taken to assign the keys to the workers (the exchange's share of the flush).
    pub(crate) routing: Duration,
    /// The DISTINCT (group, value) entries the flush's lists hold.
    pub(crate) entries: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::StringArray;
    use arrow::datatypes::{DataType, Field, Schema};
    use datafusion_expr::col;

    /// The schema `(k BIGINT NOT NULL, v BIGINT)` and the plan of `aggregates` grouped by `k`.
    fn plan_by_k(aggregates: &[datafusion_expr::Expr]) -> (SchemaRef, Arc<AggregatePlan>) {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("v", DataType::Int64, true),
        ]));
        let plan =
            AggregatePlan::try_new(Arc::clone(&schema), &[col("k")], aggregates, None).unwrap();
        (schema, Arc::new(plan))
    }

    /// The input rows each flushed key folded: every row, accumulating or retracting, before
    /// and after the first retraction of a mini-batch and in the next one.
    #[test]
    fn a_flush_counts_each_keys_rows() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("op", DataType::Utf8, false),
        ]));
        let plan = AggregatePlan::try_new(
            Arc::clone(&schema),
            &[col("k")],
            &[crate::aggregates::count_star()],
            None,
        )
        .unwrap();
        let mut local = LocalGroupAggregate::try_new(Arc::new(plan)).unwrap();
        let batch = |keys: Vec<i64>, ops: Vec<&str>| {
            let cols: Vec<ArrayRef> = vec![
                Arc::new(Int64Array::from(keys)),
                Arc::new(StringArray::from(ops)),
            ];
            RecordBatch::try_new(Arc::clone(&schema), cols).unwrap()
        };
        let rows_of = |f: Flushed| -> Vec<u64> { f.rows };
        local
            .push(&batch(vec![1, 2, 1], vec!["+I", "+I", "+I"]))
            .unwrap();
        local.push(&batch(vec![1, 3], vec!["-D", "+I"])).unwrap();
        local.push(&batch(vec![2, 3], vec!["+I", "+I"])).unwrap();
        // Keys in first-seen order: 1, 2, 3.
        assert_eq!(
            rows_of(local.flush_parts().unwrap().unwrap()),
            vec![3, 2, 2]
        );
        local
            .push(&batch(vec![3, 3, 2], vec!["+I", "+I", "+I"]))
            .unwrap();
        // The key table kept its keys (in their first-seen order: 2, then 3).
        assert_eq!(rows_of(local.flush_parts().unwrap().unwrap()), vec![1, 2]);
        local.push(&batch(vec![2], vec!["-D"])).unwrap();
        assert_eq!(rows_of(local.flush_parts().unwrap().unwrap()), vec![1]);
    }

    /// A small key table keeps its keys across a flush, and a flush sends only the keys that
    /// got rows since the last one, their accumulators afresh; a table of which fewer than
    /// half the keys came back, or past [`RETAINED_KEYS`], is cleared.
    #[test]
    fn a_small_key_table_outlives_a_flush() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("v", DataType::Int64, false),
        ]));
        let plan = AggregatePlan::try_new(
            Arc::clone(&schema),
            &[col("k")],
            &[
                crate::aggregates::count_star(),
                crate::aggregates::sum(col("v")),
            ],
            None,
        )
        .unwrap();
        let mut local = LocalGroupAggregate::try_new(Arc::new(plan)).unwrap();
        let batch = |keys: Vec<i64>, values: Vec<i64>| {
            let cols: Vec<ArrayRef> = vec![
                Arc::new(Int64Array::from(keys)),
                Arc::new(Int64Array::from(values)),
            ];
            RecordBatch::try_new(Arc::clone(&schema), cols).unwrap()
        };
        let show = |b: &RecordBatch| {
            let keys = b.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
            let sums = b.column(2).as_any().downcast_ref::<Int64Array>().unwrap();
            (0..b.num_rows())
                .map(|r| (keys.value(r), sums.value(r)))
                .collect::<Vec<_>>()
        };
        local.push(&batch(vec![1, 2, 3], vec![10, 20, 30])).unwrap();
        assert_eq!(
            show(&local.flush().unwrap().unwrap()),
            [(1, 10), (2, 20), (3, 30)]
        );
        assert_eq!((local.len(), local.keys()), (3, 0));
        assert!(local.flush().unwrap().is_none());
        local.push(&batch(vec![3, 3], vec![5, 6])).unwrap();
        assert_eq!((local.len(), local.keys()), (3, 1));
        assert_eq!(show(&local.flush().unwrap().unwrap()), [(3, 11)]);
        // One key of three came back: the table is cleared.
        assert_eq!(local.len(), 0);
        let many: Vec<i64> = (0..=RETAINED_KEYS as i64).collect();
        local.push(&batch(many.clone(), many.clone())).unwrap();
        assert_eq!(local.flush().unwrap().unwrap().num_rows(), many.len());
        assert_eq!((local.len(), local.keys()), (0, 0));
    }

    /// A flush routed to the workers holds, part by part, exactly the rows of the whole flush
    /// whose keys' key groups the worker owns (keys, accumulators, counts, hashes and rows),
    /// DISTINCT lists included (built once for the groups in worker order).
    #[test]
    fn a_routed_flush_is_the_whole_flush_cut_by_worker() {
        use arrow::array::AsArray;
        use arrow::datatypes::Int64Type;
        use arrow::util::display::array_value_to_string;
        let (schema, plan) = plan_by_k(&[
            crate::aggregates::count_star(),
            crate::aggregates::sum(col("v")),
            {
                use datafusion_expr::ExprFunctionExt;
                crate::aggregates::count(col("v"))
                    .distinct()
                    .build()
                    .unwrap()
            },
        ]);
        let keys: Vec<i64> = (0..500).map(|i| (i * 7919) % 61).collect();
        let values: Vec<Option<i64>> = (0..500).map(|i| (i % 11 != 0).then_some(i % 13)).collect();
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![
                Arc::new(Int64Array::from(keys)),
                Arc::new(Int64Array::from(values)),
            ],
        )
        .unwrap();
        let rows_of = |f: &Flushed| -> Vec<String> {
            (0..f.batch.num_rows())
                .map(|r| {
                    let cols: Vec<String> = f
                        .batch
                        .columns()
                        .iter()
                        .map(|c| array_value_to_string(c, r).unwrap())
                        .collect();
                    format!("{} {} {}", cols.join(" "), f.hashes[r], f.rows[r])
                })
                .collect()
        };
        let mut whole = LocalGroupAggregate::try_new(Arc::clone(&plan)).unwrap();
        whole.push(&batch).unwrap();
        let whole = whole.flush_parts().unwrap().unwrap();
        let kg = KeyGroups::new(128, 3).unwrap();
        let mut local = LocalGroupAggregate::try_new(Arc::clone(&plan)).unwrap();
        for _ in 0..2 {
            local.push(&batch).unwrap();
            let routed = local.flush_routed(&kg).unwrap().unwrap();
            assert_eq!(routed.parts.len(), 3);
            let mut seen = 0;
            for (w, part) in routed.parts.iter().enumerate() {
                let want: Vec<String> = rows_of(&whole)
                    .into_iter()
                    .zip(&whole.hashes)
                    .filter(|(_, h)| kg.worker_of_hash(**h) == w)
                    .map(|(r, _)| r)
                    .collect();
                assert_eq!(rows_of(part), want, "worker {w}");
                seen += part.batch.num_rows();
            }
            assert_eq!(seen, whole.batch.num_rows());
            // The hottest key's share of the rows folded.
            let counts = whole.batch.column(whole.batch.num_columns() - 1);
            let counts = counts.as_primitive::<Int64Type>();
            let top = counts.values().iter().copied().max().unwrap();
            assert_eq!(routed.hot_share, top as f64 / 500.0);
        }
    }
}
