//! Tests of the numeric accumulators.

use super::*;
use crate::test_rng::XorShift;

/// SUM over a column whose NULL slots hold arbitrary values, with NULLs rare (every row
/// added and the NULL rows taken back) and common, over few groups (lanes) and many, with
/// updates and retractions: the sums and counts are those of the valid rows alone.
#[test]
fn a_sum_skips_the_values_under_nulls() {
    let mut rng = XorShift(0x2545_f491_4f6c_dd1d);
    for (groups, null_per_mille) in [(3u32, 5u64), (3, 400), (5000, 5), (5000, 400), (1, 5)] {
        let mut acc = SumAccumulator::new(Sum::<Int64Type>::new(DataType::Int64, false));
        let mut want = vec![(0i64, 0i64); groups as usize];
        for pass in 0..6 {
            let rows = 3000;
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
