//! State TTL against a row-at-a-time reference with Flink's rules: churning keys expire and
//! leave memory, and mini-batches with retractions expire keys where Flink's operators do.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{Int64Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema};
use datafusion_expr::col;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tally::aggregates::{count, count_star, sum};
use tally::changelog::ChangeBatch;

use super::{KeyType, Row, Upserted, opt, random_stream, schema, to_batch};
use crate::common::{config, format_changes};

/// TTL with a key space that churns: each key lives for a short while, then goes idle. The
/// result must equal a row-at-a-time reference with Flink's TTL rule (a key idle for at least
/// the TTL restarts, with `+I`, from its next row), under one and several workers, and expired
/// groups must leave memory: the group table is compacted and holds about the live keys, and
/// state bytes stay far below a run without TTL.
#[test]
fn ttl_expires_churning_keys_and_compaction_returns_memory() {
    const TTL: i64 = 50;
    let mut rng = StdRng::seed_from_u64(77);
    // (time, key, v): 40 rows per ms; keys drift so that about 200 are live at a time.
    let mut rows = vec![];
    for i in 0..100_000i64 {
        let key = i / 40 * 4 + rng.random_range(0..200i64);
        rows.push((i / 40, key, rng.random_range(-5..10i64)));
    }
    // The reference: per key, (last write time, count, sum) of its current life.
    let mut reference: BTreeMap<i64, (i64, i64, i64)> = BTreeMap::new();
    for &(t, k, v) in &rows {
        let e = reference.entry(k).or_insert((t, 0, 0));
        if t - e.0 >= TTL {
            *e = (t, 0, 0);
        }
        *e = (t, e.1 + 1, e.2 + v);
    }
    let expected: Vec<String> = {
        let mut v: Vec<String> = reference
            .iter()
            .map(|(k, (_, c, s))| format!("[{k}, {c}, {s}]"))
            .collect();
        v.sort();
        v
    };
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, true),
        Field::new("v", DataType::Int64, true),
    ]));
    let mut bytes_without_ttl = 0;
    for (workers, ttl) in [(1, "0 ms"), (1, "50 ms"), (3, "50 ms")] {
        let mut cfg = config(None, false);
        cfg.parallelism = workers;
        cfg.set("table.exec.state.ttl", ttl).unwrap();
        let clock = tally::clock::ManualClock::new(0);
        let mut agg = tally::GroupAggregate::builder(schema.clone())
            .group_by([col("k")])
            .aggregate([count_star(), sum(col("v"))])
            .config(cfg)
            .clock(Arc::new(clock.clone()))
            .build_parallel()
            .unwrap()
            .with_min_slice_rows(1);
        let mut view = Upserted::default();
        let mut max_keys = 0;
        // The largest state in the first and in the second half of the stream.
        let mut halves = [0u64; 2];
        for (i, chunk) in rows.chunks(40).enumerate() {
            clock.set_ms(chunk[0].0);
            let batch = RecordBatch::try_new(
                schema.clone(),
                vec![
                    Arc::new(Int64Array::from_iter_values(chunk.iter().map(|r| r.1))),
                    Arc::new(Int64Array::from_iter_values(chunk.iter().map(|r| r.2))),
                ],
            )
            .unwrap();
            view.apply(&agg.push(&batch).unwrap(), 1);
            let m = agg.metrics().unwrap();
            max_keys = max_keys.max(m.keys_in_state);
            let half = usize::from(i * 40 >= rows.len() / 2);
            halves[half] = halves[half].max(m.state_bytes);
        }
        view.apply(&agg.finish().unwrap(), 1);
        let m = agg.metrics().unwrap();
        let ctx = format!("workers {workers} ttl {ttl}\n{m}");
        let compactions: u64 = m.workers.iter().map(|w| w.operator.compactions).sum();
        if ttl == "0 ms" {
            assert_eq!(m.keys_in_state, reference.len() as u64, "{ctx}");
            assert_eq!(compactions, 0, "{ctx}");
            // Without TTL state grows with the key space.
            assert!(halves[1] > halves[0] * 3 / 2, "{ctx}: {halves:?}");
            bytes_without_ttl = m.state_bytes;
            continue;
        }
        assert_eq!(view.rows(), expected, "{ctx}");
        // About 200 keys are live at a time (idle ones are swept once per TTL period).
        assert!(max_keys < 1_000, "{ctx}: {max_keys} keys at most");
        assert!(compactions >= 2, "{ctx}");
        // With it, memory is flat: the second half peaks no higher than the first.
        assert!(halves[1] <= halves[0] * 5 / 4, "{ctx}: {halves:?}");
        assert!(
            m.state_bytes * 3 < bytes_without_ttl,
            "{ctx}: {bytes_without_ttl} without TTL"
        );
        let peak: u64 = m.workers.iter().map(|w| w.operator.peak_state_bytes).sum();
        // Every sample is bounded by the workers' peaks (no local phase: mini-batch is off).
        assert!(
            peak >= m.state_bytes && peak >= halves[0].max(halves[1]),
            "{ctx}: peak {peak}, samples {halves:?}"
        );
    }
}

/// What a TTL reference keeps per key.
#[derive(Debug, Clone, Default)]
struct TtlKey {
    alive: bool,
    /// The hidden record count, COUNT(*), COUNT(v), SUM(v) (wrapping).
    count1: i64,
    rows: i64,
    values: i64,
    sum: i64,
    last_write: i64,
}

/// Fires one mini-batch of a TTL reference: `rows` (retract?, row) in arrival order, the keys
/// touched at `touch` (their expiry checked then), written at `fire`. `global`: Flink's global
/// phase, which merges the mini-batch's local folds and drops no retraction; otherwise the one-phase
/// operator, which drops a leading retraction of a key without state. Updates `view`, the last
/// row emitted per key (an upsert consumer's table); returns how many keys expired.
fn ttl_fire(
    state: &mut BTreeMap<Option<String>, TtlKey>,
    view: &mut BTreeMap<Option<String>, String>,
    rows: &[(bool, Row)],
    (touch, fire, ttl): (i64, i64, i64),
    global: bool,
) -> usize {
    let mut expired = 0;
    let mut order: Vec<Option<String>> = vec![];
    for (_, row) in rows {
        if !order.contains(&row.k) {
            order.push(row.k.clone());
        }
    }
    for k in order {
        let s = state.entry(k.clone()).or_default();
        if s.alive && touch - s.last_write >= ttl {
            *s = TtlKey::default();
            expired += 1;
        }
        let had_state = s.alive;
        let mut seen_acc = false;
        for (retract, row) in rows.iter().filter(|(_, r)| r.k == k) {
            let d = if *retract {
                if !global && !had_state && !seen_acc {
                    continue;
                }
                -1
            } else {
                seen_acc = true;
                1
            };
            s.count1 += d;
            s.rows += d;
            if let Some(v) = row.v {
                s.values += d;
                s.sum = s.sum.wrapping_add(d * v);
            }
        }
        if s.count1 != 0 {
            s.alive = true;
            s.last_write = fire;
            let sum = if s.values != 0 {
                s.sum.to_string()
            } else {
                "null".to_string()
            };
            view.insert(
                k.clone(),
                format!("[{}, {}, {}, {sum}]", opt(k.clone()), s.rows, s.values),
            );
        } else {
            if had_state {
                view.remove(&k);
            }
            *s = TtlKey::default();
        }
    }
    expired
}

/// State TTL with mini-batch on and retractions, on a clock that moves past the latency at every
/// push (so each push is one mini-batch): the changelog read by key must equal Flink's rules
/// applied row by row (a key idle for the TTL starts afresh, unretracted; a one-phase operator
/// checks expiry when a mini-batch first touches a key and drops leading retractions of a key
/// without state; a global phase checks it when it merges, and drops none), for the one-phase
/// operator and the parallel one in one and two phases.
#[test]
fn ttl_with_mini_batch_and_retractions_matches_reference() {
    const TTL: i64 = 50;
    let aggregates = || vec![count_star(), count(col("v")), sum(col("v"))];
    let mut seed = 7000;
    for retractions in [true, false] {
        for (workers, two_phase) in [(0, false), (1, false), (3, false), (1, true), (2, true)] {
            seed += 1;
            let ctx = format!(
                "seed {seed} retractions {retractions} workers {workers} two-phase {two_phase}"
            );
            let mut rng = StdRng::seed_from_u64(seed);
            let stream = random_stream(&mut rng, 600, retractions, 8);
            let schema = schema(KeyType::Utf8, retractions);
            let mut cfg = config(Some(1_000_000), true);
            cfg.set("table.exec.mini-batch.allow-latency", "10 ms")
                .unwrap();
            cfg.set("table.exec.state.ttl", &format!("{TTL} ms"))
                .unwrap();
            cfg.adaptive_local = false;
            cfg.parallelism = workers.max(1);
            if !two_phase {
                cfg.agg_phase_strategy = tally::config::AggPhaseStrategy::OnePhase;
            }
            let clock = tally::clock::ManualClock::new(0);
            let builder = tally::GroupAggregate::builder(schema.clone())
                .group_by([col("k")])
                .aggregate(aggregates())
                .config(cfg)
                .clock(Arc::new(clock.clone()));
            // workers 0: the one-phase operator itself.
            type Push = Box<dyn FnMut(&RecordBatch) -> Vec<ChangeBatch>>;
            let mut push: Push = if workers == 0 {
                let mut agg = builder.build().unwrap();
                Box::new(move |b| {
                    let mut out = agg.push(b).unwrap();
                    if b.num_rows() == 0 {
                        out.extend(agg.finish().unwrap());
                    }
                    out
                })
            } else {
                let mut agg = builder.build_parallel().unwrap().with_min_slice_rows(1);
                assert_eq!(agg.is_two_phase(), two_phase, "{ctx}");
                Box::new(move |b| {
                    let mut out = agg.push(b).unwrap();
                    if b.num_rows() == 0 {
                        out.extend(agg.finish().unwrap());
                    }
                    out
                })
            };
            let mut got = BTreeMap::new();
            let mut state = BTreeMap::new();
            let mut view = BTreeMap::new();
            let mut mini_batch: Vec<(bool, Row)> = vec![];
            let mut mini_batch_time = 0;
            let mut pushed = 0;
            let mut expiries = 0;
            while pushed < stream.len() {
                // Past at least one latency boundary: the pending mini-batch fires first.
                clock.advance_ms(rng.random_range(10..=35));
                let now = tally::clock::Clock::now_ms(&clock);
                let touch = if two_phase { now } else { mini_batch_time };
                expiries += ttl_fire(
                    &mut state,
                    &mut view,
                    &mini_batch,
                    (touch, now, TTL),
                    two_phase,
                );
                let n = rng.random_range(0..=25).min(stream.len() - pushed);
                mini_batch = stream[pushed..pushed + n].to_vec();
                mini_batch_time = now;
                let batch = to_batch(&schema, KeyType::Utf8, &mini_batch, rng.random_bool(0.5));
                for line in format_changes(&push(&batch)) {
                    apply_upsert(&mut got, &line);
                }
                pushed += n;
                assert_eq!(sorted(&got), sorted(&view), "{ctx}: after {pushed} rows");
            }
            // End of input: the last mini-batch fires on the clock as it stands.
            let now = tally::clock::Clock::now_ms(&clock);
            let touch = if two_phase { now } else { mini_batch_time };
            expiries += ttl_fire(
                &mut state,
                &mut view,
                &mini_batch,
                (touch, now, TTL),
                two_phase,
            );
            let empty = to_batch(&schema, KeyType::Utf8, &[], false);
            for line in format_changes(&push(&empty)) {
                apply_upsert(&mut got, &line);
            }
            assert_eq!(sorted(&got), sorted(&view), "{ctx}: at the end");
            assert!(expiries > 10, "{ctx}: {expiries} expiries");
        }
    }
}

/// A table's rows, sorted.
fn sorted<K>(table: &BTreeMap<K, String>) -> Vec<String> {
    let mut rows: Vec<String> = table.values().cloned().collect();
    rows.sort();
    rows
}

/// Applies one changelog line (`+I[k, …]`) to a table keyed by its first field.
fn apply_upsert(table: &mut BTreeMap<String, String>, line: &str) {
    let (kind, row) = line.split_at(2);
    let key = row[1..]
        .split(", ")
        .next()
        .unwrap_or("")
        .trim_end_matches(']')
        .to_string();
    match kind {
        "+I" | "+U" => {
            table.insert(key, row.to_string());
        }
        "-D" => {
            table.remove(&key);
        }
        _ => {}
    }
}
