//! Key and argument types through the operator, with Flink's result types.

use std::sync::Arc;

use arrow::array::*;
use arrow::datatypes::{DataType, Field, Int8Type, Int16Type, Schema};
use datafusion_expr::col;
use tally::aggregates::{avg, count, max, min, sum};

use crate::common::{build, config, format_changes};

/// Runs `SELECT key, aggs… GROUP BY key` over one batch (mini-batch on) and returns the changes
/// and the output schema's types.
fn run(
    cols: Vec<(&str, ArrayRef)>,
    aggs: Vec<datafusion_expr::Expr>,
) -> (Vec<String>, Vec<DataType>) {
    let schema = Arc::new(Schema::new(
        cols.iter()
            .map(|(n, a)| Field::new(*n, a.data_type().clone(), true))
            .collect::<Vec<_>>(),
    ));
    let batch =
        RecordBatch::try_new(schema.clone(), cols.into_iter().map(|(_, a)| a).collect()).unwrap();
    let (mut agg, _) = build(&schema, vec![col("key")], aggs, config(Some(100), true));
    let mut out = agg.push(&batch).unwrap();
    out.extend(agg.finish().unwrap());
    let types = agg
        .output_schema()
        .fields()
        .iter()
        .map(|f| f.data_type().clone())
        .collect();
    let mut lines = format_changes(&out);
    lines.sort();
    (lines, types)
}

#[test]
fn every_key_type_groups_and_round_trips() {
    let keys: Vec<ArrayRef> = vec![
        Arc::new(Int8Array::from(vec![Some(1), None, Some(1), Some(-3)])),
        Arc::new(Int16Array::from(vec![Some(1), None, Some(1), Some(-3)])),
        Arc::new(Int32Array::from(vec![Some(1), None, Some(1), Some(-3)])),
        Arc::new(Int64Array::from(vec![Some(1), None, Some(1), Some(-3)])),
        Arc::new(UInt8Array::from(vec![Some(1), None, Some(1), Some(3)])),
        Arc::new(UInt16Array::from(vec![Some(1), None, Some(1), Some(3)])),
        Arc::new(UInt32Array::from(vec![Some(1), None, Some(1), Some(3)])),
        Arc::new(UInt64Array::from(vec![Some(1), None, Some(1), Some(3)])),
        Arc::new(Float32Array::from(vec![
            Some(1.5),
            None,
            Some(1.5),
            Some(-3.0),
        ])),
        Arc::new(Float64Array::from(vec![
            Some(1.5),
            None,
            Some(1.5),
            Some(-3.0),
        ])),
        Arc::new(
            Decimal128Array::from(vec![Some(150), None, Some(150), Some(-300)])
                .with_precision_and_scale(10, 2)
                .unwrap(),
        ),
        Arc::new(BooleanArray::from(vec![
            Some(true),
            None,
            Some(true),
            Some(false),
        ])),
        Arc::new(StringArray::from(vec![
            Some("x"),
            None,
            Some("x"),
            Some("y"),
        ])),
        Arc::new(LargeStringArray::from(vec![
            Some("x"),
            None,
            Some("x"),
            Some("y"),
        ])),
        Arc::new(StringViewArray::from(vec![
            Some("x"),
            None,
            Some("x"),
            Some("a long string view value"),
        ])),
        Arc::new(
            vec![Some("x"), None, Some("x"), Some("y")]
                .into_iter()
                .collect::<DictionaryArray<Int8Type>>(),
        ),
        Arc::new(
            vec![Some("x"), None, Some("x"), Some("y")]
                .into_iter()
                .collect::<DictionaryArray<Int16Type>>(),
        ),
        Arc::new(Date32Array::from(vec![Some(1), None, Some(1), Some(19000)])),
        Arc::new(Time64MicrosecondArray::from(vec![
            Some(1),
            None,
            Some(1),
            Some(5),
        ])),
        Arc::new(
            TimestampMillisecondArray::from(vec![Some(1), None, Some(1), Some(5)])
                .with_timezone("UTC"),
        ),
    ];
    for key in keys {
        let dt = key.data_type().clone();
        let v: ArrayRef = Arc::new(Int64Array::from(vec![1, 2, 3, 4]));
        let (lines, types) = run(vec![("key", key.clone()), ("v", v)], vec![sum(col("v"))]);
        assert_eq!(types[0], dt, "key type kept");
        assert_eq!(lines.len(), 3, "{dt}: {lines:?}");
        // The key that appears twice sums 1 + 3.
        assert!(lines.iter().any(|l| l.ends_with(", 4]")), "{dt}: {lines:?}");
        assert!(lines.iter().any(|l| l == "+I[null, 2]"), "{dt}: {lines:?}");
    }
}

#[test]
fn result_types_follow_flink() {
    let key: ArrayRef = Arc::new(StringArray::from(vec!["a", "a", "a"]));
    let dec: ArrayRef = Arc::new(
        Decimal128Array::from(vec![222222222i128, 333333333, 333333333])
            .with_precision_and_scale(32, 8)
            .unwrap(),
    );
    let (lines, types) = run(
        vec![("key", key.clone()), ("d", dec)],
        vec![sum(col("d")), avg(col("d")), min(col("d")), count(col("d"))],
    );
    assert_eq!(
        types[1..],
        [
            DataType::Decimal128(38, 8),
            DataType::Decimal128(38, 8),
            DataType::Decimal128(32, 8),
            DataType::Int64
        ]
    );
    // avg(2.22222222, 3.33333333, 3.33333333) = 2.96296296 (HALF_UP at scale 8).
    assert_eq!(lines, vec!["+I[a, 8.88888888, 2.96296296, 2.22222222, 3]"]);

    let dec2: ArrayRef = Arc::new(
        Decimal128Array::from(vec![100i128, 200, 200])
            .with_precision_and_scale(5, 2)
            .unwrap(),
    );
    let (lines, types) = run(vec![("key", key.clone()), ("d", dec2)], vec![avg(col("d"))]);
    assert_eq!(types[1], DataType::Decimal128(38, 6));
    assert_eq!(lines, vec!["+I[a, 1.666667]"]);

    let f32s: ArrayRef = Arc::new(Float32Array::from(vec![1.0, 2.0, 4.0]));
    let (lines, types) = run(
        vec![("key", key.clone()), ("f", f32s)],
        vec![avg(col("f")), sum(col("f"))],
    );
    assert_eq!(types[1..], [DataType::Float32, DataType::Float32]);
    assert_eq!(lines, vec!["+I[a, 2.3333333, 7.0]"]);
}

#[test]
fn min_max_over_every_orderable_type() {
    let key: ArrayRef = Arc::new(StringArray::from(vec!["a", "a", "a"]));
    let cases: Vec<(ArrayRef, &str)> = vec![
        (
            Arc::new(BooleanArray::from(vec![Some(true), None, Some(false)])),
            "false, true",
        ),
        (
            Arc::new(StringViewArray::from(vec![
                Some("pear"),
                None,
                Some("apple"),
            ])),
            "apple, pear",
        ),
        (
            Arc::new(LargeStringArray::from(vec![
                Some("pear"),
                None,
                Some("apple"),
            ])),
            "apple, pear",
        ),
        (
            Arc::new(
                vec![Some("pear"), None, Some("apple")]
                    .into_iter()
                    .collect::<DictionaryArray<Int8Type>>(),
            ),
            "apple, pear",
        ),
        (
            Arc::new(Date32Array::from(vec![Some(0), None, Some(365)])),
            "1970-01-01, 1971-01-01",
        ),
        (
            Arc::new(TimestampSecondArray::from(vec![Some(60), None, Some(0)])),
            "1970-01-01T00:00:00, 1970-01-01T00:01:00",
        ),
        (
            Arc::new(Time32SecondArray::from(vec![Some(60), None, Some(0)])),
            "00:00:00, 00:01:00",
        ),
        (
            Arc::new(Float64Array::from(vec![Some(-0.0), None, Some(0.0)])),
            "-0.0, 0.0",
        ),
        (
            Arc::new(UInt64Array::from(vec![Some(u64::MAX), None, Some(0)])),
            "0, 18446744073709551615",
        ),
    ];
    for (arr, expected) in cases {
        let dt = arr.data_type().clone();
        let (lines, types) = run(
            vec![("key", key.clone()), ("x", arr)],
            vec![min(col("x")), max(col("x"))],
        );
        assert_eq!(lines, vec![format!("+I[a, {expected}]")], "{dt}");
        let want = match &dt {
            DataType::Dictionary(_, v) => v.as_ref().clone(),
            other => other.clone(),
        };
        assert_eq!(types[1], want, "{dt}");
    }
}

/// Snapshots round-trip the state of every accumulator kind over every argument type: restored
/// into an aggregate with another number of workers, the state snapshots back to the same rows,
/// and the rest of a changelog (retractions of values from before the snapshot included) gives
/// the final table of an uninterrupted run.
#[test]
fn snapshots_round_trip_every_accumulator_over_every_type() {
    use datafusion_expr::ExprFunctionExt;
    let ops: ArrayRef = Arc::new(Int8Array::from(vec![0, 0, 0, 0, 0, 3, 0, 3, 0, 0, 1, 2]));
    let keys: ArrayRef = Arc::new(StringArray::from(vec![
        Some("a"),
        Some("b"),
        Some("a"),
        Some("b"),
        Some("a"),
        Some("a"),
        Some("c"),
        Some("b"),
        Some("c"),
        None,
        Some("c"),
        Some("c"),
    ]));
    let base = Int64Array::from(vec![
        Some(5),
        Some(-3),
        None,
        Some(7),
        Some(5),
        Some(5),
        Some(2),
        Some(-3),
        Some(9),
        Some(-1),
        Some(9),
        Some(4),
    ]);
    let types = [
        DataType::Int8,
        DataType::Int32,
        DataType::Int64,
        DataType::UInt16,
        DataType::Float32,
        DataType::Float64,
        DataType::Decimal128(12, 2),
        DataType::Boolean,
        DataType::Utf8,
        DataType::LargeUtf8,
        DataType::Date32,
        DataType::Timestamp(arrow::datatypes::TimeUnit::Millisecond, None),
    ];
    for dt in types {
        let values = arrow::compute::cast(&base, &dt).unwrap();
        let schema = Arc::new(Schema::new(vec![
            Field::new("key", DataType::Utf8, true),
            Field::new("v", dt.clone(), true),
            Field::new("op", DataType::Int8, false),
        ]));
        let batch =
            RecordBatch::try_new(schema.clone(), vec![keys.clone(), values, ops.clone()]).unwrap();
        let numeric = dt.is_numeric();
        let mut aggs = vec![
            count(col("v")),
            min(col("v")),
            max(col("v")),
            count(col("v")).distinct().build().unwrap(),
            max(col("v"))
                .filter(col("key").eq(datafusion_expr::lit("a")))
                .build()
                .unwrap(),
        ];
        if numeric {
            aggs.extend([
                sum(col("v")),
                avg(col("v")),
                sum(col("v")).distinct().build().unwrap(),
            ]);
        }
        let make = |workers: usize| {
            let mut cfg = config(Some(3), true);
            cfg.parallelism = workers;
            tally::GroupAggregate::builder(schema.clone())
                .group_by([col("key")])
                .aggregate(aggs.clone())
                .config(cfg)
                .build_parallel()
                .unwrap()
                .with_min_slice_rows(1)
        };
        let materialize = |batches: &[tally::changelog::ChangeBatch]| {
            let mut m = crate::common::Materialized::default();
            m.apply(batches);
            m.rows()
        };
        let mut whole = make(2);
        let mut all = whole.push(&batch).unwrap();
        all.extend(whole.finish().unwrap());
        let mut first = make(2);
        let mut out = first.push(&batch.slice(0, 6)).unwrap();
        out.extend(first.finish().unwrap());
        let snap = first.snapshot().unwrap();
        let mut second = make(3);
        second.restore_snapshot(&snap).unwrap();
        let sorted = |b: &[RecordBatch]| {
            let mut v: Vec<String> = arrow::util::pretty::pretty_format_batches(b)
                .unwrap()
                .to_string()
                .lines()
                .filter(|l| l.starts_with("| "))
                .skip(1)
                .map(str::to_string)
                .collect();
            v.sort();
            v
        };
        assert_eq!(
            sorted(&second.snapshot().unwrap()),
            sorted(&snap),
            "{dt}: snapshot of the restored state"
        );
        out.extend(second.push(&batch.slice(6, 6)).unwrap());
        out.extend(second.finish().unwrap());
        assert_eq!(materialize(&out), materialize(&all), "{dt}");
        assert!(!materialize(&all).is_empty(), "{dt}");
    }
}
