//! A source task's input from an Expand: the group sets of the same rows, fed to the local
//! phase as one batch of the input rows, chunk by chunk of rows, or set by set.

use std::time::Instant;

use super::Source;
use crate::changelog::ChangeBatch;
use crate::error::{Error, Result};
use crate::operator::exchange::{Hashed, Rows};

impl Source<'_> {
    /// Pushes what the stages before the aggregate made of one input batch: an Expand's group
    /// sets of its rows (several batches) as one batch of them where the local phase takes
    /// each input row once, chunk by chunk where it folds a key's sets together, and otherwise
    /// (one batch, or a local phase that folds by set) each in turn. Within a chunk of a chunked
    /// split (whose epoch ends at the chunk's end only) each way applies the sets in turn.
    pub(super) fn push_all(&mut self, batches: Vec<ChangeBatch>) -> Result<()> {
        if batches.len() > 1 && self.takes_rows_once() {
            self.push_sets(&batches)
        } else if batches.len() > 1 && self.folds_sets_together() {
            self.push_interleaved(&batches)
        } else {
            batches.into_iter().try_for_each(|b| self.push(b))
        }
    }

    /// Whether the local phase folds a key's rows whatever their group set (a split PARTIAL
    /// whose workers merge the buckets: [`crate::operator::LocalGroupAggregate`]'s
    /// `merge_buckets`), so that an Expand's sets of the same rows are worth folding in one
    /// mini-batch.
    fn folds_sets_together(&self) -> bool {
        self.local
            .as_ref()
            .is_some_and(|l| l.merges_buckets() && !self.adaptive.m.bypassed)
            && self.adaptive.chunks_sets()
    }

    /// Whether the local phase takes an Expand's group sets of each input row as one row: it
    /// folds a key's rows whatever their sets and buckets and routes what it folded when it
    /// flushes ([`LocalGroupAggregate::routes_at_flush`]), so that its input needs no set
    /// batches while it folds ([`Source::push_sets`]).
    fn takes_rows_once(&self) -> bool {
        self.local.as_ref().is_some_and(|l| l.routes_at_flush())
    }

    /// Feeds the group sets of an Expand (`batches`, one per set, of the same input rows) to a
    /// local phase that takes each input row once ([`Source::takes_rows_once`]): while it folds,
    /// the sets are evaluated as one batch of the input rows
    /// ([`crate::plan::Calc::evaluate_sets`]), and its mini-batch counts input rows (each stands
    /// for its sets' rows in the row counts and the adaptive local phase's measures); while it is
    /// bypassed, each set's rows are routed as they are. Rows of one input row's sets stay in
    /// one mini-batch.
    fn push_sets(&mut self, batches: &[ChangeBatch]) -> Result<()> {
        let n = batches[0].num_rows();
        if batches.iter().any(|b| b.num_rows() != n) {
            return Err(Error::internal(
                "an Expand's group sets of different lengths",
            ));
        }
        let k = batches.len();
        self.adaptive.fold_sets(k);
        let (mut one, mut sets): (Option<Hashed>, Option<Vec<Hashed>>) = (None, None);
        self.end_epoch_if_late()?;
        for (off, len, ends) in self.trigger.cut(n) {
            let slice = |h: &Hashed| {
                if len == n {
                    h.clone()
                } else {
                    h.slice(off, len)
                }
            };
            if self.local.is_some() && !self.adaptive.m.bypassed {
                if one.is_none() {
                    one = Some(self.evaluate_sets(batches)?);
                }
                let (Some(local), Some(rows)) = (&mut self.local, &one) else {
                    return Err(Error::internal("no local phase to fold into"));
                };
                let start = Instant::now();
                local.push_sets_evaluated(&slice(rows).cb, k)?;
                self.report.local_busy += start.elapsed();
                self.epoch_folded += (len * k) as u64;
            } else {
                if sets.is_none() {
                    let evaluated = batches
                        .iter()
                        .map(|b| self.evaluate_uncounted(b))
                        .collect::<Result<Vec<_>>>()?;
                    sets = Some(evaluated);
                }
                for rows in sets.iter().flatten() {
                    self.take(slice(rows))?;
                }
            }
            // The Calc's rows: each input row once per set, as the sets' batches would count.
            self.report.rows += (len * k) as u64;
            if ends {
                self.end_epoch(false)?;
            }
        }
        Ok(())
    }

    /// Evaluates an Expand's group sets of the same rows as one batch of those rows (key hashes
    /// are not needed: the local phase's table hashes its keys itself).
    fn evaluate_sets(&mut self, batches: &[ChangeBatch]) -> Result<Hashed> {
        for b in batches {
            self.plan.check_input(b)?;
        }
        let start = Instant::now();
        // Its bucket columns are left unread (NULL): the flush routes a cold key's entries with
        // the key alone, so there is nothing to leave cold here.
        let cb = self.plan.calc.evaluate_sets(batches)?;
        self.report.calc_busy += start.elapsed();
        Ok(Hashed {
            cb,
            hashes: Vec::new().into(),
        })
    }

    /// Folds the group sets of an Expand (`batches`, one per set, of the same input rows) chunk
    /// of rows by chunk, each chunk's sets one after the other, as Flink's Expand emits a row's
    /// sets together: a mini-batch then holds every set of its rows, and the local phase folds
    /// a key's sets into one accumulator row. A chunk is a mini-batch's share of each set.
    fn push_interleaved(&mut self, batches: &[ChangeBatch]) -> Result<()> {
        let n = batches[0].num_rows();
        if batches.iter().any(|b| b.num_rows() != n) {
            for b in batches {
                self.push(b.clone())?;
            }
            return Ok(());
        }
        let sets = batches
            .iter()
            .map(|b| self.evaluate(b))
            .collect::<Result<Vec<_>>>()?;
        self.adaptive.fold_sets(sets.len());
        let chunk = (self.trigger.size() / sets.len()).max(1);
        for off in (0..n).step_by(chunk) {
            let len = chunk.min(n - off);
            for rows in &sets {
                self.feed(if len == n {
                    rows.clone()
                } else {
                    rows.slice(off, len)
                })?;
            }
        }
        Ok(())
    }
}
