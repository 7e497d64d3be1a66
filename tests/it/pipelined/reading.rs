//! How the source is read: Parquet split across every worker (by row groups and by row
//! ranges inside one), and columns nothing reads left undecoded.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use datafusion_expr::{col, lit};
use parquet::arrow::ArrowWriter;
use parquet::file::properties::WriterProperties;
use rand::SeedableRng;
use rand::rngs::StdRng;
use tally::aggregates::{count_star, sum};
use tally::changelog::ChangeBatch;
use tally::pipeline::{AggregateStage, CalcStage, Pipeline, Stage};
use tally::run::Job;
use tally::runtime::Runtime;
use tally::source::{FileTable, Format};
use tally::{Config, GroupAggregate};

use super::{final_rows, opt, random_rows, table, temp, write_parquet_with};
use crate::common::format_changes;

/// Splits of Parquet row groups, and of row ranges inside one: every row once, and as many
/// source tasks as there are workers.
#[test]
fn parquet_is_split_across_every_worker() {
    let mut rng = StdRng::seed_from_u64(7);
    let rows = random_rows(&mut rng, 4000);
    // The last cases write pages of 100 rows (with an offset index, as parquet-rs does by
    // default): a split of a row group then reads only the pages that hold its rows.
    for (row_group, workers, pages) in [
        (1000, 4, false),
        (4000, 3, false),
        (1500, 2, false),
        (4000, 3, true),
        (1500, 5, true),
    ] {
        let path = temp(&format!("split-{row_group}-{workers}-{pages}.parquet"));
        let props = WriterProperties::builder();
        let props = if pages {
            props
                .set_data_page_row_count_limit(100)
                .set_write_batch_size(50)
        } else {
            props
        };
        write_parquet_with(&path, &rows, row_group, props);
        let splits = table(&path, Format::Parquet)
            .open_splits(256, workers)
            .unwrap();
        assert_eq!(splits.len(), workers, "{row_group} rows per group");
        let mut seen: Vec<String> = vec![];
        for split in splits {
            for b in split {
                let b = b.unwrap();
                let s = b
                    .data
                    .column(3)
                    .as_any()
                    .downcast_ref::<StringArray>()
                    .unwrap();
                let k = b
                    .data
                    .column(0)
                    .as_any()
                    .downcast_ref::<StringArray>()
                    .unwrap();
                for i in 0..b.num_rows() {
                    seen.push(format!(
                        "{}:{}",
                        opt(k.is_valid(i).then(|| k.value(i))),
                        s.value(i)
                    ));
                }
            }
        }
        let mut want: Vec<String> = rows
            .iter()
            .map(|r| format!("{}:{}", opt(r.k.clone()), r.s))
            .collect();
        want.sort();
        seen.sort();
        assert_eq!(seen, want, "{row_group} rows per group, {workers} workers");
    }
}

/// A Parquet column the query never reads is not decoded: here it holds text where a BIGINT is
/// declared, which a query reading it reports, and one that does not never sees.
#[test]
fn columns_nothing_reads_are_not_decoded() {
    let file_schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Utf8, true),
        Field::new("v", DataType::Int64, true),
        Field::new("junk", DataType::Utf8, true),
    ]));
    let n = 5000;
    let cols: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from_iter_values(
            (0..n).map(|i| format!("k{}", i % 7)),
        )),
        Arc::new(Int64Array::from_iter_values(0..n as i64)),
        Arc::new(StringArray::from_iter_values(
            (0..n).map(|_| "not a number"),
        )),
    ];
    let path = temp("junk.parquet");
    let props = WriterProperties::builder()
        .set_max_row_group_row_count(Some(1000))
        .build();
    let mut w = ArrowWriter::try_new(
        std::fs::File::create(&path).unwrap(),
        Arc::clone(&file_schema),
        Some(props),
    )
    .unwrap();
    w.write(&RecordBatch::try_new(file_schema, cols).unwrap())
        .unwrap();
    w.close().unwrap();
    let declared = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Utf8, true),
        Field::new("v", DataType::Int64, true),
        Field::new("junk", DataType::Int64, true),
    ]));
    // (pipelined runtime, the query reads `junk`, a filter before the aggregate)
    for (pipelined, reads_junk, filter) in [
        (true, false, false),
        (false, false, false),
        (true, false, true),
        (true, true, false),
    ] {
        let table = FileTable {
            schema: Arc::clone(&declared),
            ..table(&path, Format::Parquet)
        };
        let config = Config::from_pairs([
            ("table.exec.resource.default-parallelism", "2"),
            ("table.exec.mini-batch.enabled", "true"),
            ("table.exec.mini-batch.allow-latency", "1 h"),
            ("table.exec.mini-batch.size", "100"),
            (
                "tally.exec.pipelined",
                if pipelined { "true" } else { "false" },
            ),
        ])
        .unwrap();
        let summed = if reads_junk { col("junk") } else { col("v") };
        let agg = GroupAggregate::builder(Arc::clone(&declared))
            .group_by([col("k")])
            .aggregate([count_star().alias("n"), sum(summed).alias("s")])
            .config(config)
            .build_parallel()
            .unwrap();
        let mut stages: Vec<Box<dyn Stage>> = vec![];
        if filter {
            // WHERE v >= 0: keeps every row, and reads `v` only.
            let input = datafusion_common::DFSchema::try_from(declared.as_ref().clone()).unwrap();
            let keep = col("v").gt_eq(lit(0i64));
            stages.push(Box::new(
                CalcStage::try_new(&input, Some(&keep), None, Arc::clone(&declared)).unwrap(),
            ));
        }
        stages.push(Box::new(AggregateStage::new(agg)));
        let mut job = Job::new(table, Pipeline::new(stages, Runtime::new(2).unwrap()), None);
        let mut lines = vec![];
        let mut sink = |b: &ChangeBatch| -> tally::Result<()> {
            lines.extend(format_changes(std::slice::from_ref(b)));
            Ok(())
        };
        let result = job.run(512, &mut sink, |_, _| {});
        if reads_junk {
            let err = result.unwrap_err().to_string();
            assert!(err.contains("junk"), "{err}");
            continue;
        }
        result.unwrap();
        let mut expected: Vec<String> = (0..7)
            .map(|k| {
                let vs: Vec<i64> = (0..n as i64).filter(|i| i % 7 == k).collect();
                format!("[k{k}, {}, {}]", vs.len(), vs.iter().sum::<i64>())
            })
            .collect();
        expected.sort();
        assert_eq!(
            final_rows(&lines),
            expected,
            "pipelined {pipelined}, filter {filter}"
        );
    }
}
