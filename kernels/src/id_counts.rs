//! Counting small dense ids (a flush's (worker, key) places, a list column's rows): how many
//! times each comes, where consecutive ids mostly repeat.

/// The most ids [`count_ids`] counts in one pass over `ids` per id.
const PASSES_MAX_IDS: usize = 8;

/// The most ids [`count_ids`] counts in four lanes.
const LANES_MAX_IDS: usize = 256;

/// Adds to `counts[a]` one for each id `a` in `ids` (each below `counts.len()`). Where the ids
/// are few (one hot key's places or rows) consecutive ones mostly repeat, and one running count
/// would wait on each increment's store: a handful are counted one pass each (a comparison and
/// a sum the compiler vectorizes), a few more in four lanes, many one by one.
pub fn count_ids(ids: &[u32], counts: &mut [u64]) {
    let m = counts.len();
    if m <= PASSES_MAX_IDS {
        for (id, c) in counts.iter_mut().enumerate() {
            let id = id as u32;
            *c += ids.iter().map(|&a| u64::from(a == id)).sum::<u64>();
        }
        return;
    }
    if m > LANES_MAX_IDS {
        // Many ids: consecutive ones seldom repeat.
        for &a in ids {
            counts[a as usize] += 1;
        }
        return;
    }
    let mut lanes = vec![0u32; 4 * m];
    let mut quads = ids.chunks_exact(4);
    for q in &mut quads {
        lanes[q[0] as usize] += 1;
        lanes[m + q[1] as usize] += 1;
        lanes[2 * m + q[2] as usize] += 1;
        lanes[3 * m + q[3] as usize] += 1;
    }
    for &a in quads.remainder() {
        lanes[a as usize] += 1;
    }
    for (i, c) in counts.iter_mut().enumerate() {
        *c += (0..4).map(|l| u64::from(lanes[l * m + i])).sum::<u64>();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_rng::XorShift;

    /// Counted a pass per id (a handful), in lanes (a few) or one by one (many), every id gets
    /// one count per time it comes, remainders past the last four included, on top of what it
    /// held.
    #[test]
    fn ids_are_counted_once_each_time_they_come() {
        let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
        for m in [1usize, 2, 3, 17, LANES_MAX_IDS, LANES_MAX_IDS + 1, 5000] {
            for len in [0usize, 1, 3, 4, 5, 1031] {
                let ids: Vec<u32> = (0..len).map(|_| rng.below(m as u64) as u32).collect();
                let before: Vec<u64> = (0..m).map(|_| rng.below(5)).collect();
                let mut want = before.clone();
                for &a in &ids {
                    want[a as usize] += 1;
                }
                let mut counts = before;
                count_ids(&ids, &mut counts);
                assert_eq!(counts, want, "{m} ids, {len} of them");
            }
        }
    }
}
