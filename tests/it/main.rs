//! Integration tests of the `tally` crate, one module per area.

#[cfg(feature = "cli")]
mod checkpoint;
mod common;
mod compaction;
mod csv_splits;
mod dictionary;
mod emission;
mod errors;
mod explain;
#[cfg(feature = "cli")]
mod generate;
#[cfg(feature = "cli")]
mod incremental;
mod oracle;
mod pipelined;
mod pipelined_changelog;
mod run;
mod scratch;
#[cfg(feature = "cli")]
mod split_auto;
#[cfg(feature = "cli")]
mod split_flink;
#[cfg(feature = "cli")]
mod sql;
#[cfg(feature = "sql")]
mod sql_oracle;
#[cfg(feature = "sql")]
mod sql_oracle_resume;
mod types;
