//! The SQL oracle's split-distinct queries resumed from their checkpoints: seeded random
//! streams (insert-only and changelogs), each query run split under random settings with
//! checkpoints, then resumed from its checkpoints on another parallelism or runtime, must give
//! the reference's final table. Where the PARTIAL's workers merge their buckets (over
//! insert-only input), the checkpoints hold that state cut back into a group per bucket.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tally::checkpoint::CheckpointDir;
use tally::sql::{PlannedQuery, plan_script};

use crate::common::{run_query, soaking, test_seed};
use crate::scratch::Scratch;
use crate::sql_oracle::{QUERIES, final_table, live, random_stream, table_ddl, write_stream};

/// Plans `script`'s query, its slices as small as one row.
fn plan(script: &str) -> PlannedQuery {
    let mut query = plan_script(script).unwrap();
    query.set_min_slice_rows(1);
    query
}

/// The settings of a split run on `workers` workers, pipelined or not: mini-batch on in two
/// phases (the incremental FINAL), a random mini-batch size and bucket count, `-U` rows or not.
fn split_settings(rng: &mut StdRng, workers: usize, pipelined: bool) -> String {
    format!(
        "SET 'table.exec.resource.default-parallelism' = '{workers}'; \
         SET 'tally.exec.pipelined' = '{pipelined}'; \
         SET 'table.exec.mini-batch.enabled' = 'true'; \
         SET 'table.exec.mini-batch.allow-latency' = '1 h'; \
         SET 'table.exec.mini-batch.size' = '{}'; \
         SET 'tally.exec.emit.update-before' = '{}'; \
         SET 'table.optimizer.distinct-agg.split.enabled' = 'true'; \
         SET 'table.optimizer.distinct-agg.split.bucket-num' = '{}';",
        [4, 40][rng.random_range(0..2)],
        rng.random_bool(0.7),
        [3, 16, 1024][rng.random_range(0..3)],
    )
}

#[test]
fn split_queries_resumed_from_their_checkpoints_match_the_reference() {
    let dir = Scratch::dir("sql-oracle-resume");
    let mut rng = StdRng::seed_from_u64(test_seed(4343));
    // Checkpoints taken by runs whose PARTIAL merged its buckets, and resumptions of them.
    let (mut merged_checkpoints, mut resumed) = (0, 0);
    for (s, retractions) in [false, true].into_iter().enumerate() {
        let stream = random_stream(&mut rng, 400, retractions);
        let path = dir.join(format!("t{s}.arrow"));
        write_stream(&path, &stream, &mut rng, false);
        let rows = live(&stream);
        let table = table_ddl(&path, "arrow", retractions);
        for q in QUERIES.iter().filter(|q| q.distinct) {
            let mut expected = (q.reference)(&rows);
            expected.sort();
            for round in 0..3 {
                let workers = rng.random_range(1..=3);
                let taken = split_settings(&mut rng, workers, true);
                let batch = [7, 64][rng.random_range(0..2)];
                let every = rng.random_range(40..160);
                let ctx = format!(
                    "{} (stream {s}): {taken} batch {batch}, every {every}",
                    q.name
                );
                let store_dir = dir.join(format!("chk-{s}-{}-{round}", q.name));
                let store = CheckpointDir::new(&store_dir).retain(1000);
                let mut query = plan(&format!("{table} {taken} {};", q.sql));
                query.job().checkpoint_every(store.clone(), every).unwrap();
                let update_before = query.emits_update_before();
                let keys = query
                    .key_columns()
                    .map(<[usize]>::to_vec)
                    .unwrap_or_default();
                let (full, stats) = run_query(&mut query, batch);
                assert_eq!(final_table(&full, update_before, &keys), expected, "{ctx}");
                let merged = stats.aggregates.iter().any(|m| m.merges_buckets);
                for (_, folder) in store.list().unwrap() {
                    merged_checkpoints += usize::from(merged);
                    let (workers, pipelined) = (rng.random_range(1..=3), rng.random_bool(0.7));
                    let again = split_settings(&mut rng, workers, pipelined);
                    // What shaped the state and the changelog stays the run's own.
                    let again = again
                        .split(';')
                        .filter(|s| !s.contains("bucket-num") && !s.contains("update-before"))
                        .collect::<Vec<_>>()
                        .join(";");
                    let mut query = plan(&format!("{table} {taken} {again} {};", q.sql));
                    let chk = query.job().restore(&folder).unwrap();
                    let delivered: usize = chk.meta("output.rows").unwrap().parse().unwrap();
                    let mut lines = full[..delivered].to_vec();
                    lines.extend(run_query(&mut query, batch).0);
                    assert_eq!(
                        final_table(&lines, update_before, &keys),
                        expected,
                        "{ctx}, resumed with {again} from {}",
                        folder.display()
                    );
                    resumed += 1;
                }
            }
        }
    }
    if soaking() {
        return;
    }
    assert!(resumed > 30, "{resumed} resumptions");
    assert!(
        merged_checkpoints > 10,
        "{merged_checkpoints} checkpoints of a PARTIAL that merged its buckets"
    );
}
