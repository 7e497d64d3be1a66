//! FILTER expressions folded over a column that holds one value in a batch.
//!
//! Split-distinct hands the PARTIAL aggregate one batch per group set of its Expand, each with
//! the set's id in every row of `$e`, and each partial call's FILTER ends in `AND $e = id`
//! (Flink's shape). Evaluated as written, every call compares `$e` row by row, ANDs and tests
//! for TRUE on every set's rows, although on a set's batch the comparison is one constant: the
//! filters of the other sets are FALSE throughout and those of the set reduce to the user's
//! condition. Folding `$e` to its value first evaluates exactly that. A Calc folds each set's
//! FILTERs once and reads each `$e` array of an Expand once ([`SetMemo`]), not per batch.

use std::sync::{Arc, RwLock};

use arrow::array::{Array, AsArray, RecordBatch, RecordBatchOptions};
use arrow::buffer::ScalarBuffer;
use arrow::datatypes::{DataType, Int64Type, Schema};
use datafusion_common::ScalarValue;
use datafusion_expr::Operator;
use datafusion_physical_expr::PhysicalExpr;
use datafusion_physical_expr::expressions::{BinaryExpr, Column, Literal};

use crate::error::Result;

/// The column whose constant value is folded into the filters: the Expand's set id.
pub(crate) const SET_ID_COLUMN: &str = "$e";

/// The index and values of the [`SET_ID_COLUMN`] of `batch` when it is a non-empty Int64
/// column without NULLs.
fn set_id_values(batch: &RecordBatch) -> Option<(usize, &ScalarBuffer<i64>)> {
    let c = batch.schema().index_of(SET_ID_COLUMN).ok()?;
    let a = batch.column(c);
    if a.data_type() != &DataType::Int64 || a.is_empty() || a.null_count() > 0 {
        return None;
    }
    Some((c, a.as_primitive::<Int64Type>().values()))
}

/// The one value `values` (non-empty) hold, if they hold one.
fn one_value(values: &[i64]) -> Option<i64> {
    let v = values[0];
    // Every value compared (no early exit) as the OR of its bits' differences, so that the loop
    // vectorizes.
    let differs = values.iter().fold(0i64, |acc, &x| acc | (x ^ v));
    (differs == 0).then_some(v)
}

/// A group set's batch as a Calc sees it: its set id (the [`SET_ID_COLUMN`]'s index and its one
/// value), and the Calc's FILTERs with the id folded in ([`fold_column`]), in the Calc's order.
#[derive(Debug)]
pub(crate) struct SetFilters {
    /// The index of the set id column.
    pub(crate) column: usize,
    /// The set id.
    pub(crate) id: i64,
    /// Each FILTER with the set id folded in.
    pub(crate) filters: Vec<Arc<dyn PhysicalExpr>>,
}

/// The most `$e` buffers, and the most set ids, a [`SetMemo`] keeps before it starts afresh (an
/// Expand has a few sets, and remakes its `$e` arrays only for a longer batch).
const MEMO_ENTRIES: usize = 16;

/// What a Calc has learnt of the group sets' batches, so that a batch costs neither a pass over
/// its `$e` nor folding its FILTERs again: the `$e` buffers found to hold one value (an
/// Expand's set batches slice the one `$e` array it keeps per set, so a batch whose `$e` starts
/// where a buffer found constant starts, and is no longer, holds its value), and per set id the
/// FILTERs with it folded in. Kept behind a lock, as the Calc is shared by the sources.
#[derive(Debug, Default)]
pub(crate) struct SetMemo(RwLock<Memo>);

#[derive(Debug, Default)]
struct Memo {
    /// `$e` values found to hold one value, and that value. Kept, the buffers cannot be freed
    /// and their memory reused for other values.
    constant: Vec<(ScalarBuffer<i64>, i64)>,
    sets: Vec<Arc<SetFilters>>,
}

impl SetMemo {
    /// The set of `batch` (its [`SET_ID_COLUMN`]'s index and its one value, where it is an
    /// Int64 column holding one non-NULL value in every row) with `filters` folded for it;
    /// None where `batch` has no constant set id.
    ///
    /// # Errors
    /// When folding a FILTER fails.
    pub(crate) fn set_of(
        &self,
        batch: &RecordBatch,
        filters: &[Arc<dyn PhysicalExpr>],
    ) -> Result<Option<Arc<SetFilters>>> {
        let Some((column, id)) = self.set_id(batch) else {
            return Ok(None);
        };
        {
            let memo = self.0.read().unwrap_or_else(|e| e.into_inner());
            if let Some(s) = memo.sets.iter().find(|s| s.column == column && s.id == id) {
                return Ok(Some(Arc::clone(s)));
            }
        }
        let value = ScalarValue::Int64(Some(id));
        let set = Arc::new(SetFilters {
            column,
            id,
            filters: filters
                .iter()
                .map(|f| fold_column(f, column, &value))
                .collect::<Result<_>>()?,
        });
        let mut memo = self.0.write().unwrap_or_else(|e| e.into_inner());
        if memo.sets.len() >= MEMO_ENTRIES {
            memo.sets.clear();
        }
        memo.sets.push(Arc::clone(&set));
        Ok(Some(set))
    }

    /// The index and value of `batch`'s constant set id, reading the `$e` values only where
    /// they are not known to hold one value.
    fn set_id(&self, batch: &RecordBatch) -> Option<(usize, i64)> {
        let (c, values) = set_id_values(batch)?;
        let within = |known: &ScalarBuffer<i64>| {
            known.as_ptr() == values.as_ptr() && values.len() <= known.len()
        };
        {
            let memo = self.0.read().unwrap_or_else(|e| e.into_inner());
            if let Some(&(_, v)) = memo.constant.iter().find(|(known, _)| within(known)) {
                return Some((c, v));
            }
        }
        let v = one_value(values)?;
        let mut memo = self.0.write().unwrap_or_else(|e| e.into_inner());
        if memo.constant.len() >= MEMO_ENTRIES {
            memo.constant.clear();
        }
        memo.constant.push((values.clone(), v));
        Some((c, v))
    }
}

/// `expr` with column `column` replaced by `value`, and every comparison of two literals, and
/// every AND with a TRUE or FALSE literal, that this makes constant folded.
///
/// # Errors
/// When a comparison of two literals fails to evaluate.
pub(crate) fn fold_column(
    expr: &Arc<dyn PhysicalExpr>,
    column: usize,
    value: &ScalarValue,
) -> Result<Arc<dyn PhysicalExpr>> {
    if let Some(c) = expr.downcast_ref::<Column>() {
        return Ok(if c.index() == column {
            Arc::new(Literal::new(value.clone()))
        } else {
            Arc::clone(expr)
        });
    }
    let Some(b) = expr.downcast_ref::<BinaryExpr>() else {
        // Anything else stays as it is: its columns are evaluated as they come.
        return Ok(Arc::clone(expr));
    };
    let l = fold_column(b.left(), column, value)?;
    let r = fold_column(b.right(), column, value)?;
    let boolean = |e: &Arc<dyn PhysicalExpr>| match e.downcast_ref::<Literal>()?.value() {
        ScalarValue::Boolean(Some(v)) => Some(*v),
        _ => None,
    };
    if *b.op() == Operator::And {
        match (boolean(&l), boolean(&r)) {
            (Some(false), _) | (_, Some(false)) => return Ok(literal(false)),
            (Some(true), _) => return Ok(r),
            (_, Some(true)) => return Ok(l),
            _ => {}
        }
    }
    let constant = l.downcast_ref::<Literal>().is_some() && r.downcast_ref::<Literal>().is_some();
    let folded: Arc<dyn PhysicalExpr> = Arc::new(BinaryExpr::new(l, *b.op(), r));
    if constant {
        let one_row = RecordBatch::try_new_with_options(
            Arc::new(Schema::empty()),
            vec![],
            &RecordBatchOptions::new().with_row_count(Some(1)),
        )?;
        let v = folded.evaluate(&one_row)?.into_array(1)?;
        return Ok(Arc::new(Literal::new(ScalarValue::try_from_array(&v, 0)?)));
    }
    Ok(folded)
}

fn literal(v: bool) -> Arc<dyn PhysicalExpr> {
    Arc::new(Literal::new(ScalarValue::Boolean(Some(v))))
}

/// The value of `expr` when it is a boolean literal (NULL: None, as a FILTER takes it: no row).
pub(crate) fn constant_filter(expr: &Arc<dyn PhysicalExpr>) -> Option<bool> {
    match expr.downcast_ref::<Literal>()?.value() {
        ScalarValue::Boolean(v) => Some(v.unwrap_or(false)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{ArrayRef, BooleanArray, Int64Array};
    use arrow::datatypes::Field;

    fn col(name: &str, i: usize) -> Arc<dyn PhysicalExpr> {
        Arc::new(Column::new(name, i))
    }
    fn int(v: i64) -> Arc<dyn PhysicalExpr> {
        Arc::new(Literal::new(ScalarValue::Int64(Some(v))))
    }
    fn bin(
        l: Arc<dyn PhysicalExpr>,
        op: Operator,
        r: Arc<dyn PhysicalExpr>,
    ) -> Arc<dyn PhysicalExpr> {
        Arc::new(BinaryExpr::new(l, op, r))
    }
    /// The index and one value of `batch`'s set id column, if it holds one.
    fn constant_set_id(batch: &RecordBatch) -> Option<(usize, i64)> {
        let (c, values) = set_id_values(batch)?;
        Some((c, one_value(values)?))
    }

    /// `(cond AND $e = id) IS TRUE`, as the physical planner writes IS TRUE.
    fn partial_filter(cond: Option<Arc<dyn PhysicalExpr>>, id: i64) -> Arc<dyn PhysicalExpr> {
        let g = bin(col("$e", 1), Operator::Eq, int(id));
        let f = match cond {
            Some(c) => bin(c, Operator::And, g),
            None => g,
        };
        bin(f, Operator::IsNotDistinctFrom, literal(true))
    }

    /// Folded on a batch whose `$e` is constant, each filter selects what it selects as written.
    #[test]
    fn folded_filters_select_what_they_select_as_written() {
        let flag: ArrayRef = Arc::new(BooleanArray::from(vec![
            Some(true),
            Some(false),
            None,
            Some(true),
        ]));
        let schema = Arc::new(Schema::new(vec![
            Field::new("f", DataType::Boolean, true),
            Field::new("$e", DataType::Int64, false),
        ]));
        for set in [1i64, 2, 3] {
            let e: ArrayRef = Arc::new(Int64Array::from(vec![set; 4]));
            let batch =
                RecordBatch::try_new(Arc::clone(&schema), vec![Arc::clone(&flag), e]).unwrap();
            assert_eq!(constant_set_id(&batch), Some((1, set)));
            for id in [1i64, 2, 3] {
                for cond in [None, Some(col("f", 0))] {
                    let written = partial_filter(cond.clone(), id);
                    let folded = fold_column(&written, 1, &ScalarValue::Int64(Some(set))).unwrap();
                    let selected = |e: &Arc<dyn PhysicalExpr>| -> Vec<bool> {
                        let a = e.evaluate(&batch).unwrap().into_array(4).unwrap();
                        a.as_boolean().iter().map(|v| v == Some(true)).collect()
                    };
                    let want = selected(&written);
                    match constant_filter(&folded) {
                        Some(v) => assert_eq!(want, vec![v; 4], "set {set} id {id} {cond:?}"),
                        None => assert_eq!(selected(&folded), want, "set {set} id {id} {cond:?}"),
                    }
                    // The other sets' filters fold away, and so does the set's own `$e = id`.
                    if id != set || cond.is_none() {
                        assert!(
                            constant_filter(&folded).is_some(),
                            "set {set} id {id}: {folded}"
                        );
                    }
                }
            }
        }
        // `$e` not constant: nothing to fold.
        let e: ArrayRef = Arc::new(Int64Array::from(vec![1, 2, 1, 1]));
        let batch = RecordBatch::try_new(schema, vec![flag, e]).unwrap();
        assert_eq!(constant_set_id(&batch), None);
    }

    /// A batch whose `$e` starts where a buffer found constant starts and is no longer gets its
    /// value without a scan; a longer one, or one elsewhere, is read. A set's FILTERs are
    /// folded once.
    #[test]
    fn set_ids_are_remembered_for_the_buffers_read() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("f", DataType::Boolean, true),
            Field::new("$e", DataType::Int64, false),
        ]));
        let e = Int64Array::from(vec![5, 5, 5, 5, 7, 7]);
        let batch = |offset: usize, len: usize| {
            let flag: ArrayRef = Arc::new(BooleanArray::from(vec![Some(true); len]));
            RecordBatch::try_new(
                Arc::clone(&schema),
                vec![flag, Arc::new(e.slice(offset, len))],
            )
            .unwrap()
        };
        let filters = vec![
            partial_filter(Some(col("f", 0)), 5),
            partial_filter(None, 7),
        ];
        let memo = SetMemo::default();
        let id = |b: &RecordBatch| memo.set_of(b, &filters).unwrap().map(|s| s.id);
        assert_eq!(id(&batch(0, 4)), Some(5));
        // The same start, longer: the 7s are read, not taken for 5s.
        assert_eq!(id(&batch(0, 6)), None);
        assert_eq!(id(&batch(0, 3)), Some(5));
        assert_eq!(id(&batch(4, 2)), Some(7));
        assert_eq!(id(&batch(3, 2)), None);
        // Folded once per set: the same set comes back; its own FILTER keeps the condition,
        // the other set's folds to FALSE.
        let five = memo.set_of(&batch(0, 2), &filters).unwrap().unwrap();
        assert!(Arc::ptr_eq(
            &five,
            &memo.set_of(&batch(1, 2), &filters).unwrap().unwrap()
        ));
        assert_eq!(five.column, 1);
        assert_eq!(constant_filter(&five.filters[0]), None);
        assert_eq!(constant_filter(&five.filters[1]), Some(false));
    }
}
