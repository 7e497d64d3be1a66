//! Compaction between two mini-batches of one pushed batch: the batch's keys are interned
//! before its first mini-batch fires, so its later rows must keep their groups when that
//! firing leaves most groups dead (a compaction renumbers the groups it keeps).

use std::sync::Arc;

use arrow::array::RecordBatch;
use datafusion_expr::col;
use tally::aggregates::{count_star, sum};
use tally::clock::ManualClock;
use tally::operator::LocalGroupAggregate;
use tally::plan::AggregatePlan;

use crate::common::{Materialized, build, config, kv_batch, kv_schema};

/// Keys that die in the first mini-batch of the second push: more than the compaction's
/// minimum of dead groups.
const DYING: usize = 3000;

/// `+I`/`-D` rows for `dying` keys `k0…` with value 1, then `+I` rows for `new` keys `z0…`.
fn rows(op: &str, dying: usize, new: usize) -> Vec<String> {
    let mut rows: Vec<String> = (0..dying).map(|i| format!("{op} k{i} 1")).collect();
    rows.extend((0..new).map(|i| format!("+I z{i} {i}")));
    rows
}

/// The final table the changelog of these pushes materializes: the new keys alone.
fn expected(new: usize) -> Vec<String> {
    let mut want: Vec<String> = (0..new).map(|i| format!("[z{i}, 1, {i}]")).collect();
    want.sort();
    want
}

/// A standalone aggregate over a changelog, mini-batches of `DYING` rows: the first push
/// fills one, the second retracts every key of it and then brings new keys, which land in the
/// next mini-batch.
#[test]
fn rows_after_a_compaction_inside_their_batch_keep_their_groups() {
    let schema = kv_schema(true);
    let (mut agg, _clock) = build(
        &schema,
        vec![col("k")],
        vec![count_star(), sum(col("v"))],
        config(Some(DYING), true),
    );
    let mut view = Materialized::default();
    let first = rows("+I", DYING, 0);
    let first: Vec<&str> = first.iter().map(String::as_str).collect();
    view.apply(&agg.push(&kv_batch(&schema, &first)).unwrap());
    let second = rows("-D", DYING, 10);
    let second: Vec<&str> = second.iter().map(String::as_str).collect();
    view.apply(&agg.push(&kv_batch(&schema, &second)).unwrap());
    view.apply(&agg.finish().unwrap());
    assert_eq!(view.rows(), expected(10));
    assert!(
        agg.metrics().compactions > 0,
        "the dead groups were compacted"
    );
}

/// The same through a global phase: accumulator rows whose first mini-batch empties every key
/// of the one before, and whose later rows bring new keys.
#[test]
fn accumulator_rows_after_a_compaction_inside_their_batch_keep_their_groups() {
    let schema = kv_schema(true);
    let plan = Arc::new(
        AggregatePlan::try_new(
            Arc::clone(&schema),
            &[col("k")],
            &[count_star(), sum(col("v"))],
            None,
        )
        .unwrap(),
    );
    let mut local = LocalGroupAggregate::try_new(Arc::clone(&plan)).unwrap();
    let mut global = tally::GroupAggregate::try_new_global(
        Arc::clone(&plan),
        config(Some(DYING), true),
        Arc::new(ManualClock::new(0)),
    )
    .unwrap();
    let mut view = Materialized::default();
    let mut through_global = |rows: Vec<String>, view: &mut Materialized| {
        let rows: Vec<&str> = rows.iter().map(String::as_str).collect();
        local.push(&kv_batch(&schema, &rows)).unwrap();
        let acc: RecordBatch = local.flush().unwrap().unwrap();
        view.apply(&global.push_accumulators(&acc).unwrap());
    };
    through_global(rows("+I", DYING, 0), &mut view);
    through_global(rows("-D", DYING, 10), &mut view);
    view.apply(&global.finish().unwrap());
    assert_eq!(view.rows(), expected(10));
    assert!(
        global.metrics().compactions > 0,
        "the dead groups were compacted"
    );
}
