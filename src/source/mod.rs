//! File sources: CSV (header row matched by column name, empty field = NULL), Parquet and Arrow
//! IPC, read as change batches of a declared schema, whole or in splits (`splits.rs`).

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch, RecordBatchReader};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder,
};

use crate::changelog::ChangeBatch;
use crate::changelog::op_codes;
use crate::decode::{check_ipc_lengths, guarded};
use crate::error::{Error, Result};

mod splits;

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
    /// The format's name, as the DDL's `'format'` option spells it.
    pub fn name(self) -> &'static str {
        match self {
            Format::Csv => "csv",
            Format::Parquet => "parquet",
            Format::Arrow => "arrow",
        }
    }

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
    /// Declared columns that nothing reads: Parquet leaves them undecoded and they arrive as
    /// NULLs (other formats read them anyway). Each must be nullable and not the time column;
    /// [`crate::run::Job`] fills it with the columns its pipeline never reads.
    pub unread_columns: Vec<String>,
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
        let ctx = self.ctx();
        let reader = guarded(&ctx, || match self.format {
            Format::Parquet => self.open_parquet(batch_size, decoders),
            Format::Csv => self.open_csv(batch_size),
            Format::Arrow => self.open_arrow(batch_size),
        })?;
        Ok(self.guard(reader))
    }

    /// Reads `reader`'s batches under the decoder panic guard; the first error ends it.
    fn guard(&self, reader: SourceReader) -> SourceReader {
        let ctx = self.ctx();
        let mut inner = reader.inner;
        let mut done = false;
        SourceReader {
            inner: Box::new(std::iter::from_fn(move || {
                if done {
                    return None;
                }
                match guarded(&ctx, || Ok(inner.next())) {
                    Ok(item) => item,
                    Err(e) => {
                        done = true;
                        Some(Err(e))
                    }
                }
            })),
            total_rows: reader.total_rows,
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
            if file_schema.index_of(f.name()).is_err() && self.is_unread(f.name()) {
                cols.push(arrow::array::new_null_array(
                    f.data_type(),
                    batch.num_rows(),
                ));
                continue;
            }
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

    /// Names of the file columns this table declares (and its changelog column).
    fn declared(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .schema
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect();
        v.extend(self.changelog_column.clone());
        v
    }

    /// Names of the file columns this table decodes: the declared ones but the unread.
    fn needed(&self) -> Vec<String> {
        let mut v = self.declared();
        v.retain(|name| !self.is_unread(name));
        v
    }

    /// Whether `name` is a declared column left unread (nullable, not the time column).
    fn is_unread(&self, name: &str) -> bool {
        self.unread_columns.iter().any(|u| u == name)
            && self.time_column.as_deref() != Some(name)
            && self
                .schema
                .field_with_name(name)
                .is_ok_and(|f| f.is_nullable())
    }

    /// Checks that the file has every declared column (read or not).
    fn check_columns(&self, file_schema: &Schema) -> Result<()> {
        for name in self.declared() {
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

    /// A Parquet file's metadata (checked against the declared columns) and the projection of
    /// the columns this table decodes.
    fn parquet_metadata(&self) -> Result<(File, ArrowReaderMetadata, ProjectionMask)> {
        let file = open(&self.path)?;
        let metadata = ArrowReaderMetadata::load(&file, ArrowReaderOptions::default())
            .map_err(|e| Error::io(format!("{}: not a readable Parquet file: {e}", self.ctx())))?;
        self.check_columns(metadata.schema())?;
        let needed = self.needed();
        let roots: Vec<usize> = metadata
            .schema()
            .fields()
            .iter()
            .enumerate()
            .filter(|(_, f)| needed.contains(f.name()))
            .map(|(i, _)| i)
            .collect();
        let mask = ProjectionMask::roots(metadata.parquet_schema(), roots);
        Ok((file, metadata, mask))
    }

    fn open_parquet(&self, batch_size: usize, decoders: usize) -> Result<SourceReader> {
        let (file, metadata, mask) = self.parquet_metadata()?;
        let builder = ParquetRecordBatchReaderBuilder::new_with_metadata(file, metadata.clone());
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
                        let reader = guarded(&ctx, || {
                            open(&table.path).and_then(|f| {
                                ParquetRecordBatchReaderBuilder::new_with_metadata(
                                    f,
                                    metadata.clone(),
                                )
                                .with_row_groups(vec![rg])
                                .with_projection(mask.clone())
                                .with_batch_size(batch_size)
                                .build()
                                .map_err(|e| Error::io(format!("{ctx}: {e}")))
                            })
                        });
                        let reader = match reader {
                            Ok(r) => r,
                            Err(e) => {
                                let _ = tx.send(Some(Err(e)));
                                return;
                            }
                        };
                        let mut reader = reader;
                        loop {
                            let item = match guarded(&ctx, || Ok(reader.next())) {
                                Ok(None) => break,
                                Ok(Some(b)) => b
                                    .map_err(|e| Error::io(format!("{ctx}: {e}")))
                                    .and_then(|b| table.convert(&b)),
                                Err(e) => Err(e),
                            };
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

    fn open_arrow(&self, batch_size: usize) -> Result<SourceReader> {
        let ctx = self.ctx();
        let mut file = open(&self.path)?;
        let mut head = Vec::with_capacity(8);
        (&mut file)
            .take(8)
            .read_to_end(&mut head)
            .map_err(|e| Error::io(format!("{ctx}: {e}")))?;
        file.seek(SeekFrom::Start(0))?;
        // The file format starts with the magic `ARROW1`. A file that has it but does not open as
        // a file is corrupt, and is not retried as a stream: that would read the magic as a
        // message length (`ARRO`: 1.3 GB, which arrow-ipc allocates before reading).
        let reader: Box<dyn RecordBatchReader + Send> = if head.starts_with(b"ARROW1") {
            let corrupt = |e: &dyn std::fmt::Display| {
                Error::io(format!("{ctx}: not a readable Arrow IPC file: {e}"))
            };
            check_ipc_lengths(&mut file, true).map_err(|e| corrupt(&e))?;
            Box::new(arrow::ipc::reader::FileReader::try_new(file, None).map_err(|e| corrupt(&e))?)
        } else {
            let not_ipc = |e: &dyn std::fmt::Display| {
                Error::io(format!("{ctx}: not an Arrow IPC file or stream: {e}"))
            };
            check_ipc_lengths(&mut file, false).map_err(|e| not_ipc(&e))?;
            Box::new(
                arrow::ipc::reader::StreamReader::try_new(file, None).map_err(|e| not_ipc(&e))?,
            )
        };
        self.check_columns(&reader.schema())?;
        let table = self.clone();
        let rechunked = Rechunk::new(reader, batch_size);
        Ok(SourceReader {
            inner: Box::new(rechunked.map(move |b| {
                let b = b.map_err(|e| Error::io(format!("{ctx}: {e}")))?;
                table.convert(&b)
            })),
            total_rows: None,
        })
    }
}

/// The batches of an Arrow IPC reader re-cut to `batch_size` rows each (the last may be
/// shorter), whatever batches the file was written in, so that `--batch-size` means the same
/// for every format. Larger batches are sliced; smaller ones are gathered (copied) into one.
struct Rechunk {
    inner: Box<dyn RecordBatchReader + Send>,
    batch_size: usize,
    coalescer: arrow::compute::BatchCoalescer,
    done: bool,
}

impl Rechunk {
    fn new(inner: Box<dyn RecordBatchReader + Send>, batch_size: usize) -> Self {
        let batch_size = batch_size.max(1);
        Self {
            coalescer: arrow::compute::BatchCoalescer::new(inner.schema(), batch_size),
            inner,
            batch_size,
            done: false,
        }
    }
}

impl Iterator for Rechunk {
    type Item = std::result::Result<RecordBatch, arrow::error::ArrowError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(b) = self.coalescer.next_completed_batch() {
                return Some(Ok(b));
            }
            if self.done {
                return None;
            }
            match self.inner.next() {
                Some(Ok(b)) => {
                    // Zero-copy slices of a batch at least twice the size; the coalescer
                    // gathers the rest.
                    let mut b = b;
                    while self.coalescer.is_empty() && b.num_rows() >= 2 * self.batch_size {
                        let head = b.slice(0, self.batch_size);
                        b = b.slice(self.batch_size, b.num_rows() - self.batch_size);
                        if let Err(e) = self.coalescer.push_batch(head) {
                            return Some(Err(e));
                        }
                    }
                    if let Err(e) = self.coalescer.push_batch(b) {
                        return Some(Err(e));
                    }
                }
                Some(Err(e)) => {
                    self.done = true;
                    return Some(Err(e));
                }
                None => {
                    self.done = true;
                    if let Err(e) = self.coalescer.finish_buffered_batch() {
                        return Some(Err(e));
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::Int64Array;

    fn table(path: PathBuf) -> FileTable {
        FileTable {
            name: "t".into(),
            schema: Arc::new(Schema::new(vec![Field::new("v", DataType::Int64, true)])),
            path,
            format: Format::Arrow,
            changelog_column: None,
            time_column: None,
            unread_columns: vec![],
        }
    }

    fn rows(path: PathBuf) -> usize {
        table(path)
            .open(8)
            .unwrap()
            .map(|b| b.unwrap().data.num_rows())
            .sum()
    }

    /// `batch_size` re-cuts an Arrow file's batches, whatever sizes they were written in:
    /// every batch but the last has exactly that many rows, in file order.
    #[test]
    fn arrow_batches_are_recut_to_the_batch_size() {
        let dir = std::env::temp_dir().join(format!("tally-recut-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.arrow");
        let schema = table(PathBuf::new()).schema;
        let mut w =
            arrow::ipc::writer::FileWriter::try_new(std::fs::File::create(&path).unwrap(), &schema)
                .unwrap();
        let mut next = 0i64;
        for n in [5, 1, 100, 0, 7, 16] {
            let values: Vec<i64> = (next..next + n).collect();
            next += n;
            let b = RecordBatch::try_new(
                Arc::clone(&schema),
                vec![Arc::new(Int64Array::from(values))],
            )
            .unwrap();
            w.write(&b).unwrap();
        }
        w.finish().unwrap();
        for batch_size in [1, 8, 40, 1000] {
            let batches: Vec<RecordBatch> = table(path.clone())
                .open(batch_size)
                .unwrap()
                .map(|b| b.unwrap().data)
                .collect();
            let sizes: Vec<usize> = batches.iter().map(RecordBatch::num_rows).collect();
            let (last, full) = sizes.split_last().unwrap();
            assert!(
                full.iter().all(|&n| n == batch_size),
                "{batch_size}: {sizes:?}"
            );
            assert!((1..=batch_size).contains(last), "{batch_size}: {sizes:?}");
            let values: Vec<i64> = batches
                .iter()
                .flat_map(|b| {
                    b.column(0)
                        .as_any()
                        .downcast_ref::<Int64Array>()
                        .unwrap()
                        .values()
                        .to_vec()
                })
                .collect();
            assert_eq!(values, (0..next).collect::<Vec<_>>(), "{batch_size}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Lengths that arrow-ipc would allocate before reading are checked against the file first:
    /// a corrupt IPC file is not retried as a stream (which read the magic `ARRO` as a 1.3 GB
    /// message length), a footer block past the end of the file (found by `fuzz/`: 17 GB, an
    /// abort) and a file of another format declared as 'arrow' (its first bytes read as a
    /// metadata length) are one-line errors.
    #[test]
    fn corrupt_and_foreign_arrow_files_fail_without_huge_allocations() {
        let dir = std::env::temp_dir().join(format!("tally-source-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let schema = table(PathBuf::new()).schema;
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![Arc::new(Int64Array::from(vec![1, 2, 3]))],
        )
        .unwrap();
        let mut file = vec![];
        let mut w = arrow::ipc::writer::FileWriter::try_new(&mut file, &schema).unwrap();
        w.write(&batch).unwrap();
        w.finish().unwrap();
        drop(w);
        let mut stream = vec![];
        let mut w = arrow::ipc::writer::StreamWriter::try_new(&mut stream, &schema).unwrap();
        w.write(&batch).unwrap();
        w.finish().unwrap();
        drop(w);
        for (name, bytes) in [("file.arrow", &file), ("stream.arrow", &stream)] {
            std::fs::write(dir.join(name), bytes).unwrap();
            assert_eq!(rows(dir.join(name)), 3, "{name}");
        }
        // The record batch block of the footer, with a body of 2^40 bytes.
        let footer_len =
            i32::from_le_bytes(file[file.len() - 10..file.len() - 6].try_into().unwrap());
        let footer_at = file.len() - 10 - footer_len as usize;
        let block = *arrow::ipc::root_as_footer(&file[footer_at..file.len() - 10])
            .unwrap()
            .recordBatches()
            .unwrap()
            .get(0);
        let mut pattern = block.offset().to_le_bytes().to_vec();
        pattern.extend(block.metaDataLength().to_le_bytes());
        pattern.extend([0; 4]);
        pattern.extend(block.bodyLength().to_le_bytes());
        let at = footer_at
            + file[footer_at..]
                .windows(pattern.len())
                .position(|w| w == pattern)
                .unwrap();
        let mut huge_block = file.clone();
        huge_block[at + 16..at + 24].copy_from_slice(&(1i64 << 40).to_le_bytes());
        for (name, bytes, needle) in [
            ("huge_block.arrow", huge_block, "a block of"),
            (
                "truncated.arrow",
                file[..file.len() / 2].to_vec(),
                "not a readable Arrow IPC file",
            ),
            (
                "orders.csv",
                b"shop,v\na,1\n".to_vec(),
                "declares 1886349427 bytes of metadata",
            ),
            (
                "orders.parquet",
                b"PAR1 not really".to_vec(),
                "declares 827474256 bytes of metadata",
            ),
        ] {
            std::fs::write(dir.join(name), bytes).unwrap();
            let e = table(dir.join(name)).open(8).unwrap_err().to_string();
            assert!(
                e.contains(name) && e.contains(needle) && !e.contains('\n'),
                "{e}"
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
