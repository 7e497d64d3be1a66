//! The [`Calc`] of an aggregate: its key, argument and FILTER expressions, evaluated once per
//! batch into a [`CalcBatch`].

use std::collections::BTreeSet;
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::array::{Array, ArrayRef, AsArray, new_null_array};
use arrow::buffer::BooleanBuffer;
use datafusion_physical_expr::PhysicalExpr;
use datafusion_physical_expr::expressions::Column;

use super::columns::{ColumnUses, columns_read};
use super::fold::{SetFilters, SetMemo};
use super::{dictionary_eq, fold};
use crate::changelog::ChangeBatch;
use crate::error::{Error, Result};

/// Evaluates the key, argument and filter expressions of a query on input batches.
#[derive(Debug)]
pub struct Calc {
    /// Group key expressions.
    pub keys: Vec<Arc<dyn PhysicalExpr>>,
    /// Distinct aggregate argument expressions.
    pub args: Vec<Arc<dyn PhysicalExpr>>,
    /// The arguments as written (for EXPLAIN).
    pub arg_names: Vec<String>,
    /// Distinct FILTER expressions.
    pub filters: Vec<Arc<dyn PhysicalExpr>>,
    /// The filters as written (for EXPLAIN).
    pub filter_names: Vec<String>,
    /// Per argument, the FILTER of each call that reads it (`None` for a call without one).
    /// On a split's set batch, an argument all of whose calls have a FILTER that is FALSE
    /// throughout is not evaluated (see [`Calc::evaluate`]).
    pub arg_filters: Vec<Vec<Option<usize>>>,
    /// The group sets' batches seen: their ids and the FILTERs folded for them.
    pub(super) sets: SetMemo,
}

impl Clone for Calc {
    /// The same expressions, with a memo of group sets of its own (a cache, refilled as sets
    /// are seen).
    fn clone(&self) -> Self {
        Self {
            keys: self.keys.clone(),
            args: self.args.clone(),
            arg_names: self.arg_names.clone(),
            filters: self.filters.clone(),
            filter_names: self.filter_names.clone(),
            arg_filters: self.arg_filters.clone(),
            sets: SetMemo::default(),
        }
    }
}

/// A batch after [`Calc`]: every column the aggregation needs.
#[derive(Debug, Clone)]
pub struct CalcBatch {
    /// Rows.
    pub num_rows: usize,
    /// Group key columns.
    pub keys: Vec<ArrayRef>,
    /// Argument columns.
    pub args: Vec<ArrayRef>,
    /// FILTER masks (NULL already false).
    pub filters: Vec<BooleanBuffer>,
    /// Retracting rows (`-U`/`-D`), when the input is a changelog.
    pub retract: Option<BooleanBuffer>,
}

impl CalcBatch {
    /// Rows `offset..offset + len`, zero-copy.
    pub fn slice(&self, offset: usize, len: usize) -> CalcBatch {
        CalcBatch {
            num_rows: len,
            keys: self.keys.iter().map(|a| a.slice(offset, len)).collect(),
            args: self.args.iter().map(|a| a.slice(offset, len)).collect(),
            filters: self.filters.iter().map(|f| f.slice(offset, len)).collect(),
            retract: self.retract.as_ref().map(|r| r.slice(offset, len)),
        }
    }

    /// The rows at `indices`, in that order.
    ///
    /// # Errors
    /// An index out of range (a bug).
    pub fn take(&self, indices: &arrow::array::UInt32Array) -> Result<CalcBatch> {
        let take = |a: &ArrayRef| arrow::compute::take(a.as_ref(), indices, None);
        let idx = indices.values();
        let take_bits = |b: &BooleanBuffer| {
            BooleanBuffer::collect_bool(idx.len(), |i| b.value(idx[i] as usize))
        };
        Ok(CalcBatch {
            num_rows: indices.len(),
            keys: self.keys.iter().map(take).collect::<Result<_, _>>()?,
            args: self.args.iter().map(take).collect::<Result<_, _>>()?,
            filters: self.filters.iter().map(take_bits).collect(),
            retract: self.retract.as_ref().map(take_bits),
        })
    }
}

impl Calc {
    /// The input columns (by index) its expressions read.
    pub fn columns_read(&self) -> BTreeSet<usize> {
        columns_read(self.keys.iter().chain(&self.args).chain(&self.filters))
    }

    /// Evaluates the group key expressions alone on `batch` (to route rows by key).
    ///
    /// # Errors
    /// When evaluation fails.
    pub fn evaluate_keys(&self, batch: &RecordBatch) -> Result<Vec<ArrayRef>> {
        let n = batch.num_rows();
        self.keys
            .iter()
            .map(|p| Ok(p.evaluate(batch)?.into_array(n)?))
            .collect()
    }

    /// Evaluates every expression on `batch`. On a split's set batch (`$e` one value
    /// throughout), the set id is folded into the FILTERs, and an argument (other than a plain
    /// column) read only by calls whose FILTER is then FALSE is not evaluated: those calls take
    /// no row of the batch, and it is NULL.
    ///
    /// # Errors
    /// When evaluation fails (a failing cast, say) or the changelog column is bad.
    pub fn evaluate(&self, changes: &ChangeBatch) -> Result<CalcBatch> {
        // A split's set batch: its id folded into the filters (`fold`).
        let set = self.set_of(&changes.data)?;
        self.evaluate_in_set(changes, set.as_deref())
    }

    /// The group set of `batch` (a split's set batch: its `$e` holds one value) with the FILTERs
    /// folded for it; None for a batch of no set. Each set's FILTERs are folded once, and each
    /// `$e` array of an Expand read once ([`fold::SetMemo`]).
    ///
    /// # Errors
    /// When folding a FILTER fails.
    pub(crate) fn set_of(&self, batch: &RecordBatch) -> Result<Option<Arc<SetFilters>>> {
        self.sets.set_of(batch, &self.filters)
    }

    /// [`Calc::evaluate`] of a batch whose set the caller found ([`Calc::set_of`]), or None
    /// where it has none.
    ///
    /// # Errors
    /// As [`Calc::evaluate`].
    pub(crate) fn evaluate_in_set(
        &self,
        changes: &ChangeBatch,
        set: Option<&SetFilters>,
    ) -> Result<CalcBatch> {
        let batch = &changes.data;
        let n = batch.num_rows();
        let keys = self.evaluate_keys(batch)?;
        let filters = set.map_or(&self.filters, |s| &s.filters);
        let (filters, never) = self.masks(n, |f| filter_mask(&filters[f], batch))?;
        let args = self.evaluate_args(batch, &never)?;
        let retract = changes.retract_mask()?;
        Ok(CalcBatch {
            num_rows: n,
            keys,
            args,
            filters,
            retract,
        })
    }

    /// Evaluates the group sets of one Expand of the same input rows (`sets`, one batch per
    /// set, each with its id in every row of `$e`) as one batch of those rows: a FILTER's mask is
    /// the OR of its masks on the sets. Where every FILTER tests its call's set id (`$e = id`,
    /// as the split rewrite's PARTIAL calls all do), each call then takes a row where it would
    /// take it on its own set's batch, and nowhere else: folding the one batch folds what the
    /// sets' batches would, reading the rows once. The keys are the first set's (its bucket
    /// columns among them), the arguments evaluated once (an Expand passes them through).
    ///
    /// # Errors
    /// No sets, sets of different lengths or without a constant set id (a bug); as
    /// [`Calc::evaluate`].
    pub fn evaluate_sets(&self, sets: &[ChangeBatch]) -> Result<CalcBatch> {
        let first = sets
            .first()
            .ok_or_else(|| Error::internal("no group sets to evaluate"))?;
        let n = first.num_rows();
        let ids = sets
            .iter()
            .map(|s| {
                self.set_of(&s.data)?
                    .filter(|_| s.num_rows() == n)
                    .ok_or_else(|| Error::internal("group sets of other lengths or without an id"))
            })
            .collect::<Result<Vec<_>>>()?;
        let (filters, never) = self.masks(n, |f| {
            let mut mask: Option<BooleanBuffer> = None;
            for (s, set) in sets.iter().zip(&ids) {
                if let Some(m) = filter_mask(&set.filters[f], &s.data)? {
                    mask = Some(match mask {
                        Some(acc) => &acc | &m,
                        None => m,
                    });
                }
            }
            Ok(mask)
        })?;
        Ok(CalcBatch {
            num_rows: n,
            keys: self.evaluate_keys(&first.data)?,
            args: self.evaluate_args(&first.data, &never)?,
            filters,
            retract: first.retract_mask()?,
        })
    }

    /// Each FILTER's mask over `n` rows, FILTER `f`'s from `mask_of(f)` (None: FALSE
    /// throughout, all false), and which FILTERs are FALSE throughout.
    fn masks(
        &self,
        n: usize,
        mask_of: impl Fn(usize) -> Result<Option<BooleanBuffer>>,
    ) -> Result<(Vec<BooleanBuffer>, Vec<bool>)> {
        let mut never = vec![false; self.filters.len()];
        let masks = never
            .iter_mut()
            .enumerate()
            .map(|(f, never)| {
                let mask = mask_of(f)?;
                *never = mask.is_none();
                Ok(mask.unwrap_or_else(|| BooleanBuffer::new_unset(n)))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok((masks, never))
    }

    /// The arguments on `batch`: NULL (not evaluated) where one other than a plain column is
    /// read only by calls whose FILTER is FALSE throughout (`never`, by filter).
    fn evaluate_args(&self, batch: &RecordBatch, never: &[bool]) -> Result<Vec<ArrayRef>> {
        let n = batch.num_rows();
        let unread = |a: usize, p: &Arc<dyn PhysicalExpr>| {
            p.downcast_ref::<Column>().is_none()
                && self.arg_filters.get(a).is_some_and(|calls| {
                    !calls.is_empty() && calls.iter().all(|f| f.is_some_and(|f| never[f]))
                })
        };
        self.args
            .iter()
            .enumerate()
            .map(|(a, p)| {
                Ok(if unread(a, p) {
                    new_null_array(&p.data_type(batch.schema_ref())?, n)
                } else {
                    p.evaluate(batch)?.into_array(n)?
                })
            })
            .collect()
    }
}

impl Calc {
    /// How its expressions use the input columns ([`ColumnUses`]): keys and FILTERs may read a
    /// string column as a dictionary, arguments read it plain.
    pub fn column_uses(&self) -> ColumnUses {
        let mut uses = ColumnUses::default();
        uses.keys(&self.keys);
        uses.predicates(&self.filters);
        uses.plain(&self.args);
        uses
    }
}

/// The mask of FILTER `p` on `batch` (NULL read as false); None where it is FALSE throughout
/// (a literal, as a FILTER folded for another set is).
fn filter_mask(p: &Arc<dyn PhysicalExpr>, batch: &RecordBatch) -> Result<Option<BooleanBuffer>> {
    let n = batch.num_rows();
    if let Some(all) = fold::constant_filter(p) {
        return Ok(all.then(|| BooleanBuffer::new_set(n)));
    }
    let a: ArrayRef = match dictionary_eq::eval_dictionary_eq(p, batch)? {
        Some(b) => Arc::new(b),
        None => p.evaluate(batch)?.into_array(n)?,
    };
    let b = a
        .as_boolean_opt()
        .ok_or_else(|| Error::internal(format!("filter evaluated to {}", a.data_type())))?;
    Ok(Some(match b.nulls() {
        Some(nulls) => b.values() & nulls.inner(),
        None => b.values().clone(),
    }))
}

#[cfg(test)]
mod tests {
    use arrow::array::{Int64Array, RecordBatch};
    use arrow::datatypes::{DataType, Field, Int64Type, Schema};
    use datafusion_expr::{ExprFunctionExt, col, lit};

    use super::*;
    use crate::plan::AggregatePlan;

    /// A split set's rows: key `k`, argument `x`, the set id `$e`.
    fn set_schema() -> Arc<Schema> {
        Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("x", DataType::Int64, true),
            Field::new("$e", DataType::Int64, false),
        ]))
    }

    /// A batch of set `id` of [`set_schema`]: keys `1..`, the given `x`.
    fn set_batch(id: i64, x: &[Option<i64>]) -> ChangeBatch {
        let n = x.len();
        let data = RecordBatch::try_new(
            set_schema(),
            vec![
                Arc::new(Int64Array::from_iter_values(1..=n as i64)),
                Arc::new(Int64Array::from(x.to_vec())),
                Arc::new(Int64Array::from(vec![id; n])),
            ],
        )
        .unwrap();
        ChangeBatch::inserts(data)
    }

    /// On a split's set batch an argument whose calls all take no row of it is NULL (not
    /// evaluated); on the set its calls take it is evaluated, and a plain column always is.
    #[test]
    fn arguments_only_other_sets_read_are_not_evaluated() {
        let schema = set_schema();
        let on = |id: i64| col("$e").eq(lit(id));
        let plan = AggregatePlan::try_new(
            Arc::clone(&schema),
            &[col("k")],
            &[
                crate::aggregates::max(col("x") + lit(1i64))
                    .filter(on(3))
                    .build()
                    .unwrap(),
                crate::aggregates::count(col("x"))
                    .distinct()
                    .filter(on(5))
                    .build()
                    .unwrap(),
                crate::aggregates::count_star()
                    .filter(on(6))
                    .build()
                    .unwrap(),
            ],
            None,
        )
        .unwrap();
        assert_eq!(plan.calc.args.len(), 2);
        let batch = |set: i64| {
            let rows = set_batch(set, &[Some(10), None, Some(30)]);
            plan.calc.evaluate(&rows).unwrap()
        };
        let values = |a: &ArrayRef| a.as_primitive::<Int64Type>().iter().collect::<Vec<_>>();
        let plus_one = plan
            .calc
            .arg_names
            .iter()
            .position(|n| n.contains('+'))
            .unwrap();
        let x = 1 - plus_one;
        let set3 = batch(3);
        assert_eq!(values(&set3.args[plus_one]), [Some(11), None, Some(31)]);
        for set in [5, 6] {
            let b = batch(set);
            assert_eq!(b.args[plus_one].null_count(), 3, "set {set}");
            assert_eq!(values(&b.args[x]), [Some(10), None, Some(30)], "set {set}");
        }
        // Not a set batch (`$e` not constant): every argument is evaluated.
        let mixed = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![
                Arc::new(Int64Array::from(vec![1, 2])),
                Arc::new(Int64Array::from(vec![Some(1), Some(2)])),
                Arc::new(Int64Array::from(vec![5, 6])),
            ],
        )
        .unwrap();
        let b = plan.calc.evaluate(&ChangeBatch::inserts(mixed)).unwrap();
        assert_eq!(values(&b.args[plus_one]), [Some(2), Some(3)]);
    }

    /// An Expand's sets evaluated as one batch: each FILTER's mask is the OR of its masks on
    /// the sets (here the one set whose id it tests), a FILTER no set passes is all false, the
    /// arguments are evaluated once (an argument no set's FILTER reads is not), and sets that
    /// are not of one Expand are refused.
    #[test]
    fn sets_evaluate_as_one_batch_of_their_rows() {
        let schema = set_schema();
        let on = |id: i64| col("$e").eq(lit(id));
        let plan = AggregatePlan::try_new(
            Arc::clone(&schema),
            &[col("k")],
            &[
                crate::aggregates::count(col("x"))
                    .distinct()
                    .filter(col("x").gt(lit(15i64)).and(on(1)))
                    .build()
                    .unwrap(),
                crate::aggregates::count_star()
                    .filter(on(2))
                    .build()
                    .unwrap(),
                crate::aggregates::max(col("x") + lit(1i64))
                    .filter(on(9))
                    .build()
                    .unwrap(),
            ],
            None,
        )
        .unwrap();
        let set =
            |id: i64, rows: usize| set_batch(id, &[Some(10), None, Some(30), Some(20)][..rows]);
        let sets = [set(1, 4), set(2, 4)];
        let one = plan.calc.evaluate_sets(&sets).unwrap();
        let bits = |b: &BooleanBuffer| b.iter().collect::<Vec<_>>();
        let mask = |name: &str| {
            let f = plan
                .calc
                .filter_names
                .iter()
                .position(|n| n.contains(name))
                .unwrap();
            bits(&one.filters[f])
        };
        assert_eq!(one.num_rows, 4);
        assert_eq!(mask("15"), [false, false, true, true]);
        assert_eq!(mask("= 2"), [true; 4]);
        assert_eq!(mask("= 9"), [false; 4]);
        // Each mask is the OR of the sets' own.
        let apart: Vec<CalcBatch> = sets
            .iter()
            .map(|s| plan.calc.evaluate(s).unwrap())
            .collect();
        for (f, m) in one.filters.iter().enumerate() {
            let or: Vec<bool> = (0..4)
                .map(|r| apart.iter().any(|b| b.filters[f].value(r)))
                .collect();
            assert_eq!(bits(m), or, "filter {f}");
        }
        let values = |a: &ArrayRef| a.as_primitive::<Int64Type>().iter().collect::<Vec<_>>();
        let x = plan.calc.arg_names.iter().position(|n| n == "x").unwrap();
        let plus_one = 1 - x;
        assert_eq!(values(&one.args[x]), [Some(10), None, Some(30), Some(20)]);
        assert_eq!(one.args[plus_one].null_count(), 4);
        assert!(plan.calc.evaluate_sets(&[]).is_err());
        assert!(plan.calc.evaluate_sets(&[set(1, 4), set(2, 3)]).is_err());
        let mixed = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![
                Arc::new(Int64Array::from(vec![1, 2])),
                Arc::new(Int64Array::from(vec![1, 2])),
                Arc::new(Int64Array::from(vec![1, 2])),
            ],
        )
        .unwrap();
        assert!(
            plan.calc
                .evaluate_sets(&[ChangeBatch::inserts(mixed)])
                .is_err()
        );
    }
}
