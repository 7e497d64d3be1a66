//! A split-distinct FINAL read through: where every FINAL key has exactly one PARTIAL row, the
//! FINAL's results are that row's.
//!
//! On one worker whose state merges the buckets ([`crate::operator::ParallelAggregate`] on the
//! pipelined runtime), in a run without checkpoints (whose FINAL keeps every key's state for
//! its checkpoints), the PARTIAL holds one group per query key: all of
//! the key's DISTINCT pairs, counts and MIN/MAX values. The FINAL's calls (`$SUM0` of a count,
//! `SUM`, `MIN`, `MAX` of a PARTIAL result) over that one row give the row's values, and its
//! record count is 1 while the PARTIAL row lives. So the FINAL's changelog is the PARTIAL's,
//! projected onto the FINAL's columns, less the updates whose projected rows did not change (the
//! FINAL emits no update that changes nothing), cut at the PARTIAL's firings instead of the
//! FINAL's own. [`through_columns`] says whether a FINAL is such a function of its one row, and
//! [`ReadThrough`] projects each firing; the FINAL then keeps no state of its own.
//!
//! On several such workers where only hot keys are spread ([`crate::plan::HotKeys`]), a cold
//! key's rows, entries and accumulators all go to the worker of the key alone: it too has
//! exactly one PARTIAL row, on that worker. [`ColdThrough`] cuts each firing into its cold
//! keys' rows, read through, and its hot keys' rows, which the FINAL folds and merges; the
//! FINAL keeps state for the hot keys alone.

use std::sync::Arc;

use arrow::array::{ArrayRef, AsArray, BooleanArray, RecordBatch, UInt32Array};
use arrow::buffer::BooleanBuffer;
use arrow::compute::{filter, filter_record_batch, take};
use arrow::datatypes::{Int8Type, SchemaRef};
use datafusion_physical_expr::expressions::Column;
use tally_kernels::aggregates::AggregateKind;

use crate::changelog::{ChangeBatch, RowKind};
use crate::error::{Error, Result};
use crate::operator::keyed::KeyHashes;
use crate::operator::mini_batch::changed_rows;
use crate::plan::{AggregatePlan, HotKeys};

/// How a FINAL reads its one PARTIAL row: for each FINAL output column, the PARTIAL output column
/// it equals, and whether an update of the PARTIAL can leave them all unchanged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThroughColumns {
    /// Per FINAL output column (keys, then calls), the PARTIAL output column.
    pub columns: Vec<usize>,
    /// The FINAL's keys (the first of `columns`).
    pub keys: usize,
    /// Whether some PARTIAL result is read by no FINAL call: a PARTIAL update that changed only
    /// such results leaves the FINAL's row as it was (and so is dropped).
    pub unread: bool,
}

/// For each output column of the FINAL aggregate `fin`, the output column of the PARTIAL
/// aggregate `partial` it equals when the key has exactly one PARTIAL row; `None` unless every
/// FINAL key is one of the PARTIAL's query keys and every FINAL call, without DISTINCT or
/// FILTER, is `SUM`, `MIN` or `MAX` of a PARTIAL result (the value itself over one row, NULL
/// included) or `$SUM0` of a PARTIAL count (never NULL), of the same type.
pub fn through_columns(partial: &AggregatePlan, fin: &AggregatePlan) -> Option<ThroughColumns> {
    let keys = partial.key_types.len();
    let query_keys = keys - partial.bucket_keys.as_ref().map_or(0, |b| b.columns);
    if fin.input_schema.fields() != partial.output_schema.fields() {
        return None;
    }
    let column = |e: &Arc<dyn datafusion_physical_expr::PhysicalExpr>| {
        e.downcast_ref::<Column>().map(Column::index)
    };
    let mut columns = Vec::with_capacity(fin.output_schema.fields().len());
    for k in &fin.calc.keys {
        columns.push(column(k).filter(|&c| c < query_keys)?);
    }
    for call in &fin.calls {
        if call.distinct || call.filter.is_some() {
            return None;
        }
        let c = column(&fin.calc.args[call.arg?]).filter(|&c| c >= keys)?;
        let read = partial.calls.get(c - keys)?;
        let same = match call.kind {
            AggregateKind::Sum | AggregateKind::Min | AggregateKind::Max => true,
            AggregateKind::Sum0 => matches!(
                read.kind,
                AggregateKind::Count | AggregateKind::CountStar | AggregateKind::Sum0
            ),
            _ => false,
        };
        if !same {
            return None;
        }
        columns.push(c);
    }
    let types_match = columns
        .iter()
        .zip(fin.output_schema.fields())
        .all(|(&c, f)| partial.output_schema.field(c).data_type() == f.data_type());
    let unread =
        (keys..keys + partial.calls.len()).any(|c| !columns[fin.calc.keys.len()..].contains(&c));
    types_match.then_some(ThroughColumns {
        keys: fin.calc.keys.len(),
        columns,
        unread,
    })
}

/// The projection of a PARTIAL's firings onto its FINAL's output ([`through_columns`]).
#[derive(Debug, Clone)]
pub struct ReadThrough {
    columns: ThroughColumns,
    output: SchemaRef,
    emit_update_before: bool,
}

impl ReadThrough {
    /// Reads `columns` of each firing ([`through_columns`]) as rows of `output`, with or
    /// without the `-U` rows.
    pub fn new(columns: ThroughColumns, output: SchemaRef, emit_update_before: bool) -> Self {
        Self {
            columns,
            output,
            emit_update_before,
        }
    }

    /// The FINAL's output schema.
    pub fn output(&self) -> &SchemaRef {
        &self.output
    }

    /// One firing of the PARTIAL (its changelog: `+I`, `-U` then `+U` of a key, `-D`) as the
    /// FINAL's changes; `None` when none is left.
    ///
    /// # Errors
    /// A firing whose row kinds are not codes, or whose columns do not fit the output.
    pub fn read(&self, firing: &ChangeBatch) -> Result<Option<ChangeBatch>> {
        Ok(self.read_rows(firing, None)?.map(|(changes, _)| changes))
    }

    /// [`ReadThrough::read`] of the rows of `firing` that `rows` selects (all where `None`):
    /// the FINAL's changes, and which of the selected rows they are (all where `None`). Only
    /// the columns the FINAL reads are cut.
    fn read_rows(
        &self,
        firing: &ChangeBatch,
        rows: Option<&BooleanArray>,
    ) -> Result<Option<(ChangeBatch, Option<BooleanArray>)>> {
        let mut columns: Vec<ArrayRef> = self
            .columns
            .columns
            .iter()
            .map(|&c| Arc::clone(firing.data.column(c)))
            .collect();
        let mut op = firing.op.clone();
        if let Some(rows) = rows {
            for column in &mut columns {
                *column = filter(column, rows)?;
            }
            op = op.map(|o| filter(&o, rows)).transpose()?;
        }
        if columns.first().is_none_or(|c| c.is_empty()) {
            return Ok(None);
        }
        let keep = match &op {
            None => None,
            Some(op) => self.kept(op, &columns)?,
        };
        let data = RecordBatch::try_new(Arc::clone(&self.output), columns)
            .map_err(|e| Error::internal(format!("a FINAL read through: {e}")))?;
        let changes = ChangeBatch { op, data };
        Ok(match keep {
            None => Some((changes, None)),
            Some(keep) => kept_rows(&changes, &keep)?.map(|c| (c, Some(keep))),
        })
    }

    /// Whether the FINAL's keys are the PARTIAL's first `query_keys` columns, in order: then
    /// the hashes of those columns of a firing are the hashes of the FINAL's keys.
    fn keys_are_query_keys(&self, query_keys: usize) -> bool {
        self.columns.keys == query_keys
            && (0..query_keys).eq(self.columns.columns[..query_keys].iter().copied())
    }

    /// The rows to keep (`None`: all): not the `-U`/`+U` pairs whose projected rows are equal,
    /// nor any `-U` without update-before. A pair is one key's (its key columns equal), and
    /// the PARTIAL emits a pair only where a result changed: only the results are compared,
    /// and only where some are not read.
    fn kept(&self, op: &ArrayRef, columns: &[ArrayRef]) -> Result<Option<BooleanArray>> {
        if !self.columns.unread && self.emit_update_before {
            return Ok(None);
        }
        let codes = op
            .as_primitive_opt::<Int8Type>()
            .ok_or_else(|| Error::internal("row kinds that are not Int8 codes"))?
            .values();
        let before = RowKind::UpdateBefore.code();
        let after = RowKind::UpdateAfter.code();
        let (mut olds, mut news) = (vec![], vec![]);
        for i in 0..codes.len().saturating_sub(1) {
            if codes[i] == before && codes[i + 1] == after {
                olds.push(i as u32);
                news.push(i as u32 + 1);
            }
        }
        if olds.is_empty() {
            return Ok(None);
        }
        let (olds, news) = (UInt32Array::from(olds), UInt32Array::from(news));
        let changed = if self.columns.unread {
            let results = &columns[self.columns.keys..];
            let pick = |at: &UInt32Array| {
                results
                    .iter()
                    .map(|c| take(c, at, None))
                    .collect::<std::result::Result<Vec<_>, _>>()
            };
            changed_rows(&pick(&olds)?, &pick(&news)?)?
        } else {
            BooleanBuffer::new_set(olds.len())
        };
        let mut keep = vec![true; codes.len()];
        for (p, (&o, &n)) in olds.values().iter().zip(news.values()).enumerate() {
            let kept = changed.value(p);
            keep[o as usize] = kept && self.emit_update_before;
            keep[n as usize] = kept;
        }
        Ok(Some(BooleanArray::from(keep)))
    }
}

/// The rows of `batch` that `keep` selects (row kinds with them); `None` where none are.
fn kept_rows(batch: &ChangeBatch, keep: &BooleanArray) -> Result<Option<ChangeBatch>> {
    let op = batch.op.as_ref().map(|o| filter(o, keep)).transpose()?;
    let data = filter_record_batch(&batch.data, keep)?;
    Ok((data.num_rows() > 0).then_some(ChangeBatch { op, data }))
}

/// A FINAL that reads its cold keys through ([`ReadThrough`]) and folds its hot keys' rows: see
/// the module docs.
#[derive(Debug, Clone)]
pub struct ColdThrough {
    through: ReadThrough,
    hot: Arc<HotKeys>,
    /// The PARTIAL's query keys: the first columns of its output, which the hot keys' hashes
    /// are over, and the FINAL's keys.
    query_keys: usize,
}

/// A firing's cold keys' rows read through.
#[derive(Debug)]
pub struct ColdChanges {
    /// The FINAL's changes.
    pub changes: ChangeBatch,
    /// Each row's key hash, as [`tally_kernels::hash::hash_columns`] gives it over the FINAL's
    /// key columns.
    pub hashes: Vec<u64>,
}

/// One firing of the PARTIAL cut by [`ColdThrough::split`].
#[derive(Debug, Default)]
pub struct SplitFiring {
    /// The cold keys' rows, read through.
    pub through: Option<ColdChanges>,
    /// The hot keys' rows, as the PARTIAL fired them.
    pub hot: Option<ChangeBatch>,
}

impl ColdThrough {
    /// Reads through the keys of a PARTIAL of `query_keys` query keys that `hot` does not name;
    /// `None` unless the FINAL's keys are those query keys, in order (split-distinct's FINAL
    /// groups by the query's keys), and there is one at least (the one key of an aggregate
    /// without keys is hot: `HotKeys::is_hot`).
    pub fn try_new(through: ReadThrough, hot: Arc<HotKeys>, query_keys: usize) -> Option<Self> {
        (query_keys > 0 && through.keys_are_query_keys(query_keys)).then_some(Self {
            through,
            hot,
            query_keys,
        })
    }

    /// The FINAL's output schema (that of the rows read through).
    pub fn output(&self) -> &SchemaRef {
        self.through.output()
    }

    /// Cuts one firing of the PARTIAL (its changelog) by its keys, hashing each row's key once:
    /// the cold keys' rows read through, with their hashes, the hot keys' rows as they are. A
    /// key's `-U`/`+U` pair stays together (both rows hold the key).
    ///
    /// # Errors
    /// Key columns that cannot be hashed (a bug: the plan checked them), and as
    /// [`ReadThrough::read`].
    pub fn split(&self, firing: &ChangeBatch) -> Result<SplitFiring> {
        self.split_hashed(firing, None)
    }

    /// [`ColdThrough::split`], taking each row's key hash from `known` where it holds the
    /// hashes of the firing's query keys (as the PARTIAL's worker hashed them when it interned
    /// the keys) instead of hashing the keys again.
    ///
    /// # Errors
    /// As [`ColdThrough::split`].
    pub fn split_hashed(
        &self,
        firing: &ChangeBatch,
        known: Option<KeyHashes>,
    ) -> Result<SplitFiring> {
        let n = firing.num_rows();
        if n == 0 {
            return Ok(SplitFiring::default());
        }
        let hashes = match known {
            Some(k) if k.keys == self.query_keys && k.hashes.len() == n => k.hashes,
            _ => {
                let mut hashes = Vec::with_capacity(n);
                tally_kernels::hash::hash_columns(
                    &firing.data.columns()[..self.query_keys],
                    &mut hashes,
                )
                .map_err(|e| Error::internal(format!("key hashes: {e}")))?;
                hashes
            }
        };
        let hot = BooleanBuffer::collect_bool(n, |r| self.hot.is_hot(Some(hashes[r])));
        let hot_rows = hot.count_set_bits();
        if hot_rows == n {
            return Ok(SplitFiring {
                through: None,
                hot: Some(firing.clone()),
            });
        }
        let cold = (hot_rows > 0).then(|| BooleanArray::new(!&hot, None));
        let through = self
            .through
            .read_rows(firing, cold.as_ref())?
            .map(|(changes, kept)| {
                // The hashes of the rows read through: of the cold rows, of those kept.
                let mut hashes = match &cold {
                    Some(cold) => selected(&hashes, cold),
                    None => hashes,
                };
                if let Some(kept) = &kept {
                    hashes = selected(&hashes, kept);
                }
                ColdChanges { changes, hashes }
            });
        let hot = match hot_rows {
            0 => None,
            _ => kept_rows(firing, &BooleanArray::new(hot, None))?,
        };
        Ok(SplitFiring { through, hot })
    }
}

/// The values of `values` that `mask` selects, in order.
fn selected(values: &[u64], mask: &BooleanArray) -> Vec<u64> {
    mask.values().set_indices().map(|i| values[i]).collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use arrow::array::{Int8Array, Int64Array, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};

    fn firing(kinds: &[RowKind], keys: &[&str], counts: &[i64], other: &[i64]) -> ChangeBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Utf8, true),
            Field::new("other", DataType::Int64, false),
            Field::new("n", DataType::Int64, false),
        ]));
        let data = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(StringArray::from(keys.to_vec())),
                Arc::new(Int64Array::from(other.to_vec())),
                Arc::new(Int64Array::from(counts.to_vec())),
            ],
        )
        .unwrap();
        let codes: Vec<i8> = kinds.iter().map(|k| k.code()).collect();
        ChangeBatch::try_new(Some(Arc::new(Int8Array::from(codes))), data).unwrap()
    }

    /// The FINAL's output in these tests: a string key and an Int64 result.
    pub(crate) fn output() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("k", DataType::Utf8, true),
            Field::new("n", DataType::Int64, false),
        ]))
    }

    /// The rows of `b` (of [`output`]'s columns) as `+I[key, n]`.
    pub(crate) fn rows(b: &ChangeBatch) -> Vec<String> {
        let kinds = b.row_kinds().unwrap();
        let k = b.data.column(0).as_string::<i32>();
        let n = b
            .data
            .column(1)
            .as_primitive::<arrow::datatypes::Int64Type>();
        (0..b.num_rows())
            .map(|i| format!("{}[{}, {}]", kinds[i].short(), k.value(i), n.value(i)))
            .collect()
    }

    /// The projection keeps inserts, deletes and updates that change the FINAL's columns, and
    /// drops the updates that only changed a column the FINAL does not read.
    #[test]
    fn updates_that_change_nothing_read_are_dropped() {
        use RowKind::*;
        let f = firing(
            &[
                Insert,
                UpdateBefore,
                UpdateAfter,
                UpdateBefore,
                UpdateAfter,
                Delete,
            ],
            &["a", "b", "b", "c", "c", "d"],
            &[1, 2, 3, 4, 4, 5],
            &[0, 1, 2, 1, 2, 0],
        );
        let columns = ThroughColumns {
            columns: vec![0, 2],
            keys: 1,
            unread: true,
        };
        let through = ReadThrough::new(columns.clone(), output(), true);
        let got = rows(&through.read(&f).unwrap().unwrap());
        assert_eq!(got, ["+I[a, 1]", "-U[b, 2]", "+U[b, 3]", "-D[d, 5]"]);
        let upsert = ReadThrough::new(columns.clone(), output(), false);
        let got = rows(&upsert.read(&f).unwrap().unwrap());
        assert_eq!(got, ["+I[a, 1]", "+U[b, 3]", "-D[d, 5]"]);
        // A firing of unchanged updates only leaves nothing.
        let same = firing(&[UpdateBefore, UpdateAfter], &["c", "c"], &[4, 4], &[1, 2]);
        assert!(through.read(&same).unwrap().is_none());
        // Where the FINAL reads every result, every update the PARTIAL emits is kept as it is.
        let all = ReadThrough::new(
            ThroughColumns {
                unread: false,
                ..columns
            },
            output(),
            true,
        );
        assert_eq!(all.read(&same).unwrap().unwrap().num_rows(), 2);
    }

    /// A firing cut by its keys: the cold keys' rows read through (their pairs kept together,
    /// an unchanged pair dropped as the projection does), the hot keys' rows as the PARTIAL
    /// fired them, with their row kinds; a firing of one kind of key is not cut.
    #[test]
    fn a_firing_is_cut_into_cold_keys_read_through_and_hot_keys_as_they_are() {
        use RowKind::*;
        let hot = Arc::new(HotKeys::from_hashes(hashes_of(&["h"])));
        let columns = ThroughColumns {
            columns: vec![0, 2],
            keys: 1,
            unread: true,
        };
        let cold = ColdThrough::try_new(ReadThrough::new(columns, output(), true), hot, 1).unwrap();
        let f = firing(
            &[
                Insert,
                UpdateBefore,
                UpdateAfter,
                UpdateBefore,
                UpdateAfter,
                UpdateBefore,
                UpdateAfter,
                Delete,
            ],
            &["a", "h", "h", "b", "b", "c", "c", "h"],
            &[1, 2, 3, 4, 5, 6, 6, 7],
            &[0, 1, 2, 1, 2, 1, 2, 0],
        );
        let cut = cold.split(&f).unwrap();
        let ColdChanges {
            changes: through,
            hashes,
        } = cut.through.unwrap();
        assert_eq!(rows(&through), ["+I[a, 1]", "-U[b, 4]", "+U[b, 5]"]);
        // Each row read through carries its key's hash, as the FINAL's key columns hash.
        let mut want = vec![];
        tally_kernels::hash::hash_columns(&through.data.columns()[..1], &mut want).unwrap();
        assert_eq!(hashes, want);
        let hot_rows = cut.hot.unwrap();
        assert_eq!(hot_rows.data.schema(), f.data.schema());
        let kinds = hot_rows.row_kinds().unwrap();
        assert_eq!(kinds, [UpdateBefore, UpdateAfter, Delete]);
        let counts = hot_rows
            .data
            .column(2)
            .as_primitive::<arrow::datatypes::Int64Type>();
        assert_eq!(counts.values().to_vec(), [2, 3, 7]);
        // All cold: read through whole; all hot: handed on whole.
        let only_cold = firing(&[Insert], &["a"], &[1], &[0]);
        let cut = cold.split(&only_cold).unwrap();
        assert!(cut.hot.is_none() && cut.through.unwrap().changes.num_rows() == 1);
        let only_hot = firing(&[Insert, Insert], &["h", "h"], &[1, 2], &[0, 0]);
        let cut = cold.split(&only_hot).unwrap();
        assert!(cut.through.is_none() && cut.hot.unwrap().num_rows() == 2);
        // Key hashes handed on with a firing decide the cut in place of its keys' own: here
        // they call every row's key the hot one's. Hashes over other keys, or of another
        // number of rows, are left unread.
        let hot_hash = KeyHashes {
            keys: 1,
            hashes: vec![hashes_of(&["h"])[0]; 3],
        };
        let f = firing(
            &[Insert, Insert, Insert],
            &["a", "b", "h"],
            &[1, 2, 3],
            &[0, 0, 0],
        );
        let cut = cold.split_hashed(&f, Some(hot_hash.clone())).unwrap();
        assert!(cut.through.is_none() && cut.hot.unwrap().num_rows() == 3);
        for unread in [
            KeyHashes {
                keys: 2,
                ..hot_hash.clone()
            },
            KeyHashes {
                keys: 1,
                hashes: hot_hash.hashes[..2].to_vec(),
            },
        ] {
            let cut = cold.split_hashed(&f, Some(unread)).unwrap();
            let through = cut.through.unwrap();
            assert_eq!(through.hashes, hashes_of(&["a", "b"]));
            assert_eq!(cut.hot.unwrap().num_rows(), 1);
        }
    }

    /// The hashes of string keys, as a firing's one key column hashes.
    fn hashes_of(keys: &[&str]) -> Vec<u64> {
        let column: ArrayRef = Arc::new(StringArray::from(keys.to_vec()));
        let mut hashes = vec![];
        tally_kernels::hash::hash_columns(&[column], &mut hashes).unwrap();
        hashes
    }
}
