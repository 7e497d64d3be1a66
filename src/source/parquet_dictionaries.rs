//! Dictionary pages shared by the splits that read one row group: where the pipelined
//! runtime's splits cut a row group between them, each split's decoder needs the row group's
//! dictionary pages (to decode its own data pages, and to skip to its first row), and would
//! decompress each one again. The first split to reach a column chunk's dictionary page
//! decompresses it into a slot the splits share ([`SharedDictionaries`]); the others wait for
//! it there rather than decompress it too, take that copy, and skip the page in their own chunk
//! ([`SharedDictionaryPages`]); the last of them to ask lets the slot go.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
#[cfg(test)]
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ParquetRecordBatchReader, RowGroups, RowSelection,
};
use parquet::arrow::parquet_to_arrow_field_levels;
use parquet::column::page::{Page, PageIterator, PageMetadata, PageReader};
use parquet::errors::{ParquetError, Result as ParquetResult};
use parquet::file::metadata::{ParquetMetaData, RowGroupMetaData};
use parquet::file::serialized_reader::SerializedPageReader;

use super::parquet_chunks::RowGroupChunks;

/// What the splits of a row group share of one column chunk's dictionary page: the page,
/// decompressed by the first split to reach it (the others wait for it rather than decompress
/// it too), or the error that split met.
type Slot = Arc<OnceLock<Result<Page, String>>>;

/// The decompressed dictionary pages of the column chunks that several splits read, each with
/// the number of those splits yet to take it.
#[derive(Debug)]
pub(super) struct SharedDictionaries {
    /// Per row group, how many splits read it.
    readers: Vec<usize>,
    /// `(row group, leaf column)` → its page's slot and the splits yet to take it.
    pages: Mutex<HashMap<(usize, usize), (Slot, usize)>>,
    /// Pages taken from another split's copy (not decompressed again), for the tests.
    #[cfg(test)]
    taken: AtomicUsize,
}

impl SharedDictionaries {
    /// Pages to share between splits, where `readers[rg]` splits read row group `rg`.
    pub(super) fn new(readers: Vec<usize>) -> Self {
        Self {
            readers,
            pages: Mutex::new(HashMap::new()),
            #[cfg(test)]
            taken: AtomicUsize::new(0),
        }
    }

    /// Whether more than one split reads row group `rg` (else nothing is worth sharing).
    pub(super) fn shared(&self, rg: usize) -> bool {
        self.readers.get(rg).is_some_and(|&n| n > 1)
    }

    /// The slot of column `column`'s dictionary page in row group `rg`, counting this split
    /// as one that has taken it: the last of the row group's splits to ask removes it.
    fn slot(&self, rg: usize, column: usize) -> Slot {
        let readers = self.readers.get(rg).copied().unwrap_or(1);
        let mut pages = self.pages.lock().unwrap_or_else(|e| e.into_inner());
        let Entry::Occupied(mut kept) = pages.entry((rg, column)) else {
            let slot = Slot::default();
            if readers > 1 {
                pages.insert((rg, column), (Arc::clone(&slot), readers - 1));
            }
            return slot;
        };
        let slot = Arc::clone(&kept.get().0);
        kept.get_mut().1 -= 1;
        if kept.get().1 == 0 {
            kept.remove();
        }
        slot
    }

    /// Dictionary pages kept now, and pages taken from another split's copy so far.
    #[cfg(test)]
    fn counts(&self) -> (usize, usize) {
        let kept = self.pages.lock().map_or(0, |p| p.len());
        (kept, self.taken.load(Ordering::Relaxed))
    }
}

/// A column chunk's pages, whose dictionary page comes from (or goes to) the pages the
/// row group's splits share.
struct SharedDictionaryPages {
    inner: SerializedPageReader<RowGroupChunks>,
    shared: Arc<SharedDictionaries>,
    rg: usize,
    column: usize,
    /// Whether the chunk's first page has been looked at.
    past_dictionary: bool,
}

impl SharedDictionaryPages {
    /// Whether the chunk's first page, not looked at yet, is its dictionary page (it is looked
    /// at now).
    fn at_dictionary(&mut self) -> ParquetResult<bool> {
        if self.past_dictionary {
            return Ok(false);
        }
        self.past_dictionary = true;
        Ok(self.inner.peek_next_page()?.is_some_and(|m| m.is_dict))
    }

    fn next_page(&mut self) -> ParquetResult<Option<Page>> {
        if !self.at_dictionary()? {
            return self.inner.get_next_page();
        }
        // The first split to get here decompresses the page; the others wait for it, take
        // it, and skip the page in their own chunk.
        let slot = self.shared.slot(self.rg, self.column);
        let (mut ran, mut own_error) = (false, None);
        let page = slot.get_or_init(|| {
            ran = true;
            match self.inner.get_next_page() {
                Ok(Some(page)) => Ok(page),
                Ok(None) => Err("the dictionary page is missing".to_string()),
                Err(e) => {
                    let message = e.to_string();
                    own_error = Some(e);
                    Err(message)
                }
            }
        });
        if let Some(e) = own_error {
            return Err(e);
        }
        let page = page.clone().map_err(ParquetError::General)?;
        if !ran {
            self.inner.skip_next_page()?;
            #[cfg(test)]
            self.shared.taken.fetch_add(1, Ordering::Relaxed);
        }
        Ok(Some(page))
    }
}

impl Iterator for SharedDictionaryPages {
    type Item = ParquetResult<Page>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_page().transpose()
    }
}

impl PageReader for SharedDictionaryPages {
    fn get_next_page(&mut self) -> ParquetResult<Option<Page>> {
        self.next_page()
    }

    fn peek_next_page(&mut self) -> ParquetResult<Option<PageMetadata>> {
        self.inner.peek_next_page()
    }

    fn skip_next_page(&mut self) -> ParquetResult<()> {
        // A dictionary page this split skips: it is one less split to take the shared copy.
        if self.at_dictionary()? {
            drop(self.shared.slot(self.rg, self.column));
        }
        self.inner.skip_next_page()
    }

    fn at_record_boundary(&mut self) -> ParquetResult<bool> {
        self.inner.at_record_boundary()
    }
}

/// One row group's projected chunks, as the decoder reads them: each column's pages through
/// [`SharedDictionaryPages`].
struct SplitRowGroup {
    chunks: Arc<RowGroupChunks>,
    metadata: Arc<ParquetMetaData>,
    rg: usize,
    shared: Arc<SharedDictionaries>,
}

/// The one page reader of a row group's column chunk.
struct OnePageReader(Option<Box<dyn PageReader>>);

impl Iterator for OnePageReader {
    type Item = ParquetResult<Box<dyn PageReader>>;

    fn next(&mut self) -> Option<Self::Item> {
        self.0.take().map(Ok)
    }
}

impl PageIterator for OnePageReader {}

impl RowGroups for SplitRowGroup {
    fn num_rows(&self) -> usize {
        usize::try_from(self.metadata.row_group(self.rg).num_rows()).unwrap_or(0)
    }

    fn column_chunks(&self, i: usize) -> ParquetResult<Box<dyn PageIterator>> {
        let group = self.metadata.row_group(self.rg);
        let pages = self
            .metadata
            .offset_index()
            .and_then(|index| index.get(self.rg))
            .filter(|columns| columns.len() == group.num_columns())
            .map(|columns| columns[i].page_locations().clone());
        let inner = SerializedPageReader::new(
            Arc::clone(&self.chunks),
            group.column(i),
            self.num_rows(),
            pages,
        )?;
        Ok(Box::new(OnePageReader(Some(Box::new(
            SharedDictionaryPages {
                inner,
                shared: Arc::clone(&self.shared),
                rg: self.rg,
                column: i,
                past_dictionary: false,
            },
        )))))
    }

    fn row_groups(&self) -> Box<dyn Iterator<Item = &RowGroupMetaData> + '_> {
        Box::new(std::iter::once(self.metadata.row_group(self.rg)))
    }

    fn metadata(&self) -> &ParquetMetaData {
        &self.metadata
    }
}

/// A reader of the rows `selection` selects of row group `rg`, whose projected chunks
/// (`mask`) are `chunks`, sharing its dictionary pages with the row group's other splits.
pub(super) fn shared_dictionary_reader(
    chunks: RowGroupChunks,
    metadata: &ArrowReaderMetadata,
    rg: usize,
    mask: &ProjectionMask,
    batch_size: usize,
    selection: Option<RowSelection>,
    shared: &Arc<SharedDictionaries>,
) -> ParquetResult<ParquetRecordBatchReader> {
    let levels = parquet_to_arrow_field_levels(
        metadata.parquet_schema(),
        mask.clone(),
        Some(metadata.schema().fields()),
    )?;
    let group = SplitRowGroup {
        chunks: Arc::new(chunks),
        metadata: Arc::clone(metadata.metadata()),
        rg,
        shared: Arc::clone(shared),
    };
    let rows = group.num_rows().max(1);
    ParquetRecordBatchReader::try_new_with_row_groups(
        &levels,
        &group,
        batch_size.min(rows),
        selection,
    )
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Array, AsArray};
    use arrow::datatypes::Int64Type;
    use parquet::file::properties::WriterProperties;

    use super::SharedDictionaries;
    use crate::source::parquet_chunks::{ChunkBuffers, RowGroupChunks, write_pages};
    use crate::source::{FileTable, Format};

    /// Three splits of one row group, each reading a range of its rows (in a file with an
    /// offset index to skip by, and in one without): each gives the rows it reads, the same
    /// with the dictionary pages shared as without, two of the three take the first one's
    /// pages instead of decompressing them, one after the other or all at once, and nothing is
    /// kept once all have read.
    #[test]
    fn splits_of_a_row_group_share_its_dictionary_pages() {
        for index in [true, false] {
            let path = std::env::temp_dir().join(format!(
                "tally-dicts-{}-{index}.parquet",
                std::process::id()
            ));
            let props = WriterProperties::builder().set_offset_index_disabled(!index);
            let schema = write_pages(&path, 3000, |i| (i % 11 != 0).then_some(i % 97), props);
            let table = FileTable {
                name: "t".into(),
                schema,
                path: path.clone(),
                format: Format::Parquet,
                changelog_column: None,
                time_column: None,
                unread_columns: vec![],
                dictionary_columns: vec![],
            };
            let scan = table.parquet_metadata(true).unwrap();
            let buffers = ChunkBuffers::default();
            let ranges = [vec![(0, 1000)], vec![(1000, 1234)], vec![(2234, 766)]];
            let read = |rows: &[(usize, usize)], shared: Option<&Arc<SharedDictionaries>>| {
                let reader = RowGroupChunks::reader(
                    &table,
                    &scan.metadata,
                    0,
                    &scan.mask,
                    &buffers,
                    128,
                    Some(rows),
                    shared,
                )
                .unwrap();
                let mut out = vec![];
                for b in reader {
                    let b = b.unwrap();
                    let v = b.column(0).as_primitive::<Int64Type>();
                    let s = b.column(1).as_string::<i32>();
                    for i in 0..b.num_rows() {
                        out.push((v.is_valid(i).then(|| v.value(i)), s.value(i).to_string()));
                    }
                }
                out
            };
            let shared = Arc::new(SharedDictionaries::new(vec![3]));
            for rows in &ranges {
                let (start, len) = rows[0];
                let want: Vec<(Option<i64>, String)> = (start..start + len)
                    .map(|i| {
                        let i = i as i64;
                        ((i % 11 != 0).then_some(i % 97), format!("k{}", i % 13))
                    })
                    .collect();
                assert_eq!(read(rows, None), want, "index {index}, rows {rows:?}");
                assert_eq!(
                    read(rows, Some(&shared)),
                    want,
                    "index {index}, rows {rows:?}, shared"
                );
            }
            // Both columns have a dictionary page: the second and third splits took them.
            assert_eq!(shared.counts(), (0, 4), "index {index}");
            // The three splits at once, as the runtime reads them: still one decompression of
            // each page, whichever split gets there first (the others wait for it).
            for _ in 0..8 {
                let shared = Arc::new(SharedDictionaries::new(vec![3]));
                let got: Vec<_> = std::thread::scope(|s| {
                    let reads: Vec<_> = ranges
                        .iter()
                        .map(|rows| s.spawn(|| read(rows, Some(&shared))))
                        .collect();
                    reads.into_iter().map(|r| r.join().unwrap()).collect()
                });
                for (rows, got) in ranges.iter().zip(got) {
                    assert_eq!(
                        got,
                        read(rows, None),
                        "index {index}, rows {rows:?}, at once"
                    );
                }
                assert_eq!(shared.counts(), (0, 4), "index {index}, at once");
            }
            std::fs::remove_file(&path).ok();
        }
    }
}
