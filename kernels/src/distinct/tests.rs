//! The DISTINCT accumulator's counters and pairs: counts past 32 bits, emptied groups,
//! value order where it changes a sum, local phases, and the pair layouts by input and
//! aggregates. Entries placed in rows, and their buckets, are in `tests/entries.rs`.

use super::*;
use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{Float64Array, Int64Array, ListArray, StructArray};
use arrow_buffer::BooleanBuffer;

/// The values of group 0's list in a state.
fn listed(state: &ArrayRef) -> ArrayRef {
    let lists = state.as_any().downcast_ref::<ListArray>().unwrap();
    let entries = lists.value(0);
    let entries = entries.as_any().downcast_ref::<StructArray>().unwrap();
    Arc::clone(entries.column(0))
}

/// The counters of group `g` in a state, by value.
fn counters(state: &ArrayRef, g: usize) -> Vec<(i64, i64)> {
    let lists = state.as_any().downcast_ref::<ListArray>().unwrap();
    let entries = lists.value(g);
    let entries = entries.as_any().downcast_ref::<StructArray>().unwrap();
    let values = entries.column(0).as_primitive::<Int64Type>();
    let counts = entries.column(1).as_primitive::<Int64Type>();
    let mut out: Vec<(i64, i64)> = values
        .values()
        .iter()
        .copied()
        .zip(counts.values().iter().copied())
        .collect();
    out.sort_unstable();
    out
}

/// A counter past 32 bits moves to the side map and back, and survives a purge.
#[test]
fn counters_past_32_bits_are_exact() {
    let mut acc =
        DistinctAccumulator::try_new(&DataType::Int64, &[AggregateKind::Count], true).unwrap();
    let one = |acc: &DistinctAccumulator, g: u32, value: u64, count: i64| {
        acc.lists(vec![value], vec![vec![count]], vec![0, 1])
            .map(|s| (s, g))
    };
    let merge = |acc: &mut DistinctAccumulator, g: u32, value: u64, count: i64| {
        let (state, g) = one(acc, g, value, count).unwrap();
        acc.merge(&state, &[g], 3).unwrap();
    };
    let count_of = |acc: &DistinctAccumulator, g: u32| {
        acc.evaluate(&[g]).unwrap()[0]
            .as_primitive::<Int64Type>()
            .value(0)
    };
    merge(&mut acc, 0, 7, 3_000_000_000);
    merge(&mut acc, 0, 7, 1_000_000_000);
    assert_eq!(
        counters(&acc.state(&[0]).unwrap(), 0),
        vec![(7, 4_000_000_000)]
    );
    assert_eq!(count_of(&acc, 0), 1);
    // Many pairs of other groups emptied: a purge renumbers, the wide counter stays.
    let values: ArrayRef = Arc::new(Int64Array::from_iter_values(0..20_000));
    acc.apply(&values, &vec![1; 20_000], &[None], 3, 1).unwrap();
    acc.reset(&[1]);
    assert!(acc.entries() < 100, "purged: {} pairs left", acc.entries());
    assert_eq!(
        counters(&acc.state(&[0, 1]).unwrap(), 0),
        vec![(7, 4_000_000_000)]
    );
    merge(&mut acc, 0, 7, -3_999_999_999);
    assert_eq!(counters(&acc.state(&[0]).unwrap(), 0), vec![(7, 1)]);
    assert!(acc.wide.is_empty());
    assert_eq!(count_of(&acc, 0), 1);
    merge(&mut acc, 0, 7, -1);
    assert_eq!(count_of(&acc, 0), 0);
    assert_eq!(acc.entries(), 0);
    // Below the 32-bit range too.
    merge(&mut acc, 2, 9, -5_000_000_000);
    assert_eq!(
        counters(&acc.state(&[2]).unwrap(), 0),
        vec![(9, -5_000_000_000)]
    );
}

/// Groups emptied and filled again, round after round: each round's values only, and the
/// pairs of emptied groups purged so that the table does not grow with the rounds.
#[test]
fn emptied_groups_start_afresh_and_their_pairs_are_purged() {
    let mut acc =
        DistinctAccumulator::try_new(&DataType::Int64, &[AggregateKind::Count], true).unwrap();
    let groups = 50u32;
    let mut most = 0;
    // The first round each group holds values of.
    let mut first = vec![0i64; groups as usize];
    for round in 0..40i64 {
        // Group g holds values round*1000 + 0..(100 + g), some twice.
        let mut gids = vec![];
        let mut vals = vec![];
        for g in 0..groups {
            for v in 0..(100 + i64::from(g)) {
                gids.push(g);
                vals.push(round * 1000 + v);
                if v % 7 == 0 {
                    gids.push(g);
                    vals.push(round * 1000 + v);
                }
            }
        }
        let arr: ArrayRef = Arc::new(Int64Array::from(vals));
        acc.apply(&arr, &gids, &[None], groups as usize, 1).unwrap();
        let all: Vec<u32> = (0..groups).collect();
        let counts = acc.evaluate(&all).unwrap();
        let counts = counts[0].as_primitive::<Int64Type>();
        for (g, &from) in first.iter().enumerate() {
            let rounds = round - from + 1;
            assert_eq!(counts.value(g), rounds * (100 + g as i64), "round {round}");
        }
        let state = acc.state(&all).unwrap();
        for g in [0, 17, 49] {
            let listed = counters(&state, g);
            assert_eq!(
                listed.len() as i64,
                (round - first[g] + 1) * (100 + g as i64)
            );
            assert_eq!(listed[0], (first[g] * 1000, 2));
            assert_eq!(listed[1], (first[g] * 1000 + 1, 1));
        }
        most = most.max(acc.entries());
        // Odd groups emptied now, even ones every other round.
        let emptied: Vec<u32> = (0..groups)
            .filter(|g| g % 2 == 1 || round % 2 == 0)
            .collect();
        acc.reset(&emptied);
        for &g in &emptied {
            first[g as usize] = round + 1;
        }
    }
    let live = (0..groups as usize).map(|g| 100 + g).sum::<usize>();
    assert!(
        most <= 2 * live + PURGE_MIN_STALE,
        "{most} pairs held at most"
    );
}

/// A local phase's flush (groups `0..n`) lists a floating-point SUM's values by their bits
/// whatever order they came in, so that the merge adds them in one order; a COUNT's values
/// come in the table's order, the same set.
#[test]
fn a_flush_orders_values_where_the_order_can_change_a_sum() {
    // `before` values first, then cleared (the table keeps its grown capacity, so its
    // order differs from a fresh table's), then `arg`.
    let state_after = |kind: AggregateKind, before: usize, arg: ArrayRef| {
        let mut acc = DistinctAccumulator::try_new(arg.data_type(), &[kind], true).unwrap();
        let filler = arrow_cast::cast(
            &(Arc::new(Int64Array::from_iter_values(0..before as i64)) as ArrayRef),
            arg.data_type(),
        )
        .unwrap();
        acc.apply(&filler, &vec![0; before], &[None], 1, 1).unwrap();
        acc.clear(1);
        acc.apply(&arg, &vec![0; arg.len()], &[None], 1, 1).unwrap();
        listed(&acc.state(&[0]).unwrap())
    };
    let floats = |v: Vec<f64>| Arc::new(Float64Array::from(v)) as ArrayRef;
    let values: Vec<f64> = (0..40).map(|i| f64::from(i) * 1.5e15 - 7.0).collect();
    let mut reversed = values.clone();
    reversed.reverse();
    let a = state_after(AggregateKind::Sum, 0, floats(values.clone()));
    let b = state_after(AggregateKind::Sum, 5000, floats(reversed));
    assert_eq!(&a, &b);
    let ints = |v: Vec<i64>| Arc::new(Int64Array::from(v)) as ArrayRef;
    let mut a: Vec<i64> = state_after(AggregateKind::Count, 5000, ints((0..100).collect()))
        .as_primitive::<Int64Type>()
        .values()
        .to_vec();
    a.sort_unstable();
    assert_eq!(a, (0..100).collect::<Vec<i64>>());
}

/// One group's list, among many groups' pairs, holds only its own entries' memory: the walk
/// that found them reserved room for every pair of the table.
#[test]
fn one_groups_list_keeps_only_its_own_entries() {
    let mut acc =
        DistinctAccumulator::try_new(&DataType::Int64, &[AggregateKind::Count], false).unwrap();
    let n = 100_000;
    let values: ArrayRef = Arc::new(Int64Array::from_iter_values(0..n as i64));
    // Group 1 gets 10 values, group 0 the rest.
    let groups: Vec<u32> = (0..n).map(|i| u32::from(i % 10_000 == 0)).collect();
    acc.apply(&values, &groups, &[None], 2, 1).unwrap();
    let one = acc.state(&[1]).unwrap();
    assert_eq!(listed(&one).len(), 10);
    assert!(
        one.get_array_memory_size() < 4096,
        "{} bytes for 10 entries",
        one.get_array_memory_size()
    );
}

/// A local phase's DISTINCT, which leaves its inner aggregates alone, flushes the same state
/// as one that updates them: a global phase fed by either holds the same results and counters,
/// with two aggregates (one FILTERed), retractions and NULLs, mini-batch after mini-batch.
#[test]
fn a_local_phase_without_inner_aggregates_flushes_the_same_state() {
    let kinds = [AggregateKind::Count, AggregateKind::Count];
    let new = || DistinctAccumulator::try_new(&DataType::Int64, &kinds, true).unwrap();
    let (mut local, mut full) = (new(), new());
    local.for_local_phase();
    let (mut global, mut reference) = (new(), new());
    let mut rng = crate::test_rng::XorShift(0x9e37_79b9_7f4a_7c15u64);
    let mut rand = move || rng.next();
    let groups = 4u32;
    let all: Vec<u32> = (0..groups).collect();
    for batch in 0..60 {
        // Rarely repeated values, then few values (most rows fold away locally).
        let range = if batch < 30 { 1_000_000 } else { 20 };
        let n = 600;
        let values: ArrayRef = Arc::new(Int64Array::from_iter((0..n).map(|_| {
            let v = rand() % range;
            (v % 97 != 0).then_some(v as i64)
        })));
        let gids: Vec<u32> = (0..n)
            .map(|_| (rand() % u64::from(groups)) as u32)
            .collect();
        let even = BooleanBuffer::collect_bool(n, |i| i % 2 == 0);
        let delta = if batch % 7 == 3 { -1 } else { 1 };
        let filters = [None, Some(&even)];
        local
            .apply(&values, &gids, &filters, groups as usize, delta)
            .unwrap();
        full.apply(&values, &gids, &filters, groups as usize, delta)
            .unwrap();
        global
            .merge(&local.state(&all).unwrap(), &all, groups as usize)
            .unwrap();
        reference
            .merge(&full.state(&all).unwrap(), &all, groups as usize)
            .unwrap();
        local.clear(groups as usize);
        full.clear(groups as usize);
        assert_eq!(
            global.evaluate(&all).unwrap(),
            reference.evaluate(&all).unwrap(),
            "batch {batch}"
        );
        let (a, b) = (global.state(&all).unwrap(), reference.state(&all).unwrap());
        for g in 0..groups as usize {
            assert_eq!(counters(&a, g), counters(&b, g), "batch {batch}, group {g}");
        }
    }
}

/// Over insert-only input the pairs keep no counts (bare with one aggregate, flags with
/// several, counters again past `MAX_FLAGGED` aggregates): local phases flushed into a global
/// one give the results and listed pairs of counted accumulators, with FILTERs, NULLs and
/// emptied groups; a bare pair takes 13 bytes a bucket; a retraction is refused.
#[test]
fn insert_only_pairs_keep_no_counts() {
    let all_kinds = [AggregateKind::Count; MAX_FLAGGED + 1];
    for k in [1, 3, MAX_FLAGGED, MAX_FLAGGED + 1] {
        let kinds = &all_kinds[..k];
        let new = |retractable| {
            DistinctAccumulator::try_new(&DataType::Int64, kinds, retractable).unwrap()
        };
        let (mut local, mut global) = (new(false), new(false));
        let (mut counted_local, mut counted) = (new(true), new(true));
        let mut rng = crate::test_rng::XorShift(0x2545_f491_4f6c_dd1d ^ k as u64);
        let mut rand = move || rng.next();
        let groups = 5u32;
        let all: Vec<u32> = (0..groups).collect();
        for batch in 0..40 {
            let n = 500;
            let range = if batch % 2 == 0 { 50 } else { 100_000 };
            let values: ArrayRef = Arc::new(Int64Array::from_iter((0..n).map(|_| {
                let v = rand() % range;
                (v % 31 != 0).then_some(v as i64)
            })));
            let gids: Vec<u32> = (0..n)
                .map(|_| (rand() % u64::from(groups)) as u32)
                .collect();
            let masks: Vec<BooleanBuffer> = (0..k)
                .map(|i| BooleanBuffer::collect_bool(n, |r| (r + i) % (i + 1) == 0))
                .collect();
            let filters: Vec<Option<&BooleanBuffer>> = masks
                .iter()
                .map(|m| Some(m).filter(|_| k > 1 && batch % 4 != 1))
                .collect();
            for acc in [&mut local, &mut counted_local] {
                acc.apply(&values, &gids, &filters, groups as usize, 1)
                    .unwrap();
            }
            if batch % 3 == 2 {
                global
                    .merge(&local.state(&all).unwrap(), &all, groups as usize)
                    .unwrap();
                counted
                    .merge(&counted_local.state(&all).unwrap(), &all, groups as usize)
                    .unwrap();
                local.clear(groups as usize);
                counted_local.clear(groups as usize);
            }
            if batch % 10 == 9 {
                global.reset(&[1, 3]);
                counted.reset(&[1, 3]);
            }
            let ctx = format!("k = {k}, batch {batch}");
            assert_eq!(
                global.evaluate(&all).unwrap(),
                counted.evaluate(&all).unwrap(),
                "{ctx}"
            );
            // Listed: the same values; each counter 1 where the counted one is past 0.
            let (a, b) = (global.state(&all).unwrap(), counted.state(&all).unwrap());
            // Each column of the entries, a group's in the order of their values (a list's
            // order is its table's).
            let entries = |s: &ArrayRef| {
                let list = s.as_list::<i32>();
                let cols: Vec<&[i64]> = list
                    .values()
                    .as_struct()
                    .columns()
                    .iter()
                    .map(|c| &**c.as_primitive::<Int64Type>().values())
                    .collect();
                let mut rows: Vec<(usize, i64, usize)> = vec![];
                for (g, w) in list.offsets().windows(2).enumerate() {
                    rows.extend((w[0] as usize..w[1] as usize).map(|j| (g, cols[0][j], j)));
                }
                rows.sort_unstable();
                cols.iter()
                    .map(|c| rows.iter().map(|&(_, _, j)| c[j]).collect())
                    .collect::<Vec<Vec<i64>>>()
            };
            let (mut a, b) = (entries(&a), entries(&b));
            if k <= MAX_FLAGGED {
                for (i, col) in b.iter().enumerate().skip(1) {
                    assert!(col.iter().all(|&c| c >= 0), "{ctx}");
                    a[i] = a[i].iter().map(|&c| c.min(1)).collect();
                    assert_eq!(a[i], col.iter().map(|&c| c.min(1)).collect::<Vec<_>>());
                }
            } else {
                assert_eq!(a, b, "{ctx}: counted past {MAX_FLAGGED}");
            }
            assert_eq!(a[0].len(), b[0].len(), "{ctx}");
        }
        assert_eq!(
            matches!(global.pairs, Pairs::Bare(_)),
            k == 1,
            "k = {k}: bare pairs"
        );
        if k == 1 {
            // Five 12-byte pairs a 64-byte line, the lines at least two fifths full.
            assert_eq!(global.pairs.len(), counted.pairs.len());
            assert!(global.pairs.bytes() < counted.pairs.bytes());
            assert!(global.pairs.bytes() <= global.pairs.len() * 32);
        }
        let values: ArrayRef = Arc::new(Int64Array::from(vec![1]));
        let err = global.apply(&values, &[0], &vec![None; k], groups as usize, -1);
        assert_eq!(err.is_err(), k <= MAX_FLAGGED, "k = {k}");
        // A negative counter in a state is refused likewise.
        let neg = counted_local
            .lists(vec![5], vec![vec![-1]; k], vec![0, 1])
            .unwrap();
        assert_eq!(
            global.merge(&neg, &[0], groups as usize).is_err(),
            k <= MAX_FLAGGED
        );
    }
}

/// A few aggregates over insert-only input keep their flags in 12-byte tagged pairs: with ids
/// past what a tagged pair holds (more fresh ids than it can name, then more groups) the
/// results and listed pairs stay those of counted accumulators; fresh ids past it purge the
/// table and keep it tagged, group numbers past it make it flagged.
#[test]
fn tagged_pairs_hold_the_flags_of_a_few_aggregates() {
    let kinds = [
        AggregateKind::Count,
        AggregateKind::Count,
        AggregateKind::Sum,
    ];
    let new =
        |retractable| DistinctAccumulator::try_new(&DataType::Int64, &kinds, retractable).unwrap();
    let (mut local, mut tagged, mut counted) = (new(false), new(false), new(true));
    assert!(matches!(tagged.pairs, Pairs::Tagged(_)));
    let mut rng = crate::test_rng::XorShift(0x9e37_79b9_7f4a_7c15);
    let mut rand = move || rng.next();
    let fewer = TAG_IDS as usize / 2;
    for batch in 0..80usize {
        // Fewer groups than a tagged pair names, then more.
        let groups = if batch < 50 { fewer } else { fewer + 3 * batch };
        let all: Vec<u32> = (0..groups as u32).collect();
        let n = 400;
        let values: ArrayRef = Arc::new(Int64Array::from_iter((0..n).map(|_| {
            let v = rand() % 300;
            (v % 17 != 0).then_some(v as i64)
        })));
        let gids: Vec<u32> = (0..n).map(|_| (rand() % groups as u64) as u32).collect();
        let masks: Vec<BooleanBuffer> = (0..kinds.len())
            .map(|i| BooleanBuffer::collect_bool(n, |r| (r + batch) % (i + 1) == 0))
            .collect();
        let filters: Vec<Option<&BooleanBuffer>> = masks.iter().map(Some).collect();
        if batch % 2 == 0 {
            tagged.apply(&values, &gids, &filters, groups, 1).unwrap();
        } else {
            // Through a local phase's flush.
            local.apply(&values, &gids, &filters, groups, 1).unwrap();
            tagged
                .merge(&local.state(&all).unwrap(), &all, groups)
                .unwrap();
            local.clear(groups);
        }
        counted.apply(&values, &gids, &filters, groups, 1).unwrap();
        // Groups emptied, batch after batch: more fresh ids than a tagged pair names.
        let emptied: Vec<u32> = (0..4).map(|_| (rand() % groups as u64) as u32).collect();
        tagged.reset(&emptied);
        counted.reset(&emptied);
        let ctx = format!("batch {batch}, {groups} groups");
        assert_eq!(
            tagged.evaluate(&all).unwrap(),
            counted.evaluate(&all).unwrap(),
            "{ctx}"
        );
        let counters = |s: &ArrayRef, g: usize| -> Vec<(i64, Vec<i64>)> {
            let list = s.as_list::<i32>();
            let entries = list.value(g);
            let entries = entries.as_struct();
            let cols: Vec<&[i64]> = entries
                .columns()
                .iter()
                .map(|c| c.as_primitive::<Int64Type>().values().as_ref())
                .collect();
            let mut rows: Vec<(i64, Vec<i64>)> = (0..cols[0].len())
                .map(|r| (cols[0][r], cols[1..].iter().map(|c| c[r].min(1)).collect()))
                .collect();
            rows.sort_unstable();
            rows
        };
        let (a, b) = (tagged.state(&all).unwrap(), counted.state(&all).unwrap());
        for g in 0..groups {
            assert_eq!(counters(&a, g), counters(&b, g), "{ctx}, group {g}");
        }
        assert_eq!(
            matches!(tagged.pairs, Pairs::Tagged(_)),
            groups <= TAG_IDS as usize,
            "{ctx}: tagged"
        );
    }
    assert!(matches!(tagged.pairs, Pairs::Flagged(_)));
}

mod entries;
