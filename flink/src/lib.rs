//! Tally as a native aggregation operator inside Apache Flink jobs.
//!
//! Flink distributes the job, exchanges rows by key group, checkpoints and rescales; Tally runs
//! the vectorized GROUP BY inside Flink's tasks. The Java side (`flink/java/`, package
//! `org.tally.flink`) buffers a task's rows into column batches and calls this library once per
//! batch through JNI ([`jni`]); this crate plans the query ([`phases::Query`]) and runs it as a
//! chain of [`phases::Phase`]s: one chained to the upstream task, then one after each of Flink's
//! keyed exchanges (one per aggregate), whose state Flink keeps per key group.
//! Rows cross JNI in the column format of [`wire`].

pub mod jni;
pub mod phases;
pub mod wire;

pub use phases::{Column, Output, Part, Phase, Query};
pub use wire::Type;
