//! Property tests for `tally_kernels::group_values`: interning keys of every type, one or
//! several columns, round trips through `keys`, `clear`, and float keys by bit pattern.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_array::{ArrayRef, BooleanArray};
use arrow_schema::DataType;
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use tally_kernels::group_values::new_group_values;
use tally_kernels::hash::hash_columns;

use common::*;

/// Compares a key column with the values it should hold, as arrays (dictionaries compared through
/// their values) and as scalars.
fn assert_key_column(got: &ArrayRef, ty: Ty, want: &[Option<S>], rng: &mut StdRng, ctx: &str) {
    assert_eq!(got.data_type(), &ty.dt(), "{ctx}: key type");
    assert_eq!(got.len(), want.len(), "{ctx}: key length");
    let expected = build(ty, want, rng);
    if ty == Ty::Dict {
        let got = arrow_cast::cast(got, &DataType::Utf8).unwrap();
        let expected = arrow_cast::cast(&expected, &DataType::Utf8).unwrap();
        assert_eq!(&got, &expected, "{ctx}: keys as arrays");
    } else {
        assert_eq!(got, &expected, "{ctx}: keys as arrays");
    }
    assert_eq!(to_scalars(got), want, "{ctx}: keys as values");
}

fn check_interning(tys: &[Ty], seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let dts: Vec<DataType> = tys.iter().map(|t| t.dt()).collect();
    let mut table = new_group_values(&dts).unwrap();
    assert!(table.is_empty());
    let mut ids: BTreeMap<Vec<Option<S>>, u32> = BTreeMap::new();
    let mut by_id: Vec<Vec<Option<S>>> = vec![];
    let (mut hashes, mut groups) = (vec![], vec![5u32; 4]);
    let mut last_size = table.size();
    for b in 0..10 {
        let ctx = format!("keys {tys:?} seed {seed} batch {b}");
        if b == 5 {
            // `clear` forgets every group but keeps the allocations: ids restart at 0.
            table.clear();
            ids.clear();
            by_id.clear();
            assert!(table.is_empty(), "{ctx}: cleared");
        }
        let (vals, arrays) = random_keys(tys, &mut rng);
        let n = arrays[0].len();
        hash_columns(&arrays, &mut hashes).unwrap();
        // A table that hashes its keys itself is given no row hashes every other batch: its
        // groups and their hashes are the same.
        let given: &[u64] = if table.hashes_keys_itself() && b % 2 == 1 {
            &[]
        } else {
            &hashes
        };
        table.intern(&arrays, given, &mut groups).unwrap();
        assert_eq!(groups.len(), n, "{ctx}: one id per row");
        assert_eq!(
            table.hashes().len(),
            table.len(),
            "{ctx}: one hash per group"
        );
        for (i, &g) in groups.iter().enumerate() {
            assert_eq!(
                table.hashes()[g as usize],
                hashes[i],
                "{ctx}: row {i}'s group hash"
            );
        }
        for (i, &g) in groups.iter().enumerate() {
            let key = row_key(&vals, i);
            let want = *ids.entry(key.clone()).or_insert_with(|| {
                by_id.push(key.clone());
                (by_id.len() - 1) as u32
            });
            assert_eq!(g, want, "{ctx}: row {i} key {key:?}");
        }
        assert_eq!(table.len(), by_id.len(), "{ctx}: len");
        assert_eq!(table.is_empty(), by_id.is_empty(), "{ctx}: is_empty");
        let size = table.size();
        assert!(
            size >= last_size,
            "{ctx}: size shrank from {last_size} to {size}"
        );
        assert!(by_id.is_empty() || size > 0, "{ctx}: size 0 with groups");
        last_size = size;

        // Round trip: every id, shuffled, plus a random list with duplicates.
        let mut all: Vec<u32> = (0..by_id.len() as u32).collect();
        all.shuffle(&mut rng);
        for list in [all, random_ids(by_id.len(), &mut rng)] {
            let keys = table.keys(&list).unwrap();
            assert_eq!(keys.len(), tys.len(), "{ctx}: key column count");
            for (c, (&ty, col)) in tys.iter().zip(&keys).enumerate() {
                let want: Vec<Option<S>> =
                    list.iter().map(|&g| by_id[g as usize][c].clone()).collect();
                assert_key_column(col, ty, &want, &mut rng, &format!("{ctx} column {c}"));
            }
        }
        assert!(
            table.keys(&[by_id.len() as u32]).is_err(),
            "{ctx}: keys of an id out of range"
        );
    }
}

#[test]
fn interning_single_column_round_trips() {
    for (i, &ty) in ALL_TYPES.iter().enumerate() {
        check_interning(&[ty], combo_seed(21, i));
        check_interning(&[ty], combo_seed(22, i));
    }
}

#[test]
fn interning_multi_column_round_trips() {
    for (i, tys) in key_layouts()
        .into_iter()
        .enumerate()
        .filter(|(_, t)| t.len() > 1)
    {
        check_interning(&tys, combo_seed(23, i));
        check_interning(&tys, combo_seed(24, i));
    }
}

#[test]
fn interning_special_floats_by_bit_pattern() {
    // -0.0 and 0.0 are different keys, NaN equals itself; NULL is a key of its own.
    for ty in [Ty::F32, Ty::F64] {
        for multi in [false, true] {
            let mut rng = StdRng::seed_from_u64(25);
            let vals: Vec<Option<S>> = [
                Some(-0.0),
                Some(0.0),
                Some(f64::NAN),
                None,
                Some(0.0),
                Some(f64::NAN),
                Some(-0.0),
                None,
            ]
            .into_iter()
            .map(|v| v.map(S::F))
            .collect();
            let mut cols = vec![build_sliced(ty, &vals, &mut rng)];
            let mut types = vec![ty.dt()];
            if multi {
                cols.push(Arc::new(BooleanArray::from(vec![true; 8])));
                types.push(DataType::Boolean);
            }
            let mut table = new_group_values(&types).unwrap();
            let (mut h, mut g) = (vec![], vec![]);
            hash_columns(&cols, &mut h).unwrap();
            table.intern(&cols, &h, &mut g).unwrap();
            assert_eq!(g, vec![0, 1, 2, 3, 1, 2, 0, 3], "{ty:?} multi {multi}");
            let keys = table.keys(&[0, 1, 2, 3]).unwrap();
            assert_key_column(
                &keys[0],
                ty,
                &vals[..4],
                &mut rng,
                &format!("{ty:?} multi {multi}"),
            );
        }
    }
}

#[test]
fn interning_without_keys_is_one_group() {
    let mut table = new_group_values(&[]).unwrap();
    let mut groups = vec![3];
    table.intern(&[], &[], &mut groups).unwrap();
    assert!(groups.is_empty());
    assert_eq!(table.len(), 0, "an empty batch creates no group");
    table.intern(&[], &[1, 2, 3], &mut groups).unwrap();
    assert_eq!(groups, vec![0, 0, 0]);
    assert_eq!(table.len(), 1);
    assert!(table.keys(&[0, 0]).unwrap().is_empty());
    assert!(table.keys(&[1]).is_err());
}
