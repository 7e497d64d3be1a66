//! Parts: one key group's rows, the unit that crosses Flink's keyed exchange as one record and
//! sits in Flink's raw keyed state as one blob (Arrow IPC stream bytes).

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use arrow::ipc::reader::StreamReader;
use arrow::ipc::writer::StreamWriter;
use tally::changelog::ChangeBatch;
use tally::{Error, Result};

/// The rows of one key group, as they cross Flink's exchange or sit in its raw keyed state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    /// The key group (Tally's and Flink's).
    pub key_group: u32,
    /// Arrow IPC stream bytes of its rows.
    pub bytes: Vec<u8>,
}

impl Part {
    /// The part of key group `key_group` holding `batch`.
    ///
    /// # Errors
    /// When the batch cannot be written as Arrow IPC (a bug).
    pub(crate) fn new(key_group: usize, batch: &RecordBatch) -> Result<Part> {
        let mut bytes = vec![];
        let mut w = StreamWriter::try_new(&mut bytes, &batch.schema())?;
        w.write(batch)?;
        w.finish()?;
        drop(w);
        Ok(Part {
            key_group: key_group as u32,
            bytes,
        })
    }
}

/// Parts of `(key group, rows)` pairs.
pub(crate) fn parts(cut: Vec<(usize, RecordBatch)>) -> Result<Vec<Part>> {
    cut.iter().map(|(g, b)| Part::new(*g, b)).collect()
}

/// The batches of a part's bytes.
///
/// # Errors
/// Bytes that are not Arrow IPC.
pub(crate) fn from_ipc(bytes: &[u8]) -> Result<Vec<RecordBatch>> {
    let reader = StreamReader::try_new(bytes, None).map_err(|e| {
        Error::invalid_input(format!(
            "a part from Flink's exchange or state is not Arrow IPC: {e}"
        ))
    })?;
    reader
        .map(|b| {
            b.map_err(|e| {
                Error::invalid_input(format!(
                    "a part from Flink's exchange or state is corrupt: {e}"
                ))
            })
        })
        .collect()
}

/// A one-phase part's rows back as changes of `input`: the part carries the kinds as its first
/// column ([`ChangeBatch::with_op_column`]: all `+I` for insert-only input, which keeps none).
///
/// # Errors
/// A part of other columns.
pub(crate) fn changes_of(
    batch: RecordBatch,
    input: &SchemaRef,
    changelog: bool,
) -> Result<ChangeBatch> {
    let mismatch = |e: &dyn std::fmt::Display| {
        Error::invalid_input(format!(
            "a part from Flink's exchange does not match the input: {e}"
        ))
    };
    let Some((op, data)) = batch.columns().split_first() else {
        return Err(mismatch(&"it has no columns"));
    };
    let data = RecordBatch::try_new(Arc::clone(input), data.to_vec()).map_err(|e| mismatch(&e))?;
    ChangeBatch::try_new(changelog.then(|| Arc::clone(op)), data)
}
