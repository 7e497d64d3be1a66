//! A split PARTIAL for tests: the plan of an Expand's three group sets over two bucketed
//! DISTINCT arguments, and its set batches.

use std::sync::Arc;

use arrow::array::{ArrayRef, BooleanArray, Int32Array, Int64Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion_expr::{ExprFunctionExt, col, lit};

use super::{AggregatePlan, BucketKeys};

/// The PARTIAL's input: key `k`, DISTINCT arguments `u` and `v`, a flag `f`, the bucket
/// columns `$f4` (of `u`) and `$f5` (of `v`), the set id `$e`.
pub(crate) fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("u", DataType::Int64, true),
        Field::new("v", DataType::Int64, true),
        Field::new("f", DataType::Boolean, true),
        Field::new("$f4", DataType::Int32, true),
        Field::new("$f5", DataType::Int32, true),
        Field::new("$e", DataType::Int64, false),
    ]))
}

/// The PARTIAL grouped by `k` and the two bucket columns over `buckets` buckets:
/// `COUNT(*)` of the keys alone's set (id 3), `COUNT(DISTINCT u)` twice (the second FILTERed
/// by `f`) of `u`'s set (id 2), `COUNT(DISTINCT v)` of `v`'s set (id 1). With `routes`, its
/// `BucketKeys::call_sets` say so (a local phase may route its entries at the flush).
pub(crate) fn plan(buckets: u32, routes: bool) -> AggregatePlan {
    let e = |id: i64| col("$e").eq(lit(id));
    let distinct = |arg: &str, filter: datafusion_expr::Expr| {
        crate::aggregates::count(col(arg))
            .distinct()
            .filter(filter)
            .build()
            .unwrap()
    };
    let aggregates = [
        crate::aggregates::count_star()
            .filter(e(3))
            .build()
            .unwrap(),
        distinct("u", e(2)),
        distinct("u", col("f").and(e(2))),
        distinct("v", e(1)),
    ];
    let mut plan = AggregatePlan::try_new(
        schema(),
        &[col("k"), col("$f4"), col("$f5")],
        &aggregates,
        None,
    )
    .unwrap();
    plan.bucket_keys = Some(BucketKeys {
        columns: 2,
        buckets,
        call_sets: routes.then(|| vec![None, Some(0), Some(0), Some(1)]),
        hot: None,
    });
    plan
}

/// A set batch of [`schema`]: the columns `k, u, v, f, $f4, $f5` given, `$e` holding `id`.
pub(crate) fn set_batch(columns: [&ArrayRef; 6], id: i64) -> RecordBatch {
    let n = columns[0].len();
    let mut cols: Vec<ArrayRef> = columns.iter().map(|&c| Arc::clone(c)).collect();
    cols.push(Arc::new(Int64Array::from(vec![id; n])));
    RecordBatch::try_new(schema(), cols).unwrap()
}

/// Key `k`'s hash, as a key table and the hot keys take it.
pub(crate) fn key_hash(k: i64) -> u64 {
    let mut h = vec![];
    tally_kernels::hash::hash_columns(&[Arc::new(Int64Array::from(vec![k])) as ArrayRef], &mut h)
        .unwrap();
    h[0]
}

/// Two set batches of the same four rows (keys 1, 1, 2, 2; `u` 10 to 13): `u`'s set, its
/// buckets 2, 3, 0, 1, and the keys alone's, its buckets NULL.
pub(crate) fn hot_and_cold_sets() -> [RecordBatch; 2] {
    let k: ArrayRef = Arc::new(Int64Array::from(vec![1, 1, 2, 2]));
    let u: ArrayRef = Arc::new(Int64Array::from(vec![10, 11, 12, 13]));
    let v: ArrayRef = Arc::new(Int64Array::from(vec![None::<i64>; 4]));
    let f: ArrayRef = Arc::new(BooleanArray::from(vec![true; 4]));
    let b4: ArrayRef = Arc::new(Int32Array::from(vec![2, 3, 0, 1]));
    let none: ArrayRef = Arc::new(Int32Array::from(vec![None::<i32>; 4]));
    [
        set_batch([&k, &u, &v, &f, &b4, &none], 2),
        set_batch([&k, &u, &v, &f, &none, &none], 3),
    ]
}
