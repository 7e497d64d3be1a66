//! The streaming operators.

pub mod group_aggregate;
pub mod local;
pub mod parallel;
pub(crate) mod state;

pub use group_aggregate::{GroupAggregate, GroupAggregateBuilder, Metrics};
pub use local::LocalGroupAggregate;
pub use parallel::{AggregateMetrics, ParallelAggregate};
