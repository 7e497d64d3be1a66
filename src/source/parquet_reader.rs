//! Reading a whole Parquet file: its metadata and projection (shared with the splits), one
//! reader, or up to P row-group decoders delivering in file order.

use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};
use parquet::basic::Encoding;
use parquet::file::metadata::{PageIndexPolicy, ParquetMetaData};

use super::parquet_chunks::{ChunkBuffers, RowGroupChunks};
use super::{FileTable, NullColumns, SourceReader, open};
use crate::changelog::ChangeBatch;
use crate::decode::guarded;
use crate::error::{Error, Result};

/// What a Parquet read of a table needs: its metadata (with the dictionary hints), the
/// projection, and the schema its batches arrive in.
pub(super) struct ParquetScan {
    pub(super) metadata: ArrowReaderMetadata,
    pub(super) mask: ProjectionMask,
    /// The declared schema, with the columns read as dictionaries typed as such.
    pub(super) schema: SchemaRef,
}

/// The dictionary type a string column is read as.
fn dictionary_of(value: &DataType) -> DataType {
    DataType::Dictionary(Box::new(DataType::Int32), Box::new(value.clone()))
}

/// Whether every data page of the file's column `root` (a flat column, one leaf) is dictionary
/// encoded in every row group, as the writer's page-encoding statistics say. A chunk that fell
/// back to PLAIN would have the reader build a dictionary per batch: slower than strings.
fn all_dictionary_encoded(metadata: &ParquetMetaData, root: usize) -> bool {
    let schema = metadata.file_metadata().schema_descr();
    let leaves: Vec<usize> = (0..schema.num_columns())
        .filter(|&l| schema.get_column_root_idx(l) == root)
        .collect();
    let [leaf] = leaves[..] else {
        return false;
    };
    metadata.num_row_groups() > 0
        && metadata.row_groups().iter().all(|rg| {
            let chunk = rg.column(leaf);
            chunk.dictionary_page_offset().is_some()
                && chunk.page_encoding_stats_mask().is_some_and(|m| {
                    m.is_only(Encoding::RLE_DICTIONARY) || m.is_only(Encoding::PLAIN_DICTIONARY)
                })
        })
}

impl FileTable {
    /// A Parquet file's metadata (checked against the declared columns), the projection of the
    /// columns this table decodes, and the schema of its batches: the declared one, except that
    /// the [`FileTable::dictionary_columns`] whose chunks are all dictionary encoded are read as
    /// `Dictionary(Int32, Utf8)` (the strings are decoded once per row group, not once per row).
    /// With `pages`, the file's offset index comes too where it has one (so that a split of a
    /// row group reads only its pages: `parquet_chunks.rs`); an index that cannot be read is
    /// left out.
    pub(super) fn parquet_metadata(&self, pages: bool) -> Result<ParquetScan> {
        let file = open(&self.path)?;
        let plain = || ArrowReaderMetadata::load(&file, ArrowReaderOptions::default());
        let loaded = if pages {
            let offsets =
                ArrowReaderOptions::default().with_offset_index_policy(PageIndexPolicy::Optional);
            ArrowReaderMetadata::load(&file, offsets).or_else(|_| plain())
        } else {
            plain()
        };
        let mut metadata = loaded
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
        let as_dictionary: Vec<usize> = roots
            .iter()
            .copied()
            .filter(|&i| {
                let f = metadata.schema().field(i);
                *f.data_type() == DataType::Utf8
                    && self.dictionary_columns.iter().any(|d| d == f.name())
                    && self
                        .schema
                        .field_with_name(f.name())
                        .is_ok_and(|d| *d.data_type() == DataType::Utf8)
                    && all_dictionary_encoded(metadata.metadata(), i)
            })
            .collect();
        let mut schema = Arc::clone(&self.schema);
        if !as_dictionary.is_empty() {
            let file_schema = Arc::clone(metadata.schema());
            let hint: Vec<Field> = file_schema
                .fields()
                .iter()
                .enumerate()
                .map(|(i, f)| {
                    let f = f.as_ref().clone();
                    if as_dictionary.contains(&i) {
                        let dt = dictionary_of(f.data_type());
                        f.with_data_type(dt)
                    } else {
                        f
                    }
                })
                .collect();
            let hint = Arc::new(Schema::new_with_metadata(
                hint,
                file_schema.metadata().clone(),
            ));
            // A hint the reader refuses leaves the strings as they are.
            if let Ok(hinted) = ArrowReaderMetadata::try_new(
                Arc::clone(metadata.metadata()),
                ArrowReaderOptions::new().with_schema(hint),
            ) {
                metadata = hinted;
                let names: Vec<&String> = as_dictionary
                    .iter()
                    .map(|&i| file_schema.field(i).name())
                    .collect();
                let fields: Vec<Field> = self
                    .schema
                    .fields()
                    .iter()
                    .map(|f| {
                        let f = f.as_ref().clone();
                        if names.contains(&f.name()) {
                            let dt = dictionary_of(f.data_type());
                            f.with_data_type(dt)
                        } else {
                            f
                        }
                    })
                    .collect();
                schema = Arc::new(Schema::new_with_metadata(
                    fields,
                    self.schema.metadata().clone(),
                ));
            }
        }
        let mask = ProjectionMask::roots(metadata.parquet_schema(), roots);
        Ok(ParquetScan {
            metadata,
            mask,
            schema,
        })
    }

    /// Reads the file with up to `decoders` row groups decoded at once on threads of their own
    /// (batches in file order); one decoder, or one row group, reads on the caller's thread as
    /// one split of every row group ([`FileTable::open_splits`]).
    pub(super) fn open_parquet(&self, batch_size: usize, decoders: usize) -> Result<SourceReader> {
        let ParquetScan {
            metadata,
            mask,
            schema,
            ..
        } = self.parquet_metadata(false)?;
        let total_rows = Some(metadata.metadata().file_metadata().num_rows() as u64);
        let decoders = decoders.min(metadata.metadata().num_row_groups());
        if decoders <= 1 {
            return Ok(self
                .parquet_splits(batch_size, 1)?
                .pop()
                .unwrap_or(SourceReader {
                    inner: Box::new(std::iter::empty()),
                    total_rows,
                }));
        }
        Ok(self.parallel_parquet((metadata, mask, schema), batch_size, decoders, total_rows))
    }

    /// Decoder `k` of `decoders` decodes row groups `k, k + decoders, …` and sends each one's
    /// batches, then an end marker, on its own channel; the reader takes the row groups in order
    /// from the channels in turn, so batches come in file order.
    fn parallel_parquet(
        &self,
        (metadata, mask, schema): (ArrowReaderMetadata, ProjectionMask, SchemaRef),
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
            let schema = Arc::clone(&schema);
            let mut nulls = NullColumns::default();
            let spawned = std::thread::Builder::new()
                .name(format!("tally-parquet-{k}"))
                .spawn(move || {
                    let ctx = table.ctx();
                    let buffers = ChunkBuffers::default();
                    for rg in (k..row_groups).step_by(decoders) {
                        let reader = guarded(&ctx, || {
                            RowGroupChunks::reader(
                                &table, &metadata, rg, &mask, &buffers, batch_size, None, None,
                            )
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
                                    .and_then(|b| table.convert_to(&b, &schema, &mut nulls)),
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
}
