//! Delta rows: a split-distinct PARTIAL's firing as one row per transition, for its
//! incremental FINAL.
//!
//! Flink's `IncrementalGroupAggregate` folds each bundle of the PARTIAL into delta accumulators
//! of the FINAL inside one function: the FINAL never sees the PARTIAL's `-U` apart from its
//! `+U`. Where the FINAL only adds the PARTIAL's counts up (a `$SUM0` of a PARTIAL BIGINT count
//! that is never NULL: COUNT, COUNT(*), COUNT(DISTINCT), as split-distinct makes of COUNT), a
//! transition is worth exactly its difference: `+I new` adds `new`, `-U old`/`+U new` adds
//! `new - old`, `-D old` takes `old`. Where it takes the extreme of a PARTIAL MIN/MAX that
//! ignores retractions (the PARTIAL's input insert-only: [`crate::plan::AggregateCall::monotonic`]),
//! a transition is worth its new value (`+I new`, `+U new`), and a `-D` nothing (NULL).
//! So a PARTIAL worker whose firings its own fold takes emits, instead of the changelog, one
//! row per transition: the key, each column's delta, and the change in the number of live
//! PARTIAL keys (`+1` for `+I`, `0` for an update, `-1` for `-D`), which is the FINAL's record
//! count. The fold (`LocalGroupAggregate::push_deltas`) takes them as inserts per FINAL key;
//! the delta accumulators, and so the FINAL's changelog, are those the changelog would have
//! given, from half the rows and without retracting.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Int64Array, RecordBatch, UInt32Array};
use arrow::compute::{concat, take};
use arrow::datatypes::{DataType, Field, Int64Type, Schema, SchemaRef};
use datafusion_physical_expr::expressions::Column;
use tally_kernels::aggregates::AggregateKind;

use crate::changelog::{ChangeBatch, RowKind};
use crate::error::{Error, Result};
use crate::plan::{AggregateCall, AggregatePlan};

/// The name of a delta batch's last column: the change in live PARTIAL keys a row stands for.
pub const KEYS_DELTA: &str = "$keys_delta";

/// Whether the FINAL aggregate `fin` can take the firings of the PARTIAL aggregate `partial`
/// as delta rows (see the module docs): every PARTIAL result a BIGINT count or, over
/// insert-only input, a MIN/MAX; every FINAL call, without FILTER or DISTINCT, a `$SUM0` of
/// one of the PARTIAL's counts or a MIN/MAX that ignores retractions of one of its MIN/MAX of
/// the same kind, read as it is; and every FINAL key one of the PARTIAL's key columns.
pub fn fits(partial: &AggregatePlan, fin: &AggregatePlan) -> bool {
    let keys = partial.key_types.len();
    let insert_only = !partial.has_retractions();
    let columns = partial
        .calls
        .iter()
        .all(|c| Delta::of(c).is_some_and(|d| insert_only || d == Delta::Count));
    let reads = fin.calls.iter().all(|c| {
        let read = c
            .arg
            .and_then(|a| fin.calc.args[a].downcast_ref::<Column>())
            .and_then(|col| col.index().checked_sub(keys))
            .and_then(|j| partial.calls.get(j));
        !c.distinct
            && c.filter.is_none()
            && read.is_some_and(|p| match (c.kind, Delta::of(p)) {
                (AggregateKind::Sum0, Some(Delta::Count)) => true,
                (AggregateKind::Min | AggregateKind::Max, Some(Delta::Extreme)) => {
                    c.monotonic && c.kind == p.kind
                }
                _ => false,
            })
    });
    // The FINAL's keys are the PARTIAL's (a delta row carries its key as it is).
    let keyed = fin.calc.keys.iter().all(|k| {
        k.downcast_ref::<Column>()
            .is_some_and(|col| col.index() < keys)
    });
    columns && reads && keyed && fin.input_schema.fields() == partial.output_schema.fields()
}

/// What a PARTIAL result column's delta is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Delta {
    /// A BIGINT count, never NULL: the difference.
    Count,
    /// A MIN/MAX: the new value.
    Extreme,
}

impl Delta {
    /// The delta of `call`'s result; `None` where it has none.
    fn of(call: &AggregateCall) -> Option<Self> {
        match call.kind {
            AggregateKind::Min | AggregateKind::Max => Some(Self::Extreme),
            // A $SUM0 of BIGINT is a BIGINT that is never NULL.
            AggregateKind::Count | AggregateKind::CountStar | AggregateKind::Sum0
                if call.result_type == DataType::Int64 =>
            {
                Some(Self::Count)
            }
            _ => None,
        }
    }
}

/// The schema of the delta batches of a PARTIAL whose output schema is `output`: its columns,
/// then [`KEYS_DELTA`].
pub fn delta_schema(output: &Schema) -> SchemaRef {
    let mut fields: Vec<Arc<Field>> = output.fields().iter().cloned().collect();
    fields.push(Arc::new(Field::new(KEYS_DELTA, DataType::Int64, false)));
    Arc::new(Schema::new_with_metadata(fields, output.metadata().clone()))
}

/// Splits a delta batch into the rows (of the PARTIAL's output schema) and the change in live
/// keys of each; `None` when `batch` is not one (another schema, or row kinds).
pub fn split(batch: &ChangeBatch, output: &Schema) -> Option<(ChangeBatch, Int64Array)> {
    let data = &batch.data;
    let n = data.num_columns();
    if batch.op.is_some()
        || n != output.fields().len() + 1
        || data.schema().field(n - 1).name() != KEYS_DELTA
        || data.schema().fields()[..n - 1] != output.fields()[..]
    {
        return None;
    }
    let keys_delta = data.column(n - 1).as_primitive_opt::<Int64Type>()?.clone();
    let rows = data.project(&(0..n - 1).collect::<Vec<_>>()).ok()?;
    Some((ChangeBatch::inserts(rows), keys_delta))
}

/// A PARTIAL worker's delta rows since its last emit: per row the group, the change in live
/// keys, and each result column's delta.
#[derive(Debug)]
pub(crate) struct Deltas {
    schema: SchemaRef,
    groups: Vec<u32>,
    keys_delta: Vec<i64>,
    columns: Vec<Waiting>,
}

/// One result column's deltas waiting.
#[derive(Debug)]
enum Waiting {
    /// A count's differences.
    Counts(Vec<i64>),
    /// A MIN/MAX's new values, a piece per firing.
    Extremes(Vec<ArrayRef>),
}

impl Deltas {
    /// Delta rows for a PARTIAL with output schema `output` and result columns of `calls`
    /// (each a count or a MIN/MAX: [`fits`]).
    pub(crate) fn new(output: &Schema, calls: &[AggregateCall]) -> Self {
        let columns = calls
            .iter()
            .map(|c| match Delta::of(c) {
                Some(Delta::Extreme) => Waiting::Extremes(vec![]),
                _ => Waiting::Counts(vec![]),
            })
            .collect();
        Self {
            schema: delta_schema(output),
            groups: vec![],
            keys_delta: vec![],
            columns,
        }
    }

    /// Adds one firing's transitions, given as the changelog would emit them (`kinds`, their
    /// `groups`, and `picks` of `(0 = old | 1 = new, position)` into `old` and `new`, the
    /// results before and after, a group's at the same position in both). A `-U` is followed
    /// by its `+U`.
    ///
    /// # Errors
    /// A `+U` without its `-U`, or counts that are not BIGINT without NULLs (a bug: [`fits`]
    /// rules them out).
    pub(crate) fn add(
        &mut self,
        kinds: &[RowKind],
        groups: &[u32],
        picks: &[(usize, usize)],
        old: &[ArrayRef],
        new: &[ArrayRef],
    ) -> Result<()> {
        fn bigints(a: &ArrayRef) -> Result<&[i64]> {
            a.as_primitive_opt::<Int64Type>()
                .filter(|a| a.null_count() == 0)
                .map(|a| &a.values()[..])
                .ok_or_else(|| Error::internal("delta rows need BIGINT counts"))
        }
        // Each row's position in `old` and `new`, and its change in live keys.
        let mut rows: Vec<(usize, i64)> = Vec::with_capacity(kinds.len());
        let mut i = 0;
        while i < kinds.len() {
            let delta = match kinds[i] {
                RowKind::Insert => 1,
                RowKind::Delete => -1,
                RowKind::UpdateBefore if kinds.get(i + 1) == Some(&RowKind::UpdateAfter) => {
                    i += 1;
                    0
                }
                _ => return Err(Error::internal("delta rows: a +U without its -U")),
            };
            rows.push((picks[i].1, delta));
            self.groups.push(groups[i]);
            i += 1;
        }
        self.keys_delta.extend(rows.iter().map(|&(_, d)| d));
        for ((out, o), n) in self.columns.iter_mut().zip(old).zip(new) {
            match out {
                // `new` less `old`, where `new` is all zeros for a `-D` and `old` for a `+I`
                // (masks, not branches).
                Waiting::Counts(out) => {
                    let (o, n) = (bigints(o)?, bigints(n)?);
                    out.extend(rows.iter().map(|&(p, d)| {
                        let (keep_new, keep_old) = (-i64::from(d >= 0), -i64::from(d <= 0));
                        (n[p] & keep_new).wrapping_sub(o[p] & keep_old)
                    }));
                }
                // The new value, NULL for a `-D`.
                Waiting::Extremes(pieces) => {
                    let at: UInt32Array = rows
                        .iter()
                        .map(|&(p, d)| (d >= 0).then_some(p as u32))
                        .collect();
                    pieces.push(take(n.as_ref(), &at, None)?);
                }
            }
        }
        Ok(())
    }

    /// The groups of the rows waiting, to build their key columns.
    pub(crate) fn groups(&self) -> &[u32] {
        &self.groups
    }

    /// The rows waiting as one delta batch with `keys` (the key columns of
    /// [`Deltas::groups`]), leaving none; `None` when there are none.
    ///
    /// # Errors
    /// Key columns that do not fit the schema (a bug).
    pub(crate) fn take(&mut self, keys: Vec<ArrayRef>) -> Result<Option<ChangeBatch>> {
        if self.groups.is_empty() {
            return Ok(None);
        }
        let mut columns = keys;
        for c in &mut self.columns {
            columns.push(match c {
                Waiting::Counts(v) => Arc::new(Int64Array::from(std::mem::take(v))),
                Waiting::Extremes(pieces) => {
                    let pieces = std::mem::take(pieces);
                    match pieces.as_slice() {
                        [one] => Arc::clone(one),
                        _ => {
                            let refs: Vec<&dyn Array> = pieces.iter().map(|a| a.as_ref()).collect();
                            concat(&refs)?
                        }
                    }
                }
            });
        }
        columns.push(Arc::new(Int64Array::from(std::mem::take(
            &mut self.keys_delta,
        ))));
        self.groups.clear();
        let batch = RecordBatch::try_new(Arc::clone(&self.schema), columns)
            .map_err(|e| Error::internal(format!("delta batch: {e}")))?;
        Ok(Some(ChangeBatch::inserts(batch)))
    }
}

#[cfg(test)]
mod tests;
