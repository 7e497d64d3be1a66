//! A split PARTIAL's bucket key columns computed from its DISTINCT arguments, for rows whose
//! bucket columns a run left unread.
//!
//! The Calc before a split's Expand computes each bucketed argument's bucket
//! (`MOD(HASH_CODE(x), buckets)`, [`tally_kernels::hash::bucket_array`]) for every row. A local
//! phase that folds a key's rows whatever their buckets and routes each DISTINCT entry by its
//! value's bucket when it flushes reads none of them: a run then leaves them unread (NULL), and
//! only rows that go around the local phase (bypassed by the adaptive local phase), which the
//! exchange routes by every key, need them. [`BucketFill`] computes them there, from the
//! argument of a DISTINCT call of each bucket column's group set, which the split rewrite
//! buckets ([`crate::plan::BucketKeys::call_sets`]). Where only some keys are hot
//! ([`HotKeys`]), a cold key's rows keep their bucket columns NULL: they go to the worker of
//! the key alone, as the flush sends that key's entries.

use std::sync::Arc;

use arrow::array::ArrayRef;
use tally_kernels::hash::bucket_array;

use super::fold::SetFilters;
use super::{AggregatePlan, CalcBatch, HotKeys, fold};
use crate::error::{Error, Result};

/// How to compute a split PARTIAL's bucket key columns (see the module docs).
#[derive(Debug, Clone)]
pub(crate) struct BucketFill {
    /// The query's keys, before the bucket columns.
    query_keys: usize,
    buckets: u32,
    /// Per bucket column: the argument it buckets (an index into the Calc's arguments) and
    /// the FILTER of a call of its set (which tests the set's id), if the call has one; None
    /// for a set of MIN/MAX calls alone, whose rows go with the keys alone (the column NULL).
    columns: Vec<Option<(usize, Option<usize>)>>,
    /// The keys spread by bucket (None: all); a cold key's bucket columns stay NULL.
    hot: Option<Arc<HotKeys>>,
}

impl BucketFill {
    /// The bucket columns of `plan` (a split PARTIAL whose bucketed sets' calls are DISTINCT
    /// calls over the bucketed argument: [`crate::plan::BucketKeys::call_sets`]), or None where
    /// they are not computed from such calls' arguments.
    pub(crate) fn try_new(plan: &AggregatePlan) -> Option<Self> {
        let b = plan.bucket_keys.as_ref()?;
        let sets = b.call_sets.as_ref()?;
        let query_keys = plan.calc.keys.len().checked_sub(b.columns)?;
        let columns = (0..b.columns)
            .map(|j| match sets.iter().position(|s| *s == Some(j)) {
                Some(c) => {
                    let call = plan.calls.get(c)?;
                    Some(Some((call.arg?, call.filter)))
                }
                None => Some(None),
            })
            .collect::<Option<Vec<_>>>()?;
        Some(Self {
            query_keys,
            buckets: b.buckets,
            columns,
            hot: b.hot.clone(),
        })
    }

    /// Sets the bucket columns of `cb` (evaluated from a batch whose bucket columns were left
    /// unread, and whose group set, found by [`crate::plan::Calc::set_of`], is `set`): on
    /// an Expand's set batch the column of its set, whose calls' FILTERs are not FALSE
    /// throughout there, the others staying NULL (all of them on the set of the keys alone);
    /// on a batch of no Expand (one bucket column, every row of its set) that column.
    ///
    /// Returns the hashes of the query keys where cold keys were looked for
    /// ([`HotKeys::leave_cold`]).
    ///
    /// # Errors
    /// A batch of several bucket columns without a set id (a bug); a failing bucket.
    pub(crate) fn fill(
        &self,
        set: Option<&SetFilters>,
        cb: &mut CalcBatch,
    ) -> Result<Option<Vec<u64>>> {
        let Some(set) = set else {
            return self.fill_all(cb);
        };
        for (j, &column) in self.columns.iter().enumerate() {
            let Some((arg, filter)) = column else {
                continue;
            };
            let of_set =
                filter.is_none_or(|f| fold::constant_filter(&set.filters[f]) != Some(false));
            if of_set {
                cb.keys[self.query_keys + j] = self.bucket(&cb.args[arg])?;
            }
        }
        self.leave_cold_keys(cb)
    }

    /// Sets the one bucket column of `cb`, rows of no Expand (every row of its set); returns
    /// as [`BucketFill::fill`].
    ///
    /// # Errors
    /// Several bucket columns (an Expand's rows, whose set is unknown here: a bug); a failing
    /// bucket.
    pub(crate) fn fill_all(&self, cb: &mut CalcBatch) -> Result<Option<Vec<u64>>> {
        match self.columns[..] {
            [Some((arg, _))] => cb.keys[self.query_keys] = self.bucket(&cb.args[arg])?,
            // MIN/MAX calls alone: their rows go with the keys alone.
            [None] => {}
            _ => {
                return Err(Error::internal(
                    "bucket columns computed for rows of no group set",
                ));
            }
        }
        self.leave_cold_keys(cb)
    }

    /// Sets the bucket columns of the rows of cold keys ([`HotKeys`]) back to NULL, so that
    /// they go with the key alone; the query keys' hashes where it computed them.
    fn leave_cold_keys(&self, cb: &mut CalcBatch) -> Result<Option<Vec<u64>>> {
        match &self.hot {
            Some(hot) => hot.leave_cold(self.query_keys, cb),
            None => Ok(None),
        }
    }

    fn bucket(&self, values: &ArrayRef) -> Result<ArrayRef> {
        Ok(Arc::new(bucket_array(values, self.buckets).map_err(
            |e| Error::internal(format!("bucket column: {e}")),
        )?))
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::{Array, AsArray, BooleanArray, Int32Array, Int64Array};
    use arrow::datatypes::Int32Type;
    use datafusion_expr::{ExprFunctionExt, col};

    use super::*;
    use crate::changelog::ChangeBatch;
    use crate::plan::{BucketKeys, split_fixture};

    /// Each set batch of an Expand gets its own set's bucket column, computed from the
    /// argument as the Calc before the Expand computes it, the other columns staying NULL; the
    /// set of the keys alone gets none; rows of no Expand get the one column, and a plan of
    /// several columns refuses to guess.
    #[test]
    fn bucket_columns_are_computed_for_their_own_set() {
        let schema = split_fixture::schema();
        let plan = split_fixture::plan(16, true);
        let fill = BucketFill::try_new(&plan).unwrap();
        let rows = 50usize;
        let u: ArrayRef = Arc::new(Int64Array::from_iter(
            (0..rows as i64).map(|i| (i % 7 != 0).then_some(i * 37)),
        ));
        let v: ArrayRef = Arc::new(Int64Array::from_iter_values(
            (0..rows as i64).map(|i| i * 11),
        ));
        let k: ArrayRef = Arc::new(Int64Array::from_iter_values(
            (0..rows as i64).map(|i| i % 3),
        ));
        let f: ArrayRef = Arc::new(BooleanArray::from(vec![true; rows]));
        let none: ArrayRef = Arc::new(Int32Array::new_null(rows));
        let set = |id: i64| {
            ChangeBatch::inserts(split_fixture::set_batch([&k, &u, &v, &f, &none, &none], id))
        };
        let filled = |id: i64| {
            let batch = set(id);
            let mut cb = plan.calc.evaluate(&batch).unwrap();
            let set = plan.calc.set_of(&batch.data).unwrap();
            assert_eq!(set.as_ref().map(|s| s.id), Some(id));
            fill.fill(set.as_deref(), &mut cb).unwrap();
            cb
        };
        let bucketed = |a: &ArrayRef| Arc::new(bucket_array(a, 16).unwrap()) as ArrayRef;
        let u_set = filled(2);
        assert_eq!(&u_set.keys[1], &bucketed(&u));
        assert_eq!(u_set.keys[1].null_count(), u.null_count());
        assert_eq!(u_set.keys[2].null_count(), rows);
        let v_set = filled(1);
        assert_eq!(v_set.keys[1].null_count(), rows);
        assert_eq!(&v_set.keys[2], &bucketed(&v));
        let keys_alone = filled(3);
        assert_eq!(keys_alone.keys[1].null_count(), rows);
        assert_eq!(keys_alone.keys[2].null_count(), rows);
        // Only key 1 hot: the other keys' rows keep NULL buckets (they go with the key alone).
        let mut one_hot = split_fixture::plan(16, true);
        let key_one: ArrayRef = Arc::new(Int64Array::from(vec![1]));
        let mut h = vec![];
        tally_kernels::hash::hash_columns(&[key_one], &mut h).unwrap();
        one_hot.bucket_keys.as_mut().unwrap().hot = Some(Arc::new(HotKeys::from_hashes(h)));
        let fill_hot = BucketFill::try_new(&one_hot).unwrap();
        let batch = set(2);
        let mut cb = one_hot.calc.evaluate(&batch).unwrap();
        let of = one_hot.calc.set_of(&batch.data).unwrap();
        fill_hot.fill(of.as_deref(), &mut cb).unwrap();
        let all = bucketed(&u);
        for r in 0..rows {
            let want =
                (r % 3 == 1 && all.is_valid(r)).then(|| all.as_primitive::<Int32Type>().value(r));
            let got = cb.keys[1]
                .is_valid(r)
                .then(|| cb.keys[1].as_primitive::<Int32Type>().value(r));
            assert_eq!(got, want, "row {r}");
        }
        // A set whose calls are MIN/MAX alone goes with the keys alone (`call_sets` None for
        // them): its column stays NULL, the other set's is computed as before.
        let mut extremes = split_fixture::plan(16, true);
        extremes.bucket_keys.as_mut().unwrap().call_sets = Some(vec![None, Some(0), Some(0), None]);
        let fill_extremes = BucketFill::try_new(&extremes).unwrap();
        for (id, column, want) in [(1, 2, None), (2, 1, Some(bucketed(&u)))] {
            let batch = set(id);
            let mut cb = extremes.calc.evaluate(&batch).unwrap();
            let set = extremes.calc.set_of(&batch.data).unwrap();
            fill_extremes.fill(set.as_deref(), &mut cb).unwrap();
            match want {
                Some(w) => assert_eq!(&cb.keys[column], &w),
                None => assert_eq!(cb.keys[column].null_count(), rows),
            }
        }
        // Rows of no Expand: with two bucket columns, whose is unknown.
        let mut cb = plan.calc.evaluate(&set(2)).unwrap();
        assert!(fill.fill_all(&mut cb).is_err());
        // One bucket column (no Expand): every row gets it.
        let mut one = AggregatePlan::try_new(
            Arc::clone(&schema),
            &[col("k"), col("v"), col("$f4")],
            &[crate::aggregates::count(col("u"))
                .distinct()
                .filter(col("f"))
                .build()
                .unwrap()],
            None,
        )
        .unwrap();
        one.bucket_keys = Some(BucketKeys {
            columns: 1,
            buckets: 16,
            call_sets: Some(vec![Some(0)]),
            hot: None,
        });
        let fill = BucketFill::try_new(&one).unwrap();
        let mut cb = one.calc.evaluate(&set(0)).unwrap();
        fill.fill_all(&mut cb).unwrap();
        assert_eq!(&cb.keys[2], &bucketed(&u));
        // A plan whose bucketed calls are not all DISTINCT over their argument has none.
        one.bucket_keys = Some(BucketKeys {
            columns: 1,
            buckets: 16,
            call_sets: None,
            hot: None,
        });
        assert!(BucketFill::try_new(&one).is_none());
    }
}
