//! Accumulator columns: per-group aggregate state in flat vectors indexed by group id — the
//! trait every aggregate implements, and the checks and helpers they share.
//!
//! Every accumulator merges (the two-phase contract); COUNT, SUM, $SUM0 and AVG also retract by
//! arithmetic, and MIN/MAX retract through a value → multiplicity multiset per group. Each call
//! works on a whole batch: `groups[i]` is row `i`'s group id, and an optional filter selects rows.
//! The (nulls × filter) case is decided once per call ([`crate::accumulate`]), and the typed inner
//! loop is chosen once, when the accumulator is built ([`crate::aggregates::new_accumulator`]).

use std::borrow::Cow;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, ArrowPrimitiveType};
use arrow_buffer::{BooleanBuffer, NullBuffer};
use arrow_schema::{ArrowError, DataType};

/// Aggregate state for many groups, one dynamic call per batch.
pub trait GroupsAccumulator: Send + Sync + std::fmt::Debug {
    /// Accumulates the selected rows of `values` into their groups. `total_groups` is the number
    /// of group ids in use (every id in `groups` is below it); state grows to it.
    ///
    /// # Errors
    /// When `values` do not have the types this accumulator was made for.
    fn update(
        &mut self,
        values: &[ArrayRef],
        groups: &[u32],
        filter: Option<&BooleanBuffer>,
        total_groups: usize,
    ) -> Result<(), ArrowError>;

    /// Retracts the selected rows of `values` from their groups.
    ///
    /// # Errors
    /// When the accumulator cannot retract (insert-only MIN/MAX) or the types are wrong.
    fn retract(
        &mut self,
        values: &[ArrayRef],
        groups: &[u32],
        filter: Option<&BooleanBuffer>,
        total_groups: usize,
    ) -> Result<(), ArrowError>;

    /// Merges accumulator rows (as produced by [`GroupsAccumulator::state`]) into the groups
    /// `groups`: row `i` of `states` goes to group `groups[i]`.
    ///
    /// # Errors
    /// When `states` do not match [`GroupsAccumulator::state_types`], or are not as long as
    /// `groups`.
    fn merge(
        &mut self,
        states: &[ArrayRef],
        groups: &[u32],
        total_groups: usize,
    ) -> Result<(), ArrowError> {
        if states.iter().any(|s| s.len() != groups.len()) {
            return Err(ArrowError::InvalidArgumentError(
                "state and group ids differ in length".to_string(),
            ));
        }
        self.merge_at(states, 0, groups, total_groups)
    }

    /// [`GroupsAccumulator::merge`] of rows `offset..offset + groups.len()` of `states` (a
    /// worker's rows of an accumulator batch that several workers share): row `offset + i`
    /// goes to group `groups[i]`. An accumulator reads the rows in place where it can, and
    /// cuts them out with [`column_rows`] otherwise.
    ///
    /// # Errors
    /// As [`GroupsAccumulator::merge`], and rows past the end of `states`.
    fn merge_at(
        &mut self,
        states: &[ArrayRef],
        offset: usize,
        groups: &[u32],
        total_groups: usize,
    ) -> Result<(), ArrowError>;

    /// The current result of each of `groups`, one row per id.
    ///
    /// # Errors
    /// When the state cannot be represented as the result type (a bug).
    fn evaluate(&self, groups: &[u32]) -> Result<ArrayRef, ArrowError>;

    /// The accumulator state of each of `groups`, as columns typed by [`Self::state_types`].
    ///
    /// # Errors
    /// When the state cannot be represented.
    fn state(&self, groups: &[u32]) -> Result<Vec<ArrayRef>, ArrowError>;

    /// The types of the columns [`Self::state`] returns.
    fn state_types(&self) -> Vec<DataType>;

    /// The type [`Self::evaluate`] returns.
    fn result_type(&self) -> DataType;

    /// Returns `groups` to the empty state (a deleted group starts afresh).
    fn reset(&mut self, groups: &[u32]);

    /// Where this accumulator is a COUNT, its per-group counts, grown to `total_groups`, for a
    /// caller that adds to them itself: a DISTINCT accumulator adds one for each value a group
    /// gains and takes one away for each it loses (none of them NULL), with no mask over the
    /// batch. `None` (the default) where the accumulator must see the rows.
    fn counts_mut(&mut self, _total_groups: usize) -> Option<&mut [i64]> {
        None
    }

    /// Bytes held, from capacity.
    fn size(&self) -> usize;
}

/// Checks that `values` holds one array of type `dt` as long as `groups`, and returns it.
pub(crate) fn single_arg<'a>(
    values: &'a [ArrayRef],
    groups: &[u32],
    dt: &DataType,
) -> Result<&'a ArrayRef, ArrowError> {
    let [v] = values else {
        return Err(ArrowError::InvalidArgumentError(format!(
            "expected one argument, got {}",
            values.len()
        )));
    };
    if v.data_type() != dt {
        return Err(ArrowError::InvalidArgumentError(format!(
            "expected an argument of type {dt}, got {}",
            v.data_type()
        )));
    }
    if v.len() != groups.len() {
        return Err(ArrowError::InvalidArgumentError(
            "argument and group ids differ in length".to_string(),
        ));
    }
    Ok(v)
}

/// Checks `filter`'s length against `groups`.
pub(crate) fn check_filter(
    filter: Option<&BooleanBuffer>,
    groups: &[u32],
) -> Result<(), ArrowError> {
    match filter {
        Some(f) if f.len() != groups.len() => Err(ArrowError::InvalidArgumentError(
            "filter and group ids differ in length".to_string(),
        )),
        _ => Ok(()),
    }
}

/// Grows `v` to `n` entries of `fill`.
#[inline]
pub(crate) fn grow<T: Clone>(v: &mut Vec<T>, n: usize, fill: T) {
    if v.len() < n {
        v.resize(n, fill);
    }
}

/// Rows `offset..offset + groups.len()` of state column `i` of `states`, read in place: their
/// values, and their validity where the column has NULLs. The values are borrowed, not cut
/// into an array of their own: a worker merging its rows of a batch the workers share then
/// writes nothing the other workers read (an array cut from it would count a reference on the
/// shared buffer, a cache line every worker writes).
pub(crate) fn state_arg<'a, T: ArrowPrimitiveType>(
    states: &'a [ArrayRef],
    i: usize,
    offset: usize,
    groups: &[u32],
) -> Result<(&'a [T::Native], Option<NullBuffer>), ArrowError> {
    let a = states
        .get(i)
        .and_then(|a| a.as_primitive_opt::<T>())
        .ok_or_else(|| ArrowError::InvalidArgumentError(format!("bad state column {i}")))?;
    let n = groups.len();
    let values = a.values().get(offset..offset + n).ok_or_else(|| {
        ArrowError::InvalidArgumentError("state rows past the end of the state columns".to_string())
    })?;
    let nulls = a
        .nulls()
        .filter(|nb| nb.null_count() > 0)
        .map(|nb| nb.slice(offset, n));
    Ok((values, nulls))
}

/// Rows `offset..offset + n` of each of `columns`: the columns themselves where they hold
/// exactly those rows, otherwise cut (zero-copy).
///
/// # Errors
/// Rows past the end of a column.
pub fn column_rows(
    columns: &[ArrayRef],
    offset: usize,
    n: usize,
) -> Result<Cow<'_, [ArrayRef]>, ArrowError> {
    if offset == 0 && columns.iter().all(|c| c.len() == n) {
        return Ok(Cow::Borrowed(columns));
    }
    if columns.iter().any(|c| offset + n > c.len()) {
        return Err(ArrowError::InvalidArgumentError(
            "state rows past the end of the state columns".to_string(),
        ));
    }
    Ok(Cow::Owned(
        columns.iter().map(|c| c.slice(offset, n)).collect(),
    ))
}

/// A state column of lists of entries: `columns` (one per entry field, as long as the entries)
/// grouped into lists by `offsets` (one list per group).
///
/// # Errors
/// Columns that do not match `fields`, or offsets that do not fit them.
pub(crate) fn entry_lists(
    fields: arrow_schema::Fields,
    columns: Vec<ArrayRef>,
    offsets: Vec<i32>,
) -> Result<ArrayRef, ArrowError> {
    let entries = arrow_array::StructArray::try_new(fields.clone(), columns, None)?;
    let list = arrow_array::GenericListArray::<i32>::try_new(
        Arc::new(arrow_schema::Field::new_struct("item", fields, false)),
        arrow_buffer::OffsetBuffer::new(arrow_buffer::ScalarBuffer::from(offsets)),
        Arc::new(entries),
        None,
    )?;
    Ok(Arc::new(list))
}
