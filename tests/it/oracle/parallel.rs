//! The invariant for two phases and the parallel runtime: local phases feeding a global one
//! through Arrow IPC, and `ParallelAggregate` over 1 to 4 workers, one and two phases, the
//! adaptive local phase on and off.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{
    KEY_CASES, KeyType, Keys, aggregates, key_exprs, parallel_aggregate, random_stream, reference,
    schema, to_batch,
};
use crate::common::{Materialized, config, soaking, test_seed};

/// Local-global: the input of each mini-batch is split over `workers` local phases (round-robin
/// slices), their accumulator batches travel through Arrow IPC to one global phase, and the
/// changelog it emits must give the reference's result at every mini-batch boundary.
fn check_two_phase(
    seed: u64,
    retractions: bool,
    keys: Keys,
    key_type: KeyType,
    mini_batch: usize,
    workers: usize,
) {
    use std::sync::Arc;
    use tally::operator::LocalGroupAggregate;
    use tally::plan::AggregatePlan;

    let ctx = format!(
        "two-phase seed {seed} retractions {retractions} {keys:?} {key_type:?} size {mini_batch} workers {workers}"
    );
    let mut rng = StdRng::seed_from_u64(test_seed(seed));
    let stream = random_stream(&mut rng, 400, retractions, 8);
    let schema = schema(key_type, retractions);
    let plan = Arc::new(
        AggregatePlan::try_new(schema.clone(), &key_exprs(keys), &aggregates(), None).unwrap(),
    );
    let mut locals: Vec<LocalGroupAggregate> = (0..workers)
        .map(|_| LocalGroupAggregate::try_new(Arc::clone(&plan)).unwrap())
        .collect();
    let config = tally::Config::from_pairs([
        ("table.exec.mini-batch.enabled", "true"),
        ("table.exec.mini-batch.allow-latency", "1 s"),
        ("table.exec.mini-batch.size", "1000000000"),
    ])
    .unwrap();
    let clock = Arc::new(tally::clock::ManualClock::new(0));
    let mut global =
        tally::GroupAggregate::try_new_global(Arc::clone(&plan), config, clock).unwrap();
    let mut view = Materialized::default();
    let mut start = 0;
    while start < stream.len() {
        let end = (start + mini_batch).min(stream.len());
        // Slices of the mini-batch, dealt round-robin in chunks of 5 rows.
        for (i, chunk) in stream[start..end].chunks(5).enumerate() {
            let batch = to_batch(&schema, key_type, chunk, rng.random_bool(0.5));
            locals[i % workers].push(&batch).unwrap();
        }
        for local in &mut locals {
            if let Some(acc) = local.flush().unwrap() {
                // Through Arrow IPC, as a global phase elsewhere would receive it.
                let mut buf = vec![];
                {
                    let mut w =
                        arrow::ipc::writer::StreamWriter::try_new(&mut buf, &acc.schema()).unwrap();
                    w.write(&acc).unwrap();
                    w.finish().unwrap();
                }
                let r = arrow::ipc::reader::StreamReader::try_new(std::io::Cursor::new(buf), None)
                    .unwrap();
                for b in r {
                    view.apply(&global.push_accumulators(&b.unwrap()).unwrap());
                }
            }
        }
        view.apply(&global.finish().unwrap());
        start = end;
        assert_eq!(
            view.rows(),
            reference(&stream[..end], keys),
            "{ctx}: after {end} rows"
        );
    }
}

#[test]
fn local_global_matches_reference() {
    let mut seed = 2000;
    for retractions in [false, true] {
        for (keys, kt) in KEY_CASES {
            for (size, workers) in [(1, 1), (7, 2), (50, 3), (400, 4)] {
                seed += 1;
                check_two_phase(seed, retractions, keys, kt, size, workers);
            }
        }
    }
}

#[test]
fn global_phase_needs_mini_batch() {
    use std::sync::Arc;
    let plan = Arc::new(
        tally::plan::AggregatePlan::try_new(
            schema(KeyType::Utf8, false),
            &key_exprs(Keys::One),
            &aggregates(),
            None,
        )
        .unwrap(),
    );
    let e = tally::GroupAggregate::try_new_global(
        plan,
        tally::Config::default(),
        Arc::new(tally::clock::SystemClock),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("Local-Global optimization is only worked in miniBatch mode"),
        "{e}"
    );
}

/// How a [`tally::ParallelAggregate`] is set up for [`check_parallel`].
#[derive(Debug, Clone, Copy)]
struct Parallel {
    workers: usize,
    two_phase: bool,
    /// `Some((threshold, min rows, probe interval))`: the adaptive local phase with these
    /// settings; `None`: adaptive off.
    adaptive: Option<(f64, u64, u64)>,
    /// `Some((latency ms, largest step))`: the clock moves forward by up to `largest step` ms
    /// before each push, and mini-batches also fire when it crosses a `latency` boundary.
    /// `None`: the clock stands still (only the size trigger fires).
    clock: Option<(i64, i64)>,
}

/// The invariant for the parallel runtime: random streams pushed as random slices through P
/// workers, one or two phases, adaptive local phase on or off, give the reference's result at
/// every mini-batch boundary (mini-batches end after exactly `size` × P input rows).
fn check_parallel(
    seed: u64,
    retractions: bool,
    keys: Keys,
    key_type: KeyType,
    mini_batch: Option<usize>,
    par: Parallel,
) -> tally::AggregateMetrics {
    let ctx = format!(
        "parallel seed {seed} retractions {retractions} {keys:?} {key_type:?} mini-batch {mini_batch:?} {par:?}"
    );
    let mut cfg = config(mini_batch, true);
    cfg.parallelism = par.workers;
    // Key groups: Flink's default, one per worker, or a count that does not divide evenly.
    cfg.max_parallelism = [-1, par.workers as i64, 7 * par.workers as i64 + 3][seed as usize % 3];
    match par.adaptive {
        Some((threshold, min_rows, probe)) => {
            cfg.adaptive_threshold = threshold;
            cfg.adaptive_min_rows = min_rows;
            cfg.adaptive_probe_interval = probe;
        }
        None => cfg.adaptive_local = false,
    }
    if !par.two_phase {
        cfg.agg_phase_strategy = tally::config::AggPhaseStrategy::OnePhase;
    }
    if let Some((latency, _)) = par.clock {
        cfg.set("table.exec.mini-batch.allow-latency", &latency.to_string())
            .unwrap();
    }
    let mut rng = StdRng::seed_from_u64(test_seed(seed));
    let stream = random_stream(&mut rng, 300, retractions, 12);
    let schema = schema(key_type, retractions);
    let clock = tally::clock::ManualClock::new(0);
    let mut agg = parallel_aggregate(&schema, keys, cfg, &clock);
    assert_eq!(agg.is_two_phase(), par.two_phase, "{ctx}");
    let mut view = Materialized::default();
    let mut pushed = 0;
    // Where the current mini-batch began (the rows before it have fired): a mini-batch ends
    // after `size` × P rows, or when the clock crosses a latency boundary (before the rows of
    // that push), which starts the next one from there.
    let mut mini_batch_start = 0;
    let mut last_interval = i64::MIN;
    let mut latency_fires = 0;
    while pushed < stream.len() {
        if let Some((latency, step)) = par.clock {
            clock.advance_ms(rng.random_range(0..=step));
            let now = tally::clock::Clock::now_ms(&clock);
            let interval = now - now.rem_euclid(latency);
            if mini_batch.is_some() && interval > last_interval {
                last_interval = interval;
                latency_fires += usize::from(pushed > mini_batch_start);
                mini_batch_start = pushed;
            }
        }
        let n = rng.random_range(0..=60).min(stream.len() - pushed);
        let batch = to_batch(
            &schema,
            key_type,
            &stream[pushed..pushed + n],
            rng.random_bool(0.5),
        );
        // Cut into 1..=5 consecutive slices (empty ones included).
        let mut cuts: Vec<usize> = (0..rng.random_range(0..5))
            .map(|_| rng.random_range(0..=n))
            .collect();
        cuts.push(0);
        cuts.push(n);
        cuts.sort_unstable();
        let slices = cuts
            .windows(2)
            .map(|w| {
                agg.plan()
                    .to_changes(&batch.slice(w[0], w[1] - w[0]))
                    .unwrap()
            })
            .collect();
        view.apply(&agg.push_slices(slices).unwrap());
        pushed += n;
        // A mini-batch is `size` rows per worker.
        let fired = match mini_batch {
            None => pushed,
            Some(size) => {
                let rows = size * par.workers;
                mini_batch_start += (pushed - mini_batch_start) / rows * rows;
                mini_batch_start
            }
        };
        assert_eq!(
            view.rows(),
            reference(&stream[..fired], keys),
            "{ctx}: after {pushed} rows"
        );
    }
    view.apply(&agg.finish().unwrap());
    let expected = reference(&stream, keys);
    assert_eq!(view.rows(), expected, "{ctx}: at the end");
    if par.clock.is_some() && mini_batch.is_some_and(|s| s > 1) {
        assert!(
            latency_fires > 0,
            "{ctx}: the clock never ended a mini-batch"
        );
    }
    let m = agg.metrics().unwrap();
    assert_eq!(m.rows_in, stream.len() as u64, "{ctx}: rows in");
    assert_eq!(
        m.keys_in_state,
        expected.len() as u64,
        "{ctx}: keys in state"
    );
    assert_eq!(m.workers.len(), par.workers, "{ctx}");
    let input: u64 = m.workers.iter().map(|w| w.input_rows).sum();
    assert_eq!(input, stream.len() as u64, "{ctx}: input rows over workers");
    assert!(
        m.skew_ratio >= 1.0 && m.skew_ratio <= par.workers as f64,
        "{ctx}: {m}"
    );
    if matches!(keys, Keys::One) {
        assert_eq!(m.hot_keys[0].0, "7", "{ctx}: hottest key\n{m}");
    }
    m
}

#[test]
fn parallel_strategies_match_reference() {
    let mut seed = 3000;
    // What the adaptive local phase with small thresholds did over the matrix: every path
    // (bypassed, probed again) must have been taken for the matrix to test it.
    let (mut bypasses, mut probes, mut bypassed_rows) = (0, 0, 0);
    for retractions in [false, true] {
        for (keys, kt) in [
            (Keys::One, KeyType::Utf8),
            (Keys::Two, KeyType::Dictionary),
            (Keys::One, KeyType::Int64),
            (Keys::Global, KeyType::Utf8),
        ] {
            for workers in 1..=4 {
                for mb in [None, Some(1), Some(17), Some(100_000)] {
                    let phases: &[bool] = if mb.is_some() {
                        &[false, true]
                    } else {
                        &[false]
                    };
                    for &two_phase in phases {
                        let adaptive: &[Option<(f64, u64, u64)>] = if two_phase {
                            &[None, Some((0.3, 10, 40)), Some((0.8, 100_000, 1_000_000))]
                        } else {
                            &[None]
                        };
                        for &adaptive in adaptive {
                            seed += 1;
                            // Every other case moves the clock: the latency trigger fires too.
                            let par = Parallel {
                                workers,
                                two_phase,
                                adaptive,
                                clock: (seed % 2 == 0).then_some((10, 8)),
                            };
                            let m = check_parallel(seed, retractions, keys, kt, mb, par);
                            if let (Some((0.3, ..)), Some(local)) = (adaptive, m.local) {
                                bypasses += local.bypass_decisions;
                                probes += local.probes;
                                bypassed_rows += local.rows_bypassed;
                            }
                        }
                    }
                }
            }
        }
    }
    eprintln!("adaptive: bypasses {bypasses}, probes {probes}, rows bypassed {bypassed_rows}");
    assert!(
        soaking() || (bypasses > 20 && probes > 10 && bypassed_rows > 1000),
        "bypasses {bypasses}, probes {probes}, rows bypassed {bypassed_rows}"
    );
}

#[test]
fn adaptive_local_phase_bypasses_and_probes_again() {
    // Small thresholds so that 300 rows in mini-batches of 17 per worker see several decisions.
    let par = Parallel {
        workers: 2,
        two_phase: true,
        adaptive: Some((0.3, 10, 40)),
        clock: None,
    };
    let m = check_parallel(1, true, Keys::Two, KeyType::Utf8, Some(17), par);
    let local = m.local.clone().unwrap();
    if !soaking() {
        assert!(local.bypass_decisions > 0, "{m}");
        assert!(local.probes > 0, "{m}");
        assert!(local.rows_bypassed > 0 && local.rows_in > 0, "{m}");
        assert!(local.last_ratio.is_some_and(|r| r > 0.3), "{m}");
    }
    assert_eq!(local.rows_in + local.rows_bypassed, m.rows_in, "{m}");
    // Adaptive off: the local phase folds every row.
    let par = Parallel {
        adaptive: None,
        ..par
    };
    let m = check_parallel(1, true, Keys::Two, KeyType::Utf8, Some(17), par);
    let local = m.local.clone().unwrap();
    assert_eq!(
        (local.rows_in, local.rows_bypassed, local.bypass_decisions),
        (m.rows_in, 0, 0),
        "{m}"
    );
}
