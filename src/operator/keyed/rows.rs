//! Keyed state as snapshot rows: its live groups exported as Arrow columns (keys, accumulator
//! columns, record count, last write, input rows) and imported again, for snapshots, restores
//! and compaction; a DISTINCT call's table read once for all of a snapshot's chunks.

use std::collections::HashSet;
use std::sync::Arc;

use arrow::array::{ArrayRef, AsArray, Int64Array, RecordBatch, UInt64Array};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};

use super::{KeyedState, UNSTAMPED, accumulator_schema};
use crate::error::{Error, Result};
use crate::plan::{HOT_KEYS_METADATA, HotKeys};

impl KeyedState {
    /// The schema of [`KeyedState::export`]: the accumulator batch's (keys, accumulator columns,
    /// `count1`), then `$last_write_ms` and `$input_rows`.
    pub(crate) fn snapshot_schema(&self) -> SchemaRef {
        let acc = accumulator_schema(&self.plan, &self.accs);
        let mut fields: Vec<Field> = acc.fields().iter().map(|f| f.as_ref().clone()).collect();
        fields.push(Field::new("$last_write_ms", DataType::Int64, false));
        fields.push(Field::new("$input_rows", DataType::UInt64, false));
        // A split PARTIAL's state holds a cold key under NULL buckets: its snapshot says which
        // keys were hot, for the restoring run to route their rows the same way.
        let metadata = match &self.plan.bucket_keys {
            Some(b) => [(
                HOT_KEYS_METADATA.to_string(),
                HotKeys::describe(b.hot.as_deref()),
            )]
            .into(),
            None => Default::default(),
        };
        Arc::new(Schema::new_with_metadata(fields, metadata))
    }

    /// The snapshot rows of groups `ids` (all live), of `schema` ([`KeyedState::snapshot_schema`]).
    pub(crate) fn export(&self, ids: &[u32], schema: &SchemaRef) -> Result<RecordBatch> {
        self.export_with(ids, self.accs.state(ids)?, schema)
    }

    /// [`KeyedState::export`] of `ids` in batches of `chunk` groups, the accumulators' state
    /// taken for all of them at once ([`Accumulators::state_chunks`]).
    pub(crate) fn export_chunks(
        &self,
        ids: &[u32],
        chunk: usize,
        schema: &SchemaRef,
    ) -> Result<Vec<RecordBatch>> {
        let chunk = chunk.max(1);
        ids.chunks(chunk)
            .zip(self.accs.state_chunks(ids, chunk)?)
            .map(|(run, states)| self.export_with(run, states, schema))
            .collect()
    }

    /// The snapshot rows of groups `ids`, their accumulator columns `states`.
    fn export_with(
        &self,
        ids: &[u32],
        states: Vec<ArrayRef>,
        schema: &SchemaRef,
    ) -> Result<RecordBatch> {
        let mut cols = self.key_columns(ids)?;
        cols.extend(states);
        let gather = |v: &[i64], none: i64| -> ArrayRef {
            Arc::new(Int64Array::from_iter_values(
                ids.iter()
                    .map(|&g| v.get(g as usize).copied().unwrap_or(none)),
            ))
        };
        cols.push(gather(&self.count1, 0));
        cols.push(gather(&self.last_write, UNSTAMPED));
        cols.push(Arc::new(UInt64Array::from_iter_values(
            ids.iter().map(|&g| self.key_rows[g as usize]),
        )));
        RecordBatch::try_new(Arc::clone(schema), cols)
            .map_err(|e| Error::internal(format!("snapshot batch: {e}")))
    }

    /// Interns the groups of a snapshot batch (with their key hashes over every key) as new
    /// live groups; returns whether one was restored without a TTL timestamp. State that
    /// merges a split PARTIAL's buckets merges each key's rows (of its buckets, a snapshot
    /// being keyed by every key: [`KeyedState::export_cut`]) into one group, `seen` holding
    /// the (group, hash) of every row imported so far.
    ///
    /// # Errors
    /// A key present twice (or already in the table), columns of the wrong types.
    pub(crate) fn import(
        &mut self,
        batch: &RecordBatch,
        hashes: &[u64],
        gids: &mut Vec<u32>,
        seen: &mut HashSet<(u32, u64)>,
    ) -> Result<bool> {
        let n = batch.num_rows();
        if n == 0 {
            return Ok(false);
        }
        let k = self.plan.key_types.len();
        let width = batch.num_columns();
        let before = self.groups.len();
        self.intern(&batch.columns()[..k], hashes, k, n, gids)?;
        let twice = if self.merges_buckets() {
            !gids.iter().zip(hashes).all(|(&g, &h)| seen.insert((g, h)))
        } else {
            self.groups.len() != before + n
        };
        if twice {
            return Err(Error::invalid_input(
                "snapshot holds a group key twice (or a key this operator already has)",
            ));
        }
        self.grow();
        self.accs
            .merge(&batch.columns()[k..width - 3], gids, self.groups.len())?;
        let int64 = |i: usize| -> Result<&Int64Array> {
            batch
                .column(i)
                .as_primitive_opt()
                .ok_or_else(|| Error::invalid_input(format!("snapshot column {i} is not Int64")))
        };
        let count1 = int64(width - 3)?;
        let last_write = int64(width - 2)?;
        let rows: &UInt64Array = batch
            .column(width - 1)
            .as_primitive_opt()
            .ok_or_else(|| Error::invalid_input("snapshot column $input_rows is not UInt64"))?;
        let mut unstamped = false;
        for (i, &g) in gids.iter().enumerate() {
            let g = g as usize;
            // A group restored from several rows (of its buckets) sums their counts and was
            // last written at the latest of their writes.
            let first = !self.alive[g];
            self.alive[g] = true;
            if let Some(c) = self.count1.get_mut(g) {
                *c = if first { 0 } else { *c } + count1.value(i);
            }
            if let Some(t) = self.last_write.get_mut(g) {
                let written = last_write.value(i);
                *t = if first { written } else { (*t).max(written) };
                unstamped |= written == UNSTAMPED;
            }
            self.key_rows[g] = if first { 0 } else { self.key_rows[g] } + rows.value(i);
        }
        self.live += (self.groups.len() - before) as u64;
        Ok(unstamped)
    }

    /// The same state with only its live groups, in id order (live group ids stay in their
    /// relative order), exported and imported `chunk` groups at a time.
    pub(crate) fn rebuilt(&self, chunk: usize) -> Result<Self> {
        self.rebuilt_as(self.merges_buckets(), chunk)
    }

    /// [`KeyedState::rebuilt`] into state that merges a split PARTIAL's buckets or not
    /// (`merge`, [`KeyedState::merge_buckets`]).
    pub(super) fn rebuilt_as(&self, merge: bool, chunk: usize) -> Result<Self> {
        let mut fresh = Self::try_new(Arc::clone(&self.plan), self.ttl)?;
        fresh.owner = self.owner.clone();
        fresh.merge_buckets(merge)?;
        let schema = self.snapshot_schema();
        let all_hashes = self.groups.hashes();
        let (mut gids, mut seen) = (vec![], HashSet::new());
        for ids in self.live_groups().chunks(chunk) {
            let batch = self.export(ids, &schema)?;
            let hashes: Vec<u64> = ids.iter().map(|&g| all_hashes[g as usize]).collect();
            fresh.import(&batch, &hashes, &mut gids, &mut seen)?;
        }
        Ok(fresh)
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::{Int64Array, StringArray};
    use datafusion_expr::{ExprFunctionExt, col, lit};

    use super::*;
    use crate::aggregates::{count, sum};
    use crate::operator::GroupAggregate;

    /// A snapshot's chunks exported together (each DISTINCT table read once) are the chunks
    /// exported one by one, whatever the chunk: DISTINCT calls over strings and over integers
    /// (one with a FILTER) beside a plain call.
    #[test]
    fn chunks_exported_together_are_the_chunks_exported_one_by_one() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("s", DataType::Utf8, true),
            Field::new("v", DataType::Int64, true),
        ]));
        let mut agg = GroupAggregate::builder(Arc::clone(&schema))
            .group_by([col("k")])
            .aggregate([
                count(col("s")).distinct().build().unwrap(),
                count(col("v"))
                    .distinct()
                    .filter(col("v").gt(lit(3i64)))
                    .build()
                    .unwrap(),
                sum(col("v")),
            ])
            .build()
            .unwrap();
        let n = 300i64;
        let batch = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from_iter_values((0..n).map(|i| (i * 7) % 37))),
                Arc::new(StringArray::from_iter(
                    (0..n).map(|i| (i % 5 != 0).then(|| format!("s{}", i % 11))),
                )),
                Arc::new(Int64Array::from_iter(
                    (0..n).map(|i| (i % 3 != 0).then_some(i % 13)),
                )),
            ],
        )
        .unwrap();
        agg.push(&batch).unwrap();
        agg.finish().unwrap();
        let keyed = &agg.keyed;
        let schema = keyed.snapshot_schema();
        let live = keyed.live_groups();
        assert_eq!(live.len(), 37);
        for chunk in [1, 2, 5, 36, 37, 100] {
            let together = keyed.export_chunks(&live, chunk, &schema).unwrap();
            let each: Vec<RecordBatch> = live
                .chunks(chunk)
                .map(|ids| keyed.export(ids, &schema).unwrap())
                .collect();
            assert_eq!(together, each, "chunks of {chunk} groups");
        }
    }
}
