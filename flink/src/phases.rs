//! A query of GROUP BYs planned for Flink's tasks, cut at Flink's keyed exchanges into a chain
//! of [`Phase`]s: phase 0 chained to the upstream task, then one per aggregate, each a keyed
//! operator whose state Flink keeps per key group.
//!
//! Phase 0 runs the per-row stages before the first aggregate (WHERE, projections) and that
//! aggregate's local side; phase k (k >= 1) runs aggregate k's keyed side, the per-row stages
//! after it, and the next aggregate's local side, if any. An aggregate's local side with two
//! phases (mini-batch on, the strategy not `ONE_PHASE`) folds each mini-batch of rows into one
//! accumulator row per key and hands them over per key group, as Flink's
//! `MiniBatchLocalGroupAggFunction`; its keyed side merges them and fires its own mini-batches,
//! as `MiniBatchGlobalGroupAggFunction`. With one phase the local side only cuts the rows by key
//! group and the keyed side is the whole aggregate. A part crosses Flink's exchange as one
//! record: a key group and the Arrow IPC bytes of its rows. A nested aggregate (over another's
//! changelog) is one more phase after one more exchange, keyed by its own keys. Split-distinct
//! is two aggregates, its PARTIAL and its FINAL; under Flink's incremental aggregate the FINAL's
//! local side folds each firing of the PARTIAL's keyed side into one row of delta accumulators
//! per FINAL key (Flink's `IncrementalGroupAggregate`, in the PARTIAL's task) and its keyed side
//! merges them. Any other local side ends a mini-batch at exactly its size in rows, as Flink's
//! bundles end.
//!
//! The key group of a row is Tally's (`KeyGroups::of_hash` of the key hash), over
//! `pipeline.max-parallelism` key groups: the Java side keys each exchange so that Flink's key
//! group of a part is this one, so Flink routes, snapshots and rescales Tally's state per key
//! group.

use std::sync::Arc;

use arrow::array::RecordBatch;
use tally::changelog::ChangeBatch;
use tally::clock::SystemClock;
use tally::operator::exchange::by_key_group;
use tally::operator::{LocalGroupAggregate, hash_keys};
use tally::pipeline::map_through;
use tally::plan::AggregatePlan;
use tally::{Error, GroupAggregate, Result};

use crate::parts::{Part, changes_of, from_ipc, parts};
use crate::query::Query;
use crate::wire;

impl Query {
    /// Phase `k` of the chain (0 before the first exchange; k >= 1 after exchange k).
    ///
    /// # Errors
    /// No such phase, or an operator that cannot be built.
    pub fn into_phase(mut self, k: usize) -> Result<Phase> {
        if k >= self.phases() {
            return Err(Error::invalid_input(format!(
                "this query has phases 0 to {}, not {k}",
                self.phases() - 1
            )));
        }
        let clock = Arc::new(SystemClock);
        let keyed = match k.checked_sub(1).map(|i| &self.aggregates[i]) {
            None => None,
            Some(a) if a.two_phase => Some(GroupAggregate::try_new_global(
                Arc::clone(&a.plan),
                a.config.clone(),
                clock,
            )?),
            Some(a) => Some(GroupAggregate::try_new(
                Arc::clone(&a.plan),
                a.config.clone(),
                clock,
            )?),
        };
        let from = k.checked_sub(1).map_or(0, |i| self.aggregates[i].stage + 1);
        let stages_len = self.stages().len();
        let next = match self.aggregates.get(k) {
            None => Next::Rows,
            Some(a) => Next::Parts(Box::new(LocalSide {
                local: if a.two_phase {
                    Some(LocalGroupAggregate::try_new(Arc::clone(&a.plan))?)
                } else {
                    None
                },
                plan: Arc::clone(&a.plan),
                pending: 0,
                size: u64::try_from(a.config.mini_batch_size).unwrap_or(1).max(1),
                per_firing: a.incremental,
                one_receiver: false,
                hashes: vec![],
            })),
        };
        let to = self.aggregates.get(k).map_or(stages_len, |a| a.stage);
        Ok(Phase {
            query: self,
            keyed,
            stages: from..to,
            next,
            hashes: vec![],
        })
    }
}

/// The local side of the next aggregate: a local phase, or with one phase the rows themselves,
/// cut by key group.
#[derive(Debug)]
struct LocalSide {
    local: Option<LocalGroupAggregate>,
    plan: Arc<AggregatePlan>,
    /// Rows folded since the last flush, against the mini-batch size.
    pending: u64,
    size: u64,
    /// Flushes after each firing of the keyed side before it, whatever its size: the fold of
    /// Flink's incremental aggregate, one row of delta accumulators per key and firing.
    per_firing: bool,
    /// The keyed operator after the exchange runs as one subtask ([`Phase::with_receivers`]).
    one_receiver: bool,
    hashes: Vec<u64>,
}

impl LocalSide {
    /// Takes changes bound for the next exchange: into the local phase, a flush at exactly
    /// each mini-batch size in rows (Flink's local phase ends a bundle there) unless it folds
    /// per firing; with one phase the rows themselves, as one part in input order for one
    /// receiver, else cut by key group.
    fn push(&mut self, b: &ChangeBatch, key_groups: usize, out: &mut Vec<Part>) -> Result<()> {
        let Some(local) = &mut self.local else {
            if b.num_rows() == 0 {
                return Ok(());
            }
            let rows = b.with_op_column()?;
            if self.one_receiver {
                out.push(Part::new(0, &rows)?);
            } else {
                let keys = self.plan.calc.evaluate_keys(&b.data)?;
                hash_keys(&keys, b.num_rows(), &mut self.hashes)?;
                out.extend(parts(by_key_group(&rows, &self.hashes, key_groups)?)?);
            }
            return Ok(());
        };
        if self.per_firing {
            local.push_changes(b)?;
            self.pending += b.num_rows() as u64;
            return Ok(());
        }
        let mut at = 0;
        while at < b.num_rows() {
            let room = self.size.saturating_sub(self.pending).max(1);
            let take = (b.num_rows() - at).min(room as usize);
            local.push_changes(&b.slice(at, take))?;
            self.pending += take as u64;
            at += take;
            if self.pending >= self.size {
                self.pending = 0;
                out.extend(parts(local.flush_by_key_group(key_groups)?)?);
            }
        }
        Ok(())
    }

    /// The local phase's accumulators, one part per key group that holds keys.
    fn flush(&mut self, key_groups: usize, out: &mut Vec<Part>) -> Result<()> {
        self.pending = 0;
        if let Some(local) = &mut self.local {
            out.extend(parts(local.flush_by_key_group(key_groups)?)?);
        }
        Ok(())
    }
}

/// Where a phase's output goes.
#[derive(Debug)]
enum Next {
    /// Into the next exchange, as parts.
    Parts(Box<LocalSide>),
    /// Out of the chain, as column batches of changes for Java.
    Rows,
}

/// What a phase hands on: parts for the next exchange, or column batches of the result's
/// changes (the last phase).
#[derive(Debug, Default)]
pub struct Output {
    /// Parts for the next exchange.
    pub parts: Vec<Part>,
    /// Column batches of changes ([`crate::wire`]).
    pub rows: Vec<Vec<u8>>,
}

/// One link of the chain: phase 0 takes column batches from Java; a later phase takes parts
/// from its exchange into its keyed aggregate. Each runs the per-row stages up to the next
/// aggregate and that aggregate's local side, or, the last, emits the result's changes.
#[derive(Debug)]
pub struct Phase {
    query: Query,
    /// The keyed aggregate after the exchange: a global phase ([`GroupAggregate::is_global`])
    /// takes accumulator rows, a one-phase aggregate the rows themselves.
    keyed: Option<GroupAggregate>,
    stages: std::ops::Range<usize>,
    next: Next,
    /// The key hashes of a snapshot's rows.
    hashes: Vec<u64>,
}

impl Phase {
    /// Tells the phase how many subtasks the keyed operator after its exchange runs (its
    /// parallelism). With one, a one-phase local side sends each batch on as one part, its rows
    /// in input order: the one subtask then sees them as they came, as Flink's own operator
    /// does, so the changelog is Flink's row for row (by key group, each key's order alone
    /// would hold). The part must reach that one subtask: the Java side checks the keyed
    /// operator's parallelism.
    pub fn with_receivers(mut self, receivers: usize) -> Phase {
        if let Next::Parts(side) = &mut self.next {
            side.one_receiver = receivers == 1;
        }
        self
    }

    /// Whether it is a keyed phase (after an exchange), which takes parts and keeps state.
    pub fn is_keyed(&self) -> bool {
        self.keyed.is_some()
    }

    /// Takes one column batch from Java (phase 0) or one part from the exchange (a later
    /// phase); returns what became due.
    ///
    /// # Errors
    /// A malformed batch or corrupt part, and evaluation errors.
    pub fn push(&mut self, bytes: &[u8]) -> Result<Output> {
        let changes = match &mut self.keyed {
            None => vec![wire::decode(bytes, &self.query.input)?],
            Some(agg) => {
                let mut out = vec![];
                for batch in from_ipc(bytes)? {
                    out.extend(if agg.is_global() {
                        agg.push_accumulators(&batch)?
                    } else {
                        let plan = agg.plan();
                        let changes = changes_of(batch, &plan.input_schema, plan.changelog)?;
                        agg.push_changes(&changes)?
                    });
                }
                out
            }
        };
        let mut out = Output::default();
        self.forward(changes, &mut out)?;
        self.end_firing(&mut out)?;
        Ok(out)
    }

    /// Fires the keyed side's pending mini-batch if its latency has passed.
    ///
    /// # Errors
    /// As [`Phase::push`].
    pub fn poll(&mut self) -> Result<Output> {
        let mut out = Output::default();
        if let Some(keyed) = &mut self.keyed {
            let changes = keyed.poll()?;
            self.forward(changes, &mut out)?;
            self.end_firing(&mut out)?;
        }
        Ok(out)
    }

    /// Fires everything pending (before a checkpoint barrier, at the end of input, on the
    /// latency trigger): the keyed side's mini-batch, then the next local side's accumulators.
    ///
    /// # Errors
    /// As [`Phase::push`].
    pub fn flush(&mut self) -> Result<Output> {
        let mut out = Output::default();
        if let Some(keyed) = &mut self.keyed {
            let changes = keyed.finish()?;
            self.forward(changes, &mut out)?;
        }
        self.flush_local(&mut out)?;
        Ok(out)
    }

    /// Changes through the per-row stages, into the next local side or out as rows.
    fn forward(&mut self, changes: Vec<ChangeBatch>, out: &mut Output) -> Result<()> {
        let range = self.stages.clone();
        for c in changes {
            for b in map_through(&self.query.stages()[range.clone()], c)? {
                match &mut self.next {
                    Next::Rows => {
                        if b.num_rows() > 0 {
                            out.rows.push(wire::encode(&b)?);
                        }
                    }
                    Next::Parts(side) => side.push(&b, self.query.key_groups, &mut out.parts)?,
                }
            }
        }
        Ok(())
    }

    /// After a firing of the keyed side: the fold of Flink's incremental aggregate flushes.
    fn end_firing(&mut self, out: &mut Output) -> Result<()> {
        match &mut self.next {
            Next::Parts(side) if side.per_firing && side.pending > 0 => {
                side.flush(self.query.key_groups, &mut out.parts)
            }
            _ => Ok(()),
        }
    }

    fn flush_local(&mut self, out: &mut Output) -> Result<()> {
        match &mut self.next {
            Next::Parts(side) => side.flush(self.query.key_groups, &mut out.parts),
            Next::Rows => Ok(()),
        }
    }

    /// The keyed state, one part per key group that holds keys (taken after
    /// [`Phase::flush`]); nothing for phase 0, which keeps none.
    ///
    /// # Errors
    /// A mini-batch still pending.
    pub fn snapshot(&mut self) -> Result<Vec<Part>> {
        let Some(agg) = &self.keyed else {
            return Ok(vec![]);
        };
        let k = agg.plan().key_types.len();
        let mut by_group: Vec<Vec<RecordBatch>> = vec![vec![]; self.query.key_groups];
        for batch in agg.snapshot()? {
            hash_keys(&batch.columns()[..k], batch.num_rows(), &mut self.hashes)?;
            for (g, rows) in by_key_group(&batch, &self.hashes, self.query.key_groups)? {
                by_group[g].push(rows);
            }
        }
        by_group
            .iter()
            .enumerate()
            .filter(|(_, batches)| !batches.is_empty())
            .map(|(g, batches)| {
                let batch = arrow::compute::concat_batches(&batches[0].schema(), batches)?;
                Part::new(g, &batch)
            })
            .collect()
    }

    /// Loads the parts of the key groups Flink assigned to this subtask (from
    /// [`Phase::snapshot`] of the same phase of the same query, at any parallelism).
    ///
    /// # Errors
    /// Phase 0 (it keeps no state), state of another query, a corrupt part, or an aggregate
    /// that already holds state.
    pub fn restore(&mut self, parts: &[&[u8]]) -> Result<()> {
        let Some(keyed) = &mut self.keyed else {
            return if parts.is_empty() {
                Ok(())
            } else {
                Err(Error::invalid_input(
                    "the phase before the first exchange keeps no state to restore",
                ))
            };
        };
        let mut batches = vec![];
        for p in parts {
            batches.extend(from_ipc(p)?);
        }
        keyed.restore_snapshot(&batches)
    }

    /// Bytes of keyed state.
    pub fn state_bytes(&self) -> u64 {
        self.keyed
            .as_ref()
            .map_or(0, |agg| agg.metrics().state_bytes)
    }
}
