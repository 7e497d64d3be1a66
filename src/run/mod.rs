//! Running a pipeline over a file source: reading it in batches, pushing them through the
//! [`Pipeline`], handing the changes to a [`Sink`], and, when asked, replaying the recorded
//! stream at its recorded pace ([`crate::replay`]), writing checkpoints and resuming from them
//! ([`crate::checkpoint`]). Insert-only aggregates run on the pipelined runtime over splits of
//! the file ([`crate::operator::pipelined`]), the rest on the ordered one (see [`Job::run`]).
//!
//! A [`Job`] is what the SQL planner builds for a query (`PlannedQuery` wraps one with its
//! EXPLAIN), and what a library user builds from their own pipeline.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arrow::array::{Array, AsArray};
use arrow::datatypes::{DataType, Int64Type, TimeUnit};

use crate::changelog::ChangeBatch;
use crate::clock::ManualClock;
use crate::error::{Error, Result};
use crate::operator::AggregateMetrics;
use crate::operator::pipelined::{InputOrder, Split};
use crate::pipeline::{Output, Pipeline};
use crate::replay::{ReplayStats, Replayer};
use crate::runtime::Activity;
use crate::sink::Sink;
use crate::source::{FileTable, Format, SourceReader};

mod checkpoints;

use checkpoints::CheckpointMeta;
pub use checkpoints::CheckpointPolicy;

/// Source batches decoded ahead of the pipeline, on the source's own thread (BENCHMARKS.md,
/// "`tally bench` from Parquet": 4 batches deep took one worker from 7.2 to 14.2 M rows/s).
const PREFETCH_BATCHES: usize = 4;

/// What running a query did.
#[derive(Debug, Clone, Default)]
pub struct RunStats {
    /// Rows read from the source (by this run: a restored run starts after the checkpoint's
    /// position).
    pub rows_in: u64,
    /// Output rows (changelog rows, or rows of the insert-only result).
    pub rows_out: u64,
    /// Checkpoints written.
    pub checkpoints: u64,
    /// Per aggregate (bottom-up): its metrics.
    pub aggregates: Vec<AggregateMetrics>,
    /// The runtime that ran the pipeline: `pipelined (N splits)`, or `ordered` and why.
    pub runtime: String,
    /// The share of the wall time in which at most one task was busy: on the pipelined
    /// runtime the source, keyed and caller tasks; on the ordered one the caller's thread, the
    /// source's reading thread and the pool's tasks.
    pub serial_fraction: Option<f64>,
    /// The mean number of those tasks busy over the wall time: the parallelism the run got
    /// (a task waiting for a core counts as busy).
    pub mean_busy_tasks: Option<f64>,
}

/// A pipeline over a file source, ready to run (and to checkpoint, restore and replay).
pub struct Job {
    source: FileTable,
    pipeline: Pipeline,
    /// The clock of the latency trigger when the source's recorded time drives it (a table
    /// with a time column); the system clock otherwise.
    event_clock: Option<ManualClock>,
    /// Where and how often to checkpoint while running.
    checkpoints: Option<CheckpointPolicy>,
    /// Source rows to skip: the position of the checkpoint restored.
    resume_rows: u64,
    /// The settings that shape the state (how split-distinct buckets it): a checkpoint
    /// records them, and restores only where they are the same.
    state_settings: Vec<(String, String)>,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("source", &self.source.name)
            .field("pipeline", &self.pipeline)
            .finish()
    }
}

impl Job {
    /// A job that reads `source` into `pipeline`. When the source has a time column, its
    /// pipeline's latency triggers must run on `event_clock`, which the job sets to the
    /// recorded time as it reads.
    pub fn new(source: FileTable, pipeline: Pipeline, event_clock: Option<ManualClock>) -> Self {
        Self {
            source,
            pipeline,
            event_clock,
            checkpoints: None,
            resume_rows: 0,
            state_settings: vec![],
        }
    }

    /// Records `(key, value)` settings that shape the pipeline's state in every checkpoint;
    /// [`Job::restore`] refuses a checkpoint taken under other values.
    pub fn with_state_settings(mut self, settings: Vec<(String, String)>) -> Self {
        self.state_settings = settings;
        self
    }

    /// The source.
    pub fn source(&self) -> &FileTable {
        &self.source
    }

    /// The pipeline.
    pub fn pipeline(&self) -> &Pipeline {
        &self.pipeline
    }

    /// The pipeline, to change its stages' settings before running.
    pub fn pipeline_mut(&mut self) -> &mut Pipeline {
        &mut self.pipeline
    }

    /// Runs the job: reads the source in batches of `batch_size` rows, pushes them through the
    /// pipeline and hands every batch of changes to `sink`; `on_progress` gets the rows read so
    /// far and the rows in the source (when the format says) after each batch.
    ///
    /// Which runtime runs it: an aggregate with mini-batch on and `tally.exec.pipelined`,
    /// without replay or a time column, runs on the pipelined runtime
    /// (the file split across the workers, each decoding and folding its own split:
    /// [`crate::operator::pipelined`]) over a file, insert-only or a changelog (then dealt to
    /// the splits in chunks, applied in input order; so is any file with checkpoints or a
    /// restore: a checkpoint is taken at the end of a round of chunks), except an Arrow stream
    /// or a CSV file holding a double quote at P > 1 (one split);
    /// anything else on the ordered one (the source read in order, each batch cut into P
    /// slices). [`RunStats::runtime`] says which ran and why. Either way, only the source
    /// columns the pipeline reads are decoded.
    ///
    /// With checkpoints set ([`Job::checkpoint_every`]), at each one, as Flink does before a
    /// barrier, every pending mini-batch is fired and its changes handed to the sink; then
    /// [`Sink::checkpoint`] makes the sink durable and says where it stands, and the run adds
    /// `source.rows`, `source.bytes`, `source.path`, `output.rows`, the settings that shape the
    /// state and the aggregate states before the checkpoint is written. A run restored from it
    /// ([`Job::restore`]) resumes from exactly there: the rows before it are not read again and
    /// the changes before it not emitted again. When the source turns out to be bad (a corrupt
    /// file, a row without its recorded time), the state of the rows before it is checkpointed
    /// and the error says where.
    ///
    /// # Errors
    /// Source errors, evaluation errors, checkpoint I/O errors, and the sink's.
    pub fn run(
        &mut self,
        batch_size: usize,
        sink: &mut impl Sink,
        on_progress: impl FnMut(u64, Option<u64>),
    ) -> Result<RunStats> {
        self.run_with(batch_size, None, sink, on_progress)
            .map(|(stats, _)| stats)
    }

    /// Replays a recorded stream (a source with a time column) at `speed` times its recorded
    /// speed (None: as fast as possible), as [`Job::run`] does, and measures the end-to-end
    /// latency of its rows ([`crate::replay`]).
    ///
    /// # Errors
    /// A source without a time column, a speed out of [`crate::replay::SPEED_RANGE`], and as
    /// [`Job::run`].
    pub fn replay(
        &mut self,
        batch_size: usize,
        speed: Option<f64>,
        sink: &mut impl Sink,
        on_progress: impl FnMut(u64, Option<u64>),
    ) -> Result<(RunStats, ReplayStats)> {
        if self.source.time_column.is_none() {
            return Err(Error::invalid_input(format!(
                "a replay needs a table with a 'time-column'; table '{}' has none",
                self.source.name
            )));
        }
        let replayer = Replayer::new(speed)?;
        let (stats, replay) = self.run_with(batch_size, Some(replayer), sink, on_progress)?;
        Ok((stats, replay.unwrap_or_default()))
    }

    /// The size of the input file in bytes (None when it cannot be read).
    pub fn input_bytes(&self) -> Option<u64> {
        std::fs::metadata(&self.source.path).map(|m| m.len()).ok()
    }

    fn run_with(
        &mut self,
        batch_size: usize,
        replayer: Option<Replayer>,
        sink: &mut impl Sink,
        on_progress: impl FnMut(u64, Option<u64>),
    ) -> Result<(RunStats, Option<ReplayStats>)> {
        let mut stats = RunStats::default();
        self.source.unread_columns = self.unread_columns();
        self.source.dictionary_columns = self.dictionary_columns();
        match self.pipelined(replayer.is_some()) {
            Ok(()) => {
                let p = self.pipeline.parallelism();
                let order = self.input_order();
                let splits = self.pipeline.splits();
                let splits = match order {
                    InputOrder::Any => self.source.open_splits(batch_size, splits)?,
                    InputOrder::Chunks(rows) => self.source.open_chunked_splits(
                        batch_size,
                        splits,
                        rows,
                        self.resume_rows,
                    )?,
                };
                if splits.len() > 1 || p == 1 || self.source.can_split()? {
                    self.run_pipelined(splits, order, &mut stats, sink, on_progress)?;
                    return Ok((stats, None));
                }
                stats.runtime = format!(
                    "ordered: the {} source is read as one split",
                    self.source.format.name()
                );
            }
            Err(why) => stats.runtime = format!("ordered: {why}"),
        }
        // Decoding runs ahead on threads of its own (source tasks, as in Flink): Parquet row
        // groups on up to P decoders, in file order.
        let decoders = self.pipeline.parallelism();
        // The caller's thread is busy from here on, beside the reading thread and the pool.
        let activity = Arc::new(Activity::new(1));
        let reader = self
            .source
            .open_with(batch_size, decoders)?
            .prefetch(PREFETCH_BATCHES, Some(Arc::clone(&activity)));
        self.pipeline.runtime().watch(Some(Arc::clone(&activity)));
        let result = self.run_ordered(reader, replayer, &mut stats, sink, on_progress);
        self.pipeline.runtime().watch(None);
        let read = activity.reading();
        stats.serial_fraction = Some(read.serial_fraction);
        stats.mean_busy_tasks = Some(read.mean_busy_tasks);
        let replay = result?;
        Ok((stats, replay))
    }

    /// The ordered runtime: `reader`'s batches in order through the pipeline, with checkpoints,
    /// a restored position to skip to, and replay.
    fn run_ordered(
        &mut self,
        reader: SourceReader,
        mut replayer: Option<Replayer>,
        stats: &mut RunStats,
        sink: &mut impl Sink,
        mut on_progress: impl FnMut(u64, Option<u64>),
    ) -> Result<Option<ReplayStats>> {
        let total_rows = reader.total_rows;
        let time_index = self
            .source
            .time_column
            .as_ref()
            .and_then(|t| self.source.schema.index_of(t).ok());
        // The source position (rows read, counting those before a restored checkpoint).
        let mut position = std::mem::take(&mut self.resume_rows);
        let reader = match position {
            0 => reader,
            skip => reader.skip_rows(skip, self.source.past_end(skip)),
        };
        let mut since_checkpoint = 0u64;
        for batch in reader {
            // A row without its recorded time is bad input, like a corrupt file.
            let batch = batch.and_then(|b| self.check_times(&b, time_index, position).map(|()| b));
            let batch = match batch {
                Ok(b) => b,
                Err(e) => {
                    // Bad input (a corrupt or malformed file): the rows before it are in the
                    // state, which a checkpoint keeps, so that nothing accepted is lost.
                    let Some(dir) = self.checkpoints.as_ref().map(|p| p.dir.clone()) else {
                        return Err(e);
                    };
                    let saved = self
                        .take_checkpoint(position, stats, sink)
                        .map(|_| dir.latest());
                    return Err(match saved {
                        Ok(Ok(Some(p))) => e.with_note(format!(
                            "the state after the {position} rows before it is saved in checkpoint {}; resume from it with --restore once the input is fixed",
                            p.display()
                        )),
                        _ => e,
                    });
                }
            };
            stats.rows_in += batch.num_rows() as u64;
            position += batch.num_rows() as u64;
            since_checkpoint += batch.num_rows() as u64;
            if let Some(i) = time_index {
                // Replay: the recorded time drives the latency trigger (and the pacing).
                let t = arrow::compute::cast(
                    batch.data.column(i),
                    &DataType::Timestamp(TimeUnit::Millisecond, None),
                )?;
                let t = arrow::compute::cast(&t, &DataType::Int64)?;
                let t = t.as_primitive::<Int64Type>();
                if let Some(r) = &mut replayer {
                    r.before_push(t.values())?;
                }
                if let (Some(clock), Some(max)) = (&self.event_clock, arrow::compute::max(t)) {
                    clock.set_ms(max);
                }
            }
            let out = self.pipeline.push(batch)?;
            let mut rows = deliver(sink, out, stats)?;
            if let Some(policy) = &self.checkpoints
                && since_checkpoint >= policy.every_rows
            {
                since_checkpoint = 0;
                rows += self.take_checkpoint(position, stats, sink)?;
            }
            if let Some(r) = &mut replayer {
                r.after_push(rows);
            }
            on_progress(stats.rows_in, total_rows);
        }
        let out = self.pipeline.finish()?;
        let rows = deliver(sink, out, stats)?;
        if let Some(r) = &mut replayer {
            // Whatever is still pending is emitted by the end of input (or never changes output).
            r.after_push(rows.max(1));
        }
        stats.aggregates = self.pipeline.metrics()?;
        Ok(replayer.map(Replayer::finish))
    }

    /// The declared columns of the source that the pipeline may take as dictionaries
    /// ([`Pipeline::dictionary_columns`]; not the time column, which replay reads).
    fn dictionary_columns(&self) -> Vec<String> {
        let fields = self.source.schema.fields();
        self.pipeline
            .dictionary_columns()
            .into_iter()
            .filter_map(|i| fields.get(i).map(|f| f.name().clone()))
            .filter(|name| self.source.time_column.as_ref() != Some(name))
            .collect()
    }

    /// The declared columns of the source that the pipeline never reads (nullable ones, not
    /// the time column; at least one column stays read): Parquet leaves them undecoded.
    fn unread_columns(&self) -> Vec<String> {
        match self.pipeline.columns_read() {
            Some(read) => self.source.unread_outside(&read),
            None => vec![],
        }
    }

    /// The runtime a run would take, in words, as far as it is known before the input is read
    /// (EXPLAIN): `pipelined` and how the file is split, or `ordered` and why. A run says what
    /// it took in [`RunStats::runtime`].
    pub fn planned_runtime(&self) -> String {
        let p = self.pipeline.parallelism();
        if let Err(why) = self.pipelined(false) {
            return format!("ordered: {why}");
        }
        let order = self.input_order();
        match order {
            _ if p == 1 => "pipelined: one split, read, filtered and folded by its own task".into(),
            InputOrder::Chunks(rows) => format!(
                "pipelined: the file dealt to {p} splits in chunks of {rows} rows, applied in input order{}{}",
                if self.pipeline.input_order() == order {
                    " (a changelog)"
                } else {
                    " (checkpoints end rounds of chunks)"
                },
                match self.source.format {
                    Format::Csv =>
                        " (a CSV file holding a double quote is one split and runs ordered)",
                    Format::Arrow => " (an Arrow stream is one split and runs ordered)",
                    Format::Parquet => "",
                }
            ),
            InputOrder::Any => format!(
                "pipelined: the file split across {p} workers, each split read, filtered and folded by its own task, mini-batches per split, no barrier{}",
                match self.source.format {
                    Format::Csv =>
                        " (a CSV file holding a double quote is one split and runs ordered)",
                    Format::Arrow => " (an Arrow stream is one split and runs ordered)",
                    Format::Parquet => "",
                }
            ),
        }
    }

    /// How the pipelined runtime's splits must cover the input: chunks in turn for a changelog
    /// ([`Pipeline::input_order`]) and for checkpoints or a resumed run, whose rows applied at
    /// a round's end must be a prefix of the input.
    fn input_order(&self) -> InputOrder {
        match self.pipeline.chunked_order() {
            Some(chunks) if self.checkpoints.is_some() || self.resume_rows > 0 => chunks,
            _ => self.pipeline.input_order(),
        }
    }

    /// Whether the run can take the pipelined runtime (the source split across the workers);
    /// why not, in words.
    fn pipelined(&self, replaying: bool) -> std::result::Result<(), String> {
        if replaying {
            return Err("a replay paces one ordered stream".into());
        }
        if self.event_clock.is_some() {
            return Err(
                "the recorded time of one ordered stream drives the latency trigger".into(),
            );
        }
        self.pipeline.pipelined()
    }

    /// Runs the pipeline over `splits` of the source on the pipelined runtime.
    fn run_pipelined(
        &mut self,
        splits: Vec<SourceReader>,
        order: InputOrder,
        stats: &mut RunStats,
        sink: &mut impl Sink,
        mut on_progress: impl FnMut(u64, Option<u64>),
    ) -> Result<()> {
        let resumed = std::mem::take(&mut self.resume_rows);
        let mut checkpoints = self.checkpoint_meta();
        let every = self.checkpoints.as_ref().map(|p| p.every_rows);
        let total_rows = splits.first().and_then(|s| s.total_rows);
        stats.runtime = match splits.len() {
            1 => "pipelined (1 split)".to_string(),
            n => format!("pipelined ({n} splits)"),
        };
        // Rows read, counted by the source tasks as they read.
        let read = Arc::new(AtomicU64::new(0));
        let splits: Vec<Split> = splits
            .into_iter()
            .map(|s| -> Split {
                let read = Arc::clone(&read);
                Box::new(s.inspect(move |b| {
                    if let Ok(b) = b {
                        read.fetch_add(b.num_rows() as u64, Ordering::Relaxed);
                    }
                }))
            })
            .collect();
        let result = self
            .pipeline
            .run_splits(splits, order, every, &mut |out| match out {
                Output::Changes(b) => {
                    stats.rows_out += b.num_rows() as u64;
                    sink.write(&b)?;
                    on_progress(read.load(Ordering::Relaxed), total_rows);
                    Ok(())
                }
                Output::Checkpoint { rows, stages } => {
                    let meta = checkpoints.as_mut().ok_or_else(|| {
                        Error::internal("a checkpoint without a checkpoint directory")
                    })?;
                    meta.write(resumed + rows, stages, stats, sink)
                }
            });
        stats.rows_in = read.load(Ordering::Relaxed);
        // The last checkpoint started is written (or failed) before the run ends or says where
        // its state is saved.
        let written = checkpoints.as_mut().map_or(Ok(()), CheckpointMeta::finish);
        let result = result.and(written);
        if let Err(e) = result {
            // Bad input after a checkpoint: the rows before it are in that state.
            let saved = checkpoints.as_ref().and_then(CheckpointMeta::written);
            return Err(match saved {
                Some((position, path)) => e.with_note(format!(
                    "the state after the first {position} rows is saved in checkpoint {}; resume from it with --restore once the input is fixed",
                    path.display()
                )),
                None => e,
            });
        }
        on_progress(stats.rows_in, total_rows);
        stats.aggregates = self.pipeline.metrics()?;
        let runtime = stats.aggregates.first().and_then(|m| m.runtime.as_ref());
        stats.serial_fraction = runtime.map(|r| r.serial_fraction);
        stats.mean_busy_tasks = runtime.map(|r| r.mean_busy_tasks);
        Ok(())
    }

    /// Checks that every row of `batch` (the rows after source row `position`) has its recorded
    /// time, when the table has a time column (its column `time_index`).
    fn check_times(
        &self,
        batch: &ChangeBatch,
        time_index: Option<usize>,
        position: u64,
    ) -> Result<()> {
        let Some(i) = time_index else {
            return Ok(());
        };
        let times = batch.data.column(i);
        if times.null_count() == 0 {
            return Ok(());
        }
        let row = (0..times.len()).find(|&r| times.is_null(r)).unwrap_or(0) as u64;
        Err(Error::invalid_input(format!(
            "table '{}' ({}): its time column '{}' is NULL at row {} of the input; a recorded stream needs every row's time (Flink: RowTime field should not be null)",
            self.source.name,
            self.source.path.display(),
            self.source.time_column.as_deref().unwrap_or(""),
            position + row + 1
        )))
    }
}

/// Hands `batches` to the sink; returns their rows.
fn deliver(sink: &mut impl Sink, batches: Vec<ChangeBatch>, stats: &mut RunStats) -> Result<usize> {
    let mut rows = 0;
    for b in batches {
        rows += b.num_rows();
        sink.write(&b)?;
    }
    stats.rows_out += rows as u64;
    Ok(rows)
}
