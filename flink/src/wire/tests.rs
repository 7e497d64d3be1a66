//! The column batch format's unit tests: round trips of every type, malformed bytes.

use super::*;
use arrow::datatypes::{Field, Schema};

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("shop", DataType::Utf8, true),
        Field::new("n", DataType::Int64, true),
        Field::new("x", DataType::Float64, false),
        Field::new("ok", DataType::Boolean, false),
        Field::new("i", DataType::Int32, false),
        Field::new("t", DataType::Timestamp(TimeUnit::Millisecond, None), true),
        Field::new("t0", DataType::Timestamp(TimeUnit::Second, None), true),
        Field::new("t6", DataType::Timestamp(TimeUnit::Microsecond, None), true),
        Field::new("t9", DataType::Timestamp(TimeUnit::Nanosecond, None), false),
        Field::new("d", DataType::Decimal128(38, 18), true),
        Field::new("day", DataType::Date32, true),
    ]))
}

fn changes() -> ChangeBatch {
    let data = RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(StringArray::from(vec![Some("a"), None, Some("çé")])),
            Arc::new(Int64Array::from(vec![Some(1), Some(-2), None])),
            Arc::new(Float64Array::from(vec![0.5, -1.0, 3.25])),
            Arc::new(BooleanArray::from(vec![true, false, true])),
            Arc::new(Int32Array::from(vec![7, 8, 9])),
            Arc::new(TimestampMillisecondArray::from(vec![
                Some(-1),
                None,
                Some(1_700_000_000_123),
            ])),
            Arc::new(TimestampSecondArray::from(vec![Some(-1), Some(0), None])),
            Arc::new(TimestampMicrosecondArray::from(vec![
                None,
                Some(1_700_000_000_123_456),
                Some(-7),
            ])),
            Arc::new(TimestampNanosecondArray::from(vec![i64::MIN, 0, i64::MAX])),
            Arc::new(
                Decimal128Array::from(vec![
                    Some(-10i128.pow(38) + 1),
                    None,
                    Some(12_345_000_000_000_000_000),
                ])
                .with_precision_and_scale(38, 18)
                .unwrap(),
            ),
            Arc::new(Date32Array::from(vec![Some(-719_162), None, Some(19_723)])),
        ],
    )
    .unwrap();
    ChangeBatch::try_new(
        Some(op_array(&[
            RowKind::Insert,
            RowKind::UpdateBefore,
            RowKind::Delete,
        ])),
        data,
    )
    .unwrap()
}

#[test]
fn a_batch_survives_the_round_trip() {
    let c = changes();
    let back = decode(&encode(&c).unwrap(), &schema()).unwrap();
    assert_eq!(back.data, c.data);
    assert_eq!(back.row_kinds().unwrap(), c.row_kinds().unwrap());
    let sliced = c.slice(1, 2);
    let back = decode(&encode(&sliced).unwrap(), &schema()).unwrap();
    assert_eq!(back.data, sliced.data);
    let inserts = ChangeBatch::inserts(c.data.clone());
    let back = decode(&encode(&inserts).unwrap(), &schema()).unwrap();
    assert!(back.op.is_none());
}

#[test]
fn malformed_bytes_are_errors_not_panics() {
    let good = encode(&changes()).unwrap();
    for cut in 0..good.len() {
        let e = decode(&good[..cut], &schema()).unwrap_err().to_string();
        assert!(e.contains("malformed column batch"), "{e}");
    }
    let mut bad_kind = good.clone();
    bad_kind[13] = 9;
    assert!(
        decode(&bad_kind, &schema())
            .unwrap_err()
            .to_string()
            .contains("row kind 9")
    );
    let mut long = good;
    long.push(0);
    assert!(
        decode(&long, &schema())
            .unwrap_err()
            .to_string()
            .contains("after the last column")
    );
}

#[test]
fn a_column_not_sent_arrives_as_nulls() {
    let schema = Arc::new(Schema::new(vec![
        Field::new("a", DataType::Int64, true),
        Field::new("b", DataType::Utf8, true),
    ]));
    let mut bytes = b"TLY1".to_vec();
    bytes.extend(2u32.to_le_bytes());
    bytes.extend(2u32.to_le_bytes());
    bytes.push(0);
    bytes.extend([Type::BigInt.tag(), 0]);
    bytes.extend(5i64.to_le_bytes());
    bytes.extend(6i64.to_le_bytes());
    bytes.extend([Type::String.tag(), 2]);
    let c = decode(&bytes, &schema).unwrap();
    assert_eq!(c.data.column(1).null_count(), 2);
    assert_eq!(
        c.data.column(0).as_primitive::<Int64Type>().values(),
        &[5, 6]
    );
}

#[test]
fn a_null_in_a_not_null_column_is_named() {
    let strict = Arc::new(Schema::new(vec![Field::new("n", DataType::Int64, false)]));
    let loose = Arc::new(Schema::new(vec![Field::new("n", DataType::Int64, true)]));
    let data =
        RecordBatch::try_new(loose, vec![Arc::new(Int64Array::from(vec![Some(1), None]))]).unwrap();
    let bytes = encode(&ChangeBatch::inserts(data)).unwrap();
    let e = decode(&bytes, &strict).unwrap_err().to_string();
    assert!(e.contains("'n' is declared NOT NULL"), "{e}");
}

#[test]
fn types_parse_by_flink_names() {
    assert_eq!(Type::parse("bigint").unwrap(), Type::BigInt);
    assert_eq!(Type::parse("VARCHAR").unwrap(), Type::String);
    assert_eq!(Type::parse("DECIMAL(10, 2)").unwrap(), Type::Decimal(10, 2));
    assert_eq!(Type::parse("date").unwrap(), Type::Date);
    assert_eq!(
        Type::parse("TIMESTAMP(9)").unwrap(),
        Type::Timestamp(TimeUnit::Nanosecond)
    );
    assert_eq!(
        Type::parse("TIMESTAMP(2)").unwrap(),
        Type::Timestamp(TimeUnit::Millisecond)
    );
    for t in [
        Type::Decimal(38, 18),
        Type::Timestamp(TimeUnit::Second),
        Type::Date,
    ] {
        assert_eq!(Type::parse(&t.name()).unwrap(), t);
    }
    for bad in [
        "TIME",
        "TIMESTAMP(3) WITH TIME ZONE",
        "ARRAY<INT>",
        "DECIMAL(39, 2)",
    ] {
        let e = Type::parse(bad).unwrap_err().to_string();
        assert!(
            e.contains(&format!("'{bad}'")) && e.contains("DECIMAL(p, s)"),
            "{e}"
        );
    }
}

#[test]
fn a_decimal_beyond_its_precision_is_malformed() {
    let schema = Arc::new(Schema::new(vec![Field::new(
        "d",
        DataType::Decimal128(4, 2),
        true,
    )]));
    let mut bytes = b"TLY1".to_vec();
    bytes.extend(1u32.to_le_bytes());
    bytes.extend(1u32.to_le_bytes());
    bytes.extend([0, 10, 4, 2, 0]);
    bytes.extend(12_345i128.to_le_bytes());
    let e = decode(&bytes, &schema).unwrap_err().to_string();
    assert!(e.contains("beyond DECIMAL(4, 2)"), "{e}");
}
