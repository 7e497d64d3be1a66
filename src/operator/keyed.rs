//! Keyed state: the group table (keys → dense group ids) and, per group, the accumulators,
//! whether the group has state, its hidden record count, its last write time (for a TTL) and
//! the input rows it received (for the hot keys); it reports its size from capacity. Its live
//! groups as snapshot rows (exported and imported for snapshots, restores and compaction) are
//! in `keyed/rows.rs`, a split PARTIAL's merged state cut into them in `keyed/cut.rs`.

use std::sync::Arc;

use arrow::array::ArrayRef;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use tally_kernels::accumulator::column_rows;
use tally_kernels::group_values::{
    BucketedGroupValues, GroupValues, MAX_BUCKET_COLUMNS, new_group_values,
};
use tally_kernels::hash::hash_columns;

mod cut;
mod rows;

use crate::error::{Error, Result};
use crate::operator::accumulators::Accumulators;
use crate::operator::key_groups::KeyGroups;
use crate::operator::local::FlushedPart;
use crate::operator::local_ids::KnownIds;
use crate::plan::AggregatePlan;

/// A snapshot's `$last_write_ms` for a group written without a TTL.
pub(crate) const UNSTAMPED: i64 = i64::MIN;

/// Hashes the rows of `keys` into `hashes` (`n` zeros when there are no keys): the one key hash
/// every operator computes, from which the key group of a row comes ([`KeyGroups::of_hash`]).
///
/// # Errors
/// A key column of a type that cannot be hashed.
///
/// [`KeyGroups::of_hash`]: crate::operator::key_groups::KeyGroups::of_hash
pub fn hash_keys(keys: &[ArrayRef], n: usize, hashes: &mut Vec<u64>) -> Result<()> {
    hash_columns(keys, hashes)?;
    if keys.is_empty() {
        hashes.resize(n, 0);
    }
    Ok(())
}

/// The first key column of the batch hashed last and its hashes, for [`hash_keys_reusing`].
pub(crate) type FirstKeyHashes = Option<(ArrayRef, Vec<u64>)>;

/// [`hash_keys`], taking the first key column's hashes from `memo` when it holds that very
/// array, and keeping them there otherwise: the batches of a split's group sets share their
/// first key column (the Expand passes the same array to each), so its values, often strings
/// (q15's day), are hashed once per input batch instead of once per set.
pub(crate) fn hash_keys_reusing(
    keys: &[ArrayRef],
    n: usize,
    memo: &mut FirstKeyHashes,
    hashes: &mut Vec<u64>,
) -> Result<()> {
    let [first, rest @ ..] = keys else {
        return hash_keys(keys, n, hashes);
    };
    if rest.is_empty() {
        return hash_keys(keys, n, hashes);
    }
    match memo {
        Some((array, known)) if Arc::ptr_eq(array, first) && known.len() == n => {
            tally_kernels::hash::hash_columns_after(known, rest, hashes)?;
        }
        _ => {
            // The memo's buffer is reused for the new column's hashes.
            let mut known = memo.take().map(|(_, known)| known).unwrap_or_default();
            hash_columns(std::slice::from_ref(first), &mut known)?;
            tally_kernels::hash::hash_columns_after(&known, rest, hashes)?;
            *memo = Some((Arc::clone(first), known));
        }
    }
    Ok(())
}

/// The key table of a local phase of `plan`: a split PARTIAL's, whose last keys are Int32
/// buckets, finds them by position ([`BucketedGroupValues`]); any other, the table its key
/// types call for. (A global phase keeps the latter: its rows come routed, so the bucketed
/// table's prefix is interned anew for each part, and under many prefixes, as in Nexmark q16,
/// most keys outgrow the blocks; callgrind, q16 split over 2M bids: 28.1 G instructions with
/// the packed table, 29.7 G with the bucketed one.)
///
/// # Errors
/// A key type that cannot be a key.
pub(crate) fn key_table(plan: &AggregatePlan) -> Result<Box<dyn GroupValues>> {
    let types = &plan.key_types;
    match &plan.bucket_keys {
        Some(b)
            if b.columns <= MAX_BUCKET_COLUMNS
                && b.columns <= types.len()
                && types[types.len() - b.columns..]
                    .iter()
                    .all(|t| t == &DataType::Int32) =>
        {
            let prefix = &types[..types.len() - b.columns];
            BucketedGroupValues::try_new(prefix, b.columns, b.buckets)
                .map(|t| Box::new(t) as Box<dyn GroupValues>)
        }
        _ => new_group_values(types),
    }
    .map_err(|e| Error::plan(format!("group keys: {e}")))
}

/// Interns the rows of `keys` whose hashes are `hashes` (a global aggregate, with no keys, puts
/// every row in group 0; `hashes` then holds one arbitrary value per row).
pub(crate) fn intern_hashed(
    groups: &mut dyn GroupValues,
    keys: &[ArrayRef],
    hashes: &[u64],
    gids: &mut Vec<u32>,
) -> Result<()> {
    groups.intern(keys, hashes, gids)?;
    Ok(())
}

/// The accumulator batch schema of `plan` (see [`crate::operator::local`]): the keys, every
/// call's accumulator columns, then `count1$N`, the signed number of input rows.
pub(crate) fn accumulator_schema(plan: &AggregatePlan, accs: &Accumulators) -> SchemaRef {
    let mut fields: Vec<Field> = plan
        .key_names
        .iter()
        .zip(&plan.key_types)
        .map(|(n, t)| Field::new(n, t.clone(), true))
        .collect();
    let state_fields = accs.state_fields();
    let count1 = format!("count1${}", state_fields.len());
    fields.extend(state_fields);
    fields.push(Field::new(count1, DataType::Int64, false));
    Arc::new(Schema::new(fields))
}

/// Each row's key hash of a firing, as [`hash_columns`] gives it over the firing's first `keys`
/// columns (the keys the firing worker's state is keyed by): what the state hashed when it
/// interned them, handed on so that a fold of the firing does not hash them again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyHashes {
    /// The key columns hashed: the firing's first.
    pub keys: usize,
    /// One hash per row of the firing.
    pub hashes: Vec<u64>,
}

/// The keyed state of one operator (see the module docs). A deleted or expired group keeps its
/// id, with reset accumulators, until the table is rebuilt without it ([`KeyedState::rebuilt`]).
#[derive(Debug)]
pub(crate) struct KeyedState {
    plan: Arc<AggregatePlan>,
    pub(crate) groups: Box<dyn GroupValues>,
    pub(crate) accs: Accumulators,
    /// Whether each group has state (Flink: `state(k) != null`).
    pub(crate) alive: Vec<bool>,
    /// The hidden record count per group (retraction input only).
    pub(crate) count1: Vec<i64>,
    /// The last write time of each group (with a TTL only).
    pub(crate) last_write: Vec<i64>,
    /// Input rows received per group (for the hot keys).
    pub(crate) key_rows: Vec<u64>,
    /// Groups with state.
    pub(crate) live: u64,
    ttl: bool,
    /// How many of the plan's keys key the state: all of them, or, where a split PARTIAL's
    /// state merges buckets ([`KeyedState::merge_buckets`]), the query's keys before the
    /// buckets.
    state_keys: usize,
    /// Scratch: the hashes of the state's keys where they are fewer than the plan's.
    state_hashes: Vec<u64>,
    /// The groups of local phases' key ids (forgotten with the group table: a rebuilt state is
    /// a new one).
    known: KnownIds,
    /// The key groups and the worker this state is, where it is one of several: a cut of
    /// state that merges buckets puts what no bucket locates on rows its worker owns
    /// ([`KeyedState::export_cut`]).
    owner: Option<(KeyGroups, usize)>,
}

impl KeyedState {
    /// Empty state for `plan`; `ttl`: whether groups keep their last write time.
    pub(crate) fn try_new(plan: Arc<AggregatePlan>, ttl: bool) -> Result<Self> {
        let groups = new_group_values(&plan.key_types)
            .map_err(|e| Error::plan(format!("group keys: {e}")))?;
        let accs = Accumulators::try_new(&plan)?;
        Ok(Self {
            groups,
            accs,
            alive: vec![],
            count1: vec![],
            last_write: vec![],
            key_rows: vec![],
            live: 0,
            ttl,
            state_keys: plan.key_types.len(),
            state_hashes: vec![],
            known: KnownIds::default(),
            owner: None,
            plan,
        })
    }

    /// Keys the state of a split PARTIAL by the query's keys alone (`on`), its buckets only
    /// routing rows to workers, or by every key again; a plan without buckets keeps its keying.
    /// A worker then holds one group per key, with the DISTINCT pairs (and MIN/MAX values) of
    /// every bucket it owns, instead of one group per (key, bucket): the FINAL adds up the
    /// workers' partial results as it adds up the buckets', since the buckets a worker owns are
    /// whole. Such state cannot be cut by key group (a snapshot refuses it:
    /// `GroupAggregate::snapshot`), so a run that takes checkpoints keys its state by every
    /// key: one group per (key, bucket) for a hot key, one per key for a cold one, whose
    /// buckets are NULL (`AggregatePlan::leave_cold`).
    ///
    /// # Errors
    /// State already held (a bug: the caller checks); a key type that cannot be a key.
    pub(crate) fn merge_buckets(&mut self, on: bool) -> Result<()> {
        let all = self.plan.key_types.len();
        let want = match (on, &self.plan.bucket_keys) {
            (true, Some(b)) if b.columns <= all => all - b.columns,
            _ => all,
        };
        if want == self.state_keys {
            return Ok(());
        }
        if !self.groups.is_empty() {
            return Err(Error::internal(
                "keyed state changed its keys while holding groups",
            ));
        }
        self.groups = new_group_values(&self.plan.key_types[..want])
            .map_err(|e| Error::plan(format!("group keys: {e}")))?;
        self.known = KnownIds::default();
        self.state_keys = want;
        Ok(())
    }

    /// Whether the key table hashes the keys it keeps itself, so that rows need no key hashes
    /// ([`tally_kernels::group_values::GroupValues::hashes_keys_itself`]).
    pub(crate) fn hashes_keys_itself(&self) -> bool {
        self.groups.hashes_keys_itself()
    }

    /// Whether the state merges a split PARTIAL's buckets ([`KeyedState::merge_buckets`]).
    pub(crate) fn merges_buckets(&self) -> bool {
        self.state_keys < self.plan.key_types.len()
    }

    /// How many of the plan's keys key the state: all, or the query's where it merges buckets.
    pub(crate) fn state_keys(&self) -> usize {
        self.state_keys
    }

    /// Interns `n` rows of the plan's key columns `keys` into group ids: by every key, or by
    /// the query's keys where the state merges buckets. `hashes` are the rows' hashes over the
    /// first `hashed` keys (all of them, or the query's keys where a local phase merged the
    /// buckets too), or none (rows one worker took unhashed); where they are not over the keys
    /// the state is keyed by, those are hashed here, unless the table hashes them itself.
    ///
    /// # Errors
    /// Key columns of the wrong types.
    pub(crate) fn intern(
        &mut self,
        keys: &[ArrayRef],
        hashes: &[u64],
        hashed: usize,
        n: usize,
        gids: &mut Vec<u32>,
    ) -> Result<()> {
        let keys = &keys[..self.state_keys];
        if hashed == self.state_keys && hashes.len() == n {
            return intern_hashed(self.groups.as_mut(), keys, hashes, gids);
        }
        if self.groups.hashes_keys_itself() && !keys.is_empty() {
            self.state_hashes.clear();
        } else {
            hash_keys(keys, n, &mut self.state_hashes)?;
        }
        intern_hashed(self.groups.as_mut(), keys, &self.state_hashes, gids)
    }

    /// [`KeyedState::intern`] of a worker's part of a local phase's flush (its first `k`
    /// columns are the keys): found by the rows' key ids in the local phase's key table where
    /// the flush has them and each is known, otherwise interned (the key columns cut to the
    /// part's rows) and their ids learnt ([`crate::operator::local_ids`]).
    ///
    /// # Errors
    /// As [`KeyedState::intern`].
    pub(crate) fn intern_flushed(
        &mut self,
        part: &FlushedPart,
        k: usize,
        gids: &mut Vec<u32>,
    ) -> Result<()> {
        let n = part.len();
        let local = part.local_ids();
        if let Some((table, ids)) = local
            && self.known.find(table, ids, gids)
        {
            return Ok(());
        }
        let flush = part.shared();
        let keys = column_rows(&flush.batch.columns()[..k], part.offset(), n)?;
        self.intern(&keys, part.hashes(), flush.hashed_keys, n, gids)?;
        if let Some((table, ids)) = local {
            self.known.learn(table, ids, gids);
        }
        Ok(())
    }

    /// The plan's key columns of groups `ids`: the keys the state holds and, where it merges
    /// buckets, NULL buckets (a worker's group stands for every bucket it owns).
    ///
    /// # Errors
    /// An id out of range.
    pub(crate) fn key_columns(&self, ids: &[u32]) -> Result<Vec<ArrayRef>> {
        let mut cols = self.groups.keys(ids)?;
        for t in &self.plan.key_types[self.state_keys..] {
            cols.push(arrow::array::new_null_array(t, ids.len()));
        }
        Ok(cols)
    }

    /// The key hashes of groups `ids` (a firing's rows), over the keys the state holds.
    ///
    /// # Errors
    /// An id out of range.
    pub(crate) fn key_hashes(&self, ids: &[u32]) -> Result<KeyHashes> {
        let all = self.groups.hashes();
        let hashes = ids
            .iter()
            .map(|&g| all.get(g as usize).copied())
            .collect::<Option<Vec<u64>>>()
            .ok_or_else(|| Error::internal("a fired group past the key table"))?;
        Ok(KeyHashes {
            keys: self.state_keys,
            hashes,
        })
    }

    /// Groups in the table, dead ones included.
    pub(crate) fn len(&self) -> usize {
        self.groups.len()
    }

    /// Grows the per-group vectors to the groups in the table.
    pub(crate) fn grow(&mut self) {
        let total = self.groups.len();
        if self.alive.len() < total {
            self.alive.resize(total, false);
            if self.plan.has_retractions() {
                self.count1.resize(total, 0);
            }
            if self.ttl {
                self.last_write.resize(total, 0);
            }
            self.key_rows.resize(total, 0);
        }
    }

    /// Gives group `g` state.
    pub(crate) fn revive(&mut self, g: usize) {
        if !self.alive[g] {
            self.alive[g] = true;
            self.live += 1;
        }
    }

    /// Drops the state of groups `ids` (all live): deleted or expired.
    pub(crate) fn kill(&mut self, ids: &[u32]) {
        for &g in ids {
            let g = g as usize;
            if self.alive[g] {
                self.alive[g] = false;
                self.live -= 1;
            }
            if let Some(c) = self.count1.get_mut(g) {
                *c = 0;
            }
        }
        self.accs.reset(ids);
    }

    /// Dead groups (deleted or expired, still in the table).
    pub(crate) fn dead(&self) -> usize {
        self.groups.len() - self.live as usize
    }

    /// The ids of the groups with state, in order.
    pub(crate) fn live_groups(&self) -> Vec<u32> {
        (0..self.alive.len() as u32)
            .filter(|&g| self.alive[g as usize])
            .collect()
    }

    /// Bytes held, from capacity.
    pub(crate) fn size(&self) -> usize {
        self.groups.size()
            + self.accs.size()
            + self.alive.capacity()
            + self.count1.capacity() * 8
            + self.last_write.capacity() * 8
            + self.key_rows.capacity() * 8
            + self.known.size()
    }

    /// Takes `plan` (the same query, with other hot keys: [`AggregatePlan::with_hot_keys`])
    /// in place of its own, before any group is held.
    ///
    /// # Errors
    /// Groups held (a bug: the caller checks).
    pub(crate) fn replace_plan(&mut self, plan: Arc<AggregatePlan>) -> Result<()> {
        if !self.groups.is_empty() {
            return Err(Error::internal(
                "keyed state changed its plan while holding groups",
            ));
        }
        self.plan = plan;
        Ok(())
    }

    /// The `k` keys that received the most input rows, hottest first, with their row counts;
    /// each key is shown as its values joined by `, `.
    ///
    /// # Errors
    /// When a key cannot be formatted (a bug).
    pub(crate) fn hot_keys(&self, k: usize) -> Result<Vec<(String, u64)>> {
        let mut top: Vec<(u64, u32)> = Vec::with_capacity(k + 1);
        for (g, &rows) in self.key_rows.iter().enumerate() {
            if rows == 0 || (top.len() == k && top.last().is_some_and(|t| t.0 >= rows)) {
                continue;
            }
            let at = top.partition_point(|t| t.0 >= rows);
            top.insert(at, (rows, g as u32));
            top.truncate(k);
        }
        let ids: Vec<u32> = top.iter().map(|t| t.1).collect();
        let keys = self.groups.keys(&ids)?;
        let opts = arrow::util::display::FormatOptions::default().with_null("NULL");
        let fmts = keys
            .iter()
            .map(|c| arrow::util::display::ArrayFormatter::try_new(c.as_ref(), &opts))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(top
            .iter()
            .enumerate()
            .map(|(i, &(rows, _))| {
                let parts: Vec<String> = fmts.iter().map(|f| f.value(i).to_string()).collect();
                let key = if parts.is_empty() {
                    "()".to_string()
                } else {
                    parts.join(", ")
                };
                (key, rows)
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int32Array, StringArray};

    /// Hashes reused for the very first column equal hashes computed afresh, for each of an
    /// Expand's sets (the same first array, other columns beside it); another array of equal
    /// length and a single key column are hashed afresh.
    #[test]
    fn reused_first_column_hashes_equal_fresh_ones() {
        let day: ArrayRef = Arc::new(StringArray::from(vec!["d1", "d1", "d2", "d3"]));
        let bucket: ArrayRef = Arc::new(Int32Array::from(vec![Some(1), None, Some(7), Some(1)]));
        let nulls: ArrayRef = arrow::array::new_null_array(&DataType::Int32, 4);
        let other: ArrayRef = Arc::new(StringArray::from(vec!["x", "y", "z", "w"]));
        let mut memo: FirstKeyHashes = None;
        for keys in [
            vec![Arc::clone(&day), Arc::clone(&bucket), Arc::clone(&nulls)],
            vec![Arc::clone(&day), Arc::clone(&nulls), Arc::clone(&bucket)],
            vec![Arc::clone(&day), Arc::clone(&nulls), Arc::clone(&nulls)],
            vec![Arc::clone(&other), Arc::clone(&bucket)],
            vec![Arc::clone(&day)],
        ] {
            let (mut fresh, mut reused) = (vec![], vec![]);
            hash_keys(&keys, 4, &mut fresh).unwrap();
            hash_keys_reusing(&keys, 4, &mut memo, &mut reused).unwrap();
            assert_eq!(reused, fresh);
        }
        // The memo held the last first column of several.
        assert!(memo.is_some_and(|(a, _)| Arc::ptr_eq(&a, &other)));
    }
}
