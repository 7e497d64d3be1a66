//! Checkpoints of a [`Job`]: the policy, writing one at a barrier (every pending mini-batch
//! fired first, the sink made durable; on the pipelined runtime the files are written on a
//! thread of their own while the run goes on), and restoring one into a fresh job.

use std::path::PathBuf;
use std::thread::JoinHandle;

use crate::checkpoint::{Checkpoint, CheckpointDir};
use crate::error::{Error, Result};
use crate::pipeline::is_stage_entry;
use crate::sink::Sink;

use super::{Job, RunStats, deliver};

/// When and where [`Job::run`] writes checkpoints.
#[derive(Debug, Clone)]
pub struct CheckpointPolicy {
    /// The checkpoint directory.
    pub dir: CheckpointDir,
    /// A checkpoint is taken after the source batch that brings the rows read since the last
    /// one to at least this many.
    pub every_rows: u64,
}

impl Job {
    /// Writes a checkpoint to `dir` every `every_rows` source rows while running (see
    /// [`Job::run`]).
    ///
    /// # Errors
    /// `every_rows` of 0.
    pub fn checkpoint_every(&mut self, dir: CheckpointDir, every_rows: u64) -> Result<()> {
        if every_rows == 0 {
            return Err(Error::invalid_input(
                "the checkpoint interval must be at least 1 row",
            ));
        }
        self.checkpoints = Some(CheckpointPolicy { dir, every_rows });
        Ok(())
    }

    /// Restores the state of a checkpoint written by a run of the same job (the newest under
    /// `path`, or the one `path` names) into this fresh job: the aggregate states (redistributed
    /// over this run's workers) and the source position, so that the next run starts with the
    /// row after it. Returns the checkpoint, whose metadata tells the caller where its sink
    /// stood (`output.rows`, and what [`Sink::checkpoint`] recorded), without the stages'
    /// entries (their state is in the job now): the sink's entries and the metadata.
    ///
    /// The input is not checked beyond its length (a run that finds fewer rows than the
    /// checkpoint's position fails): the metadata's `source.bytes` is the input's size when the
    /// checkpoint was taken, for the caller to compare (a file fixed after bad input may differ).
    /// The settings that shape the state ([`Job::with_state_settings`]) must be the same; the
    /// others (parallelism, phases, mini-batch size, …) may change.
    ///
    /// # Errors
    /// A missing, corrupt or unsupported checkpoint; one of another query or of other state
    /// settings (named).
    pub fn restore(&mut self, path: &std::path::Path) -> Result<Checkpoint> {
        let mut chk = CheckpointDir::read(path)?;
        for (key, value) in &self.state_settings {
            let then = chk.meta(&format!("setting.{key}")).map_err(|_| {
                Error::invalid_input(format!(
                    "the checkpoint does not record '{key}', which shapes the state (it was written by an older Tally): resume it with that version"
                ))
            })?;
            if then != value {
                return Err(Error::invalid_input(format!(
                    "the checkpoint was taken with '{key}' = '{then}' and this run has '{value}', which lays out the state differently: set '{key}' = '{then}' to resume from it"
                )));
            }
        }
        let rows: u64 = chk
            .meta("source.rows")?
            .parse()
            .map_err(|_| Error::invalid_input("checkpoint: bad source.rows"))?;
        self.pipeline.restore(&chk)?;
        self.resume_rows = rows;
        // The stages' state now lives in the pipeline; the caller needs the metadata and the
        // sink's entries, not a second copy of the state for the whole run.
        chk.entries.retain(|e| !is_stage_entry(&e.0));
        Ok(chk)
    }

    /// Takes a checkpoint at source row `position`: as before a checkpoint barrier, fires every
    /// pending mini-batch and delivers its changes to the sink, has the sink say where it
    /// stands, then writes the state. Returns the rows emitted.
    pub(super) fn take_checkpoint(
        &mut self,
        position: u64,
        stats: &mut RunStats,
        sink: &mut impl Sink,
    ) -> Result<usize> {
        let mut meta = self
            .checkpoint_meta()
            .ok_or_else(|| Error::internal("a checkpoint without a checkpoint directory"))?;
        let out = self.pipeline.finish()?;
        let rows = deliver(sink, out, stats)?;
        meta.write(position, self.pipeline.snapshot()?, stats, sink)?;
        meta.finish()?;
        Ok(rows)
    }

    /// Where checkpoints go and what each records besides the state and positions, when the
    /// job takes checkpoints.
    pub(super) fn checkpoint_meta(&self) -> Option<CheckpointMeta> {
        let dir = self.checkpoints.as_ref()?.dir.clone();
        let mut fixed = vec![(
            "source.path".to_string(),
            self.source
                .path
                .display()
                .to_string()
                .replace(['\n', '\r'], " "),
        )];
        if let Some(b) = self.input_bytes() {
            fixed.push(("source.bytes".into(), b.to_string()));
        }
        for (key, value) in &self.state_settings {
            fixed.push((format!("setting.{key}"), value.clone()));
        }
        Some(CheckpointMeta {
            dir,
            fixed,
            writing: None,
            written: None,
        })
    }
}

/// A job's checkpoint directory and the metadata every checkpoint of the run records (taken
/// before the run, which borrows the pipeline), and the checkpoint being written.
pub(super) struct CheckpointMeta {
    pub(super) dir: CheckpointDir,
    fixed: Vec<(String, String)>,
    /// The checkpoint being written on a thread of its own, while the run goes on, and the
    /// source rows its state holds.
    writing: Option<(u64, JoinHandle<Result<PathBuf>>)>,
    /// The source rows and folder of the last checkpoint written.
    written: Option<(u64, PathBuf)>,
}

impl CheckpointMeta {
    /// Makes the sink durable ([`Sink::checkpoint`]) and starts writing a checkpoint of
    /// `stages` after `position` source rows, with the output rows delivered so far, on a
    /// thread of its own (encoding, checksums and fsyncs off the thread that delivers the
    /// run's changes), once the previous one is written: one at a time, so that ids follow
    /// each other and at most one checkpoint's state is held besides the run's.
    /// [`CheckpointMeta::finish`] waits for it.
    ///
    /// # Errors
    /// The previous checkpoint's write failed; the sink cannot be made durable; the next id
    /// cannot be found.
    pub(super) fn write(
        &mut self,
        position: u64,
        stages: Vec<(
            String,
            arrow::datatypes::SchemaRef,
            Vec<arrow::array::RecordBatch>,
        )>,
        stats: &mut RunStats,
        sink: &mut impl Sink,
    ) -> Result<()> {
        self.finish()?;
        let mut chk = sink.checkpoint()?;
        chk.meta.insert("source.rows".into(), position.to_string());
        chk.meta.extend(self.fixed.iter().cloned());
        chk.meta
            .insert("output.rows".into(), stats.rows_out.to_string());
        chk.id = self.dir.next_id()?;
        chk.entries.extend(stages);
        let dir = self.dir.clone();
        let writer = std::thread::Builder::new()
            .name("tally-checkpoint".into())
            .spawn(move || dir.write(&chk))
            .map_err(|e| Error::internal(format!("cannot start the checkpoint writer: {e}")))?;
        self.writing = Some((position, writer));
        stats.checkpoints += 1;
        Ok(())
    }

    /// Waits for the checkpoint being written, if any.
    ///
    /// # Errors
    /// Its write failed (named by [`CheckpointDir::write`]).
    pub(super) fn finish(&mut self) -> Result<()> {
        let Some((position, writer)) = self.writing.take() else {
            return Ok(());
        };
        let folder = writer
            .join()
            .map_err(|_| Error::internal("the checkpoint writer panicked"))??;
        self.written = Some((position, folder));
        Ok(())
    }

    /// The source rows and folder of the last checkpoint this run wrote (after
    /// [`CheckpointMeta::finish`]).
    pub(super) fn written(&self) -> Option<(u64, PathBuf)> {
        self.written.clone()
    }
}

impl Drop for CheckpointMeta {
    /// A run that stops early still leaves the checkpoint it started whole (or none).
    fn drop(&mut self) {
        let _ = self.finish();
    }
}
