//! The scalar functions of the split-distinct rewrite (`sql/split.rs`): the bucket of a value
//! ([`bucket`]) and AVG from its split parts ([`avg_final`]), shown in EXPLAIN as Flink shows them.

use std::sync::Arc;

use arrow::array::ArrayRef;
use arrow::datatypes::DataType;
use datafusion_common::DataFusionError;
use datafusion_expr::{
    ColumnarValue, Expr, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};
use tally_kernels::aggregates::{AggregateKind, new_accumulator, result_type};

fn df_err(e: impl std::fmt::Display) -> DataFusionError {
    DataFusionError::Execution(e.to_string())
}

/// The columns of scalar function arguments, as arrays of `n` rows.
fn arg_arrays(args: &ScalarFunctionArgs) -> datafusion_common::Result<Vec<ArrayRef>> {
    args.args
        .iter()
        .map(|a| a.clone().into_array(args.number_rows))
        .collect()
}

/// The split-distinct bucket of a value: `MOD(HASH_CODE(x), buckets)` (see
/// [`tally_kernels::hash::bucket_array`]). Shown in EXPLAIN as Flink shows it.
#[derive(Debug, PartialEq, Eq, Hash)]
struct Bucket {
    buckets: u32,
    signature: Signature,
}

impl ScalarUDFImpl for Bucket {
    fn name(&self) -> &str {
        BUCKET_FUNCTION
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn return_type(&self, _arg_types: &[DataType]) -> datafusion_common::Result<DataType> {
        Ok(DataType::Int32)
    }
    fn invoke_with_args(
        &self,
        args: ScalarFunctionArgs,
    ) -> datafusion_common::Result<ColumnarValue> {
        let arrays = arg_arrays(&args)?;
        let [x] = arrays.as_slice() else {
            return Err(df_err("the bucket function takes one argument"));
        };
        let b = tally_kernels::hash::bucket_array(x, self.buckets).map_err(df_err)?;
        Ok(ColumnarValue::Array(Arc::new(b)))
    }
}

/// The name of the bucket function in plans.
pub const BUCKET_FUNCTION: &str = "tally_bucket";

/// `MOD(HASH_CODE(x), buckets)`: the split-distinct bucket of `x` (an Int32 in `0..buckets`,
/// NULL for NULL).
pub fn bucket(x: Expr, buckets: u32) -> Expr {
    ScalarUDF::from(Bucket {
        buckets,
        signature: Signature::any(1, Volatility::Immutable),
    })
    .call(vec![x])
}

/// The buckets of a [`bucket`] call, if `f` is one.
pub fn bucket_count(f: &ScalarUDF) -> Option<u32> {
    let any: &dyn std::any::Any = f.inner().as_ref();
    any.downcast_ref::<Bucket>().map(|b| b.buckets)
}

/// AVG from its split parts: `IF(count = 0, NULL, sum / count)` computed by the AVG kernel
/// itself (merging the sum and count as its accumulator state), so that the result is exactly
/// the unsplit AVG's: same type, truncation and rounding.
#[derive(Debug, PartialEq, Eq, Hash)]
struct AvgFinal {
    /// The type of AVG's argument.
    arg_type: DataType,
    signature: Signature,
}

impl ScalarUDFImpl for AvgFinal {
    fn name(&self) -> &str {
        AVG_FINAL_FUNCTION
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn return_type(&self, _arg_types: &[DataType]) -> datafusion_common::Result<DataType> {
        result_type(AggregateKind::Avg, Some(&self.arg_type)).map_err(df_err)
    }
    fn invoke_with_args(
        &self,
        args: ScalarFunctionArgs,
    ) -> datafusion_common::Result<ColumnarValue> {
        let arrays = arg_arrays(&args)?;
        let n = args.number_rows;
        let mut acc =
            new_accumulator(AggregateKind::Avg, Some(&self.arg_type), false).map_err(df_err)?;
        let groups: Vec<u32> = (0..n as u32).collect();
        acc.merge(&arrays, &groups, n).map_err(df_err)?;
        Ok(ColumnarValue::Array(acc.evaluate(&groups).map_err(df_err)?))
    }
}

/// The name of the AVG finisher in plans.
pub const AVG_FINAL_FUNCTION: &str = "tally_avg_final";

/// AVG's state type for an argument of `arg_type`: what its split sum is cast to.
///
/// # Errors
/// When AVG does not take that type.
pub fn avg_sum_type(arg_type: &DataType) -> crate::Result<DataType> {
    let acc = new_accumulator(AggregateKind::Avg, Some(arg_type), false)
        .map_err(|e| crate::Error::plan(format!("AVG over {arg_type}: {e}")))?;
    acc.state_types()
        .into_iter()
        .next()
        .ok_or_else(|| crate::Error::internal("AVG without state"))
}

/// AVG of `arg_type` from the merged `sum` (of [`avg_sum_type`]) and `count` of its split parts.
pub fn avg_final(sum: Expr, count: Expr, arg_type: DataType) -> Expr {
    ScalarUDF::from(AvgFinal {
        arg_type,
        signature: Signature::any(2, Volatility::Immutable),
    })
    .call(vec![sum, count])
}
