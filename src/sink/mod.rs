//! Where a query's changes go: the [`Sink`] a run hands them to, the tables a changelog
//! materializes ([`tables`], kept in hash tables cut into shards that a batch is applied to side
//! by side, `shards.rs`), and the files results are written to ([`writer`]; CSV formatted
//! on rayon's pool, [`csv`]).

pub mod csv;
mod shards;
pub mod tables;
pub mod writer;

use crate::changelog::ChangeBatch;
use crate::checkpoint::Checkpoint;
use crate::error::Result;

pub use csv::CsvWriter;
pub use tables::{FinalTable, MultisetTable, ResultTable};
pub use writer::{ChangelogWriter, OutputFormat, TrackedFile, Writer};

/// The end of a run ([`crate::run::Job`]): takes every batch of changes, in order, and at a
/// checkpoint makes what it took durable and says where it stands.
pub trait Sink {
    /// Takes one batch of changes.
    ///
    /// # Errors
    /// Whatever stops the sink (I/O, a changelog it cannot apply); the run stops with it.
    fn write(&mut self, changes: &ChangeBatch) -> Result<()>;

    /// At a checkpoint, after every change before it was written: makes them durable and
    /// returns what the checkpoint records for the sink (metadata, and entries of its own named
    /// other than `stage-<i>`). A sink that cannot resume refuses.
    ///
    /// # Errors
    /// A sink that cannot be checkpointed, and I/O errors.
    fn checkpoint(&mut self) -> Result<Checkpoint> {
        Ok(Checkpoint::default())
    }
}

/// A closure as a sink without state to checkpoint.
impl<F: FnMut(&ChangeBatch) -> Result<()>> Sink for F {
    fn write(&mut self, changes: &ChangeBatch) -> Result<()> {
        self(changes)
    }
}

/// A sink that drops every change (for runs measured, not read: benchmarks, EXPLAIN ANALYZE).
#[derive(Debug, Default, Clone, Copy)]
pub struct Discard;

impl Sink for Discard {
    fn write(&mut self, _changes: &ChangeBatch) -> Result<()> {
        Ok(())
    }
}
