use super::*;
use crate::test_rng::XorShift;
use arrow_array::DictionaryArray;

/// Short and long runs, of values of one length and of several (the empty string among
/// them), in sliced arrays: each row's group is the group its value gets alone.
#[test]
fn runs_give_each_row_its_values_group() {
    let pool = [
        "2023-11-14",
        "2023-11-15",
        "2023-11-1",
        "",
        "a",
        "2023-11-14x",
    ];
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    for case in 0..200 {
        let (mut rows, mut n) = (vec![], 0);
        while n < 600 {
            let v = pool[rng.below(if case % 2 == 0 { 2 } else { 6 }) as usize];
            let run = match rng.below(4) {
                0 => 1 + rng.below(3) as usize,
                1 => 60 + rng.below(8) as usize,
                _ => 1 + rng.below(200) as usize,
            };
            rows.extend(std::iter::repeat_n(v, run));
            n += run;
        }
        let all = StringArray::from(rows.clone());
        let skip = rng.below(5) as usize;
        let col: ArrayRef = Arc::new(all.slice(skip, all.len() - skip));
        let mut table = BytesGroupValues::new(DataType::Utf8);
        let mut groups = vec![];
        assert!(table.intern_runs(&col, &mut groups).unwrap());
        let mut alone = BytesGroupValues::new(DataType::Utf8);
        let rs = crate::hash::random_state();
        let want: Vec<u32> = rows[skip..]
            .iter()
            .map(|v| alone.intern_one(v.as_bytes(), crate::hash::hash_bytes(&rs, v.as_bytes())))
            .collect();
        assert_eq!(groups, want, "case {case}");
        assert_eq!(table.len(), alone.len(), "case {case}");
    }
}

/// Every pair of lengths up to 40 and a difference at each position: equal exactly when the
/// bytes are.
#[test]
fn same_bytes_is_byte_equality() {
    let base: Vec<u8> = (0..40u8).map(|i| i.wrapping_mul(37) ^ 0x5a).collect();
    for n in 0..=40 {
        let a = &base[..n];
        assert!(same_bytes(a, a));
        for m in 0..=40 {
            assert_eq!(same_bytes(a, &base[..m]), n == m, "{n} vs {m}");
        }
        for at in 0..n {
            let mut b = a.to_vec();
            b[at] ^= 1;
            assert!(!same_bytes(a, &b), "length {n}, byte {at}");
        }
    }
    assert!(same_value(None, None));
    assert!(!same_value(None, Some(b"")));
    assert!(same_value(Some(b"2015-07-15"), Some(b"2015-07-15")));
}

/// Batches over one dictionary's values (a new array per batch, as a Parquet column chunk's
/// batches are, and slices of one), with NULL keys in some, then another dictionary of as many
/// values in another order, across clears: each row's group is the one its value gets as a
/// plain string, with the row hashes given and without (the cache over a dictionary's values
/// is kept from batch to batch, and must not outlive a clear or serve another dictionary).
#[test]
fn dictionary_batches_take_their_values_groups() {
    use arrow_array::{Int32Array, types::Int32Type};
    let names: Vec<String> = (0..50).map(|i| format!("shop-{i}")).collect();
    let values: ArrayRef = Arc::new(StringArray::from(names.clone()));
    let reversed: ArrayRef = Arc::new(StringArray::from_iter_values(names.iter().rev()));
    let mut rng = XorShift(0x2545_f491_4f6c_dd1d);
    for given_hashes in [false, true] {
        let dt = DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8));
        let mut table = BytesGroupValues::new(dt);
        let mut plain = BytesGroupValues::new(DataType::Utf8);
        for batch in 0..60 {
            let dictionary = if batch % 20 < 12 { &values } else { &reversed };
            let n = 1 + rng.below(400) as usize;
            let spread = if batch % 3 == 0 { 5 } else { 50 };
            let keys: Int32Array = (0..n)
                .map(|_| (batch % 4 != 1 || rng.below(9) != 0).then(|| rng.below(spread) as i32))
                .collect();
            let dict = DictionaryArray::<Int32Type>::try_new(keys, Arc::clone(dictionary)).unwrap();
            let skip = rng.below(3) as usize;
            let col: ArrayRef = Arc::new(dict.slice(skip, n - skip));
            let strings = arrow_cast::cast(&col, &DataType::Utf8).unwrap();
            let intern = |t: &mut BytesGroupValues, c: &ArrayRef| {
                let mut hashes = vec![];
                if given_hashes {
                    crate::hash::hash_columns(std::slice::from_ref(c), &mut hashes).unwrap();
                }
                let mut groups = vec![];
                t.intern(std::slice::from_ref(c), &hashes, &mut groups)
                    .unwrap();
                groups
            };
            let got = intern(&mut table, &col);
            let want = intern(&mut plain, &strings);
            assert_eq!(got, want, "batch {batch}, hashes given: {given_hashes}");
            assert_eq!(table.len(), plain.len());
            if batch % 7 == 6 {
                table.clear();
                plain.clear();
            }
        }
    }
}

/// A clear empties the cache over a dictionary (kept for the dictionary's next batches): the
/// groups are numbered afresh, none taken from the entries found before the clear.
#[test]
fn a_clear_empties_the_dictionary_cache() {
    use arrow_array::{Int32Array, types::Int32Type};
    let values: ArrayRef = Arc::new(StringArray::from(vec!["a", "b", "c"]));
    let dict = |keys: Vec<i32>| -> ArrayRef {
        Arc::new(
            DictionaryArray::<Int32Type>::try_new(Int32Array::from(keys), Arc::clone(&values))
                .unwrap(),
        )
    };
    let dt = DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8));
    let mut table = BytesGroupValues::new(dt);
    let mut groups = vec![];
    for _ in 0..2 {
        table
            .intern(&[dict(vec![2, 0, 2])], &[], &mut groups)
            .unwrap();
        assert_eq!(groups, [0, 1, 0]);
        table.clear();
        table
            .intern(&[dict(vec![0, 1, 2, 0])], &[], &mut groups)
            .unwrap();
        assert_eq!(groups, [0, 1, 2, 0]);
        table
            .intern(&[dict(vec![1, 1, 0])], &[], &mut groups)
            .unwrap();
        assert_eq!(groups, [1, 1, 0]);
        let keys = table.keys(&[0, 1, 2]).unwrap();
        let keys = arrow_cast::cast(&keys[0], &DataType::Utf8).unwrap();
        let keys = keys.as_string::<i32>();
        assert_eq!(
            keys.iter().collect::<Vec<_>>(),
            [Some("a"), Some("b"), Some("c")]
        );
        table.clear();
    }
}

/// The keys of any list of groups (runs of consecutive groups, groups out of order, repeated,
/// the NULL group among them) are the groups' own values, row for row; a group past the table
/// is an error.
#[test]
fn keys_are_each_groups_value() {
    let values: Vec<Option<String>> = (0..40)
        .map(|i| (i != 17).then(|| "k".repeat(i % 7) + &i.to_string()))
        .collect();
    let col: ArrayRef = Arc::new(StringArray::from(values.clone()));
    let mut table = BytesGroupValues::new(DataType::Utf8);
    let mut hashes = vec![];
    crate::hash::hash_columns(std::slice::from_ref(&col), &mut hashes).unwrap();
    let mut groups = vec![];
    table
        .intern(std::slice::from_ref(&col), &hashes, &mut groups)
        .unwrap();
    assert_eq!(groups, (0..40).collect::<Vec<u32>>());
    let mut rng = XorShift(0x2545_f491_4f6c_dd1d);
    for case in 0..100 {
        let mut ids = vec![];
        while ids.len() < 60 {
            let start = rng.below(40) as u32;
            let run = 1 + rng.below(if case % 2 == 0 { 3 } else { 12 }) as u32;
            ids.extend((start..(start + run).min(40)).rev().take(if case % 3 == 0 {
                1
            } else {
                40
            }));
            ids.extend(start..(start + run).min(40));
        }
        let keys = table.keys(&ids).unwrap();
        let keys = keys[0].as_string::<i32>();
        let got: Vec<Option<&str>> = keys.iter().collect();
        let want: Vec<Option<&str>> = ids.iter().map(|&g| values[g as usize].as_deref()).collect();
        assert_eq!(got, want, "case {case}");
    }
    assert!(table.keys(&[3, 40]).is_err());
}
