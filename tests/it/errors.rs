//! Bad input gets a clear one-line error naming the problem, never a panic, and never loses
//! state already accepted.

use std::sync::Arc;

use arrow::array::{
    ArrayRef, Int8Array, Int32Array, Int64Array, ListArray, RecordBatch, StringArray,
};
use arrow::datatypes::{DataType, Field, Int32Type, Schema, SchemaRef};
use datafusion_expr::{ExprFunctionExt, col, lit};
use tally::aggregates::{avg, count, count_star, sum};
use tally::{GroupAggregate, Result};

use crate::common::{build, config, format_changes, kv_batch, kv_schema};

fn build_err(
    schema: SchemaRef,
    keys: Vec<datafusion_expr::Expr>,
    aggs: Vec<datafusion_expr::Expr>,
) -> String {
    let e = GroupAggregate::builder(schema)
        .group_by(keys)
        .aggregate(aggs)
        .build()
        .unwrap_err();
    assert!(e.is_user_error(), "{e}");
    let s = e.to_string();
    assert!(!s.contains('\n'), "error is not one line: {s}");
    s
}

#[test]
fn unknown_columns_are_named() {
    let s = build_err(kv_schema(false), vec![col("nope")], vec![count_star()]);
    assert!(s.contains("nope"), "{s}");
    let s = build_err(kv_schema(false), vec![col("k")], vec![sum(col("missing"))]);
    assert!(s.contains("missing"), "{s}");
    let s = build_err(
        kv_schema(false),
        vec![col("k")],
        vec![
            sum(col("v"))
                .filter(col("ghost").eq(lit(1)))
                .build()
                .unwrap(),
        ],
    );
    assert!(s.contains("ghost"), "{s}");
}

#[test]
fn wrong_types_are_named() {
    let s = build_err(kv_schema(false), vec![col("v")], vec![sum(col("k"))]);
    assert!(s.contains("SUM") && s.contains("Utf8"), "{s}");
    let s = build_err(kv_schema(false), vec![col("v")], vec![avg(col("k"))]);
    assert!(s.contains("AVG") && s.contains("Utf8"), "{s}");
    let s = build_err(
        kv_schema(false),
        vec![col("k")],
        vec![sum(col("v")).filter(col("v")).build().unwrap()],
    );
    assert!(s.contains("BOOLEAN"), "{s}");
    let list = Arc::new(Schema::new(vec![Field::new(
        "l",
        DataType::List(Arc::new(Field::new("item", DataType::Int32, true))),
        true,
    )]));
    let s = build_err(list, vec![col("l")], vec![count_star()]);
    assert!(s.contains("group key"), "{s}");
}

#[test]
fn unsupported_functions_and_shapes_are_named() {
    let s = build_err(kv_schema(false), vec![col("k")], vec![col("v")]);
    assert!(s.contains("not an aggregate"), "{s}");
    let s = build_err(kv_schema(false), vec![col("k")], vec![]);
    assert!(s.contains("at least one aggregate"), "{s}");
    let s = build_err(
        kv_schema(false),
        vec![col("k")],
        vec![count_star().distinct().build().unwrap()],
    );
    assert!(s.contains("DISTINCT"), "{s}");
}

#[test]
fn bad_changelog_column() {
    let schema = Arc::new(Schema::new(vec![
        Field::new("op", DataType::Float64, false),
        Field::new("k", DataType::Utf8, true),
    ]));
    let s = build_err(schema, vec![col("k")], vec![count_star()]);
    assert!(s.contains("changelog column 'op'"), "{s}");
    let e = GroupAggregate::builder(kv_schema(false))
        .group_by([col("k")])
        .aggregate([count_star()])
        .changelog_column("kind")
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("'kind'"), "{e}");
}

fn changes(agg: &mut GroupAggregate, b: &RecordBatch) -> Result<Vec<String>> {
    Ok(format_changes(&agg.push(b)?))
}

#[test]
fn bad_op_codes_fail_the_batch_and_keep_the_state() {
    let schema = kv_schema(true);
    let (mut agg, _) = build(
        &schema,
        vec![col("k")],
        vec![count_star()],
        config(None, true),
    );
    assert_eq!(
        changes(&mut agg, &kv_batch(&schema, &["+I a 1"])).unwrap(),
        vec!["+I[a, 1]"]
    );
    for bad in ["+X", "", "I"] {
        let b = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(StringArray::from(vec!["+I", bad])) as ArrayRef,
                Arc::new(StringArray::from(vec!["a", "a"])),
                Arc::new(Int64Array::from(vec![1, 2])),
            ],
        )
        .unwrap();
        let e = agg.push(&b).unwrap_err();
        assert!(e.is_user_error());
        assert!(e.to_string().contains("row 1"), "{e}");
    }
    // Nothing of the failed batches was applied.
    assert_eq!(
        changes(&mut agg, &kv_batch(&schema, &["+I a 1"])).unwrap(),
        vec!["-U[a, 1]", "+U[a, 2]"]
    );

    let int_schema = Arc::new(Schema::new(vec![
        Field::new("op", DataType::Int8, true),
        Field::new("k", DataType::Utf8, true),
    ]));
    let (mut agg, _) = build(
        &int_schema,
        vec![col("k")],
        vec![count_star()],
        config(Some(10), true),
    );
    for (codes, needle) in [
        (vec![Some(0i8), Some(7)], "7 at row 1"),
        (vec![None, Some(0)], "NULL op at row 0"),
    ] {
        let b = RecordBatch::try_new(
            int_schema.clone(),
            vec![
                Arc::new(Int8Array::from(codes)) as ArrayRef,
                Arc::new(StringArray::from(vec!["a", "b"])),
            ],
        )
        .unwrap();
        let e = agg.push(&b).unwrap_err().to_string();
        assert!(e.contains(needle), "{e}");
    }
}

#[test]
fn op_column_as_codes_strings_and_dictionary() {
    let expected = vec!["+I[a, 1]", "-D[a, 1]", "+I[b, 1]"];
    let keys: ArrayRef = Arc::new(StringArray::from(vec!["a", "a", "b"]));
    let ops: Vec<ArrayRef> = vec![
        Arc::new(Int8Array::from(vec![0, 3, 2])),
        Arc::new(Int32Array::from(vec![0, 1, 0])),
        Arc::new(StringArray::from(vec!["+I", "-D", "+U"])),
        Arc::new(
            vec!["+I", "-U", "+I"]
                .into_iter()
                .collect::<arrow::array::DictionaryArray<Int32Type>>(),
        ),
    ];
    for op in ops {
        let schema = Arc::new(Schema::new(vec![
            Field::new("op", op.data_type().clone(), false),
            Field::new("k", DataType::Utf8, true),
        ]));
        let (mut agg, _) = build(
            &schema,
            vec![col("k")],
            vec![count_star()],
            config(None, true),
        );
        let b = RecordBatch::try_new(schema.clone(), vec![op.clone(), keys.clone()]).unwrap();
        assert_eq!(
            changes(&mut agg, &b).unwrap(),
            expected,
            "{}",
            op.data_type()
        );
    }
}

#[test]
fn schema_mismatch_is_rejected() {
    let schema = kv_schema(false);
    let (mut agg, _) = build(
        &schema,
        vec![col("k")],
        vec![count(col("v"))],
        config(None, true),
    );
    let other = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Utf8, true),
        Field::new("v", DataType::Int32, true),
    ]));
    let b = RecordBatch::try_new(
        other,
        vec![
            Arc::new(StringArray::from(vec!["a"])) as ArrayRef,
            Arc::new(Int32Array::from(vec![1])),
        ],
    )
    .unwrap();
    let e = agg.push(&b).unwrap_err().to_string();
    assert!(
        e.contains("does not match") && e.contains("v: Int32") && e.contains("v: Int64"),
        "{e}"
    );
    let list_batch = RecordBatch::try_new(
        Arc::new(Schema::new(vec![Field::new(
            "l",
            DataType::List(Arc::new(Field::new("item", DataType::Int32, true))),
            true,
        )])),
        vec![Arc::new(ListArray::new_null(
            Arc::new(Field::new("item", DataType::Int32, true)),
            1,
        )) as ArrayRef],
    )
    .unwrap();
    assert!(agg.push(&list_batch).is_err());
}

#[test]
fn failing_expressions_are_input_errors() {
    // CAST('x' AS BIGINT) fails on the data, not at planning.
    let schema = kv_schema(false);
    let (mut agg, _) = build(
        &schema,
        vec![col("k")],
        vec![sum(datafusion_expr::cast(col("k"), DataType::Int64))],
        config(None, true),
    );
    let e = agg.push(&kv_batch(&schema, &["+I x 1"])).unwrap_err();
    assert!(e.is_user_error(), "{e}");
    assert!(!e.to_string().contains('\n'));
}

/// Settings a library operator cannot honour are errors naming the key, not silent no-ops.
#[test]
fn library_refuses_settings_it_cannot_honour() {
    use datafusion_expr::col;
    use tally::aggregates::count_star;
    let schema = crate::common::kv_schema(false);
    let builder = || {
        tally::GroupAggregate::builder(schema.clone())
            .group_by([col("k")])
            .aggregate([count_star()])
    };
    let e = builder()
        .option("table.optimizer.agg-phase-strategy", "TWO_PHASE")
        .unwrap()
        .build()
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("table.optimizer.agg-phase-strategy") && e.contains("build_parallel"),
        "{e}"
    );
    for parallel in [false, true] {
        let b = builder()
            .option("table.optimizer.distinct-agg.split.enabled", "true")
            .unwrap();
        let e = if parallel {
            b.build_parallel().unwrap_err().to_string()
        } else {
            b.build().unwrap_err().to_string()
        };
        assert!(
            e.contains("table.optimizer.distinct-agg.split.enabled"),
            "{e}"
        );
        assert!(e.contains("tally::sql"), "{e}");
    }
}

/// The inputs `fuzz/` found to crash arrow-ipc and parquet (panics inside those crates, huge
/// allocations from corrupt lengths): read through the file sources they give errors, and the
/// process goes on. Each input is the fuzz target's control byte, then the file.
#[test]
fn fuzzer_found_files_are_errors_not_crashes() {
    use arrow::datatypes::TimeUnit;
    use tally::source::{FileTable, Format};
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/regressions");
    let dir = std::env::temp_dir().join(format!("tally-regressions-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut seen = 0;
    for (folder, format) in [
        ("ipc_reader", Format::Arrow),
        ("parquet_reader", Format::Parquet),
    ] {
        for entry in std::fs::read_dir(root.join(folder)).unwrap() {
            let input = std::fs::read(entry.unwrap().path()).unwrap();
            let path = dir.join(format!("input-{seen}"));
            std::fs::write(&path, &input[1..]).unwrap();
            seen += 1;
            for (changelog, decoders) in [(false, 1), (true, 2)] {
                let table = FileTable {
                    name: "t".into(),
                    schema: Arc::new(Schema::new(vec![
                        Field::new("shop", DataType::Utf8, true),
                        Field::new("amount", DataType::Int64, true),
                        Field::new("ts", DataType::Timestamp(TimeUnit::Millisecond, None), true),
                    ])),
                    path: path.clone(),
                    format,
                    changelog_column: changelog.then(|| "op".to_string()),
                    time_column: None,
                    unread_columns: vec![],
                    dictionary_columns: vec![],
                };
                // Every input is a broken file: reading it must fail, cleanly.
                let result: tally::Result<Vec<_>> =
                    table.open_with(3, decoders).and_then(|r| r.collect());
                let e = match result {
                    Ok(batches) => {
                        panic!("{folder} input {seen} read as {} batches", batches.len())
                    }
                    Err(e) => e.to_string(),
                };
                assert!(e.contains("table 't'") && !e.contains('\n'), "{e}");
            }
        }
    }
    assert!(seen >= 10, "{seen} inputs");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A batch that fails to evaluate is refused whole: no mini-batch fires on its way in (by the
/// clock, or by size inside the batch), the state is as before, and every change that became
/// due is delivered by a later call. The changelog of the good rows, applied, must equal their
/// GROUP BY, for the one-phase operator and the parallel one in one and two phases.
#[test]
fn a_failing_batch_loses_no_change_that_became_due() {
    use crate::common::Materialized;
    use tally::clock::ManualClock;

    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Utf8, true),
        Field::new("v", DataType::Utf8, true),
    ]));
    let batch = |rows: &[(&str, &str)]| {
        RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.0))) as ArrayRef,
                Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.1))),
            ],
        )
        .unwrap()
    };
    let aggregates = || {
        vec![
            count_star(),
            sum(datafusion_expr::cast(col("v"), DataType::Int64)),
        ]
    };
    let cfg = |size: usize, workers: usize, two_phase: bool| {
        let mut c = config(Some(size), true);
        c.set("table.exec.mini-batch.allow-latency", "10 ms")
            .unwrap();
        c.parallelism = workers;
        if !two_phase {
            c.agg_phase_strategy = tally::config::AggPhaseStrategy::OnePhase;
        }
        c
    };
    // The good rows of each case, and what their GROUP BY must give.
    let expected = |good: &[(&str, &str)]| {
        let mut m = std::collections::BTreeMap::<&str, (i64, i64)>::new();
        for (k, v) in good {
            let e = m.entry(k).or_default();
            *e = (e.0 + 1, e.1 + v.parse::<i64>().unwrap());
        }
        m.iter()
            .map(|(k, (c, s))| format!("[{k}, {c}, {s}]"))
            .collect::<Vec<_>>()
    };

    // The clock passes the latency interval, then a bad batch comes: the pending mini-batch
    // must not fire into the error.
    let clock = ManualClock::new(0);
    let mut agg = GroupAggregate::builder(schema.clone())
        .group_by([col("k")])
        .aggregate(aggregates())
        .config(cfg(1000, 1, false))
        .clock(Arc::new(clock.clone()))
        .build()
        .unwrap();
    let mut view = Materialized::default();
    view.apply(&agg.push(&batch(&[("a", "1"), ("b", "2")])).unwrap());
    clock.set_ms(25);
    let e = agg.push(&batch(&[("a", "3"), ("c", "x")])).unwrap_err();
    assert!(e.is_user_error() && e.to_string().contains("'x'"), "{e}");
    let delivered = agg.push(&batch(&[("a", "4")])).unwrap();
    assert!(
        !delivered.is_empty(),
        "the due mini-batch fires on the next call"
    );
    view.apply(&delivered);
    view.apply(&agg.finish().unwrap());
    assert_eq!(view.rows(), expected(&[("a", "1"), ("b", "2"), ("a", "4")]));
    assert_eq!(agg.metrics().rows_in, 3);

    // The parallel operator: a batch spanning several mini-batches (2 rows per worker) whose
    // last row is bad; and the latency trigger before a bad batch.
    for (workers, two_phase) in [(1, false), (2, false), (1, true), (2, true), (3, true)] {
        let ctx = format!("{workers} workers, two-phase {two_phase}");
        let clock = ManualClock::new(0);
        let mut agg = GroupAggregate::builder(schema.clone())
            .group_by([col("k")])
            .aggregate(aggregates())
            .config(cfg(2, workers, two_phase))
            .clock(Arc::new(clock.clone()))
            .build_parallel()
            .unwrap()
            .with_min_slice_rows(1);
        let mut view = Materialized::default();
        let keys = ["a", "b", "c", "a", "a", "d"];
        let rows: Vec<(String, String)> = (0..5 * 2 * workers)
            .map(|i| (keys[i % keys.len()].to_string(), i.to_string()))
            .collect();
        let mut good: Vec<(&str, &str)> =
            rows.iter().map(|r| (r.0.as_str(), r.1.as_str())).collect();
        let mut bad = good.clone();
        bad.push(("a", "not a number"));
        view.apply(&agg.push(&batch(&good[..1])).unwrap());
        assert!(agg.push(&batch(&bad[1..])).is_err(), "{ctx}");
        assert_eq!(
            agg.metrics().unwrap().rows_in,
            1,
            "{ctx}: nothing of the bad batch"
        );
        clock.set_ms(25);
        assert!(agg.push(&batch(&[("e", "x")])).is_err(), "{ctx}");
        view.apply(&agg.push(&batch(&good[1..])).unwrap());
        view.apply(&agg.finish().unwrap());
        good.sort();
        assert_eq!(view.rows(), expected(&good), "{ctx}");
    }
}

/// The library reports settings that have no effect as the SQL planner does: a warning kept by
/// the operator (and printed once on standard error), an error under `tally.strict`.
#[test]
fn library_reports_settings_without_effect() {
    /// (parallel operator, options, the warning's start)
    type Case = (bool, Vec<(&'static str, &'static str)>, &'static str);
    let schema = kv_schema(false);
    let cases: Vec<Case> = vec![
        (
            false,
            vec![("table.exec.mini-batch.size", "500")],
            "'table.exec.mini-batch.size' = '500' has no effect: 'table.exec.mini-batch.enabled' is false",
        ),
        (
            true,
            vec![("table.exec.mini-batch.allow-latency", "5 s")],
            "'table.exec.mini-batch.allow-latency' = '5000 ms' has no effect",
        ),
        (
            false,
            vec![("table.optimizer.distinct-agg.split.bucket-num", "8")],
            "'table.optimizer.distinct-agg.split.bucket-num' = '8' has no effect",
        ),
        (
            false,
            vec![("tally.exec.local-agg.adaptive.min-rows", "10")],
            "'tally.exec.local-agg.adaptive.min-rows' has no effect: no local phase runs",
        ),
        (
            true,
            vec![
                ("table.exec.mini-batch.enabled", "true"),
                ("table.exec.mini-batch.allow-latency", "1 s"),
                ("table.exec.mini-batch.size", "10"),
                ("table.optimizer.agg-phase-strategy", "ONE_PHASE"),
                ("tally.exec.local-agg.adaptive.threshold", "0.5"),
            ],
            "'tally.exec.local-agg.adaptive.threshold' has no effect: no local phase runs",
        ),
        (
            true,
            vec![("table.optimizer.agg-phase-strategy", "TWO_PHASE")],
            "'table.optimizer.agg-phase-strategy' = 'TWO_PHASE' has no effect: two-phase aggregation needs mini-batch",
        ),
        (
            true,
            vec![("table.exec.state.ttl", "999 us")],
            "'table.exec.state.ttl' = '999 us' has no effect: it is below the state's 1 ms resolution",
        ),
    ];
    for (parallel, pairs, warning) in cases {
        let build = |strict: bool| {
            let mut b = GroupAggregate::builder(schema.clone())
                .group_by([col("k")])
                .aggregate([count_star()]);
            for (k, v) in &pairs {
                b = b.option(k, v).unwrap();
            }
            if strict {
                b = b.option("tally.strict", "true").unwrap();
            }
            if parallel {
                b.build_parallel().map(|a| a.warnings().to_vec())
            } else {
                b.build().map(|a| a.warnings().to_vec())
            }
        };
        let warnings = build(false).unwrap();
        assert!(
            warnings.len() == 1 && warnings[0].starts_with(warning),
            "{pairs:?}: {warnings:?}"
        );
        let e = build(true).unwrap_err();
        assert!(e.is_user_error(), "{e}");
        let e = e.to_string();
        assert!(e.contains(warning) && e.contains("tally.strict"), "{e}");
    }
}

/// Key groups fewer than the workers cannot be spread: a one-line error naming the option.
#[test]
fn max_parallelism_below_the_parallelism_is_an_error() {
    let schema = std::sync::Arc::new(arrow::datatypes::Schema::new(vec![
        arrow::datatypes::Field::new("k", arrow::datatypes::DataType::Utf8, true),
    ]));
    let config = tally::Config::from_pairs([
        ("table.exec.resource.default-parallelism", "4"),
        ("pipeline.max-parallelism", "3"),
    ])
    .unwrap();
    let err = tally::GroupAggregate::builder(schema)
        .group_by([datafusion_expr::col("k")])
        .aggregate([tally::aggregates::count_star()])
        .config(config)
        .build_parallel()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("pipeline.max-parallelism") && err.contains("4 workers"),
        "{err}"
    );
    assert!(!err.contains('\n'), "{err}");
    for bad in ["0", "-2", "40000", "x"] {
        let err = tally::Config::from_pairs([("pipeline.max-parallelism", bad)]).unwrap_err();
        assert!(
            err.to_string().contains("pipeline.max-parallelism"),
            "{bad}: {err}"
        );
    }
}
