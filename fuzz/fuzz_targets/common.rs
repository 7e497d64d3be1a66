//! Shared by the file reader targets: the input's first byte picks the reader options, the rest
//! is the file, read through `tally::source::FileTable` with a fixed schema and drained.

use std::path::PathBuf;
use std::sync::Arc;

use arrow::array::{Array, AsArray};
use arrow::datatypes::{DataType, Field, Int8Type, Schema, TimeUnit};
use tally::source::{FileTable, Format};

/// Declared columns: `shop STRING, amount BIGINT, ts TIMESTAMP(3)`; the changelog column `op`
/// (when the control byte asks for it) is read from the file.
pub fn table(format: Format, path: PathBuf, changelog: bool) -> FileTable {
    let schema = Arc::new(Schema::new(vec![
        Field::new("shop", DataType::Utf8, true),
        Field::new("amount", DataType::Int64, true),
        Field::new("ts", DataType::Timestamp(TimeUnit::Millisecond, None), true),
    ]));
    FileTable {
        name: "t".into(),
        schema,
        path,
        format,
        changelog_column: changelog.then(|| "op".to_string()),
        time_column: None,
        unread_columns: vec![],
        dictionary_columns: vec![],
    }
}

/// Control byte: bit 0 = changelog column `op`; bits 1..=3 = batch size - 1; bit 4 = two
/// decoders (Parquet only).
pub fn read(format: Format, ext: &str, data: &[u8]) {
    let Some((&control, file)) = data.split_first() else {
        return;
    };
    let path =
        std::env::temp_dir().join(format!("tally-fuzz-{}-{}.{ext}", std::process::id(), ext));
    std::fs::write(&path, file).expect("cannot write the temporary input file");
    let changelog = control & 1 == 1;
    let batch_size = 1 + ((control >> 1) & 7) as usize;
    let decoders = 1 + ((control >> 4) & 1) as usize;
    let table = table(format, path, changelog);
    let Ok(reader) = table.open_with(batch_size, decoders) else {
        return;
    };
    for item in reader {
        let Ok(cb) = item else {
            break;
        };
        // What a source promises: the declared schema, and with a changelog column one valid
        // Int8 op code (0..=3) per row.
        assert_eq!(cb.data.schema(), table.schema);
        match (&cb.op, changelog) {
            (Some(op), true) => {
                assert_eq!(op.len(), cb.data.num_rows());
                assert_eq!(op.null_count(), 0);
                let codes = op.as_primitive::<Int8Type>();
                assert!(codes.values().iter().all(|c| (0..=3).contains(c)));
            }
            (None, false) => {}
            (op, _) => panic!("op column {op:?} with changelog = {changelog}"),
        }
    }
}
