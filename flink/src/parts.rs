//! Parts: one key group's rows, the unit that crosses Flink's keyed exchange as one record and
//! sits in Flink's raw keyed state as one blob (Arrow IPC stream bytes), and how rows are cut into
//! them by Tally's key group.

use std::sync::Arc;

use arrow::array::{ArrayRef, Int8Array, RecordBatch, UInt32Array};
use arrow::compute::take_record_batch;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::ipc::reader::StreamReader;
use arrow::ipc::writer::StreamWriter;
use tally::changelog::ChangeBatch;
use tally::operator::key_groups::KeyGroups;
use tally::{Error, Result};

/// The rows of one key group, as they cross Flink's exchange or sit in its raw keyed state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    /// The key group (Tally's and Flink's).
    pub key_group: u32,
    /// Arrow IPC stream bytes of its rows.
    pub bytes: Vec<u8>,
}

/// The name of the row kind column of a one-phase part (Int8 codes, Flink's byte values).
const KIND_COLUMN: &str = "$kind";

/// Cuts `batch` (whose first `keys` columns are the group keys, or whose `keys` are given) into
/// one part per key group, in key group order, the rows of each in input order.
pub(crate) fn cut_by_key_group(
    batch: &RecordBatch,
    keys: &[ArrayRef],
    groups: &KeyGroups,
    hashes: &mut Vec<u64>,
) -> Result<Vec<Part>> {
    let n = batch.num_rows();
    tally_hash(keys, n, hashes)?;
    let mut counts = vec![0u32; groups.count() + 1];
    let kgs: Vec<u32> = hashes.iter().map(|&h| groups.of_hash(h) as u32).collect();
    for &g in &kgs {
        counts[g as usize + 1] += 1;
    }
    for g in 1..counts.len() {
        counts[g] += counts[g - 1];
    }
    let starts = counts.clone();
    let mut order = vec![0u32; n];
    for (row, &g) in kgs.iter().enumerate() {
        let at = &mut counts[g as usize];
        order[*at as usize] = row as u32;
        *at += 1;
    }
    let order = UInt32Array::from(order);
    let sorted = take_record_batch(batch, &order)?;
    let mut parts = vec![];
    for g in 0..groups.count() {
        let (start, end) = (starts[g] as usize, starts[g + 1] as usize);
        if start < end {
            parts.push(Part {
                key_group: g as u32,
                bytes: to_ipc(&sorted.slice(start, end - start))?,
            });
        }
    }
    Ok(parts)
}

/// The key hash Tally's operators compute (and so its key groups).
fn tally_hash(keys: &[ArrayRef], n: usize, hashes: &mut Vec<u64>) -> Result<()> {
    tally_kernels::hash::hash_columns(keys, hashes)?;
    if keys.is_empty() {
        hashes.clear();
        hashes.resize(n, 0);
    }
    Ok(())
}

pub(crate) fn to_ipc(batch: &RecordBatch) -> Result<Vec<u8>> {
    let mut out = vec![];
    let mut w = StreamWriter::try_new(&mut out, &batch.schema())?;
    w.write(batch)?;
    w.finish()?;
    drop(w);
    Ok(out)
}

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

/// The rows of a changelog with their kinds as a last Int8 column (a one-phase part).
pub(crate) fn with_kinds(changes: &ChangeBatch) -> Result<RecordBatch> {
    let Some(_) = &changes.op else {
        return Ok(changes.data.clone());
    };
    let codes: Int8Array = changes
        .row_kinds()?
        .iter()
        .map(|k| Some(k.code()))
        .collect();
    let mut fields: Vec<Field> = changes
        .data
        .schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    fields.push(Field::new(KIND_COLUMN, DataType::Int8, false));
    let mut columns = changes.data.columns().to_vec();
    columns.push(Arc::new(codes));
    Ok(RecordBatch::try_new(
        Arc::new(Schema::new(fields)),
        columns,
    )?)
}

pub(crate) fn without_kinds(batch: RecordBatch, input: &SchemaRef) -> Result<ChangeBatch> {
    let n = batch.num_columns();
    let schema = batch.schema();
    let (data, op) = if n > 0 && schema.field(n - 1).name() == KIND_COLUMN {
        let mut b = batch;
        let op = b.remove_column(n - 1);
        (b, Some(op))
    } else {
        (batch, None)
    };
    let data = RecordBatch::try_new(Arc::clone(input), data.columns().to_vec()).map_err(|e| {
        Error::invalid_input(format!(
            "a part from Flink's exchange does not match the input: {e}"
        ))
    })?;
    ChangeBatch::try_new(op, data)
}
