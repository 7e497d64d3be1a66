//! What a [`GroupAggregate`] takes: input rows and changes, the accumulator rows of local
//! phases, and the parts routed to it as a worker, into its keyed state and mini-batch.

use arrow::array::{AsArray, RecordBatch};

use super::{Firing, GroupAggregate, Input};
use crate::changelog::ChangeBatch;
use crate::error::{Error, Result};
use crate::operator::exchange::Routed;
use crate::operator::keyed::KeyHashes;
use crate::operator::local::FlushedPart;
use crate::plan::CalcBatch;

impl GroupAggregate {
    /// Consumes one record batch of the builder's schema (its changelog column, if any, read as
    /// row kinds) and returns the changes that became due; see
    /// [`GroupAggregate::push_changes`].
    ///
    /// # Errors
    /// As [`GroupAggregate::push_changes`]; a batch of another schema.
    pub fn push(&mut self, batch: &RecordBatch) -> Result<Vec<ChangeBatch>> {
        let changes = self.plan.to_changes(batch)?;
        self.push_changes(&changes)
    }

    /// Consumes one batch of changes and returns the changelog batches that became due: with
    /// mini-batch off, the changes of every row; with it on, those of each mini-batch that
    /// filled up (or whose latency passed on the clock).
    ///
    /// # Errors
    /// Rows whose schema differs from the input schema, bad row kinds, or an expression that
    /// fails on the data. Such a batch is refused whole before anything happens: the state is
    /// unchanged and no mini-batch fires (a pending one fires on the next call), so no change is
    /// lost.
    pub fn push_changes(&mut self, changes: &ChangeBatch) -> Result<Vec<ChangeBatch>> {
        self.plan.check_input(changes)?;
        let n = changes.num_rows();
        // Calc first: a batch that fails to evaluate changes nothing, and fires nothing whose
        // changes the error would lose.
        let cb = if n > 0 {
            let mut cb = self.plan.calc.evaluate(changes)?;
            // A split's cold keys go with the key alone; the query keys' hashes, where that
            // looked them up, are the state's where it merges the buckets, and go on to the
            // bucket columns otherwise: no key is hashed twice.
            let prefix = self.plan.leave_cold(&mut cb)?;
            Some((cb, prefix))
        } else {
            None
        };
        let mut out = vec![];
        self.set_now();
        self.check_latency(&mut out)?;
        self.sweep_expired()?;
        self.metrics.batches_in += 1;
        let Some((cb, prefix)) = cb else {
            return Ok(out);
        };
        // The keys the state is keyed by, each hashed once.
        let keys = self.keyed.state_keys();
        match prefix {
            Some(prefix) => self
                .plan
                .hash_from_lookup(prefix, &cb, keys, &mut self.hashes)?,
            // A key table that hashes its keys itself takes none.
            None if self.keyed.hashes_keys_itself() => self.hashes.clear(),
            None => crate::operator::keyed::hash_keys(&cb.keys[..keys], n, &mut self.hashes)?,
        }
        let mut gids = std::mem::take(&mut self.gids);
        let result = self
            .keyed
            .intern(&cb.keys, &self.hashes, keys, n, &mut gids)
            .and_then(|()| {
                self.grow();
                self.metrics.rows_in += n as u64;
                if self.config.mini_batch_enabled {
                    self.push_mini_batch(&cb, &gids, &mut out)
                } else {
                    // One changelog batch per pushed batch, in input order.
                    self.run_records(&cb, &gids)
                        .and_then(|()| self.emit(&mut out))
                }
            });
        self.gids = gids;
        result?;
        Ok(out)
    }

    /// Merges one accumulator batch (a global phase only). Each accumulator row counts as one
    /// input record for the mini-batch size, as in Flink.
    ///
    /// # Errors
    /// Not a global phase, or a batch of another schema.
    pub fn push_accumulators(&mut self, batch: &RecordBatch) -> Result<Vec<ChangeBatch>> {
        self.push_accumulators_with(batch, None)
    }

    /// [`GroupAggregate::push_accumulators`] of a batch whose key hashes are known
    /// ([`crate::operator::hash_keys`]): a sharded global phase routes rows by them.
    ///
    /// # Errors
    /// As [`GroupAggregate::push_accumulators`], and hashes of another length.
    pub(crate) fn push_accumulators_hashed(
        &mut self,
        batch: &RecordBatch,
        hashes: &[u64],
    ) -> Result<Vec<ChangeBatch>> {
        if hashes.len() != batch.num_rows() {
            return Err(Error::internal("one key hash per accumulator row"));
        }
        self.push_accumulators_with(batch, Some(hashes))
    }

    fn push_accumulators_with(
        &mut self,
        batch: &RecordBatch,
        hashes: Option<&[u64]>,
    ) -> Result<Vec<ChangeBatch>> {
        let Input::Accumulators(schema) = &self.input else {
            return Err(Error::invalid_input(
                "push_accumulators needs a global phase (try_new_global)",
            ));
        };
        if batch.schema().fields() != schema.fields() {
            return Err(Error::invalid_input(
                "accumulator batch schema does not match this aggregate's accumulators",
            ));
        }
        let mut out = vec![];
        self.set_now();
        self.check_latency(&mut out)?;
        let n = batch.num_rows();
        self.metrics.batches_in += 1;
        if n == 0 {
            return Ok(out);
        }
        let k = self.plan.key_types.len();
        let mut own = std::mem::take(&mut self.hashes);
        let hashes = match hashes {
            Some(h) => h,
            None => {
                let hashed = crate::operator::keyed::hash_keys(&batch.columns()[..k], n, &mut own);
                if let Err(e) = hashed {
                    self.hashes = own;
                    return Err(e);
                }
                &own
            }
        };
        let mut gids = std::mem::take(&mut self.gids);
        let result = (|| -> Result<()> {
            self.keyed
                .intern(&batch.columns()[..k], hashes, k, n, &mut gids)?;
            self.grow();
            let pieces = match &mut self.firing {
                Firing::Own(trigger) => trigger.cut(n),
                Firing::Runtime => vec![(0, n, false)],
            };
            for (off, len, ends) in pieces {
                self.merge_rows(batch, off, &gids[off..off + len], None)?;
                if ends {
                    self.fire()?;
                    // The batch's later rows go on with `gids`: no compaction before them.
                    self.emit_keeping_ids(&mut out)?;
                }
            }
            self.maybe_compact()
        })();
        self.gids = gids;
        self.hashes = own;
        result?;
        self.metrics.rows_in += n as u64;
        Ok(out)
    }

    /// What [`GroupAggregate::push_accumulators`] does before it takes a batch: fires the
    /// pending mini-batch if the latency interval has passed (a shard of a global phase that
    /// the batch at hand has no rows for).
    ///
    /// # Errors
    /// As [`GroupAggregate::push_accumulators`].
    pub(crate) fn fire_if_late(&mut self) -> Result<Vec<ChangeBatch>> {
        let mut out = vec![];
        self.set_now();
        self.check_latency(&mut out)?;
        Ok(out)
    }

    /// Fires the pending mini-batch if the latency interval has passed on the clock (for a
    /// source that has gone quiet). Returns the changes it emitted.
    ///
    /// # Errors
    /// As [`GroupAggregate::push_changes`].
    pub fn poll(&mut self) -> Result<Vec<ChangeBatch>> {
        let mut out = vec![];
        self.set_now();
        self.check_latency(&mut out)?;
        self.sweep_expired()?;
        Ok(out)
    }

    /// End of input (or, for a worker, the end of the runtime's mini-batch): fires the pending
    /// mini-batch and returns its changes.
    ///
    /// # Errors
    /// As [`GroupAggregate::push_changes`].
    pub fn finish(&mut self) -> Result<Vec<ChangeBatch>> {
        let mut out = vec![];
        self.fire_now()?;
        self.emit(&mut out)?;
        Ok(out)
    }

    /// [`GroupAggregate::finish`], and with its changelog batch each row's key hash, as the
    /// state hashed the key when it interned it (`None` where it fires delta rows or nothing):
    /// a fold of the firing then does not hash the keys again.
    ///
    /// # Errors
    /// As [`GroupAggregate::finish`].
    pub(crate) fn finish_hashed(&mut self) -> Result<(Vec<ChangeBatch>, Option<KeyHashes>)> {
        self.fire_now()?;
        // Taken before the emission, whose compaction may renumber the groups.
        let hashes = self.pending_key_hashes()?;
        let mut out = vec![];
        self.emit(&mut out)?;
        // The emission makes one batch of the pending rows, one row each.
        let hashes = hashes.filter(|h| matches!(&out[..], [b] if b.num_rows() == h.hashes.len()));
        Ok((out, hashes))
    }

    /// Fires the pending mini-batch now, whatever its trigger.
    fn fire_now(&mut self) -> Result<()> {
        self.set_now();
        if let Firing::Own(trigger) = &mut self.firing {
            trigger.reset();
        }
        self.fire()
    }

    /// Takes rows routed to this worker, in order. With mini-batch on they join the pending
    /// mini-batch (a global phase applies them as raw rows, dropping no retraction); with it off
    /// each part is processed per record and the changes of all parts come back as one batch.
    pub(crate) fn push_routed(&mut self, parts: &[Routed]) -> Result<Vec<ChangeBatch>> {
        let mut out = vec![];
        self.set_now();
        self.sweep_expired()?;
        let mut gids = std::mem::take(&mut self.gids);
        let result = (|| -> Result<()> {
            for part in parts {
                let n = part.cb.num_rows;
                self.metrics.batches_in += 1;
                if n == 0 {
                    continue;
                }
                self.keyed.intern(
                    &part.cb.keys,
                    &part.hashes,
                    part.cb.keys.len(),
                    n,
                    &mut gids,
                )?;
                self.grow();
                self.metrics.rows_in += n as u64;
                if self.config.mini_batch_enabled {
                    self.apply(&part.cb, 0, n, &gids)?;
                } else {
                    self.run_records(&part.cb, &gids)?;
                }
            }
            if !self.config.mini_batch_enabled {
                self.emit(&mut out)?;
            }
            Ok(())
        })();
        self.gids = gids;
        result?;
        Ok(out)
    }

    /// Merges accumulator rows routed to this worker (a global phase of the runtime), with their
    /// key hashes and the input rows each folds: each part is the worker's range of a flush,
    /// read in place.
    pub(crate) fn merge_routed(&mut self, parts: &[FlushedPart]) -> Result<()> {
        if !self.is_global() {
            return Err(Error::internal("merge_routed needs a global phase"));
        }
        self.set_now();
        self.sweep_expired()?;
        let k = self.plan.key_types.len();
        let mut gids = std::mem::take(&mut self.gids);
        let result = (|| -> Result<()> {
            for part in parts {
                let n = part.len();
                self.metrics.batches_in += 1;
                if n == 0 {
                    continue;
                }
                self.keyed.intern_flushed(part, k, &mut gids)?;
                self.grow();
                self.merge_rows(
                    &part.shared().batch,
                    part.offset(),
                    &gids,
                    Some(part.rows()),
                )?;
                self.metrics.rows_in += n as u64;
            }
            Ok(())
        })();
        self.gids = gids;
        result
    }

    /// Merges accumulator rows `offset..offset + gids.len()` of `batch` (interned as `gids`)
    /// into the pending mini-batch: keeps the groups' results on first touch, merges the
    /// states, adds the record counts, and counts the input rows each stands for (`rows`, or
    /// the absolute record count when not given).
    fn merge_rows(
        &mut self,
        batch: &RecordBatch,
        offset: usize,
        gids: &[u32],
        rows: Option<&[u64]>,
    ) -> Result<()> {
        let k = self.plan.key_types.len();
        let last = batch.num_columns() - 1;
        let n = gids.len();
        let counts = batch
            .column(last)
            .as_primitive_opt::<arrow::datatypes::Int64Type>()
            .ok_or_else(|| Error::invalid_input("count1 is not Int64"))?
            .values()
            .get(offset..offset + n)
            .ok_or_else(|| Error::internal("accumulator rows past the end of their batch"))?;
        self.touch(gids, false)?;
        let total = self.keyed.len();
        self.keyed
            .accs
            .merge_at(&batch.columns()[k..last], offset, gids, total)?;
        if self.plan.has_retractions() {
            for (&g, &c) in gids.iter().zip(counts) {
                self.keyed.count1[g as usize] += c;
            }
        }
        match rows {
            Some(rows) => {
                for (&g, &r) in gids.iter().zip(rows) {
                    self.keyed.key_rows[g as usize] += r;
                }
            }
            None => {
                for (&g, &c) in gids.iter().zip(counts) {
                    self.keyed.key_rows[g as usize] += c.unsigned_abs();
                }
            }
        }
        Ok(())
    }

    /// Mini-batch on: applies `cb` (group ids `gids`) to the pending mini-batch, firing each
    /// one that fills up on the way when the operator fires its own.
    fn push_mini_batch(
        &mut self,
        cb: &CalcBatch,
        gids: &[u32],
        out: &mut Vec<ChangeBatch>,
    ) -> Result<()> {
        let n = cb.num_rows;
        let pieces = match &mut self.firing {
            Firing::Own(trigger) => trigger.cut(n),
            Firing::Runtime => vec![(0, n, false)],
        };
        for (off, len, ends) in pieces {
            self.apply(cb, off, len, &gids[off..off + len])?;
            if ends {
                self.fire()?;
                // The batch's later rows go on with `gids`: no compaction before them.
                self.emit_keeping_ids(out)?;
            }
        }
        self.maybe_compact()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Int64Array, RecordBatch, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};
    use datafusion_expr::col;

    use crate::aggregates::count_star;
    use crate::{Config, GroupAggregate};

    /// A firing's key hashes, handed on with it, are its rows' hashes over their key columns,
    /// in order: a firing of new keys, then one of updates (each `-U`/`+U` pair one key's)
    /// and a new key, NULL keys among them.
    #[test]
    fn a_firing_hands_on_its_key_hashes() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Utf8, true),
            Field::new("n", DataType::Int64, true),
        ]));
        let config = Config::from_pairs([
            ("table.exec.mini-batch.enabled", "true"),
            ("table.exec.mini-batch.allow-latency", "1 h"),
            ("table.exec.mini-batch.size", "1000"),
        ])
        .unwrap();
        let mut agg = GroupAggregate::builder(Arc::clone(&schema))
            .group_by([col("k"), col("n")])
            .aggregate([count_star()])
            .config(config)
            .build()
            .unwrap();
        let batch = |k: Vec<Option<&str>>, n: Vec<Option<i64>>| {
            RecordBatch::try_new(
                Arc::clone(&schema),
                vec![
                    Arc::new(StringArray::from(k)),
                    Arc::new(Int64Array::from(n)),
                ],
            )
            .unwrap()
        };
        let firings = [
            batch(
                vec![Some("a"), Some("b"), None, Some("a")],
                vec![Some(1), Some(2), Some(3), None],
            ),
            batch(
                vec![Some("b"), Some("c"), Some("a"), Some("b")],
                vec![Some(2), Some(9), None, Some(2)],
            ),
        ];
        for b in &firings {
            agg.push(b).unwrap();
            let (fired, hashes) = agg.finish_hashed().unwrap();
            let [out] = &fired[..] else {
                panic!("{} batches fired", fired.len());
            };
            let hashes = hashes.unwrap();
            assert_eq!(hashes.keys, 2);
            let mut want = vec![];
            tally_kernels::hash::hash_columns(&out.data.columns()[..2], &mut want).unwrap();
            assert_eq!(hashes.hashes, want);
        }
        // Nothing pending: nothing fired, no hashes.
        let (fired, hashes) = agg.finish_hashed().unwrap();
        assert!(fired.is_empty() && hashes.is_none());
    }

    /// A split PARTIAL naming hot keys interns each key under one group whatever hashes reach
    /// its key table: u's set, whose cold key's buckets are set to NULL (the lookup's query-key
    /// hashes handed on), the keys alone's set, whose buckets are all NULL (the keys hashed
    /// whole), then u's set again. Its state keyed by every key holds the hot key 1 per bucket
    /// (2 and 3) and under NULL buckets, and the cold key 2 once; merging the buckets, one
    /// group per key.
    #[test]
    fn a_split_partial_keeps_its_groups_whatever_hashes_it_takes() {
        use crate::clock::SystemClock;
        use crate::plan::{HotKeys, split_fixture};
        let [u_set, keys_alone] = split_fixture::hot_and_cold_sets();
        for merged in [false, true] {
            let hot = HotKeys::from_hashes([split_fixture::key_hash(1)]);
            let plan = split_fixture::plan(4, false).with_hot_keys(Some(hot));
            let mut agg =
                GroupAggregate::try_new(Arc::new(plan), Config::default(), Arc::new(SystemClock))
                    .unwrap();
            agg.merge_buckets(merged).unwrap();
            for b in [&u_set, &keys_alone, &u_set] {
                agg.push(b).unwrap();
            }
            agg.finish().unwrap();
            assert_eq!(
                agg.keyed.live,
                if merged { 2 } else { 4 },
                "merged: {merged}"
            );
            // The key table holds each group's hash over the keys it is keyed by.
            let ids = agg.keyed.live_groups();
            let keys = agg.keyed.key_columns(&ids).unwrap();
            let mut want = vec![];
            tally_kernels::hash::hash_columns(&keys[..agg.keyed.state_keys()], &mut want).unwrap();
            let held: Vec<u64> = ids
                .iter()
                .map(|&g| agg.keyed.groups.hashes()[g as usize])
                .collect();
            assert_eq!(held, want, "merged: {merged}");
        }
    }
}
