//! Tally as a native aggregation operator inside Apache Flink jobs.
//!
//! Flink distributes the job, exchanges rows by key group, checkpoints and rescales; Tally runs
//! the vectorized GROUP BY inside Flink's tasks. The Java side (`flink/java/`, package
//! `org.tally.flink`) buffers a task's rows into column batches and calls this library once per
//! batch through JNI ([`jni`]); this crate plans the query ([`query::Query`]) and runs it as a
//! chain of [`phases::Phase`]s: one chained to the upstream task, then one after each of Flink's
//! keyed exchanges (one per aggregate), whose state Flink keeps per key group.
//! Rows cross JNI in the column format of [`wire`].

pub mod jni;
pub mod parts;
pub mod phases;
pub mod query;
pub mod wire;

pub use parts::Part;
pub use phases::{Output, Phase};
pub use query::{Column, Query};
pub use wire::Type;
