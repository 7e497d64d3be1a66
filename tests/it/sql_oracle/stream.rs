//! The SQL oracle's input: seeded random streams (insert-only and changelogs), written to Arrow
//! IPC or Parquet files with their table's DDL, the rows they leave, and the final table a
//! changelog gives.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{ArrayRef, Int8Array, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use rand::Rng;
use rand::rngs::StdRng;

use crate::common::{Materialized, changelog_stream};

/// One input row: key, value, user.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Row {
    pub(crate) k: Option<String>,
    pub(crate) v: Option<i64>,
    pub(crate) u: i64,
}

fn random_row(rng: &mut StdRng) -> Row {
    let k = if rng.random_bool(0.05) {
        None
    } else if rng.random_bool(0.4) {
        Some("h".to_string())
    } else {
        Some(format!("k{}", rng.random_range(0..6)))
    };
    Row {
        k,
        v: rng.random_bool(0.9).then(|| rng.random_range(-20..40)),
        u: rng.random_range(0..9),
    }
}

/// (retract?, row): inserts, deletes of live rows, `-U`/`+U` updates of live rows.
pub(crate) fn random_stream(rng: &mut StdRng, len: usize, retractions: bool) -> Vec<(bool, Row)> {
    changelog_stream(rng, len, retractions, random_row, |old, new| {
        new.k = old.k.clone()
    })
}

/// Writes the stream as an Arrow IPC file of random batch sizes (or, with `parquet`, a Parquet
/// file of random row groups), with an `op` column (`-D` or `-U` for retractions, `+I` or `+U`
/// for the rest).
pub(crate) fn write_stream(
    path: &std::path::Path,
    stream: &[(bool, Row)],
    rng: &mut StdRng,
    parquet: bool,
) {
    let schema = Arc::new(Schema::new(vec![
        Field::new("op", DataType::Int8, false),
        Field::new("k", DataType::Utf8, true),
        Field::new("v", DataType::Int64, true),
        Field::new("u", DataType::Int64, false),
    ]));
    let mut batches = vec![];
    let mut at = 0;
    while at < stream.len() {
        let n = rng.random_range(1..=90).min(stream.len() - at);
        let rows = &stream[at..at + n];
        let update = rng.random_bool(0.5);
        let cols: Vec<ArrayRef> = vec![
            Arc::new(Int8Array::from_iter_values(rows.iter().map(
                |(r, _)| match (*r, update) {
                    (false, false) => 0,
                    (true, true) => 1,
                    (false, true) => 2,
                    (true, false) => 3,
                },
            ))),
            Arc::new(StringArray::from_iter(
                rows.iter().map(|(_, r)| r.k.clone()),
            )),
            Arc::new(Int64Array::from_iter(rows.iter().map(|(_, r)| r.v))),
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|(_, r)| r.u))),
        ];
        batches.push(RecordBatch::try_new(schema.clone(), cols).unwrap());
        at += n;
    }
    let file = std::fs::File::create(path).unwrap();
    if parquet {
        let props = parquet::file::properties::WriterProperties::builder()
            .set_max_row_group_row_count(Some(rng.random_range(30..300)))
            .build();
        let mut w = parquet::arrow::ArrowWriter::try_new(file, schema, Some(props)).unwrap();
        for b in &batches {
            w.write(b).unwrap();
        }
        w.close().unwrap();
    } else {
        let mut w = arrow::ipc::writer::FileWriter::try_new(file, &schema).unwrap();
        for b in &batches {
            w.write(b).unwrap();
        }
        w.finish().unwrap();
    }
}

/// The rows a changelog leaves.
pub(crate) fn live(stream: &[(bool, Row)]) -> Vec<Row> {
    let mut rows: Vec<Row> = vec![];
    for (retract, row) in stream {
        if *retract {
            let i = rows.iter().position(|r| r == row).unwrap();
            rows.swap_remove(i);
        } else {
            rows.push(row.clone());
        }
    }
    rows
}

/// The DDL of table `t` over the stream written to `path` in `format` (a changelog where
/// it has `retractions`).
pub(crate) fn table_ddl(path: &std::path::Path, format: &str, retractions: bool) -> String {
    format!(
        "CREATE TABLE t (k STRING, v BIGINT, u BIGINT) WITH ('connector' = 'filesystem', \
         'path' = '{}', 'format' = '{format}'{});",
        path.display(),
        if retractions {
            ", 'changelog-column' = 'op'"
        } else {
            ""
        }
    )
}

/// The final table a changelog gives: a multiset with `-U` rows, else upserts by the key columns.
pub(crate) fn final_table(lines: &[String], update_before: bool, keys: &[usize]) -> Vec<String> {
    if update_before {
        let mut m = Materialized::default();
        m.apply_lines(lines);
        return m.rows();
    }
    let mut table: BTreeMap<Vec<String>, String> = BTreeMap::new();
    for l in lines {
        let (kind, row) = l.split_at(2);
        let fields: Vec<String> = row[1..row.len() - 1]
            .split(", ")
            .map(str::to_string)
            .collect();
        let key: Vec<String> = keys.iter().map(|&i| fields[i].clone()).collect();
        match kind {
            "+I" | "+U" => {
                table.insert(key, row.to_string());
            }
            "-D" => {
                assert_eq!(
                    table.remove(&key).as_deref(),
                    Some(row),
                    "-D of a row not there"
                );
            }
            other => panic!("{other} in a changelog without -U rows"),
        }
    }
    let mut rows: Vec<String> = table.into_values().collect();
    rows.sort();
    rows
}
