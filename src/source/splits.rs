//! Splitting a file source across workers, for the pipelined runtime: Parquet by row ranges
//! (whole row groups, cut where a split's boundary falls inside one) or by chunks of rows dealt
//! in turn (for a changelog), Arrow IPC files by record batches, CSV by byte ranges or by chunks
//! of records dealt in turn (`csv.rs`). Each split reads its part in file order on the thread
//! that consumes it.

use std::sync::Arc;

use super::parquet_chunks::{ChunkBuffers, RowGroupChunks};
use super::parquet_dictionaries::SharedDictionaries;
use super::parquet_reader::ParquetScan;
use super::{FileTable, Format, NullColumns, Rechunk, SourceReader, open};
use crate::changelog::ChangeBatch;
use crate::decode::{check_ipc_lengths, guarded};
use crate::error::{Error, Result};

/// One split's share of a Parquet file: for each row group it reads, in file order, the row
/// ranges (first row within the group, rows) it reads, in order.
type RowGroupShare = Vec<(usize, Vec<(usize, usize)>)>;

impl FileTable {
    /// Opens the file as up to `n` splits that together read every row once, each in file
    /// order (batches of `batch_size` rows). Parquet splits into equal row ranges (cutting a row
    /// group where a boundary falls inside one); an Arrow IPC file by record batches; CSV by
    /// byte ranges cut at line ends (one split when a field may be quoted); an Arrow stream is
    /// one split. Empty splits are left out.
    ///
    /// # Errors
    /// As [`FileTable::open`].
    pub fn open_splits(&self, batch_size: usize, n: usize) -> Result<Vec<SourceReader>> {
        let n = n.max(1);
        match self.format {
            Format::Parquet if n > 1 => {
                let ctx = self.ctx();
                guarded(&ctx, || self.parquet_splits(batch_size, n))
            }
            Format::Arrow if n > 1 => {
                let ctx = self.ctx();
                guarded(&ctx, || self.arrow_splits(batch_size, n))
            }
            Format::Csv if n > 1 => {
                let ctx = self.ctx();
                guarded(&ctx, || self.csv_splits(batch_size, n))
            }
            _ => Ok(vec![self.open(batch_size)?]),
        }
    }

    /// Opens the rows after the first `start` as up to `n` splits of chunks of `chunk` rows
    /// dealt in turn: split `s` reads chunks `s`, `s + n`, … in file order (the layout of
    /// [`crate::operator::pipelined::InputOrder::Chunks`]; `start` is a restored checkpoint's
    /// position). Parquet (a row selection per row group) and CSV (the byte ranges of its
    /// chunks of records, found by one scan; a file with a double quote is one split), Arrow
    /// IPC files (the record batches that hold each split's chunks, found from the footer and
    /// the batches' headers); an Arrow stream, and `n` = 1 without a `start`, are one split
    /// reading everything after `start`. Empty splits are left out (only the last ones can be).
    ///
    /// # Errors
    /// As [`FileTable::open`], and a `start` past the end of the file.
    pub fn open_chunked_splits(
        &self,
        batch_size: usize,
        n: usize,
        chunk: usize,
        start: u64,
    ) -> Result<Vec<SourceReader>> {
        let past_end = self.past_end(start);
        match self.format {
            Format::Parquet if n > 1 || start > 0 => {
                let ctx = self.ctx();
                let chunk = chunk.max(1);
                guarded(&ctx, || {
                    self.parquet_shared(batch_size, |sizes| {
                        let total: usize = sizes.iter().sum();
                        match usize::try_from(start) {
                            Ok(start) if start <= total => {
                                Ok(deal_chunks(sizes, n.max(1), chunk, start))
                            }
                            _ => Err(past_end.clone()(total as u64)),
                        }
                    })
                })
            }
            Format::Csv | Format::Arrow if n > 1 || start > 0 => {
                let ctx = self.ctx();
                let chunk = chunk.max(1);
                let dealt = guarded(&ctx, || {
                    let past_end = past_end.clone();
                    if self.format == Format::Csv {
                        self.csv_chunked_splits(batch_size, n, chunk, start, past_end)
                    } else {
                        self.arrow_chunked_splits(batch_size, n, chunk, start, past_end)
                    }
                })?;
                match dealt {
                    Some(splits) => Ok(splits),
                    // A CSV file with a quote, or an Arrow stream: one split.
                    None => Ok(vec![self.open(batch_size)?.skip_rows(start, past_end)]),
                }
            }
            _ => {
                let reader = self.open(batch_size)?;
                if start == 0 {
                    return Ok(vec![reader]);
                }
                Ok(vec![reader.skip_rows(start, past_end)])
            }
        }
    }

    pub(super) fn parquet_splits(&self, batch_size: usize, n: usize) -> Result<Vec<SourceReader>> {
        self.parquet_shared(batch_size, |sizes| Ok(share_row_groups(sizes, n)))
    }

    /// One split per non-empty share that `shares` makes of the row groups (of the sizes
    /// given).
    fn parquet_shared(
        &self,
        batch_size: usize,
        shares: impl FnOnce(&[usize]) -> Result<Vec<RowGroupShare>>,
    ) -> Result<Vec<SourceReader>> {
        let ParquetScan {
            metadata,
            mask,
            schema,
            ..
        } = self.parquet_metadata(true)?;
        let sizes: Vec<usize> = metadata
            .metadata()
            .row_groups()
            .iter()
            .map(|rg| usize::try_from(rg.num_rows()).unwrap_or(0))
            .collect();
        let total_rows = Some(sizes.iter().sum::<usize>() as u64);
        let shares = shares(&sizes)?;
        // How many splits read each row group: those that cut one between them share its
        // decompressed dictionary pages.
        let mut readers = vec![0usize; sizes.len()];
        for (rg, _) in shares.iter().flatten() {
            readers[*rg] += 1;
        }
        let dictionaries = Arc::new(SharedDictionaries::new(readers));
        let mut splits = vec![];
        for share in shares {
            if share.is_empty() {
                continue;
            }
            let (table, metadata, mask) = (self.clone(), metadata.clone(), mask.clone());
            let schema = Arc::clone(&schema);
            let mut nulls = NullColumns::default();
            let sizes = sizes.clone();
            let ctx = self.ctx();
            let mut groups = share.into_iter();
            let buffers = ChunkBuffers::default();
            let dictionaries = Arc::clone(&dictionaries);
            let mut current: Option<parquet::arrow::arrow_reader::ParquetRecordBatchReader> = None;
            let inner = std::iter::from_fn(move || {
                loop {
                    if let Some(reader) = &mut current {
                        match reader.next() {
                            Some(b) => {
                                return Some(
                                    b.map_err(|e| Error::io(format!("{ctx}: {e}")))
                                        .and_then(|b| table.convert_to(&b, &schema, &mut nulls)),
                                );
                            }
                            None => current = None,
                        }
                    }
                    let (rg, ranges) = groups.next()?;
                    let part = (ranges != [(0, sizes[rg])]).then_some(ranges.as_slice());
                    let built = RowGroupChunks::reader(
                        &table,
                        &metadata,
                        rg,
                        &mask,
                        &buffers,
                        batch_size,
                        part,
                        Some(&dictionaries),
                    );
                    match built {
                        Ok(r) => current = Some(r),
                        Err(e) => {
                            groups = Vec::new().into_iter();
                            return Some(Err(e));
                        }
                    }
                }
            });
            splits.push(self.guard(SourceReader {
                inner: Box::new(inner),
                total_rows,
            }));
        }
        Ok(splits)
    }

    /// Whether the file can be read in parts by several splits, dealt in chunks of rows or in
    /// any parts: Parquet, CSV without a double quote, and Arrow IPC files
    /// (not streams). Where it cannot, [`FileTable::open_splits`] and
    /// [`FileTable::open_chunked_splits`] make one split.
    ///
    /// # Errors
    /// The file cannot be read.
    pub fn can_split(&self) -> Result<bool> {
        match self.format {
            Format::Parquet => Ok(true),
            Format::Csv => {
                let (header_len, _) = self.csv_header()?;
                let mut file = open(&self.path)?;
                Ok(!super::csv::has_quote(&mut file, header_len).map_err(|e| self.io_error(&e))?)
            }
            Format::Arrow => self.is_ipc_file(),
        }
    }

    /// Whether the Arrow source is an IPC file (it starts with the magic `ARROW1`), not a
    /// stream, which has no index of its batches.
    fn is_ipc_file(&self) -> Result<bool> {
        let mut head = [0u8; 6];
        let mut file = open(&self.path)?;
        Ok(std::io::Read::read_exact(&mut file, &mut head).is_ok() && &head == b"ARROW1")
    }

    /// The chunked splits of an Arrow IPC file (see [`FileTable::open_chunked_splits`]): the
    /// rows of each record batch come from its header, the chunks are dealt as Parquet's are
    /// (the batches standing for row groups), and each split decodes only the batches that
    /// hold its chunks. `None` for a stream.
    fn arrow_chunked_splits(
        &self,
        batch_size: usize,
        n: usize,
        chunk: usize,
        start: u64,
        past_end: impl Fn(u64) -> Error,
    ) -> Result<Option<Vec<SourceReader>>> {
        if !self.is_ipc_file()? {
            return Ok(None);
        }
        let ctx = self.ctx();
        let corrupt = |e: &dyn std::fmt::Display| {
            Error::io(format!("{ctx}: not a readable Arrow IPC file: {e}"))
        };
        let mut file = open(&self.path)?;
        check_ipc_lengths(&mut file, true).map_err(|e| corrupt(&e))?;
        let sizes = super::ipc::batch_rows(&mut file).map_err(|e| corrupt(&e))?;
        let total = sizes.iter().fold(0usize, |t, &r| t.saturating_add(r));
        let start = match usize::try_from(start) {
            Ok(start) if start <= total => start,
            _ => return Err(past_end(total as u64)),
        };
        let n = n.max(1);
        let mut splits = vec![];
        // Split `s` is empty when its first chunk starts past the end (only the last can be).
        for s in (0..n).take_while(|&s| start.saturating_add(s.saturating_mul(chunk)) < total) {
            let reader = arrow::ipc::reader::FileReader::try_new(open(&self.path)?, None)
                .map_err(|e| corrupt(&e))?;
            if splits.is_empty() {
                self.check_columns(&reader.schema())?;
            }
            let schema = reader.schema();
            let deal = super::ipc::Deal { start, chunk, n, s };
            let part = SliceOfBatches {
                schema,
                inner: Box::new(super::ipc::IpcChunks::new(reader, sizes.clone(), deal)),
            };
            splits.push(self.arrow_split(part, batch_size));
        }
        Ok(Some(splits))
    }

    /// The split reading `part` of an Arrow IPC file, re-cut to `batch_size` rows.
    fn arrow_split(&self, part: SliceOfBatches, batch_size: usize) -> SourceReader {
        let table = self.clone();
        let ctx = self.ctx();
        let rechunked = Rechunk::new(Box::new(part), batch_size);
        self.guard(SourceReader {
            inner: Box::new(rechunked.map(move |b| -> Result<ChangeBatch> {
                let b = b.map_err(|e| Error::io(format!("{ctx}: {e}")))?;
                table.convert(&b)
            })),
            total_rows: None,
        })
    }

    fn arrow_splits(&self, batch_size: usize, n: usize) -> Result<Vec<SourceReader>> {
        let ctx = self.ctx();
        if !self.is_ipc_file()? {
            // A stream has no index of its batches: one split.
            return Ok(vec![self.open(batch_size)?]);
        }
        let corrupt = |e: &dyn std::fmt::Display| {
            Error::io(format!("{ctx}: not a readable Arrow IPC file: {e}"))
        };
        let file = open(&self.path)?;
        let mut checked = open(&self.path)?;
        check_ipc_lengths(&mut checked, true).map_err(|e| corrupt(&e))?;
        let reader =
            arrow::ipc::reader::FileReader::try_new(file, None).map_err(|e| corrupt(&e))?;
        self.check_columns(&reader.schema())?;
        let batches = reader.num_batches();
        let mut splits = vec![];
        for i in 0..n.min(batches) {
            let (start, end) = (
                batches * i / n.min(batches),
                batches * (i + 1) / n.min(batches),
            );
            let mut reader = arrow::ipc::reader::FileReader::try_new(open(&self.path)?, None)
                .map_err(|e| corrupt(&e))?;
            reader.set_index(start).map_err(|e| corrupt(&e))?;
            let part = SliceOfBatches {
                schema: reader.schema(),
                inner: Box::new(reader.take(end - start)),
            };
            splits.push(self.arrow_split(part, batch_size));
        }
        Ok(splits)
    }
}

/// Some record batches of an Arrow IPC file, as a reader.
struct SliceOfBatches {
    schema: arrow::datatypes::SchemaRef,
    inner: Box<
        dyn Iterator<
                Item = std::result::Result<arrow::array::RecordBatch, arrow::error::ArrowError>,
            > + Send,
    >,
}

impl Iterator for SliceOfBatches {
    type Item = std::result::Result<arrow::array::RecordBatch, arrow::error::ArrowError>;
    fn next(&mut self) -> Option<Self::Item> {
        self.inner.next()
    }
}

impl arrow::array::RecordBatchReader for SliceOfBatches {
    fn schema(&self) -> arrow::datatypes::SchemaRef {
        Arc::clone(&self.schema)
    }
}

/// Shares row groups of `sizes` rows among `n` splits of equal rows (±1), in file order: split
/// `i` reads rows `[total·i/n, total·(i+1)/n)`, cut inside a row group where a boundary falls in
/// one (that row group's dictionary pages are then decoded by both splits, a small cost beside
/// the imbalance whole row groups leave: the 10 M-row bench file, in row groups of 1 Mi rows,
/// split 5.24 M / 4.76 M rows by whole groups, and the larger split set the wall time).
fn share_row_groups(sizes: &[usize], n: usize) -> Vec<RowGroupShare> {
    let total: usize = sizes.iter().sum();
    (0..n)
        .map(|i| share_of(sizes, [(total * i / n, total * (i + 1) / n)]))
        .collect()
}

/// Deals chunks of `chunk` rows of row groups of `sizes` rows, from row `start` on, to `n`
/// splits in turn: split `s` reads chunks `s`, `s + n`, …
fn deal_chunks(sizes: &[usize], n: usize, chunk: usize, start: usize) -> Vec<RowGroupShare> {
    let total: usize = sizes.iter().sum();
    (0..n)
        .map(|s| {
            let ranges = (s..)
                .step_by(n)
                .map(|j| start.saturating_add(j.saturating_mul(chunk)))
                .take_while(|&lo| lo < total)
                .map(|lo| (lo, lo.saturating_add(chunk).min(total)));
            share_of(sizes, ranges)
        })
        .collect()
}

/// The share of row groups of `sizes` rows that reads the file's rows in `ranges` (`[lo, hi)`,
/// ascending, not overlapping).
fn share_of(sizes: &[usize], ranges: impl IntoIterator<Item = (usize, usize)>) -> RowGroupShare {
    let mut share: RowGroupShare = vec![];
    let mut ranges = ranges.into_iter().peekable();
    let mut rg_start = 0;
    for (rg, &size) in sizes.iter().enumerate() {
        let rg_end = rg_start + size;
        let mut mine = vec![];
        while let Some(&(lo, hi)) = ranges.peek() {
            let (a, b) = (lo.max(rg_start), hi.min(rg_end));
            if a < b {
                mine.push((a - rg_start, b - a));
            }
            if hi <= rg_end {
                ranges.next();
            } else {
                break;
            }
        }
        if !mine.is_empty() {
            share.push((rg, mine));
        }
        rg_start = rg_end;
    }
    share
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Marks the rows a share reads; checks file order and that no row is read twice.
    fn read_by(share: &RowGroupShare, seen: &mut [Vec<bool>], what: &str) -> Vec<(usize, usize)> {
        let mut order = vec![];
        for (rg, ranges) in share {
            for &(first, rows) in ranges {
                assert!(rows > 0, "{what}: an empty range");
                order.push((*rg, first));
                for r in &mut seen[*rg][first..first + rows] {
                    assert!(!*r, "{what}: row read twice");
                    *r = true;
                }
            }
        }
        assert!(order.windows(2).all(|w| w[0] < w[1]), "{what}: file order");
        order
    }

    /// Every row is in exactly one share, in file order within each.
    #[test]
    fn shares_cover_every_row_once() {
        for (sizes, n) in [
            (vec![100usize, 100, 100, 100], 2),
            (vec![100, 100, 100], 4),
            (vec![1000], 3),
            (vec![10, 0, 990], 2),
            (vec![5, 5, 5, 5, 5], 5),
            (vec![0, 0], 2),
        ] {
            let what = format!("{sizes:?} {n}");
            let shares = share_row_groups(&sizes, n);
            assert_eq!(shares.len(), n);
            let mut seen: Vec<Vec<bool>> = sizes.iter().map(|&s| vec![false; s]).collect();
            for share in &shares {
                read_by(share, &mut seen, &what);
            }
            assert!(seen.iter().flatten().all(|&s| s), "{what}: a row not read");
            let lens: Vec<usize> = shares
                .iter()
                .map(|s| s.iter().flat_map(|x| &x.1).map(|r| r.1).sum())
                .collect();
            let (lo, hi) = (lens.iter().min().unwrap(), lens.iter().max().unwrap());
            assert!(hi - lo <= 1, "{what}: {lens:?}");
        }
    }

    /// Chunks are dealt in turn: split `s` reads exactly the rows of chunks `s`, `s + n`, …
    #[test]
    fn chunks_are_dealt_in_turn() {
        for (sizes, n, chunk) in [
            (vec![100usize, 100, 100, 100], 2, 30),
            (vec![100, 100, 100], 4, 100),
            (vec![1000], 3, 7),
            (vec![10, 0, 990], 2, 64),
            (vec![5, 5], 4, 3),
            (vec![0, 0], 2, 5),
            (vec![50], 3, 1000),
        ] {
            let what = format!("{sizes:?} {n} {chunk}");
            let shares = deal_chunks(&sizes, n, chunk, 0);
            let mut seen: Vec<Vec<bool>> = sizes.iter().map(|&s| vec![false; s]).collect();
            let starts: Vec<usize> = sizes
                .iter()
                .scan(0, |at, &s| {
                    let start = *at;
                    *at += s;
                    Some(start)
                })
                .collect();
            for (s, share) in shares.iter().enumerate() {
                read_by(share, &mut seen, &what);
                for (rg, ranges) in share {
                    for &(first, rows) in ranges {
                        for row in starts[*rg] + first..starts[*rg] + first + rows {
                            assert_eq!((row / chunk) % n, s, "{what}: row {row} in split {s}");
                        }
                    }
                }
            }
            assert!(seen.iter().flatten().all(|&s| s), "{what}: a row not read");
        }
    }
}
