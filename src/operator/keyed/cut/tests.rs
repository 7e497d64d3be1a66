//! The cut of merged state against state keyed by every key, on one worker and on several.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, BooleanArray, Int32Array, Int64Array, RecordBatch};
use tally_kernels::hash::{bucket_array, hash_columns};

use crate::clock::SystemClock;
use crate::config::Config;
use crate::operator::GroupAggregate;
use crate::plan::{HotKeys, split_fixture};

/// The split fixture's PARTIAL over 8 buckets (its calls routable), keys 0 and 1 hot, its
/// state merging the buckets or not.
fn partial(merged: bool) -> GroupAggregate {
    let hot = HotKeys::from_hashes([split_fixture::key_hash(0), split_fixture::key_hash(1)]);
    let plan = split_fixture::plan(8, true).with_hot_keys(Some(hot));
    let mut agg =
        GroupAggregate::try_new(Arc::new(plan), Config::default(), Arc::new(SystemClock)).unwrap();
    agg.merge_buckets(merged).unwrap();
    agg
}

/// An Expand's three sets of `n` seeded rows over keys 0 to 5: `u`'s (bucketed), `v`'s
/// (bucketed), the keys alone's; NULL values among them (in the NULL bucket).
fn sets(n: usize, seed: u64) -> Vec<RecordBatch> {
    let mut x = seed;
    let mut next = |m: u64| {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (x >> 33) % m
    };
    let rows: Vec<(i64, Option<i64>, Option<i64>, bool)> = (0..n)
        .map(|_| {
            let k = [0, 0, 0, 1, 1, 2, 3, 4, 5][next(9) as usize];
            let u = (next(10) > 0).then(|| next(60) as i64);
            let v = (next(10) > 0).then(|| next(25) as i64);
            (k, u, v, next(2) == 0)
        })
        .collect();
    let k: ArrayRef = Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0)));
    let u: ArrayRef = Arc::new(Int64Array::from_iter(rows.iter().map(|r| r.1)));
    let v: ArrayRef = Arc::new(Int64Array::from_iter(rows.iter().map(|r| r.2)));
    let f: ArrayRef = Arc::new(BooleanArray::from_iter(rows.iter().map(|r| Some(r.3))));
    let bucketed = |a: &ArrayRef| -> ArrayRef { Arc::new(bucket_array(a, 8).unwrap()) };
    let none: ArrayRef = Arc::new(Int32Array::new_null(n));
    vec![
        split_fixture::set_batch([&k, &u, &v, &f, &bucketed(&u), &none], 2),
        split_fixture::set_batch([&k, &u, &v, &f, &none, &bucketed(&v)], 1),
        split_fixture::set_batch([&k, &u, &v, &f, &none, &none], 3),
    ]
}

/// Each row of `batches` as text, sorted, without its last `skip` columns; a list's
/// entries sorted (their order follows the table's history).
fn rows(batches: &[RecordBatch], skip: usize) -> Vec<String> {
    use arrow::array::{Array, AsArray};
    use arrow::util::display::{ArrayFormatter, FormatOptions};
    let opts = FormatOptions::default().with_null("NULL");
    let mut out = vec![];
    for b in batches {
        for r in 0..b.num_rows() {
            let mut cells = vec![];
            for c in &b.columns()[..b.num_columns() - skip] {
                let cell = match c.as_list_opt::<i32>() {
                    Some(list) => {
                        let entries = list.value(r);
                        let f = ArrayFormatter::try_new(entries.as_ref(), &opts).unwrap();
                        let mut e: Vec<String> =
                            (0..entries.len()).map(|i| f.value(i).to_string()).collect();
                        e.sort();
                        e.join(";")
                    }
                    None => ArrayFormatter::try_new(c.as_ref(), &opts)
                        .unwrap()
                        .value(r)
                        .to_string(),
                };
                cells.push(cell);
            }
            out.push(cells.join(" | "));
        }
    }
    out.sort();
    out
}

/// A snapshot of state that merges its buckets, cut on one worker, holds the rows state
/// keyed by every key holds after the same input: the hot keys' groups per (set, bucket)
/// with the entries of their bucket, the keys alone's row with the plain calls' state, a
/// cold key's group whole; the input rows each group received lie on the keys alone's
/// row. Restored into state keyed either way, it is snapshot the same again.
#[test]
fn merged_state_cuts_into_the_groups_of_state_keyed_by_every_key() {
    let (mut merged, mut spread) = (partial(true), partial(false));
    for seed in 1..4 {
        for b in sets(300, seed) {
            merged.push(&b).unwrap();
            spread.push(&b).unwrap();
        }
    }
    merged.finish().unwrap();
    spread.finish().unwrap();
    assert!(merged.keyed.live < spread.keyed.live);
    let cut = merged.snapshot().unwrap();
    let whole = spread.snapshot().unwrap();
    // Every column but the input rows, which the keys alone's row carries.
    assert_eq!(rows(&cut, 1), rows(&whole, 1));
    let hot_rows: Vec<String> = rows(&cut, 0)
        .into_iter()
        .filter(|r| r.starts_with("0 | ") || r.starts_with("1 | "))
        .collect();
    assert!(hot_rows.len() > 8, "{hot_rows:?}");
    let total = |batches: &[RecordBatch]| -> u64 {
        batches
            .iter()
            .map(|b| {
                let c = b.column(b.num_columns() - 1);
                arrow::compute::sum(
                    c.as_any()
                        .downcast_ref::<arrow::array::UInt64Array>()
                        .unwrap(),
                )
                .unwrap()
            })
            .sum()
    };
    assert_eq!(total(&cut), total(&whole));
    for into_merged in [false, true] {
        let mut restored = partial(into_merged);
        restored.restore_snapshot(&cut).unwrap();
        assert_eq!(restored.merges_buckets(), into_merged);
        assert_eq!(
            restored.keyed.live,
            if into_merged {
                merged.keyed.live
            } else {
                spread.keyed.live
            }
        );
        assert_eq!(rows(&restored.snapshot().unwrap(), 0), rows(&cut, 0));
    }
    // Restored keyed by every key, then merged for a run that merges.
    let mut restored = partial(false);
    restored.restore_snapshot(&whole).unwrap();
    assert!(restored.merge_restored_buckets().unwrap());
    assert_eq!(restored.keyed.live, merged.keyed.live);
    assert_eq!(rows(&restored.snapshot().unwrap(), 1), rows(&cut, 1));
}

/// On one of several workers, what no bucket locates lies on a row the worker owns: the
/// keys alone's where it owns that, otherwise one of the group's bucket rows.
#[test]
fn a_cut_on_several_workers_keeps_its_rows_on_the_worker() {
    use crate::operator::key_groups::KeyGroups;
    let kg = KeyGroups::new(128, 3).unwrap();
    let whole_hash = |b: &RecordBatch, r: usize| {
        let mut h = vec![];
        let keys: Vec<ArrayRef> = (0..3).map(|c| b.column(c).slice(r, 1)).collect();
        hash_columns(&keys, &mut h).unwrap();
        h[0]
    };
    let mut carriers = [0, 0];
    for w in 0..3 {
        let mut agg = partial(true);
        agg.set_owner(&kg, w);
        // The rows bound for worker `w`, as the runtimes route them (by every key).
        for b in sets(400, 7) {
            let changes = crate::changelog::ChangeBatch::inserts(b.clone());
            let cb = agg.plan.evaluate(&changes).unwrap();
            let mut hashes = vec![];
            hash_columns(&cb.keys, &mut hashes).unwrap();
            let mine: BooleanArray = hashes
                .iter()
                .map(|&h| Some(kg.worker_of_hash(h) == w))
                .collect();
            agg.push(&arrow::compute::filter_record_batch(&b, &mine).unwrap())
                .unwrap();
        }
        agg.finish().unwrap();
        for b in agg.snapshot().unwrap() {
            let input_rows = b.column(b.num_columns() - 1);
            let input_rows = input_rows
                .as_any()
                .downcast_ref::<arrow::array::UInt64Array>()
                .unwrap();
            for r in 0..b.num_rows() {
                assert_eq!(
                    kg.worker_of_hash(whole_hash(&b, r)),
                    w,
                    "row {r} of worker {w}"
                );
                let bucketed = b.column(1).is_valid(r) || b.column(2).is_valid(r);
                carriers[usize::from(bucketed)] += usize::from(input_rows.value(r) > 0);
            }
        }
    }
    // Carriers on keys alone's rows, and on bucket rows (a hot key's other workers).
    assert!(carriers[0] > 0 && carriers[1] > 0, "{carriers:?}");
}
