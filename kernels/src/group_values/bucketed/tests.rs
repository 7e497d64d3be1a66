use super::*;
use crate::group_values::new_group_values;
use arrow_array::StringArray;

use crate::test_rng::XorShift as Rng;

/// How a batch's bucket columns are filled.
#[derive(Clone, Copy, Debug)]
enum Shape {
    /// An Expand's group set: column `j` set (None: all NULL), the others NULL.
    Set(Option<usize>),
    /// Each value set or NULL at random, some out of `0..buckets`.
    Mixed,
}

/// A batch of `n` rows: a string prefix of few values (NULL among them; with `one_day`, one of
/// them in every row) and `m` bucket columns.
fn batch(
    rng: &mut Rng,
    n: usize,
    m: usize,
    buckets: u32,
    shape: Shape,
    one_day: bool,
) -> Vec<ArrayRef> {
    let fixed = one_day.then(|| rng.below(6));
    let days: Vec<Option<String>> = (0..n)
        .map(|_| match fixed.unwrap_or_else(|| rng.below(6)) {
            0 => None,
            d => Some(format!("day-{d}")),
        })
        .collect();
    let mut cols: Vec<ArrayRef> = vec![Arc::new(StringArray::from(days))];
    for j in 0..m {
        let values: Vec<Option<i32>> = (0..n)
            .map(|_| match shape {
                Shape::Set(s) if s == Some(j) => Some(match rng.below(16) {
                    0 => -(rng.below(3) as i32) - 1,
                    1 => buckets as i32 + rng.below(3) as i32,
                    _ => rng.below(u64::from(buckets)) as i32,
                }),
                Shape::Set(_) => None,
                Shape::Mixed => match rng.below(8) {
                    0 | 1 => None,
                    2 => Some(-(rng.below(5) as i32) - 1),
                    3 => Some(buckets as i32 + rng.below(3) as i32),
                    _ => Some(rng.below(u64::from(buckets)) as i32),
                },
            })
            .collect();
        cols.push(Arc::new(Int32Array::from(values)));
    }
    cols
}

/// Interns `cols` into both tables (the bucketed one with the row hashes, or without when
/// `hashed` is false) and checks that they group the rows alike (one bucketed group per generic
/// group, and back) and that the bucketed table's keys and their hashes are the rows'.
fn check_alike(
    bucketed: &mut BucketedGroupValues,
    generic: &mut dyn GroupValues,
    cols: &[ArrayRef],
    pairs: &mut std::collections::HashMap<u32, u32>,
    hashed: bool,
) {
    let mut hashes = vec![];
    crate::hash::hash_columns(cols, &mut hashes).unwrap();
    let (mut mine, mut want) = (vec![], vec![]);
    let given = if hashed { &hashes[..] } else { &[] };
    bucketed.intern(cols, given, &mut mine).unwrap();
    generic.intern(cols, &hashes, &mut want).unwrap();
    for (&b, &g) in mine.iter().zip(&want) {
        assert_eq!(*pairs.entry(g).or_insert(b), b, "generic group {g}");
    }
    let distinct: std::collections::HashSet<u32> = pairs.values().copied().collect();
    assert_eq!(distinct.len(), pairs.len(), "two keys share a group");
    assert_eq!(bucketed.len(), generic.len());
    // Each group's key, read back and interned again, is the generic table's same group, and
    // its hash is the one its rows had.
    let ids: Vec<u32> = (0..bucketed.len() as u32).collect();
    let keys = bucketed.keys(&ids).unwrap();
    let mut again = vec![];
    crate::hash::hash_columns(&keys, &mut hashes).unwrap();
    assert_eq!(hashes, bucketed.hashes());
    generic.intern(&keys, &hashes, &mut again).unwrap();
    let back: std::collections::HashMap<u32, u32> = pairs.iter().map(|(&g, &b)| (b, g)).collect();
    for (b, g) in again.iter().enumerate() {
        assert_eq!(back[&(b as u32)], *g, "bucketed group {b}");
    }
}

/// Randomized batches of every shape, the group sets of one Expand sharing their prefix column
/// (of one value or several, buckets in and out of the blocks), against the generic table of
/// the same types; cleared now and then, as a local phase does.
#[test]
fn groups_rows_as_the_generic_table_does() {
    for (seed, m, buckets) in [(1u64, 1usize, 16u32), (2, 2, 64), (3, 3, 5), (4, 2, 1)] {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ seed);
        let mut types = vec![DataType::Utf8];
        types.extend(std::iter::repeat_n(DataType::Int32, m));
        let mut bucketed = BucketedGroupValues::try_new(&types[..1], m, buckets).unwrap();
        let mut generic = new_group_values(&types).unwrap();
        let mut pairs = std::collections::HashMap::new();
        for round in 0..40 {
            if round % 13 == 12 {
                bucketed.clear();
                generic.clear();
                pairs.clear();
                assert!(bucketed.is_empty());
            }
            let n = rng.below(200) as usize;
            if round % 3 == 0 {
                check_alike(
                    &mut bucketed,
                    generic.as_mut(),
                    &batch(&mut rng, n, m, buckets, Shape::Mixed, false),
                    &mut pairs,
                    round % 2 == 0,
                );
                continue;
            }
            // An Expand: one batch per set over the same prefix array (every other time one
            // prefix value throughout, as a day is), then the all-NULL set.
            let one_day = round % 2 == 1;
            let first = batch(&mut rng, n, m, buckets, Shape::Set(Some(0)), one_day);
            for s in (0..m).map(Some).chain([None]) {
                let mut cols = batch(&mut rng, n, m, buckets, Shape::Set(s), false);
                cols[0] = Arc::clone(&first[0]);
                check_alike(
                    &mut bucketed,
                    generic.as_mut(),
                    &cols,
                    &mut pairs,
                    round % 2 == 0,
                );
            }
        }
    }
}

/// Past [`MAX_BLOCK_ENTRIES`], new (prefix, set) pairs go to the hash table, and the keys of
/// pairs that have a block keep finding it.
#[test]
fn keys_past_the_block_limit_are_hashed() {
    let buckets = (MAX_BLOCK_ENTRIES / 3 + 1) as u32;
    let types = [DataType::Int64, DataType::Int32];
    let mut bucketed = BucketedGroupValues::try_new(&types[..1], 1, buckets).unwrap();
    let mut generic = new_group_values(&types).unwrap();
    let mut pairs = std::collections::HashMap::new();
    for round in 0..3 {
        // Prefixes 0..5, each with a set bucket: blocks for the first two only.
        let prefix: ArrayRef = Arc::new(arrow_array::Int64Array::from(
            (0..50).map(|i| (i + round) % 5).collect::<Vec<i64>>(),
        ));
        let values: ArrayRef = Arc::new(Int32Array::from(
            (0..50).map(|i| (i * 7919) % 97).collect::<Vec<i32>>(),
        ));
        check_alike(
            &mut bucketed,
            generic.as_mut(),
            &[prefix, values],
            &mut pairs,
            round != 1,
        );
    }
    assert!(bucketed.blocks.len() <= MAX_BLOCK_ENTRIES);
    assert!(!bucketed.map.is_empty(), "some keys were hashed");
}

/// A table without prefix columns (a split global aggregate), and the errors.
#[test]
fn no_prefix_and_bad_input() {
    let mut bucketed = BucketedGroupValues::try_new(&[], 2, 8).unwrap();
    let mut generic = new_group_values(&[DataType::Int32, DataType::Int32]).unwrap();
    let mut pairs = std::collections::HashMap::new();
    let mut rng = Rng(7);
    for shape in [Shape::Set(Some(1)), Shape::Set(None), Shape::Mixed] {
        let mut cols = batch(&mut rng, 100, 2, 8, shape, false);
        cols.remove(0);
        check_alike(&mut bucketed, generic.as_mut(), &cols, &mut pairs, false);
    }
    let wrong: ArrayRef = Arc::new(arrow_array::Int64Array::from(vec![1, 2]));
    let err = bucketed
        .intern(&[Arc::clone(&wrong), wrong], &[0, 0], &mut vec![])
        .unwrap_err();
    assert!(
        err.to_string().contains("bucket column 0 is Int64"),
        "{err}"
    );
    assert!(BucketedGroupValues::try_new(&[], 0, 8).is_err());
    assert!(BucketedGroupValues::try_new(&[], 9, 8).is_err());
    assert!(BucketedGroupValues::try_new(&[DataType::Int32], 1, 0).is_err());
}
