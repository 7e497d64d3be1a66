//! Reading an Arrow IPC file or stream whole, re-cut to the batch size.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};

use arrow::array::{RecordBatch, RecordBatchReader};

use super::{FileTable, SourceReader, open};
use crate::decode::check_ipc_lengths;
use crate::error::{Error, Result};

impl FileTable {
    pub(super) fn open_arrow(&self, batch_size: usize) -> Result<SourceReader> {
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

/// The rows of each record batch of an Arrow IPC file, in file order, read from its footer
/// and each batch's message header: no body is read, so a split of chunks knows where its rows
/// lie before it decodes any. The file's lengths must have been checked
/// ([`check_ipc_lengths`]). An error names what does not parse.
pub(super) fn batch_rows(file: &mut File) -> std::result::Result<Vec<usize>, String> {
    let read_at = |file: &mut File, pos: u64, len: usize| -> std::result::Result<Vec<u8>, String> {
        let mut buf = vec![0u8; len];
        file.seek(SeekFrom::Start(pos))
            .and_then(|_| file.read_exact(&mut buf))
            .map_err(|e| format!("reading {len} bytes at byte {pos}: {e}"))?;
        Ok(buf)
    };
    let size = file.metadata().map_err(|e| e.to_string())?.len();
    if size < 18 {
        return Err(format!("{size} bytes are too few for a file with a footer"));
    }
    let tail = read_at(file, size - 10, 10)?;
    let footer_len = u64::try_from(i32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]))
        .ok()
        .filter(|&n| n <= size - 18)
        .ok_or("its footer's length is out of range")?;
    let footer_bytes = read_at(file, size - 10 - footer_len, footer_len as usize)?;
    let footer = arrow::ipc::root_as_footer(&footer_bytes)
        .map_err(|e| format!("its footer does not parse: {e}"))?;
    let mut rows = vec![];
    for block in footer.recordBatches().into_iter().flatten() {
        let (offset, meta) = (block.offset(), block.metaDataLength());
        let (Ok(offset), Ok(meta)) = (u64::try_from(offset), usize::try_from(meta)) else {
            return Err(format!(
                "a block at byte {offset} has a negative length or offset"
            ));
        };
        let header = read_at(file, offset, meta)?;
        // The metadata: a length (after the continuation marker 0xFFFFFFFF, or alone in the
        // format before 0.15), then the message's flatbuffer.
        let start = if header.starts_with(&[0xff; 4]) { 8 } else { 4 };
        let message = header
            .get(start - 4..start)
            .and_then(|l| usize::try_from(i32::from_le_bytes([l[0], l[1], l[2], l[3]])).ok())
            .and_then(|len| header.get(start..start.checked_add(len)?))
            .and_then(|m| arrow::ipc::root_as_message(m).ok())
            .ok_or_else(|| format!("the message at byte {offset} does not parse"))?;
        let batch = message
            .header_as_record_batch()
            .ok_or_else(|| format!("the block at byte {offset} is no record batch"))?;
        let n = usize::try_from(batch.length())
            .map_err(|_| format!("the record batch at byte {offset} has a negative length"))?;
        rows.push(n);
    }
    Ok(rows)
}

/// Which chunks a split reads: chunks of `chunk` rows from row `start` on, dealt to `n`
/// splits in turn; this is split `s` (chunks `s`, `s + n`, …).
#[derive(Debug, Clone, Copy)]
pub(super) struct Deal {
    pub(super) start: usize,
    pub(super) chunk: usize,
    pub(super) n: usize,
    pub(super) s: usize,
}

/// One split's chunks of an Arrow IPC file, in file order: the record batches that hold them
/// are decoded (no other), and each chunk's rows in a batch come out as a zero-copy slice of
/// it. The rows of each batch (`rows`, from the headers: [`batch_rows`]) place the chunks
/// before a batch is decoded; a decoded batch of other rows than its header's is an error.
/// Lazy, one batch at a time: a header declaring absurdly many rows costs nothing until the
/// batch decodes, which then fails.
pub(super) struct IpcChunks {
    reader: arrow::ipc::reader::FileReader<File>,
    rows: Vec<usize>,
    deal: Deal,
    /// The next batch to look at, and its first row in the file.
    next: usize,
    next_first_row: usize,
    /// The batch being sliced: it, its first row in the file, and the next chunk of the split
    /// to cut from it.
    current: Option<(RecordBatch, usize, usize)>,
}

impl IpcChunks {
    pub(super) fn new(
        reader: arrow::ipc::reader::FileReader<File>,
        rows: Vec<usize>,
        deal: Deal,
    ) -> Self {
        Self {
            reader,
            rows,
            deal,
            next: 0,
            next_first_row: 0,
            current: None,
        }
    }

    /// The first chunk of this split that ends after row `row` (the first chunk of the split
    /// when `row` is before the start).
    fn first_chunk_after(&self, row: usize) -> usize {
        let Deal { start, chunk, n, s } = self.deal;
        let j = row.saturating_sub(start) / chunk;
        j + (s + n - j % n) % n
    }

    /// Chunk `j`'s rows, `[lo, hi)` in the file.
    fn chunk_rows(&self, j: usize) -> (usize, usize) {
        let lo = self
            .deal
            .start
            .saturating_add(j.saturating_mul(self.deal.chunk));
        (lo, lo.saturating_add(self.deal.chunk))
    }
}

impl Iterator for IpcChunks {
    type Item = std::result::Result<RecordBatch, arrow::error::ArrowError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some((batch, first, j)) = &self.current {
                let (first, j) = (*first, *j);
                let end = first + batch.num_rows();
                let (lo, hi) = self.chunk_rows(j);
                if lo < end {
                    let (a, b) = (lo.max(first), hi.min(end));
                    let piece = batch.slice(a - first, b - a);
                    self.current.as_mut()?.2 = j + self.deal.n;
                    return Some(Ok(piece));
                }
                self.current = None;
            }
            // The next batch holding a row of one of this split's chunks.
            let index = self.next;
            let rows = *self.rows.get(index)?;
            let first = self.next_first_row;
            let end = first.saturating_add(rows);
            (self.next, self.next_first_row) = (index + 1, end);
            let j = self.first_chunk_after(first);
            if rows == 0 || end <= self.deal.start || self.chunk_rows(j).0 >= end {
                continue;
            }
            let decoded = match self.reader.set_index(index).map(|()| self.reader.next()) {
                Ok(Some(Ok(batch))) if batch.num_rows() == rows => Ok(batch),
                Ok(Some(Ok(batch))) => Err(arrow::error::ArrowError::IpcError(format!(
                    "record batch {index} holds {} rows where its header says {rows}",
                    batch.num_rows()
                ))),
                Ok(Some(Err(e))) | Err(e) => Err(e),
                Ok(None) => Err(arrow::error::ArrowError::IpcError(format!(
                    "record batch {index} is missing"
                ))),
            };
            match decoded {
                Ok(batch) => self.current = Some((batch, first, j)),
                Err(e) => {
                    // Nothing after an error.
                    self.next = self.rows.len();
                    return Some(Err(e));
                }
            }
        }
    }
}

/// The batches of an Arrow IPC reader re-cut to `batch_size` rows each (the last may be
/// shorter), whatever batches the file was written in, so that `--batch-size` means the same
/// for every format. Larger batches are sliced; smaller ones are gathered (copied) into one.
pub(super) struct Rechunk {
    inner: Box<dyn RecordBatchReader + Send>,
    batch_size: usize,
    coalescer: arrow::compute::BatchCoalescer,
    done: bool,
}

impl Rechunk {
    pub(super) fn new(inner: Box<dyn RecordBatchReader + Send>, batch_size: usize) -> Self {
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
    use std::path::PathBuf;
    use std::sync::Arc;

    use arrow::datatypes::{DataType, Field, Schema};

    use super::*;
    use crate::source::Format;
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
            dictionary_columns: vec![],
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

    /// The rows of each record batch come from the headers alone, and the chunked splits of a
    /// file with every single byte of it flipped in turn read the rows or fail with one line
    /// naming the file: no panic, no hang.
    #[test]
    fn batch_rows_from_headers_and_corrupt_chunked_files() {
        let dir = std::env::temp_dir().join(format!("tally-ipc-rows-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let schema = table(PathBuf::new()).schema;
        let mut file = vec![];
        let mut w = arrow::ipc::writer::FileWriter::try_new(&mut file, &schema).unwrap();
        for n in [5i64, 0, 3] {
            let values = Int64Array::from_iter_values(0..n);
            w.write(&RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(values)]).unwrap())
                .unwrap();
        }
        w.finish().unwrap();
        drop(w);
        let path = dir.join("t.arrow");
        std::fs::write(&path, &file).unwrap();
        let mut f = File::open(&path).unwrap();
        assert_eq!(batch_rows(&mut f).unwrap(), vec![5, 0, 3]);
        let read = |path: &PathBuf| -> Result<usize> {
            let mut rows = 0;
            for split in table(path.clone()).open_chunked_splits(4, 2, 2, 0)? {
                for b in split {
                    rows += b?.data.num_rows();
                }
            }
            Ok(rows)
        };
        assert_eq!(read(&path).unwrap(), 8);
        let bad = dir.join("bad.arrow");
        for i in 0..file.len() {
            let mut bytes = file.clone();
            bytes[i] ^= 0xff;
            std::fs::write(&bad, &bytes).unwrap();
            if let Err(e) = read(&bad) {
                let e = e.to_string();
                assert!(
                    e.contains("bad.arrow") && !e.contains('\n'),
                    "byte {i}: {e}"
                );
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
