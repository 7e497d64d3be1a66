//! How the FINAL takes the PARTIAL's firings: folded into delta rows on the PARTIAL's workers
//! ([`DeltaFold`]), read through where every key has one PARTIAL row ([`ThroughFold`]), or read
//! through for the cold keys and folded for the hot ones ([`ColdFold`]); the folds each worker
//! makes, and the switches between these ways, which only a run that has passed no firing yet
//! may make.

use std::sync::Arc;

use datafusion_physical_expr::expressions::Column;

use super::coalesce::Coalescer;
use super::{ColdFold, DeltaFold, IncrementalAggregate, ThroughFold};
use crate::error::{Error, Result};
use crate::operator::LocalGroupAggregate;
use crate::operator::deltas;
use crate::operator::read_through::{ColdThrough, ReadThrough, through_columns};
use crate::plan::{AggregatePlan, HotKeys};

impl IncrementalAggregate {
    /// Reads the FINAL through ([`crate::operator::read_through`]) where `on` (every key of
    /// the PARTIAL aggregate `partial` has exactly one PARTIAL row: one worker whose state
    /// merges the buckets), the FINAL is a function of that row, and no state TTL is set (an
    /// expired PARTIAL row would restart the key's results); otherwise folds and merges.
    /// Returns whether it reads through. Once a firing has passed, the mode stays as it is.
    ///
    /// # Errors
    /// Switching after firings have passed.
    pub fn read_through(&mut self, partial: &AggregatePlan, on: bool) -> Result<bool> {
        let through = if on { self.through_of(partial) } else { None };
        if through.is_some() == self.through.is_some() {
            return Ok(through.is_some());
        }
        self.switch_before_firings()?;
        self.through = through;
        Ok(self.through.is_some())
    }

    /// Reads the cold keys through and folds and merges the hot ones
    /// ([`crate::operator::read_through::ColdThrough`]) where `hot` names the keys spread over
    /// the PARTIAL `partial`'s workers (each of which merges the buckets: every other key has
    /// exactly one PARTIAL row, on the worker of the key alone), the FINAL is a function of
    /// that row over the same keys, no state TTL is set, and the FINAL's output is told apart
    /// from its delta rows by schema. Returns whether it does. Once a firing has passed, the
    /// mode stays as it is.
    ///
    /// # Errors
    /// Switching after firings have passed.
    pub fn read_cold_through(
        &mut self,
        partial: &AggregatePlan,
        hot: Option<&Arc<HotKeys>>,
    ) -> Result<bool> {
        let cold = hot.and_then(|hot| self.cold_through_of(partial, Arc::clone(hot)));
        if cold.is_some() == self.cold.is_some() {
            return Ok(cold.is_some());
        }
        self.switch_before_firings()?;
        self.cold = cold;
        Ok(self.cold.is_some())
    }

    /// Whether the FINAL can read the cold keys of the PARTIAL `partial` through, whichever
    /// keys are hot ([`IncrementalAggregate::read_cold_through`]).
    pub fn cold_through_fits(&self, partial: &AggregatePlan) -> bool {
        self.cold_through_of(partial, Arc::new(HotKeys::from_hashes([])))
            .is_some()
    }

    /// [`IncrementalAggregate::through_of`] for the keys `hot` does not name
    /// ([`ColdThrough::try_new`]); `None` also where the FINAL's output could not be told from
    /// its delta rows by schema.
    fn cold_through_of(&self, partial: &AggregatePlan, hot: Arc<HotKeys>) -> Option<ColdThrough> {
        let buckets = partial.bucket_keys.as_ref().map_or(0, |b| b.columns);
        let query_keys = partial.key_types.len().saturating_sub(buckets);
        self.through_of(partial)
            .filter(|t| *t.output() != self.fold.delta_schema())
            .and_then(|t| ColdThrough::try_new(t, hot, query_keys))
    }

    /// The projection of `partial`'s one row per key onto the output, where the FINAL is a
    /// function of it and no state TTL is set (an expired PARTIAL row would restart the key's
    /// results).
    fn through_of(&self, partial: &AggregatePlan) -> Option<ReadThrough> {
        if !self.config().state_ttl.is_zero() {
            return None;
        }
        through_columns(partial, &self.plan).map(|columns| {
            ReadThrough::new(
                columns,
                Arc::clone(&self.plan.output_schema),
                self.config().emit_update_before,
            )
        })
    }

    /// Fails where firings have passed: how they were taken decides the FINAL's state.
    fn switch_before_firings(&self) -> Result<()> {
        let seen = self.fold.metrics.lock().map_or(1, |m| m.batches) + self.merge.batches;
        if seen > 0 {
            return Err(Error::internal(
                "a split-distinct FINAL switched between reading its PARTIAL through and merging after firings passed",
            ));
        }
        Ok(())
    }

    /// Whether it reads the cold keys through ([`IncrementalAggregate::read_cold_through`]).
    pub fn reads_cold_through(&self) -> bool {
        self.cold.is_some()
    }

    /// Where it reads the cold keys through, what makes each worker of the PARTIAL its fold of
    /// its own firings ([`ColdFold`]), whose output [`IncrementalAggregate::push`] takes as it is.
    ///
    /// # Errors
    /// As [`IncrementalAggregate::fold_factory`]'s folds.
    pub fn cold_factory(&self) -> Option<impl Fn() -> Result<ColdFold> + Send + Sync + 'static> {
        let cold = self.cold.clone()?;
        let deltas = self.fold_factory();
        let (keys, size) = (self.plan.calc.keys.len(), self.config().mini_batch_size);
        let size = usize::try_from(size).unwrap_or(usize::MAX);
        let emit_update_before = self.config().emit_update_before;
        Some(move || {
            Ok(ColdFold {
                held: Coalescer::try_new(
                    Arc::clone(cold.output()),
                    keys,
                    size,
                    emit_update_before,
                )?,
                cold: cold.clone(),
                deltas: deltas()?,
            })
        })
    }

    /// Where it reads the PARTIAL through, what makes each worker of the PARTIAL its projection
    /// of its own firings, whose output [`IncrementalAggregate::push`] passes on as it is.
    pub fn through_factory(&self) -> Option<impl Fn() -> ThroughFold + Send + Sync + 'static> {
        let fold = ThroughFold {
            through: self.through.clone()?,
            metrics: Arc::clone(&self.fold.metrics),
        };
        Some(move || fold.clone())
    }

    /// What makes a fold for each worker of the PARTIAL (its firings folded where they are
    /// fired), apart from the aggregate; what a fold makes goes to
    /// [`IncrementalAggregate::push`] as it is, and its counters to this aggregate's.
    pub fn fold_factory(&self) -> impl Fn() -> Result<DeltaFold> + Send + Sync + 'static {
        let (plan, metrics) = (Arc::clone(&self.plan), Arc::clone(&self.fold.metrics));
        let rows_are_keys = self.rows_are_keys;
        move || {
            Ok(DeltaFold {
                deltas: LocalGroupAggregate::try_new(Arc::clone(&plan))?,
                partial_output: Arc::clone(&plan.input_schema),
                rows_are_keys,
                metrics: Arc::clone(&metrics),
            })
        }
    }

    /// Where `on`, the PARTIAL `partial`'s workers each hold one group per FINAL key (they
    /// key their state by its query keys alone, `KeyedState::merge_buckets`), so that a
    /// firing's delta rows hold each key once: the folds that [`Self::fold_factory`] makes from
    /// now on take each delta row as its key's delta accumulator row, without interning keys.
    /// Set only where the FINAL's keys are the PARTIAL's query keys, in order. Returns whether
    /// it is set.
    pub fn fold_rows_as_keys(&mut self, partial: &AggregatePlan, on: bool) -> bool {
        let buckets = partial.bucket_keys.as_ref().map_or(0, |b| b.columns);
        let query_keys = partial.key_types.len().saturating_sub(buckets);
        let same_keys = self.plan.calc.keys.len() == query_keys
            && self
                .plan
                .calc
                .keys
                .iter()
                .enumerate()
                .all(|(i, k)| k.downcast_ref::<Column>().is_some_and(|c| c.index() == i));
        self.rows_are_keys = on && same_keys;
        self.rows_are_keys
    }

    /// Whether its folds take the firings of the PARTIAL aggregate `partial` as delta rows
    /// ([`crate::operator::deltas::fits`]).
    pub fn takes_deltas_from(&self, partial: &AggregatePlan) -> bool {
        deltas::fits(partial, &self.plan)
    }
}
