//! Tally: streaming GROUP BY aggregation with Flink's changelog semantics over Apache Arrow.
#![allow(missing_docs)]
pub mod changelog;
pub mod clock;
pub mod config;
pub mod error;
pub mod functions;
pub mod operator;
pub mod plan;
pub use config::Config;
pub use error::{Error, ErrorKind, Result};
pub use operator::{GroupAggregate, GroupAggregateBuilder, Metrics};
