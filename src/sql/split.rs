//! The split-distinct rewrite (Flink's `SplitAggregateRule`), on DataFusion's logical plan.
//!
//! `COUNT(DISTINCT x)` grouped by a hot key cannot be shrunk by a local phase: its state is the
//! set of values. Split-distinct spreads it over buckets of the value:
//!
//! 1. a Calc selects the input columns the aggregate reads and adds one bucket column
//!    `MOD(HASH_CODE(x), bucket-num)` per argument of a DISTINCT or MIN/MAX call that is not a
//!    group key (a NULL value gets the NULL bucket); with an Expand (below), also one column per
//!    group key that is not a column and per distinct FILTER condition, evaluated once per
//!    input row;
//! 2. when more than one argument is bucketed, an Expand emits each row once per group set (the
//!    keys plus one bucket; plus the keys alone when other calls exist), with the other buckets
//!    NULL and the set's id in `$e`; each partial call then only takes the rows of its set
//!    (`FILTER … AND $e = id`);
//! 3. the PARTIAL aggregate groups by the keys and the buckets and computes every call per bucket
//!    (the DISTINCT calls keep DISTINCT and their FILTER; AVG becomes `$SUM0` and `COUNT`);
//! 4. the FINAL aggregate groups by the keys over the partial changelog (with retraction) and
//!    merges: `$SUM0` for COUNT and AVG's parts, SUM for SUM, MIN for MIN, MAX for MAX;
//! 5. a Calc returns the original columns (AVG from its parts, by the AVG kernel itself).
//!
//! Decimal sums (SUM, and AVG's sum part) travel between the aggregates as exact
//! `DECIMAL(76, s)` values, so that split and unsplit agree on overflow too (NULL exactly when
//! the whole sum does not fit 38 digits).
//!
//! Applies when `table.optimizer.distinct-agg.split.enabled` is true, the aggregate has a
//! DISTINCT call and at least one argument to bucket (every Tally function is splittable).
//! Unlike Flink's, the split sum of AVG over integers is a BIGINT (AVG's own sum type), so that
//! split and unsplit AVG agree even where an INT sum would wrap.

use std::collections::HashSet;
use std::sync::Arc;

use arrow::datatypes::{DataType, Field};

use datafusion_common::{Column, DFSchema, DFSchemaRef, ScalarValue, TableReference};
use datafusion_expr::expr::{AggregateFunction, Alias};
use datafusion_expr::logical_plan::{Aggregate, EmptyRelation};
use datafusion_expr::{
    Expr, ExprFunctionExt, ExprSchemable, LogicalPlan, cast, col, lit, try_cast,
};

use super::split_functions::{avg_final, avg_sum_type, bucket};
use crate::aggregates::{count, count_star, max, min, sum, sum0};
use crate::error::{Error, Result};

/// The Expand of a split over several bucketed arguments.
#[derive(Debug, Clone)]
pub(crate) struct Expand {
    /// Per group set: the columns (of the Calc's output) it sets to NULL, and its `$e` id.
    pub(crate) sets: Vec<(Vec<usize>, i64)>,
}

/// A planned split: the pieces the planner turns into stages.
#[derive(Debug)]
pub(crate) struct Split {
    /// With an Expand, each group key that is not a column, and its column name (`$f<n>`):
    /// computed by the Calc once per input row, not once per group set.
    pub(crate) keys: Vec<(Expr, String)>,
    /// Each bucketed argument and its column name (`$f<n>`).
    pub(crate) buckets: Vec<(Expr, String)>,
    /// With an Expand, each distinct FILTER condition and its column name (`$f<n>`).
    pub(crate) filters: Vec<(Expr, String)>,
    /// The Calc: the input columns the aggregate reads, the buckets, the FILTER conditions.
    pub(crate) pre_exprs: Vec<Expr>,
    /// Its output schema.
    pub(crate) pre_schema: DFSchemaRef,
    /// The Expand, when several arguments are bucketed.
    pub(crate) expand: Option<Expand>,
    /// The PARTIAL aggregate's input schema (the Calc's, plus `$e` with an Expand).
    pub(crate) partial_input: DFSchemaRef,
    /// The PARTIAL aggregate.
    pub(crate) partial: Aggregate,
    /// Per PARTIAL call, where a flush may route its state: the bucket column of its group set
    /// (a DISTINCT call over exactly the bucketed argument, each entry by its value's bucket),
    /// or None, with the keys alone (a call of the keys alone's set, with an Expand, or a
    /// MIN/MAX of a set without DISTINCT calls, whose parts may lie on any worker); set where
    /// every call is one of these: a local phase may then fold a key's rows whatever their
    /// sets ([`crate::plan::BucketKeys::call_sets`]). None otherwise.
    pub(crate) call_sets: Option<Vec<Option<usize>>>,
    /// The FINAL aggregate (over the partial's output).
    pub(crate) final_agg: Aggregate,
    /// The closing Calc over the final's output, giving the original aggregate's columns.
    pub(crate) post_exprs: Vec<Expr>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Func {
    Count,
    CountStar,
    Sum,
    Sum0,
    Avg,
    Min,
    Max,
}

struct Call {
    func: Func,
    arg: Option<Expr>,
    distinct: bool,
    filter: Option<Expr>,
    /// The bucket this call's group set adds, if any.
    bucket: Option<usize>,
}

fn unalias(e: &Expr) -> &Expr {
    match e {
        Expr::Alias(Alias { expr, .. }) => unalias(expr),
        other => other,
    }
}

fn empty(schema: DFSchemaRef) -> Arc<LogicalPlan> {
    Arc::new(LogicalPlan::EmptyRelation(EmptyRelation {
        produce_one_row: false,
        schema,
    }))
}

fn df(e: datafusion_common::DataFusionError) -> Error {
    Error::plan(format!("split-distinct: {}", e.strip_backtrace()))
}

/// The split of `agg` with `bucket_num` buckets, or None when split-distinct does not apply
/// (no DISTINCT call, nothing to bucket, or a call this rewrite does not know, which the
/// ordinary planning then reports).
///
/// # Errors
/// When the rewritten plan does not resolve (a bug).
pub(crate) fn plan_split(agg: &Aggregate, bucket_num: u32) -> Result<Option<Split>> {
    let in_df = agg.input.schema();
    let k = agg.group_expr.len();
    let keys: Vec<&Expr> = agg.group_expr.iter().map(unalias).collect();
    let mut calls = vec![];
    let mut buckets: Vec<(Expr, String)> = vec![];
    for a in &agg.aggr_expr {
        let Expr::AggregateFunction(AggregateFunction { func, params }) = unalias(a) else {
            return Ok(None);
        };
        let star = matches!(
            params.args.as_slice(),
            [] | [Expr::Literal(ScalarValue::Int64(Some(_)), _)]
        );
        let f = match func.name().to_ascii_lowercase().as_str() {
            "count" if star => Func::CountStar,
            "count" => Func::Count,
            "sum" => Func::Sum,
            "$sum0" | "sum0" => Func::Sum0,
            "avg" | "mean" => Func::Avg,
            "min" => Func::Min,
            "max" => Func::Max,
            _ => return Ok(None),
        };
        let arg = match (f, params.args.as_slice()) {
            (Func::CountStar, _) => None,
            (_, [a]) => Some(a.clone()),
            _ => return Ok(None),
        };
        let needs = params.distinct || matches!(f, Func::Min | Func::Max);
        let bucket = match &arg {
            Some(a) if needs && !keys.contains(&unalias(a)) => {
                Some(match buckets.iter().position(|b| b.0 == *a) {
                    Some(i) => i,
                    None => {
                        buckets.push((a.clone(), String::new()));
                        buckets.len() - 1
                    }
                })
            }
            _ => None,
        };
        calls.push(Call {
            func: f,
            arg,
            distinct: params.distinct,
            filter: params.filter.as_deref().cloned(),
            bucket,
        });
    }
    if !calls.iter().any(|c| c.distinct) || buckets.is_empty() {
        return Ok(None);
    }

    // 1. The Calc: the input columns the aggregate reads (as Flink's, so that the source
    // decodes no others), then the buckets, named by their position (`$f<n>`).
    // With an Expand, each group key that is not a column and each FILTER condition are
    // evaluated here once per input row (a key after the columns, a condition after the
    // buckets, shared by the calls with the same condition) rather than once per expanded
    // row (and call), as Flink's Calc before its Expand does (its group keys are columns of
    // its input); the columns only they read then stay behind.
    let hoist = buckets.len() > 1;
    let hoisted = |e: &Expr| hoist && !matches!(unalias(e), Expr::Column(_));
    let read: HashSet<&Column> = agg
        .group_expr
        .iter()
        .filter(|e| !hoisted(e))
        .chain(calls.iter().flat_map(|c| &c.arg))
        .chain(calls.iter().filter(|_| !hoist).flat_map(|c| &c.filter))
        .flat_map(Expr::column_refs)
        .collect();
    let kept: Vec<(Option<&TableReference>, &Arc<Field>)> = in_df
        .iter()
        .filter(|&(q, f)| read.contains(&Column::from((q, f))))
        .collect();
    let mut pre_exprs: Vec<Expr> = kept
        .iter()
        .map(|&(q, f)| Expr::Column(Column::from((q, f))))
        .collect();
    let kept_df = DFSchema::new_with_metadata(
        kept.iter()
            .map(|&(q, f)| (q.cloned(), Arc::clone(f)))
            .collect(),
        in_df.metadata().clone(),
    )
    .map_err(df)?;
    let mut added_fields = vec![];
    let mut hoisted_keys: Vec<(Expr, String)> = vec![];
    let mut partial_keys: Vec<Expr> = vec![];
    for e in &agg.group_expr {
        if !hoisted(e) {
            partial_keys.push(e.clone());
            continue;
        }
        let key = unalias(e).clone();
        let name = format!("$f{}", kept.len() + hoisted_keys.len());
        let (_, field) = key.to_field(in_df.as_ref()).map_err(df)?;
        pre_exprs.push(key.clone().alias(&name));
        added_fields.push(Field::new(
            &name,
            field.data_type().clone(),
            field.is_nullable(),
        ));
        partial_keys.push(col(&name));
        hoisted_keys.push((key, name));
    }
    let n_in = kept.len() + hoisted_keys.len();
    for (j, (_, name)) in buckets.iter_mut().enumerate() {
        *name = format!("$f{}", n_in + j);
    }
    for (a, name) in &buckets {
        pre_exprs.push(bucket(a.clone(), bucket_num).alias(name));
        added_fields.push(Field::new(name, DataType::Int32, true));
    }
    let mut filters: Vec<(Expr, String)> = vec![];
    if hoist {
        for c in &mut calls {
            let Some(f) = c.filter.take() else { continue };
            let name = match filters.iter().find(|(e, _)| *e == f) {
                Some((_, name)) => name.clone(),
                None => {
                    let name = format!("$f{}", n_in + buckets.len() + filters.len());
                    pre_exprs.push(f.clone().alias(&name));
                    added_fields.push(Field::new(&name, DataType::Boolean, true));
                    filters.push((f, name.clone()));
                    name
                }
            };
            c.filter = Some(col(name));
        }
    }
    let added_df =
        DFSchema::from_unqualified_fields(added_fields.into(), Default::default()).map_err(df)?;
    let pre_schema = Arc::new(kept_df.join(&added_df).map_err(df)?);

    // 2. The Expand, when more than one bucket is used.
    let m = buckets.len();
    let set_id = |b: Option<usize>| -> i64 {
        // Flink's ExpandUtil.genExpandId: a bit per absent column of the full group set, the
        // last bucket weighing 1.
        (0..m)
            .filter(|&j| Some(j) != b)
            .map(|j| 1i64 << (m - 1 - j))
            .sum()
    };
    let expand = (m > 1).then(|| {
        let mut sets: Vec<(Vec<usize>, i64)> = (0..m)
            .map(|j| {
                let nulls = (0..m).filter(|&o| o != j).map(|o| n_in + o).collect();
                (nulls, set_id(Some(j)))
            })
            .collect();
        if calls.iter().any(|c| c.bucket.is_none()) {
            sets.push(((n_in..n_in + m).collect(), set_id(None)));
        }
        Expand { sets }
    });
    let partial_input = match &expand {
        None => Arc::clone(&pre_schema),
        Some(_) => {
            let e = DFSchema::from_unqualified_fields(
                vec![Field::new(
                    crate::plan::SET_ID_COLUMN,
                    DataType::Int64,
                    false,
                )]
                .into(),
                Default::default(),
            )
            .map_err(df)?;
            Arc::new(pre_schema.join(&e).map_err(df)?)
        }
    };

    // 3. The PARTIAL aggregate.
    let mut partial_group: Vec<Expr> = partial_keys;
    partial_group.extend(buckets.iter().map(|(_, n)| col(n)));
    let mut partial_aggs = vec![];
    // Per PARTIAL call, where a flush may route its state: by its entries' values' bucket, or
    // with the keys alone.
    let mut call_sets: Option<Vec<Option<usize>>> = Some(vec![]);
    for (i, c) in calls.iter().enumerate() {
        let extreme = matches!(c.func, Func::Min | Func::Max);
        let by_value = match c.bucket {
            // A MIN/MAX's part may lie on any worker: the FINAL takes the extreme of them all.
            // It goes with the keys alone, where its set makes no DISTINCT entry: the set's
            // rows are then counted at the keys alone's worker, whose row carries its state.
            Some(j) if extreme => calls.iter().all(|d| {
                d.bucket != Some(j) || !d.distinct || matches!(d.func, Func::Min | Func::Max)
            }),
            // DISTINCT over the bucketed argument (a call's bucket is its argument's): the
            // entries' values give the buckets. AVG's parts are over a cast of it. (A decimal
            // SUM's part sums a cast: the local phase finds and refuses it by the argument's
            // type.)
            Some(_) => c.distinct && c.func != Func::Avg,
            // The keys alone's set: with an Expand, all its rows go where the key's do.
            None => expand.is_some(),
        };
        let routed = if extreme { None } else { c.bucket };
        let parts = if c.func == Func::Avg { 2 } else { 1 };
        call_sets = call_sets.filter(|_| by_value).map(|mut v| {
            v.extend(std::iter::repeat_n(routed, parts));
            v
        });
        let mut filter = c.filter.clone();
        if expand.is_some() {
            let g = col(crate::plan::SET_ID_COLUMN).eq(lit(set_id(c.bucket)));
            filter = Some(match filter {
                Some(f) => f.and(g),
                None => g,
            });
        }
        let finish = |e: Expr, alias: String| -> Result<Expr> {
            let e = match (c.distinct, filter.clone()) {
                (false, None) => e,
                (true, None) => e.distinct().build().map_err(df)?,
                (false, Some(f)) => e.filter(f).build().map_err(df)?,
                (true, Some(f)) => e.distinct().filter(f).build().map_err(df)?,
            };
            Ok(e.alias(alias))
        };
        let arg = || {
            c.arg
                .clone()
                .ok_or_else(|| Error::internal("call without argument"))
        };
        match c.func {
            Func::CountStar => partial_aggs.push(finish(count_star(), format!("$p{i}"))?),
            Func::Count => partial_aggs.push(finish(count(arg()?), format!("$p{i}"))?),
            Func::Sum => {
                // A decimal sum's parts are exact (DECIMAL(76, s), the state type), so that a
                // bucket's sum overflowing 38 digits does not lose its value: the FINAL sum is
                // NULL exactly when the whole sum overflows, as without split.
                let a = arg()?;
                let a = match a.get_type(in_df.as_ref()).map_err(df)? {
                    DataType::Decimal128(_, s) => cast(a, DataType::Decimal256(76, s)),
                    _ => a,
                };
                partial_aggs.push(finish(sum(a), format!("$p{i}"))?);
            }
            Func::Sum0 => partial_aggs.push(finish(sum0(arg()?), format!("$p{i}"))?),
            Func::Min => partial_aggs.push(finish(min(arg()?), format!("$p{i}"))?),
            Func::Max => partial_aggs.push(finish(max(arg()?), format!("$p{i}"))?),
            Func::Avg => {
                let a = arg()?;
                let t = a.get_type(in_df.as_ref()).map_err(df)?;
                let sum_type = avg_sum_type(&t)?;
                partial_aggs.push(finish(
                    sum0(cast(a.clone(), sum_type)),
                    format!("$p{i}_sum"),
                )?);
                partial_aggs.push(finish(count(a), format!("$p{i}_count"))?);
            }
        }
    }
    let partial = Aggregate::try_new(
        empty(Arc::clone(&partial_input)),
        partial_group,
        partial_aggs,
    )
    .map_err(df)?;

    // 4. The FINAL aggregate over the partial's output.
    let pcol = |name: String| Expr::Column(Column::new_unqualified(name));
    let final_group: Vec<Expr> = (0..k)
        .map(|j| {
            let (q, f) = partial.schema.qualified_field(j);
            Expr::Column(Column::from((q, f)))
        })
        .collect();
    let mut final_aggs = vec![];
    for (i, c) in calls.iter().enumerate() {
        let p = pcol(format!("$p{i}"));
        match c.func {
            Func::CountStar | Func::Count | Func::Sum0 => {
                final_aggs.push(sum0(p).alias(format!("$q{i}")));
            }
            Func::Sum => final_aggs.push(sum(p).alias(format!("$q{i}"))),
            Func::Min => final_aggs.push(min(p).alias(format!("$q{i}"))),
            Func::Max => final_aggs.push(max(p).alias(format!("$q{i}"))),
            Func::Avg => {
                final_aggs.push(sum0(pcol(format!("$p{i}_sum"))).alias(format!("$q{i}_sum")));
                final_aggs.push(sum0(pcol(format!("$p{i}_count"))).alias(format!("$q{i}_count")));
            }
        }
    }
    let final_agg = Aggregate::try_new(empty(Arc::clone(&partial.schema)), final_group, final_aggs)
        .map_err(df)?;

    // 5. Back to the original columns and types.
    let mut post_exprs: Vec<Expr> = (0..k)
        .map(|j| {
            let (q, f) = final_agg.schema.qualified_field(j);
            Expr::Column(Column::from((q, f)))
        })
        .collect();
    for (i, c) in calls.iter().enumerate() {
        let e = match c.func {
            Func::Avg => {
                let a = c
                    .arg
                    .clone()
                    .ok_or_else(|| Error::internal("AVG without argument"))?;
                let t = a.get_type(in_df.as_ref()).map_err(df)?;
                avg_final(pcol(format!("$q{i}_sum")), pcol(format!("$q{i}_count")), t)
            }
            _ => pcol(format!("$q{i}")),
        };
        let want = agg.schema.field(k + i).data_type();
        let got = e.get_type(final_agg.schema.as_ref()).map_err(df)?;
        post_exprs.push(if &got == want {
            e
        } else if matches!(got, DataType::Decimal256(..)) {
            // An exact decimal sum back to DECIMAL(38, s): NULL when it does not fit.
            try_cast(e, want.clone())
        } else {
            cast(e, want.clone())
        });
    }
    Ok(Some(Split {
        keys: hoisted_keys,
        buckets,
        filters,
        pre_exprs,
        pre_schema,
        expand,
        partial_input,
        partial,
        call_sets,
        final_agg,
        post_exprs,
    }))
}
