//! Aggregate function expressions: `count`, `count_star`, `sum`, `sum0`, `avg`, `min`, `max`.
//!
//! These build ordinary [`datafusion_expr::Expr::AggregateFunction`] values, so the DataFusion
//! builder methods apply: `.distinct()` and `.filter(...)` through
//! [`datafusion_expr::ExprFunctionExt`], `.alias(...)` for the output name. The functions carry
//! no evaluation code of their own: Tally's kernels evaluate them. Aggregate expressions built
//! with `datafusion-functions-aggregate` (as the SQL planner produces them) are accepted too;
//! Tally recognises the functions by name.
//!
//! ```
//! use datafusion_expr::{col, lit, ExprFunctionExt};
//! use tally::aggregates::{count, count_star, sum};
//!
//! let paid = sum(col("amount")).filter(col("status").eq(lit("PAID"))).build().unwrap();
//! let users = count(col("user_id")).distinct().build().unwrap();
//! let rows = count_star();
//! # let _ = (paid, users, rows);
//! ```

use std::sync::{Arc, LazyLock};

use arrow::datatypes::DataType;
use datafusion_expr::{
    Accumulator, AggregateUDF, AggregateUDFImpl, Expr, Signature, Volatility,
    function::AccumulatorArgs, lit,
};
use tally_kernels::aggregates::{AggregateKind, result_type};

/// A Tally aggregate function: a name and a return type; evaluation is the kernels' job.
#[derive(Debug, PartialEq, Eq, Hash)]
struct TallyAggregate {
    name: &'static str,
    kind: AggregateKind,
    signature: Signature,
}

impl AggregateUDFImpl for TallyAggregate {
    fn name(&self) -> &str {
        self.name
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, arg_types: &[DataType]) -> datafusion_common::Result<DataType> {
        result_type(self.kind, arg_types.first())
            .map_err(|e| datafusion_common::DataFusionError::Plan(e.to_string()))
    }

    fn is_nullable(&self) -> bool {
        !matches!(self.kind, AggregateKind::Count | AggregateKind::CountStar)
    }

    fn accumulator(
        &self,
        _acc_args: AccumulatorArgs,
    ) -> datafusion_common::Result<Box<dyn Accumulator>> {
        datafusion_common::not_impl_err!(
            "{} is evaluated by Tally's group kernels, not by a DataFusion accumulator",
            self.name
        )
    }
}

fn udaf(name: &'static str, kind: AggregateKind) -> Arc<AggregateUDF> {
    Arc::new(AggregateUDF::from(TallyAggregate {
        name,
        kind,
        signature: Signature::any(1, Volatility::Immutable),
    }))
}

static COUNT: LazyLock<Arc<AggregateUDF>> = LazyLock::new(|| udaf("count", AggregateKind::Count));
static SUM: LazyLock<Arc<AggregateUDF>> = LazyLock::new(|| udaf("sum", AggregateKind::Sum));
static SUM0: LazyLock<Arc<AggregateUDF>> = LazyLock::new(|| udaf("$sum0", AggregateKind::Sum0));
static AVG: LazyLock<Arc<AggregateUDF>> = LazyLock::new(|| udaf("avg", AggregateKind::Avg));
static MIN: LazyLock<Arc<AggregateUDF>> = LazyLock::new(|| udaf("min", AggregateKind::Min));
static MAX: LazyLock<Arc<AggregateUDF>> = LazyLock::new(|| udaf("max", AggregateKind::Max));

/// The aggregate UDFs Tally provides, for planners that look functions up by name.
pub fn all_udafs() -> Vec<Arc<AggregateUDF>> {
    vec![
        Arc::clone(&COUNT),
        Arc::clone(&SUM),
        Arc::clone(&SUM0),
        Arc::clone(&AVG),
        Arc::clone(&MIN),
        Arc::clone(&MAX),
    ]
}

/// `COUNT(x)`: the number of non-NULL values.
pub fn count(x: Expr) -> Expr {
    COUNT.call(vec![x])
}

/// `COUNT(*)`: the number of rows (output name `count(*)` unless aliased).
pub fn count_star() -> Expr {
    COUNT.call(vec![lit(1i64)])
}

/// `SUM(x)`: NULL for a group without non-NULL values; keeps the argument's type.
pub fn sum(x: Expr) -> Expr {
    SUM.call(vec![x])
}

/// `$SUM0(x)`: like `SUM` but 0 for a group without non-NULL values (Flink's internal sum).
pub fn sum0(x: Expr) -> Expr {
    SUM0.call(vec![x])
}

/// `AVG(x)`: of an integer type, that type, truncated.
pub fn avg(x: Expr) -> Expr {
    AVG.call(vec![x])
}

/// `MIN(x)`.
pub fn min(x: Expr) -> Expr {
    MIN.call(vec![x])
}

/// `MAX(x)`.
pub fn max(x: Expr) -> Expr {
    MAX.call(vec![x])
}
