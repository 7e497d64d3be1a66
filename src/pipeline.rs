//! Linear pipelines of streaming stages over changelog batches.
//!
//! A [`ChangeBatch`] is a batch of rows plus, for a changelog, their row kinds. Stages transform
//! change batches: [`CalcStage`] filters and projects (a filter or projection over a changelog
//! passes each row's kind through), [`AggregateStage`] runs a [`GroupAggregate`]. A
//! [`Pipeline`] chains them from a source to a sink.

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, Int8Array, RecordBatch, RecordBatchOptions,
};
use arrow::compute::filter_record_batch;
use arrow::datatypes::{DataType, Field, Int8Type, Schema, SchemaRef};
use datafusion_common::DFSchema;
use datafusion_expr::Expr;
use datafusion_expr::execution_props::ExecutionProps;
use datafusion_expr::physical_planning_context::PhysicalPlanningContext;
use datafusion_physical_expr::{PhysicalExpr, create_physical_expr};

use crate::error::{Error, Result};
use crate::operator::GroupAggregate;

/// The name of the row-kind column inside an aggregate's input.
pub const OP_FIELD: &str = "__op";

/// Rows and, for a changelog, their row kinds (`Int8` codes 0..3).
#[derive(Debug, Clone)]
pub struct ChangeBatch {
    /// Row kinds; `None` means every row is an insert.
    pub op: Option<ArrayRef>,
    /// The rows.
    pub data: RecordBatch,
}

impl ChangeBatch {
    /// Rows in the batch.
    pub fn num_rows(&self) -> usize {
        self.data.num_rows()
    }

    /// The batch with an `op` column first (all `+I` when it has no kinds), as the operators
    /// emit changelogs.
    pub fn with_op_column(&self) -> Result<RecordBatch> {
        let op = self
            .op
            .clone()
            .unwrap_or_else(|| Arc::new(Int8Array::from(vec![0i8; self.num_rows()])));
        let mut fields = vec![Arc::new(Field::new(
            crate::changelog::OP_COLUMN,
            DataType::Int8,
            false,
        ))];
        fields.extend(self.data.schema().fields().iter().cloned());
        let mut cols = vec![op];
        cols.extend(self.data.columns().iter().cloned());
        Ok(RecordBatch::try_new(Arc::new(Schema::new(fields)), cols)?)
    }
}

/// A streaming transformation of change batches.
pub trait Stage: Send + std::fmt::Debug {
    /// Consumes one batch and returns what became due.
    ///
    /// # Errors
    /// When evaluation fails on the data.
    fn push(&mut self, batch: ChangeBatch) -> Result<Vec<ChangeBatch>>;

    /// End of input: flushes what is buffered.
    ///
    /// # Errors
    /// As [`Stage::push`].
    fn finish(&mut self) -> Result<Vec<ChangeBatch>>;

    /// The aggregate operator inside, if this stage is one (for metrics).
    fn aggregate(&self) -> Option<&GroupAggregate> {
        None
    }
}

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
    filter: Option<Arc<dyn PhysicalExpr>>,
    projection: Option<Vec<Arc<dyn PhysicalExpr>>>,
    output: SchemaRef,
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
            output,
        })
    }
}

impl Stage for CalcStage {
    fn push(&mut self, batch: ChangeBatch) -> Result<Vec<ChangeBatch>> {
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
            return Ok(vec![]);
        }
        let data = match &self.projection {
            None => RecordBatch::try_new(Arc::clone(&self.output), data.columns().to_vec())?,
            Some(exprs) => {
                let n = data.num_rows();
                let cols = exprs
                    .iter()
                    .map(|e| Ok(e.evaluate(&data)?.into_array(n)?))
                    .collect::<Result<Vec<_>>>()?;
                RecordBatch::try_new_with_options(
                    Arc::clone(&self.output),
                    cols,
                    &RecordBatchOptions::new().with_row_count(Some(n)),
                )?
            }
        };
        Ok(vec![ChangeBatch { op, data }])
    }

    fn finish(&mut self) -> Result<Vec<ChangeBatch>> {
        Ok(vec![])
    }
}

/// A [`GroupAggregate`] as a stage: its input is the data columns plus the row kinds in a last
/// column named [`OP_FIELD`] (when the input is a changelog); its output is renamed to `output`.
#[derive(Debug)]
pub struct AggregateStage {
    agg: GroupAggregate,
    changelog_input: bool,
    input_schema: SchemaRef,
    output: SchemaRef,
}

impl AggregateStage {
    /// The input schema an aggregate over `data` needs: the data fields, then [`OP_FIELD`] when
    /// the input is a changelog.
    pub fn input_schema(data: &Schema, changelog: bool) -> SchemaRef {
        let mut fields: Vec<_> = data.fields().iter().cloned().collect();
        if changelog {
            fields.push(Arc::new(Field::new(OP_FIELD, DataType::Int8, false)));
        }
        Arc::new(Schema::new(fields))
    }

    /// Wraps `agg` (built over [`AggregateStage::input_schema`]), naming its output columns as
    /// `output` (which excludes the op column).
    ///
    /// # Errors
    /// When `output` does not fit the aggregate's output.
    pub fn try_new(agg: GroupAggregate, changelog_input: bool, output: SchemaRef) -> Result<Self> {
        let got = agg.output_schema();
        if got.fields().len() != output.fields().len() + 1
            || got.fields()[1..]
                .iter()
                .zip(output.fields())
                .any(|(a, b)| a.data_type() != b.data_type())
        {
            return Err(Error::internal(format!(
                "aggregate output {got:?} does not fit the planned schema {output:?}"
            )));
        }
        let input_schema = agg.plan().input_schema.clone();
        Ok(Self {
            agg,
            changelog_input,
            input_schema,
            output,
        })
    }

    fn convert(&self, batches: Vec<RecordBatch>) -> Result<Vec<ChangeBatch>> {
        batches
            .into_iter()
            .map(|b| {
                let op = Arc::clone(b.column(0));
                let data =
                    RecordBatch::try_new(Arc::clone(&self.output), b.columns()[1..].to_vec())?;
                Ok(ChangeBatch { op: Some(op), data })
            })
            .collect()
    }
}

impl Stage for AggregateStage {
    fn push(&mut self, batch: ChangeBatch) -> Result<Vec<ChangeBatch>> {
        let mut cols = batch.data.columns().to_vec();
        if self.changelog_input {
            let op = batch
                .op
                .unwrap_or_else(|| Arc::new(Int8Array::from(vec![0i8; batch.data.num_rows()])));
            if op.data_type() != &DataType::Int8 || op.as_primitive::<Int8Type>().null_count() > 0 {
                return Err(Error::internal("row kinds must be non-NULL Int8 codes"));
            }
            cols.push(op);
        }
        let input = RecordBatch::try_new_with_options(
            Arc::clone(&self.input_schema),
            cols,
            &RecordBatchOptions::new().with_row_count(Some(batch.data.num_rows())),
        )?;
        let out = self.agg.push(&input)?;
        self.convert(out)
    }

    fn finish(&mut self) -> Result<Vec<ChangeBatch>> {
        let out = self.agg.finish()?;
        self.convert(out)
    }

    fn aggregate(&self) -> Option<&GroupAggregate> {
        Some(&self.agg)
    }
}

/// Stages chained in order.
#[derive(Debug, Default)]
pub struct Pipeline {
    stages: Vec<Box<dyn Stage>>,
}

impl Pipeline {
    /// A pipeline of `stages`, first to last.
    pub fn new(stages: Vec<Box<dyn Stage>>) -> Self {
        Self { stages }
    }

    /// The stages.
    pub fn stages(&self) -> &[Box<dyn Stage>] {
        &self.stages
    }

    fn run_from(&mut self, first: usize, batches: Vec<ChangeBatch>) -> Result<Vec<ChangeBatch>> {
        let mut current = batches;
        for stage in &mut self.stages[first..] {
            let mut next = vec![];
            for b in current {
                next.extend(stage.push(b)?);
            }
            current = next;
        }
        Ok(current)
    }

    /// Pushes one input batch through every stage.
    ///
    /// # Errors
    /// The first stage error.
    pub fn push(&mut self, batch: ChangeBatch) -> Result<Vec<ChangeBatch>> {
        self.run_from(0, vec![batch])
    }

    /// End of input: finishes each stage in order, pushing what it flushes through the rest.
    ///
    /// # Errors
    /// The first stage error.
    pub fn finish(&mut self) -> Result<Vec<ChangeBatch>> {
        let mut out = vec![];
        for i in 0..self.stages.len() {
            let tail = self.stages[i].finish()?;
            out.extend(self.run_from(i + 1, tail)?);
        }
        Ok(out)
    }
}
