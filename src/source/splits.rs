//! Splitting a file source across workers, for the pipelined runtime: Parquet by row ranges
//! (whole row groups, cut where a split's boundary falls inside one), Arrow IPC files by record
//! batches. Each split reads its part in file order on the thread that consumes it.

use std::sync::Arc;

use parquet::arrow::arrow_reader::{ParquetRecordBatchReaderBuilder, RowSelection, RowSelector};

use super::parquet_reader::ParquetScan;
use super::{FileTable, Format, NullColumns, Rechunk, SourceReader, open};
use crate::changelog::ChangeBatch;
use crate::decode::{check_ipc_lengths, guarded};
use crate::error::{Error, Result};

/// One split's share of a Parquet file: for each row group it reads, the rows to skip at its
/// start and the rows to read after them.
type RowGroupShare = Vec<(usize, usize, usize)>;

impl FileTable {
    /// Opens the file as up to `n` splits that together read every row once, each in file
    /// order (batches of `batch_size` rows). Parquet splits into equal row ranges (cutting a row
    /// group where a boundary falls inside one); an Arrow IPC file by record batches; an Arrow stream
    /// and CSV are one split. Empty splits are left out.
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
            _ => Ok(vec![self.open(batch_size)?]),
        }
    }

    fn parquet_splits(&self, batch_size: usize, n: usize) -> Result<Vec<SourceReader>> {
        let ParquetScan {
            metadata,
            mask,
            schema,
            ..
        } = self.parquet_metadata()?;
        let sizes: Vec<usize> = metadata
            .metadata()
            .row_groups()
            .iter()
            .map(|rg| usize::try_from(rg.num_rows()).unwrap_or(0))
            .collect();
        let total_rows = Some(sizes.iter().sum::<usize>() as u64);
        let mut splits = vec![];
        for share in share_row_groups(&sizes, n) {
            if share.is_empty() {
                continue;
            }
            let (table, metadata, mask) = (self.clone(), metadata.clone(), mask.clone());
            let schema = Arc::clone(&schema);
            let mut nulls = NullColumns::default();
            let sizes = sizes.clone();
            let ctx = self.ctx();
            let mut groups = share.into_iter();
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
                    let (rg, skip, take) = groups.next()?;
                    let built = open(&table.path).and_then(|f| {
                        let mut builder =
                            ParquetRecordBatchReaderBuilder::new_with_metadata(f, metadata.clone())
                                .with_row_groups(vec![rg])
                                .with_projection(mask.clone())
                                .with_batch_size(batch_size);
                        if skip > 0 || take < sizes[rg] {
                            builder = builder.with_row_selection(RowSelection::from(vec![
                                RowSelector::skip(skip),
                                RowSelector::select(take),
                            ]));
                        }
                        builder
                            .build()
                            .map_err(|e| Error::io(format!("{ctx}: {e}")))
                    });
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

    fn arrow_splits(&self, batch_size: usize, n: usize) -> Result<Vec<SourceReader>> {
        let ctx = self.ctx();
        let mut file = open(&self.path)?;
        let mut head = [0u8; 6];
        let is_file = std::io::Read::read_exact(&mut file, &mut head).is_ok() && &head == b"ARROW1";
        if !is_file {
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
            let table = self.clone();
            let ctx = self.ctx();
            let rechunked = Rechunk::new(Box::new(part), batch_size);
            splits.push(self.guard(SourceReader {
                inner: Box::new(rechunked.map(move |b| -> Result<ChangeBatch> {
                    let b = b.map_err(|e| Error::io(format!("{ctx}: {e}")))?;
                    table.convert(&b)
                })),
                total_rows: None,
            }));
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
/// split 5.24 M / 4.76 M rows by whole groups, and the larger split set the wall time). Each share lists `(row group, rows to skip, rows to read)`.
fn share_row_groups(sizes: &[usize], n: usize) -> Vec<RowGroupShare> {
    let total: usize = sizes.iter().sum();
    let mut shares: Vec<RowGroupShare> = (0..n).map(|_| vec![]).collect();
    let mut rg_start = 0;
    for (rg, &size) in sizes.iter().enumerate() {
        let rg_end = rg_start + size;
        for (i, share) in shares.iter_mut().enumerate() {
            let (lo, hi) = (total * i / n, total * (i + 1) / n);
            let (a, b) = (lo.max(rg_start), hi.min(rg_end));
            if a < b {
                share.push((rg, a - rg_start, b - a));
            }
        }
        rg_start = rg_end;
    }
    shares
}

#[cfg(test)]
mod tests {
    use super::*;

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
            let shares = share_row_groups(&sizes, n);
            assert_eq!(shares.len(), n);
            let mut seen: Vec<Vec<bool>> = sizes.iter().map(|&s| vec![false; s]).collect();
            for share in &shares {
                let mut last = None;
                for &(rg, skip, take) in share {
                    assert!(last < Some((rg, skip)), "{sizes:?} {n}: file order");
                    last = Some((rg, skip));
                    for r in &mut seen[rg][skip..skip + take] {
                        assert!(!*r, "{sizes:?} {n}: row read twice");
                        *r = true;
                    }
                }
            }
            assert!(
                seen.iter().flatten().all(|&s| s),
                "{sizes:?} {n}: a row not read"
            );
            let lens: Vec<usize> = shares.iter().map(|s| s.iter().map(|x| x.2).sum()).collect();
            let (lo, hi) = (lens.iter().min().unwrap(), lens.iter().max().unwrap());
            assert!(hi - lo <= 1, "{sizes:?} {n}: {lens:?}");
        }
    }
}
