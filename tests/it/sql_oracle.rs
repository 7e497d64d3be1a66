//! The invariant at the SQL level: seeded random streams (insert-only and changelogs with
//! deletes and `-U/+U` updates, a hot key, NULL keys and values) written to an Arrow IPC file and
//! run through `tally::sql` under random configurations (mini-batch off and on, one and two
//! phases, split-distinct with several bucket counts, `tally.exec.emit.update-before` off, the
//! adaptive local phase with small thresholds, 1 to 3 workers with several local phases each,
//! random batch sizes) must give the final table of a reference computed here from the live rows:
//! nested aggregates, HAVING, WHERE over an aggregate, DISTINCT with FILTER.

use std::collections::{BTreeMap, BTreeSet};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tally::sql::{Session, StatementResult, script_statements};

use crate::common::{run_query, soaking, test_seed};

mod stream;
pub(crate) use stream::{Row, final_table, live, random_stream, table_ddl, write_stream};

fn opt<T: ToString>(v: Option<T>) -> String {
    v.map_or("null".to_string(), |v| v.to_string())
}

fn line(fields: &[String]) -> String {
    format!("[{}]", fields.join(", "))
}

/// Per key: (rows, their non-NULL values).
fn by_key(rows: &[Row]) -> BTreeMap<Option<String>, Vec<&Row>> {
    let mut m: BTreeMap<Option<String>, Vec<&Row>> = BTreeMap::new();
    for r in rows {
        m.entry(r.k.clone()).or_default().push(r);
    }
    m
}

fn sum(rows: &[&Row]) -> Option<i64> {
    let vs: Vec<i64> = rows.iter().filter_map(|r| r.v).collect();
    (!vs.is_empty()).then(|| vs.iter().sum())
}

/// A query and its reference over the live rows (sorted lines like `[a, 1, 2]`).
pub(crate) struct Query {
    pub(crate) name: &'static str,
    pub(crate) sql: &'static str,
    /// Whether its last aggregate's changes go straight to the sink (it may drop `-U`).
    pub(crate) upsert: bool,
    /// Whether split-distinct applies to it.
    pub(crate) distinct: bool,
    pub(crate) reference: fn(&[Row]) -> Vec<String>,
}

pub(crate) const QUERIES: &[Query] = &[
    Query {
        name: "nested",
        sql: "SELECT c, COUNT(*) AS n, SUM(s) AS total FROM \
              (SELECT k, COUNT(*) AS c, SUM(v) AS s FROM t GROUP BY k) GROUP BY c",
        upsert: true,
        distinct: false,
        reference: |rows| {
            let mut outer: BTreeMap<i64, Vec<Option<i64>>> = BTreeMap::new();
            for rs in by_key(rows).values() {
                outer.entry(rs.len() as i64).or_default().push(sum(rs));
            }
            outer
                .iter()
                .map(|(c, sums)| {
                    let vs: Vec<i64> = sums.iter().flatten().copied().collect();
                    let total = (!vs.is_empty()).then(|| vs.iter().sum::<i64>());
                    line(&[c.to_string(), sums.len().to_string(), opt(total)])
                })
                .collect()
        },
    },
    Query {
        name: "having",
        sql: "SELECT k, COUNT(*) AS c, SUM(v) AS s, MAX(u) AS m FROM t GROUP BY k \
              HAVING COUNT(*) < 75",
        upsert: false,
        distinct: false,
        reference: |rows| {
            by_key(rows)
                .iter()
                .filter(|(_, rs)| rs.len() < 75)
                .map(|(k, rs)| {
                    let m = rs.iter().map(|r| r.u).max();
                    line(&[opt(k.clone()), rs.len().to_string(), opt(sum(rs)), opt(m)])
                })
                .collect()
        },
    },
    Query {
        name: "nested having and where",
        sql: "SELECT c, COUNT(*) AS n FROM \
              (SELECT k, COUNT(*) AS c FROM t GROUP BY k HAVING SUM(v) > 10) \
              WHERE c > 1 GROUP BY c",
        upsert: true,
        distinct: false,
        reference: |rows| {
            let mut outer: BTreeMap<usize, i64> = BTreeMap::new();
            for rs in by_key(rows).values() {
                if sum(rs).is_some_and(|s| s > 10) && rs.len() > 1 {
                    *outer.entry(rs.len()).or_default() += 1;
                }
            }
            outer
                .iter()
                .map(|(c, n)| line(&[c.to_string(), n.to_string()]))
                .collect()
        },
    },
    Query {
        name: "distinct",
        sql: "SELECT k, COUNT(DISTINCT u) AS d, COUNT(*) AS n, \
              SUM(v) FILTER (WHERE v > 0) AS p, MIN(v) AS lo FROM t GROUP BY k",
        upsert: true,
        distinct: true,
        reference: |rows| {
            by_key(rows)
                .iter()
                .map(|(k, rs)| {
                    let users: BTreeSet<i64> = rs.iter().map(|r| r.u).collect();
                    let pos: Vec<i64> = rs.iter().filter_map(|r| r.v).filter(|&v| v > 0).collect();
                    let p = (!pos.is_empty()).then(|| pos.iter().sum::<i64>());
                    let lo = rs.iter().filter_map(|r| r.v).min();
                    line(&[
                        opt(k.clone()),
                        users.len().to_string(),
                        rs.len().to_string(),
                        opt(p),
                        opt(lo),
                    ])
                })
                .collect()
        },
    },
    Query {
        // Nexmark q16's shape: the extremes' arguments bucketed in sets of their own, which a
        // local phase routing at the flush sends with the keys alone.
        name: "distinct beside string extremes",
        sql: "SELECT k, COUNT(DISTINCT u) AS d, COUNT(*) AS n, MAX(CAST(v AS STRING)) AS hi, \
              MIN(CAST(u AS STRING)) AS lo FROM t GROUP BY k",
        upsert: true,
        distinct: true,
        reference: |rows| {
            by_key(rows)
                .iter()
                .map(|(k, rs)| {
                    let users: BTreeSet<i64> = rs.iter().map(|r| r.u).collect();
                    let hi = rs.iter().filter_map(|r| r.v).map(|v| v.to_string()).max();
                    let lo = rs.iter().map(|r| r.u.to_string()).min();
                    line(&[
                        opt(k.clone()),
                        users.len().to_string(),
                        rs.len().to_string(),
                        opt(hi),
                        opt(lo),
                    ])
                })
                .collect()
        },
    },
    Query {
        name: "one distinct argument alone",
        sql: "SELECT k, COUNT(DISTINCT u) AS d, \
              COUNT(DISTINCT u) FILTER (WHERE v > 0) AS dp FROM t GROUP BY k",
        upsert: true,
        distinct: true,
        reference: |rows| {
            by_key(rows)
                .iter()
                .map(|(k, rs)| {
                    let users: BTreeSet<i64> = rs.iter().map(|r| r.u).collect();
                    let paying: BTreeSet<i64> = rs
                        .iter()
                        .filter(|r| r.v.is_some_and(|v| v > 0))
                        .map(|r| r.u)
                        .collect();
                    line(&[
                        opt(k.clone()),
                        users.len().to_string(),
                        paying.len().to_string(),
                    ])
                })
                .collect()
        },
    },
    Query {
        name: "two distinct arguments",
        sql: "SELECT k, COUNT(DISTINCT u) AS du, COUNT(*) AS n, \
              COUNT(DISTINCT v) FILTER (WHERE v > 0) AS dv FROM t GROUP BY k",
        upsert: true,
        distinct: true,
        reference: |rows| {
            by_key(rows)
                .iter()
                .map(|(k, rs)| {
                    let users: BTreeSet<i64> = rs.iter().map(|r| r.u).collect();
                    let pos: BTreeSet<i64> =
                        rs.iter().filter_map(|r| r.v).filter(|&v| v > 0).collect();
                    line(&[
                        opt(k.clone()),
                        users.len().to_string(),
                        rs.len().to_string(),
                        pos.len().to_string(),
                    ])
                })
                .collect()
        },
    },
    Query {
        // One group set whose COUNT(*) sits beside the DISTINCT call: a split's local phases
        // route rows by their buckets (they cannot route entries at the flush).
        name: "distinct beside a count, one set",
        sql: "SELECT k, COUNT(DISTINCT u) AS d, COUNT(*) AS n FROM t GROUP BY k",
        upsert: true,
        distinct: true,
        reference: |rows| {
            by_key(rows)
                .iter()
                .map(|(k, rs)| {
                    let users: BTreeSet<i64> = rs.iter().map(|r| r.u).collect();
                    line(&[
                        opt(k.clone()),
                        users.len().to_string(),
                        rs.len().to_string(),
                    ])
                })
                .collect()
        },
    },
];

/// One random configuration, as SET statements, and the batch size.
fn random_settings(rng: &mut StdRng, distinct: bool) -> (String, usize, String) {
    let mut sets = vec![];
    let mut desc = vec![];
    let mut set = |k: &str, v: String, desc: &mut Vec<String>| {
        desc.push(format!("{k}={v}"));
        sets.push(format!("SET '{k}' = '{v}';"));
    };
    let workers = rng.random_range(1..=3);
    set(
        "table.exec.resource.default-parallelism",
        workers.to_string(),
        &mut desc,
    );
    if rng.random_bool(0.75) {
        let size = [1, 4, 40][rng.random_range(0..3)];
        set("table.exec.mini-batch.enabled", "true".into(), &mut desc);
        set(
            "table.exec.mini-batch.allow-latency",
            "1 h".into(),
            &mut desc,
        );
        set("table.exec.mini-batch.size", size.to_string(), &mut desc);
        if rng.random_bool(0.3) {
            set(
                "table.optimizer.agg-phase-strategy",
                "ONE_PHASE".into(),
                &mut desc,
            );
        } else {
            match rng.random_range(0..3) {
                0 => set(
                    "tally.exec.local-agg.adaptive.enabled",
                    "false".into(),
                    &mut desc,
                ),
                1 => {
                    set(
                        "tally.exec.local-agg.adaptive.threshold",
                        "0.05".into(),
                        &mut desc,
                    );
                    set(
                        "tally.exec.local-agg.adaptive.min-rows",
                        "20".into(),
                        &mut desc,
                    );
                    set(
                        "tally.exec.local-agg.adaptive.probe-interval",
                        "60".into(),
                        &mut desc,
                    );
                }
                _ => {}
            }
        }
    }
    if rng.random_bool(0.5) {
        set("tally.exec.emit.update-before", "false".into(), &mut desc);
    }
    if distinct && rng.random_bool(0.5) {
        set(
            "table.optimizer.distinct-agg.split.enabled",
            "true".into(),
            &mut desc,
        );
        let buckets = [1, 3, 1024][rng.random_range(0..3)];
        set(
            "table.optimizer.distinct-agg.split.bucket-num",
            buckets.to_string(),
            &mut desc,
        );
    }
    let batch = [1, 7, 64, 8192][rng.random_range(0..4)];
    (sets.join(" "), batch, desc.join(" "))
}

#[test]
fn sql_queries_match_the_reference_under_random_settings() {
    let dir = std::env::temp_dir().join(format!("tally-sql-oracle-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut rng = StdRng::seed_from_u64(test_seed(4242));
    let (mut bypasses, mut local_tasks, mut mini_batches, mut dropped_ub) = (0, 0, 0, 0);
    // Bypasses of a split PARTIAL's local phase on the pipelined runtime, whose key table
    // hashes its keys itself: the rows it passes on are hashed then.
    let mut split_bypasses = 0;
    // Runs whose split PARTIAL keyed its workers' state by the query's keys alone.
    let mut merged_buckets = 0;
    // Runs whose split PARTIAL's local phases routed its DISTINCT entries when they flushed,
    // and of them those with MIN/MAX calls (sent with the keys alone).
    let (mut routed_at_flush, mut routed_extremes) = (0, 0);
    // Runs whose split PARTIAL's workers merged the buckets with some keys hot and others not
    // (`HotKeys`: a cold key's entries and rows go with the key alone), where its local phases
    // routed at the flush and where they routed rows.
    let (mut hot_and_cold_at_flush, mut hot_and_cold_by_rows) = (0, 0);
    // Runs whose split PARTIAL kept every key's groups apart (the ordered runtime, say) with
    // some keys hot and others not: a cold key's rows still go with the key alone.
    let mut hot_and_cold_unmerged = 0;
    // Runs whose split FINAL read its PARTIAL through (one worker merging the buckets).
    let mut read_through = 0;
    let mut cold_through = 0;
    let mut chunked_changelogs = 0;
    for (s, retractions) in [false, true, true].into_iter().enumerate() {
        let stream = random_stream(&mut rng, 500, retractions);
        // The second changelog as Parquet: on one worker it runs pipelined, in chunks of a
        // mini-batch applied in input order (more workers deal it in chunks of 65 536 rows).
        let format = if s == 1 { "parquet" } else { "arrow" };
        let path = dir.join(format!("t{s}.{format}"));
        write_stream(&path, &stream, &mut rng, s == 1);
        let rows = live(&stream);
        let table = table_ddl(&path, format, retractions);
        for q in QUERIES {
            let mut expected = (q.reference)(&rows);
            expected.sort();
            assert!(!expected.is_empty(), "{}", q.name);
            for _ in 0..10 {
                let (settings, batch, desc) = random_settings(&mut rng, q.distinct);
                let ctx = format!("{} (stream {s}): {desc} batch {batch}", q.name);
                let mut session = Session::new();
                let mut query = None;
                for stmt in script_statements(&format!("{table} {settings} {};", q.sql)).unwrap() {
                    if let StatementResult::Query(p) = session.execute(&stmt).unwrap() {
                        query = Some(p);
                    }
                }
                let mut query = query.unwrap();
                query.set_min_slice_rows(1);
                let ub_off = desc.contains("update-before=false");
                assert_eq!(
                    query.emits_update_before(),
                    !(ub_off && q.upsert),
                    "{ctx}: -U rows only where the sink upserts"
                );
                dropped_ub += usize::from(!query.emits_update_before());
                let (lines, stats) = run_query(&mut query, batch);
                let keys = query
                    .key_columns()
                    .map(<[usize]>::to_vec)
                    .unwrap_or_default();
                let got = final_table(&lines, query.emits_update_before(), &keys);
                assert_eq!(got, expected, "{ctx}");
                chunked_changelogs += usize::from(s == 1 && stats.runtime.starts_with("pipelined"));
                let split = desc.contains("split.enabled=true");
                let explain = query.explain(&[]);
                let some_hot = explain
                    .split("Only hot keys are spread: ")
                    .nth(1)
                    .and_then(|s| {
                        let mut words = s.split(' ');
                        let hot: usize = words.next()?.parse().ok()?;
                        let all: usize = words.nth(2)?.parse().ok()?;
                        Some(hot > 0 && hot < all)
                    })
                    .unwrap_or(false);
                hot_and_cold_at_flush +=
                    usize::from(some_hot && stats.aggregates.iter().any(|m| m.routes_at_flush));
                hot_and_cold_by_rows += usize::from(
                    some_hot
                        && stats
                            .aggregates
                            .iter()
                            .any(|m| m.merges_buckets && !m.routes_at_flush),
                );
                hot_and_cold_unmerged +=
                    usize::from(some_hot && !stats.aggregates.iter().any(|m| m.merges_buckets));
                for m in &stats.aggregates {
                    merged_buckets += usize::from(m.merges_buckets);
                    routed_at_flush += usize::from(m.routes_at_flush);
                    routed_extremes += usize::from(
                        m.routes_at_flush && (q.sql.contains("MIN(") || q.sql.contains("MAX(")),
                    );
                    read_through += usize::from(m.reads_through);
                    cold_through += usize::from(some_hot && m.reads_cold_through);
                    if let Some(local) = &m.local {
                        bypasses += local.bypass_decisions;
                        if split && stats.runtime.starts_with("pipelined") {
                            split_bypasses += local.bypass_decisions;
                        }
                        if m.parallelism > 1 {
                            let stage = m.stages.iter().find(|s| {
                                s.step == tally::explain::AggregateStep::LocalGroupAggregate
                            });
                            local_tasks += stage.map_or(0, |s| s.batches);
                            mini_batches += m.mini_batches;
                        }
                    }
                }
            }
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
    if soaking() {
        return;
    }
    // The paths the matrix is meant to take were taken.
    assert!(bypasses > 0, "the adaptive local phase never stepped aside");
    assert!(
        merged_buckets > 3,
        "{merged_buckets} runs with a split PARTIAL's state keyed by the query's keys"
    );
    assert!(
        routed_at_flush > 1,
        "{routed_at_flush} runs whose split local phases routed DISTINCT entries at the flush"
    );
    assert!(
        routed_extremes > 1,
        "{routed_extremes} runs whose split local phases routed MIN/MAX state at the flush"
    );
    assert!(
        hot_and_cold_at_flush > 0 && hot_and_cold_by_rows > 0,
        "{hot_and_cold_at_flush} runs whose split local phases routed at the flush with hot and cold keys, {hot_and_cold_by_rows} routing rows"
    );
    assert!(
        hot_and_cold_unmerged > 0,
        "{hot_and_cold_unmerged} runs whose split PARTIAL kept its buckets apart with hot and cold keys"
    );
    assert!(
        read_through > 1,
        "{read_through} runs with a split FINAL reading its PARTIAL through"
    );
    assert!(
        cold_through > 0,
        "{cold_through} runs with a split FINAL reading cold keys through beside hot ones"
    );
    assert!(
        split_bypasses > 0,
        "a split PARTIAL's local phase never stepped aside on the pipelined runtime"
    );
    assert!(
        local_tasks > mini_batches,
        "never more than one local phase per mini-batch: {local_tasks} tasks, {mini_batches} mini-batches"
    );
    assert!(dropped_ub > 3, "{dropped_ub} runs without -U");
    assert!(
        chunked_changelogs > 5,
        "{chunked_changelogs} runs of the Parquet changelog on the pipelined runtime"
    );
}
