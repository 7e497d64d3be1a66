//! Flink's emission rules, row by row: every row of the emission table in `docs/semantics.md`
//! ("Changelog"; its rows are numbered from 1 below) and the derived cases
//! D-1..D-6, each with mini-batch off (per-record, `GroupAggFunction`) and on
//! (`MiniBatchGroupAggFunction`).
//!
//! The derived cases (this project's numbering):
//! * D-1 only the *leading* retractions of a stateless key are dropped; later ones apply;
//! * D-2 a key whose mini-batch holds only leading retractions is skipped without abandoning
//!   the other keys of the mini-batch (FLINK-35661);
//! * D-3 the hidden record count counts every row, NULLs and filtered rows included;
//! * D-4 only output values are compared: a change of the hidden count alone emits nothing;
//! * D-5 SUM and AVG of integers keep the integer type (wrapping SUM, truncating AVG);
//! * D-6 MIN/MAX under retraction fall back to the next value, and FILTER guards retractions.

use std::sync::Arc;

use arrow::array::{Int32Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema};
use datafusion_expr::{ExprFunctionExt, col, lit};
use tally::aggregates::{avg, count, count_star, max, min, sum};

use crate::common::*;

const OFF: Option<usize> = None;
const ON: Option<usize> = Some(1000);

fn count_sum(
    mini_batch: Option<usize>,
    changelog: bool,
) -> (tally::GroupAggregate, arrow::datatypes::SchemaRef) {
    let schema = kv_schema(changelog);
    let (agg, _) = build(
        &schema,
        vec![col("k")],
        vec![count_star().alias("c"), sum(col("v")).alias("s")],
        config(mini_batch, true),
    );
    (agg, schema)
}

fn v(lines: &[&str]) -> Vec<String> {
    lines.iter().map(|s| s.to_string()).collect()
}

// Emission table row 1: no state, the mini-batch (or record) starts with retractions only → nothing.
#[test]
fn a4_row1_retractions_without_state_are_dropped() {
    for mb in [OFF, ON] {
        let (mut agg, schema) = count_sum(mb, true);
        let out = run_mini_batches(&mut agg, &schema, &[&["-D a 5", "-U a 3"]]);
        assert_eq!(out, vec![Vec::<String>::new()], "mini-batch {mb:?}");
        assert_eq!(agg.metrics().keys_in_state, 0);
    }
}

// Emission table row 2: no state, accumulates → +I with the new values.
#[test]
fn a4_row2_new_key_emits_insert() {
    for mb in [OFF, ON] {
        let (mut agg, schema) = count_sum(mb, false);
        let out = run_mini_batches(&mut agg, &schema, &[&["+I a 5"]]);
        assert_eq!(out, vec![v(&["+I[a, 1, 5]"])], "mini-batch {mb:?}");
    }
}

// Emission table row 3: no state, accumulates then retracts to 0 in one mini-batch: nothing;
// per record it is +I then -D.
#[test]
fn a4_row3_new_key_that_cancels_out() {
    let (mut agg, schema) = count_sum(OFF, true);
    let out = run_mini_batches(&mut agg, &schema, &[&["+I a 5", "-D a 5"]]);
    assert_eq!(out, vec![v(&["+I[a, 1, 5]", "-D[a, 1, 5]"])]);

    let (mut agg, schema) = count_sum(ON, true);
    let out = run_mini_batches(&mut agg, &schema, &[&["+I a 5", "-D a 5"]]);
    assert_eq!(out, vec![Vec::<String>::new()]);
    assert_eq!(agg.metrics().keys_in_state, 0);
    // The state stays empty: the key comes back as a new group with fresh accumulators.
    let out = run_mini_batches(&mut agg, &schema, &[&["+I a 2"]]);
    assert_eq!(out, vec![v(&["+I[a, 1, 2]"])]);
}

// Emission table row 4: state present, values changed → -U old, +U new (-U only when switched on).
#[test]
fn a4_row4_changed_values_emit_update_pair() {
    for mb in [OFF, ON] {
        let (mut agg, schema) = count_sum(mb, false);
        let out = run_mini_batches(&mut agg, &schema, &[&["+I a 5"], &["+I a 3"]]);
        assert_eq!(
            out,
            vec![v(&["+I[a, 1, 5]"]), v(&["-U[a, 1, 5]", "+U[a, 2, 8]"])]
        );

        let schema = kv_schema(false);
        let (mut agg, _) = build(
            &schema,
            vec![col("k")],
            vec![count_star(), sum(col("v"))],
            config(mb, false),
        );
        let out = run_mini_batches(&mut agg, &schema, &[&["+I a 5"], &["+I a 3"]]);
        assert_eq!(
            out,
            vec![v(&["+I[a, 1, 5]"]), v(&["+U[a, 2, 8]"])],
            "no -U, {mb:?}"
        );
    }
}

// Emission table row 5: state present, values equal, TTL off → nothing (state is still updated).
#[test]
fn a4_row5_unchanged_values_emit_nothing() {
    for mb in [OFF, ON] {
        for changelog in [false, true] {
            let schema = kv_schema(changelog);
            let (mut agg, _) = build(
                &schema,
                vec![col("k")],
                vec![max(col("v"))],
                config(mb, true),
            );
            let out = run_mini_batches(&mut agg, &schema, &[&["+I a 5"], &["+I a 3"], &["+I a 7"]]);
            assert_eq!(
                out,
                vec![v(&["+I[a, 5]"]), vec![], v(&["-U[a, 5]", "+U[a, 7]"])],
                "{mb:?} {changelog}"
            );
        }
    }
}

// Emission table row 7: state present, count back to 0 → -D with the previous values; state cleared.
#[test]
fn a4_row7_count_zero_deletes_with_previous_values() {
    let (mut agg, schema) = count_sum(OFF, true);
    let out = run_mini_batches(
        &mut agg,
        &schema,
        &[&["+I a 5", "+I a 3"], &["-D a 5", "-U a 3"]],
    );
    assert_eq!(
        out,
        vec![
            v(&["+I[a, 1, 5]", "-U[a, 1, 5]", "+U[a, 2, 8]"]),
            v(&["-U[a, 2, 8]", "+U[a, 1, 3]", "-D[a, 1, 3]"]),
        ]
    );
    let (mut agg, schema) = count_sum(ON, true);
    let out = run_mini_batches(
        &mut agg,
        &schema,
        &[&["+I a 5", "+I a 3"], &["-D a 5", "-U a 3"], &["+I a 2"]],
    );
    assert_eq!(
        out,
        vec![
            v(&["+I[a, 2, 8]"]),
            v(&["-D[a, 2, 8]"]),
            v(&["+I[a, 1, 2]"])
        ]
    );
    assert_eq!(agg.metrics().keys_in_state, 1);
}

// Emission table row 8: insert-only input has no record count; a group is never deleted, even one
// whose aggregates are all "empty".
#[test]
fn a4_row8_insert_only_groups_are_never_deleted() {
    for mb in [OFF, ON] {
        let schema = kv_schema(false);
        let (mut agg, _) = build(
            &schema,
            vec![col("k")],
            vec![count(col("v")), sum(col("v"))],
            config(mb, true),
        );
        let out = run_mini_batches(&mut agg, &schema, &[&["+I a null"], &["+I a null"]]);
        assert_eq!(out, vec![v(&["+I[a, 0, null]"]), vec![]]);
        assert_eq!(agg.metrics().keys_in_state, 1);
    }
}

// D-1: leading retractions are dropped, later retractions of the same key apply.
#[test]
fn d1_only_leading_retractions_are_dropped() {
    let rows: &[&str] = &["-D a 9", "+I a 5", "-D a 5", "+I a 7"];
    let (mut agg, schema) = count_sum(ON, true);
    assert_eq!(
        run_mini_batches(&mut agg, &schema, &[rows]),
        vec![v(&["+I[a, 1, 7]"])]
    );
    let (mut agg, schema) = count_sum(OFF, true);
    assert_eq!(
        run_mini_batches(&mut agg, &schema, &[rows]),
        vec![v(&["+I[a, 1, 5]", "-D[a, 1, 5]", "+I[a, 1, 7]"])]
    );
    // A key with state keeps its retractions even when they come first in the mini-batch.
    let (mut agg, schema) = count_sum(ON, true);
    let out = run_mini_batches(&mut agg, &schema, &[&["+I a 9"], &["-D a 9", "+I a 4"]]);
    assert_eq!(
        out,
        vec![v(&["+I[a, 1, 9]"]), v(&["-U[a, 1, 9]", "+U[a, 1, 4]"])]
    );
}

// D-2: a key whose mini-batch holds only leading retractions is skipped; the other keys still emit
// (FLINK-35661: `continue`, not `return`).
#[test]
fn d2_skipped_key_does_not_abandon_the_bundle() {
    let (mut agg, schema) = count_sum(ON, true);
    let out = run_mini_batches(
        &mut agg,
        &schema,
        &[&["-D a 1", "+I b 2", "-U c 3", "+I d 4"]],
    );
    assert_eq!(out, vec![v(&["+I[b, 1, 2]", "+I[d, 1, 4]"])]);
}

// D-3: the record count includes NULL values and rows that fail every FILTER.
#[test]
fn d3_record_count_ignores_nulls_and_filters() {
    for mb in [OFF, ON] {
        let schema = kv_schema(true);
        let (mut agg, _) = build(
            &schema,
            vec![col("k")],
            vec![
                count(col("v")).alias("c"),
                sum(col("v"))
                    .filter(col("v").gt(lit(10i64)))
                    .build()
                    .unwrap(),
            ],
            config(mb, true),
        );
        let out = run_mini_batches(
            &mut agg,
            &schema,
            &[&["+I a null", "+I a 5"], &["-D a 5"], &["-D a null"]],
        );
        let first = if mb.is_none() {
            v(&["+I[a, 0, null]", "-U[a, 0, null]", "+U[a, 1, null]"])
        } else {
            v(&["+I[a, 1, null]"])
        };
        assert_eq!(
            out,
            vec![
                first,
                v(&["-U[a, 1, null]", "+U[a, 0, null]"]),
                v(&["-D[a, 0, null]"])
            ],
            "{mb:?}"
        );
    }
}

// D-4: equality is on output values; a change of the hidden count alone emits nothing.
#[test]
fn d4_hidden_count_changes_are_not_emitted() {
    for mb in [OFF, ON] {
        let schema = kv_schema(true);
        let (mut agg, _) = build(
            &schema,
            vec![col("k")],
            vec![sum(col("v"))],
            config(mb, true),
        );
        let out = run_mini_batches(
            &mut agg,
            &schema,
            &[&["+I a 5"], &["+I a null"], &["-D a null"], &["-D a 5"]],
        );
        assert_eq!(
            out,
            vec![v(&["+I[a, 5]"]), vec![], vec![], v(&["-D[a, 5]"])],
            "{mb:?}"
        );
    }
}

// D-5: SUM(INT) is an INT that wraps; AVG of integers is that type, truncated toward zero
// (Flink: 29/8 → 3).
#[test]
fn d5_integer_sum_wraps_and_avg_truncates() {
    let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int32, true)]));
    for mb in [OFF, ON] {
        let (mut agg, _) = build(
            &schema,
            vec![],
            vec![sum(col("x")).alias("s"), avg(col("x")).alias("a")],
            config(mb, true),
        );
        let batch = |xs: Vec<i32>| {
            RecordBatch::try_new(schema.clone(), vec![Arc::new(Int32Array::from(xs))]).unwrap()
        };
        let mut out = agg.push(&batch(vec![i32::MAX, 1])).unwrap();
        out.extend(agg.finish().unwrap());
        let last = format_changes(&out).pop().unwrap();
        // SUM wraps to i32::MIN; the AVG sum is a BIGINT, so the mean is (2^31) / 2.
        assert_eq!(
            &last[2..],
            format!("[{}, {}]", i32::MIN, 1i64 << 30),
            "{mb:?}"
        );
        assert_eq!(agg.output_schema().field(0).data_type(), &DataType::Int32);
        assert_eq!(agg.output_schema().field(1).data_type(), &DataType::Int32);

        let (mut agg, _) = build(&schema, vec![], vec![avg(col("x"))], config(mb, true));
        let mut out = agg.push(&batch(vec![1, 2, 3, 4, 5, 6, 7, 1])).unwrap();
        out.extend(agg.finish().unwrap());
        assert_eq!(&format_changes(&out).pop().unwrap()[2..], "[3]");
        let (mut agg, _) = build(&schema, vec![], vec![avg(col("x"))], config(mb, true));
        let mut out = agg.push(&batch(vec![-7, 0])).unwrap();
        out.extend(agg.finish().unwrap());
        assert_eq!(&format_changes(&out).pop().unwrap()[2..], "[-3]");
    }
}

// D-6: MIN/MAX under retraction fall back to the next value; a FILTER guards the retraction.
#[test]
fn d6_min_max_with_retraction_and_filter() {
    for mb in [OFF, ON] {
        let schema = kv_schema(true);
        let (mut agg, _) = build(
            &schema,
            vec![col("k")],
            vec![
                max(col("v")),
                min(col("v"))
                    .filter(col("v").gt(lit(2i64)))
                    .build()
                    .unwrap(),
            ],
            config(mb, true),
        );
        let out = run_mini_batches(
            &mut agg,
            &schema,
            &[
                &["+I a 1", "+I a 9", "+I a 5"],
                &["-D a 9"],
                &["-D a 5"],
                &["-U a 1"],
            ],
        );
        let first = if mb.is_none() {
            v(&[
                "+I[a, 1, null]",
                "-U[a, 1, null]",
                "+U[a, 9, 9]",
                "-U[a, 9, 9]",
                "+U[a, 9, 5]",
            ])
        } else {
            v(&["+I[a, 9, 5]"])
        };
        assert_eq!(
            out,
            vec![
                first,
                v(&["-U[a, 9, 5]", "+U[a, 5, 5]"]),
                v(&["-U[a, 5, 5]", "+U[a, 1, null]"]),
                v(&["-D[a, 1, null]"]),
            ],
            "{mb:?}"
        );
    }
}

// Mini-batch folds every change of a key into one transition; keys come out in order of first
// appearance in the mini-batch.
#[test]
fn mini_batch_folds_changes_per_key() {
    let (mut agg, schema) = count_sum(ON, false);
    let out = run_mini_batches(
        &mut agg,
        &schema,
        &[
            &["+I b 1", "+I a 1"],
            &["+I a 2", "+I c 7", "+I a 3", "+I b 0"],
        ],
    );
    assert_eq!(
        out,
        vec![
            v(&["+I[b, 1, 1]", "+I[a, 1, 1]"]),
            v(&[
                "-U[a, 1, 1]",
                "+U[a, 3, 6]",
                "+I[c, 1, 7]",
                "-U[b, 1, 1]",
                "+U[b, 2, 1]"
            ]),
        ]
    );
}

// The size trigger fires inside a batch, after exactly `size` input rows.
#[test]
fn size_trigger_cuts_batches() {
    let (mut agg, schema) = count_sum(Some(2), false);
    let out = run(
        &mut agg,
        &schema,
        &[&["+I a 1", "+I a 2", "+I a 3"], &["+I a 4"]],
    );
    assert_eq!(
        out,
        vec![
            v(&["+I[a, 2, 3]"]),
            v(&["-U[a, 2, 3]", "+U[a, 4, 10]"]),
            vec![],
        ]
    );
    assert_eq!(agg.metrics().mini_batches, 2);
}

// The latency trigger fires when the clock crosses an interval boundary, on the next push or poll.
#[test]
fn latency_trigger_follows_the_injected_clock() {
    let schema = kv_schema(false);
    let (mut agg, clock) = build(
        &schema,
        vec![col("k")],
        vec![count_star()],
        config(ON, true),
    );
    assert!(
        agg.push(&kv_batch(&schema, &["+I a 1"]))
            .unwrap()
            .is_empty()
    );
    clock.advance_ms(999);
    assert!(
        agg.push(&kv_batch(&schema, &["+I a 2"]))
            .unwrap()
            .is_empty()
    );
    assert!(agg.poll().unwrap().is_empty());
    clock.advance_ms(1);
    assert_eq!(format_changes(&agg.poll().unwrap()), v(&["+I[a, 2]"]));
    // The next batch is in the new interval: it waits for the next boundary.
    assert!(
        agg.push(&kv_batch(&schema, &["+I a 3"]))
            .unwrap()
            .is_empty()
    );
    clock.advance_ms(1000);
    let out = agg.push(&kv_batch(&schema, &["+I b 1"])).unwrap();
    assert_eq!(format_changes(&out), v(&["-U[a, 2]", "+U[a, 3]"]));
    assert_eq!(format_changes(&agg.finish().unwrap()), v(&["+I[b, 1]"]));
}

// A global aggregate (no GROUP BY): nothing before the first row, -D when the last row goes.
#[test]
fn global_aggregate_without_keys() {
    for mb in [OFF, ON] {
        let schema = kv_schema(true);
        let (mut agg, _) = build(
            &schema,
            vec![],
            vec![count_star(), sum(col("v"))],
            config(mb, true),
        );
        assert!(agg.finish().unwrap().is_empty());
        let out = run_mini_batches(&mut agg, &schema, &[&[], &["+I a 1"], &["-D a 1"]]);
        assert_eq!(out, vec![vec![], v(&["+I[1, 1]"]), v(&["-D[1, 1]"])]);
    }
}

// NULL is a key value of its own.
#[test]
fn null_is_a_key() {
    for mb in [OFF, ON] {
        let (mut agg, schema) = count_sum(mb, false);
        let out = run_mini_batches(&mut agg, &schema, &[&["+I null 1", "+I a 2", "+I null 3"]]);
        let expected = if mb.is_none() {
            v(&[
                "+I[null, 1, 1]",
                "+I[a, 1, 2]",
                "-U[null, 1, 1]",
                "+U[null, 2, 4]",
            ])
        } else {
            v(&["+I[null, 2, 4]", "+I[a, 1, 2]"])
        };
        assert_eq!(out, vec![expected]);
    }
}

fn with_ttl(mb: Option<usize>, update_before: bool, ttl: &str) -> tally::Config {
    let mut c = config(mb, update_before);
    c.set("table.exec.state.ttl", ttl).unwrap();
    c.validate().unwrap();
    c
}

// Emission table row 6: state present, values equal, TTL on → -U/+U of the same values (FLINK-33936).
#[test]
fn a4_row6_unchanged_values_with_ttl_still_emit() {
    for mb in [OFF, ON] {
        let schema = kv_schema(false);
        let (mut agg, _) = build(
            &schema,
            vec![col("k")],
            vec![max(col("v"))],
            with_ttl(mb, true, "1 h"),
        );
        let out = run_mini_batches(&mut agg, &schema, &[&["+I a 5"], &["+I a 3"]]);
        assert_eq!(
            out,
            vec![v(&["+I[a, 5]"]), v(&["-U[a, 5]", "+U[a, 5]"])],
            "{mb:?}"
        );
        let (mut agg, _) = build(
            &schema,
            vec![col("k")],
            vec![max(col("v"))],
            with_ttl(mb, false, "1 h"),
        );
        let out = run_mini_batches(&mut agg, &schema, &[&["+I a 5"], &["+I a 3"]]);
        assert_eq!(out, vec![v(&["+I[a, 5]"]), v(&["+U[a, 5]"])], "{mb:?}");
    }
}

// After expiry (Flink's harness cases C-17/C-19): a retraction for the expired key is dropped and
// the next accumulation starts a new group with +I (no -U of the stale value).
#[test]
fn expired_state_restarts_the_group() {
    for mb in [OFF, ON] {
        let schema = kv_schema(true);
        let (mut agg, clock) = build(
            &schema,
            vec![col("k")],
            vec![count_star(), sum(col("v"))],
            with_ttl(mb, true, "100 ms"),
        );
        let out = run_mini_batches(&mut agg, &schema, &[&["+I a 5", "+I b 1"]]);
        assert_eq!(out, vec![v(&["+I[a, 1, 5]", "+I[b, 1, 1]"])]);
        clock.advance_ms(60);
        // Writing b refreshes its TTL; a is not written.
        let out = run_mini_batches(&mut agg, &schema, &[&["+I b 1"]]);
        assert_eq!(out, vec![v(&["-U[b, 1, 1]", "+U[b, 2, 2]"])]);
        clock.advance_ms(40);
        assert_eq!(agg.metrics().keys_in_state, 2);
        let out = run_mini_batches(&mut agg, &schema, &[&["-D a 5"], &["+I a 2", "+I b 3"]]);
        assert_eq!(
            out,
            vec![vec![], v(&["+I[a, 1, 2]", "-U[b, 2, 2]", "+U[b, 3, 5]"])],
            "{mb:?}"
        );
        // The late retraction of the expired key was dropped, and counted.
        assert_eq!(agg.metrics().dropped_retractions, 1, "{mb:?}");
        // An idle key is swept without output once its TTL has passed.
        clock.advance_ms(100);
        assert!(agg.poll().unwrap().is_empty());
        assert_eq!(agg.metrics().keys_in_state, 0, "{mb:?}");
    }
}

/// A snapshot taken without a TTL restored into an operator with one: the restored groups count
/// as written at the first clock reading after the restore, so they neither expire at once nor
/// live forever.
#[test]
fn groups_restored_without_ttl_timestamps_expire_from_the_restore() {
    for mb in [OFF, ON] {
        let schema = kv_schema(true);
        let (mut before, _) = build(
            &schema,
            vec![col("k")],
            vec![sum(col("v"))],
            config(mb, true),
        );
        run_mini_batches(&mut before, &schema, &[&["+I a 5", "+I b 1"]]);
        let snap = before.snapshot().unwrap();
        let (mut after, clock) = build(
            &schema,
            vec![col("k")],
            vec![sum(col("v"))],
            with_ttl(mb, true, "100 ms"),
        );
        clock.set_ms(1_000_000);
        after.restore_snapshot(&snap).unwrap();
        // a is written at 1_000_000: an update, not a restart.
        let out = run_mini_batches(&mut after, &schema, &[&["+I a 2"]]);
        assert_eq!(out, vec![v(&["-U[a, 5]", "+U[a, 7]"])], "{mb:?}");
        // b, never written since the restore, expires a TTL after it; a a TTL after its write.
        clock.advance_ms(100);
        assert!(after.poll().unwrap().is_empty());
        assert_eq!(after.metrics().keys_in_state, 0, "{mb:?}");
        let out = run_mini_batches(&mut after, &schema, &[&["-D b 1", "+I b 4"]]);
        assert_eq!(out, vec![v(&["+I[b, 4]"])], "{mb:?}");
    }
}
