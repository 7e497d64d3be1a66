//! The streaming operators and their parts.
//!
//! - [`GroupAggregate`] aggregates on one worker ([`group_aggregate`]), built by a
//!   [`GroupAggregateBuilder`] (`builder.rs`); its keyed state is `keyed.rs` (the group table
//!   and per-group columns) over `accumulators.rs` (one per aggregate call); its mini-batches
//!   are `mini_batch.rs` (the trigger, what a mini-batch touched, the transitions it emits);
//!   its snapshots, restores and compaction are [`snapshot`].
//! - [`LocalGroupAggregate`] is the stateless first phase of local-global aggregation
//!   ([`local`]).
//! - [`IncrementalAggregate`] is split-distinct's FINAL aggregate under Flink's incremental
//!   aggregate: delta accumulators per PARTIAL firing, merged by a global phase ([`incremental`]);
//!   where it only sums the PARTIAL's counts, the PARTIAL's workers fire [`deltas`] rows for it
//!   instead of their changelog; where each key has one PARTIAL row (one worker merging the
//!   buckets) it reads the PARTIAL's firings through instead ([`read_through`]).
//! - [`ParallelAggregate`] runs an aggregate over P workers ([`parallel`]), with the exchange
//!   and slicing of [`exchange`] and the adaptive local phase of [`adaptive`]: on the ordered
//!   runtime (pushed batches, a barrier per step) or on the pipelined runtime over input splits
//!   ([`pipelined`]: source and keyed tasks joined by bounded channels).
//! - [`metrics`]: what they measure, per [`metrics::AggregateStep`]. (Their `explain()` is
//!   written in [`crate::explain`].)

pub(crate) mod accumulators;
pub mod adaptive;
mod builder;
pub mod deltas;
pub mod exchange;
pub mod group_aggregate;
pub mod incremental;
pub mod key_groups;
pub(crate) mod keyed;
pub mod local;
pub(crate) mod local_ids;
pub mod metrics;
pub(crate) mod mini_batch;
pub mod ordered;
pub(crate) mod owners;
pub mod parallel;
pub mod pipelined;
pub mod read_through;
pub mod snapshot;

pub use builder::GroupAggregateBuilder;
pub use group_aggregate::GroupAggregate;
pub use incremental::IncrementalAggregate;
pub use keyed::{KeyHashes, hash_keys};
pub use local::LocalGroupAggregate;
pub use metrics::{
    AggregateMetrics, LocalPhaseMetrics, Metrics, RuntimeMetrics, StageMetrics, TaskMetrics,
    TaskRole, WorkerMetrics,
};
pub use parallel::ParallelAggregate;
