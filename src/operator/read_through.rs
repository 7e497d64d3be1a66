//! A split-distinct FINAL read through: where every FINAL key has exactly one PARTIAL row, the
//! FINAL's results are that row's.
//!
//! On one worker whose state merges the buckets ([`crate::operator::ParallelAggregate`] on the
//! pipelined runtime without checkpoints), the PARTIAL holds one group per query key: all of
//! the key's DISTINCT pairs, counts and MIN/MAX values. The FINAL's calls (`$SUM0` of a count,
//! `SUM`, `MIN`, `MAX` of a PARTIAL result) over that one row give the row's values, and its
//! record count is 1 while the PARTIAL row lives. So the FINAL's changelog is the PARTIAL's,
//! projected onto the FINAL's columns, less the updates whose projected rows did not change (the
//! FINAL emits no update that changes nothing), cut at the PARTIAL's firings instead of the
//! FINAL's own. [`through_columns`] says whether a FINAL is such a function of its one row, and
//! [`ReadThrough`] projects each firing; the FINAL then keeps no state of its own.

use std::sync::Arc;

use arrow::array::{ArrayRef, AsArray, BooleanArray, RecordBatch, UInt32Array};
use arrow::buffer::BooleanBuffer;
use arrow::compute::{filter, take};
use arrow::datatypes::{Int8Type, SchemaRef};
use datafusion_physical_expr::expressions::Column;
use tally_kernels::aggregates::AggregateKind;

use crate::changelog::{ChangeBatch, RowKind};
use crate::error::{Error, Result};
use crate::operator::mini_batch::changed_rows;
use crate::plan::AggregatePlan;

/// How a FINAL reads its one PARTIAL row: for each FINAL output column, the PARTIAL output column
/// it equals, and whether an update of the PARTIAL can leave them all unchanged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThroughColumns {
    /// Per FINAL output column (keys, then calls), the PARTIAL output column.
    pub columns: Vec<usize>,
    /// The FINAL's keys (the first of `columns`).
    pub keys: usize,
    /// Whether some PARTIAL result is read by no FINAL call: a PARTIAL update that changed only
    /// such results leaves the FINAL's row as it was (and so is dropped).
    pub unread: bool,
}

/// For each output column of the FINAL aggregate `fin`, the output column of the PARTIAL
/// aggregate `partial` it equals when the key has exactly one PARTIAL row; `None` unless every
/// FINAL key is one of the PARTIAL's query keys and every FINAL call, without DISTINCT or
/// FILTER, is `SUM`, `MIN` or `MAX` of a PARTIAL result (the value itself over one row, NULL
/// included) or `$SUM0` of a PARTIAL count (never NULL), of the same type.
pub fn through_columns(partial: &AggregatePlan, fin: &AggregatePlan) -> Option<ThroughColumns> {
    let keys = partial.key_types.len();
    let query_keys = keys - partial.bucket_keys.as_ref().map_or(0, |b| b.columns);
    if fin.input_schema.fields() != partial.output_schema.fields() {
        return None;
    }
    let column = |e: &Arc<dyn datafusion_physical_expr::PhysicalExpr>| {
        e.downcast_ref::<Column>().map(Column::index)
    };
    let mut columns = Vec::with_capacity(fin.output_schema.fields().len());
    for k in &fin.calc.keys {
        columns.push(column(k).filter(|&c| c < query_keys)?);
    }
    for call in &fin.calls {
        if call.distinct || call.filter.is_some() {
            return None;
        }
        let c = column(&fin.calc.args[call.arg?]).filter(|&c| c >= keys)?;
        let read = partial.calls.get(c - keys)?;
        let same = match call.kind {
            AggregateKind::Sum | AggregateKind::Min | AggregateKind::Max => true,
            AggregateKind::Sum0 => matches!(
                read.kind,
                AggregateKind::Count | AggregateKind::CountStar | AggregateKind::Sum0
            ),
            _ => false,
        };
        if !same {
            return None;
        }
        columns.push(c);
    }
    let types_match = columns
        .iter()
        .zip(fin.output_schema.fields())
        .all(|(&c, f)| partial.output_schema.field(c).data_type() == f.data_type());
    let unread =
        (keys..keys + partial.calls.len()).any(|c| !columns[fin.calc.keys.len()..].contains(&c));
    types_match.then_some(ThroughColumns {
        keys: fin.calc.keys.len(),
        columns,
        unread,
    })
}

/// The projection of a PARTIAL's firings onto its FINAL's output ([`through_columns`]).
#[derive(Debug, Clone)]
pub struct ReadThrough {
    columns: ThroughColumns,
    output: SchemaRef,
    emit_update_before: bool,
}

impl ReadThrough {
    /// Reads `columns` of each firing ([`through_columns`]) as rows of `output`, with or
    /// without the `-U` rows.
    pub fn new(columns: ThroughColumns, output: SchemaRef, emit_update_before: bool) -> Self {
        Self {
            columns,
            output,
            emit_update_before,
        }
    }

    /// The FINAL's output schema.
    pub fn output(&self) -> &SchemaRef {
        &self.output
    }

    /// One firing of the PARTIAL (its changelog: `+I`, `-U` then `+U` of a key, `-D`) as the
    /// FINAL's changes; `None` when none is left.
    ///
    /// # Errors
    /// A firing whose row kinds are not codes, or whose columns do not fit the output.
    pub fn read(&self, firing: &ChangeBatch) -> Result<Option<ChangeBatch>> {
        let n = firing.num_rows();
        if n == 0 {
            return Ok(None);
        }
        let columns: Vec<ArrayRef> = self
            .columns
            .columns
            .iter()
            .map(|&c| Arc::clone(firing.data.column(c)))
            .collect();
        let keep = match &firing.op {
            None => None,
            Some(op) => self.kept(op, &columns)?,
        };
        let data = RecordBatch::try_new(Arc::clone(&self.output), columns)
            .map_err(|e| Error::internal(format!("a FINAL read through: {e}")))?;
        let Some(keep) = keep else {
            return Ok(Some(ChangeBatch {
                op: firing.op.clone(),
                data,
            }));
        };
        let op = firing.op.as_ref().map(|o| filter(o, &keep)).transpose()?;
        let data = arrow::compute::filter_record_batch(&data, &keep)?;
        Ok((data.num_rows() > 0).then_some(ChangeBatch { op, data }))
    }

    /// The rows to keep (`None`: all): not the `-U`/`+U` pairs whose projected rows are equal,
    /// nor any `-U` without update-before. A pair is one key's (its key columns equal), and
    /// the PARTIAL emits a pair only where a result changed: only the results are compared,
    /// and only where some are not read.
    fn kept(&self, op: &ArrayRef, columns: &[ArrayRef]) -> Result<Option<BooleanArray>> {
        if !self.columns.unread && self.emit_update_before {
            return Ok(None);
        }
        let codes = op
            .as_primitive_opt::<Int8Type>()
            .ok_or_else(|| Error::internal("row kinds that are not Int8 codes"))?
            .values();
        let before = RowKind::UpdateBefore.code();
        let after = RowKind::UpdateAfter.code();
        let (mut olds, mut news) = (vec![], vec![]);
        for i in 0..codes.len().saturating_sub(1) {
            if codes[i] == before && codes[i + 1] == after {
                olds.push(i as u32);
                news.push(i as u32 + 1);
            }
        }
        if olds.is_empty() {
            return Ok(None);
        }
        let (olds, news) = (UInt32Array::from(olds), UInt32Array::from(news));
        let changed = if self.columns.unread {
            let results = &columns[self.columns.keys..];
            let pick = |at: &UInt32Array| {
                results
                    .iter()
                    .map(|c| take(c, at, None))
                    .collect::<std::result::Result<Vec<_>, _>>()
            };
            changed_rows(&pick(&olds)?, &pick(&news)?)?
        } else {
            BooleanBuffer::new_set(olds.len())
        };
        let mut keep = vec![true; codes.len()];
        for (p, (&o, &n)) in olds.values().iter().zip(news.values()).enumerate() {
            let kept = changed.value(p);
            keep[o as usize] = kept && self.emit_update_before;
            keep[n as usize] = kept;
        }
        Ok(Some(BooleanArray::from(keep)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int8Array, Int64Array, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};

    fn firing(kinds: &[RowKind], keys: &[&str], counts: &[i64], other: &[i64]) -> ChangeBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Utf8, true),
            Field::new("other", DataType::Int64, false),
            Field::new("n", DataType::Int64, false),
        ]));
        let data = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(StringArray::from(keys.to_vec())),
                Arc::new(Int64Array::from(other.to_vec())),
                Arc::new(Int64Array::from(counts.to_vec())),
            ],
        )
        .unwrap();
        let codes: Vec<i8> = kinds.iter().map(|k| k.code()).collect();
        ChangeBatch::try_new(Some(Arc::new(Int8Array::from(codes))), data).unwrap()
    }

    fn output() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("k", DataType::Utf8, true),
            Field::new("n", DataType::Int64, false),
        ]))
    }

    fn rows(b: &ChangeBatch) -> Vec<String> {
        let kinds = b.row_kinds().unwrap();
        let k = b.data.column(0).as_string::<i32>();
        let n = b
            .data
            .column(1)
            .as_primitive::<arrow::datatypes::Int64Type>();
        (0..b.num_rows())
            .map(|i| format!("{}[{}, {}]", kinds[i].short(), k.value(i), n.value(i)))
            .collect()
    }

    /// The projection keeps inserts, deletes and updates that change the FINAL's columns, and
    /// drops the updates that only changed a column the FINAL does not read.
    #[test]
    fn updates_that_change_nothing_read_are_dropped() {
        use RowKind::*;
        let f = firing(
            &[
                Insert,
                UpdateBefore,
                UpdateAfter,
                UpdateBefore,
                UpdateAfter,
                Delete,
            ],
            &["a", "b", "b", "c", "c", "d"],
            &[1, 2, 3, 4, 4, 5],
            &[0, 1, 2, 1, 2, 0],
        );
        let columns = ThroughColumns {
            columns: vec![0, 2],
            keys: 1,
            unread: true,
        };
        let through = ReadThrough::new(columns.clone(), output(), true);
        let got = rows(&through.read(&f).unwrap().unwrap());
        assert_eq!(got, ["+I[a, 1]", "-U[b, 2]", "+U[b, 3]", "-D[d, 5]"]);
        let upsert = ReadThrough::new(columns.clone(), output(), false);
        let got = rows(&upsert.read(&f).unwrap().unwrap());
        assert_eq!(got, ["+I[a, 1]", "+U[b, 3]", "-D[d, 5]"]);
        // A firing of unchanged updates only leaves nothing.
        let same = firing(&[UpdateBefore, UpdateAfter], &["c", "c"], &[4, 4], &[1, 2]);
        assert!(through.read(&same).unwrap().is_none());
        // Where the FINAL reads every result, every update the PARTIAL emits is kept as it is.
        let all = ReadThrough::new(
            ThroughColumns {
                unread: false,
                ..columns
            },
            output(),
            true,
        );
        assert_eq!(all.read(&same).unwrap().unwrap().num_rows(), 2);
    }
}
