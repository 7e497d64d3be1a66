//! The Flink operator's two halves without a JVM: seeded changelogs through local phases, parts
//! routed to the owner of their key group as Flink routes them, global phases firing, against a
//! row-at-a-time reference; and state snapshotted per key group at one parallelism and restored
//! at another.

mod common;

use std::collections::BTreeMap;

use tally::changelog::RowKind;
use tally_flink::{Column, Part, Query, Type};

use common::{Job, Order, SQL, changelog, columns, options, query, query_over, reference};

#[test]
fn every_phase_and_parallelism_gives_the_reference_table() {
    for seed in 0..4 {
        let changes = changelog(seed, 3_000);
        let want = reference(&changes);
        for two_phase in [true, false] {
            for (sources, workers, batch_rows) in [(1, 1, 64), (2, 3, 100), (3, 2, 7)] {
                let mut job = Job::new(SQL, two_phase, sources, workers);
                job.run(&changes, batch_rows);
                job.barrier();
                assert_eq!(
                    job.table, want,
                    "seed {seed}, two-phase {two_phase}, {sources} sources, {workers} workers"
                );
            }
        }
    }
}

#[test]
fn state_snapshotted_per_key_group_restores_at_another_parallelism() {
    let changes = changelog(9, 4_000);
    let (first, rest) = changes.split_at(2_000);
    let want = reference(&changes);
    for two_phase in [true, false] {
        let mut a = Job::new(SQL, two_phase, 2, 2);
        a.run(first, 50);
        a.barrier();
        let mut parts: Vec<Part> = vec![];
        for g in &mut a.phases[1] {
            parts.extend(g.snapshot().unwrap());
        }
        let mut groups: Vec<u32> = parts.iter().map(|p| p.key_group).collect();
        groups.sort_unstable();
        groups.dedup();
        assert_eq!(groups.len(), parts.len(), "one part per key group");
        for workers in [3, 1] {
            let mut b = Job::new(SQL, two_phase, 2, workers);
            for (w, g) in b.phases[1].iter_mut().enumerate() {
                let mine: Vec<&[u8]> = parts
                    .iter()
                    .filter(|p| b.groups.range(w).contains(&(p.key_group as usize)))
                    .map(|p| p.bytes.as_slice())
                    .collect();
                g.restore(&mine).unwrap();
            }
            b.table = a.table.clone();
            b.run(rest, 50);
            b.barrier();
            assert_eq!(
                b.table, want,
                "two-phase {two_phase}, restored at P = {workers}"
            );
        }
    }
}

#[test]
fn bad_queries_and_inputs_are_one_line_errors() {
    let plan = |sql: &str| Query::plan(sql, "orders", &columns(), true, &options(true));
    for (sql, says) in [
        ("SELECT shop, COUNT(*) FROM orders GROUP BY nope", "nope"),
        ("SELECT shop FROM orders", "no aggregate"),
    ] {
        let e = plan(sql).unwrap_err().to_string();
        assert!(e.contains(says) && !e.contains('\n'), "{sql}: {e}");
    }
    let bad_name = Column {
        name: "a b".into(),
        ty: Type::BigInt,
        nullable: true,
    };
    let e = Query::plan(SQL, "orders", &[bad_name], false, &[]).unwrap_err();
    assert!(e.to_string().contains("'a b'"), "{e}");
    let e = Query::plan(
        SQL,
        "orders",
        &columns(),
        false,
        &[("table.exec.mini-batch.size".into(), "x".into())],
    )
    .unwrap_err();
    assert!(e.to_string().contains("mini-batch.size"), "{e}");
    let auto = [(
        "tally.optimizer.distinct-agg.split.auto".to_string(),
        "true".to_string(),
    )];
    let e = Query::plan(SQL, "orders", &columns(), true, &auto)
        .unwrap_err()
        .to_string();
    assert!(e.contains("split.enabled") && !e.contains('\n'), "{e}");
    let mut local = query(SQL, true).into_phase(0).unwrap();
    let e = local.push(b"TLY1 not a batch").unwrap_err().to_string();
    assert!(e.contains("malformed column batch"), "{e}");
    let mut global = query(SQL, true).into_phase(1).unwrap();
    let e = global.push(b"not arrow").unwrap_err().to_string();
    assert!(e.contains("not Arrow IPC"), "{e}");
}

#[test]
fn a_nested_aggregate_is_one_more_phase_after_one_more_exchange() {
    let sql = "SELECT orders, COUNT(*) AS shops, MAX(total) AS best FROM \
        (SELECT shop, COUNT(*) AS orders, SUM(amount) AS total FROM orders GROUP BY shop) \
        GROUP BY orders";
    for seed in 0..3 {
        let changes = changelog(seed, 2_000);
        // The reference: the inner table from the row-at-a-time reference, grouped again.
        let mut want: BTreeMap<Option<String>, (usize, Option<i64>)> = BTreeMap::new();
        for row in reference(&changes).values() {
            let mut f = row.split(' ');
            let orders = f.next().unwrap().to_string();
            let total = f.next().unwrap();
            let total = total.parse::<i64>().ok();
            let e = want.entry(Some(orders)).or_insert((0, None));
            e.0 += 1;
            e.1 = e.1.max(total);
        }
        let want: BTreeMap<Option<String>, String> = want
            .into_iter()
            .map(|(k, (n, best))| {
                let best = best.map_or("NULL".to_string(), |b| b.to_string());
                (k, format!("{n} {best}"))
            })
            .collect();
        for two_phase in [true, false] {
            for (sources, workers) in [(1, 1), (2, 3)] {
                let mut job = Job::new(sql, two_phase, sources, workers);
                assert_eq!(job.phases.len(), 3);
                job.run(&changes, 50);
                job.barrier();
                assert_eq!(
                    job.table, want,
                    "seed {seed}, two-phase {two_phase}, P = {workers}"
                );
            }
        }
    }
}

#[test]
fn split_distinct_runs_as_a_partial_and_a_final_aggregate() {
    let sql = "SELECT shop, COUNT(DISTINCT user_id) AS buyers, SUM(amount) AS total, \
        COUNT(*) AS orders, SUM(amount) FILTER (WHERE user_id < 10) AS early FROM orders GROUP BY shop";
    // Two phases with and without Flink's incremental aggregate (its default), and one phase.
    let split = |two_phase: bool, incremental: bool| {
        let mut o = options(two_phase);
        for (k, v) in [
            ("table.optimizer.distinct-agg.split.enabled", "true"),
            ("table.optimizer.distinct-agg.split.bucket-num", "8"),
            (
                "table.optimizer.incremental-agg-enabled",
                if incremental { "true" } else { "false" },
            ),
        ] {
            o.push((k.into(), v.into()));
        }
        o
    };
    let changes = changelog(4, 3_000);
    let want = {
        let mut plain = Job::new(sql, true, 1, 1);
        plain.run(&changes, 100);
        plain.barrier();
        plain.table
    };
    assert!(!want.is_empty());
    for (two_phase, incremental) in [(true, true), (true, false), (false, false)] {
        let plan = || {
            Query::plan(
                sql,
                "orders",
                &columns(),
                true,
                &split(two_phase, incremental),
            )
        };
        let q = plan().unwrap();
        assert_eq!(q.phases(), 3, "a PARTIAL and a FINAL aggregate");
        for (sources, workers) in [(1, 1), (2, 3)] {
            let mut job = Job::with(
                (0..q.phases())
                    .map(|k| {
                        let n = if k == 0 { sources } else { workers };
                        (0..n)
                            .map(|_| plan().unwrap().into_phase(k).unwrap())
                            .collect()
                    })
                    .collect(),
                &q,
                workers,
            );
            job.run(&changes, 64);
            job.barrier();
            assert_eq!(
                job.table, want,
                "split, two-phase {two_phase}, incremental {incremental}, P = {workers}"
            );
        }
    }
}

#[test]
fn an_insert_only_input_gives_the_reference_table() {
    let inserts: Vec<(RowKind, Order)> = changelog(6, 3_000)
        .into_iter()
        .filter(|c| c.0 == RowKind::Insert)
        .collect();
    let want = reference(&inserts);
    for two_phase in [true, false] {
        for (sources, workers) in [(1, 1), (2, 3)] {
            let q = query_over(SQL, two_phase, false);
            let phases = (0..q.phases())
                .map(|k| {
                    let n = if k == 0 { sources } else { workers };
                    (0..n)
                        .map(|_| query_over(SQL, two_phase, false).into_phase(k).unwrap())
                        .collect()
                })
                .collect();
            let mut job = Job::with(phases, &q, workers);
            job.run(&inserts, 100);
            job.barrier();
            assert_eq!(
                job.table, want,
                "insert-only, two-phase {two_phase}, P = {workers}"
            );
        }
    }
}
