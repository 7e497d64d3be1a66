//! Property tests for the plain accumulators (COUNT, SUM, AVG, MIN, MAX): update, retract,
//! reset, filters and merges against the naive model; result types; DECIMAL overflow.

mod common;

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::*;
use arrow_array::{Array, ArrayRef, Decimal128Array};
use arrow_buffer::{BooleanBuffer, NullBuffer, i256};
use arrow_schema::DataType;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tally_kernels::accumulate::{count_selected, for_each_selected};
use tally_kernels::accumulator::GroupsAccumulator;
use tally_kernels::aggregates::{AggregateKind, new_accumulator, result_type};
use tally_kernels::distinct::DistinctAccumulator;

use AggregateKind::{Avg, Count, CountStar, Max, Min, Sum, Sum0};
use common::*;

// ------------------------------------------------------------------------------------------------
// Setups and evaluation against the model
// ------------------------------------------------------------------------------------------------

fn supports(kind: AggregateKind, ty: Ty) -> bool {
    match kind {
        CountStar | Count | Min | Max => true,
        Sum | Sum0 | Avg => ty.is_numeric(),
    }
}

fn is_arith(kind: AggregateKind) -> bool {
    matches!(kind, Sum | Sum0 | Avg)
}

/// Every (type, kind, retractable) the accumulator tests run.
fn combos() -> Vec<(Ty, AggregateKind, bool)> {
    let mut out = vec![];
    for &ty in ALL_TYPES {
        for kind in [CountStar, Count, Sum, Sum0, Avg, Min, Max] {
            if !supports(kind, ty) {
                continue;
            }
            out.push((ty, kind, false));
            if matches!(kind, Min | Max) {
                out.push((ty, kind, true));
            }
        }
    }
    out
}

fn make_acc(kind: AggregateKind, ty: Ty, retractable: bool) -> Box<dyn GroupsAccumulator> {
    let dt = ty.dt();
    let arg = (kind != CountStar || ty == Ty::I8).then_some(&dt);
    let acc = new_accumulator(kind, arg, retractable).unwrap();
    assert_eq!(acc.result_type(), result_type(kind, Some(&dt)).unwrap());
    acc
}

fn can_retract(kind: AggregateKind, retractable: bool) -> bool {
    retractable || !matches!(kind, Min | Max)
}

/// Evaluates every group below `total` and a random id list, and compares with the model.
fn check_eval(
    acc: &dyn GroupsAccumulator,
    model: &[Bag],
    kind: AggregateKind,
    ty: Ty,
    total: usize,
    rng: &mut StdRng,
    ctx: &str,
) {
    let want_type = result_type(kind, Some(&ty.dt())).unwrap();
    let all: Vec<u32> = (0..total as u32).collect();
    for ids in [all, random_ids(total, rng), vec![]] {
        let got = acc.evaluate(&ids).unwrap();
        assert_eq!(got.data_type(), &want_type, "{ctx}: result type");
        let want: Vec<Option<S>> = ids
            .iter()
            .map(|&g| naive(kind, ty, &model[g as usize]))
            .collect();
        assert_eq!(to_scalars(&got), want, "{ctx}: evaluate({ids:?})");
    }
}

// ------------------------------------------------------------------------------------------------
// Accumulators: update / retract / filter / reset against the model
// ------------------------------------------------------------------------------------------------

#[test]
fn for_each_selected_visits_valid_selected_rows() {
    let mut rng = StdRng::seed_from_u64(71);
    for round in 0..300 {
        let n = batch_len(&mut rng);
        let groups: Vec<u32> = (0..n).map(|_| rng.random_range(0..50)).collect();
        let rate = null_rate(&mut rng);
        let valid: Vec<bool> = (0..n).map(|_| !rng.random_bool(rate)).collect();
        let nulls = rng
            .random_bool(0.8)
            .then(|| NullBuffer::new(sliced_filter(&valid, &mut rng)));
        let filter = gen_filter(n, &mut rng);
        let filter_buf = filter.as_ref().map(|f| sliced_filter(f, &mut rng));
        let mut seen = vec![];
        for_each_selected(&groups, nulls.as_ref(), filter_buf.as_ref(), |i, g| {
            seen.push((i, g))
        });
        let want: Vec<(usize, u32)> = (0..n)
            .filter(|&i| (nulls.is_none() || valid[i]) && selected(filter.as_ref(), i))
            .map(|i| (i, groups[i]))
            .collect();
        assert_eq!(seen, want, "round {round}");
        assert_eq!(
            count_selected(n, nulls.as_ref(), filter_buf.as_ref()),
            want.len(),
            "round {round}"
        );
    }
}

#[test]
fn result_types_follow_the_spec() {
    let dec = DataType::Decimal128(10, 2);
    let dict = Ty::Dict.dt();
    let cases: Vec<(AggregateKind, Option<DataType>, DataType)> = vec![
        (CountStar, None, DataType::Int64),
        (Count, Some(DataType::Utf8), DataType::Int64),
        (Sum, Some(DataType::Int8), DataType::Int8),
        (Sum0, Some(DataType::UInt32), DataType::UInt32),
        (Sum, Some(DataType::Float32), DataType::Float32),
        (Sum, Some(dec.clone()), DataType::Decimal128(38, 2)),
        (
            Sum0,
            Some(DataType::Decimal128(5, 0)),
            DataType::Decimal128(38, 0),
        ),
        (Avg, Some(DataType::Int32), DataType::Int32),
        (Avg, Some(DataType::UInt64), DataType::UInt64),
        (Avg, Some(DataType::Float32), DataType::Float32),
        (Avg, Some(DataType::Float64), DataType::Float64),
        (Avg, Some(dec.clone()), DataType::Decimal128(38, 6)),
        (
            Avg,
            Some(DataType::Decimal128(20, 8)),
            DataType::Decimal128(38, 8),
        ),
        (Min, Some(dict.clone()), DataType::Utf8),
        (Max, Some(DataType::Boolean), DataType::Boolean),
        (Max, Some(DataType::LargeUtf8), DataType::LargeUtf8),
        (Min, Some(DataType::Utf8View), DataType::Utf8View),
        (Min, Some(dec.clone()), dec.clone()),
        (Max, Some(Ty::TsMs.dt()), Ty::TsMs.dt()),
    ];
    for (kind, arg, want) in cases {
        assert_eq!(
            result_type(kind, arg.as_ref()).unwrap(),
            want,
            "{kind:?}({arg:?})"
        );
        for retractable in [false, true] {
            let acc = new_accumulator(kind, arg.as_ref(), retractable).unwrap();
            assert_eq!(acc.result_type(), want, "{kind:?}({arg:?}) accumulator");
        }
    }
    for (kind, arg) in [
        (Sum, Some(DataType::Utf8)),
        (Avg, Some(DataType::Boolean)),
        (Sum0, Some(DataType::Date32)),
        (Avg, Some(dict)),
        (Sum, None),
        (Min, None),
    ] {
        assert!(
            result_type(kind, arg.as_ref()).is_err(),
            "{kind:?}({arg:?})"
        );
        assert!(
            new_accumulator(kind, arg.as_ref(), false).is_err(),
            "{kind:?}({arg:?})"
        );
    }
    assert!(DistinctAccumulator::try_new(&DataType::Int32, &[CountStar], true).is_err());
    assert!(DistinctAccumulator::try_new(&DataType::Int32, &[], true).is_err());
}

/// Random updates, retractions of earlier rows, resets and update-then-retract round trips on one
/// accumulator, checked against the model after every step.
fn check_accumulator(ty: Ty, kind: AggregateKind, retractable: bool, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let pool = ty.pool(is_arith(kind));
    let mut acc = make_acc(kind, ty, retractable);
    let retracts = can_retract(kind, retractable);
    let mut model: Vec<Bag> = vec![];
    let mut applied: Vec<(u32, Option<S>)> = vec![];
    let mut total = 0usize;
    for step in 0..14 {
        let ctx = format!("{kind:?}({ty:?}) retractable={retractable} seed={seed} step={step}");
        let op = rng.random_range(0..10);
        match op {
            6 | 7 if retracts => {
                // Retract earlier rows; retractable MIN/MAX also take rows they never saw (their
                // multiplicities go negative and must never make a result).
                let batch = if matches!(kind, Min | Max) && rng.random_bool(0.3) {
                    Batch::random(&pool, total, &mut rng)
                } else {
                    let rows = take_random(&mut applied, 0.4, &mut rng);
                    Batch::of_rows(rows, &pool, total, &mut rng)
                };
                let (arr, filter) = batch.arrays(ty, &mut rng);
                acc.retract(&[arr], &batch.groups, filter.as_ref(), total)
                    .unwrap();
                for (g, v) in batch.selected_rows() {
                    model[g as usize].add(&v, -1);
                }
            }
            8 => {
                let reset = random_ids(total, &mut rng);
                acc.reset(&reset);
                for &g in &reset {
                    model[g as usize] = Bag::default();
                }
                applied.retain(|(g, _)| !reset.contains(g));
            }
            9 if retracts => {
                // An update and a retraction of the same rows restore the earlier results.
                let all: Vec<u32> = (0..total as u32).collect();
                let before = acc.evaluate(&all).unwrap();
                let batch = Batch::random(&pool, total, &mut rng);
                let (arr, filter) = batch.arrays(ty, &mut rng);
                acc.update(&[arr], &batch.groups, filter.as_ref(), total)
                    .unwrap();
                let (arr, filter) = batch.arrays(ty, &mut rng);
                acc.retract(&[arr], &batch.groups, filter.as_ref(), total)
                    .unwrap();
                let after = acc.evaluate(&all).unwrap();
                assert_eq!(
                    to_scalars(&after),
                    to_scalars(&before),
                    "{ctx}: update+retract"
                );
            }
            _ => {
                if rng.random_bool(0.5) || total == 0 {
                    total = total.max(rng.random_range(1..=MAX_GROUPS));
                    model.resize(total, Bag::default());
                }
                let batch = Batch::random(&pool, total, &mut rng);
                let (arr, filter) = batch.arrays(ty, &mut rng);
                acc.update(&[arr], &batch.groups, filter.as_ref(), total)
                    .unwrap();
                for (g, v) in batch.selected_rows() {
                    model[g as usize].add(&v, 1);
                    applied.push((g, v));
                }
            }
        }
        check_eval(acc.as_ref(), &model, kind, ty, total, &mut rng, &ctx);
        assert!(total == 0 || acc.size() > 0, "{ctx}: size 0 with state");
    }
    if !retracts {
        let arr = build(ty, &[pool.first().cloned()], &mut rng);
        assert!(
            acc.retract(&[arr], &[0], None, total.max(1)).is_err(),
            "{kind:?}({ty:?}): insert-only MIN/MAX must refuse to retract"
        );
    }
}

#[test]
fn accumulators_match_naive_model() {
    for (i, (ty, kind, retractable)) in combos().into_iter().enumerate() {
        check_accumulator(ty, kind, retractable, combo_seed(31, i));
        check_accumulator(ty, kind, retractable, combo_seed(32, i));
        check_accumulator(ty, kind, retractable, combo_seed(33, i));
    }
}

#[test]
fn all_null_and_empty_batches() {
    for (i, (ty, kind, retractable)) in combos().into_iter().enumerate() {
        let mut rng = StdRng::seed_from_u64(combo_seed(34, i));
        let ctx = format!("{kind:?}({ty:?}) retractable={retractable}");
        let mut acc = make_acc(kind, ty, retractable);
        let empty = build_sliced(ty, &[], &mut rng);
        acc.update(std::slice::from_ref(&empty), &[], None, 0)
            .unwrap();
        acc.update(&[empty], &[], Some(&BooleanBuffer::new_set(0)), 2)
            .unwrap();
        let nulls = vec![None; 5];
        let arr = build_sliced(ty, &nulls, &mut rng);
        acc.update(std::slice::from_ref(&arr), &[0, 1, 0, 1, 2], None, 4)
            .unwrap();
        let filter = sliced_filter(&[true, false, true, true, false], &mut rng);
        acc.update(&[arr], &[3, 3, 3, 0, 3], Some(&filter), 4)
            .unwrap();
        let got = to_scalars(&acc.evaluate(&[0, 1, 2, 3]).unwrap());
        let want: Vec<Option<S>> = match kind {
            CountStar => [3, 2, 1, 2].map(|c| Some(S::I(c))).to_vec(),
            Count => vec![Some(S::I(0)); 4],
            Sum0 if ty.is_float() => vec![Some(S::F(0.0)); 4],
            Sum0 => vec![Some(S::I(0)); 4],
            _ => vec![None; 4],
        };
        assert_eq!(got, want, "{ctx}: all-NULL input");
        // The same through a merge of the state.
        let mut other = make_acc(kind, ty, retractable);
        let state = acc.state(&[2, 0, 1, 3, 3]).unwrap();
        let state: Vec<ArrayRef> = state.iter().map(|a| a.slice(1, 3)).collect();
        other.merge(&state, &[4, 5, 4], 6).unwrap();
        let got = to_scalars(&other.evaluate(&[4, 5, 0]).unwrap());
        let want: Vec<Option<S>> = match kind {
            CountStar => [5, 2, 0].map(|c| Some(S::I(c))).to_vec(),
            _ => want[..3].to_vec(),
        };
        assert_eq!(got, want, "{ctx}: merged all-NULL state");
    }
}

// ------------------------------------------------------------------------------------------------
// Merge
// ------------------------------------------------------------------------------------------------

/// Rows spread over a target accumulator and one or two partial ones (with their own group ids);
/// merging the partials' states into the target must equal one accumulator that saw all rows.
fn check_merge(ty: Ty, kind: AggregateKind, retractable: bool, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let pool = ty.pool(is_arith(kind));
    let total = rng.random_range(1..=MAX_GROUPS);
    let retracts = can_retract(kind, retractable);
    let mut whole = make_acc(kind, ty, retractable);
    let mut target = make_acc(kind, ty, retractable);
    let mut parts: Vec<(Box<dyn GroupsAccumulator>, LocalIds)> = (0..rng.random_range(1..=2))
        .map(|_| {
            (
                make_acc(kind, ty, retractable),
                LocalIds::new(total, &mut rng),
            )
        })
        .collect();
    let mut model = vec![Bag::default(); total];
    let mut applied: Vec<(u32, Option<S>)> = vec![];
    let ctx = format!("merge {kind:?}({ty:?}) retractable={retractable} seed={seed}");

    for _ in 0..8 {
        let op = rng.random_range(0..10);
        if op == 9 {
            let g = rng.random_range(0..total) as u32;
            whole.reset(&[g]);
            target.reset(&[g]);
            for (p, local) in &mut parts {
                p.reset(&local.of_global[g as usize]);
            }
            model[g as usize] = Bag::default();
            applied.retain(|r| r.0 != g);
            continue;
        }
        let retract = retracts && op >= 6 && !applied.is_empty();
        let batch = if retract {
            let rows = take_random(&mut applied, 0.4, &mut rng);
            Batch::of_rows(rows, &pool, total, &mut rng)
        } else {
            Batch::random(&pool, total, &mut rng)
        };
        let dest = rng.random_range(0..=parts.len());
        let (arr, filter) = batch.arrays(ty, &mut rng);
        let (arr2, filter2) = batch.arrays(ty, &mut rng);
        let (acc, groups, acc_total) = if dest == 0 {
            (&mut target, batch.groups.clone(), total)
        } else {
            let (p, local) = &mut parts[dest - 1];
            (p, local.map(&batch.groups, &mut rng), local.len())
        };
        if retract {
            whole
                .retract(&[arr], &batch.groups, filter.as_ref(), total)
                .unwrap();
            acc.retract(&[arr2], &groups, filter2.as_ref(), acc_total)
                .unwrap();
        } else {
            whole
                .update(&[arr], &batch.groups, filter.as_ref(), total)
                .unwrap();
            acc.update(&[arr2], &groups, filter2.as_ref(), acc_total)
                .unwrap();
        }
        for (g, v) in batch.selected_rows() {
            model[g as usize].add(&v, if retract { -1 } else { 1 });
            if !retract {
                applied.push((g, v));
            }
        }
    }

    for (i, (p, local)) in parts.iter().enumerate() {
        let (padded, range, map) = local.merge_plan(&mut rng);
        let state = p.state(&padded).unwrap();
        let types = p.state_types();
        assert_eq!(state.len(), types.len(), "{ctx}: state columns");
        for (col, t) in state.iter().zip(&types) {
            assert_eq!(col.data_type(), t, "{ctx}: state type");
            assert_eq!(col.len(), padded.len(), "{ctx}: state length");
        }
        if (seed as usize + i).is_multiple_of(2) {
            let state: Vec<ArrayRef> = state
                .iter()
                .map(|a| a.slice(range.start, range.len()))
                .collect();
            target.merge(&state, &map, total).unwrap();
        } else {
            // The rows read in place, as a worker merges its range of a flush the workers
            // share.
            target.merge_at(&state, range.start, &map, total).unwrap();
            assert!(
                target
                    .merge_at(&state, padded.len() + 1, &map, total)
                    .is_err(),
                "{ctx}: rows past the end of the state"
            );
        }
    }
    let all: Vec<u32> = (0..total as u32).collect();
    assert_eq!(
        to_scalars(&target.evaluate(&all).unwrap()),
        to_scalars(&whole.evaluate(&all).unwrap()),
        "{ctx}: merged vs whole"
    );
    check_eval(target.as_ref(), &model, kind, ty, total, &mut rng, &ctx);

    // The merged state keeps working: more rows, and retractions of earlier ones.
    for _ in 0..3 {
        let retract = retracts && rng.random_bool(0.5) && !applied.is_empty();
        let batch = if retract {
            let rows = take_random(&mut applied, 0.5, &mut rng);
            Batch::of_rows(rows, &pool, total, &mut rng)
        } else {
            Batch::random(&pool, total, &mut rng)
        };
        for acc in [&mut target, &mut whole] {
            let (arr, filter) = batch.arrays(ty, &mut rng);
            if retract {
                acc.retract(&[arr], &batch.groups, filter.as_ref(), total)
                    .unwrap();
            } else {
                acc.update(&[arr], &batch.groups, filter.as_ref(), total)
                    .unwrap();
            }
        }
        for (g, v) in batch.selected_rows() {
            model[g as usize].add(&v, if retract { -1 } else { 1 });
            if !retract {
                applied.push((g, v));
            }
        }
        check_eval(target.as_ref(), &model, kind, ty, total, &mut rng, &ctx);
        check_eval(whole.as_ref(), &model, kind, ty, total, &mut rng, &ctx);
    }
}

#[test]
fn merge_equals_single_accumulator() {
    for (i, (ty, kind, retractable)) in combos().into_iter().enumerate() {
        check_merge(ty, kind, retractable, combo_seed(41, i));
        check_merge(ty, kind, retractable, combo_seed(42, i));
        check_merge(ty, kind, retractable, combo_seed(43, i));
    }
}

// ------------------------------------------------------------------------------------------------
// DECIMAL overflow
// ------------------------------------------------------------------------------------------------

/// DECIMAL SUM at the edge of 38 digits: NULL exactly when the exact sum does not fit, whatever
/// the order, the split into partial states, or retractions that bring it back into range.
#[test]
fn decimal_sum_is_null_exactly_when_it_overflows_38_digits() {
    let dt = DataType::Decimal128(38, 2);
    let half = 5 * 10i128.pow(37);
    let arr = |v: &[i128]| -> ArrayRef {
        Arc::new(
            Decimal128Array::from(v.to_vec())
                .with_precision_and_scale(38, 2)
                .unwrap(),
        )
    };
    let result = |acc: &dyn GroupsAccumulator| -> Option<i128> {
        let r = acc.evaluate(&[0]).unwrap();
        let r = r.as_primitive::<Decimal128Type>();
        r.is_valid(0).then(|| r.value(0))
    };
    let mut sum = new_accumulator(Sum, Some(&dt), false).unwrap();
    sum.update(&[arr(&[half, half - 1])], &[0, 0], None, 1)
        .unwrap();
    assert_eq!(result(sum.as_ref()), Some(10i128.pow(38) - 1));
    sum.update(&[arr(&[1])], &[0], None, 1).unwrap();
    assert_eq!(result(sum.as_ref()), None, "10^38 overflows");
    // Far past i128 and back: the state is exact.
    sum.update(&[arr(&[half; 8])], &[0; 8], None, 1).unwrap();
    assert_eq!(result(sum.as_ref()), None);
    sum.retract(&[arr(&[half; 8])], &[0; 8], None, 1).unwrap();
    sum.retract(&[arr(&[half])], &[0], None, 1).unwrap();
    assert_eq!(result(sum.as_ref()), Some(half));
    // Two partial states in range whose merge is not.
    let mut parts = vec![];
    for v in [half, half] {
        let mut p = new_accumulator(Sum, Some(&dt), false).unwrap();
        p.update(&[arr(&[v])], &[0], None, 1).unwrap();
        assert_eq!(result(p.as_ref()), Some(v));
        parts.push(p.state(&[0]).unwrap());
    }
    let mut merged = new_accumulator(Sum, Some(&dt), false).unwrap();
    for state in &parts {
        merged.merge(state, &[0], 1).unwrap();
    }
    assert_eq!(result(merged.as_ref()), None);
    // AVG: NULL with its overflowing sum, a value again once the sum fits.
    let mut avg = new_accumulator(Avg, Some(&dt), false).unwrap();
    avg.update(&[arr(&[half, half, -half])], &[0, 0, 0], None, 1)
        .unwrap();
    assert_eq!(result(avg.as_ref()), None);
    avg.retract(&[arr(&[half])], &[0], None, 1).unwrap();
    // (half - half) / 2 = 0 at scale 6.
    assert_eq!(result(avg.as_ref()), Some(0));
    // The split-distinct sum over the DECIMAL(76, s) state type is exact too.
    let wide = DataType::Decimal256(76, 2);
    assert_eq!(result_type(Sum, Some(&wide)).unwrap(), wide);
    let mut wide_sum = new_accumulator(Sum0, Some(&wide), false).unwrap();
    let values: arrow_array::Decimal256Array = [half, half, half]
        .iter()
        .map(|&v| Some(i256::from_i128(v)))
        .collect::<arrow_array::Decimal256Array>()
        .with_precision_and_scale(76, 2)
        .unwrap();
    wide_sum
        .update(&[Arc::new(values)], &[0, 0, 0], None, 1)
        .unwrap();
    let r = wide_sum.evaluate(&[0]).unwrap();
    assert_eq!(
        r.as_primitive::<Decimal256Type>().value(0),
        i256::from_i128(half) * i256::from_i128(3)
    );
}
