//! Property tests for `tally_kernels::hash`: equal keys give equal hashes (dictionaries as
//! their values, one or several columns), and `bucket_array`.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use arrow_array::{Array, ArrayRef, Int32Array, Int64Array};
use rand::SeedableRng;
use rand::rngs::StdRng;
use tally_kernels::hash::hash_columns;

use common::*;

#[test]
fn hash_equal_keys_give_equal_hashes() {
    for (li, tys) in key_layouts().into_iter().enumerate() {
        let mut rng = StdRng::seed_from_u64(combo_seed(11, li));
        let mut seen: BTreeMap<Vec<Option<S>>, u64> = BTreeMap::new();
        let mut hashes = vec![7u64; 3];
        for b in 0..8 {
            let (vals, arrays) = random_keys(&tys, &mut rng);
            let n = arrays[0].len();
            hash_columns(&arrays, &mut hashes).unwrap();
            assert_eq!(hashes.len(), n, "{tys:?} batch {b}: one hash per row");
            for (i, &h) in hashes.iter().enumerate() {
                let key = row_key(&vals, i);
                let prev = *seen.entry(key.clone()).or_insert(h);
                assert_eq!(prev, h, "{tys:?} batch {b}: key {key:?} hashed differently");
            }
        }
        // Not a requirement, but a hash that maps many keys to one value would hide bugs.
        let distinct: BTreeSet<u64> = seen.values().copied().collect();
        assert!(
            distinct.len() * 10 >= seen.len() * 9,
            "{tys:?}: {} keys but only {} hashes",
            seen.len(),
            distinct.len()
        );
    }
}

#[test]
fn hash_dictionary_equals_plain_utf8() {
    let mut rng = StdRng::seed_from_u64(12);
    let pool = Ty::Utf8.pool(false);
    let int_pool = Ty::I64.pool(false);
    for _ in 0..30 {
        let n = batch_len(&mut rng);
        let rate = null_rate(&mut rng);
        let vals = gen_vals(&pool, n, rate, &mut rng);
        let ints = gen_vals(&int_pool, n, 0.2, &mut rng);
        let plain = build_sliced(Ty::Utf8, &vals, &mut rng);
        let dict = build_sliced(Ty::Dict, &vals, &mut rng);
        let other = build_sliced(Ty::I64, &ints, &mut rng);
        let (mut hp, mut hd) = (vec![], vec![1, 2, 3]);
        hash_columns(std::slice::from_ref(&plain), &mut hp).unwrap();
        hash_columns(std::slice::from_ref(&dict), &mut hd).unwrap();
        assert_eq!(hp.len(), n);
        assert_eq!(hp, hd, "dictionary vs plain: {vals:?}");
        hash_columns(&[other.clone(), plain.clone()], &mut hp).unwrap();
        hash_columns(&[other.clone(), dict.clone()], &mut hd).unwrap();
        assert_eq!(hp, hd, "(Int64, dictionary) vs (Int64, plain)");
        hash_columns(&[dict, other.clone()], &mut hd).unwrap();
        hash_columns(&[plain, other], &mut hp).unwrap();
        assert_eq!(hp, hd, "(dictionary, Int64) vs (plain, Int64)");
    }
}

#[test]
fn hash_columns_shape() {
    let a: ArrayRef = Arc::new(Int32Array::from(vec![1, 2, 3]));
    let b: ArrayRef = Arc::new(Int32Array::from(vec![1, 2]));
    let mut out = vec![9; 10];
    hash_columns(std::slice::from_ref(&a), &mut out).unwrap();
    assert_eq!(out.len(), 3);
    assert!(
        hash_columns(&[a.clone(), b], &mut out).is_err(),
        "columns of different lengths"
    );
    hash_columns(&[a.slice(3, 0)], &mut out).unwrap();
    assert!(out.is_empty(), "an empty batch gives no hashes");
    // Column order matters for multi-column keys: (1, 2) and (2, 1) should (almost surely) differ.
    let x: ArrayRef = Arc::new(Int32Array::from(vec![1, 2]));
    let y: ArrayRef = Arc::new(Int32Array::from(vec![2, 1]));
    hash_columns(&[x.clone(), y.clone()], &mut out).unwrap();
    assert_ne!(out[0], out[1]);
    // The first column's hashes known beforehand: the same hashes as all columns at once.
    let mut first = vec![];
    hash_columns(std::slice::from_ref(&x), &mut first).unwrap();
    let mut after = vec![];
    tally_kernels::hash::hash_columns_after(&first, std::slice::from_ref(&y), &mut after).unwrap();
    assert_eq!(after, out);
    assert!(
        tally_kernels::hash::hash_columns_after(&first, &[a], &mut after).is_err(),
        "columns of different lengths"
    );
}

#[test]
fn buckets_are_in_range_equal_for_equal_values_and_null_for_null() {
    use tally_kernels::hash::bucket_array;
    let mut rng = StdRng::seed_from_u64(91);
    for ty in [Ty::I64, Ty::Utf8, Ty::F64, Ty::Bool] {
        let pool = ty.pool(false);
        let vals = gen_vals(&pool, 500, 0.1, &mut rng);
        let arr = build(ty, &vals, &mut rng);
        for buckets in [1u32, 7, 1024] {
            let b = bucket_array(&arr, buckets).unwrap();
            assert_eq!(b.len(), vals.len());
            let mut seen: BTreeMap<S, i32> = BTreeMap::new();
            for (i, v) in vals.iter().enumerate() {
                match v {
                    None => assert!(b.is_null(i), "{ty:?}: NULL value, bucket {:?}", b.value(i)),
                    Some(v) => {
                        let x = b.value(i);
                        assert!((0..buckets as i32).contains(&x), "{ty:?}: bucket {x}");
                        assert_eq!(*seen.entry(v.clone()).or_insert(x), x, "{ty:?}: {v:?}");
                    }
                }
            }
            if buckets == 1024 && ty != Ty::Bool {
                let distinct: BTreeSet<i32> = seen.values().copied().collect();
                assert!(
                    distinct.len() > seen.len().min(1024) / 4,
                    "{ty:?}: buckets spread"
                );
            }
        }
    }
    assert!(bucket_array(&(Arc::new(Int64Array::from(vec![1])) as ArrayRef), 0).is_err());
}
