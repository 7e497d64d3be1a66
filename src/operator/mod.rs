//! The streaming operators.

pub mod group_aggregate;
pub(crate) mod state;

pub use group_aggregate::{GroupAggregate, GroupAggregateBuilder, Metrics};
