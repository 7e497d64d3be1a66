//! The Calc stage: a filter and/or projection over change batches (row kinds pass through),
//! its expressions planned with datafusion-physical-expr.

use std::collections::BTreeSet;
use std::sync::{Arc, RwLock};

use arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, RecordBatch, RecordBatchOptions, new_null_array,
};
use arrow::compute::filter_record_batch;
use arrow::datatypes::{DataType, SchemaRef};
use datafusion_common::DFSchema;
use datafusion_expr::Expr;
use datafusion_expr::execution_props::ExecutionProps;
use datafusion_expr::physical_planning_context::PhysicalPlanningContext;
use datafusion_physical_expr::expressions::Column;
use datafusion_physical_expr::{PhysicalExpr, create_physical_expr};

use super::{Stage, schema_of};
use crate::changelog::ChangeBatch;
use crate::error::{Error, Result};
use crate::plan::{ColumnUses, columns_read, dictionary_capable};
use crate::runtime::Runtime;

/// Plans `expr` against `schema` into a physical expression.
///
/// # Errors
/// When the expression does not resolve.
pub fn physical_expr(expr: &Expr, schema: &DFSchema) -> Result<Arc<dyn PhysicalExpr>> {
    create_physical_expr(
        expr,
        schema,
        &ExecutionProps::new(),
        &PhysicalPlanningContext::default(),
    )
    .map_err(|e| Error::plan(format!("cannot plan {expr}: {}", e.strip_backtrace())))
}

/// A filter and/or projection over change batches; row kinds pass through.
#[derive(Debug)]
pub struct CalcStage {
    pub(super) filter: Option<Arc<dyn PhysicalExpr>>,
    projection: Option<Vec<Arc<dyn PhysicalExpr>>>,
    /// The input's columns (their types: which may come as dictionaries).
    input: SchemaRef,
    output: SchemaRef,
    /// Projected columns no later stage reads in this run ([`Stage::leave_unread`]): NULL.
    unread: BTreeSet<usize>,
    /// Per projected column, a NULL array made once for when it is unread (sliced to each
    /// batch, grown when a longer batch comes).
    nulls: RwLock<Vec<Option<ArrayRef>>>,
}

impl CalcStage {
    /// A stage filtering rows of `input` by `filter` and computing `projection` (None keeps the
    /// columns), producing batches of `output` schema.
    ///
    /// # Errors
    /// When an expression does not resolve or the filter is not boolean.
    pub fn try_new(
        input: &DFSchema,
        filter: Option<&Expr>,
        projection: Option<&[Expr]>,
        output: SchemaRef,
    ) -> Result<Self> {
        let filter = filter.map(|f| physical_expr(f, input)).transpose()?;
        if let Some(f) = &filter {
            let dt = f.data_type(input.as_arrow())?;
            if dt != DataType::Boolean {
                return Err(Error::plan(format!(
                    "WHERE/HAVING condition has type {dt}; it must be BOOLEAN"
                )));
            }
        }
        let projection = projection
            .map(|exprs| {
                exprs
                    .iter()
                    .map(|e| physical_expr(e, input))
                    .collect::<Result<Vec<_>>>()
            })
            .transpose()?;
        Ok(Self {
            filter,
            projection,
            input: Arc::clone(input.inner()),
            output,
            unread: BTreeSet::new(),
            nulls: RwLock::new(vec![]),
        })
    }
}

impl CalcStage {
    /// `n` NULLs of `data_type` for projected column `i`: a slice of the column's NULL array,
    /// made (or grown) here when it is shorter.
    fn null_column(&self, i: usize, data_type: &DataType, n: usize) -> ArrayRef {
        {
            let nulls = self.nulls.read().unwrap_or_else(|e| e.into_inner());
            if let Some(Some(a)) = nulls.get(i)
                && a.len() >= n
            {
                return a.slice(0, n);
            }
        }
        let a = new_null_array(data_type, n.next_power_of_two());
        let mut nulls = self.nulls.write().unwrap_or_else(|e| e.into_inner());
        if nulls.len() <= i {
            nulls.resize(i + 1, None);
        }
        nulls[i] = Some(Arc::clone(&a));
        a.slice(0, n)
    }

    /// Whether it passes its input's columns on as they are (a filter without a projection).
    pub(super) fn keeps_columns(&self) -> bool {
        self.projection.is_none()
    }

    /// The input columns (by index) its filter reads.
    pub(super) fn filter_columns(&self) -> BTreeSet<usize> {
        columns_read(&self.filter)
    }

    /// Filters and projects one batch (None when no row is left).
    ///
    /// # Errors
    /// When an expression fails on the data.
    pub fn apply(&self, batch: ChangeBatch) -> Result<Option<ChangeBatch>> {
        let ChangeBatch { mut op, mut data } = batch;
        if let Some(f) = &self.filter {
            let mask = f.evaluate(&data)?.into_array(data.num_rows())?;
            let mask = mask
                .as_boolean_opt()
                .ok_or_else(|| Error::internal("filter is not boolean"))?
                .clone();
            // NULL is false.
            let mask = match mask.nulls() {
                Some(n) => BooleanArray::new(mask.values() & n.inner(), None),
                None => mask,
            };
            if mask.true_count() < data.num_rows() {
                data = filter_record_batch(&data, &mask)?;
                op = op.map(|o| arrow::compute::filter(&o, &mask)).transpose()?;
            }
        }
        if data.num_rows() == 0 {
            return Ok(None);
        }
        let data = match &self.projection {
            None => RecordBatch::try_new(
                schema_of(&self.output, data.columns()),
                data.columns().to_vec(),
            )?,
            Some(exprs) => {
                let n = data.num_rows();
                let cols = exprs
                    .iter()
                    .zip(self.output.fields())
                    .enumerate()
                    .map(|(i, (e, f))| {
                        if self.unread.contains(&i) {
                            return Ok(self.null_column(i, f.data_type(), n));
                        }
                        Ok(e.evaluate(&data)?.into_array(n)?)
                    })
                    .collect::<Result<Vec<_>>>()?;
                RecordBatch::try_new_with_options(
                    schema_of(&self.output, &cols),
                    cols,
                    &RecordBatchOptions::new().with_row_count(Some(n)),
                )?
            }
        };
        Ok(Some(ChangeBatch { op, data }))
    }
}

impl Stage for CalcStage {
    fn as_calc(&self) -> Option<&CalcStage> {
        Some(self)
    }

    fn per_batch(&self) -> bool {
        true
    }

    fn map_batch(&self, batch: ChangeBatch) -> Result<Vec<ChangeBatch>> {
        Ok(self.apply(batch)?.into_iter().collect())
    }

    fn columns_read(&self) -> Option<BTreeSet<usize>> {
        let projection = self.projection.as_ref()?;
        Some(columns_read(projection.iter().chain(&self.filter)))
    }

    fn passes_every_row(&self) -> bool {
        self.filter.is_none()
    }

    /// A filter's columns compared only with literals, and a projection's columns passed on
    /// bare to outputs in `outputs` (and read no other way); without a projection, the columns
    /// of `outputs` the filter allows.
    fn dictionary_inputs(&self, outputs: &BTreeSet<usize>) -> BTreeSet<usize> {
        let mut uses = ColumnUses::default();
        uses.predicates(&self.filter);
        let candidates: BTreeSet<usize> = match &self.projection {
            None => outputs
                .iter()
                .copied()
                .filter(|&c| uses.allows_dictionary(c))
                .collect(),
            Some(exprs) => {
                for (i, e) in exprs.iter().enumerate() {
                    let one = std::slice::from_ref(e);
                    if e.downcast_ref::<Column>().is_some() && outputs.contains(&i) {
                        uses.keys(one);
                    } else {
                        uses.plain(one);
                    }
                }
                uses.dictionary_safe()
            }
        };
        let fields = self.input.fields();
        candidates
            .into_iter()
            .filter(|&c| {
                fields
                    .get(c)
                    .is_some_and(|f| dictionary_capable(f.data_type()))
            })
            .collect()
    }

    /// A projection leaves its unread columns NULL (of nullable fields); a filter alone passes
    /// its input's columns on, those it reads excepted.
    fn leave_unread(&mut self, unread: &BTreeSet<usize>) -> Option<BTreeSet<usize>> {
        if self.projection.is_none() {
            let read = self.filter_columns();
            return Some(unread.difference(&read).copied().collect());
        }
        self.unread = unread
            .iter()
            .copied()
            .filter(|&c| self.output.fields().get(c).is_some_and(|f| f.is_nullable()))
            .collect();
        None
    }

    fn push(&mut self, slices: Vec<ChangeBatch>, runtime: &Runtime) -> Result<Vec<ChangeBatch>> {
        let this = &*self;
        let mut out = Vec::with_capacity(slices.len());
        for r in runtime.map(slices, |s| this.apply(s)) {
            out.extend(r?);
        }
        Ok(out)
    }

    fn finish(&mut self, _runtime: &Runtime) -> Result<Vec<ChangeBatch>> {
        Ok(vec![])
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::Int64Array;
    use arrow::datatypes::{Field, Int64Type, Schema};
    use datafusion_expr::{col, lit};

    use super::*;
    use crate::pipeline::ExpandStage;

    /// A projected column no later stage reads is left NULL for the run, and computed again
    /// once it is read; through an Expand (columns by position) and a filter alone the walk
    /// reaches the projection, but not for a column the filter reads.
    #[test]
    fn unread_projected_columns_are_left_null() {
        let input = Schema::new(vec![Field::new("x", DataType::Int64, true)]);
        let df = DFSchema::try_from(input.clone()).unwrap();
        let output = Arc::new(Schema::new(vec![
            Field::new("x", DataType::Int64, true),
            Field::new("y", DataType::Int64, true),
        ]));
        let projection = [col("x"), col("x") + lit(1i64)];
        let mut calc =
            CalcStage::try_new(&df, None, Some(&projection), Arc::clone(&output)).unwrap();
        let batch = |n: i64| {
            let x: ArrayRef = Arc::new(Int64Array::from_iter_values(1..=n));
            ChangeBatch::inserts(RecordBatch::try_new(Arc::new(input.clone()), vec![x]).unwrap())
        };
        let y = |calc: &CalcStage, n: i64| {
            let out = calc.apply(batch(n)).unwrap().unwrap();
            let y = out.data.column(1).as_primitive::<Int64Type>().clone();
            y.iter().collect::<Vec<_>>()
        };
        assert_eq!(y(&calc, 3), [Some(2), Some(3), Some(4)]);
        assert!(calc.leave_unread(&BTreeSet::from([1])).is_none());
        // Batches of any length, longer and shorter than the NULL array made first.
        for n in [3, 700, 2, 3] {
            assert_eq!(y(&calc, n), vec![None; n as usize], "{n} rows");
        }
        calc.leave_unread(&BTreeSet::new());
        assert_eq!(y(&calc, 3), [Some(2), Some(3), Some(4)]);

        // An Expand passes positions on, its `$e` excepted.
        let mut fields = output.fields().to_vec();
        fields.push(Arc::new(Field::new("$e", DataType::Int64, false)));
        let mut expand = ExpandStage::new(vec![(vec![1], 1)], Arc::new(Schema::new(fields)));
        assert_eq!(
            expand.leave_unread(&BTreeSet::from([1, 2])),
            Some(BTreeSet::from([1]))
        );
        // A filter alone passes them on, less the columns it reads.
        let df2 = DFSchema::try_from(output.as_ref().clone()).unwrap();
        let mut filter = CalcStage::try_new(
            &df2,
            Some(&col("y").gt(lit(0i64))),
            None,
            Arc::clone(&output),
        )
        .unwrap();
        assert_eq!(
            filter.leave_unread(&BTreeSet::from([0, 1])),
            Some(BTreeSet::from([0]))
        );
    }
}
