//! File sources: CSV (header row matched by column name, empty field = NULL), Parquet and Arrow
//! IPC, read as change batches of a declared schema.

use std::fs::File;
use std::io::{BufRead, BufReader, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch, RecordBatchReader};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder,
};

use crate::changelog::op_codes;
use crate::error::{Error, Result};
use crate::pipeline::ChangeBatch;

/// A file format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Comma-separated values with a header row.
    Csv,
    /// Apache Parquet.
    Parquet,
    /// Arrow IPC (file or stream format).
    Arrow,
}

impl Format {
    /// Parses `csv`, `parquet` or `arrow`.
    ///
    /// # Errors
    /// Any other name.
    pub fn parse(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "csv" => Ok(Format::Csv),
            "parquet" => Ok(Format::Parquet),
            "arrow" | "ipc" => Ok(Format::Arrow),
            other => Err(Error::plan(format!(
                "format '{other}' is not supported (csv, parquet, arrow)"
            ))),
        }
    }
}

/// A table backed by a file.
#[derive(Debug, Clone)]
pub struct FileTable {
    /// The table's name.
    pub name: String,
    /// Declared columns.
    pub schema: SchemaRef,
    /// The file.
    pub path: PathBuf,
    /// Its format.
    pub format: Format,
    /// The column holding row kinds, if the file is a changelog (need not be declared).
    pub changelog_column: Option<String>,
    /// The column holding event time, for replay (must be declared).
    pub time_column: Option<String>,
}

/// An open source: an iterator of change batches plus, when known, the total row count.
pub struct SourceReader {
    inner: Box<dyn Iterator<Item = Result<ChangeBatch>> + Send>,
    /// Rows in the file, when the format says (Parquet).
    pub total_rows: Option<u64>,
}

impl std::fmt::Debug for SourceReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SourceReader")
            .field("total_rows", &self.total_rows)
            .finish()
    }
}

impl Iterator for SourceReader {
    type Item = Result<ChangeBatch>;
    fn next(&mut self) -> Option<Self::Item> {
        self.inner.next()
    }
}

impl SourceReader {
    /// Reads and decodes on a thread of its own, up to `depth` batches ahead, so that decoding
    /// overlaps the aggregation; batches (and the first error) arrive in file order. The thread
    /// stops when the reader is dropped.
    pub fn prefetch(self, depth: usize) -> SourceReader {
        let (tx, rx) = std::sync::mpsc::sync_channel(depth.max(1));
        let mut inner = self.inner;
        let spawned = std::thread::Builder::new()
            .name("tally-source".into())
            .spawn(move || {
                for item in inner.by_ref() {
                    let stop = item.is_err();
                    if tx.send(item).is_err() || stop {
                        break;
                    }
                }
            });
        let inner: Box<dyn Iterator<Item = Result<ChangeBatch>> + Send> = match spawned {
            Ok(_) => Box::new(rx.into_iter()),
            Err(e) => Box::new(std::iter::once(Err(Error::internal(format!(
                "cannot start the source thread: {e}"
            ))))),
        };
        SourceReader {
            inner,
            total_rows: self.total_rows,
        }
    }
}

fn open(path: &Path) -> Result<File> {
    File::open(path).map_err(|e| Error::io(format!("{}: {e}", path.display())))
}

impl FileTable {
    /// Opens the file and checks it against the declaration.
    ///
    /// # Errors
    /// A missing file, a declared column the file lacks, a type that cannot be converted, a
    /// corrupt file.
    pub fn open(&self, batch_size: usize) -> Result<SourceReader> {
        self.open_with(batch_size, 1)
    }

    /// As [`FileTable::open`], decoding up to `decoders` Parquet row groups at once on threads
    /// of their own; batches still come in file order (other formats read on one thread).
    ///
    /// # Errors
    /// As [`FileTable::open`].
    pub fn open_with(&self, batch_size: usize, decoders: usize) -> Result<SourceReader> {
        match self.format {
            Format::Parquet => self.open_parquet(batch_size, decoders),
            Format::Csv => self.open_csv(batch_size),
            Format::Arrow => self.open_arrow(),
        }
    }

    fn ctx(&self) -> String {
        format!("table '{}' ({})", self.name, self.path.display())
    }

    /// Maps a batch read from the file (any column order, extra columns) to the declared schema
    /// and the row kinds.
    fn convert(&self, batch: &RecordBatch) -> Result<ChangeBatch> {
        let file_schema = batch.schema();
        let mut cols: Vec<ArrayRef> = Vec::with_capacity(self.schema.fields().len());
        for f in self.schema.fields() {
            let i = file_schema.index_of(f.name()).map_err(|_| {
                Error::invalid_input(format!(
                    "{}: column '{}' is not in the file",
                    self.ctx(),
                    f.name()
                ))
            })?;
            let c = batch.column(i);
            cols.push(if c.data_type() == f.data_type() {
                Arc::clone(c)
            } else {
                // Not the safe cast, which would turn values it cannot read into NULLs.
                let strict = arrow::compute::CastOptions {
                    safe: false,
                    ..Default::default()
                };
                arrow::compute::cast_with_options(c, f.data_type(), &strict).map_err(|e| {
                    Error::invalid_input(format!(
                        "{}: column '{}' holds {} that cannot be read as {}: {e}",
                        self.ctx(),
                        f.name(),
                        c.data_type(),
                        f.data_type()
                    ))
                })?
            });
        }
        let op = match &self.changelog_column {
            None => None,
            Some(name) => {
                let i = file_schema.index_of(name).map_err(|_| {
                    Error::invalid_input(format!(
                        "{}: changelog column '{name}' is not in the file",
                        self.ctx()
                    ))
                })?;
                Some(
                    op_codes(batch.column(i))
                        .map_err(|e| Error::invalid_input(format!("{}: {e}", self.ctx())))?,
                )
            }
        };
        let data = RecordBatch::try_new(Arc::clone(&self.schema), cols)
            .map_err(|e| Error::invalid_input(format!("{}: {e}", self.ctx())))?;
        Ok(ChangeBatch { op, data })
    }

    /// Names of the file columns this table reads.
    fn needed(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .schema
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect();
        v.extend(self.changelog_column.clone());
        v
    }

    fn check_columns(&self, file_schema: &Schema) -> Result<()> {
        for name in self.needed() {
            if file_schema.index_of(&name).is_err() {
                let have: Vec<&str> = file_schema
                    .fields()
                    .iter()
                    .map(|f| f.name().as_str())
                    .collect();
                return Err(Error::invalid_input(format!(
                    "{}: column '{name}' is not in the file (it has: {})",
                    self.ctx(),
                    have.join(", ")
                )));
            }
        }
        Ok(())
    }

    fn open_parquet(&self, batch_size: usize, decoders: usize) -> Result<SourceReader> {
        let file = open(&self.path)?;
        let metadata = ArrowReaderMetadata::load(&file, ArrowReaderOptions::default())
            .map_err(|e| Error::io(format!("{}: not a readable Parquet file: {e}", self.ctx())))?;
        let builder = ParquetRecordBatchReaderBuilder::new_with_metadata(file, metadata.clone());
        let file_schema = Arc::clone(builder.schema());
        self.check_columns(&file_schema)?;
        let needed = self.needed();
        let roots: Vec<usize> = file_schema
            .fields()
            .iter()
            .enumerate()
            .filter(|(_, f)| needed.contains(f.name()))
            .map(|(i, _)| i)
            .collect();
        let mask = ProjectionMask::roots(builder.parquet_schema(), roots);
        let total_rows = Some(builder.metadata().file_metadata().num_rows() as u64);
        let row_groups = builder.metadata().num_row_groups();
        let decoders = decoders.min(row_groups);
        if decoders > 1 {
            return Ok(self.parallel_parquet(metadata, mask, batch_size, decoders, total_rows));
        }
        let reader = builder
            .with_projection(mask)
            .with_batch_size(batch_size)
            .build()
            .map_err(|e| Error::io(format!("{}: {e}", self.ctx())))?;
        let table = self.clone();
        let ctx = self.ctx();
        Ok(SourceReader {
            inner: Box::new(reader.map(move |b| {
                let b = b.map_err(|e| Error::io(format!("{ctx}: {e}")))?;
                table.convert(&b)
            })),
            total_rows,
        })
    }

    /// Decoder `k` of `decoders` decodes row groups `k, k + decoders, …` and sends each one's
    /// batches, then an end marker, on its own channel; the reader takes the row groups in order
    /// from the channels in turn, so batches come in file order.
    fn parallel_parquet(
        &self,
        metadata: ArrowReaderMetadata,
        mask: ProjectionMask,
        batch_size: usize,
        decoders: usize,
        total_rows: Option<u64>,
    ) -> SourceReader {
        let row_groups = metadata.metadata().num_row_groups();
        let mut receivers = Vec::with_capacity(decoders);
        for k in 0..decoders {
            let (tx, rx) = std::sync::mpsc::sync_channel::<Option<Result<ChangeBatch>>>(2);
            receivers.push(rx);
            let (table, metadata, mask) = (self.clone(), metadata.clone(), mask.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("tally-parquet-{k}"))
                .spawn(move || {
                    let ctx = table.ctx();
                    for rg in (k..row_groups).step_by(decoders) {
                        let reader = open(&table.path).and_then(|f| {
                            ParquetRecordBatchReaderBuilder::new_with_metadata(f, metadata.clone())
                                .with_row_groups(vec![rg])
                                .with_projection(mask.clone())
                                .with_batch_size(batch_size)
                                .build()
                                .map_err(|e| Error::io(format!("{ctx}: {e}")))
                        });
                        let reader = match reader {
                            Ok(r) => r,
                            Err(e) => {
                                let _ = tx.send(Some(Err(e)));
                                return;
                            }
                        };
                        for b in reader {
                            let item = b
                                .map_err(|e| Error::io(format!("{ctx}: {e}")))
                                .and_then(|b| table.convert(&b));
                            let stop = item.is_err();
                            if tx.send(Some(item)).is_err() || stop {
                                return;
                            }
                        }
                        if tx.send(None).is_err() {
                            return;
                        }
                    }
                });
            if let Err(e) = spawned {
                let msg = format!("cannot start a Parquet decoder thread: {e}");
                return SourceReader {
                    inner: Box::new(std::iter::once(Err(Error::internal(msg)))),
                    total_rows,
                };
            }
        }
        let mut rg = 0;
        let mut failed = false;
        let inner = std::iter::from_fn(move || {
            while rg < row_groups && !failed {
                match receivers[rg % decoders].recv() {
                    Ok(Some(item)) => {
                        failed = item.is_err();
                        return Some(item);
                    }
                    Ok(None) => rg += 1,
                    Err(_) => {
                        failed = true;
                        return Some(Err(Error::internal("a Parquet decoder thread stopped")));
                    }
                }
            }
            None
        });
        SourceReader {
            inner: Box::new(inner),
            total_rows,
        }
    }

    fn open_csv(&self, batch_size: usize) -> Result<SourceReader> {
        let mut file = open(&self.path)?;
        let mut header = String::new();
        BufReader::new(&mut file)
            .read_line(&mut header)
            .map_err(|e| Error::io(format!("{}: {e}", self.ctx())))?;
        if header.trim().is_empty() {
            return Err(Error::invalid_input(format!(
                "{}: the CSV file has no header row",
                self.ctx()
            )));
        }
        file.seek(SeekFrom::Start(0))?;
        let names: Vec<String> = header
            .trim_end_matches(['\r', '\n'])
            .split(',')
            .map(|s| s.trim().trim_matches('"').to_string())
            .collect();
        // Declared columns get their types; the changelog column and undeclared ones are read as
        // strings and dropped by `convert`.
        let file_schema = Arc::new(Schema::new(
            names
                .iter()
                .map(|n| {
                    let dt = self
                        .schema
                        .field_with_name(n)
                        .map_or(DataType::Utf8, |f| f.data_type().clone());
                    Field::new(n, dt, true)
                })
                .collect::<Vec<_>>(),
        ));
        self.check_columns(&file_schema)?;
        let reader = arrow::csv::ReaderBuilder::new(file_schema)
            .with_header(true)
            .with_batch_size(batch_size)
            .build(file)
            .map_err(|e| Error::io(format!("{}: {e}", self.ctx())))?;
        let table = self.clone();
        let ctx = self.ctx();
        Ok(SourceReader {
            inner: Box::new(reader.map(move |b| {
                let b = b.map_err(|e| Error::invalid_input(format!("{ctx}: {e}")))?;
                table.convert(&b)
            })),
            total_rows: None,
        })
    }

    fn open_arrow(&self) -> Result<SourceReader> {
        let ctx = self.ctx();
        let reader: Box<dyn RecordBatchReader + Send> =
            match arrow::ipc::reader::FileReader::try_new(open(&self.path)?, None) {
                Ok(r) => Box::new(r),
                Err(_) => Box::new(
                    arrow::ipc::reader::StreamReader::try_new(open(&self.path)?, None).map_err(
                        |e| Error::io(format!("{ctx}: not an Arrow IPC file or stream: {e}")),
                    )?,
                ),
            };
        self.check_columns(&reader.schema())?;
        let table = self.clone();
        Ok(SourceReader {
            inner: Box::new(reader.map(move |b| {
                let b = b.map_err(|e| Error::io(format!("{ctx}: {e}")))?;
                table.convert(&b)
            })),
            total_rows: None,
        })
    }
}
