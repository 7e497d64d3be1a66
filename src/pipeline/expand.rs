//! Flink's `Expand`: every row once per group set of a split-distinct aggregate.

use std::collections::BTreeSet;
use std::sync::{Arc, RwLock};

use arrow::array::{ArrayRef, RecordBatch, RecordBatchOptions};
use arrow::datatypes::SchemaRef;

use super::{Stage, schema_of};
use crate::changelog::ChangeBatch;
use crate::error::{Error, Result};
use crate::runtime::Runtime;

/// Flink's `Expand` for split-distinct aggregation over several bucketed argument sets: every
/// input row is emitted once per group set, with the bucket columns outside that set NULL and a
/// last `$e` (Int64) column holding the set's id. Row kinds pass through. Nothing is copied: a
/// set's batch shares the input's columns, and its NULL buckets and `$e` are slices of arrays
/// made once (grown when a longer batch comes).
#[derive(Debug)]
pub struct ExpandStage {
    /// Per group set: the columns it sets to NULL, and its id.
    sets: Vec<(Vec<usize>, i64)>,
    output: SchemaRef,
    /// Per column, a NULL array, and per set, its `$e` array, of `.0` rows.
    constants: RwLock<(usize, Vec<Option<ArrayRef>>, Vec<ArrayRef>)>,
}

impl ExpandStage {
    /// An expand producing batches of `output` (the input's fields, then `$e`) for `sets`.
    pub fn new(sets: Vec<(Vec<usize>, i64)>, output: SchemaRef) -> Self {
        Self {
            sets,
            output,
            constants: RwLock::new((0, vec![], vec![])),
        }
    }

    /// The NULL arrays (by column) and `$e` arrays (by set) of at least `n` rows.
    fn constants(&self, n: usize) -> (Vec<Option<ArrayRef>>, Vec<ArrayRef>) {
        {
            let c = self.constants.read().unwrap_or_else(|e| e.into_inner());
            if c.0 >= n {
                return (c.1.clone(), c.2.clone());
            }
        }
        let len = n.next_power_of_two();
        let fields = self.output.fields();
        let mut nulls: Vec<Option<ArrayRef>> = vec![None; fields.len()];
        for (set, _) in &self.sets {
            for &c in set {
                nulls[c] = Some(arrow::array::new_null_array(fields[c].data_type(), len));
            }
        }
        let ids: Vec<ArrayRef> = self
            .sets
            .iter()
            .map(|(_, id)| Arc::new(arrow::array::Int64Array::from(vec![*id; len])) as ArrayRef)
            .collect();
        let mut c = self.constants.write().unwrap_or_else(|e| e.into_inner());
        *c = (len, nulls.clone(), ids.clone());
        (nulls, ids)
    }

    fn expand(&self, batch: &ChangeBatch) -> Result<Vec<ChangeBatch>> {
        let n = batch.num_rows();
        let (null_arrays, ids) = self.constants(n);
        self.sets
            .iter()
            .zip(&ids)
            .map(|((nulls, _), id)| {
                let mut cols: Vec<ArrayRef> = batch.data.columns().to_vec();
                for &c in nulls {
                    let null = null_arrays[c].as_ref().ok_or_else(|| {
                        Error::internal("Expand: no NULL array for a set's column")
                    })?;
                    cols[c] = null.slice(0, n);
                }
                cols.push(id.slice(0, n));
                Ok(ChangeBatch {
                    op: batch.op.clone(),
                    data: RecordBatch::try_new_with_options(
                        schema_of(&self.output, &cols),
                        cols,
                        &RecordBatchOptions::new().with_row_count(Some(n)),
                    )?,
                })
            })
            .collect()
    }
}

impl Stage for ExpandStage {
    fn push(&mut self, slices: Vec<ChangeBatch>, runtime: &Runtime) -> Result<Vec<ChangeBatch>> {
        let this = &*self;
        let mut out = Vec::with_capacity(slices.len() * self.sets.len());
        for r in runtime.map(slices, |s| this.expand(&s)) {
            out.extend(r?);
        }
        Ok(out)
    }

    fn finish(&mut self, _runtime: &Runtime) -> Result<Vec<ChangeBatch>> {
        Ok(vec![])
    }

    fn per_batch(&self) -> bool {
        true
    }

    fn map_batch(&self, batch: ChangeBatch) -> Result<Vec<ChangeBatch>> {
        self.expand(&batch)
    }

    /// Its input's columns pass on by position, those a set nulls excepted (a set's batch
    /// would carry its NULLs as plain strings, another's the dictionary).
    fn dictionary_inputs(&self, outputs: &BTreeSet<usize>) -> BTreeSet<usize> {
        let width = self.output.fields().len() - 1;
        outputs
            .iter()
            .copied()
            .filter(|&c| c < width && !self.sets.iter().any(|(nulls, _)| nulls.contains(&c)))
            .collect()
    }

    /// Its input's columns pass on by position (the last, `$e`, is its own).
    fn leave_unread(&mut self, unread: &BTreeSet<usize>) -> Option<BTreeSet<usize>> {
        let width = self.output.fields().len() - 1;
        Some(unread.iter().copied().filter(|&c| c < width).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Array, AsArray, Int32Array};
    use arrow::datatypes::{DataType, Field, Int32Type, Int64Type, Schema};

    /// An Expand's output schema over `input`: its fields, then `$e`.
    fn with_set_id(input: &Schema) -> SchemaRef {
        let mut fields = input.fields().to_vec();
        fields.push(Arc::new(Field::new(
            crate::plan::SET_ID_COLUMN,
            DataType::Int64,
            false,
        )));
        Arc::new(Schema::new(fields))
    }

    /// Batches of growing and shrinking lengths: every set's rows carry the input's values, NULL
    /// in its nulled columns, and its id in `$e`.
    #[test]
    fn sets_share_the_input_and_slice_their_constants() {
        let input = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int32, true),
            Field::new("$f1", DataType::Int32, true),
            Field::new("$f2", DataType::Int32, true),
        ]));
        let stage = ExpandStage::new(
            vec![(vec![2], 1), (vec![1], 2), (vec![1, 2], 3)],
            with_set_id(&input),
        );
        for n in [3usize, 10, 2, 70] {
            let col = |m: i32| {
                Arc::new(Int32Array::from_iter_values((0..n as i32).map(|i| i * m))) as ArrayRef
            };
            let batch = ChangeBatch {
                op: None,
                data: RecordBatch::try_new(Arc::clone(&input), vec![col(1), col(2), col(3)])
                    .unwrap(),
            };
            let out = stage.map_batch(batch).unwrap();
            assert_eq!(out.len(), 3);
            for (b, (nulls, id)) in out
                .iter()
                .zip([(vec![2], 1i64), (vec![1], 2), (vec![1, 2], 3)])
            {
                assert_eq!(b.num_rows(), n);
                for c in 0..3 {
                    let a = b.data.column(c);
                    assert_eq!(a.len(), n);
                    if nulls.contains(&c) {
                        assert_eq!(a.null_count(), n, "{n} rows, set {id}, column {c}");
                    } else {
                        let v = a.as_primitive::<Int32Type>();
                        assert!((0..n).all(|i| v.value(i) == i as i32 * (c as i32 + 1)));
                    }
                }
                let e = b.data.column(3).as_primitive::<Int64Type>();
                assert!(e.iter().all(|v| v == Some(id)), "{n} rows, set {id}");
            }
        }
    }

    /// A dictionary passes through the sets that do not null its column (their batches carry
    /// its type), and only such columns may come as dictionaries.
    #[test]
    fn dictionaries_pass_where_no_set_nulls_them() {
        let dict = DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8));
        let input = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Utf8, true),
            Field::new("b", DataType::Utf8, true),
        ]));
        let stage = ExpandStage::new(vec![(vec![], 0), (vec![1], 1)], with_set_id(&input));
        assert_eq!(
            stage.dictionary_inputs(&BTreeSet::from([0, 1, 2])),
            BTreeSet::from([0])
        );
        let k: ArrayRef = Arc::new(arrow::array::DictionaryArray::<Int32Type>::from_iter([
            Some("x"),
            None,
            Some("x"),
        ]));
        let b: ArrayRef = Arc::new(arrow::array::StringArray::from(vec!["p", "q", "r"]));
        let in_schema = Arc::new(Schema::new(vec![
            Field::new("k", dict.clone(), true),
            Field::new("b", DataType::Utf8, true),
        ]));
        let out = stage
            .map_batch(ChangeBatch::inserts(
                RecordBatch::try_new(in_schema, vec![k, b]).unwrap(),
            ))
            .unwrap();
        assert_eq!(out.len(), 2);
        for set in &out {
            assert_eq!(set.data.schema().field(0).data_type(), &dict);
            assert_eq!(set.data.column(0).data_type(), &dict);
            assert_eq!(set.data.schema().field(1).data_type(), &DataType::Utf8);
        }
        assert_eq!(out[1].data.column(1).null_count(), 3);
    }
}
