//! The invariant across a checkpoint: a parallel aggregate snapshotted mid-stream and restored
//! into one of another parallelism and strategy; a snapshot of another query is refused.

use datafusion_expr::col;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tally::aggregates::{count_star, max, sum};

use super::{KEY_CASES, KeyType, parallel_aggregate, random_stream, reference, schema, to_batch};
use crate::common::{Materialized, config};

/// Checkpoint round trip: a random stream is pushed through a parallel aggregate; at a random
/// point its mini-batch is finished (the changes delivered) and its state snapshotted, and a fresh
/// aggregate with another parallelism and strategy restored from the snapshot takes the rest.
/// The changelog of both, applied in order, must equal the reference over the whole stream
/// (every accumulator kind: COUNT, SUM, AVG, MIN/MAX multisets under retraction, FILTERs and
/// DISTINCT value sets, record counts for retractions after the restore).
#[test]
fn snapshot_and_restore_resume_the_aggregation() {
    let mut seed = 5000;
    for retractions in [false, true] {
        for (keys, key_type) in KEY_CASES {
            for (before, after) in [
                ((1, Some(7), false), (3, Some(5), true)),
                ((2, None, false), (1, Some(100_000), true)),
                ((3, Some(4), true), (2, None, false)),
            ] {
                seed += 1;
                let ctx = format!(
                    "seed {seed} retractions {retractions} {keys:?} {key_type:?} {before:?} -> {after:?}"
                );
                let mut rng = StdRng::seed_from_u64(seed);
                let stream = random_stream(&mut rng, 400, retractions, 40);
                let schema = schema(key_type, retractions);
                let make = |(workers, mini_batch, two_phase): (usize, Option<usize>, bool)| {
                    let mut cfg = config(mini_batch, true);
                    cfg.parallelism = workers;
                    if retractions {
                        // TTL timestamps travel in the snapshot too (the clock stands still).
                        cfg.set("table.exec.state.ttl", "1 h").unwrap();
                    }
                    if !two_phase {
                        cfg.agg_phase_strategy = tally::config::AggPhaseStrategy::OnePhase;
                    }
                    parallel_aggregate(&schema, keys, cfg, &tally::clock::ManualClock::new(0))
                };
                let cut = rng.random_range(0..=stream.len());
                let mut view = Materialized::default();
                let mut first = make(before);
                let batch = to_batch(&schema, key_type, &stream[..cut], false);
                view.apply(&first.push(&batch).unwrap());
                // A mini-batch is pending unless the rows filled whole mini-batches (size × workers
                // rows): a snapshot must refuse it, and only it.
                let pending = before.1.is_some_and(|size| cut % (size * before.0) != 0);
                match first.snapshot() {
                    Err(e) => {
                        assert!(pending, "{ctx}: refused with nothing pending: {e}");
                        assert!(e.to_string().contains("finish()"), "{ctx}: {e}");
                    }
                    Ok(_) => assert!(!pending, "{ctx}: a pending mini-batch was snapshotted"),
                }
                view.apply(&first.finish().unwrap());
                let snapshot = first.snapshot().unwrap();
                let live: usize = snapshot.iter().map(|b| b.num_rows()).sum();
                assert_eq!(
                    live as u64,
                    first.metrics().unwrap().keys_in_state,
                    "{ctx}: snapshot rows"
                );
                let mut second = make(after);
                if seed % 2 == 0 {
                    use tally::checkpoint::Checkpointed;
                    // Through a checkpoint on disk, with the caller's metadata.
                    let dir = tally::checkpoint::CheckpointDir::new(
                        std::env::temp_dir()
                            .join(format!("tally-oracle-chk-{}-{seed}", std::process::id())),
                    );
                    let meta = [("source.rows".to_string(), cut.to_string())].into();
                    first.checkpoint(&dir, meta).unwrap();
                    let chk = second.restore(dir.root()).unwrap();
                    assert_eq!(chk.meta("source.rows").unwrap(), cut.to_string(), "{ctx}");
                    std::fs::remove_dir_all(dir.root()).unwrap();
                } else {
                    second.restore_snapshot(&snapshot).unwrap();
                }
                assert_eq!(
                    second.metrics().unwrap().keys_in_state,
                    live as u64,
                    "{ctx}: restored keys"
                );
                // A second restore into an operator with state is refused.
                assert!(second.restore_snapshot(&snapshot).is_err(), "{ctx}");
                let rest = to_batch(&schema, key_type, &stream[cut..], true);
                view.apply(&second.push(&rest).unwrap());
                view.apply(&second.finish().unwrap());
                assert_eq!(view.rows(), reference(&stream, keys), "{ctx}");
            }
        }
    }
}

#[test]
fn a_snapshot_of_another_query_is_refused() {
    let schema = schema(KeyType::Utf8, false);
    let mut a = tally::GroupAggregate::builder(schema.clone())
        .group_by([col("k")])
        .aggregate([count_star(), sum(col("v"))])
        .build()
        .unwrap();
    a.push(&to_batch(
        &schema,
        KeyType::Utf8,
        &random_stream(&mut StdRng::seed_from_u64(1), 20, false, 5),
        false,
    ))
    .unwrap();
    let snap = a.snapshot().unwrap();
    let mut b = tally::GroupAggregate::builder(schema.clone())
        .group_by([col("k")])
        .aggregate([count_star(), max(col("v"))])
        .build()
        .unwrap();
    let e = b.restore_snapshot(&snap).unwrap_err().to_string();
    assert!(e.contains("another query") && e.contains("max$"), "{e}");
}
