//! One Parquet row group's column chunks held in memory: each projected column's chunk read
//! whole, in one read, and served to the Parquet decoder as zero-copy slices. Read from a
//! `File`, the decoder would duplicate the handle, seek and read into a new buffer for every
//! page (and decompress from that copy); here a page costs a slice of the chunk. A split that
//! reads some rows of the group, in a file with an offset index, reads only the pages that hold
//! them (and the dictionary page before them): the decoder then skips the others by the index,
//! without reading them. The chunks' buffers come back to their split once the decoder drops
//! them ([`ChunkBuffers`]). The decoder reads batches of at most one data page of each column
//! read as a dictionary, where the offset index shows pages smaller than the batch asked for
//! ([`page_batch_size`]). Splits that cut one row group between them share its decompressed
//! dictionary pages (`parquet_dictionaries.rs`).

use std::fs::File;
use std::io::{Cursor, Read, Seek, SeekFrom};
use std::sync::{Arc, Mutex};

use arrow::datatypes::DataType;
use bytes::Bytes;
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder, RowSelection,
    RowSelector,
};
use parquet::errors::ParquetError;
use parquet::file::metadata::ParquetMetaData;
use parquet::file::page_index::offset_index::PageLocation;
use parquet::file::reader::{ChunkReader, Length};

use super::parquet_dictionaries::{SharedDictionaries, shared_dictionary_reader};
use crate::error::{Error, Result};

/// The buffers a split's column chunks were read into, handed back once the decoder has let go
/// of every slice of a chunk, for the next row group's chunks: memory already faulted in,
/// where a fresh allocation of megabytes would have the kernel zero its pages again (with
/// transparent huge pages, 2 MB at a time). A chunk takes the smallest kept buffer that holds
/// it, and a new buffer is made with room to spare ([`buffer_capacity`]): the same column's
/// chunk in the next row group is seldom exactly as long, and a buffer a few bytes short of it
/// (or one taken by a smaller chunk first) would be a fresh allocation, faulted in again.
#[derive(Debug, Clone, Default)]
pub(super) struct ChunkBuffers(Arc<Mutex<Vec<Vec<u8>>>>);

/// The most buffers kept (a row group's projected columns, and the next's).
const KEPT_BUFFERS: usize = 16;

/// The capacity a new buffer for a chunk of `n` bytes is made with: an eighth more, rounded up
/// to 64 KiB (a kept buffer then fits the same column's chunk of the next row groups: in the
/// generated orders file, the largest column's chunks differ by up to 520 bytes in 2.68 MB).
fn buffer_capacity(n: usize) -> usize {
    const GRAIN: usize = 1 << 16;
    n.saturating_add(n / 8)
        .checked_next_multiple_of(GRAIN)
        .unwrap_or(n)
}

impl ChunkBuffers {
    /// An empty buffer of at least `n` bytes of capacity: the smallest kept one that is large
    /// enough, or a new one of [`buffer_capacity`].
    fn take(&self, n: usize) -> Vec<u8> {
        let mut kept = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let best = kept
            .iter()
            .enumerate()
            .filter(|(_, b)| b.capacity() >= n)
            .min_by_key(|(_, b)| b.capacity())
            .map(|(i, _)| i);
        match best {
            Some(i) => kept.swap_remove(i),
            None => Vec::with_capacity(buffer_capacity(n)),
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
    /// Reads the chunks of row group `rg` that `mask` projects from `file` (one read each, or
    /// one per run of pages holding the row ranges `rows` where given: see the module docs),
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
        rows: Option<&[(usize, usize)]>,
        buffers: &ChunkBuffers,
        ctx: &str,
    ) -> Result<Self> {
        let file_len = file
            .metadata()
            .map_err(|e| Error::io(format!("{ctx}: {e}")))?
            .len();
        let group = metadata.row_group(rg);
        let pages = metadata
            .offset_index()
            .and_then(|index| index.get(rg))
            .filter(|columns| columns.len() == group.num_columns());
        let mut ranges: Vec<(u64, u64)> = vec![];
        for c in (0..group.num_columns()).filter(|&c| mask.leaf_included(c)) {
            let whole = group.column(c).byte_range();
            match (rows, pages) {
                (Some(rows), Some(pages)) => ranges.extend(page_ranges(
                    whole,
                    pages[c].page_locations(),
                    usize::try_from(group.num_rows()).unwrap_or(0),
                    rows,
                )),
                _ => ranges.push(whole),
            }
        }
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

    /// A reader of row group `rg` of `table`'s file (its projected chunks read into
    /// `buffers`), in batches of `batch_size` rows, reading the row ranges `rows` (first row
    /// within the group, rows; in order, not overlapping), or every row when None. With
    /// `dictionaries`, where other splits read the row group too, its dictionary pages are
    /// decompressed once for all of them ([`SharedDictionaries`]).
    ///
    /// # Errors
    /// As [`RowGroupChunks::read`], and a reader the decoder refuses.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn reader(
        table: &super::FileTable,
        metadata: &ArrowReaderMetadata,
        rg: usize,
        mask: &ProjectionMask,
        buffers: &ChunkBuffers,
        batch_size: usize,
        rows: Option<&[(usize, usize)]>,
        dictionaries: Option<&Arc<SharedDictionaries>>,
    ) -> Result<ParquetRecordBatchReader> {
        let ctx = table.ctx();
        let file = super::open(&table.path)?;
        let chunks = Self::read(file, metadata.metadata(), rg, mask, rows, buffers, &ctx)?;
        let batch_size = page_batch_size(metadata, rg, mask, batch_size);
        if let Some(shared) = dictionaries.filter(|d| d.shared(rg)) {
            return shared_dictionary_reader(
                chunks,
                metadata,
                rg,
                mask,
                batch_size,
                rows.map(selection),
                shared,
            )
            .map_err(|e| Error::io(format!("{ctx}: {e}")));
        }
        let mut builder =
            ParquetRecordBatchReaderBuilder::new_with_metadata(chunks, metadata.clone())
                .with_row_groups(vec![rg])
                .with_projection(mask.clone())
                .with_batch_size(batch_size);
        if let Some(rows) = rows {
            builder = builder.with_row_selection(selection(rows));
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

/// The fewest rows per page that a read batch is cut down to ([`page_batch_size`]): below it,
/// the cost of a batch (the aggregation's per-batch work, each dictionary's lookups) outweighs
/// the copies saved.
const MIN_PAGE_BATCH: usize = 8192;

/// Rows per read batch of row group `rg`: `batch_size`, or, where the columns read as
/// dictionaries have data pages of fewer rows (but at least [`MIN_PAGE_BATCH`]), the rows of
/// the smallest such page. arrow-rs grows a dictionary column's key vector to exactly the
/// rows of each page it decodes into a batch, so a batch of k pages reallocates it k - 1
/// times, copying the keys it holds each time ((k - 1) / 2 keys a row on average: 2 (k - 1)
/// bytes for 32-bit keys); a batch of one page copies nothing. Writers close pages at 20,000 rows by default (arrow-rs, parquet-mr), fewer than
/// a 65,536-row batch. Without an offset index, or without dictionary columns, `batch_size`.
fn page_batch_size(
    metadata: &ArrowReaderMetadata,
    rg: usize,
    mask: &ProjectionMask,
    batch_size: usize,
) -> usize {
    let Some(index) = metadata.metadata().offset_index().and_then(|i| i.get(rg)) else {
        return batch_size;
    };
    let parquet = metadata.parquet_schema();
    let fields = metadata.schema().fields();
    let pages = (0..parquet.num_columns().min(index.len()))
        .filter(|&leaf| mask.leaf_included(leaf))
        .filter(|&leaf| {
            fields
                .get(parquet.get_column_root_idx(leaf))
                .is_some_and(|f| matches!(f.data_type(), DataType::Dictionary(..)))
        })
        .map(|leaf| index[leaf].page_locations().as_slice());
    batch_for_pages(pages, batch_size)
}

/// [`page_batch_size`] over the page locations of each dictionary column chunk: the fewest
/// rows of a page that is not its chunk's last, where that lies in [`MIN_PAGE_BATCH`] ..
/// `batch_size`; `batch_size` otherwise.
fn batch_for_pages<'a>(
    chunks: impl Iterator<Item = &'a [PageLocation]>,
    batch_size: usize,
) -> usize {
    let fewest = chunks
        .flat_map(|pages| pages.windows(2))
        .filter_map(|w| {
            let rows = w[1].first_row_index.checked_sub(w[0].first_row_index)?;
            usize::try_from(rows).ok()
        })
        .min();
    match fewest {
        Some(rows) if (MIN_PAGE_BATCH..batch_size).contains(&rows) => rows,
        _ => batch_size,
    }
}

/// The byte ranges of a column chunk (`whole`: start, length) that a reader of the row ranges
/// `rows` of its row group (of `num_rows` rows) needs, where `pages` locates its data pages:
/// what comes before the first data page (the dictionary page), and each run of pages that
/// hold selected rows. The whole chunk when a selected page does not lie inside it.
fn page_ranges(
    whole: (u64, u64),
    pages: &[PageLocation],
    num_rows: usize,
    rows: &[(usize, usize)],
) -> Vec<(u64, u64)> {
    let (start, len) = whole;
    let first = pages.first().and_then(|p| u64::try_from(p.offset).ok());
    let Some(first) = first.filter(|&f| f >= start && f < start + len) else {
        return vec![whole];
    };
    let mut out = vec![];
    if first > start {
        out.push((start, first - start));
    }
    for (i, page) in pages.iter().enumerate() {
        let from = usize::try_from(page.first_row_index).unwrap_or(0);
        let to = pages.get(i + 1).map_or(num_rows, |next| {
            usize::try_from(next.first_row_index).unwrap_or(num_rows)
        });
        if !rows.iter().any(|&(a, n)| a < to && from < a + n) {
            continue;
        }
        let (Ok(at), Ok(size)) = (
            u64::try_from(page.offset),
            u64::try_from(page.compressed_page_size),
        ) else {
            return vec![whole];
        };
        if at < first || at + size > start + len {
            return vec![whole];
        }
        match out.last_mut() {
            Some((s, l)) if *s + *l == at => *l += size,
            _ => out.push((at, size)),
        }
    }
    out
}

/// The row selection reading `ranges` (first row, rows; ascending) of a row group.
fn selection(ranges: &[(usize, usize)]) -> RowSelection {
    let mut selectors = Vec::with_capacity(ranges.len() * 2);
    let mut at = 0;
    for &(first, rows) in ranges {
        if first > at {
            selectors.push(RowSelector::skip(first - at));
        }
        selectors.push(RowSelector::select(rows));
        at = first + rows;
    }
    RowSelection::from(selectors)
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

/// Writes a test file of one row group of `n` rows, `v` (Int64, `v(i)` in row `i`) and `s`
/// (Utf8, `k{i % 13}`), in pages of 100 rows, with `props`; returns its schema.
#[cfg(test)]
pub(super) fn write_pages(
    path: &std::path::Path,
    n: i64,
    v: impl Fn(i64) -> Option<i64>,
    props: parquet::file::properties::WriterPropertiesBuilder,
) -> arrow::datatypes::SchemaRef {
    use arrow::array::{Int64Array, RecordBatch, StringArray};
    use arrow::datatypes::{Field, Schema};
    use parquet::arrow::ArrowWriter;

    let schema = Arc::new(Schema::new(vec![
        Field::new("v", DataType::Int64, true),
        Field::new("s", DataType::Utf8, false),
    ]));
    let v = Int64Array::from_iter((0..n).map(v));
    let s = StringArray::from_iter_values((0..n).map(|i| format!("k{}", i % 13)));
    let batch = RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(v), Arc::new(s)]).unwrap();
    let props = props
        .set_data_page_row_count_limit(100)
        .set_write_batch_size(50)
        .build();
    let file = File::create(path).unwrap();
    let mut w = ArrowWriter::try_new(file, Arc::clone(&schema), Some(props)).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    schema
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
        assert!(buffers.take(1 << 20).capacity() >= 1 << 20);
        assert_eq!(
            buffers.0.lock().unwrap().len(),
            1,
            "the small one stays kept"
        );
    }

    /// A chunk takes the smallest kept buffer that holds it, and a new buffer has room for
    /// the same column's slightly longer chunk of the next row group.
    #[test]
    fn chunks_take_the_smallest_buffer_that_fits() {
        let buffers = ChunkBuffers::default();
        let small = buffers.take(100_000);
        assert!(small.capacity() >= 100_000 + 100_000 / 8);
        let large = buffers.take(2_000_000);
        let (small_at, large_at) = (small.as_ptr(), large.as_ptr());
        buffers.give_back(large);
        buffers.give_back(small);
        // A little longer than the chunk the small one was made for: it still fits there, and
        // the large one is left for a large chunk.
        let next = buffers.take(100_500);
        assert_eq!(next.as_ptr(), small_at);
        let big = buffers.take(2_010_000);
        assert_eq!(big.as_ptr(), large_at);
        assert!(buffers.0.lock().unwrap().is_empty());
        assert_eq!(buffer_capacity(0), 0);
        assert_eq!(buffer_capacity(1), 1 << 16);
        assert_eq!(buffer_capacity(usize::MAX), usize::MAX);
    }

    fn page(offset: i64, size: i32, first_row: i64) -> PageLocation {
        PageLocation {
            offset,
            compressed_page_size: size,
            first_row_index: first_row,
        }
    }

    /// A read batch is cut to the smallest page (not a chunk's last) of the dictionary
    /// columns, within the floor and the batch asked for.
    #[test]
    fn a_batch_is_cut_to_the_smallest_page_of_a_dictionary_column() {
        let pages = |rows: &[i64]| -> Vec<PageLocation> {
            rows.iter()
                .scan(0, |first, &n| {
                    let p = page(0, 1, *first);
                    *first += n;
                    Some(p)
                })
                .collect()
        };
        let (a, b) = (pages(&[20_000, 20_000, 7]), pages(&[30_000, 12_000, 5]));
        let cut =
            |chunks: &[&[PageLocation]], batch| batch_for_pages(chunks.iter().copied(), batch);
        // The last page of a chunk does not count; the smallest page of any chunk does.
        assert_eq!(cut(&[&a], 65_536), 20_000);
        assert_eq!(cut(&[&a, &b], 65_536), 12_000);
        // Never larger than asked, never below the floor, unchanged without pages.
        assert_eq!(cut(&[&a], 16_384), 16_384);
        assert_eq!(cut(&[&pages(&[4_000, 4_000, 1])], 65_536), 65_536);
        assert_eq!(cut(&[&pages(&[1_000_000])], 65_536), 65_536);
        assert_eq!(cut(&[], 65_536), 65_536);
        // A corrupt index (rows going backwards) is ignored.
        let mut back = pages(&[20_000, 20_000, 1]);
        back[2].first_row_index = 5;
        assert_eq!(cut(&[&back], 65_536), 20_000);
    }

    /// A split reads what precedes the first data page (the dictionary page) and the runs of
    /// pages that hold its rows; without locations inside the chunk, the whole chunk.
    #[test]
    fn a_split_reads_the_dictionary_and_its_pages() {
        // A chunk at bytes 100..400: a dictionary page, then pages of 10 rows at 150, 200, 250,
        // 300 and 350.
        let whole = (100, 300);
        let pages: Vec<PageLocation> = (0..5).map(|i| page(150 + 50 * i, 50, 10 * i)).collect();
        assert_eq!(page_ranges(whole, &pages, 50, &[(0, 50)]), vec![(100, 300)]);
        assert_eq!(
            page_ranges(whole, &pages, 50, &[(12, 5)]),
            vec![(100, 50), (200, 50)]
        );
        // Rows 15..25 span two pages; a range that ends where a page starts leaves it out.
        assert_eq!(
            page_ranges(whole, &pages, 50, &[(15, 10)]),
            vec![(100, 50), (200, 100)]
        );
        assert_eq!(
            page_ranges(whole, &pages, 50, &[(20, 10)]),
            vec![(100, 50), (250, 50)]
        );
        // Two ranges, with a page between them not read; the last page runs to the group's end.
        assert_eq!(
            page_ranges(whole, &pages, 50, &[(0, 5), (41, 2)]),
            vec![(100, 100), (350, 50)]
        );
        // No dictionary page: the first data page starts the chunk.
        let plain: Vec<PageLocation> = (0..3).map(|i| page(100 + 100 * i, 100, 10 * i)).collect();
        assert_eq!(page_ranges(whole, &plain, 30, &[(25, 5)]), vec![(300, 100)]);
        // Locations that do not fall inside the chunk (a file that lies): the whole chunk.
        let wrong = vec![page(90, 50, 0), page(140, 50, 10)];
        assert_eq!(page_ranges(whole, &wrong, 20, &[(12, 2)]), vec![whole]);
        let past_end = vec![page(150, 50, 0), page(380, 50, 10)];
        assert_eq!(page_ranges(whole, &past_end, 20, &[(12, 2)]), vec![whole]);
        assert_eq!(page_ranges(whole, &[], 20, &[(12, 2)]), vec![whole]);
    }

    /// Over a file with an offset index and pages of 100 rows, the rows 1,000..1,150 of a
    /// row group of 4,000 take a fraction of its bytes, and a reader over them gives those
    /// rows; read whole, the group gives every row.
    #[test]
    fn a_split_of_a_row_group_reads_its_pages_only() {
        use arrow::array::{Array, AsArray};
        use arrow::datatypes::Int64Type;
        use parquet::arrow::arrow_reader::ArrowReaderOptions;
        use parquet::file::metadata::PageIndexPolicy;
        use parquet::file::properties::WriterProperties;

        let path =
            std::env::temp_dir().join(format!("tally-chunks-{}.parquet", std::process::id()));
        // `v` in plain pages (a dictionary of its 4,000 values would outweigh them), `s` in a
        // dictionary page and pages of its keys.
        let props = WriterProperties::builder().set_column_dictionary_enabled("v".into(), false);
        let n = 4000;
        write_pages(&path, n, |i| (i % 7 != 0).then_some(i), props);

        let options =
            ArrowReaderOptions::default().with_offset_index_policy(PageIndexPolicy::Required);
        let meta = ArrowReaderMetadata::load(&File::open(&path).unwrap(), options).unwrap();
        let mask = ProjectionMask::all();
        let buffers = ChunkBuffers::default();
        let read = |rows: Option<&[(usize, usize)]>| {
            let file = File::open(&path).unwrap();
            RowGroupChunks::read(file, meta.metadata(), 0, &mask, rows, &buffers, "f").unwrap()
        };
        let bytes = |c: &RowGroupChunks| c.chunks.iter().map(|(_, b)| b.len()).sum::<usize>();
        let rows = [(1000, 150)];
        let (whole, part) = (read(None), read(Some(&rows)));
        assert!(
            bytes(&part) * 4 < bytes(&whole),
            "{} of {} bytes",
            bytes(&part),
            bytes(&whole)
        );
        let values = |chunks: RowGroupChunks, rows: Option<&[(usize, usize)]>| -> Vec<i64> {
            let mut builder =
                ParquetRecordBatchReaderBuilder::new_with_metadata(chunks, meta.clone())
                    .with_batch_size(64);
            if let Some(rows) = rows {
                builder = builder.with_row_selection(selection(rows));
            }
            let mut out = vec![];
            for b in builder.build().unwrap() {
                let b = b.unwrap();
                let v = b.column(0).as_primitive::<Int64Type>();
                let s = b.column(1).as_string::<i32>();
                for i in 0..b.num_rows() {
                    // The row number: its value, or (under a NULL) its string's residue checks.
                    let row = if v.is_valid(i) { v.value(i) } else { -1 };
                    assert!(row == -1 || s.value(i) == format!("k{}", row % 13));
                    out.push(row);
                }
            }
            out
        };
        let want = |from: i64, to: i64| -> Vec<i64> {
            (from..to)
                .map(|i| if i % 7 == 0 { -1 } else { i })
                .collect()
        };
        assert_eq!(values(part, Some(&rows)), want(1000, 1150));
        assert_eq!(values(whole, None), want(0, n));
        std::fs::remove_file(&path).ok();
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
