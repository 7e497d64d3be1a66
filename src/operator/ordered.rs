//! The ordered runtime of a [`ParallelAggregate`]: the input pushed in order, as slices.
//!
//! # Execution
//!
//! Input arrives as slices (consecutive pieces of the stream, as P readers or the pipeline cut
//! it). Every step below runs as one task per slice or per worker on the [`crate::runtime::Runtime`], with a
//! barrier between steps:
//!
//! 1. **Calc**: each slice evaluates the keys, arguments and FILTER masks and hashes its keys,
//!    once per row, for the whole push before anything is applied, so a batch that fails (a bad
//!    cast, say) leaves the state untouched and fires nothing.
//! 2. Two-phase: each slice folds its rows into its own [`LocalGroupAggregate`], which keeps them
//!    until the mini-batch ends. One-phase (or a bypassed local phase): the **Exchange** routes
//!    each row to the worker that owns its key group ([`crate::operator::key_groups`]),
//!    reusing the hash, and the workers apply their rows.
//! 3. At the end of a mini-batch (`table.exec.mini-batch.size` input rows per worker, i.e.
//!    size × P rows, as each of Flink's P tasks buffers `size` rows; or the latency interval
//!    passing on the clock; or the end of input), the local phases flush one accumulator row per
//!    key, the exchange routes those rows by the same hash, each worker's global phase merges
//!    them, and every worker emits its part of the changelog. The output of a mini-batch is the
//!    workers' changelogs in worker order; each key lives on one worker, so its changes stay in
//!    order.
//!
//! With mini-batch off there are no mini-batches: the workers run one phase per record (Flink's
//! `GroupAggFunction`) on the rows routed to them, in input order.
//!
//! Whether the local phases fold or step aside is the adaptive local phase's decision
//! ([`crate::operator::adaptive`]); the slicing and routing are [`crate::operator::exchange`]'s.

use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::RecordBatch;

use crate::changelog::ChangeBatch;
use crate::error::{Error, Result};
use crate::operator::exchange::{Evaluated, Hashed, Routed, Rows, balance, route, slice_evenly};
use crate::operator::keyed::hash_keys;
use crate::operator::local::FlushedPart;
use crate::operator::parallel::Worker;
use crate::operator::{LocalGroupAggregate, ParallelAggregate};

impl ParallelAggregate {
    /// Consumes one record batch of the builder's schema (its changelog column, if any, read as
    /// row kinds), cut into up to P slices, and returns the changes that became due (see
    /// [`ParallelAggregate::push_slices`]).
    ///
    /// # Errors
    /// As [`ParallelAggregate::push_slices`]; a batch of another schema.
    pub fn push(&mut self, batch: &RecordBatch) -> Result<Vec<ChangeBatch>> {
        let changes = self.plan.to_changes(batch)?;
        self.push_changes(&changes)
    }

    /// Consumes one batch of changes, cut into up to P slices (see
    /// [`ParallelAggregate::push_slices`]).
    ///
    /// # Errors
    /// As [`ParallelAggregate::push_slices`].
    pub fn push_changes(&mut self, changes: &ChangeBatch) -> Result<Vec<ChangeBatch>> {
        let slices = slice_evenly(changes, self.runtime.parallelism());
        self.push_slices(slices)
    }

    /// Consumes consecutive slices of the input (in stream order) and returns the changes that
    /// became due: with mini-batch off, the changes of every row; with it on, those of each
    /// mini-batch that filled up (or whose latency passed on the clock).
    ///
    /// # Errors
    /// A slice whose rows differ from the input schema, bad row kinds, or an expression that
    /// fails on the data; a batch that fails so is refused whole: the state is as it was before
    /// it and nothing fires.
    pub fn push_slices(&mut self, slices: Vec<ChangeBatch>) -> Result<Vec<ChangeBatch>> {
        let runtime = Arc::clone(&self.runtime);
        runtime.install(|| self.push_slices_on_pool(slices))
    }

    fn push_slices_on_pool(&mut self, slices: Vec<ChangeBatch>) -> Result<Vec<ChangeBatch>> {
        for s in &slices {
            self.plan.check_input(s)?;
        }
        let n: usize = slices.iter().map(ChangeBatch::num_rows).sum();
        let mini_batch = self.config.mini_batch_enabled;
        // One-phase rows are routed in the same task as their Calc when no mini-batch ends
        // inside this push (a latency trigger ends one before it, which only empties it).
        let route_early = !self.two_phase && (!mini_batch || self.trigger.cut_free(n));
        // Calc runs on the whole push before anything is applied or fired: a batch that fails
        // to evaluate (a bad cast, say) leaves the state as it was and loses no change that
        // became due.
        let evaluated = self.evaluate(slices, route_early)?;
        let mut out = vec![];
        self.check_latency(&mut out)?;
        if route_early {
            if mini_batch {
                self.trigger.cut(n);
            }
            let routed = evaluated
                .into_iter()
                .filter_map(|e| match e {
                    Evaluated::Routed(parts) => Some(parts),
                    Evaluated::Hashed(_) => None,
                })
                .collect();
            self.apply_routed(routed, n as u64, &mut out)?;
            return Ok(out);
        }
        let mut pending = vec![];
        for e in evaluated {
            let Evaluated::Hashed(s) = e else {
                return Err(Error::internal(
                    "rows routed before their mini-batch was cut",
                ));
            };
            for (off, len, ends) in self.trigger.cut(s.num_rows()) {
                pending.push(s.slice(off, len));
                if ends {
                    self.process(std::mem::take(&mut pending), &mut out)?;
                    self.end_mini_batch(&mut out)?;
                }
            }
        }
        self.process(pending, &mut out)?;
        Ok(out)
    }

    /// Calc: evaluates and hashes the slices, regrouped into at most P tasks of consecutive
    /// rows, and with `route_rows` also routes them to the workers. Returns the slices in order.
    fn evaluate(&mut self, slices: Vec<ChangeBatch>, route_rows: bool) -> Result<Vec<Evaluated>> {
        let p = self.runtime.parallelism();
        let tasks = balance(slices, p, self.min_slice_rows);
        let n_tasks = tasks.len() as u64;
        let plan = &self.plan;
        let key_groups = &self.key_groups;
        let results = self.runtime.map(
            tasks,
            |slices| -> Result<(Vec<Evaluated>, u64, Duration, Duration)> {
                let (mut calc_busy, mut exchange_busy) = (Duration::ZERO, Duration::ZERO);
                let mut rows = 0;
                let mut out = Vec::with_capacity(slices.len());
                for s in slices {
                    let start = Instant::now();
                    let mut cb = plan.calc.evaluate(&s)?;
                    // A split's cold keys go with the key alone; the query keys' hashes, where
                    // that looked them up, go on to the bucket columns.
                    let prefix = plan.leave_cold(&mut cb)?;
                    rows += cb.num_rows as u64;
                    let mut hashes = vec![];
                    match &prefix {
                        Some(prefix) => plan.hash_after_query_keys(prefix, &cb, &mut hashes)?,
                        None => hash_keys(&cb.keys, cb.num_rows, &mut hashes)?,
                    }
                    let routing = Instant::now();
                    calc_busy += routing - start;
                    let hashed = Hashed {
                        cb,
                        hashes: hashes.into(),
                    };
                    if route_rows {
                        out.push(Evaluated::Routed(route(hashed, key_groups)?));
                        exchange_busy += routing.elapsed();
                    } else {
                        out.push(Evaluated::Hashed(hashed));
                    }
                }
                Ok((out, rows, calc_busy, exchange_busy))
            },
        );
        // Counted only once every slice has evaluated (a failed push counts nothing).
        let results = results.into_iter().collect::<Result<Vec<_>>>()?;
        let mut all = vec![];
        for (evaluated, rows, calc_busy, exchange_busy) in results {
            self.calc.busy += calc_busy;
            self.exchange.busy += exchange_busy;
            self.calc.rows_in += rows;
            self.calc.rows_out += rows;
            all.extend(evaluated);
        }
        self.calc.batches += n_tasks;
        Ok(all)
    }

    /// Fires the pending mini-batch if the latency interval has passed on the clock.
    ///
    /// # Errors
    /// As [`ParallelAggregate::push_slices`].
    pub fn poll(&mut self) -> Result<Vec<ChangeBatch>> {
        let runtime = Arc::clone(&self.runtime);
        runtime.install(|| {
            let mut out = vec![];
            self.check_latency(&mut out)?;
            Ok(out)
        })
    }

    /// End of input: fires the pending mini-batch and returns its changes.
    ///
    /// # Errors
    /// As [`ParallelAggregate::push_slices`].
    pub fn finish(&mut self) -> Result<Vec<ChangeBatch>> {
        let runtime = Arc::clone(&self.runtime);
        runtime.install(|| {
            let mut out = vec![];
            self.trigger.reset();
            self.end_mini_batch(&mut out)?;
            Ok(out)
        })
    }

    fn check_latency(&mut self, out: &mut Vec<ChangeBatch>) -> Result<()> {
        if self.config.mini_batch_enabled && self.trigger.latency_due(self.clock.now_ms()) {
            self.trigger.reset();
            self.end_mini_batch(out)?;
        }
        Ok(())
    }

    /// Runs evaluated slices through the local phase, or through the exchange to the workers:
    /// they are regrouped into at most P tasks of consecutive rows, near-equal in size.
    fn process(&mut self, slices: Vec<Hashed>, out: &mut Vec<ChangeBatch>) -> Result<()> {
        let p = self.runtime.parallelism();
        let tasks = balance(slices, p, self.min_slice_rows);
        if tasks.is_empty() {
            return Ok(());
        }
        let rows: u64 = tasks.iter().flatten().map(|h| h.num_rows() as u64).sum();
        let n_tasks = tasks.len() as u64;
        if self.two_phase && !self.adaptive.m.bypassed {
            let work: Vec<(&mut LocalGroupAggregate, Vec<Hashed>)> =
                self.locals.iter_mut().zip(tasks).collect();
            let results = self
                .runtime
                .map(work, |(local, slices)| -> Result<Duration> {
                    let start = Instant::now();
                    for h in slices {
                        local.push_evaluated(&h.cb, &h.hashes)?;
                    }
                    Ok(start.elapsed())
                });
            for r in results {
                self.local.busy += r?;
            }
            self.local.rows_in += rows;
            self.local.batches += n_tasks;
            self.rows += rows;
            self.folded += rows;
            return Ok(());
        }
        let key_groups = &self.key_groups;
        let results = self
            .runtime
            .map(tasks, |slices| -> Result<(Vec<Vec<Routed>>, Duration)> {
                let start = Instant::now();
                let routed = slices
                    .into_iter()
                    .map(|h| route(h, key_groups))
                    .collect::<Result<Vec<_>>>()?;
                Ok((routed, start.elapsed()))
            });
        let mut routed = Vec::with_capacity(results.len());
        for r in results {
            let (parts, busy) = r?;
            self.exchange.busy += busy;
            routed.extend(parts);
        }
        if self.two_phase {
            self.bypassed += rows;
        }
        self.apply_routed(routed, rows, out)
    }

    /// The exchange's delivery: each worker applies the rows routed to it (`routed[i][w]` is
    /// slice `i`'s part for worker `w`), in slice order, and emits what became due.
    fn apply_routed(
        &mut self,
        routed: Vec<Vec<Routed>>,
        rows: u64,
        out: &mut Vec<ChangeBatch>,
    ) -> Result<()> {
        let p = self.runtime.parallelism();
        let slices = routed.len() as u64;
        if self.config.mini_batch_enabled {
            self.rows += rows;
        }
        let mut per_worker: Vec<Vec<Routed>> = (0..p).map(|_| vec![]).collect();
        for parts in routed {
            for (w, part) in parts.into_iter().enumerate() {
                if part.cb.num_rows > 0 {
                    per_worker[w].push(part);
                }
            }
        }
        self.exchange.rows_in += rows;
        self.exchange.rows_out += rows;
        self.exchange.batches += slices;
        let tasks: Vec<(&mut Worker, Vec<Routed>)> =
            self.workers.iter_mut().zip(per_worker).collect();
        let results = self
            .runtime
            .map(tasks, |(w, parts)| -> Result<Vec<ChangeBatch>> {
                if parts.is_empty() {
                    return Ok(vec![]);
                }
                let start = Instant::now();
                let n: u64 = parts.iter().map(|r| r.cb.num_rows as u64).sum();
                let changes = w.agg.push_routed(&parts)?;
                w.rows_received += n;
                w.input_rows += n;
                w.busy += start.elapsed();
                Ok(changes)
            });
        self.collect(results, out)
    }

    /// Appends the workers' changes in worker order.
    fn collect(
        &mut self,
        results: Vec<Result<Vec<ChangeBatch>>>,
        out: &mut Vec<ChangeBatch>,
    ) -> Result<()> {
        for r in results {
            for b in r? {
                self.aggregate.rows_out += b.num_rows() as u64;
                out.push(b);
            }
        }
        Ok(())
    }

    /// Ends the mini-batch: flushes the local phases through the exchange into the global
    /// phases and has every worker emit its changes.
    fn end_mini_batch(&mut self, out: &mut Vec<ChangeBatch>) -> Result<()> {
        let p = self.runtime.parallelism();
        let mut flushed_rows = 0u64;
        let mut entries = 0u64;
        let mut hot_share = 0.0f64;
        let mut per_worker: Vec<Vec<FlushedPart>> = (0..p).map(|_| vec![]).collect();
        if self.locals.iter().any(|l| l.keys() > 0) {
            let locals: Vec<&mut LocalGroupAggregate> = self.locals.iter_mut().collect();
            let key_groups = &self.key_groups;
            let flushed = self.runtime.map(
                locals,
                |local| -> Result<(Vec<FlushedPart>, f64, u64, Duration, Duration)> {
                    let start = Instant::now();
                    let Some(f) = local.flush_routed(key_groups)? else {
                        return Ok((vec![], 0.0, 0, start.elapsed(), Duration::ZERO));
                    };
                    let local_busy = start.elapsed().saturating_sub(f.routing);
                    Ok((f.parts, f.hot_share, f.entries, local_busy, f.routing))
                },
            );
            for f in flushed {
                let (parts, share, flush_entries, local_busy, exchange_busy) = f?;
                hot_share = hot_share.max(share);
                entries += flush_entries;
                self.local.busy += local_busy;
                self.exchange.busy += exchange_busy;
                for (w, part) in parts.into_iter().enumerate() {
                    if !part.is_empty() {
                        flushed_rows += part.len() as u64;
                        per_worker[w].push(part);
                    }
                }
            }
            self.local.rows_out += flushed_rows;
            self.exchange.rows_in += flushed_rows;
            self.exchange.rows_out += flushed_rows;
            self.exchange.batches += p as u64;
        }
        // Each worker merges what it received and emits its changes, in one task.
        let tasks: Vec<(&mut Worker, Vec<FlushedPart>)> =
            self.workers.iter_mut().zip(per_worker).collect();
        let results = self
            .runtime
            .map(tasks, |(w, parts)| -> Result<Vec<ChangeBatch>> {
                let start = Instant::now();
                if !parts.is_empty() {
                    w.agg.merge_routed(&parts)?;
                    w.rows_received += parts.iter().map(|f| f.len() as u64).sum::<u64>();
                    w.input_rows += parts.iter().flat_map(|f| f.rows()).sum::<u64>();
                }
                let changes = w.agg.finish()?;
                w.busy += start.elapsed();
                Ok(changes)
            });
        self.collect(results, out)?;
        if self.rows > 0 {
            self.mini_batches += 1;
        }
        if self.two_phase {
            self.adaptive.after_mini_batch(
                self.folded,
                flushed_rows,
                entries,
                hot_share,
                self.bypassed,
            );
        }
        (self.rows, self.folded, self.bypassed) = (0, 0, 0);
        Ok(())
    }
}
