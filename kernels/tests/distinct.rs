//! Property tests for `DistinctAccumulator`: several DISTINCT aggregates over one argument
//! against the naive model, and merges of partial states.

mod common;

use std::collections::BTreeMap;

use arrow_array::Array;
use arrow_buffer::BooleanBuffer;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use tally_kernels::aggregates::{AggregateKind, result_type};
use tally_kernels::distinct::DistinctAccumulator;

use AggregateKind::{Avg, Count, Max, Min, Sum, Sum0};
use common::*;

/// The DISTINCT setups tested: argument type, value pool kind (arithmetic or not), aggregates.
fn distinct_combos() -> Vec<(Ty, bool, Vec<AggregateKind>)> {
    vec![
        (Ty::I32, true, vec![Count, Sum, Avg, Count]),
        (Ty::I32, false, vec![Min, Max, Count]),
        (Ty::I8, true, vec![Sum, Avg, Sum0]),
        (Ty::I64, true, vec![Sum, Avg, Count]),
        (Ty::U64, true, vec![Sum, Avg]),
        (Ty::F64, true, vec![Count, Sum, Avg]),
        (Ty::F32, true, vec![Avg, Sum0]),
        (Ty::F64, false, vec![Count, Min, Max]),
        (Ty::Dec(10, 2), true, vec![Sum, Avg, Count]),
        (Ty::Dec(18, 7), true, vec![Avg, Sum0]),
        (Ty::Utf8, false, vec![Count, Min, Max]),
        (Ty::Dict, false, vec![Count, Max, Min, Count]),
        (Ty::LargeUtf8, false, vec![Count, Min]),
        (Ty::Utf8View, false, vec![Max, Count]),
        (Ty::Bool, false, vec![Count, Max, Min]),
        (Ty::Date32, false, vec![Count, Min, Max]),
        // One aggregate: insert-only pairs are bare.
        (Ty::I64, true, vec![Count]),
        (Ty::F64, true, vec![Sum]),
        (Ty::Utf8, false, vec![Count]),
    ]
}

/// Per group: value → one counter per aggregate.
type DModel = Vec<BTreeMap<S, Vec<i64>>>;

/// A batch of rows for a DISTINCT accumulator: one filter per aggregate.
#[derive(Clone, Debug)]
struct DBatch {
    groups: Vec<u32>,
    vals: Vec<Option<S>>,
    filters: Vec<Option<Vec<bool>>>,
}

/// A row as the model keeps it: group, value, and which aggregates selected it.
type DRow = (u32, Option<S>, Vec<bool>);

impl DBatch {
    fn random(pool: &[S], k: usize, total: usize, rng: &mut StdRng) -> Self {
        let b = Batch::random(pool, total, rng);
        let n = b.groups.len();
        DBatch {
            groups: b.groups,
            vals: b.vals,
            filters: (0..k).map(|_| gen_filter(n, rng)).collect(),
        }
    }

    /// `rows` with their selections (or fresh random selections with `fresh`), plus decoy rows no
    /// aggregate selects.
    fn of_rows(
        rows: Vec<DRow>,
        pool: &[S],
        k: usize,
        total: usize,
        fresh: bool,
        rng: &mut StdRng,
    ) -> Self {
        let mut items = rows;
        if fresh {
            for r in &mut items {
                r.2 = (0..k).map(|_| rng.random_bool(0.5)).collect();
            }
        }
        let decoys = if total > 0 { rng.random_range(0..3) } else { 0 };
        for _ in 0..decoys {
            let v = gen_vals(pool, 1, 0.3, rng).remove(0);
            items.push((rng.random_range(0..total) as u32, v, vec![false; k]));
        }
        items.shuffle(rng);
        let filters = (0..k)
            .map(|i| {
                let bits: Vec<bool> = items.iter().map(|r| r.2[i]).collect();
                let all = bits.iter().all(|&b| b);
                (!all || rng.random_bool(0.5)).then_some(bits)
            })
            .collect();
        DBatch {
            groups: items.iter().map(|r| r.0).collect(),
            vals: items.iter().map(|r| r.1.clone()).collect(),
            filters,
        }
    }

    fn rows(&self) -> Vec<DRow> {
        (0..self.groups.len())
            .map(|r| {
                let sel = self
                    .filters
                    .iter()
                    .map(|f| selected(f.as_ref(), r))
                    .collect();
                (self.groups[r], self.vals[r].clone(), sel)
            })
            .collect()
    }

    fn apply(
        &self,
        acc: &mut DistinctAccumulator,
        groups: &[u32],
        ty: Ty,
        total: usize,
        delta: i64,
        rng: &mut StdRng,
    ) {
        let arr = build_sliced(ty, &self.vals, rng);
        let filters: Vec<Option<BooleanBuffer>> = self
            .filters
            .iter()
            .map(|f| f.as_ref().map(|f| sliced_filter(f, rng)))
            .collect();
        let refs: Vec<Option<&BooleanBuffer>> = filters.iter().map(Option::as_ref).collect();
        acc.apply(&arr, groups, &refs, total, delta).unwrap();
    }
}

fn d_model_apply(model: &mut DModel, rows: &[DRow], delta: i64) {
    for (g, v, sel) in rows {
        let Some(v) = v else { continue };
        let counters = model[*g as usize]
            .entry(v.clone())
            .or_insert_with(|| vec![0; sel.len()]);
        for (c, &s) in counters.iter_mut().zip(sel) {
            if s {
                *c += delta;
            }
        }
    }
}

fn check_distinct_eval(
    acc: &DistinctAccumulator,
    model: &DModel,
    ty: Ty,
    kinds: &[AggregateKind],
    rng: &mut StdRng,
    ctx: &str,
) {
    let total = model.len();
    let all: Vec<u32> = (0..total as u32).collect();
    for ids in [all, random_ids(total, rng)] {
        let got = acc.evaluate(&ids).unwrap();
        assert_eq!(got.len(), kinds.len(), "{ctx}: one result per aggregate");
        for (i, (arr, &kind)) in got.iter().zip(kinds).enumerate() {
            assert_eq!(
                arr.data_type(),
                &result_type(kind, Some(&ty.dt())).unwrap(),
                "{ctx}"
            );
            assert_eq!(arr.data_type(), &acc.result_type(i), "{ctx}");
            let want: Vec<Option<S>> = ids
                .iter()
                .map(|&g| {
                    let bag = Bag {
                        rows: 0,
                        vals: model[g as usize]
                            .iter()
                            .filter(|(_, c)| c[i] > 0)
                            .map(|(v, _)| (v.clone(), 1))
                            .collect(),
                    };
                    naive(kind, ty, &bag)
                })
                .collect();
            assert_eq!(
                to_scalars(arr),
                want,
                "{ctx}: aggregate {i} {kind:?} over {ids:?}"
            );
        }
    }
}

fn check_distinct(ty: Ty, arith: bool, kinds: &[AggregateKind], seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let pool = ty.pool(arith);
    let k = kinds.len();
    let retractable = rng.random_bool(0.5) || kinds.iter().any(|k| matches!(k, Min | Max));
    let mut acc = DistinctAccumulator::try_new(&ty.dt(), kinds, retractable).unwrap();
    assert_eq!(acc.num_aggregates(), k);
    let mut model: DModel = vec![];
    let mut applied: Vec<DRow> = vec![];
    let mut total = 0usize;
    for step in 0..14 {
        let ctx = format!("DISTINCT {kinds:?}({ty:?}) seed={seed} step={step}");
        let mut choice = rng.random_range(0..10);
        if !retractable && matches!(choice, 6 | 7 | 9) {
            // Insert-only: a retraction is refused and changes nothing; insert instead.
            if total > 0 {
                let batch = DBatch::random(&pool, k, total, &mut rng);
                let arr = build_sliced(ty, &batch.vals, &mut rng);
                let err = acc
                    .apply(&arr, &batch.groups, &vec![None; k], total, -1)
                    .unwrap_err();
                assert!(err.to_string().contains("cannot retract"), "{ctx}: {err}");
            }
            choice = 0;
        }
        match choice {
            6 | 7 => {
                let fresh = rng.random_bool(0.25);
                let rows = take_random(&mut applied, 0.4, &mut rng);
                let batch = DBatch::of_rows(rows, &pool, k, total, fresh, &mut rng);
                batch.apply(&mut acc, &batch.groups, ty, total, -1, &mut rng);
                d_model_apply(&mut model, &batch.rows(), -1);
            }
            8 => {
                let reset = random_ids(total, &mut rng);
                acc.reset(&reset);
                for &g in &reset {
                    model[g as usize].clear();
                }
                applied.retain(|r| !reset.contains(&r.0));
            }
            9 => {
                let before = acc
                    .evaluate(&(0..total as u32).collect::<Vec<_>>())
                    .unwrap();
                let batch = DBatch::random(&pool, k, total, &mut rng);
                batch.apply(&mut acc, &batch.groups, ty, total, 1, &mut rng);
                batch.apply(&mut acc, &batch.groups, ty, total, -1, &mut rng);
                let after = acc
                    .evaluate(&(0..total as u32).collect::<Vec<_>>())
                    .unwrap();
                for (a, b) in after.iter().zip(&before) {
                    assert_eq!(to_scalars(a), to_scalars(b), "{ctx}: accumulate+retract");
                }
            }
            _ => {
                if rng.random_bool(0.5) || total == 0 {
                    total = total.max(rng.random_range(1..=MAX_GROUPS));
                    model.resize(total, BTreeMap::new());
                }
                let batch = DBatch::random(&pool, k, total, &mut rng);
                batch.apply(&mut acc, &batch.groups, ty, total, 1, &mut rng);
                let rows = batch.rows();
                d_model_apply(&mut model, &rows, 1);
                applied.extend(rows);
            }
        }
        check_distinct_eval(&acc, &model, ty, kinds, &mut rng, &ctx);
        assert!(acc.size() > 0, "{ctx}: size");
    }
}

#[test]
fn distinct_matches_naive_model() {
    for (i, (ty, arith, kinds)) in distinct_combos().into_iter().enumerate() {
        check_distinct(ty, arith, &kinds, combo_seed(51, i));
        check_distinct(ty, arith, &kinds, combo_seed(52, i));
        check_distinct(ty, arith, &kinds, combo_seed(53, i));
    }
}

fn check_distinct_merge(ty: Ty, arith: bool, kinds: &[AggregateKind], seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let pool = ty.pool(arith);
    let k = kinds.len();
    let total = rng.random_range(1..=MAX_GROUPS);
    let dt = ty.dt();
    // Insert-only input half the time: pairs kept without counts, merged the same.
    let retractable = rng.random_bool(0.5);
    let mk = || DistinctAccumulator::try_new(&dt, kinds, retractable).unwrap();
    let (mut whole, mut target, mut part) = (mk(), mk(), mk());
    let local = LocalIds::new(total, &mut rng);
    let mut model: DModel = vec![BTreeMap::new(); total];
    let mut applied: Vec<DRow> = vec![];
    let ctx = format!("DISTINCT merge {kinds:?}({ty:?}) retractable={retractable} seed={seed}");
    // One random step on `whole` and on `target` or `part`: accumulate, retract earlier rows
    // (wherever they went), or reset a group everywhere.
    let step = |whole: &mut DistinctAccumulator,
                target: &mut DistinctAccumulator,
                mut part: Option<&mut DistinctAccumulator>,
                model: &mut DModel,
                applied: &mut Vec<DRow>,
                rng: &mut StdRng| {
        if rng.random_bool(0.1) {
            let g = rng.random_range(0..total) as u32;
            whole.reset(&[g]);
            target.reset(&[g]);
            if let Some(p) = part.as_mut() {
                p.reset(&local.of_global[g as usize]);
            }
            model[g as usize].clear();
            applied.retain(|r| r.0 != g);
            return;
        }
        let retract = retractable && rng.random_bool(0.35) && !applied.is_empty();
        let (batch, delta) = if retract {
            let rows = take_random(applied, 0.4, rng);
            (DBatch::of_rows(rows, &pool, k, total, false, rng), -1)
        } else {
            (DBatch::random(&pool, k, total, rng), 1)
        };
        batch.apply(whole, &batch.groups, ty, total, delta, rng);
        match part {
            Some(p) if rng.random_bool(0.5) => {
                let groups = local.map(&batch.groups, rng);
                batch.apply(p, &groups, ty, local.len(), delta, rng);
            }
            _ => batch.apply(target, &batch.groups, ty, total, delta, rng),
        }
        let rows = batch.rows();
        d_model_apply(model, &rows, delta);
        if !retract {
            applied.extend(rows);
        }
    };
    // Two rounds, as a local phase runs mini-batches: steps, then `part` merged into `target`;
    // between them `part` is cleared (forgets everything, keeps its allocations).
    for round in 0..2 {
        if round == 1 {
            part.clear(local.len());
            assert_eq!(part.entries(), 0, "{ctx}: cleared");
        }
        for _ in 0..8 {
            step(
                &mut whole,
                &mut target,
                Some(&mut part),
                &mut model,
                &mut applied,
                &mut rng,
            );
        }
        let (padded, range, map) = local.merge_plan(&mut rng);
        let state = part.state(&padded).unwrap();
        assert_eq!(state.data_type(), &part.state_type(), "{ctx}: state type");
        assert_eq!(state.len(), padded.len(), "{ctx}: state length");
        let state = state.slice(range.start, range.len());
        target.merge(&state, &map, total).unwrap();
    }
    let all: Vec<u32> = (0..total as u32).collect();
    for (a, b) in target
        .evaluate(&all)
        .unwrap()
        .iter()
        .zip(&whole.evaluate(&all).unwrap())
    {
        assert_eq!(to_scalars(a), to_scalars(b), "{ctx}: merged vs whole");
    }
    check_distinct_eval(&target, &model, ty, kinds, &mut rng, &ctx);
    check_state_chunks(&target, total, &mut rng, &ctx);
    for _ in 0..3 {
        step(
            &mut whole,
            &mut target,
            None,
            &mut model,
            &mut applied,
            &mut rng,
        );
        check_distinct_eval(&target, &model, ty, kinds, &mut rng, &ctx);
        check_distinct_eval(&whole, &model, ty, kinds, &mut rng, &ctx);
    }
}

/// A snapshot's chunks read together are each chunk's state: some of the groups, in a random
/// order, cut into runs of a random length.
fn check_state_chunks(acc: &DistinctAccumulator, total: usize, rng: &mut StdRng, ctx: &str) {
    let mut ids: Vec<u32> = (0..total as u32).filter(|_| rng.random_bool(0.8)).collect();
    ids.shuffle(rng);
    let chunk = rng.random_range(1..=ids.len().max(1));
    let chunks = acc.state_chunks(&ids, chunk).unwrap();
    let each: Vec<_> = ids.chunks(chunk).map(|c| acc.state(c).unwrap()).collect();
    assert_eq!(chunks.len(), each.len(), "{ctx}: chunks");
    for (i, (a, b)) in chunks.iter().zip(&each).enumerate() {
        assert_eq!(
            a.to_data(),
            b.to_data(),
            "{ctx}: chunk {i} of {chunk} groups"
        );
    }
}

#[test]
fn distinct_merge_equals_single_accumulator() {
    for (i, (ty, arith, kinds)) in distinct_combos().into_iter().enumerate() {
        check_distinct_merge(ty, arith, &kinds, combo_seed(61, i));
        check_distinct_merge(ty, arith, &kinds, combo_seed(62, i));
        check_distinct_merge(ty, arith, &kinds, combo_seed(63, i));
    }
}
