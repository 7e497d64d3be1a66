//! The values a batch made its groups gain or lose, handed on to the inner aggregates: where an
//! inner aggregate is a COUNT, straight into its counts; otherwise as a mask over the batch.

use arrow_array::ArrayRef;
use arrow_buffer::BooleanBufferBuilder;
use arrow_schema::ArrowError;

use super::DistinctAccumulator;

/// The rows of one call's batch whose value its group gained or lost, per inner aggregate:
/// `rows[2 * i]` gained for aggregate `i`, `rows[2 * i + 1]` lost. Kept between calls (scratch).
#[derive(Debug, Default)]
pub(super) struct Flips {
    rows: Vec<Vec<u32>>,
}

impl Flips {
    /// Empty lists for `k` aggregates.
    pub(super) fn clear(&mut self, k: usize) {
        self.rows.resize_with(2 * k, Vec::new);
        self.rows.iter_mut().for_each(Vec::clear);
    }

    /// Row `row`'s value became one of its group's for aggregate `i`.
    #[inline(always)]
    pub(super) fn gain(&mut self, i: usize, row: usize) {
        self.rows[2 * i].push(row as u32);
    }

    /// Row `row`'s value stopped being one of its group's for aggregate `i`.
    #[inline(always)]
    pub(super) fn loss(&mut self, i: usize, row: usize) {
        self.rows[2 * i + 1].push(row as u32);
    }

    /// Bytes held, from capacity.
    pub(super) fn size(&self) -> usize {
        self.rows.iter().map(|r| r.capacity() * 4).sum::<usize>()
            + self.rows.capacity() * std::mem::size_of::<Vec<u32>>()
    }
}

impl DistinctAccumulator {
    /// Hands `flips` (rows of the batch whose `values` are in `groups`) to the inner aggregates:
    /// a COUNT's counts move by one a row, any other aggregate takes the gained rows' values as
    /// an update and the lost rows' as a retraction, in row order.
    pub(super) fn apply_flips(
        &mut self,
        flips: &Flips,
        values: &ArrayRef,
        groups: &[u32],
        total_groups: usize,
    ) -> Result<(), ArrowError> {
        let n = groups.len();
        let values = std::slice::from_ref(values);
        for (inner, rows) in self.inners.iter_mut().zip(flips.rows.chunks_exact(2)) {
            let (gained, lost) = (&rows[0], &rows[1]);
            if gained.is_empty() && lost.is_empty() {
                continue;
            }
            if let Some(counts) = inner.counts_mut(total_groups) {
                for &r in gained {
                    counts[groups[r as usize] as usize] += 1;
                }
                for &r in lost {
                    counts[groups[r as usize] as usize] -= 1;
                }
                continue;
            }
            if !gained.is_empty() {
                inner.update(values, groups, Some(&mask(gained, n)), total_groups)?;
            }
            if !lost.is_empty() {
                inner.retract(values, groups, Some(&mask(lost, n)), total_groups)?;
            }
        }
        Ok(())
    }
}

/// A mask of `n` rows with `rows` set.
fn mask(rows: &[u32], n: usize) -> arrow_buffer::BooleanBuffer {
    let mut b = BooleanBufferBuilder::new(n);
    b.append_n(n, false);
    for &r in rows {
        b.set_bit(r as usize, true);
    }
    b.finish()
}
