//! One Parquet row group's column chunks held in memory: each projected column's chunk read
//! whole, in one read, and served to the Parquet decoder as zero-copy slices. Read from a
//! `File`, the decoder would duplicate the handle, seek and read into a new buffer for every
//! page (and decompress from that copy); here a page costs a slice of the chunk. The chunks'
//! buffers come back to their split once the decoder drops them ([`ChunkBuffers`]).

use std::fs::File;
use std::io::{Cursor, Read, Seek, SeekFrom};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder, RowSelection,
};
use parquet::errors::ParquetError;
use parquet::file::metadata::ParquetMetaData;
use parquet::file::reader::{ChunkReader, Length};

use crate::error::{Error, Result};

/// The buffers a split's column chunks were read into, handed back once the decoder has let go
/// of every slice of a chunk, for the next row group's chunks: memory already faulted in,
/// where a fresh allocation of megabytes would have the kernel zero its pages again (with
/// transparent huge pages, 2 MB at a time).
#[derive(Debug, Clone, Default)]
pub(super) struct ChunkBuffers(Arc<Mutex<Vec<Vec<u8>>>>);

/// The most buffers kept (a row group's projected columns, and the next's).
const KEPT_BUFFERS: usize = 16;

impl ChunkBuffers {
    /// An empty buffer of at least `n` bytes of capacity: a kept one if one is large enough.
    fn take(&self, n: usize) -> Vec<u8> {
        let mut kept = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match kept.iter().position(|b| b.capacity() >= n) {
            Some(i) => kept.swap_remove(i),
            None => Vec::with_capacity(n),
        }
    }

    fn give_back(&self, mut buf: Vec<u8>) {
        let mut kept = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if kept.len() < KEPT_BUFFERS {
            buf.clear();
            kept.push(buf);
        }
    }
}

/// A chunk's bytes, back to its [`ChunkBuffers`] when the last slice of them is dropped.
struct Pooled {
    buf: Vec<u8>,
    buffers: ChunkBuffers,
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        self.buffers.give_back(std::mem::take(&mut self.buf));
    }
}

/// The projected column chunks of one row group, by their position in the file.
#[derive(Debug)]
pub(super) struct RowGroupChunks {
    /// The file's length (what [`Length`] reports).
    file_len: u64,
    /// `(offset in the file, bytes)` of each chunk read, by offset.
    chunks: Vec<(u64, Bytes)>,
}

impl RowGroupChunks {
    /// Reads the chunks of row group `rg` that `mask` projects from `file` (one read each),
    /// into buffers from `buffers`.
    ///
    /// # Errors
    /// A chunk the metadata places outside the file (a corrupt footer), and read errors;
    /// `ctx` names the file.
    pub(super) fn read(
        mut file: File,
        metadata: &ParquetMetaData,
        rg: usize,
        mask: &ProjectionMask,
        buffers: &ChunkBuffers,
        ctx: &str,
    ) -> Result<Self> {
        let file_len = file
            .metadata()
            .map_err(|e| Error::io(format!("{ctx}: {e}")))?
            .len();
        let group = metadata.row_group(rg);
        let mut ranges: Vec<(u64, u64)> = (0..group.num_columns())
            .filter(|&c| mask.leaf_included(c))
            .map(|c| group.column(c).byte_range())
            .collect();
        ranges.sort_unstable();
        let mut chunks = Vec::with_capacity(ranges.len());
        for (start, len) in ranges {
            let end = start.checked_add(len).filter(|&end| end <= file_len);
            let (Some(_), Ok(n)) = (end, usize::try_from(len)) else {
                return Err(Error::io(format!(
                    "{ctx}: row group {rg} places a column chunk at bytes {start}..+{len}, past the end of the file ({file_len} bytes): the file is corrupt"
                )));
            };
            // Read into spare capacity: no zero-filling of a buffer the read overwrites.
            let mut buf = buffers.take(n);
            file.seek(SeekFrom::Start(start))
                .and_then(|_| (&mut file).take(len).read_to_end(&mut buf))
                .map_err(|e| Error::io(format!("{ctx}: {e}")))?;
            if buf.len() != n {
                return Err(Error::io(format!(
                    "{ctx}: row group {rg}: the file ended inside a column chunk"
                )));
            }
            let buffers = buffers.clone();
            chunks.push((start, Bytes::from_owner(Pooled { buf, buffers })));
        }
        Ok(Self { file_len, chunks })
    }

    /// A reader of row group `rg` of `table`'s file (its projected chunks read whole into
    /// `buffers`), in batches of `batch_size` rows, reading the rows `selection` selects (all
    /// when None).
    ///
    /// # Errors
    /// As [`RowGroupChunks::read`], and a reader the decoder refuses.
    pub(super) fn reader(
        table: &super::FileTable,
        metadata: &ArrowReaderMetadata,
        rg: usize,
        mask: &ProjectionMask,
        buffers: &ChunkBuffers,
        batch_size: usize,
        selection: Option<RowSelection>,
    ) -> Result<ParquetRecordBatchReader> {
        let ctx = table.ctx();
        let file = super::open(&table.path)?;
        let chunks = Self::read(file, metadata.metadata(), rg, mask, buffers, &ctx)?;
        let mut builder =
            ParquetRecordBatchReaderBuilder::new_with_metadata(chunks, metadata.clone())
                .with_row_groups(vec![rg])
                .with_projection(mask.clone())
                .with_batch_size(batch_size);
        if let Some(selection) = selection {
            builder = builder.with_row_selection(selection);
        }
        builder
            .build()
            .map_err(|e| Error::io(format!("{ctx}: {e}")))
    }

    /// The bytes from `start` to the end of the chunk that holds it.
    fn rest_of_chunk(&self, start: u64) -> parquet::errors::Result<Bytes> {
        let at = self.chunks.partition_point(|(off, _)| *off <= start);
        let (off, bytes) = at
            .checked_sub(1)
            .map(|i| &self.chunks[i])
            .ok_or_else(|| outside(start))?;
        let skip = (start - off) as usize;
        if skip >= bytes.len() {
            return Err(outside(start));
        }
        Ok(bytes.slice(skip..))
    }
}

fn outside(start: u64) -> ParquetError {
    ParquetError::General(format!(
        "byte {start} lies outside the column chunks read: the file is corrupt"
    ))
}

impl Length for RowGroupChunks {
    fn len(&self) -> u64 {
        self.file_len
    }
}

impl ChunkReader for RowGroupChunks {
    type T = Cursor<Bytes>;

    fn get_read(&self, start: u64) -> parquet::errors::Result<Self::T> {
        Ok(Cursor::new(self.rest_of_chunk(start)?))
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
        let rest = self.rest_of_chunk(start)?;
        if length > rest.len() {
            return Err(ParquetError::EOF(format!(
                "expected {length} bytes at byte {start}, the column chunk holds {}",
                rest.len()
            )));
        }
        Ok(rest.slice(..length))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunks() -> RowGroupChunks {
        RowGroupChunks {
            file_len: 100,
            chunks: vec![
                (10, Bytes::from_static(b"abcdef")),
                (40, Bytes::from_static(b"0123")),
            ],
        }
    }

    #[test]
    fn slices_come_from_the_chunk_that_holds_them() {
        let c = chunks();
        assert_eq!(&c.get_bytes(10, 3).unwrap()[..], b"abc");
        assert_eq!(&c.get_bytes(12, 4).unwrap()[..], b"cdef");
        assert_eq!(&c.get_bytes(41, 3).unwrap()[..], b"123");
        let mut rest = vec![];
        c.get_read(13).unwrap().read_to_end(&mut rest).unwrap();
        assert_eq!(rest, b"def");
        assert_eq!(c.len(), 100);
    }

    /// A chunk's buffer comes back once its last slice is dropped, and serves a later chunk
    /// it is large enough for; a smaller one is not handed out for a larger chunk.
    #[test]
    fn buffers_come_back_when_the_last_slice_goes() {
        let buffers = ChunkBuffers::default();
        let mut buf = buffers.take(100);
        buf.extend_from_slice(&[7; 100]);
        let at = buf.as_ptr();
        let bytes = Bytes::from_owner(Pooled {
            buf,
            buffers: buffers.clone(),
        });
        let slice = bytes.slice(10..20);
        drop(bytes);
        assert!(
            buffers.0.lock().unwrap().is_empty(),
            "a slice still holds it"
        );
        assert_eq!(&slice[..], &[7; 10]);
        drop(slice);
        let again = buffers.take(64);
        assert_eq!((again.as_ptr(), again.len()), (at, 0));
        buffers.give_back(again);
        assert!(buffers.take(1000).capacity() >= 1000);
        assert_eq!(
            buffers.0.lock().unwrap().len(),
            1,
            "the small one stays kept"
        );
    }

    #[test]
    fn bytes_outside_the_chunks_are_errors() {
        let c = chunks();
        for (start, len) in [(0, 1), (9, 2), (16, 1), (12, 5), (44, 1), (99, 1)] {
            assert!(c.get_bytes(start, len).is_err(), "{start}+{len}");
        }
        assert!(c.get_read(16).is_err());
    }
}
