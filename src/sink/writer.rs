//! Writing results to files: the output formats ([`Writer`]), a changelog's op column as codes
//! or text ([`changelog_batch`]), the output file a checkpoint can truncate back to
//! ([`TrackedFile`]), and the changelog sink that uses them ([`ChangelogWriter`]).

use std::fs::File;
use std::io::Write;
use std::sync::{Arc, Mutex};

use arrow::array::{ArrayRef, AsArray, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Int8Type, Schema, SchemaRef};

use crate::changelog::{ChangeBatch, OP_COLUMN, RowKind};
use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};
use crate::sink::Sink;
use crate::sink::csv::CsvWriter;

/// The checkpoint metadata key of a changelog file's length.
const SINK_BYTES: &str = "sink.bytes";

/// An output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum OutputFormat {
    /// CSV with a header line.
    Csv,
    /// Parquet (a file only).
    Parquet,
    /// Arrow IPC file.
    Arrow,
    /// A text table, written when the output ends.
    Table,
}

impl OutputFormat {
    /// The format a file name calls for: `.parquet`, `.arrow`/`.ipc`, else CSV; a text table on
    /// standard output (`-`).
    pub fn for_output(output: &str) -> Self {
        if output == "-" {
            return OutputFormat::Table;
        }
        match output
            .rsplit('.')
            .next()
            .map(str::to_ascii_lowercase)
            .as_deref()
        {
            Some("parquet") => OutputFormat::Parquet,
            Some("arrow" | "ipc") => OutputFormat::Arrow,
            _ => OutputFormat::Csv,
        }
    }

    /// Whether the format is text, where row kinds read `+I`, `-U`, … rather than codes.
    pub fn is_text(self) -> bool {
        matches!(self, OutputFormat::Csv | OutputFormat::Table)
    }
}

/// The schema of a changelog of rows of `schema` as a record batch: an `op` column (text or
/// `Int8` codes) first.
pub fn changelog_schema(schema: &Schema, text_kinds: bool) -> SchemaRef {
    let op_type = if text_kinds {
        DataType::Utf8
    } else {
        DataType::Int8
    };
    let mut fields = vec![Arc::new(Field::new(OP_COLUMN, op_type, false))];
    fields.extend(schema.fields().iter().cloned());
    Arc::new(Schema::new(fields))
}

/// A batch of changes as a record batch of [`changelog_schema`]: its row kinds as text (`+I`, …)
/// or as `Int8` codes in a leading `op` column.
///
/// # Errors
/// Row kinds that are not valid codes.
pub fn changelog_batch(changes: &ChangeBatch, text_kinds: bool) -> Result<RecordBatch> {
    let batch = changes.with_op_column()?;
    if !text_kinds {
        return Ok(batch);
    }
    let codes = batch.column(0).as_primitive::<Int8Type>();
    let strings: StringArray = codes
        .values()
        .iter()
        .map(|c| RowKind::from_code(i64::from(*c)).map(RowKind::short))
        .collect();
    let mut cols: Vec<ArrayRef> = vec![Arc::new(strings)];
    cols.extend(batch.columns()[1..].iter().cloned());
    Ok(RecordBatch::try_new(
        changelog_schema(changes.data.schema_ref(), true),
        cols,
    )?)
}

/// Writes record batches in one format, to a file or to standard output.
pub enum Writer<'a> {
    /// CSV, formatted on rayon's pool.
    Csv(CsvWriter<'a>),
    /// Parquet.
    Parquet(parquet::arrow::ArrowWriter<File>),
    /// Arrow IPC file.
    Arrow(arrow::ipc::writer::FileWriter<Box<dyn Write + 'a>>),
    /// A text table of the batches, written at the end.
    Table(Box<dyn Write + 'a>, Vec<RecordBatch>),
}

impl std::fmt::Debug for Writer<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self {
            Writer::Csv(_) => "Csv",
            Writer::Parquet(_) => "Parquet",
            Writer::Arrow(_) => "Arrow",
            Writer::Table(..) => "Table",
        };
        f.debug_tuple("Writer").field(&kind).finish()
    }
}

impl<'a> Writer<'a> {
    /// A writer of batches of `schema` in `format` to the file `output`, or to `stdout` when
    /// `output` is `-`.
    ///
    /// # Errors
    /// A file that cannot be created, and Parquet to standard output.
    pub fn try_new(
        format: OutputFormat,
        output: &str,
        schema: &SchemaRef,
        stdout: &'a mut dyn Write,
    ) -> Result<Self> {
        let create = || File::create(output).map_err(|e| Error::io(format!("{output}: {e}")));
        let target = |stdout: &'a mut dyn Write| -> Result<Box<dyn Write + 'a>> {
            Ok(if output == "-" {
                Box::new(stdout)
            } else {
                Box::new(std::io::BufWriter::new(create()?))
            })
        };
        Ok(match format {
            OutputFormat::Csv => Writer::csv(target(stdout)?, true),
            OutputFormat::Parquet => {
                if output == "-" {
                    return Err(Error::invalid_input("--format parquet needs --output FILE"));
                }
                Writer::Parquet(parquet::arrow::ArrowWriter::try_new(
                    create()?,
                    Arc::clone(schema),
                    None,
                )?)
            }
            OutputFormat::Arrow => Writer::Arrow(arrow::ipc::writer::FileWriter::try_new(
                target(stdout)?,
                schema,
            )?),
            OutputFormat::Table => Writer::Table(target(stdout)?, vec![]),
        })
    }

    /// A CSV writer to `out`, with or without the header line.
    pub fn csv(out: Box<dyn Write + 'a>, header: bool) -> Self {
        Writer::Csv(CsvWriter::new(out, header))
    }

    /// Writes one batch.
    ///
    /// # Errors
    /// I/O and encoding errors.
    pub fn write(&mut self, b: &RecordBatch) -> Result<()> {
        match self {
            Writer::Csv(w) => w.write(b)?,
            Writer::Parquet(w) => w.write(b)?,
            Writer::Arrow(w) => w.write(b)?,
            Writer::Table(_, v) => v.push(b.clone()),
        }
        Ok(())
    }

    /// Ends the output (a Parquet or Arrow footer, the text table) and flushes it.
    ///
    /// # Errors
    /// I/O and encoding errors.
    pub fn finish(self) -> Result<()> {
        match self {
            Writer::Csv(w) => w.finish()?,
            Writer::Parquet(w) => {
                w.close()?;
            }
            Writer::Arrow(mut w) => w.finish()?,
            Writer::Table(mut w, batches) => {
                writeln!(
                    w,
                    "{}",
                    arrow::util::pretty::pretty_format_batches(&batches)?
                )?;
                w.flush()?;
            }
        }
        Ok(())
    }
}

/// An output file that counts the bytes written and can be made durable mid-run: a checkpoint
/// records its length, and a resumed run truncates it back to that length and appends.
#[derive(Clone, Debug)]
pub struct TrackedFile(Arc<Mutex<(std::io::BufWriter<File>, u64)>>);

impl TrackedFile {
    /// Creates `path`, or with `resume_at` opens it truncated to that many bytes.
    ///
    /// # Errors
    /// I/O errors, and a file shorter than `resume_at` (changed since the checkpoint).
    pub fn open(path: &str, resume_at: Option<u64>) -> Result<Self> {
        let err = |e: std::io::Error| Error::io(format!("{path}: {e}"));
        let file = match resume_at {
            None => File::create(path).map_err(err)?,
            Some(len) => {
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .open(path)
                    .map_err(err)?;
                let now = f.metadata().map_err(err)?.len();
                if now < len {
                    return Err(Error::invalid_input(format!(
                        "the output {path} has {now} bytes, fewer than the {len} it had at the checkpoint: it was changed since"
                    )));
                }
                f.set_len(len).map_err(err)?;
                std::io::Seek::seek(&mut f, std::io::SeekFrom::End(0)).map_err(err)?;
                f
            }
        };
        Ok(Self(Arc::new(Mutex::new((
            std::io::BufWriter::new(file),
            resume_at.unwrap_or(0),
        )))))
    }

    /// Flushes and fsyncs; returns the bytes written so far.
    ///
    /// # Errors
    /// I/O errors.
    pub fn sync(&self) -> Result<u64> {
        let mut g = self
            .0
            .lock()
            .map_err(|_| Error::internal("output lock poisoned"))?;
        g.0.flush()?;
        g.0.get_ref().sync_data()?;
        Ok(g.1)
    }
}

impl Write for TrackedFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut g = self
            .0
            .lock()
            .map_err(|_| std::io::Error::other("output lock poisoned"))?;
        let n = g.0.write(buf)?;
        g.1 += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.0
            .lock()
            .map_err(|_| std::io::Error::other("output lock poisoned"))?
            .0
            .flush()
    }
}

/// A sink that writes the changelog itself: each batch of changes as rows of
/// [`changelog_schema`]. Made durable ([`ChangelogWriter::durable_csv`]) it records its file's
/// length at each checkpoint, and a resumed run truncates the file back to it.
#[derive(Debug)]
pub struct ChangelogWriter<'a> {
    writer: Writer<'a>,
    text_kinds: bool,
    file: Option<TrackedFile>,
}

impl<'a> ChangelogWriter<'a> {
    /// The changelog of rows of `schema` in `format` to `output` (`-`: `stdout`).
    ///
    /// # Errors
    /// As [`Writer::try_new`].
    pub fn try_new(
        format: OutputFormat,
        output: &str,
        schema: &Schema,
        stdout: &'a mut dyn Write,
    ) -> Result<Self> {
        let text_kinds = format.is_text();
        let schema = changelog_schema(schema, text_kinds);
        Ok(Self {
            writer: Writer::try_new(format, output, &schema, stdout)?,
            text_kinds,
            file: None,
        })
    }

    /// The changelog as CSV in the file `path`, which checkpoints make durable; resuming from
    /// `restored`, the file is truncated to its length at that checkpoint and appended to.
    ///
    /// # Errors
    /// A checkpoint written by another sink, and as [`TrackedFile::open`].
    pub fn durable_csv(path: &str, restored: Option<&Checkpoint>) -> Result<Self> {
        let resume_at = match restored {
            Some(chk) => Some(
                chk.meta(SINK_BYTES)
                    .map_err(|_| {
                        Error::invalid_input(
                            "the checkpoint was written with --emit final; resume with --emit final",
                        )
                    })?
                    .parse::<u64>()
                    .map_err(|_| Error::invalid_input("checkpoint: bad sink.bytes"))?,
            ),
            None => None,
        };
        let file = TrackedFile::open(path, resume_at)?;
        Ok(Self {
            writer: Writer::csv(Box::new(file.clone()), resume_at.unwrap_or(0) == 0),
            text_kinds: true,
            file: Some(file),
        })
    }

    /// The time spent waiting for batches formatting on the pool (CSV only, [`CsvWriter`]).
    pub fn waited(&self) -> Option<std::time::Duration> {
        match &self.writer {
            Writer::Csv(csv) => Some(csv.waited()),
            _ => None,
        }
    }

    /// Ends the output.
    ///
    /// # Errors
    /// I/O errors.
    pub fn finish(self) -> Result<()> {
        self.writer.finish()?;
        if let Some(file) = &self.file {
            file.sync()?;
        }
        Ok(())
    }
}

impl Sink for ChangelogWriter<'_> {
    fn write(&mut self, changes: &ChangeBatch) -> Result<()> {
        match &mut self.writer {
            // The op column's text is made on the pool too, with the rest of the formatting.
            Writer::Csv(csv) => {
                for (off, rows) in crate::sink::csv::pieces(changes.num_rows()) {
                    csv.write_with(changes.slice(off, rows), rows, |c| {
                        changelog_batch(&c, true)
                    })?;
                }
                Ok(())
            }
            writer => writer.write(&changelog_batch(changes, self.text_kinds)?),
        }
    }

    fn checkpoint(&mut self) -> Result<Checkpoint> {
        let mut chk = Checkpoint::default();
        match &self.file {
            Some(file) => {
                // Every change before the checkpoint is in the file before its length is
                // taken: the batches still formatting are written first.
                if let Writer::Csv(csv) = &mut self.writer {
                    csv.flush()?;
                }
                chk.meta.insert(SINK_BYTES.into(), file.sync()?.to_string());
            }
            None => {
                return Err(Error::invalid_input(
                    "checkpoints with --emit changelog need --output FILE in CSV (a resumed run truncates it to the checkpoint and appends); use --emit final for other outputs",
                ));
            }
        }
        Ok(chk)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::Int64Array;

    fn changes(start: i64, rows: usize) -> ChangeBatch {
        let schema = Arc::new(Schema::new(vec![Field::new("v", DataType::Int64, false)]));
        let v: Int64Array = (0..rows as i64).map(|i| start + i).collect();
        ChangeBatch::inserts(RecordBatch::try_new(schema, vec![Arc::new(v)]).unwrap())
    }

    /// A checkpoint of a durable changelog records the length of a file that holds every
    /// change written before it, batches formatting on the pool included; a resumed writer
    /// truncates to that length and appends.
    #[test]
    fn a_checkpoint_counts_every_change_written_before_it() {
        let dir = std::env::temp_dir().join(format!("tally-durable-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("changes.csv");
        let path = path.to_str().unwrap();
        let mut w = ChangelogWriter::durable_csv(path, None).unwrap();
        for (start, rows) in [(0, 3_000), (10_000, 5), (20_000, 4_000)] {
            w.write(&changes(start, rows)).unwrap();
        }
        let chk = w.checkpoint().unwrap();
        let len: u64 = chk.meta(SINK_BYTES).unwrap().parse().unwrap();
        let on_disk = std::fs::read_to_string(path).unwrap();
        assert_eq!(len, on_disk.len() as u64);
        assert_eq!(on_disk.lines().count(), 1 + 3_000 + 5 + 4_000);
        assert!(on_disk.ends_with("+I,23999\n"));
        // Changes after the checkpoint are cut off by a resume, which appends after it.
        w.write(&changes(30_000, 2_000)).unwrap();
        drop(w);
        let mut resumed = ChangelogWriter::durable_csv(path, Some(&chk)).unwrap();
        resumed.write(&changes(40_000, 1)).unwrap();
        resumed.finish().unwrap();
        let after = std::fs::read_to_string(path).unwrap();
        assert_eq!(after, format!("{on_disk}+I,40000\n"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
