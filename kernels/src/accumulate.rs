//! The one loop every accumulator runs: visit the rows that count.
//!
//! A row counts when its value is not NULL and the filter (if any) selects it. Which of the four
//! (nulls × filter) cases applies is decided once per batch; the selected rows are then walked
//! with bit iterators that read validity 64 bits at a time.

use arrow_buffer::{BooleanBuffer, NullBuffer};

/// Calls `f(row, group)` for every row `row` whose value is valid in `nulls` and that `filter`
/// selects, in row order. `groups[row]` is the row's group id.
///
/// `nulls` and `filter`, when given, must be as long as `groups`.
#[inline(always)]
pub fn for_each_selected<F: FnMut(usize, u32)>(
    groups: &[u32],
    nulls: Option<&NullBuffer>,
    filter: Option<&BooleanBuffer>,
    mut f: F,
) {
    let nulls = nulls.filter(|n| n.null_count() > 0);
    match (nulls, filter) {
        (None, None) => {
            for (i, &g) in groups.iter().enumerate() {
                f(i, g);
            }
        }
        (Some(n), None) => {
            for i in n.inner().set_indices() {
                f(i, groups[i]);
            }
        }
        (None, Some(sel)) => {
            for i in sel.set_indices() {
                f(i, groups[i]);
            }
        }
        (Some(n), Some(sel)) => {
            let both = n.inner() & sel;
            for i in both.set_indices() {
                f(i, groups[i]);
            }
        }
    }
}

/// The number of rows [`for_each_selected`] would visit.
pub fn count_selected(
    len: usize,
    nulls: Option<&NullBuffer>,
    filter: Option<&BooleanBuffer>,
) -> usize {
    let nulls = nulls.filter(|n| n.null_count() > 0);
    match (nulls, filter) {
        (None, None) => len,
        (Some(n), None) => len - n.null_count(),
        (None, Some(sel)) => sel.count_set_bits(),
        (Some(n), Some(sel)) => (n.inner() & sel).count_set_bits(),
    }
}
