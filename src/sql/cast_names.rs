//! Distinct names for aggregates over casts.
//!
//! DataFusion names an expression under a CAST by the expression alone (`CAST(price AS DOUBLE)`
//! is `bid.price`), so `SUM(price)` and `SUM(CAST(price AS DOUBLE))` are both `sum(bid.price)`
//! and its aggregate refuses the pair ("duplicate unqualified field name"; apache/datafusion
//! #18975). Flink plans them as two aggregates. [`CastArgNames`] names each CAST argument of an
//! aggregate by the whole cast, which changes no value: only the aggregate's internal name
//! (the query's output columns are named by [`super::names`]).

use datafusion_common::Result;
use datafusion_expr::Expr;
use datafusion_expr::planner::{ExprPlanner, PlannerResult, RawAggregateExpr};

/// The planner hook that names an aggregate's CAST and TRY_CAST arguments by the whole cast.
#[derive(Debug)]
pub(crate) struct CastArgNames;

impl ExprPlanner for CastArgNames {
    fn plan_aggregate(
        &self,
        mut expr: RawAggregateExpr,
    ) -> Result<PlannerResult<RawAggregateExpr>> {
        for arg in &mut expr.args {
            if matches!(arg, Expr::Cast(_) | Expr::TryCast(_)) {
                let name = arg.to_string();
                *arg = arg.clone().alias(name);
            }
        }
        Ok(PlannerResult::Original(expr))
    }
}
