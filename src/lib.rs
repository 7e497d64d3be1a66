//! Tally: streaming GROUP BY aggregation with Flink SQL's changelog semantics, natively over
//! Apache Arrow record batches.
//!
//! A [`GroupAggregate`] consumes input batches (optionally a changelog, with an `op` column of
//! `+I`/`-U`/`+U`/`-D`), keeps keyed aggregate state, and emits the changelog of its result
//! exactly as Flink's group aggregation does: per record with mini-batch off, one transition per
//! key per mini-batch with it on. Queries are built from `datafusion_expr` expressions; options
//! use Flink's keys ([`Config`]).
//!
//! ```
//! use std::sync::Arc;
//! use arrow::array::{Int64Array, RecordBatch, StringArray};
//! use arrow::datatypes::{DataType, Field, Schema};
//! use datafusion_expr::{col, lit, ExprFunctionExt};
//! use tally::aggregates::{count, count_star, sum};
//! use tally::{Config, GroupAggregate};
//!
//! let schema = Arc::new(Schema::new(vec![
//!     Field::new("shop", DataType::Utf8, false),
//!     Field::new("user_id", DataType::Int64, false),
//!     Field::new("amount", DataType::Int64, true),
//!     Field::new("status", DataType::Utf8, false),
//! ]));
//! let mut agg = GroupAggregate::builder(schema.clone())
//!     .group_by([col("shop")])
//!     .aggregate([
//!         count_star().alias("orders"),
//!         sum(col("amount")).filter(col("status").eq(lit("PAID"))).build().unwrap().alias("paid"),
//!         count(col("user_id")).distinct().build().unwrap().alias("buyers"),
//!     ])
//!     .config(Config::from_pairs([
//!         ("table.exec.mini-batch.enabled", "true"),
//!         ("table.exec.mini-batch.allow-latency", "1 s"),
//!         ("table.exec.mini-batch.size", "10000"),
//!     ]).unwrap())
//!     .build()
//!     .unwrap();
//!
//! let batch = RecordBatch::try_new(schema, vec![
//!     Arc::new(StringArray::from(vec!["a", "b", "a"])),
//!     Arc::new(Int64Array::from(vec![1, 2, 1])),
//!     Arc::new(Int64Array::from(vec![Some(10), Some(20), None])),
//!     Arc::new(StringArray::from(vec!["PAID", "NEW", "PAID"])),
//! ]).unwrap();
//! assert!(agg.push(&batch).unwrap().is_empty()); // the mini-batch is not full yet
//! let changes = agg.finish().unwrap();           // end of input fires it
//! let rows: Vec<_> = changes.iter().map(|c| c.with_op_column().unwrap()).collect();
//! let text = arrow::util::pretty::pretty_format_batches(&rows).unwrap().to_string();
//! assert!(text.contains("| 0  | a    | 2      | 10   | 1      |")); // +I
//! ```
//!
//! The changes come as [`changelog::ChangeBatch`]es: the rows and their row kinds. A
//! [`sink::ResultTable`] materializes them; a [`run::Job`] runs a pipeline over a file source
//! into a [`sink::Sink`], with checkpoints and replay.
//!
//! The stateless vectorized building blocks (hashing, key interning, accumulator columns) live
//! in the `tally-kernels` crate.

#![warn(missing_docs)]

pub mod aggregates;
pub mod changelog;
pub mod checkpoint;
pub mod clock;
pub mod config;
#[cfg(feature = "datagen")]
pub mod datagen;
mod decode;
pub mod error;
pub mod explain;
pub mod operator;
pub mod phases;
pub mod pipeline;
pub mod plan;
pub mod replay;
pub mod run;
pub mod runtime;
pub mod sink;
pub mod source;
#[cfg(feature = "sql")]
pub mod sql;

pub use config::Config;
pub use error::{Error, ErrorKind, Result};
pub use operator::{
    AggregateMetrics, GroupAggregate, GroupAggregateBuilder, Metrics, ParallelAggregate,
};
