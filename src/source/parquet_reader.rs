//! Reading a whole Parquet file: its metadata and projection (shared with the splits), one
//! reader, or up to P row-group decoders delivering in file order.

use std::fs::File;

use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder,
};

use super::{FileTable, SourceReader, open};
use crate::changelog::ChangeBatch;
use crate::decode::guarded;
use crate::error::{Error, Result};

impl FileTable {
    /// A Parquet file's metadata (checked against the declared columns) and the projection of
    /// the columns this table decodes.
    pub(super) fn parquet_metadata(&self) -> Result<(File, ArrowReaderMetadata, ProjectionMask)> {
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

    pub(super) fn open_parquet(&self, batch_size: usize, decoders: usize) -> Result<SourceReader> {
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
}
