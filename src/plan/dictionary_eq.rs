//! `column = 'literal'` over a dictionary-encoded column, evaluated on the dictionary's keys.
//!
//! Arrow compares a dictionary with a scalar by comparing the dictionary's values and gathering
//! the result bit by bit through the keys. Where the literal matches one value (a Parquet
//! dictionary holds each value once), the row's key either is that value's key or not: one
//! vectorized comparison of the keys with it, and no gather.

use std::sync::Arc;

use arrow::array::{Array, BooleanArray, PrimitiveArray, RecordBatch};
use arrow::compute::kernels::cmp::eq;
use arrow::datatypes::{ArrowDictionaryKeyType, ArrowNativeType, DataType};
use arrow::downcast_dictionary_array;
use datafusion_expr::Operator;
use datafusion_physical_expr::PhysicalExpr;
use datafusion_physical_expr::expressions::{BinaryExpr, Column, Literal};

use crate::error::Result;

/// `expr` on `batch` where it is `column = literal` (either way round), the column arrives as
/// a dictionary and the literal is one of at most one of its values; None otherwise (the
/// caller evaluates `expr` itself). It is TRUE exactly where the general comparison is (a row
/// whose value is NULL may be FALSE here where the general comparison is NULL: a FILTER selects
/// neither).
///
/// # Errors
/// When a comparison kernel fails.
pub(crate) fn eval_dictionary_eq(
    expr: &Arc<dyn PhysicalExpr>,
    batch: &RecordBatch,
) -> Result<Option<BooleanArray>> {
    let Some(binary) = expr.downcast_ref::<BinaryExpr>() else {
        return Ok(None);
    };
    if *binary.op() != Operator::Eq {
        return Ok(None);
    }
    let (l, r) = (binary.left(), binary.right());
    let (column, literal) = match (l.downcast_ref::<Column>(), r.downcast_ref::<Literal>()) {
        (Some(c), Some(lit)) => (c, lit),
        _ => match (r.downcast_ref::<Column>(), l.downcast_ref::<Literal>()) {
            (Some(c), Some(lit)) => (c, lit),
            _ => return Ok(None),
        },
    };
    let Some(array) = batch.columns().get(column.index()) else {
        return Ok(None);
    };
    let DataType::Dictionary(_, value_type) = array.data_type() else {
        return Ok(None);
    };
    if literal.value().is_null() || &literal.value().data_type() != value_type.as_ref() {
        return Ok(None);
    }
    let scalar = literal.value().to_scalar()?;
    let result = downcast_dictionary_array!(
        array => {
            let matched = eq(array.values(), &scalar)?;
            let mut keys = matched
                .iter()
                .enumerate()
                .filter(|(_, m)| *m == Some(true))
                .map(|(k, _)| k);
            match (keys.next(), keys.next()) {
                (None, _) => Some(BooleanArray::new(
                    arrow::buffer::BooleanBuffer::new_unset(array.len()),
                    array.nulls().cloned(),
                )),
                (Some(k), None) => key_eq(array.keys(), k)?,
                (Some(_), Some(_)) => None,
            }
        }
        _ => None
    );
    Ok(result)
}

/// The rows of `keys` equal to `k` (None if `k` is not a key of this type).
fn key_eq<K: ArrowDictionaryKeyType>(
    keys: &PrimitiveArray<K>,
    k: usize,
) -> Result<Option<BooleanArray>> {
    let Some(k) = K::Native::from_usize(k) else {
        return Ok(None);
    };
    let scalar = PrimitiveArray::<K>::new_scalar(k);
    Ok(Some(eq(keys, &scalar)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{ArrayRef, AsArray, DictionaryArray, Int8Array, Int32Array, StringArray};
    use arrow::datatypes::{Field, Int8Type, Int32Type, Schema};
    use datafusion_common::ScalarValue;

    fn batch(col: ArrayRef) -> RecordBatch {
        let schema = Schema::new(vec![Field::new("s", col.data_type().clone(), true)]);
        RecordBatch::try_new(Arc::new(schema), vec![col]).unwrap()
    }

    fn eq_expr(literal: &str, column_first: bool) -> Arc<dyn PhysicalExpr> {
        let c: Arc<dyn PhysicalExpr> = Arc::new(Column::new("s", 0));
        let l: Arc<dyn PhysicalExpr> =
            Arc::new(Literal::new(ScalarValue::Utf8(Some(literal.into()))));
        let (a, b) = if column_first { (c, l) } else { (l, c) };
        Arc::new(BinaryExpr::new(a, Operator::Eq, b))
    }

    /// The rows a comparison selects (TRUE).
    fn selected(b: &BooleanArray) -> Vec<bool> {
        b.iter().map(|v| v == Some(true)).collect()
    }

    /// What the general path selects: arrow's comparison of the dictionary with the scalar.
    fn general(expr: &Arc<dyn PhysicalExpr>, b: &RecordBatch) -> Vec<bool> {
        let a = expr.evaluate(b).unwrap().into_array(b.num_rows()).unwrap();
        selected(a.as_boolean())
    }

    #[test]
    fn equals_the_general_comparison() {
        let values = StringArray::from(vec![Some("PAID"), Some("NEW"), None, Some("VOID")]);
        let keys = Int32Array::from(vec![Some(0), Some(1), None, Some(2), Some(3), Some(0)]);
        let dict: ArrayRef =
            Arc::new(DictionaryArray::<Int32Type>::try_new(keys, Arc::new(values)).unwrap());
        let b = batch(dict);
        for lit in ["PAID", "NEW", "VOID", "nothing", ""] {
            for column_first in [true, false] {
                let e = eq_expr(lit, column_first);
                let got = eval_dictionary_eq(&e, &b).unwrap().expect("applies");
                assert_eq!(selected(&got), general(&e, &b), "{lit}");
            }
        }
        // A sliced dictionary, with 8-bit keys.
        let values = StringArray::from(vec!["a", "b"]);
        let keys = Int8Array::from(vec![0, 1, 1, 0, 1]);
        let dict: ArrayRef =
            Arc::new(DictionaryArray::<Int8Type>::try_new(keys, Arc::new(values)).unwrap());
        let b = batch(dict.slice(1, 3));
        let e = eq_expr("b", true);
        let got = eval_dictionary_eq(&e, &b).unwrap().unwrap();
        assert_eq!(selected(&got), general(&e, &b));
    }

    #[test]
    fn declines_what_it_does_not_cover() {
        // A value held twice: no single key.
        let values = StringArray::from(vec!["a", "a"]);
        let keys = Int32Array::from(vec![0, 1]);
        let dict: ArrayRef =
            Arc::new(DictionaryArray::<Int32Type>::try_new(keys, Arc::new(values)).unwrap());
        assert!(
            eval_dictionary_eq(&eq_expr("a", true), &batch(dict))
                .unwrap()
                .is_none()
        );
        // Plain strings.
        let plain: ArrayRef = Arc::new(StringArray::from(vec!["a"]));
        assert!(
            eval_dictionary_eq(&eq_expr("a", true), &batch(plain))
                .unwrap()
                .is_none()
        );
    }
}
