//! Dictionary pages shared by the splits that read one row group: where the pipelined
//! runtime's splits cut a row group between them, each split's decoder needs the row group's
//! dictionary pages (to decode its own data pages, and to skip to its first row), and would
//! decompress each one again. The first split to read a column chunk's dictionary page keeps it
//! decompressed ([`SharedDictionaries`]), and the others take that copy, skipping the page in
//! their own chunk ([`SharedDictionaryPages`]); the last of them lets it go.

use std::collections::HashMap;
use std::collections::hash_map::{Entry, OccupiedEntry};
#[cfg(test)]
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ParquetRecordBatchReader, RowGroups, RowSelection,
};
use parquet::arrow::parquet_to_arrow_field_levels;
use parquet::column::page::{Page, PageIterator, PageMetadata, PageReader};
use parquet::errors::Result as ParquetResult;
use parquet::file::metadata::{ParquetMetaData, RowGroupMetaData};
use parquet::file::serialized_reader::SerializedPageReader;

use super::parquet_chunks::RowGroupChunks;

/// The decompressed dictionary pages of the column chunks that several splits read, each with
/// the number of those splits yet to take it.
#[derive(Debug)]
pub(super) struct SharedDictionaries {
    /// Per row group, how many splits read it.
    readers: Vec<usize>,
    /// `(row group, leaf column)` → the page and the splits yet to take it.
    pages: Mutex<HashMap<(usize, usize), (Page, usize)>>,
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

    /// The kept pages, locked.
    fn pages(&self) -> MutexGuard<'_, HashMap<(usize, usize), (Page, usize)>> {
        self.pages.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The page another split of row group `rg` decompressed for column `column`, if one has;
    /// the last split to take it removes it.
    fn take(&self, rg: usize, column: usize) -> Option<Page> {
        let mut pages = self.pages();
        let Entry::Occupied(kept) = pages.entry((rg, column)) else {
            return None;
        };
        let page = kept.get().0.clone();
        #[cfg(test)]
        self.taken.fetch_add(1, Ordering::Relaxed);
        one_less(kept);
        Some(page)
    }

    /// Counts a split of row group `rg` that will not take column `column`'s page.
    fn pass(&self, rg: usize, column: usize) {
        if let Entry::Occupied(kept) = self.pages().entry((rg, column)) {
            one_less(kept);
        }
    }

    /// Keeps `page`, which one split of row group `rg` decompressed, for the others (unless one
    /// of them kept its own meanwhile: then this split counts as one that took it).
    fn keep(&self, rg: usize, column: usize, page: &Page) {
        let others = self.readers.get(rg).map_or(0, |&n| n.saturating_sub(1));
        let mut pages = self.pages();
        match pages.entry((rg, column)) {
            Entry::Occupied(kept) => one_less(kept),
            Entry::Vacant(slot) if others > 0 => {
                slot.insert((page.clone(), others));
            }
            Entry::Vacant(_) => {}
        }
    }

    /// Dictionary pages kept now, and pages taken from another split's copy so far.
    #[cfg(test)]
    fn counts(&self) -> (usize, usize) {
        (self.pages().len(), self.taken.load(Ordering::Relaxed))
    }
}

/// One split fewer yet to take a kept page; the last one removes it.
fn one_less(mut kept: OccupiedEntry<'_, (usize, usize), (Page, usize)>) {
    kept.get_mut().1 -= 1;
    if kept.get().1 == 0 {
        kept.remove();
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
    fn next_page(&mut self) -> ParquetResult<Option<Page>> {
        if !self.past_dictionary {
            self.past_dictionary = true;
            if self.inner.peek_next_page()?.is_some_and(|m| m.is_dict) {
                if let Some(page) = self.shared.take(self.rg, self.column) {
                    self.inner.skip_next_page()?;
                    return Ok(Some(page));
                }
                let page = self.inner.get_next_page()?;
                if let Some(page) = &page {
                    self.shared.keep(self.rg, self.column, page);
                }
                return Ok(page);
            }
        }
        self.inner.get_next_page()
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
        if !self.past_dictionary {
            self.past_dictionary = true;
            // The dictionary page skipped by this split is one less taker of the shared copy.
            if self.inner.peek_next_page()?.is_some_and(|m| m.is_dict) {
                self.shared.pass(self.rg, self.column);
            }
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

    /// Three splits of one row group, each reading a range of its rows (one of them without an
    /// offset index to skip by): each gives the rows it reads, the same with the dictionary
    /// pages shared as without, two of the three take the first one's pages instead of
    /// decompressing them, and nothing is kept once all have read.
    #[test]
    fn splits_of_a_row_group_share_its_dictionary_pages() {
        let dir = std::env::temp_dir().join(format!("tally-dicts-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for index in [true, false] {
            let path = dir.join(format!("dicts-{index}.parquet"));
            let props = WriterProperties::builder().set_offset_index_disabled(!index);
            let schema = write_pages(&path, 3000, |i| (i % 11 != 0).then_some(i % 97), props);
            let table = FileTable {
                name: "t".into(),
                schema,
                path,
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
        }
    }
}
