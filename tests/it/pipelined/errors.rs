//! Failures in the pipelined runtime: an error in one split, or a failing sink, ends the run
//! with that error.

use rand::SeedableRng;
use rand::rngs::StdRng;
use tally::changelog::ChangeBatch;
use tally::source::Format;

use super::{Settings, job, random_rows, table, temp, write_parquet};

/// A value that fails to evaluate, in one split: the run ends with that error (no hang, no
/// panic), whichever worker reads it.
#[test]
fn an_error_in_one_split_ends_the_run_with_it() {
    let mut rng = StdRng::seed_from_u64(11);
    let mut rows = random_rows(&mut rng, 3000);
    rows[2500].s = "not a number".into();
    let path = temp("bad.parquet");
    write_parquet(&path, &rows, 500);
    for workers in 1..=4 {
        let s = Settings {
            workers,
            two_phase: workers % 2 == 0,
            size: 100,
            adaptive_probe: false,
            pipelined: true,
            batch: 128,
            filter: false,
            splits: 1,
        };
        let mut sink = |_: &ChangeBatch| -> tally::Result<()> { Ok(()) };
        let err = job(table(&path, Format::Parquet), &s)
            .run(s.batch, &mut sink, |_, _| {})
            .unwrap_err();
        assert!(
            err.to_string().contains("not a number"),
            "{workers} workers: {err}"
        );
    }
}

/// A sink that fails stops every task: the run ends with the sink's error.
#[test]
fn a_failing_sink_stops_the_run() {
    let mut rng = StdRng::seed_from_u64(12);
    let rows = random_rows(&mut rng, 3000);
    let path = temp("sink.parquet");
    write_parquet(&path, &rows, 300);
    let s = Settings {
        workers: 3,
        two_phase: true,
        size: 50,
        adaptive_probe: false,
        pipelined: true,
        batch: 64,
        filter: true,
        splits: 1,
    };
    let mut written = 0;
    let mut sink = |_: &ChangeBatch| -> tally::Result<()> {
        written += 1;
        if written == 3 {
            return Err(tally::Error::io("disk full"));
        }
        Ok(())
    };
    let err = job(table(&path, Format::Parquet), &s)
        .run(s.batch, &mut sink, |_, _| {})
        .unwrap_err();
    assert!(err.to_string().contains("disk full"), "{err}");
}
