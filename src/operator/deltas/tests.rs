//! Delta rows' tests: what `fits` accepts, and delta rows folded against the changelog they
//! stand for.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{Int8Array, Int64Array, RecordBatch, StringArray};
use arrow::compute::concat_batches;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::util::display::array_value_to_string;
use datafusion_expr::{Expr, ExprFunctionExt, col, lit};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::fits;
use crate::aggregates::{count, count_star, max, min, sum0};
use crate::changelog::ChangeBatch;
use crate::clock::ManualClock;
use crate::operator::{GroupAggregate, IncrementalAggregate, ParallelAggregate};

/// The PARTIAL's input: a changelog of (k, b, u), b the bucket.
fn input_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("op", DataType::Int8, false),
        Field::new("k", DataType::Utf8, true),
        Field::new("b", DataType::Int64, false),
        Field::new("u", DataType::Int64, false),
    ]))
}

/// A PARTIAL as split-distinct makes one: grouped by a key and a bucket, counts only.
fn partial(input: SchemaRef, extra: Option<Expr>) -> GroupAggregate {
    let mut calls = vec![
        count(col("u")).distinct().build().unwrap().alias("d"),
        count(col("u"))
            .distinct()
            .filter(col("u").gt(lit(4i64)))
            .build()
            .unwrap()
            .alias("dh"),
        count_star().alias("n"),
    ];
    calls.extend(extra);
    GroupAggregate::builder(input)
        .changelog_column("op")
        .group_by([col("k"), col("b")])
        .aggregate(calls)
        .option("table.exec.mini-batch.enabled", "true")
        .unwrap()
        .option("table.exec.mini-batch.size", "7")
        .unwrap()
        .option("table.exec.mini-batch.allow-latency", "1 h")
        .unwrap()
        .clock(Arc::new(ManualClock::new(0)))
        .build()
        .unwrap()
}

/// The FINAL over the PARTIAL's changes: `calls` per `keys` (split-distinct's: the counts
/// added up per `k`).
fn final_agg(
    partial: &GroupAggregate,
    keys: Vec<Expr>,
    calls: Vec<Expr>,
    monotonic: bool,
) -> ParallelAggregate {
    let mut fields: Vec<Arc<Field>> = vec![Arc::new(Field::new("op", DataType::Int8, false))];
    fields.extend(partial.output_schema().fields().iter().cloned());
    let builder = GroupAggregate::builder(Arc::new(Schema::new(fields)));
    let builder = if monotonic {
        builder.monotonic_min_max()
    } else {
        builder
    };
    builder
        .changelog_column("op")
        .group_by(keys)
        .aggregate(calls)
        .option("table.exec.mini-batch.enabled", "true")
        .unwrap()
        .option("table.exec.mini-batch.size", "5")
        .unwrap()
        .option("table.exec.mini-batch.allow-latency", "1 h")
        .unwrap()
        .option("table.optimizer.agg-phase-strategy", "TWO_PHASE")
        .unwrap()
        .build_parallel()
        .unwrap()
}

fn sums() -> Vec<Expr> {
    vec![
        sum0(col("d")).alias("d"),
        sum0(col("dh")).alias("dh"),
        sum0(col("n")).alias("n"),
    ]
}

/// A changelog of (k, b, u): inserts, and retractions of live rows (some of them updates).
fn stream(rng: &mut StdRng, input: &SchemaRef) -> Vec<ChangeBatch> {
    let mut live: Vec<(Option<String>, i64)> = vec![];
    let mut batches = vec![];
    for _ in 0..40 {
        let (mut op, mut k, mut b, mut u) = (vec![], vec![], vec![], vec![]);
        for _ in 0..rng.random_range(1..30) {
            let retract = !live.is_empty() && rng.random_bool(0.3);
            let (key, user) = if retract {
                live.swap_remove(rng.random_range(0..live.len()))
            } else {
                let key = (!rng.random_bool(0.05))
                    .then(|| format!("k{}", rng.random_range(0..3).min(rng.random_range(0..3))));
                let row = (key, rng.random_range(0..12i64));
                live.push(row.clone());
                row
            };
            op.push(if retract { 3i8 } else { 0 });
            b.push(user % 4);
            k.push(key);
            u.push(user);
        }
        let data = RecordBatch::try_new(
            Arc::clone(input),
            vec![
                Arc::new(Int8Array::from(op)),
                Arc::new(StringArray::from(k)),
                Arc::new(Int64Array::from(b)),
                Arc::new(Int64Array::from(u)),
            ],
        )
        .unwrap();
        batches.push(data);
    }
    batches
        .into_iter()
        .map(|b| {
            let op = b.column(0).clone();
            ChangeBatch::try_new(Some(op), b.project(&[1, 2, 3]).unwrap()).unwrap()
        })
        .collect()
}

/// The FINAL's changelog from the PARTIAL's firings folded as they are or as delta rows.
fn final_changes(input: &SchemaRef, seed: u64, deltas: bool) -> RecordBatch {
    let p = partial(Arc::clone(input), None);
    let fin = final_agg(&p, vec![col("k")], sums(), false);
    let mut rng = StdRng::seed_from_u64(seed);
    let batches = stream(&mut rng, input);
    run_final(
        p,
        &fin,
        batches,
        (deltas, deltas),
        &["op", "k", "d", "dh", "n"],
    )
}

/// The changelog of `fin` over the firings of `p` on `batches`, folded as they are or as
/// delta rows, with its row kinds as a column and the columns named `names`.
fn run_final(
    mut p: GroupAggregate,
    fin: &ParallelAggregate,
    batches: Vec<ChangeBatch>,
    (deltas, rows_as_keys): (bool, bool),
    names: &[&str],
) -> RecordBatch {
    assert!(fits(p.plan(), fin.plan()));
    p.set_emit_deltas(deltas);
    let mut inc = IncrementalAggregate::try_new(
        fin.shared_plan(),
        fin.config().clone(),
        Arc::new(ManualClock::new(0)),
    )
    .unwrap();
    // Only where the PARTIAL's keys are the FINAL's.
    let same_keys = p.plan().key_types.len() == fin.plan().key_types.len();
    assert_eq!(
        inc.fold_rows_as_keys(p.plan(), rows_as_keys),
        rows_as_keys && same_keys
    );
    let mut fold = inc.fold_factory()().unwrap();
    let runtime = crate::runtime::Runtime::new(1).unwrap();
    let mut out = vec![];
    for batch in batches {
        let mut firings = p.push_changes(&batch).unwrap();
        firings.extend(p.finish().unwrap());
        for firing in firings {
            let is_delta = firing.data.num_columns() == p.output_schema().fields().len() + 1;
            assert_eq!(is_delta, deltas, "the PARTIAL fires what it was told");
            if let Some(d) = fold.fold(&firing).unwrap() {
                out.extend(inc.push(&[ChangeBatch::inserts(d)], &runtime).unwrap());
            }
        }
    }
    out.extend(inc.finish(&runtime).unwrap());
    let with_op: Vec<RecordBatch> = out
        .iter()
        .map(|c| {
            let op =
                c.op.clone()
                    .unwrap_or_else(|| Arc::new(Int8Array::from(vec![0i8; c.num_rows()])));
            let cols = std::iter::once(op).chain(c.data.columns().iter().cloned());
            RecordBatch::try_from_iter_with_nullable(
                names.iter().zip(cols).map(|(n, c)| (*n, c, true)),
            )
            .unwrap()
        })
        .collect();
    assert!(!with_op.is_empty(), "no changes");
    concat_batches(&with_op[0].schema(), &with_op).unwrap()
}

/// Insert-only (k, b, u, s) batches, b the bucket of u, s a string that is NULL in some
/// rows.
fn inserts(rng: &mut StdRng) -> (SchemaRef, Vec<ChangeBatch>) {
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Utf8, true),
        Field::new("b", DataType::Int64, false),
        Field::new("u", DataType::Int64, false),
        Field::new("s", DataType::Utf8, true),
    ]));
    let batches = (0..40)
        .map(|_| {
            let n = rng.random_range(1..30);
            let k: Vec<Option<String>> = (0..n)
                .map(|_| (!rng.random_bool(0.05)).then(|| format!("k{}", rng.random_range(0..3))))
                .collect();
            let u: Vec<i64> = (0..n).map(|_| rng.random_range(0..40i64)).collect();
            let b: Vec<i64> = u.iter().map(|u| u % 4).collect();
            let s: Vec<Option<String>> = (0..n)
                .map(|_| {
                    rng.random_bool(0.7)
                        .then(|| format!("s{:02}", rng.random_range(0..60)))
                })
                .collect();
            let data = RecordBatch::try_new(
                Arc::clone(&schema),
                vec![
                    Arc::new(StringArray::from(k)),
                    Arc::new(Int64Array::from(b)),
                    Arc::new(Int64Array::from(u)),
                    Arc::new(StringArray::from(s)),
                ],
            )
            .unwrap();
            ChangeBatch::inserts(data)
        })
        .collect();
    (schema, batches)
}

/// Over insert-only input the PARTIAL's MIN/MAX travel as their new values: a FINAL that
/// takes their extremes without retracting gets from delta rows the changelog it gets
/// from the PARTIAL's changelog, NULL extremes included.
#[test]
fn extremes_take_delta_rows_over_insert_only_input() {
    let mut null_extremes = 0;
    for seed in 0..8 {
        let run = |deltas: bool| {
            let (p, fin, batches) = extremes(seed, vec![col("k"), col("b")]);
            run_final(p, &fin, batches, (deltas, deltas), EXTREMES)
        };
        let (changelog, deltas) = (run(false), run(true));
        assert!(changelog.num_rows() > 10, "seed {seed}");
        null_extremes += changelog.column(5).null_count();
        assert_eq!(deltas, changelog, "seed {seed}");
    }
    assert!(null_extremes > 0, "no seed gave a NULL MIN");
}

/// The columns of [`extremes`]' FINAL changelog.
const EXTREMES: &[&str] = &["op", "k", "d", "n", "hi", "lo"];

/// An insert-only PARTIAL grouped by `keys` with counts and extremes, its FINAL by `k`
/// (MIN/MAX without retraction), and seed `seed`'s input.
fn extremes(seed: u64, keys: Vec<Expr>) -> (GroupAggregate, ParallelAggregate, Vec<ChangeBatch>) {
    let mut rng = StdRng::seed_from_u64(seed);
    let (schema, batches) = inserts(&mut rng);
    let p = GroupAggregate::builder(schema)
        .group_by(keys)
        .aggregate([
            count(col("u")).distinct().build().unwrap().alias("d"),
            count_star().alias("n"),
            max(col("u")).alias("hi"),
            min(col("s")).alias("lo"),
        ])
        .option("table.exec.mini-batch.enabled", "true")
        .unwrap()
        .option("table.exec.mini-batch.size", "7")
        .unwrap()
        .option("table.exec.mini-batch.allow-latency", "1 h")
        .unwrap()
        .clock(Arc::new(ManualClock::new(0)))
        .build()
        .unwrap();
    let calls = vec![
        sum0(col("d")).alias("d"),
        sum0(col("n")).alias("n"),
        max(col("hi")).alias("hi"),
        min(col("lo")).alias("lo"),
    ];
    // Retracting extremes take no delta rows.
    assert!(!fits(
        p.plan(),
        final_agg(&p, vec![col("k")], calls.clone(), false).plan()
    ));
    let fin = final_agg(&p, vec![col("k")], calls, true);
    (p, fin, batches)
}

/// The table a changelog batch (its first column the row kind, its second the key)
/// leaves, each row shown as text.
fn final_rows(changelog: &RecordBatch) -> BTreeMap<String, String> {
    let show = |c: usize, r: usize| array_value_to_string(changelog.column(c), r).unwrap();
    let mut table = BTreeMap::new();
    for r in 0..changelog.num_rows() {
        let row: Vec<String> = (1..changelog.num_columns()).map(|c| show(c, r)).collect();
        match show(0, r).as_str() {
            "0" | "2" => table.insert(show(1, r), row.join(",")),
            _ => table.remove(&show(1, r)),
        };
    }
    table
}

/// Where the PARTIAL holds one group per FINAL key (grouped by the FINAL's keys alone, as a
/// worker that merges its buckets), each firing's delta rows are taken as the fold's
/// accumulator rows, without a key table: the FINAL ends with the table a key table
/// gives. Its changelog may be cut elsewhere: a small key table kept across firings
/// flushes its keys in the order they first came, the rows as keys in the firing's order.
/// (Where the PARTIAL has other keys, the fold keeps its key table: `run_final` checks it.)
#[test]
fn delta_rows_of_one_group_per_key_fold_without_a_key_table() {
    for seed in 0..8 {
        let run = |rows_as_keys: bool| {
            let (p, fin, batches) = extremes(seed, vec![col("k")]);
            run_final(p, &fin, batches, (true, rows_as_keys), EXTREMES)
        };
        let (table, as_rows) = (run(false), run(true));
        assert!(table.num_rows() > 10, "seed {seed}");
        assert_eq!(final_rows(&as_rows), final_rows(&table), "seed {seed}");
    }
}

#[test]
fn delta_rows_give_the_final_the_changelog_it_would_get() {
    let input = input_schema();
    for seed in 0..8 {
        let changelog = final_changes(&input, seed, false);
        let deltas = final_changes(&input, seed, true);
        assert!(changelog.num_rows() > 10, "seed {seed}");
        assert_eq!(deltas, changelog, "seed {seed}");
    }
}

#[test]
fn only_sums_of_counts_take_delta_rows() {
    let input = input_schema();
    let p = partial(Arc::clone(&input), None);
    assert!(fits(
        p.plan(),
        final_agg(&p, vec![col("k")], sums(), false).plan()
    ));
    // A MAX in the FINAL, a FILTER, or an expression over a count: not a sum of counts.
    let not = [
        max(col("d")).alias("m"),
        sum0(col("d"))
            .filter(col("n").gt(lit(1i64)))
            .build()
            .unwrap()
            .alias("f"),
        sum0(col("d") * lit(2i64)).alias("x"),
        sum0(col("b")).alias("b"),
    ];
    for call in not {
        let shown = call.to_string();
        assert!(
            !fits(
                p.plan(),
                final_agg(&p, vec![col("k")], vec![call], false).plan()
            ),
            "{shown}"
        );
    }
    // A FINAL keyed by a count.
    let by_count = final_agg(&p, vec![col("n")], sums(), false);
    assert!(!fits(p.plan(), by_count.plan()));
    // A PARTIAL result that is not a count.
    let p = partial(input, Some(max(col("u")).alias("m")));
    assert!(!fits(
        p.plan(),
        final_agg(&p, vec![col("k")], sums(), false).plan()
    ));
}
