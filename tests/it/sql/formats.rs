//! `tally sql`'s file formats: Arrow IPC in, Parquet and Arrow out, and Parquet row groups
//! decoded on several threads in file order.

use std::path::Path;

use super::{CSV_QUERY, csv_reference, csv_rows, csv_stream, ok, scratch, write_csv};

/// Arrow IPC in, Parquet and Arrow out: the same rows as CSV.
#[test]
fn arrow_input_and_binary_outputs() {
    let dir = scratch("formats");
    let rows = csv_stream(true);
    let csv = dir.join("t.csv");
    write_csv(&csv, &rows);
    // Convert the CSV to an Arrow IPC file with tally itself.
    let ipc = dir.join("t.arrow");
    let script = format!(
        "CREATE TABLE t (s STRING, op STRING, k STRING, v BIGINT, u INT) WITH ('connector' = 'filesystem', 'path' = '{}', 'format' = 'csv'); \
         SELECT s, op, k, v, u FROM t;",
        csv.display()
    );
    ok(
        &script,
        &["--emit", "final", "--output", ipc.to_str().unwrap()],
    );
    let table = format!(
        "CREATE TABLE t (k STRING, v BIGINT, u INT, s STRING) WITH ('connector' = 'filesystem', 'path' = '{}', 'format' = 'arrow', 'changelog-column' = 'op');",
        ipc.display()
    );
    let expected = csv_reference(&rows);
    for (format, ext) in [("parquet", "parquet"), ("arrow", "arrow")] {
        let out = dir.join(format!("out.{ext}"));
        ok(
            &format!("{table} {CSV_QUERY}"),
            &[
                "--emit",
                "final",
                "--format",
                format,
                "--output",
                out.to_str().unwrap(),
            ],
        );
        // Read it back through tally as a table of that format.
        let back = format!(
            "CREATE TABLE r (k STRING, n BIGINT, paid BIGINT, users BIGINT) WITH ('connector' = 'filesystem', 'path' = '{}', 'format' = '{format}'); \
             SELECT k, n, paid, users FROM r;",
            out.display()
        );
        let text = ok(&back, &["--emit", "final", "--format", "csv"]);
        assert_eq!(csv_rows(&text), expected, "{format}");
    }
}

/// Parquet row groups decoded on several threads come back in file order: the same batches as
/// one reader's, for a changelog file with several row groups.
#[test]
fn parallel_parquet_decoding_keeps_file_order() {
    use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
    use tally::source::{FileTable, Format};
    let table = FileTable {
        name: "orders".into(),
        schema: std::sync::Arc::new(Schema::new(vec![
            Field::new("order_id", DataType::Int64, true),
            Field::new("shop", DataType::Utf8, true),
            Field::new("amount", DataType::Int64, true),
            Field::new("ts", DataType::Timestamp(TimeUnit::Millisecond, None), true),
        ])),
        path: Path::new(env!("CARGO_MANIFEST_DIR")).join("data/orders_changelog.parquet"),
        format: Format::Parquet,
        changelog_column: Some("op".into()),
        time_column: None,
        unread_columns: vec![],
        dictionary_columns: vec![],
    };
    let read = |decoders: usize, batch: usize| -> Vec<String> {
        table
            .open_with(batch, decoders)
            .unwrap()
            .prefetch(2, None)
            .flat_map(|b| {
                let b = b.unwrap();
                let rows =
                    arrow::util::pretty::pretty_format_batches(&[b.with_op_column().unwrap()])
                        .unwrap()
                        .to_string();
                rows.lines()
                    .skip(3)
                    .filter(|l| !l.starts_with('+'))
                    .map(str::to_string)
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    let one = read(1, 7000);
    assert_eq!(one.len(), 100_000);
    for decoders in [2, 3, 8] {
        assert!(
            read(decoders, 7000) == one,
            "{decoders} decoders changed the order"
        );
    }
}
