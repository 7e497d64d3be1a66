//! File sources: CSV (header row matched by column name, empty field = NULL), Parquet and Arrow
//! IPC, read as change batches of a declared schema (the declaration and the conversion here),
//! whole (`csv.rs`, `parquet_reader.rs`, `ipc.rs`) or in splits (`splits.rs`, and CSV's own in
//! `csv.rs`).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch};
use arrow::datatypes::{DataType, Schema, SchemaRef};

use crate::changelog::ChangeBatch;
use crate::changelog::op_codes;
use crate::decode::guarded;
use crate::error::{Error, Result};
use crate::runtime::Activity;

mod csv;
mod ipc;
mod parquet_chunks;
mod parquet_dictionaries;
mod parquet_reader;
mod splits;

use ipc::Rechunk;

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
    /// Declared string (Utf8) columns that may arrive dictionary-encoded, as
    /// `Dictionary(Int32, Utf8)`: Parquet reads them so where every page of the column is
    /// dictionary encoded. Only for consumers that take either form ([`crate::run::Job`] fills
    /// it from [`crate::pipeline::Pipeline::dictionary_columns`]).
    pub dictionary_columns: Vec<String>,
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

impl FileTable {
    /// The error of an input that ends (after `total` rows) before a restored checkpoint's
    /// position `start`.
    pub(crate) fn past_end(&self, start: u64) -> impl Fn(u64) -> Error + Send + Clone + 'static {
        let path = self.path.display().to_string();
        move |total: u64| {
            Error::invalid_input(format!(
                "the checkpoint's source position ({start} rows) is past the end of {path} ({total} rows): it was taken over another input"
            ))
        }
    }
}

impl SourceReader {
    /// The rows after the first `rows` (a restored checkpoint's position); `past_end(rows
    /// read)` is the error when the input ends before them.
    pub(crate) fn skip_rows(
        self,
        rows: u64,
        past_end: impl FnOnce(u64) -> Error + Send + 'static,
    ) -> SourceReader {
        let mut inner = self.inner;
        let (mut skipped, mut past_end) = (0u64, Some(past_end));
        SourceReader {
            inner: Box::new(std::iter::from_fn(move || {
                while skipped < rows {
                    match inner.next() {
                        None => return past_end.take().map(|f| Err(f(skipped))),
                        Some(Err(e)) => return Some(Err(e)),
                        Some(Ok(b)) => {
                            let n = b.num_rows() as u64;
                            let drop = (rows - skipped).min(n);
                            skipped += drop;
                            if drop < n {
                                return Some(Ok(b.slice(drop as usize, (n - drop) as usize)));
                            }
                        }
                    }
                }
                inner.next()
            })),
            total_rows: self.total_rows,
        }
    }

    /// Reads and decodes on a thread of its own, up to `depth` batches ahead, so that decoding
    /// overlaps the aggregation; batches (and the first error) arrive in file order. The thread
    /// stops when the reader is dropped.
    ///
    /// With `activity`, the reading thread counts as a task, busy but while it waits to hand a
    /// batch on.
    pub fn prefetch(self, depth: usize, activity: Option<Arc<Activity>>) -> SourceReader {
        let (tx, rx) = std::sync::mpsc::sync_channel(depth.max(1));
        let mut inner = self.inner;
        let spawned = std::thread::Builder::new()
            .name("tally-source".into())
            .spawn(move || {
                if let Some(a) = &activity {
                    a.change(1);
                }
                for item in inner.by_ref() {
                    let stop = item.is_err();
                    let sent = match &activity {
                        Some(a) => a.send(&tx, item).0,
                        None => tx.send(item),
                    };
                    if sent.is_err() || stop {
                        break;
                    }
                }
                if let Some(a) = &activity {
                    a.change(-1);
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

/// The NULL columns a reader hands out for unread columns: each a slice of one array, made
/// again only when a longer batch comes (a fresh NULL array per batch would zero its buffers
/// every time).
#[derive(Debug, Default)]
struct NullColumns(Vec<(usize, ArrayRef)>);

impl NullColumns {
    /// `len` NULLs of type `dt` for column `at`.
    fn get(&mut self, at: usize, dt: &DataType, len: usize) -> ArrayRef {
        match self.0.iter_mut().find(|(i, _)| *i == at) {
            Some((_, a)) if a.len() >= len => a.slice(0, len),
            Some((_, a)) => {
                *a = arrow::array::new_null_array(dt, len);
                Arc::clone(a)
            }
            None => {
                let a = arrow::array::new_null_array(dt, len);
                self.0.push((at, Arc::clone(&a)));
                a
            }
        }
    }
}

fn open(path: &Path) -> Result<File> {
    File::open(path).map_err(|e| Error::io(format!("{}: {e}", path.display())))
}

impl FileTable {
    /// The declared columns outside `read` (by index) that may go undecoded: nullable ones,
    /// not the time column, one column at least read ([`FileTable::unread_columns`]).
    pub fn unread_outside(&self, read: &std::collections::BTreeSet<usize>) -> Vec<String> {
        let fields = self.schema.fields();
        let unread: Vec<String> = fields
            .iter()
            .enumerate()
            .filter(|(i, f)| {
                !read.contains(i)
                    && f.is_nullable()
                    && self.time_column.as_deref() != Some(f.name().as_str())
            })
            .map(|(_, f)| f.name().clone())
            .collect();
        if unread.len() == fields.len() {
            return unread[1..].to_vec();
        }
        unread
    }

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
        self.convert_to(batch, &self.schema, &mut NullColumns::default())
    }

    /// As [`FileTable::convert`], to `schema`: the declared schema or, for Parquet, the one
    /// with some string columns read as dictionaries. The unread columns are cut from `nulls`.
    fn convert_to(
        &self,
        batch: &RecordBatch,
        schema: &SchemaRef,
        nulls: &mut NullColumns,
    ) -> Result<ChangeBatch> {
        let file_schema = batch.schema();
        let mut cols: Vec<ArrayRef> = Vec::with_capacity(schema.fields().len());
        for (at, f) in schema.fields().iter().enumerate() {
            if file_schema.index_of(f.name()).is_err() && self.is_unread(f.name()) {
                cols.push(nulls.get(at, f.data_type(), batch.num_rows()));
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
        let data = RecordBatch::try_new(Arc::clone(schema), cols)
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
}
