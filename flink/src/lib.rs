//! Tally as a native aggregation operator inside Apache Flink jobs.
//!
//! Flink distributes the job, exchanges rows by key group, checkpoints and rescales; Tally runs
//! the vectorized GROUP BY inside Flink's tasks. The Java side (`flink/java/`, package
//! `org.tally.flink`) buffers a task's rows into column batches and calls this library once per
//! batch through JNI ([`jni`]); this crate plans the query ([`phases::Query`]) and runs its two
//! halves: the [`phases::LocalPhase`] chained to the upstream task and the
//! [`phases::GlobalPhase`] after Flink's keyed exchange, whose state Flink keeps per key group.
//! Rows cross JNI in the column format of [`wire`].

pub mod jni;
pub mod phases;
pub mod wire;

pub use phases::{Column, GlobalPhase, LocalPhase, Part, Query};
pub use wire::Type;
