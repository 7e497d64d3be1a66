use std::collections::BTreeMap;

use arrow::array::{Array, AsArray, Int8Array, Int64Array, StringArray};
use arrow::datatypes::{DataType, Field, Int64Type, Schema};

use super::*;

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("k", DataType::Utf8, true),
        Field::new("n", DataType::Int64, true),
    ]))
}

/// Changes of `(kind, k, n)` rows.
fn changes(rows: &[(RowKind, Option<&str>, Option<i64>)]) -> ChangeBatch {
    let data = RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(StringArray::from_iter(rows.iter().map(|r| r.1))),
            Arc::new(Int64Array::from_iter(rows.iter().map(|r| r.2))),
        ],
    )
    .unwrap();
    let kinds = Int8Array::from_iter_values(rows.iter().map(|r| r.0 as i8));
    ChangeBatch::try_new(Some(Arc::new(kinds)), data).unwrap()
}

/// `(k, n)` rows of a table's batch, in its order.
fn rows_of(batch: &RecordBatch) -> Vec<(Option<String>, Option<i64>)> {
    let k = batch
        .column(0)
        .as_any()
        .downcast_ref::<StringArray>()
        .unwrap();
    let n = batch
        .column(1)
        .as_any()
        .downcast_ref::<Int64Array>()
        .unwrap();
    (0..batch.num_rows())
        .map(|i| {
            (
                (!k.is_null(i)).then(|| k.value(i).to_string()),
                (!n.is_null(i)).then(|| n.value(i)),
            )
        })
        .collect()
}

/// A seeded changelog of inserts and retractions of rows already in the table (NULLs among
/// them, rows repeated) gives the multiset a count per row gives, sorted as the rows sort.
#[test]
fn a_multiset_counts_each_row_and_sorts_them() {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = |m: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % m
    };
    let names = [None, Some("a"), Some("b"), Some("ab"), Some("")];
    let mut table = MultisetTable::try_new(schema()).unwrap();
    let mut model: BTreeMap<(Option<String>, Option<i64>), i64> = BTreeMap::new();
    for _ in 0..40 {
        let mut batch = vec![];
        for _ in 0..next(30) {
            let held: Vec<_> = model
                .iter()
                .filter(|e| *e.1 > 0)
                .map(|e| e.0.clone())
                .collect();
            if !held.is_empty() && next(3) == 0 {
                let (k, n) = held[next(held.len() as u64) as usize].clone();
                *model.get_mut(&(k.clone(), n)).unwrap() -= 1;
                let kind = [RowKind::UpdateBefore, RowKind::Delete][next(2) as usize];
                batch.push((kind, k, n));
            } else {
                let k = names[next(5) as usize].map(str::to_string);
                let n = (next(6) > 0).then(|| next(4) as i64 - 1);
                *model.entry((k.clone(), n)).or_insert(0) += 1;
                let kind = [RowKind::Insert, RowKind::UpdateAfter][next(2) as usize];
                batch.push((kind, k, n));
            }
        }
        let rows: Vec<_> = batch
            .iter()
            .map(|(r, k, n)| (*r, k.as_deref(), *n))
            .collect();
        table.apply(&changes(&rows)).unwrap();
    }
    // The model's order is the rows' order: NULLs first, then by value.
    let expected: Vec<_> = model
        .iter()
        .flat_map(|(row, &c)| std::iter::repeat_n(row.clone(), c as usize))
        .collect();
    assert!(expected.len() > 50, "{}", expected.len());
    assert_eq!(table.len(), expected.len());
    assert_eq!(rows_of(&table.to_batch().unwrap()), expected);
    // A row retracted as often as it was added is gone: retracting it again is an error,
    // as is retracting a row never added.
    let once = [
        (RowKind::Insert, Some("zz"), Some(1)),
        (RowKind::Delete, Some("zz"), Some(1)),
    ];
    table.apply(&changes(&once)).unwrap();
    for never in [Some("zz"), Some("yy")] {
        let e = table
            .apply(&changes(&[(RowKind::Delete, never, Some(1))]))
            .unwrap_err();
        assert!(e.to_string().contains("not in the result"), "{e}");
    }
}

/// An upsert table keeps each key's last row, checks a `-U` against it, and sorts by key.
#[test]
fn a_final_table_keeps_each_keys_last_row() {
    use RowKind::{Delete, Insert, UpdateAfter, UpdateBefore};
    let mut table = FinalTable::try_new(schema(), &[0]).unwrap();
    table
        .apply(&changes(&[
            (Insert, Some("b"), Some(1)),
            (Insert, None, Some(5)),
            (Insert, Some("a"), None),
            (UpdateBefore, Some("b"), Some(1)),
            (UpdateAfter, Some("b"), Some(22)),
            (UpdateAfter, Some("a"), Some(3)),
            (Insert, Some("c"), Some(4)),
            (Delete, Some("c"), Some(4)),
        ]))
        .unwrap();
    assert_eq!(
        rows_of(&table.to_batch().unwrap()),
        [
            (None, Some(5)),
            (Some("a".into()), Some(3)),
            (Some("b".into()), Some(22))
        ]
    );
    for (bad, why) in [
        ((UpdateBefore, Some("b"), Some(1)), "-U of a row"),
        ((UpdateBefore, Some("q"), Some(1)), "-U of a row"),
        ((Delete, Some("q"), None), "-D of a key"),
    ] {
        let e = table.apply(&changes(&[bad])).unwrap_err().to_string();
        assert!(e.contains(why), "{e}");
    }
}

/// Tables of more rows than a decoded piece, filled on the pool (batches past its
/// threshold) and read back in pieces: every row once, in order, the same for the keyed
/// table and the multiset (each row once).
#[test]
fn large_tables_apply_and_decode_in_pieces() {
    let n = DECODE_PIECE_ROWS + 4_321;
    let names: Vec<String> = (0..n).map(|i| format!("k{:07}", (i * 7_919) % n)).collect();
    let rows: Vec<(RowKind, Option<&str>, Option<i64>)> = names
        .iter()
        .enumerate()
        .map(|(i, k)| {
            (
                RowKind::Insert,
                Some(k.as_str()),
                (i % 9 != 0).then_some(i as i64),
            )
        })
        .collect();
    let mut keyed = FinalTable::try_new(schema(), &[0]).unwrap();
    let mut multiset = MultisetTable::try_new(schema()).unwrap();
    for part in rows.chunks(10_000) {
        keyed.apply(&changes(part)).unwrap();
        multiset.apply(&changes(part)).unwrap();
    }
    let mut want: Vec<(Option<String>, Option<i64>)> = rows
        .iter()
        .map(|r| (r.1.map(str::to_string), r.2))
        .collect();
    want.sort();
    assert_eq!(rows_of(&keyed.to_batch().unwrap()), want);
    assert_eq!(rows_of(&multiset.to_batch().unwrap()), want);
    // Handed on in pieces: the same rows, in order, none over a piece.
    for table in [ResultTable::Upsert(keyed), ResultTable::Multiset(multiset)] {
        let mut got = vec![];
        let mut sizes = vec![];
        table
            .for_each_sorted(|b| {
                sizes.push(b.num_rows());
                got.extend(rows_of(&b));
                Ok(())
            })
            .unwrap();
        assert_eq!(sizes, [DECODE_PIECE_ROWS, 4_321]);
        assert_eq!(got, want);
    }
}

/// Pieces go to `f` in order, windows of them decoded on the pool; an empty table is one
/// empty piece; the first error (of a decode or of `f`) ends it.
#[test]
fn pieces_are_handed_on_in_order() {
    let one = Arc::new(Schema::new(vec![Field::new("i", DataType::Int64, false)]));
    let decode = |r: Range<usize>| -> Result<RecordBatch> {
        if r.start == 700 {
            return Err(Error::internal("piece at 700"));
        }
        let values = Int64Array::from_iter_values(r.map(|i| i as i64));
        Ok(RecordBatch::try_new(
            Arc::clone(&one),
            vec![Arc::new(values)],
        )?)
    };
    let collect = |n: usize, piece: usize| -> (Vec<usize>, Vec<i64>) {
        let (mut sizes, mut values) = (vec![], vec![]);
        for_each_piece(n, piece, decode, |b| {
            sizes.push(b.num_rows());
            values.extend(b.column(0).as_primitive::<Int64Type>().values());
            Ok(())
        })
        .unwrap();
        (sizes, values)
    };
    let (sizes, values) = collect(650, 7);
    assert_eq!(sizes.len(), 93);
    assert!(sizes[..92].iter().all(|&s| s == 7));
    assert_eq!(sizes[92], 650 - 92 * 7);
    assert_eq!(values, (0..650).collect::<Vec<i64>>());
    assert_eq!(collect(0, 7), (vec![0], vec![]));
    assert_eq!(collect(5, 7), (vec![5], (0..5).collect()));
    // A piece that fails to decode: the pieces before it went out, none after.
    let mut taken = 0;
    let err = for_each_piece(1_000, 10, decode, |b| {
        taken += b.num_rows();
        Ok(())
    })
    .unwrap_err();
    assert!(err.to_string().contains("piece at 700"), "{err}");
    // Every window before the failing piece's went out whole; its window's did not.
    let window = 2 * rayon::current_num_threads().max(1);
    assert_eq!(taken, 70 / window * window * 10, "{taken}");
    // `f`'s error ends it at once.
    let mut calls = 0;
    let err = for_each_piece(1_000, 10, decode, |_| {
        calls += 1;
        Err(Error::invalid_input("full disk"))
    })
    .unwrap_err();
    assert!(err.to_string().contains("full disk"));
    assert_eq!(calls, 1);
}
