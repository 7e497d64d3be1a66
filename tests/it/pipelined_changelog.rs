//! Changelog inputs on the pipelined runtime: the file is cut into chunks dealt to the splits in
//! turn, and every worker applies the chunks in input order, so that a key's updates that cross
//! chunk and split boundaries (`-U` in one chunk, `+U` in the next, a delete far after the
//! insert) give the row-at-a-time reference's final table under every P, phase strategy, chunk
//! and batch size; the changelog is the same on every run, and the same from a CSV file of the
//! stream (chunks of records, cut by one scan of its lines) and from an Arrow IPC file of it
//! (the record batches that hold each chunk, found from their headers).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use arrow::array::{ArrayRef, Int8Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion_expr::col;
use parquet::arrow::ArrowWriter;
use parquet::file::properties::WriterProperties;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tally::changelog::ChangeBatch;
use tally::operator::ParallelAggregate;
use tally::operator::pipelined::InputOrder;
use tally::pipeline::{AggregateStage, Pipeline, Stage};
use tally::run::Job;
use tally::runtime::Runtime;
use tally::source::{FileTable, Format};
use tally::{Config, GroupAggregate};

use crate::common::{changelog_stream, format_changes, runtime_config, test_seed};
use crate::pipelined::{Row, aggregates, batch, final_rows, random_rows, reference, schema, temp};

/// A changelog over a few keys (a hot one among them): inserts, deletes of live rows, and
/// `-U`/`+U` updates of live rows keeping the key; `true` marks a retraction.
fn stream(rng: &mut StdRng, n: usize) -> Vec<(bool, Row)> {
    changelog_stream(
        rng,
        n,
        true,
        |rng| random_rows(rng, 1).remove(0),
        |old, new| new.k = old.k.clone(),
    )
}

/// The rows live at the end of `stream`.
fn live(stream: &[(bool, Row)]) -> Vec<Row> {
    let mut counts: BTreeMap<&Row, i64> = BTreeMap::new();
    for (retract, row) in stream {
        *counts.entry(row).or_default() += if *retract { -1 } else { 1 };
    }
    let mut out = vec![];
    for (row, n) in counts {
        assert!(n >= 0, "the stream retracts a row it never inserted");
        out.extend(std::iter::repeat_n(row.clone(), n as usize));
    }
    out
}

fn record_schema() -> SchemaRef {
    let mut fields = vec![Field::new("op", DataType::Int8, false)];
    fields.extend(schema().fields().iter().map(|f| f.as_ref().clone()));
    Arc::new(Schema::new(fields))
}

/// Writes the stream with its row kinds (`+I` for an insert, `-D` for a retraction) in `op`.
fn write_changelog(path: &Path, stream: &[(bool, Row)], row_group: usize) {
    let props = WriterProperties::builder()
        .set_max_row_group_row_count(Some(row_group))
        .build();
    let file = std::fs::File::create(path).unwrap();
    let mut w = ArrowWriter::try_new(file, record_schema(), Some(props)).unwrap();
    for chunk in stream.chunks(777) {
        w.write(&record_batch(chunk)).unwrap();
    }
    w.close().unwrap();
}

/// Rows of the stream as a batch of [`record_schema`], `op` 0 (`+I`) or 3 (`-D`).
fn record_batch(rows: &[(bool, Row)]) -> RecordBatch {
    let ops: ArrayRef = Arc::new(Int8Array::from_iter_values(
        rows.iter().map(|(retract, _)| if *retract { 3 } else { 0 }),
    ));
    let data: Vec<Row> = rows.iter().map(|(_, r)| r.clone()).collect();
    let mut cols = vec![ops];
    cols.extend(batch(&data).columns().iter().cloned());
    RecordBatch::try_new(record_schema(), cols).unwrap()
}

/// Writes the stream as CSV, its row kinds as `+I` / `-D` in `op`, with blank lines (which
/// are no records) and `\r\n` line ends sprinkled in.
fn write_changelog_csv(path: &Path, stream: &[(bool, Row)], rng: &mut StdRng) {
    let mut fields = vec![Field::new("op", DataType::Utf8, false)];
    fields.extend(schema().fields().iter().map(|f| f.as_ref().clone()));
    let csv_schema = Arc::new(Schema::new(fields));
    let mut bytes = vec![];
    {
        let mut w = arrow::csv::WriterBuilder::new()
            .with_header(true)
            .build(&mut bytes);
        for chunk in stream.chunks(777) {
            let rows: Vec<Row> = chunk.iter().map(|(_, r)| r.clone()).collect();
            let ops: ArrayRef = Arc::new(arrow::array::StringArray::from_iter_values(
                chunk
                    .iter()
                    .map(|(retract, _)| if *retract { "-D" } else { "+I" }),
            ));
            let mut cols = vec![ops];
            cols.extend(batch(&rows).columns().iter().cloned());
            w.write(&RecordBatch::try_new(Arc::clone(&csv_schema), cols).unwrap())
                .unwrap();
        }
    }
    let text = String::from_utf8(bytes).unwrap();
    let mut out = String::new();
    for (i, line) in text.lines().enumerate() {
        out.push_str(line);
        out.push_str(if i > 0 && rng.random_bool(0.05) {
            "\r\n"
        } else {
            "\n"
        });
        if i > 0 && rng.random_bool(0.02) {
            out.push_str(if rng.random_bool(0.5) { "\n" } else { "\r\n\n" });
        }
    }
    // No line end after the last record, now and then.
    if rng.random_bool(0.5) {
        out.truncate(out.trim_end().len());
    }
    assert!(!out.contains('"'), "a quote would make the file one split");
    std::fs::write(path, out).unwrap();
}

/// Writes the stream as an Arrow IPC file in record batches of random sizes, empty ones among
/// them.
fn write_changelog_arrow(path: &Path, stream: &[(bool, Row)], rng: &mut StdRng) {
    let file = std::fs::File::create(path).unwrap();
    let mut w = arrow::ipc::writer::FileWriter::try_new(file, &record_schema()).unwrap();
    let mut rest = stream;
    while !rest.is_empty() {
        let n = [0, 1, 37, 500, 3000][rng.random_range(0..5)].min(rest.len());
        let (chunk, tail) = rest.split_at(n);
        rest = tail;
        w.write(&record_batch(chunk)).unwrap();
    }
    w.finish().unwrap();
}

fn table(path: &Path) -> FileTable {
    table_of(path, Format::Parquet)
}

fn table_of(path: &Path, format: Format) -> FileTable {
    FileTable {
        name: "t".into(),
        schema: schema(),
        path: path.to_path_buf(),
        format,
        changelog_column: Some("op".into()),
        time_column: None,
        unread_columns: vec![],
        dictionary_columns: vec![],
    }
}

fn config(workers: usize, two_phase: bool, size: usize, pipelined: bool) -> Config {
    let mut config = runtime_config(workers, two_phase, size, pipelined);
    if two_phase && size > 1 {
        // A local phase that flips between folding and stepping aside: in one round some
        // sources send accumulator rows and others raw rows.
        for (k, v) in [
            ("tally.exec.local-agg.adaptive.threshold", "0.3"),
            ("tally.exec.local-agg.adaptive.min-rows", "20"),
            ("tally.exec.local-agg.adaptive.probe-interval", "40"),
        ] {
            config.set(k, v).unwrap();
        }
    }
    config
}

fn aggregate(config: Config) -> ParallelAggregate {
    GroupAggregate::builder(record_schema())
        .changelog_column("op")
        .group_by([col("k")])
        .aggregate(aggregates())
        .config(config)
        .build_parallel()
        .unwrap()
        .with_min_slice_rows(1)
}

/// Runs `agg` over the file (of `format`) in chunks of `chunk` rows dealt to `per_worker`
/// splits per worker (its threads taking turns on them); returns the changelog lines.
fn run_chunks(
    agg: &mut ParallelAggregate,
    path: &Path,
    format: Format,
    (chunk, per_worker): (usize, usize),
    batch: usize,
) -> Vec<String> {
    let splits = table_of(path, format)
        .open_chunked_splits(batch, agg.parallelism() * per_worker, chunk, 0)
        .unwrap();
    let splits: Vec<tally::operator::pipelined::Split> = splits
        .into_iter()
        .map(|s| -> tally::operator::pipelined::Split { Box::new(s) })
        .collect();
    let mut lines = vec![];
    agg.run_splits(
        splits,
        InputOrder::Chunks(chunk),
        &|b| Ok(vec![b]),
        &mut |b| {
            lines.extend(format_changes(std::slice::from_ref(&b)));
            Ok(())
        },
    )
    .unwrap();
    lines
}

#[test]
fn chunks_in_turn_keep_each_keys_rows_in_input_order() {
    for seed in 0..5u64 {
        let mut rng = StdRng::seed_from_u64(test_seed(100 + seed));
        let n = rng.random_range(1500..4000);
        let stream = stream(&mut rng, n);
        let expected = reference(&live(&stream));
        let path = temp(&format!("changelog-{seed}.parquet"));
        write_changelog(&path, &stream, rng.random_range(200..1500));
        let csv = temp(&format!("changelog-{seed}.csv"));
        write_changelog_csv(&csv, &stream, &mut rng);
        let arrow = temp(&format!("changelog-{seed}.arrow"));
        write_changelog_arrow(&arrow, &stream, &mut rng);
        for _ in 0..4 {
            let workers = rng.random_range(1..=4);
            let two_phase = rng.random_bool(0.6);
            let size = [1, 10, 300][rng.random_range(0..3)];
            let chunk = [3, 50, 400][rng.random_range(0..3)];
            let batch = [7, 128, 4096][rng.random_range(0..3)];
            // More splits than workers: the threads take turns on them.
            let per_worker = rng.random_range(1..=3);
            let what = format!(
                "seed {seed}: P={workers} two-phase {two_phase} size {size} chunk {chunk} batch {batch} splits per worker {per_worker}"
            );
            let chunk = (chunk, per_worker);
            let mut agg = aggregate(config(workers, two_phase, size, true));
            let lines = run_chunks(&mut agg, &path, Format::Parquet, chunk, batch);
            assert_eq!(final_rows(&lines), expected, "{what}");
            let mut again = aggregate(config(workers, two_phase, size, true));
            assert_eq!(
                run_chunks(&mut again, &path, Format::Parquet, chunk, batch),
                lines,
                "{what}: again"
            );
            // The CSV file's chunks hold the same rows (its blank lines are no records), so
            // the changelog is the same.
            let mut from_csv = aggregate(config(workers, two_phase, size, true));
            assert_eq!(
                run_chunks(&mut from_csv, &csv, Format::Csv, chunk, batch),
                lines,
                "{what}: CSV"
            );
            // And the Arrow file's, whatever its record batches.
            let mut from_arrow = aggregate(config(workers, two_phase, size, true));
            assert_eq!(
                run_chunks(&mut from_arrow, &arrow, Format::Arrow, chunk, batch),
                lines,
                "{what}: Arrow"
            );
        }
    }
}

#[test]
fn a_changelog_in_splits_of_any_order_is_refused() {
    let mut rng = StdRng::seed_from_u64(9);
    let path = temp("changelog-any.parquet");
    write_changelog(&path, &stream(&mut rng, 300), 100);
    let mut agg = aggregate(config(2, true, 10, true));
    let splits: Vec<tally::operator::pipelined::Split> = table(&path)
        .open_splits(64, 2)
        .unwrap()
        .into_iter()
        .map(|s| -> tally::operator::pipelined::Split { Box::new(s) })
        .collect();
    let err = agg
        .run_splits(splits, InputOrder::Any, &|b| Ok(vec![b]), &mut |_| Ok(()))
        .unwrap_err();
    assert!(err.to_string().contains("input order"), "{err}");
}

/// A job aggregating the changelog file at `path` on `workers` workers, two-phase, mini-batches
/// of 5 000 rows.
fn changelog_job(path: &Path, workers: usize, pipelined: bool) -> Job {
    let format = match path.extension().and_then(|e| e.to_str()) {
        Some("csv") => Format::Csv,
        Some("arrow") => Format::Arrow,
        _ => Format::Parquet,
    };
    let agg = aggregate(config(workers, true, 5000, pipelined));
    Job::new(
        table_of(path, format),
        Pipeline::new(
            vec![Box::new(AggregateStage::new(agg)) as Box<dyn Stage>],
            Runtime::new(workers).unwrap(),
        ),
        None,
    )
}

/// Runs `job` in batches of 4096 rows; returns its stats and changelog lines.
fn run_job(job: &mut Job) -> (tally::run::RunStats, Vec<String>) {
    let mut lines = vec![];
    let mut sink = |b: &ChangeBatch| -> tally::Result<()> {
        lines.extend(format_changes(std::slice::from_ref(b)));
        Ok(())
    };
    let stats = job.run(4096, &mut sink, |_, _| {}).unwrap();
    (stats, lines)
}

/// Through a job: a changelog file of three chunks, Parquet, CSV or Arrow, runs pipelined at P = 2
/// (the chunk is 65 536 rows there) and gives the reference; the ordered runtime gives it too.
#[test]
fn a_changelog_file_runs_pipelined_in_a_job() {
    let mut rng = StdRng::seed_from_u64(21);
    let stream = stream(&mut rng, 140_000);
    let expected = reference(&live(&stream));
    let path = temp("changelog-job.parquet");
    write_changelog(&path, &stream, 50_000);
    let csv = temp("changelog-job.csv");
    write_changelog_csv(&csv, &stream, &mut rng);
    let arrow = temp("changelog-job.arrow");
    write_changelog_arrow(&arrow, &stream, &mut rng);
    for path in [&path, &csv, &arrow] {
        for (pipelined, runtime) in [(true, "pipelined (2 splits)"), (false, "ordered")] {
            let (stats, lines) = run_job(&mut changelog_job(path, 2, pipelined));
            assert!(stats.runtime.starts_with(runtime), "{}", stats.runtime);
            assert_eq!(stats.rows_in, stream.len() as u64);
            assert_eq!(final_rows(&lines), expected, "{runtime} {path:?}");
        }
    }
}

/// Checkpoints on the pipelined runtime at P = 2: taken at the end of a round of chunks (the
/// rows applied are the first 131 072 of the file, then all 140 000), and resumed on 1, 2 and 3
/// workers, the output before the checkpoint plus the resumed run's give the reference (from
/// the last one there is nothing left to read); restored over a shorter file, the run fails
/// naming the position.
#[test]
fn pipelined_checkpoints_resume_at_any_parallelism() {
    let mut rng = StdRng::seed_from_u64(22);
    let stream = stream(&mut rng, 140_000);
    let path = temp("changelog-checkpoints.parquet");
    write_changelog(&path, &stream, 30_000);
    let short = temp("changelog-short.parquet");
    write_changelog(&short, &stream[..100_000], 30_000);
    resume_at_any_parallelism(&stream, &path, &short, "parquet");
    let csv = temp("changelog-checkpoints.csv");
    write_changelog_csv(&csv, &stream, &mut rng);
    let short_csv = temp("changelog-short.csv");
    write_changelog_csv(&short_csv, &stream[..100_000], &mut rng);
    resume_at_any_parallelism(&stream, &csv, &short_csv, "csv");
    let arrow = temp("changelog-checkpoints.arrow");
    write_changelog_arrow(&arrow, &stream, &mut rng);
    let short_arrow = temp("changelog-short.arrow");
    write_changelog_arrow(&short_arrow, &stream[..100_000], &mut rng);
    resume_at_any_parallelism(&stream, &arrow, &short_arrow, "arrow");
}

/// The body of [`pipelined_checkpoints_resume_at_any_parallelism`] over the file at `path`
/// (the stream) and `short` (its first 100 000 rows).
fn resume_at_any_parallelism(stream: &[(bool, Row)], path: &Path, short: &Path, name: &str) {
    let expected = reference(&live(stream));
    let dir = temp(&format!("checkpoints-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    let store = tally::checkpoint::CheckpointDir::new(dir.to_path_buf()).retain(10);
    let mut first = changelog_job(path, 2, true);
    first.checkpoint_every(store.clone(), 70_000).unwrap();
    let (stats, full) = run_job(&mut first);
    assert_eq!(stats.runtime, "pipelined (2 splits)", "{name}");
    assert_eq!(final_rows(&full), expected, "{name}");
    assert_eq!(stats.checkpoints, 2, "{name}: {stats:?}");
    let checkpoints = store.list().unwrap();
    for ((_, folder), position) in checkpoints.iter().zip([131_072u64, 140_000]) {
        for workers in 1..=3 {
            let mut resumed = changelog_job(path, workers, true);
            let chk = resumed.restore(folder).unwrap();
            assert_eq!(chk.meta("source.rows").unwrap(), position.to_string());
            let delivered: usize = chk.meta("output.rows").unwrap().parse().unwrap();
            let (stats, rest) = run_job(&mut resumed);
            assert!(stats.runtime.starts_with("pipelined"), "{}", stats.runtime);
            assert_eq!(
                stats.rows_in,
                140_000 - position,
                "{name}: {workers} workers"
            );
            let mut lines = full[..delivered].to_vec();
            lines.extend(rest);
            assert_eq!(
                final_rows(&lines),
                expected,
                "{name}: resumed at {position} on {workers} workers"
            );
        }
    }
    // Restored over a shorter input, on either runtime: an error naming the position.
    let (_, folder) = &checkpoints[0];
    for pipelined in [true, false] {
        let mut resumed = changelog_job(short, 2, pipelined);
        resumed.restore(folder).unwrap();
        let mut sink = |_: &ChangeBatch| -> tally::Result<()> { Ok(()) };
        let err = resumed
            .run(4096, &mut sink, |_, _| {})
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("source position (131072 rows) is past the end")
                && err.contains("(100000 rows)"),
            "{name}, pipelined {pipelined}: {err}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A split that fails stops the rounds at the first one it cannot complete: the checkpoints
/// delivered are those of every whole round before its failed chunk (a prefix of the input),
/// on every run, however far the other split has read (it reads on to the end of those rounds,
/// or stops there); none claims the rows of a round that lacks the failed split's chunk.
#[test]
fn a_failing_split_ends_the_checkpoints_at_its_last_whole_round() {
    let mut rng = StdRng::seed_from_u64(23);
    let path = temp("changelog-failing.parquet");
    write_changelog(&path, &stream(&mut rng, 2000), 400);
    let chunk = 50;
    // Batches of one chunk or of up to three (a batch then ends several epochs, sent
    // together); the second split reads two batches, then fails.
    for batch in [chunk, 3 * chunk] {
        for workers in [2, 3] {
            for slow in [false, true] {
                for _ in 0..5 {
                    let (positions, read) =
                        checkpoints_before_a_failure(&path, workers, chunk, batch, slow);
                    // Every round before the failed chunk (one per chunk the failing split
                    // read), and none after, whatever the timing.
                    let rounds = (read / chunk) as u64;
                    assert!(rounds >= 2, "{read} rows");
                    let want: Vec<u64> = (1..=rounds).map(|r| r * 2 * chunk as u64).collect();
                    assert_eq!(
                        positions, want,
                        "batch {batch}, {workers} workers, slow first split: {slow}"
                    );
                }
            }
        }
    }
}

/// The checkpoints (rows applied) of a run over two splits of `path` on `workers` workers,
/// checkpointing every round, where the first split reads slowly or not and the second reads
/// two batches of up to `batch` rows, then fails; and the rows those two batches held.
fn checkpoints_before_a_failure(
    path: &Path,
    workers: usize,
    chunk: usize,
    batch: usize,
    slow: bool,
) -> (Vec<u64>, usize) {
    let mut agg = aggregate(config(workers, true, 10, true));
    let mut splits = table(path)
        .open_chunked_splits(batch, 2, chunk, 0)
        .unwrap()
        .into_iter();
    let first = splits.next().unwrap();
    let first: tally::operator::pipelined::Split = Box::new(first.inspect(move |_| {
        if slow {
            std::thread::sleep(std::time::Duration::from_millis(3));
        }
    }));
    let read = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = Arc::clone(&read);
    let failing: tally::operator::pipelined::Split = Box::new(
        splits
            .next()
            .unwrap()
            .take(2)
            .inspect(move |b| {
                let rows = b.as_ref().map_or(0, |b| b.num_rows());
                counted.fetch_add(rows, std::sync::atomic::Ordering::Relaxed);
            })
            .chain(std::iter::once(Err(tally::Error::invalid_input(
                "bad input in the second split",
            )))),
    );
    let mut positions = vec![];
    let err = agg
        .run_splits_checkpointed(
            vec![first, failing],
            InputOrder::Chunks(chunk),
            Some(1),
            &|b| Ok(vec![b]),
            None,
            &mut |d| {
                if let tally::operator::pipelined::Delivery::Checkpoint { rows, .. } = d {
                    positions.push(rows);
                }
                Ok(())
            },
        )
        .unwrap_err();
    assert!(err.to_string().contains("bad input"), "{err}");
    (positions, read.load(std::sync::atomic::Ordering::Relaxed))
}
