//! The local phase's flushes: the rows each key folded, the key table kept across a flush,
//! and a flush routed to the workers.

use super::*;
use arrow::array::{Int64Array, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use datafusion_expr::col;

/// The schema `(k BIGINT NOT NULL, v BIGINT)` and the plan of `aggregates` grouped by `k`.
fn plan_by_k(aggregates: &[datafusion_expr::Expr]) -> (SchemaRef, Arc<AggregatePlan>) {
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("v", DataType::Int64, true),
    ]));
    let plan = AggregatePlan::try_new(Arc::clone(&schema), &[col("k")], aggregates, None).unwrap();
    (schema, Arc::new(plan))
}

/// The input rows each flushed key folded: every row, accumulating or retracting, before
/// and after the first retraction of a mini-batch and in the next one.
#[test]
fn a_flush_counts_each_keys_rows() {
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("op", DataType::Utf8, false),
    ]));
    let plan = AggregatePlan::try_new(
        Arc::clone(&schema),
        &[col("k")],
        &[crate::aggregates::count_star()],
        None,
    )
    .unwrap();
    let mut local = LocalGroupAggregate::try_new(Arc::new(plan)).unwrap();
    let batch = |keys: Vec<i64>, ops: Vec<&str>| {
        let cols: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from(keys)),
            Arc::new(StringArray::from(ops)),
        ];
        RecordBatch::try_new(Arc::clone(&schema), cols).unwrap()
    };
    let rows_of = |f: Flushed| -> Vec<u64> { f.rows };
    local
        .push(&batch(vec![1, 2, 1], vec!["+I", "+I", "+I"]))
        .unwrap();
    local.push(&batch(vec![1, 3], vec!["-D", "+I"])).unwrap();
    local.push(&batch(vec![2, 3], vec!["+I", "+I"])).unwrap();
    // Keys in first-seen order: 1, 2, 3.
    assert_eq!(
        rows_of(local.flush_parts().unwrap().unwrap()),
        vec![3, 2, 2]
    );
    local
        .push(&batch(vec![3, 3, 2], vec!["+I", "+I", "+I"]))
        .unwrap();
    // The key table kept its keys (in their first-seen order: 2, then 3).
    assert_eq!(rows_of(local.flush_parts().unwrap().unwrap()), vec![1, 2]);
    local.push(&batch(vec![2], vec!["-D"])).unwrap();
    assert_eq!(rows_of(local.flush_parts().unwrap().unwrap()), vec![1]);
}

/// A small key table keeps its keys across a flush, and a flush sends only the keys that
/// got rows since the last one, their accumulators afresh; a table of which fewer than
/// half the keys came back, or past [`RETAINED_KEYS`], is cleared.
#[test]
fn a_small_key_table_outlives_a_flush() {
    let (schema, plan) = plan_by_k(&[
        crate::aggregates::count_star(),
        crate::aggregates::sum(col("v")),
    ]);
    let mut local = LocalGroupAggregate::try_new(plan).unwrap();
    let batch = |keys: Vec<i64>, values: Vec<i64>| {
        let cols: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from(keys)),
            Arc::new(Int64Array::from(values)),
        ];
        RecordBatch::try_new(Arc::clone(&schema), cols).unwrap()
    };
    let show = |b: &RecordBatch| {
        let keys = b.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
        let sums = b.column(2).as_any().downcast_ref::<Int64Array>().unwrap();
        (0..b.num_rows())
            .map(|r| (keys.value(r), sums.value(r)))
            .collect::<Vec<_>>()
    };
    local.push(&batch(vec![1, 2, 3], vec![10, 20, 30])).unwrap();
    assert_eq!(
        show(&local.flush().unwrap().unwrap()),
        [(1, 10), (2, 20), (3, 30)]
    );
    assert_eq!((local.len(), local.keys()), (3, 0));
    assert!(local.flush().unwrap().is_none());
    local.push(&batch(vec![3, 3], vec![5, 6])).unwrap();
    assert_eq!((local.len(), local.keys()), (3, 1));
    assert_eq!(show(&local.flush().unwrap().unwrap()), [(3, 11)]);
    // One key of three came back: the table is cleared.
    assert_eq!(local.len(), 0);
    let many: Vec<i64> = (0..=RETAINED_KEYS as i64).collect();
    local.push(&batch(many.clone(), many.clone())).unwrap();
    assert_eq!(local.flush().unwrap().unwrap().num_rows(), many.len());
    assert_eq!((local.len(), local.keys()), (0, 0));
}

/// A flush routed to the workers holds, part by part, exactly the rows of the whole flush
/// whose keys' key groups the worker owns (keys, accumulators, counts, hashes and rows),
/// DISTINCT lists included (built once for the groups in worker order).
#[test]
fn a_routed_flush_is_the_whole_flush_cut_by_worker() {
    use arrow::array::AsArray;
    use arrow::datatypes::Int64Type;
    use arrow::util::display::array_value_to_string;
    let (schema, plan) = plan_by_k(&[
        crate::aggregates::count_star(),
        crate::aggregates::sum(col("v")),
        {
            use datafusion_expr::ExprFunctionExt;
            crate::aggregates::count(col("v"))
                .distinct()
                .build()
                .unwrap()
        },
    ]);
    let keys: Vec<i64> = (0..500).map(|i| (i * 7919) % 61).collect();
    let values: Vec<Option<i64>> = (0..500).map(|i| (i % 11 != 0).then_some(i % 13)).collect();
    let batch = RecordBatch::try_new(
        Arc::clone(&schema),
        vec![
            Arc::new(Int64Array::from(keys)),
            Arc::new(Int64Array::from(values)),
        ],
    )
    .unwrap();
    let rows_of = |f: &Flushed| -> Vec<String> {
        (0..f.batch.num_rows())
            .map(|r| {
                let cols: Vec<String> = f
                    .batch
                    .columns()
                    .iter()
                    .map(|c| array_value_to_string(c, r).unwrap())
                    .collect();
                format!("{} {} {}", cols.join(" "), f.hashes[r], f.rows[r])
            })
            .collect()
    };
    let mut whole = LocalGroupAggregate::try_new(Arc::clone(&plan)).unwrap();
    whole.push(&batch).unwrap();
    let whole = whole.flush_parts().unwrap().unwrap();
    let kg = KeyGroups::new(128, 3).unwrap();
    let mut local = LocalGroupAggregate::try_new(Arc::clone(&plan)).unwrap();
    for _ in 0..2 {
        local.push(&batch).unwrap();
        let routed = local.flush_routed(&kg).unwrap().unwrap();
        assert_eq!(routed.parts.len(), 3);
        let mut seen = 0;
        for (w, part) in routed.parts.iter().enumerate() {
            let want: Vec<String> = rows_of(&whole)
                .into_iter()
                .zip(&whole.hashes)
                .filter(|(_, h)| kg.worker_of_hash(**h) == w)
                .map(|(r, _)| r)
                .collect();
            assert_eq!(rows_of(part), want, "worker {w}");
            seen += part.batch.num_rows();
        }
        assert_eq!(seen, whole.batch.num_rows());
        // The hottest key's share of the rows folded.
        let counts = whole.batch.column(whole.batch.num_columns() - 1);
        let counts = counts.as_primitive::<Int64Type>();
        let top = counts.values().iter().copied().max().unwrap();
        assert_eq!(routed.hot_share, top as f64 / 500.0);
    }
}
