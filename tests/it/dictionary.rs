//! Dictionary-encoded Parquet strings: a string column that the query only keys by or compares
//! with literals is read as `Dictionary(Int32, Utf8)` where every page of it is dictionary
//! encoded, and the results are those of a row-at-a-time reference under every runtime,
//! strategy and parallelism; a column used any other way, or stored without a dictionary, is
//! read as plain strings.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion_expr::{Expr, ExprFunctionExt, col, lit};
use parquet::arrow::ArrowWriter;
use parquet::file::properties::WriterProperties;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tally::aggregates::{count_star, min, sum};
use tally::changelog::ChangeBatch;
use tally::pipeline::{AggregateStage, CalcStage, Pipeline, Stage};
use tally::run::Job;
use tally::runtime::Runtime;
use tally::source::{FileTable, Format};
use tally::{Config, GroupAggregate, ParallelAggregate};

use crate::common::{Materialized, format_changes, runtime_config};
use crate::scratch::Scratch;

#[derive(Debug, Clone)]
struct Row {
    shop: Option<String>,
    status: &'static str,
    amount: Option<i64>,
}

const STATUSES: [&str; 4] = ["PAID", "CANCELLED", "NEW", "VOID"];

/// A hot shop with half the rows, 40 others, NULL shops and amounts.
fn random_rows(rng: &mut StdRng, n: usize) -> Vec<Row> {
    (0..n)
        .map(|_| Row {
            shop: if rng.random_bool(0.04) {
                None
            } else if rng.random_bool(0.5) {
                Some("hot".into())
            } else {
                Some(format!("shop-{}", rng.random_range(0..40)))
            },
            status: STATUSES[rng.random_range(0..4)],
            amount: rng.random_bool(0.9).then(|| rng.random_range(-20..500)),
        })
        .collect()
}

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("shop", DataType::Utf8, true),
        Field::new("status", DataType::Utf8, false),
        Field::new("amount", DataType::Int64, true),
    ]))
}

fn write_parquet(path: &Path, rows: &[Row], row_group: usize, props: WriterProperties) {
    let props = props
        .into_builder()
        .set_max_row_group_row_count(Some(row_group))
        .build();
    let file = std::fs::File::create(path).unwrap();
    let mut w = ArrowWriter::try_new(file, schema(), Some(props)).unwrap();
    for chunk in rows.chunks(250) {
        let cols: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from_iter(chunk.iter().map(|r| r.shop.clone()))),
            Arc::new(StringArray::from_iter_values(
                chunk.iter().map(|r| r.status),
            )),
            Arc::new(Int64Array::from_iter(chunk.iter().map(|r| r.amount))),
        ];
        w.write(&RecordBatch::try_new(schema(), cols).unwrap())
            .unwrap();
    }
    w.close().unwrap();
}

fn temp(name: &str) -> Scratch {
    Scratch::file(&format!("dictionary-{name}"))
}

fn table(path: &Path) -> FileTable {
    FileTable {
        name: "orders".into(),
        schema: schema(),
        path: path.to_path_buf(),
        format: Format::Parquet,
        changelog_column: None,
        time_column: None,
        unread_columns: vec![],
        dictionary_columns: vec![],
    }
}

fn opt<T: ToString>(v: Option<T>) -> String {
    v.map_or("null".to_string(), |v| v.to_string())
}

/// `WHERE status <> 'VOID'` (when `filter`), `GROUP BY shop`: COUNT(*),
/// SUM(amount) FILTER (status = 'PAID'), COUNT(*) FILTER ('NEW' > status), MIN(amount).
fn reference(rows: &[Row], filter: bool) -> Vec<String> {
    let mut by_shop: BTreeMap<Option<String>, Vec<&Row>> = BTreeMap::new();
    for r in rows.iter().filter(|r| !filter || r.status != "VOID") {
        by_shop.entry(r.shop.clone()).or_default().push(r);
    }
    let mut out: Vec<String> = by_shop
        .iter()
        .map(|(shop, rs)| {
            let paid: Vec<i64> = rs
                .iter()
                .filter(|r| r.status == "PAID")
                .filter_map(|r| r.amount)
                .collect();
            let fields = [
                opt(shop.clone()),
                rs.len().to_string(),
                opt((!paid.is_empty()).then(|| paid.iter().sum::<i64>())),
                rs.iter().filter(|r| "NEW" > r.status).count().to_string(),
                opt(rs.iter().filter_map(|r| r.amount).min()),
            ];
            format!("[{}]", fields.join(", "))
        })
        .collect();
    out.sort();
    out
}

/// `SUM(amount) FILTER (WHERE status = 'PAID') AS paid`.
fn paid() -> Expr {
    sum(col("amount"))
        .filter(col("status").eq(lit("PAID")))
        .build()
        .unwrap()
        .alias("paid")
}

/// The aggregate of [`reference`] over `input`, by `key`.
fn reference_aggregate(input: SchemaRef, key: Expr, config: Config) -> ParallelAggregate {
    GroupAggregate::builder(input)
        .group_by([key])
        .aggregate([
            count_star().alias("n"),
            paid(),
            count_star()
                .filter(lit("NEW").gt(col("status")))
                .build()
                .unwrap()
                .alias("early"),
            min(col("amount")).alias("lo"),
        ])
        .config(config)
        .build_parallel()
        .unwrap()
        .with_min_slice_rows(1)
}

/// The pipeline of [`reference`], with `key` as the group key.
fn pipeline(config: Config, workers: usize, filter: bool, key: Expr) -> Pipeline {
    let agg = reference_aggregate(schema(), key, config);
    let mut stages: Vec<Box<dyn Stage>> = vec![];
    if filter {
        let input = datafusion_common::DFSchema::try_from(schema()).unwrap();
        let f = col("status").not_eq(lit("VOID"));
        stages.push(Box::new(
            CalcStage::try_new(&input, Some(&f), None, schema()).unwrap(),
        ));
    }
    stages.push(Box::new(AggregateStage::new(agg)));
    Pipeline::new(stages, Runtime::new(workers).unwrap())
}

fn final_rows(mut job: Job, batch: usize) -> Vec<String> {
    let mut lines = vec![];
    let mut sink = |b: &ChangeBatch| -> tally::Result<()> {
        lines.extend(format_changes(std::slice::from_ref(b)));
        Ok(())
    };
    job.run(batch, &mut sink, |_, _| {}).unwrap();
    let mut m = Materialized::default();
    m.apply_lines(&lines);
    m.rows()
}

/// The column types the table's reader delivers.
fn types_read(table: &FileTable) -> Vec<DataType> {
    let batch = table.open(64).unwrap().next().unwrap().unwrap();
    batch
        .data
        .columns()
        .iter()
        .map(|c| c.data_type().clone())
        .collect()
}

fn dictionary() -> DataType {
    DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8))
}

#[test]
fn keys_and_comparisons_read_dictionaries_and_match_the_reference() {
    for seed in 0..4u64 {
        let mut rng = StdRng::seed_from_u64(seed);
        let n = rng.random_range(400..2500);
        let rows = random_rows(&mut rng, n);
        let path = temp(&format!("orders-{seed}.parquet"));
        write_parquet(
            &path,
            &rows,
            rng.random_range(90..900),
            WriterProperties::default(),
        );
        for _ in 0..4 {
            let workers = rng.random_range(1..=3);
            let filter = rng.random_bool(0.5);
            let config = runtime_config(
                workers,
                rng.random_bool(0.6),
                [1, 50, 400][rng.random_range(0..3)],
                rng.random_bool(0.7),
            );
            let what = format!("seed {seed}, P={workers}, filter {filter}, {config:?}");
            let p = pipeline(config, workers, filter, col("shop"));
            // shop (a key) and status (compared with literals) may be dictionaries.
            assert_eq!(
                p.dictionary_columns().into_iter().collect::<Vec<_>>(),
                vec![0, 1],
                "{what}"
            );
            let mut t = table(&path);
            t.dictionary_columns = vec!["shop".into(), "status".into()];
            assert_eq!(
                types_read(&t),
                vec![dictionary(), dictionary(), DataType::Int64],
                "{what}"
            );
            let batch = [3, 64, 4096][rng.random_range(0..3)];
            let got = final_rows(Job::new(table(&path), p, None), batch);
            assert_eq!(got, reference(&rows, filter), "{what}");
        }
    }
}

#[test]
fn other_uses_and_undictionaried_files_read_plain_strings() {
    let mut rng = StdRng::seed_from_u64(11);
    let rows = random_rows(&mut rng, 1500);
    let config = || runtime_config(2, true, 100, true);
    // The key used inside an expression (a LIKE): plain strings for it.
    let p = pipeline(config(), 2, false, col("shop").like(lit("shop-1%")));
    assert_eq!(
        p.dictionary_columns().into_iter().collect::<Vec<_>>(),
        vec![1]
    );
    // A file without dictionaries, and one whose dictionary falls back to PLAIN pages.
    let plain = temp("plain.parquet");
    let no_dict = WriterProperties::builder()
        .set_dictionary_enabled(false)
        .build();
    write_parquet(&plain, &rows, 700, no_dict);
    let fallback = temp("fallback.parquet");
    let small = WriterProperties::builder()
        .set_dictionary_page_size_limit(64)
        .set_data_page_row_count_limit(50)
        .set_write_batch_size(50)
        .build();
    write_parquet(&fallback, &rows, 700, small);
    for path in [plain, fallback] {
        let mut t = table(&path);
        t.dictionary_columns = vec!["shop".into()];
        assert_eq!(types_read(&t)[0], DataType::Utf8, "{}", path.display());
        let got = final_rows(
            Job::new(table(&path), pipeline(config(), 2, true, col("shop")), None),
            128,
        );
        assert_eq!(got, reference(&rows, true), "{}", path.display());
    }
}

/// A read batch of a file whose dictionary columns have pages smaller than the batch stops at
/// each page (arrow-rs would otherwise copy the keys once per page it adds to a batch); a file
/// read as plain strings keeps the batch size asked for. The results stay the reference's.
#[test]
fn a_read_batch_stops_at_a_dictionary_page() {
    let mut rng = StdRng::seed_from_u64(21);
    let rows = random_rows(&mut rng, 40_000);
    let path = temp("pages.parquet");
    let pages = WriterProperties::builder()
        .set_data_page_row_count_limit(10_000)
        .build();
    write_parquet(&path, &rows, 40_000, pages);
    let sizes = |t: &FileTable| -> Vec<usize> {
        let batches = t.open(30_000).unwrap();
        batches.map(|b| b.unwrap().data.num_rows()).collect()
    };
    let mut t = table(&path);
    assert_eq!(sizes(&t), vec![30_000, 10_000]);
    t.dictionary_columns = vec!["shop".into(), "status".into()];
    assert_eq!(sizes(&t), vec![10_000; 4]);
    for workers in [1, 2] {
        let config = runtime_config(workers, true, 400, true);
        let p = pipeline(config, workers, true, col("shop"));
        let got = final_rows(Job::new(table(&path), p, None), 30_000);
        assert_eq!(got, reference(&rows, true), "P={workers}");
    }
}

/// A dictionary handed to the aggregate for a column it takes plain (an argument) is refused
/// with the schema named, not misread.
#[test]
fn a_dictionary_where_plain_strings_are_needed_is_an_error() {
    let mut agg = GroupAggregate::builder(schema())
        .group_by([col("amount")])
        .aggregate([min(col("shop")).alias("first")])
        .config(runtime_config(1, false, 10, true))
        .build()
        .unwrap();
    let dict_schema = Arc::new(Schema::new(vec![
        Field::new("shop", dictionary(), true),
        Field::new("status", DataType::Utf8, false),
        Field::new("amount", DataType::Int64, true),
    ]));
    let shop: ArrayRef = Arc::new(
        arrow::array::DictionaryArray::<arrow::datatypes::Int32Type>::from_iter(["a", "b"]),
    );
    let batch = RecordBatch::try_new(
        dict_schema,
        vec![
            shop,
            Arc::new(StringArray::from(vec!["PAID", "NEW"])),
            Arc::new(Int64Array::from(vec![1, 2])),
        ],
    )
    .unwrap();
    let err = agg.push_changes(&ChangeBatch::inserts(batch)).unwrap_err();
    assert!(
        err.to_string().contains("does not match the input schema"),
        "{err}"
    );
}

#[test]
fn a_dictionary_batch_reaches_the_aggregate_as_its_strings() {
    // The library path: a caller hands dictionary-encoded keys and compared columns directly.
    let dict_schema = Arc::new(Schema::new(vec![
        Field::new("shop", dictionary(), true),
        Field::new("status", dictionary(), false),
        Field::new("amount", DataType::Int64, true),
    ]));
    let mut agg = GroupAggregate::builder(schema())
        .group_by([col("shop")])
        .aggregate([count_star().alias("n"), paid()])
        .config(runtime_config(1, false, 100, true))
        .build()
        .unwrap();
    let shop = arrow::array::DictionaryArray::<arrow::datatypes::Int32Type>::from_iter([
        Some("a"),
        None,
        Some("a"),
        Some("b"),
    ]);
    let status = arrow::array::DictionaryArray::<arrow::datatypes::Int32Type>::from_iter([
        "PAID", "PAID", "NEW", "PAID",
    ]);
    let batch = RecordBatch::try_new(
        dict_schema,
        vec![
            Arc::new(shop),
            Arc::new(status),
            Arc::new(Int64Array::from(vec![Some(5), Some(7), Some(100), None])),
        ],
    )
    .unwrap();
    // Two key columns (keys encoded as rows): the dictionary is the same key as its string.
    let mut by_two = GroupAggregate::builder(schema())
        .group_by([col("shop"), col("status")])
        .aggregate([count_star().alias("n")])
        .config(runtime_config(1, false, 100, true))
        .build()
        .unwrap();
    let mut two = by_two
        .push_changes(&ChangeBatch::inserts(batch.clone()))
        .unwrap();
    two.extend(by_two.finish().unwrap());
    let mut m = Materialized::default();
    m.apply(&two);
    assert_eq!(
        m.rows(),
        vec![
            "[a, NEW, 1]",
            "[a, PAID, 1]",
            "[b, PAID, 1]",
            "[null, PAID, 1]"
        ]
    );
    let mut out = agg.push_changes(&ChangeBatch::inserts(batch)).unwrap();
    out.extend(agg.finish().unwrap());
    assert!(
        out.iter()
            .all(|b| b.data.column(0).data_type() == &DataType::Utf8)
    );
    let mut m = Materialized::default();
    m.apply(&out);
    assert_eq!(m.rows(), vec!["[a, 2, 5]", "[b, 1, null]", "[null, 1, 7]"]);
}

/// The pipeline of [`reference`] behind a projection: `shop`, `status` and `amount` passed on
/// bare, `amount + 1` computed, and with `like` a `shop LIKE 'shop-1%'` column besides (which
/// reads `shop` as its strings).
fn projected_pipeline(config: Config, workers: usize, filter: bool, like: bool) -> Pipeline {
    let input = datafusion_common::DFSchema::try_from(schema()).unwrap();
    let mut exprs = vec![
        col("shop"),
        col("status"),
        col("amount"),
        (col("amount") + lit(1i64)).alias("amount1"),
    ];
    let mut fields = schema().fields().to_vec();
    fields.push(Arc::new(Field::new("amount1", DataType::Int64, true)));
    if like {
        exprs.push(col("shop").like(lit("shop-1%")).alias("ones"));
        fields.push(Arc::new(Field::new("ones", DataType::Boolean, true)));
    }
    let projected = Arc::new(Schema::new(fields));
    let f = col("status").not_eq(lit("VOID"));
    let calc = CalcStage::try_new(
        &input,
        filter.then_some(&f),
        Some(&exprs),
        Arc::clone(&projected),
    )
    .unwrap();
    let agg = reference_aggregate(projected, col("shop"), config);
    Pipeline::new(
        vec![Box::new(calc), Box::new(AggregateStage::new(agg))],
        Runtime::new(workers).unwrap(),
    )
}

/// A projection passes a dictionary on where it passes the column on bare: the key and the
/// compared column behind it are read as dictionaries (a column read another way in the
/// projection as plain strings), and the results are the reference's.
#[test]
fn dictionaries_pass_through_a_projection_to_the_aggregate() {
    let mut rng = StdRng::seed_from_u64(23);
    let rows = random_rows(&mut rng, 1800);
    let path = temp("projected.parquet");
    write_parquet(&path, &rows, 500, WriterProperties::default());
    for (workers, pipelined, like) in [(1, true, false), (2, true, true), (3, false, false)] {
        for filter in [false, true] {
            let config = runtime_config(workers, true, 100, pipelined);
            let what = format!("P={workers}, pipelined {pipelined}, LIKE {like}, filter {filter}");
            let p = projected_pipeline(config, workers, filter, like);
            let want: Vec<usize> = if like { vec![1] } else { vec![0, 1] };
            assert_eq!(
                p.dictionary_columns().into_iter().collect::<Vec<_>>(),
                want,
                "{what}"
            );
            let got = final_rows(Job::new(table(&path), p, None), 256);
            assert_eq!(got, reference(&rows, filter), "{what}");
        }
    }
}
