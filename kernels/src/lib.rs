//! Stateless, vectorized building blocks of the Tally streaming aggregation engine.
//!
//! A mini-batch flows through these kernels in three steps:
//!
//! 1. [`hash::hash_columns`] hashes each row's group key once;
//! 2. a [`group_values::GroupValues`] table interns the keys into dense `u32` group ids;
//! 3. [`accumulator::GroupsAccumulator`]s (built by [`aggregates::new_accumulator`]; one per aggregate, or one
//!    [`distinct::DistinctAccumulator`] per DISTINCT argument) fold the rows into flat per-group
//!    state, and evaluate the results of the groups that changed.
//!
//! ```
//! use std::sync::Arc;
//! use arrow_array::{ArrayRef, Int64Array, StringArray, cast::AsArray, types::Int64Type};
//! use tally_kernels::aggregates::{new_accumulator, AggregateKind};
//! use tally_kernels::group_values::new_group_values;
//! use tally_kernels::hash::hash_columns;
//!
//! let keys: ArrayRef = Arc::new(StringArray::from(vec!["a", "b", "a"]));
//! let amounts: ArrayRef = Arc::new(Int64Array::from(vec![1, 2, 3]));
//!
//! let mut hashes = vec![];
//! hash_columns(&[keys.clone()], &mut hashes).unwrap();
//! let mut table = new_group_values(&[keys.data_type().clone()]).unwrap();
//! let mut groups = vec![];
//! table.intern(&[keys], &hashes, &mut groups).unwrap();
//! assert_eq!(groups, vec![0, 1, 0]);
//!
//! let mut sum = new_accumulator(AggregateKind::Sum, Some(amounts.data_type()), false).unwrap();
//! sum.update(&[amounts], &groups, None, table.len()).unwrap();
//! let result = sum.evaluate(&[0, 1]).unwrap();
//! assert_eq!(result.as_primitive::<Int64Type>().values(), &[4, 2]);
//! ```
//!
//! Everything here depends only on arrow-level crates; the engine (`tally`) builds operators on
//! top.

pub mod accumulate;
pub mod accumulator;
pub mod aggregates;
mod bits;
pub mod decimal;
pub mod distinct;
pub mod group_values;
pub mod hash;
pub mod id_counts;
pub mod min_max;
pub mod numeric;
#[cfg(test)]
mod test_rng;
