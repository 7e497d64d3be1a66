//! The exchange and the slicing around it: cutting the input into slices and regrouping them
//! into at most P tasks of consecutive rows (`balance`), and routing rows or snapshot rows to
//! the worker that owns their key's key group ([`KeyGroups`]), with one gather (`take_parts`)
//! for both; the local phases' accumulator rows are flushed straight into per-worker parts
//! by the same `partition` (`LocalGroupAggregate::flush_routed`: one batch ordered by worker,
//! each worker's part a range of it).

use arrow::array::{RecordBatch, UInt32Array};
use arrow::buffer::ScalarBuffer;
use arrow::compute::take_record_batch;

use crate::changelog::ChangeBatch;
use crate::error::{Error, Result};
use crate::operator::key_groups::KeyGroups;
use crate::plan::CalcBatch;

/// Rows routed to one worker by the exchange: evaluated columns and each row's key hash.
#[derive(Debug)]
pub(crate) struct Routed {
    pub(crate) cb: CalcBatch,
    pub(crate) hashes: ScalarBuffer<u64>,
}

/// Rows after Calc, with each row's key hash (or none yet: [`Hashed::hash`]).
#[derive(Debug, Clone)]
pub(crate) struct Hashed {
    pub(crate) cb: CalcBatch,
    pub(crate) hashes: ScalarBuffer<u64>,
}

impl Hashed {
    /// The rows with their key hashes, computed here if they were left out (for a local phase
    /// whose key table hashes its keys itself).
    pub(crate) fn hash(self) -> Result<Hashed> {
        if !self.hashes.is_empty() || self.cb.num_rows == 0 {
            return Ok(self);
        }
        let mut hashes = vec![];
        crate::operator::keyed::hash_keys(&self.cb.keys, self.cb.num_rows, &mut hashes)?;
        Ok(Hashed {
            cb: self.cb,
            hashes: hashes.into(),
        })
    }
}

/// A slice after Calc: hashed (for a local phase, or for the exchange once its mini-batch is
/// cut), or already routed to the workers.
pub(crate) enum Evaluated {
    Hashed(Hashed),
    Routed(Vec<Routed>),
}

/// Consecutive rows that can be cut without copying: input changes and evaluated slices.
pub(crate) trait Rows: Sized {
    fn num_rows(&self) -> usize;
    fn slice(&self, offset: usize, len: usize) -> Self;
}

impl Rows for ChangeBatch {
    fn num_rows(&self) -> usize {
        ChangeBatch::num_rows(self)
    }
    fn slice(&self, offset: usize, len: usize) -> Self {
        ChangeBatch::slice(self, offset, len)
    }
}

impl Rows for Hashed {
    fn num_rows(&self) -> usize {
        self.cb.num_rows
    }
    fn slice(&self, offset: usize, len: usize) -> Self {
        Hashed {
            cb: self.cb.slice(offset, len),
            hashes: if self.hashes.is_empty() {
                ScalarBuffer::from(vec![])
            } else {
                self.hashes.slice(offset, len)
            },
        }
    }
}

/// Cuts `changes` into up to `p` consecutive slices of at least [`MIN_SLICE_ROWS`] rows.
pub(crate) fn slice_evenly(changes: &ChangeBatch, p: usize) -> Vec<ChangeBatch> {
    even_slices(changes.num_rows(), p)
        .into_iter()
        .map(|(offset, len)| changes.slice(offset, len))
        .collect()
}

/// `(offset, len)` of up to `p` consecutive, near-equal slices of `n` rows, each of at least
/// [`MIN_SLICE_ROWS`] rows (one slice when `n` is smaller).
pub(crate) fn even_slices(n: usize, p: usize) -> Vec<(usize, usize)> {
    let pieces = p.min(n / MIN_SLICE_ROWS).max(1);
    let mut out = Vec::with_capacity(pieces);
    let mut start = 0;
    for i in 0..pieces {
        let end = n * (i + 1) / pieces;
        out.push((start, end - start));
        start = end;
    }
    out
}

/// Regroups consecutive slices into at most `p` tasks of consecutive rows, near-equal in size
/// (each of at least `min_rows` rows when there are enough), cutting slices where needed
/// (zero-copy). Task `j`'s rows all come before task `j + 1`'s.
pub(crate) fn balance<T: Rows>(slices: Vec<T>, p: usize, min_rows: usize) -> Vec<Vec<T>> {
    let total: usize = slices.iter().map(Rows::num_rows).sum();
    if total == 0 {
        return vec![];
    }
    let tasks = p.min(total / min_rows).max(1);
    let mut out: Vec<Vec<T>> = (0..tasks).map(|_| vec![]).collect();
    let (mut task, mut pos) = (0, 0);
    for s in slices {
        let n = s.num_rows();
        let mut off = 0;
        while off < n {
            let task_end = total * (task + 1) / tasks;
            let take = (n - off).min(task_end - pos);
            if take > 0 {
                out[task].push(s.slice(off, take));
            }
            off += take;
            pos += take;
            if pos == task_end {
                task += 1;
            }
        }
    }
    out
}

/// Slices smaller than this are not worth a task of their own (BENCHMARKS.md, "Tuning
/// constants").
pub const MIN_SLICE_ROWS: usize = 1024;

/// Row indices per worker: row `r` goes to the owner of its key group.
pub(crate) fn partition(hashes: &[u64], kg: &KeyGroups) -> Vec<Vec<u32>> {
    let p = kg.workers();
    let mut idx: Vec<Vec<u32>> = (0..p)
        .map(|_| Vec::with_capacity(hashes.len() / p + 16))
        .collect();
    for (r, &h) in hashes.iter().enumerate() {
        idx[kg.worker_of_hash(h)].push(r as u32);
    }
    idx
}

/// Routes rows to `p` workers by their key hashes: `gather(indices, hashes)` takes one worker's
/// rows (the row indices, in order, and their hashes); the parts come back in worker order.
pub(crate) fn take_parts<T>(
    hashes: &[u64],
    kg: &KeyGroups,
    mut gather: impl FnMut(&UInt32Array, ScalarBuffer<u64>) -> Result<T>,
) -> Result<Vec<T>> {
    partition(hashes, kg)
        .into_iter()
        .map(|idx| {
            let part_hashes: Vec<u64> = idx.iter().map(|&i| hashes[i as usize]).collect();
            gather(&UInt32Array::from(idx), part_hashes.into())
        })
        .collect()
}

/// The exchange for evaluated rows: one part per worker.
pub(crate) fn route(h: Hashed, kg: &KeyGroups) -> Result<Vec<Routed>> {
    if kg.workers() == 1 {
        return Ok(vec![Routed {
            cb: h.cb,
            hashes: h.hashes,
        }]);
    }
    take_parts(&h.hashes, kg, |idx, hashes| {
        Ok(Routed {
            cb: h.cb.take(idx)?,
            hashes,
        })
    })
}

/// The exchange for snapshot rows (a restore to another parallelism): one part per worker,
/// each with its key hashes.
pub(crate) fn route_snapshot(
    batch: &RecordBatch,
    hashes: &[u64],
    kg: &KeyGroups,
) -> Result<Vec<(RecordBatch, Vec<u64>)>> {
    if kg.workers() == 1 {
        return Ok(vec![(batch.clone(), hashes.to_vec())]);
    }
    take_parts(hashes, kg, |idx, hashes| {
        Ok((take_record_batch(batch, idx)?, hashes.to_vec()))
    })
}

/// Rows of a batch and their key hashes.
pub(crate) type HashedRows = (RecordBatch, Vec<u64>);

/// Snapshot batches (their first `k` columns the keys) cut into one list per worker of `kg`:
/// each worker's rows of each batch that has some, with their key hashes (each key hashed once).
///
/// # Errors
/// A batch of fewer than `k` columns (a snapshot of another query).
pub(crate) fn route_snapshots(
    batches: &[RecordBatch],
    k: usize,
    kg: &KeyGroups,
) -> Result<Vec<Vec<HashedRows>>> {
    let mut parts: Vec<Vec<HashedRows>> = (0..kg.workers()).map(|_| vec![]).collect();
    let mut hashes = vec![];
    for b in batches {
        if b.num_columns() < k {
            return Err(Error::invalid_input(
                "the snapshot was taken for another query: too few columns",
            ));
        }
        crate::operator::hash_keys(&b.columns()[..k], b.num_rows(), &mut hashes)?;
        for (w, part) in route_snapshot(b, &hashes, kg)?.into_iter().enumerate() {
            if part.0.num_rows() > 0 {
                parts[w].push(part);
            }
        }
    }
    Ok(parts)
}

/// The rows of `batch` cut into one batch per key group of `key_groups` that holds rows, in key
/// group order, each with its key group, the rows of each in input order; `hashes` are the rows'
/// key hashes ([`crate::operator::hash_keys`]). For a host that routes by key group itself
/// (Flink): the same cut as `route_snapshot`, with a worker per key group.
///
/// # Errors
/// No key group, or more than [`crate::operator::key_groups::MAX_KEY_GROUPS`].
pub fn by_key_group(
    batch: &RecordBatch,
    hashes: &[u64],
    key_groups: usize,
) -> Result<Vec<(usize, RecordBatch)>> {
    let kg = KeyGroups::new(key_groups, key_groups)?;
    Ok(route_snapshot(batch, hashes, &kg)?
        .into_iter()
        .enumerate()
        .filter(|(_, (b, _))| b.num_rows() > 0)
        .map(|(g, (b, _))| (g, b))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    use arrow::array::{AsArray, Int64Array};
    use arrow::datatypes::{DataType, Field, Int64Type, Schema};

    fn batch(from: i64, n: usize) -> ChangeBatch {
        let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, false)]));
        let values: Vec<i64> = (from..from + n as i64).collect();
        ChangeBatch::inserts(
            RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(values))]).unwrap(),
        )
    }

    #[test]
    fn balance_keeps_order_and_evens_out_tasks() {
        for (sizes, p, min_rows) in [
            (vec![10usize, 0, 3, 25, 1], 3, 1),
            (vec![100], 4, 1),
            (vec![5, 5], 4, 1),
            (vec![2000, 10], 4, 1024),
            (vec![0, 0], 2, 1),
            (vec![7], 1, 1),
        ] {
            let mut from = 0;
            let slices: Vec<ChangeBatch> = sizes
                .iter()
                .map(|&n| {
                    let b = batch(from, n);
                    from += n as i64;
                    b
                })
                .collect();
            let total: usize = sizes.iter().sum();
            let tasks = balance(slices, p, min_rows);
            if total == 0 {
                assert!(tasks.is_empty());
                continue;
            }
            let want = p.min(total / min_rows).max(1);
            assert_eq!(tasks.len(), want, "{sizes:?} p {p}");
            let lens: Vec<usize> = tasks
                .iter()
                .map(|t| t.iter().map(ChangeBatch::num_rows).sum())
                .collect();
            let (lo, hi) = (lens.iter().min().unwrap(), lens.iter().max().unwrap());
            assert!(hi - lo <= 1, "{sizes:?} p {p}: {lens:?}");
            let values: Vec<i64> = tasks
                .iter()
                .flatten()
                .flat_map(|b| {
                    let a = b.data.column(0).as_primitive::<Int64Type>();
                    (0..a.len()).map(|i| a.value(i)).collect::<Vec<_>>()
                })
                .collect();
            assert_eq!(values, (0..total as i64).collect::<Vec<_>>(), "{sizes:?}");
        }
    }

    #[test]
    fn even_slices_cover_the_batch() {
        for (n, p) in [(0, 4), (100, 4), (5000, 4), (4096, 4), (1 << 20, 16)] {
            let parts = even_slices(n, p);
            assert!(parts.len() <= p.max(1));
            let mut at = 0;
            for (off, len) in parts {
                assert_eq!(off, at);
                at += len;
            }
            assert_eq!(at, n);
        }
    }
    /// Each worker's part holds exactly the rows whose key group it owns, in input order, with
    /// their hashes (one gather per worker).
    #[test]
    fn parts_hold_each_workers_rows_in_order() {
        let kg = KeyGroups::new(128, 3).unwrap();
        let n = 1000;
        let hashes: Vec<u64> = (0..n as u64)
            .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
            .collect();
        let b = batch(0, n);
        let parts = route_snapshot(&b.data, &hashes, &kg).unwrap();
        assert_eq!(parts.len(), 3);
        for (w, (part, part_hashes)) in parts.iter().enumerate() {
            let want: Vec<i64> = (0..n)
                .filter(|&r| kg.worker_of_hash(hashes[r]) == w)
                .map(|r| r as i64)
                .collect();
            let got: Vec<i64> = part.column(0).as_primitive::<Int64Type>().values().to_vec();
            assert_eq!(got, want, "worker {w}");
            let want_hashes: Vec<u64> = want.iter().map(|&r| hashes[r as usize]).collect();
            assert_eq!(part_hashes, &want_hashes, "worker {w}");
        }
    }
}
