//! Resolving a GROUP BY query (key and aggregate expressions over an input schema) into what the
//! operators run: a [`Calc`] that evaluates every expression once per batch, and the list of
//! [`AggregateCall`]s.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch, RecordBatchOptions};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion_common::DFSchema;
use datafusion_common::ScalarValue;
use datafusion_expr::Expr;
use datafusion_expr::execution_props::ExecutionProps;
use datafusion_expr::expr::AggregateFunction;
use datafusion_expr::physical_planning_context::PhysicalPlanningContext;
use datafusion_physical_expr::{PhysicalExpr, create_physical_expr};
use tally_kernels::aggregates::{AggregateKind, result_type};
use tally_kernels::group_values::key_type_supported;

use crate::changelog::{ChangeBatch, OP_COLUMN, op_codes, op_type_supported};
use crate::error::{Error, Result};

mod bucket_fill;
mod calc;
mod columns;
mod dictionary_eq;
mod fold;
mod hot_keys;
#[cfg(test)]
pub(crate) mod split_fixture;

pub(crate) use bucket_fill::BucketFill;
pub use calc::{Calc, CalcBatch};
pub use columns::{ColumnUses, columns_read, dictionary_capable, same_or_dictionary_of};
pub(crate) use fold::SET_ID_COLUMN;
pub use hot_keys::{HOT_KEYS_METADATA, HotKeys};

/// One aggregate call of the query, resolved.
#[derive(Debug, Clone)]
pub struct AggregateCall {
    /// The function.
    pub kind: AggregateKind,
    /// Index of its argument in [`Calc`]'s arguments (None for `COUNT(*)`).
    pub arg: Option<usize>,
    /// `DISTINCT`.
    pub distinct: bool,
    /// Index of its FILTER in [`Calc`]'s filters.
    pub filter: Option<usize>,
    /// The output column name.
    pub name: String,
    /// The result type.
    pub result_type: DataType,
    /// A MIN/MAX whose argument only moves the extreme's way across the input changelog (a
    /// split-distinct FINAL's over insert-only input, [`AggregatePlan::set_monotonic_min_max`]):
    /// it ignores retractions and keeps one value a group, as Flink's non-retract function.
    pub monotonic: bool,
}

/// The query, resolved against the input schema.
///
/// Input arrives as [`ChangeBatch`]es: the rows (of [`AggregatePlan::input_schema`]) and, for a
/// changelog, their row kinds beside them. Library callers may hand over record batches with the
/// row kinds in a column instead ([`AggregatePlan::to_changes`]).
#[derive(Debug, Clone)]
pub struct AggregatePlan {
    /// The schema of the input rows (without a changelog column).
    pub input_schema: SchemaRef,
    /// Whether the input is a changelog (its rows carry row kinds, so groups can be deleted).
    pub changelog: bool,
    /// The schema of the record batches [`AggregatePlan::to_changes`] takes, and the position of
    /// their changelog column, if any.
    pub record_schema: SchemaRef,
    /// The position of the changelog column in [`AggregatePlan::record_schema`].
    pub op_column: Option<usize>,
    /// Group key column names (output order).
    pub key_names: Vec<String>,
    /// Group key types.
    pub key_types: Vec<DataType>,
    /// The aggregate calls in output order.
    pub calls: Vec<AggregateCall>,
    /// Expression evaluation.
    pub calc: Calc,
    /// The output rows: the keys, then the aggregate results (the row kinds travel beside
    /// them, in the output [`ChangeBatch`]es).
    pub output_schema: SchemaRef,
    /// The input columns (by index) that may arrive as dictionaries of their (Utf8) values:
    /// those the [`Calc`] only keys by or compares with literals ([`ColumnUses`]).
    pub dictionary_columns: BTreeSet<usize>,
    /// Set on a split-distinct PARTIAL: its last keys are bucket columns, which its local phase
    /// interns by position ([`tally_kernels::group_values::BucketedGroupValues`]).
    pub bucket_keys: Option<BucketKeys>,
}

/// The keys of a split-distinct PARTIAL aggregate: the query's keys, then `columns` Int32
/// bucket columns of values in `0..buckets` (or NULL).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketKeys {
    /// How many of the last keys are buckets.
    pub columns: usize,
    /// The bucket count.
    pub buckets: u32,
    /// Per call, where a flush may route its state: the bucket column of the group set that
    /// computes it (a DISTINCT call over exactly the bucketed argument), or None, with the
    /// keys alone (a call of the set of the keys alone, with an Expand, or a MIN/MAX of a set
    /// without DISTINCT calls, which the FINAL takes the extreme of wherever its parts lie);
    /// None where a call is neither. Every row of a set without DISTINCT calls makes no
    /// entry, so a key with such state has rows counted at the keys alone's worker.
    /// Where it is set, a local phase whose workers merge the buckets may fold a key's rows
    /// whatever their buckets, and route each DISTINCT entry by its value's bucket when it
    /// flushes (`LocalGroupAggregate::merge_buckets`). With an Expand, every call's FILTER
    /// tests its set's id (`$e = id`, as the split rewrite writes them all), so that a row of
    /// the input passes a call's FILTER in one set at most: such a local phase takes an
    /// Expand's sets of the same rows as one batch of them ([`Calc::evaluate_sets`]).
    pub call_sets: Option<Vec<Option<usize>>>,
    /// The keys whose DISTINCT values a local phase routing at the flush spreads by bucket,
    /// the others staying with their own worker ([`HotKeys`]); None: every key, as Flink's
    /// split does.
    pub hot: Option<Arc<HotKeys>>,
}

/// Checks that `got` has `want`'s column names and types (nullability may differ); the columns
/// in `dictionary` may also be dictionaries of their type's values.
fn check_fields(got: &Schema, want: &Schema, dictionary: &BTreeSet<usize>) -> Result<()> {
    let (want, got) = (want.fields(), got.fields());
    if want.len() != got.len()
        || want.iter().zip(got.iter()).enumerate().any(|(i, (a, b))| {
            a.name() != b.name()
                || !same_or_dictionary_of(b.data_type(), a.data_type(), dictionary.contains(&i))
        })
    {
        let show = |f: &arrow::datatypes::Fields| {
            f.iter()
                .map(|f| format!("{}: {}", f.name(), f.data_type()))
                .collect::<Vec<_>>()
                .join(", ")
        };
        return Err(Error::invalid_input(format!(
            "batch schema ({}) does not match the input schema ({})",
            show(got),
            show(want)
        )));
    }
    Ok(())
}

impl AggregatePlan {
    /// The input columns (by index) of a split-distinct PARTIAL's bucket keys that nothing else
    /// in the plan reads (none without bucket keys): what a run keying state by the query's
    /// keys alone on one worker, whose buckets route nowhere, never reads.
    pub fn bucket_columns_unread(&self) -> BTreeSet<usize> {
        let Some(b) = &self.bucket_keys else {
            return BTreeSet::new();
        };
        let query_keys = self.calc.keys.len().saturating_sub(b.columns);
        let (keys, buckets) = self.calc.keys.split_at(query_keys);
        let read = columns_read(keys.iter().chain(&self.calc.args).chain(&self.calc.filters));
        columns_read(buckets).difference(&read).copied().collect()
    }

    /// Whether the input carries retractions (it is a changelog).
    pub fn has_retractions(&self) -> bool {
        self.changelog
    }

    /// Marks every MIN/MAX call [`AggregateCall::monotonic`]: the plan is a split-distinct
    /// FINAL whose PARTIAL takes insert-only input, so each PARTIAL MAX only grows (MIN only
    /// shrinks) and an update's `-U` is dominated by its `+U`. Flink plans these calls without
    /// retraction (`MAX($f6)` beside `$SUM0_RETRACT`).
    pub fn set_monotonic_min_max(&mut self) {
        for c in &mut self.calls {
            c.monotonic = matches!(c.kind, AggregateKind::Min | AggregateKind::Max);
        }
    }

    /// Checks that `changes` fits the plan: rows of the input schema (names and types;
    /// nullability may differ), and row kinds only for a changelog input.
    ///
    /// # Errors
    /// A one-line error naming the mismatch.
    pub fn check_input(&self, changes: &ChangeBatch) -> Result<()> {
        check_fields(
            changes.data.schema_ref(),
            &self.input_schema,
            &self.dictionary_columns,
        )?;
        if changes.op.is_some() && !self.changelog {
            return Err(Error::invalid_input(
                "the batch carries row kinds, but the aggregate was planned for insert-only input (give it a changelog column)",
            ));
        }
        Ok(())
    }

    /// The changes a record batch of [`AggregatePlan::record_schema`] holds: its changelog
    /// column, if any, read as row kinds (codes or `+I`/`-U`/`+U`/`-D`) and taken out of the rows.
    ///
    /// # Errors
    /// A batch of another schema, a bad row kind (naming the row).
    pub fn to_changes(&self, batch: &RecordBatch) -> Result<ChangeBatch> {
        check_fields(batch.schema_ref(), &self.record_schema, &BTreeSet::new())?;
        let Some(i) = self.op_column else {
            return Ok(ChangeBatch::inserts(RecordBatch::try_new_with_options(
                Arc::clone(&self.input_schema),
                batch.columns().to_vec(),
                &RecordBatchOptions::new().with_row_count(Some(batch.num_rows())),
            )?));
        };
        let op = op_codes(batch.column(i))?;
        let mut cols = batch.columns().to_vec();
        cols.remove(i);
        let data = RecordBatch::try_new_with_options(
            Arc::clone(&self.input_schema),
            cols,
            &RecordBatchOptions::new().with_row_count(Some(batch.num_rows())),
        )?;
        Ok(ChangeBatch { op: Some(op), data })
    }

    /// Output changes of this plan's output schema, from the output columns and row kinds.
    ///
    /// # Errors
    /// Columns that do not fit the output schema (a bug).
    pub(crate) fn output(&self, op: ArrayRef, columns: Vec<ArrayRef>) -> Result<ChangeBatch> {
        let data = RecordBatch::try_new(Arc::clone(&self.output_schema), columns)
            .map_err(|e| Error::internal(format!("output batch: {e}")))?;
        Ok(ChangeBatch { op: Some(op), data })
    }

    /// Renames the output columns (the SQL planner names them as the query does); the types
    /// must be the same.
    ///
    /// # Errors
    /// A schema of other types or another width.
    pub fn rename_output(&mut self, schema: SchemaRef) -> Result<()> {
        let same = schema.fields().len() == self.output_schema.fields().len()
            && schema
                .fields()
                .iter()
                .zip(self.output_schema.fields())
                .all(|(a, b)| a.data_type() == b.data_type());
        if !same {
            return Err(Error::internal(format!(
                "aggregate output {:?} does not fit the planned schema {schema:?}",
                self.output_schema
            )));
        }
        self.output_schema = schema;
        Ok(())
    }

    /// Resolves `group_by` and `aggregates` against the record batches of `record_schema`
    /// (as a library caller hands them over). The changelog column is `changelog` if given, else
    /// a column named `op` if the schema has one; it is not part of the input rows.
    ///
    /// # Errors
    /// Unknown columns, unsupported functions or types, non-boolean filters (plan errors).
    pub fn try_new(
        record_schema: SchemaRef,
        group_by: &[Expr],
        aggregates: &[Expr],
        changelog: Option<&str>,
    ) -> Result<Self> {
        let op_column = match changelog {
            Some(name) => Some(record_schema.index_of(name).map_err(|_| {
                Error::plan(format!(
                    "changelog column '{name}' is not in the input schema"
                ))
            })?),
            None => record_schema.index_of(OP_COLUMN).ok(),
        };
        let mut fields: Vec<_> = record_schema.fields().iter().cloned().collect();
        if let Some(i) = op_column {
            let dt = record_schema.field(i).data_type();
            if !op_type_supported(dt) {
                return Err(Error::plan(format!(
                    "changelog column '{}' has type {dt}; expected Int8 codes or +I/-U/+U/-D strings",
                    record_schema.field(i).name()
                )));
            }
            fields.remove(i);
        }
        let input_schema = Arc::new(Schema::new(fields));
        let df_schema = DFSchema::try_from(input_schema.as_ref().clone())
            .map_err(|e| Error::plan(format!("input schema: {e}")))?;
        let mut plan = Self::try_new_with(
            input_schema,
            &df_schema,
            group_by,
            aggregates,
            op_column.is_some(),
        )?;
        plan.record_schema = record_schema;
        plan.op_column = op_column;
        Ok(plan)
    }

    /// Resolves `group_by` and `aggregates` against the input rows of `input_schema` (whose
    /// qualified form, as a SQL planner has it, is `df_schema`); `changelog`: whether the input
    /// carries row kinds.
    ///
    /// # Errors
    /// As [`AggregatePlan::try_new`].
    pub fn try_new_with(
        input_schema: SchemaRef,
        df_schema: &DFSchema,
        group_by: &[Expr],
        aggregates: &[Expr],
        changelog: bool,
    ) -> Result<Self> {
        let mut planner = ExprPlanner {
            df_schema,
            schema: &input_schema,
            props: ExecutionProps::new(),
            ctx: PhysicalPlanningContext::default(),
            args: vec![],
            arg_index: HashMap::new(),
            filters: vec![],
            filter_index: HashMap::new(),
            arg_names: vec![],
            filter_names: vec![],
        };

        let mut keys = vec![];
        let mut key_names = vec![];
        let mut key_types = vec![];
        for k in group_by {
            let (name, inner) = split_alias(k);
            let phys = planner.physical(inner)?;
            let dt = phys
                .data_type(&input_schema)
                .map_err(|e| Error::plan(format!("group key {inner}: {e}")))?;
            if !key_type_supported(&dt) {
                return Err(Error::plan(format!(
                    "group key {name} has type {dt}, which cannot be a group key"
                )));
            }
            keys.push(phys);
            key_names.push(name);
            key_types.push(dt);
        }

        let mut calls = vec![];
        for a in aggregates {
            calls.push(planner.aggregate(a)?);
        }
        if calls.is_empty() {
            return Err(Error::plan("a GROUP BY query needs at least one aggregate"));
        }

        let mut fields = vec![];
        for (n, t) in key_names.iter().zip(&key_types) {
            fields.push(Field::new(n, t.clone(), true));
        }
        for c in &calls {
            let nullable = !matches!(c.kind, AggregateKind::Count | AggregateKind::CountStar);
            fields.push(Field::new(&c.name, c.result_type.clone(), nullable));
        }
        let arg_filters = (0..planner.args.len())
            .map(|a| {
                calls
                    .iter()
                    .filter(|c| c.arg == Some(a))
                    .map(|c| c.filter)
                    .collect()
            })
            .collect();
        let calc = Calc {
            keys,
            arg_filters,
            args: planner.args,
            filters: planner.filters,
            arg_names: planner.arg_names,
            filter_names: planner.filter_names,
            sets: fold::SetMemo::default(),
        };
        let dictionary_columns = calc
            .column_uses()
            .dictionary_safe()
            .into_iter()
            .filter(|&i| {
                i < input_schema.fields().len()
                    && columns::dictionary_capable(input_schema.field(i).data_type())
            })
            .collect();
        Ok(Self {
            dictionary_columns,
            bucket_keys: None,
            record_schema: Arc::clone(&input_schema),
            op_column: None,
            changelog,
            input_schema,
            key_names,
            key_types,
            calls,
            calc,
            output_schema: Arc::new(Schema::new(fields)),
        })
    }
}

/// The output name (the outermost alias, else the expression's name) and the expression under
/// any aliases.
fn split_alias(e: &Expr) -> (String, &Expr) {
    let name = match e {
        Expr::Alias(a) => a.name.clone(),
        other => other.schema_name().to_string(),
    };
    let mut inner = e;
    while let Expr::Alias(a) = inner {
        inner = a.expr.as_ref();
    }
    (name, inner)
}

struct ExprPlanner<'a> {
    df_schema: &'a DFSchema,
    schema: &'a SchemaRef,
    props: ExecutionProps,
    ctx: PhysicalPlanningContext,
    args: Vec<Arc<dyn PhysicalExpr>>,
    arg_index: HashMap<Expr, usize>,
    filters: Vec<Arc<dyn PhysicalExpr>>,
    filter_index: HashMap<Expr, usize>,
    /// The arguments and filters as written.
    arg_names: Vec<String>,
    filter_names: Vec<String>,
}

impl ExprPlanner<'_> {
    fn physical(&self, e: &Expr) -> Result<Arc<dyn PhysicalExpr>> {
        create_physical_expr(e, self.df_schema, &self.props, &self.ctx)
            .map_err(|err| Error::plan(format!("cannot resolve {e}: {}", err.strip_backtrace())))
    }

    fn aggregate(&mut self, e: &Expr) -> Result<AggregateCall> {
        let (name, inner) = split_alias(e);
        let Expr::AggregateFunction(AggregateFunction { func, params }) = inner else {
            return Err(Error::plan(format!(
                "{inner} is not an aggregate function call"
            )));
        };
        let fname = func.name().to_ascii_lowercase();
        if !params.order_by.is_empty() {
            return Err(Error::plan(format!(
                "{fname}: ORDER BY inside an aggregate is not supported"
            )));
        }
        let star = |args: &[Expr]| match args {
            [] => true,
            [Expr::Literal(v, _)] => !v.is_null(),
            _ => false,
        };
        let kind = match fname.as_str() {
            "count" if params.args.len() > 1 => {
                return Err(Error::plan("We now only support the count of one field."));
            }
            "count" if star(&params.args) => AggregateKind::CountStar,
            "count" => AggregateKind::Count,
            "sum" => AggregateKind::Sum,
            "$sum0" | "sum0" => AggregateKind::Sum0,
            "avg" | "mean" => AggregateKind::Avg,
            "min" => AggregateKind::Min,
            "max" => AggregateKind::Max,
            other => {
                return Err(Error::plan(format!(
                    "aggregate function '{other}' is not supported (supported: COUNT, SUM, AVG, MIN, MAX)"
                )));
            }
        };
        if kind == AggregateKind::CountStar && params.distinct {
            return Err(Error::plan("COUNT(DISTINCT *) is not valid"));
        }
        let (arg, arg_type) = if kind == AggregateKind::CountStar {
            (None, None)
        } else {
            let [a] = params.args.as_slice() else {
                return Err(Error::plan(format!(
                    "{} takes exactly one argument",
                    kind.name()
                )));
            };
            let idx = match self.arg_index.get(a) {
                Some(&i) => i,
                None => {
                    let p = self.physical(a)?;
                    self.args.push(p);
                    self.arg_names.push(a.human_display().to_string());
                    self.arg_index.insert(a.clone(), self.args.len() - 1);
                    self.args.len() - 1
                }
            };
            let dt = self.args[idx]
                .data_type(self.schema)
                .map_err(|e| Error::plan(format!("argument {a}: {e}")))?;
            (Some(idx), Some(dt))
        };
        let result_type = result_type(kind, arg_type.as_ref())
            .map_err(|e| Error::plan(format!("{name}: {e}")))?;
        let filter = match &params.filter {
            None => None,
            Some(f) => {
                let f = f.as_ref();
                if let Expr::Literal(ScalarValue::Boolean(Some(true)), _) = f {
                    None
                } else {
                    let idx = match self.filter_index.get(f) {
                        Some(&i) => i,
                        None => {
                            let p = self.physical(f)?;
                            let dt = p
                                .data_type(self.schema)
                                .map_err(|e| Error::plan(format!("filter {f}: {e}")))?;
                            if dt != DataType::Boolean {
                                return Err(Error::plan(format!(
                                    "FILTER (WHERE {f}) has type {dt}; it must be BOOLEAN"
                                )));
                            }
                            self.filters.push(p);
                            self.filter_names.push(f.human_display().to_string());
                            self.filter_index.insert(f.clone(), self.filters.len() - 1);
                            self.filters.len() - 1
                        }
                    };
                    Some(idx)
                }
            }
        };
        let name = if kind == AggregateKind::CountStar && !matches!(e, Expr::Alias(_)) {
            name.replacen("count(Int64(1))", "count(*)", 1)
        } else {
            name
        };
        Ok(AggregateCall {
            kind,
            arg,
            distinct: params.distinct,
            filter,
            name,
            result_type,
            monotonic: false,
        })
    }
}
