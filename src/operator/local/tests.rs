//! The local phase's flushes: the rows each key folded, the key table kept across a flush,
//! and a flush routed to the workers.

use super::flush::Flushed;
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
            let got = rows_of(&Flushed {
                batch: part.batch(),
                hashes: part.hashes().to_vec(),
                hashed_keys: part.shared().hashed_keys,
                rows: part.rows().to_vec(),
                local_ids: None,
            });
            assert_eq!(got, want, "worker {w}");
            // Every part is a range of one flush, shared by the workers.
            assert!(std::ptr::eq(part.shared(), routed.parts[0].shared()));
            seen += part.len();
        }
        assert_eq!(seen, whole.batch.num_rows());
        // The hottest key's share of the rows folded.
        let counts = whole.batch.column(whole.batch.num_columns() - 1);
        let counts = counts.as_primitive::<Int64Type>();
        let top = counts.values().iter().copied().max().unwrap();
        assert_eq!(routed.hot_share, top as f64 / 500.0);
    }
}

/// A flush of a key table that outlives it names each row's key by its id in the table, the
/// same ids flush after flush; a global phase that merges two local phases whose equal ids name
/// different keys keeps the keys apart (it knows ids per table), and merges as it would by the
/// keys themselves.
#[test]
fn retained_keys_go_by_their_ids_per_table() {
    use crate::GroupAggregate;
    use crate::config::Config;
    let (schema, plan) = plan_by_k(&[
        crate::aggregates::count_star(),
        crate::aggregates::sum(col("v")),
    ]);
    let batch = |keys: Vec<i64>, values: Vec<i64>| {
        let cols: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from(keys)),
            Arc::new(Int64Array::from(values)),
        ];
        RecordBatch::try_new(Arc::clone(&schema), cols).unwrap()
    };
    let mut config = Config::default();
    config.set("table.exec.mini-batch.enabled", "true").unwrap();
    config.set("table.exec.mini-batch.size", "1000").unwrap();
    config
        .set("table.exec.mini-batch.allow-latency", "1 h")
        .unwrap();
    let clock = Arc::new(crate::clock::ManualClock::new(0));
    let mut global = GroupAggregate::try_new_global(Arc::clone(&plan), config, clock)
        .unwrap()
        .into_worker();
    let mut a = LocalGroupAggregate::try_new(Arc::clone(&plan)).unwrap();
    let mut b = LocalGroupAggregate::try_new(Arc::clone(&plan)).unwrap();
    let mut tables = None;
    for _ in 0..3 {
        // Key 1 is id 0 in `a`'s table and id 1 in `b`'s; key 2 the other way round.
        a.push(&batch(vec![1, 2, 1], vec![1, 10, 1])).unwrap();
        b.push(&batch(vec![2, 1], vec![100, 1000])).unwrap();
        let (fa, fb) = (
            a.flush_parts().unwrap().unwrap(),
            b.flush_parts().unwrap().unwrap(),
        );
        let (ia, ib) = (fa.local_ids.clone().unwrap(), fb.local_ids.clone().unwrap());
        assert_eq!(
            (ia.ids.as_slice(), ib.ids.as_slice()),
            (&[0, 1][..], &[0, 1][..])
        );
        assert_ne!(ia.table, ib.table);
        assert_eq!(
            *tables.get_or_insert((ia.table, ib.table)),
            (ia.table, ib.table)
        );
        global
            .merge_routed(&[FlushedPart::whole(fa), FlushedPart::whole(fb)])
            .unwrap();
    }
    let mut rows = vec![];
    for c in global.finish().unwrap() {
        let col = |i: usize| {
            c.data
                .column(i)
                .as_any()
                .downcast_ref::<Int64Array>()
                .unwrap()
        };
        for r in 0..c.num_rows() {
            rows.push((col(0).value(r), col(1).value(r), col(2).value(r)));
        }
    }
    rows.sort_unstable();
    assert_eq!(rows, [(1, 9, 3006), (2, 6, 330)]);
    // A table cleared at a flush (one key of three came back) starts afresh under another
    // identity, and its flush names no ids.
    a.push(&batch(vec![3], vec![0])).unwrap();
    let cleared = a.flush_parts().unwrap().unwrap();
    assert!(cleared.local_ids.is_none());
    a.push(&batch(vec![3], vec![0])).unwrap();
    let fresh = a.flush_parts().unwrap().unwrap().local_ids.unwrap();
    assert_eq!(fresh.ids, [0]);
    assert_ne!(fresh.table, tables.unwrap().0);
}

/// A split PARTIAL's local phase that routes its DISTINCT entries when it flushes hands each
/// worker the same state as one that routes every row by its key and bucket: per worker and
/// key, the same COUNT(*) of the keys alone's set and the same DISTINCT entries with their
/// counters (three workers, two bucketed arguments, a FILTER, NULLs, two mini-batches).
#[test]
fn entries_routed_at_the_flush_land_where_their_rows_would() {
    entries_routed_as_rows(400, 5, 16, 97, false, None);
}

/// As [`entries_routed_at_the_flush_land_where_their_rows_would`], with the Expand's sets of
/// each row folded as one batch ([`crate::plan::Calc::evaluate_sets`]).
#[test]
fn sets_folded_as_one_batch_route_as_their_rows_would() {
    entries_routed_as_rows(400, 5, 16, 97, true, None);
}

/// As [`entries_routed_at_the_flush_land_where_their_rows_would`], over many keys: 1,500 of
/// a few entries each (routed by their hashes), and 1,100 of some 100 entries each, whose
/// blocks of routes are more than the local phase keeps across flushes (the routes it forgets
/// are forgotten before a flush routes a column's entries, never while it does).
#[test]
fn entries_of_many_keys_route_as_their_rows_would() {
    entries_routed_as_rows(6_000, 1_500, 1024, 97, false, None);
    entries_routed_as_rows(6_000, 1_500, 1024, 97, true, None);
    entries_routed_as_rows(110_000, 1_100, 1024, 100_003, false, None);
    entries_routed_as_rows(110_000, 1_100, 1024, 100_003, true, None);
}

/// As [`entries_routed_at_the_flush_land_where_their_rows_would`], over one key (a hot one)
/// whose entries in a flush are enough to be routed by its block of routes.
#[test]
fn entries_of_one_hot_key_route_as_their_rows_would() {
    for buckets in [16, 1024] {
        entries_routed_as_rows(3_000, 1, buckets, 997, false, None);
        entries_routed_as_rows(3_000, 1, buckets, 997, true, None);
    }
}

/// A split where only keys 0 and 3 of 40 are hot ([`crate::plan::HotKeys`]): the flush sends
/// a cold key's entries to the worker its rows go to with their bucket columns NULL (as
/// [`crate::plan::BucketFill`] leaves them), so each cold key lands on one worker, and the hot
/// keys' entries still spread.
#[test]
fn entries_of_cold_keys_stay_where_their_rows_go() {
    entries_routed_as_rows(4_000, 40, 16, 997, false, Some(&[0, 3]));
    entries_routed_as_rows(4_000, 40, 16, 997, true, Some(&[0, 3]));
    // No key hot: every key on one worker.
    entries_routed_as_rows(4_000, 40, 16, 997, true, Some(&[]));
}

/// A split PARTIAL's local phase naming hot keys folds each key into one group whatever
/// hashes reach its key table: u's set (its cold key's buckets set to NULL, the lookup's
/// query-key hashes handed on), the keys alone's set (no bucket: the keys hashed whole), u's
/// set again. By every key: the hot key 1 in buckets 2, 3 and under NULL buckets, the cold key
/// 2 once; merging the buckets on one worker: one group per key.
#[test]
fn a_split_local_phase_keeps_its_groups_whatever_hashes_it_takes() {
    use crate::plan::{HotKeys, split_fixture};
    let [u_set, keys_alone] = split_fixture::hot_and_cold_sets();
    for merged in [false, true] {
        let hot = HotKeys::from_hashes([split_fixture::key_hash(1)]);
        let plan = split_fixture::plan(4, false).with_hot_keys(Some(hot));
        let mut local = LocalGroupAggregate::try_new(Arc::new(plan)).unwrap();
        if merged {
            local
                .merge_buckets(Some(&KeyGroups::new(128, 1).unwrap()))
                .unwrap();
        }
        for b in [&u_set, &keys_alone, &u_set] {
            local
                .push_changes(&crate::changelog::ChangeBatch::inserts(b.clone()))
                .unwrap();
        }
        assert_eq!(local.len(), if merged { 2 } else { 4 }, "merged: {merged}");
        // The key table holds each group's hash over the keys it is keyed by.
        let ids: Vec<u32> = (0..local.len() as u32).collect();
        let mut want = vec![];
        tally_kernels::hash::hash_columns(&local.groups.keys(&ids).unwrap(), &mut want).unwrap();
        assert_eq!(local.groups.hashes(), &want[..], "merged: {merged}");
    }
}

/// Feeds a local phase routing at the flush (its sets folded as one batch where `as_one`) and
/// one routing rows the same Expand's sets of `rows` rows over `keys` keys and `buckets`
/// buckets (one argument's values below `values`), twice, and compares what each worker gets.
/// With `hot`, only those keys are spread ([`crate::plan::HotKeys`]): the other keys' rows get
/// NULL bucket columns.
fn entries_routed_as_rows(
    rows: i64,
    keys: i64,
    buckets: u32,
    values: i64,
    as_one: bool,
    hot: Option<&[i64]>,
) {
    use crate::plan::{HotKeys, split_fixture};
    use arrow::array::{BooleanArray, Int32Array};
    use arrow::compute::nullif;
    use arrow::util::display::array_value_to_string;
    use std::collections::BTreeMap;
    use tally_kernels::hash::{bucket_array, hash_columns};
    let key_hashes = |k: &ArrayRef| {
        let mut h = vec![];
        hash_columns(std::slice::from_ref(k), &mut h).unwrap();
        h
    };
    let hot_keys = hot.map(|hot| {
        let k: ArrayRef = Arc::new(Int64Array::from_iter_values(hot.iter().copied()));
        Arc::new(HotKeys::from_hashes(key_hashes(&k)))
    });
    let plan = |routes: bool| {
        let mut plan = split_fixture::plan(buckets, routes);
        if routes && let Some(b) = &mut plan.bucket_keys {
            b.hot = hot_keys.clone();
        }
        Arc::new(plan)
    };
    let kg = KeyGroups::new(128, 3).unwrap();
    let mut by_entries = LocalGroupAggregate::try_new(plan(true)).unwrap();
    let mut by_rows = LocalGroupAggregate::try_new(plan(false)).unwrap();
    by_entries.merge_buckets(Some(&kg)).unwrap();
    by_rows.merge_buckets(Some(&kg)).unwrap();
    assert!(by_entries.routes_at_flush() && !by_rows.routes_at_flush());
    // An Expand's three sets of the rows: u's bucket set (id 2), v's (id 1), the keys alone.
    let k: ArrayRef = Arc::new(Int64Array::from_iter_values(
        (0..rows).map(|i| (i * 7) % keys),
    ));
    let u: ArrayRef = Arc::new(Int64Array::from_iter(
        (0..rows).map(|i| (i % 9 != 0).then_some((i * 31) % values)),
    ));
    let v: ArrayRef = Arc::new(Int64Array::from_iter(
        (0..rows).map(|i| (i % 7 != 0).then_some((i * 13) % 53)),
    ));
    let f: ArrayRef = Arc::new(BooleanArray::from_iter(
        (0..rows).map(|i| (i % 5 != 0).then_some(i % 3 == 0)),
    ));
    // A cold key's rows keep NULL buckets.
    let cold: BooleanArray = key_hashes(&k)
        .iter()
        .map(|&h| Some(hot_keys.as_ref().is_some_and(|hot| !hot.is_hot(Some(h)))))
        .collect();
    let bucketed = |a: &ArrayRef| nullif(&bucket_array(a, buckets).unwrap(), &cold).unwrap();
    let none: ArrayRef = Arc::new(Int32Array::new_null(rows as usize));
    let set = |b4: &ArrayRef, b5: &ArrayRef, id: i64| {
        split_fixture::set_batch([&k, &u, &v, &f, b4, b5], id)
    };
    let sets = [
        set(&bucketed(&u), &none, 2),
        set(&none, &bucketed(&v), 1),
        set(&none, &none, 3),
    ];
    // Per worker and key: each state column's values, the DISTINCT lists as sorted entries; a
    // row without a count or an entry (one that only counted rows) left out.
    type Model = BTreeMap<(usize, String), Vec<Vec<String>>>;
    let merged = |local: &mut LocalGroupAggregate, model: &mut Model| {
        let flushed = local.flush_routed(&kg).unwrap().unwrap();
        // The hottest share is a (key, worker)'s, as the rows count them: with five keys or
        // more, below any key's (each has a fifth of the rows or less).
        let counts: Vec<u64> = flushed
            .parts
            .iter()
            .flat_map(|p| p.rows().to_vec())
            .collect();
        let top = *counts.iter().max().unwrap() as f64 / counts.iter().sum::<u64>() as f64;
        assert_eq!(flushed.hot_share, top);
        assert!(keys < 5 || top < 0.2, "{top}");
        for (w, part) in flushed.parts.iter().enumerate() {
            let batch = part.batch();
            for r in 0..batch.num_rows() {
                let key = array_value_to_string(batch.column(0), r).unwrap();
                let slot = model.entry((w, key)).or_insert_with(|| vec![vec![]; 3]);
                let count = batch
                    .column(3)
                    .as_any()
                    .downcast_ref::<Int64Array>()
                    .unwrap();
                slot[0].push(count.value(r).to_string());
                for (i, c) in [4, 5].into_iter().enumerate() {
                    let list = batch
                        .column(c)
                        .as_any()
                        .downcast_ref::<arrow::array::ListArray>()
                        .unwrap();
                    let entries = list.value(r);
                    let entries = entries
                        .as_any()
                        .downcast_ref::<arrow::array::StructArray>()
                        .unwrap();
                    for e in 0..arrow::array::Array::len(entries) {
                        let fields: Vec<String> = entries
                            .columns()
                            .iter()
                            .map(|a| array_value_to_string(a, e).unwrap())
                            .collect();
                        slot[i + 1].push(fields.join(" "));
                    }
                }
            }
        }
    };
    let (mut a, mut b) = (Model::new(), Model::new());
    for _ in 0..2 {
        if as_one {
            let changes: Vec<ChangeBatch> = sets
                .iter()
                .map(|s| ChangeBatch::inserts(s.clone()))
                .collect();
            let one = by_entries.plan.calc.evaluate_sets(&changes).unwrap();
            by_entries.push_sets_evaluated(&one, sets.len()).unwrap();
        }
        for s in &sets {
            if !as_one {
                by_entries.push(s).unwrap();
            }
            by_rows.push(s).unwrap();
        }
        merged(&mut by_entries, &mut a);
        merged(&mut by_rows, &mut b);
    }
    let tidy = |m: Model| -> Model {
        m.into_iter()
            .map(|(at, mut cols)| {
                let count: i64 = cols[0].iter().map(|c| c.parse::<i64>().unwrap()).sum();
                cols[0] = vec![count.to_string()];
                cols[1].sort();
                cols[2].sort();
                (at, cols)
            })
            .filter(|(_, cols)| cols[0][0] != "0" || !cols[1].is_empty() || !cols[2].is_empty())
            .collect()
    };
    let (a, b) = (tidy(a), tidy(b));
    assert_eq!(a, b);
    // Every worker got some of the entries; each cold key went to one worker, a hot one to all.
    let workers: std::collections::BTreeSet<usize> = a.keys().map(|(w, _)| *w).collect();
    assert_eq!(workers.len(), 3);
    if let Some(hot) = hot {
        let mut workers_of: BTreeMap<&str, usize> = BTreeMap::new();
        for (_, key) in a.keys() {
            *workers_of.entry(key).or_default() += 1;
        }
        for (key, n) in workers_of {
            let is_hot = hot.iter().any(|h| h.to_string() == key);
            assert_eq!(n, if is_hot { 3 } else { 1 }, "key {key}");
        }
    }
}

/// A source holds its routed flushes until the workers let go of every part, and frees them
/// oldest first: a flush still held by a worker keeps the later ones, returned or not.
#[test]
fn retired_flushes_are_freed_once_returned_oldest_first() {
    let (schema, plan) = plan_by_k(&[crate::aggregates::count_star()]);
    let kg = KeyGroups::new(128, 2).unwrap();
    let mut local = LocalGroupAggregate::try_new(plan).unwrap();
    let batch = RecordBatch::try_new(
        schema,
        vec![
            Arc::new(Int64Array::from_iter_values(0..64)),
            Arc::new(Int64Array::from_iter_values(0..64)),
        ],
    )
    .unwrap();
    let mut flush = || {
        local.push(&batch).unwrap();
        local.flush_routed(&kg).unwrap().unwrap().parts
    };
    let mut retired = RetiredFlushes::default();
    let first = flush();
    retired.hold(first[0].handle());
    let second = flush();
    retired.hold(second[1].handle());
    assert_eq!(retired.len(), 2);
    // The second flush comes back whole; the first is still out: both are held.
    drop(second);
    retired.free_returned();
    assert_eq!(retired.len(), 2);
    // One of the first's parts comes back: still held.
    let mut first = first.into_iter();
    drop(first.next());
    retired.free_returned();
    assert_eq!(retired.len(), 2);
    // The last part of the first comes back: both go, oldest first.
    drop(first);
    retired.free_returned();
    assert_eq!(retired.len(), 0);
}
