//! Tests of the numeric accumulators.

use super::*;
use crate::test_rng::XorShift;

/// SUM over a column whose NULL slots hold arbitrary values, with NULLs rare (every row
/// added and the NULL rows taken back), common and absent, over few groups (lanes) and many,
/// with updates and retractions: the sums and counts are those of the valid rows alone.
#[test]
fn a_sum_skips_the_values_under_nulls() {
    let mut rng = XorShift(0x2545_f491_4f6c_dd1d);
    for (groups, null_per_mille) in [
        (3u32, 5u64),
        (3, 0),
        (3, 400),
        (5000, 5),
        (5000, 400),
        (1, 5),
    ] {
        let mut acc = SumAccumulator::new(Sum::<Int64Type>::new(DataType::Int64, false));
        let mut want = vec![(0i64, 0i64); groups as usize];
        for pass in 0..6 {
            // Lengths that leave 0 to 3 rows past the last four (a pass in lanes takes four
            // rows at a time).
            let rows = 3000 + pass;
            let ids: Vec<u32> = (0..rows).map(|_| rng.below(groups.into()) as u32).collect();
            let vals: Vec<i64> = (0..rows).map(|_| rng.next() as i64).collect();
            let valid: Vec<bool> = (0..rows)
                .map(|_| rng.below(1000) >= null_per_mille)
                .collect();
            let arr: ArrayRef = Arc::new(Int64Array::new(
                vals.clone().into(),
                Some(NullBuffer::from(valid.clone())),
            ));
            let retract = pass % 3 == 2;
            let total = groups as usize;
            if retract {
                acc.retract(&[arr], &ids, None, total).unwrap();
            } else {
                acc.update(&[arr], &ids, None, total).unwrap();
            }
            for r in (0..rows).filter(|&r| valid[r]) {
                let (s, c) = &mut want[ids[r] as usize];
                let (v, d) = if retract {
                    (vals[r].wrapping_neg(), -1)
                } else {
                    (vals[r], 1)
                };
                *s = s.wrapping_add(v);
                *c += d;
            }
        }
        let got: Vec<(i64, i64)> = (0..groups as usize).map(|g| acc.get(g)).collect();
        assert_eq!(
            got, want,
            "{groups} groups, {null_per_mille} NULLs per 1,000"
        );
    }
}

/// SUM, $SUM0 and AVG results over groups asked in any order, repeated, and past the groups
/// ever seen: a SUM or AVG of a group without values (never given one, or every value
/// retracted) is NULL at its own row and only there, a $SUM0 is its sum (0 without values);
/// results without a NULL carry no validity.
#[test]
fn results_are_null_exactly_where_a_group_has_no_values() {
    let vals: ArrayRef = Arc::new(Int64Array::from(vec![5, 7, -3, 11, 2, 40]));
    let ids = [0u32, 2, 2, 3, 5, 5];
    // Group 3's only value is retracted again; groups 1 and 4 never get one.
    let gone: ArrayRef = Arc::new(Int64Array::from(vec![11]));
    let fill = |acc: &mut dyn GroupsAccumulator| {
        acc.update(&[Arc::clone(&vals)], &ids, None, 6).unwrap();
        acc.retract(&[Arc::clone(&gone)], &[3], None, 6).unwrap();
    };
    let asked = [4u32, 0, 3, 2, 1, 5, 0, 9];
    let results = |acc: &dyn GroupsAccumulator, groups: &[u32]| {
        let a = acc.evaluate(groups).unwrap();
        let a = a.as_primitive::<Int64Type>();
        (a.iter().collect::<Vec<_>>(), a.nulls().is_some())
    };
    let mut sum = SumAccumulator::new(Sum::<Int64Type>::new(DataType::Int64, false));
    fill(&mut sum);
    let want = vec![None, Some(5), None, Some(4), None, Some(42), Some(5), None];
    assert_eq!(results(&sum, &asked), (want, true));
    assert_eq!(
        results(&sum, &[5, 0, 2]),
        (vec![Some(42), Some(5), Some(4)], false)
    );
    let mut sum0 = SumAccumulator::new(Sum::<Int64Type>::new(DataType::Int64, true));
    fill(&mut sum0);
    let want = [0, 5, 0, 4, 0, 42, 5, 0].map(Some).to_vec();
    assert_eq!(results(&sum0, &asked), (want, false));
    let mut avg = SumAccumulator::new(Avg::<Int64Type>::new(DataType::Int64));
    fill(&mut avg);
    let want = vec![None, Some(5), None, Some(2), None, Some(21), Some(5), None];
    assert_eq!(results(&avg, &asked), (want, true));
}
