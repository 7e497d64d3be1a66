//! The Flink operator's two halves without a JVM: seeded changelogs through local phases, parts
//! routed to the owner of their key group as Flink routes them, global phases firing, against a
//! row-at-a-time reference; and state snapshotted per key group at one parallelism and restored
//! at another.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{Array, AsArray, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Int64Type, Schema};
use tally::changelog::{ChangeBatch, RowKind, op_array};
use tally::operator::key_groups::KeyGroups;
use tally_flink::{Column, GlobalPhase, LocalPhase, Part, Query, Type, wire};

const SQL: &str = "SELECT shop, COUNT(*) AS orders, SUM(amount) AS total, \
    COUNT(DISTINCT user_id) AS buyers, SUM(amount) FILTER (WHERE user_id < 10) AS early \
    FROM orders GROUP BY shop";

fn columns() -> Vec<Column> {
    let c = |name: &str, ty| Column {
        name: name.into(),
        ty,
        nullable: true,
    };
    vec![
        c("shop", Type::String),
        c("user_id", Type::BigInt),
        c("amount", Type::BigInt),
    ]
}

fn schema() -> Arc<Schema> {
    Arc::new(Schema::new(vec![
        Field::new("shop", DataType::Utf8, true),
        Field::new("user_id", DataType::Int64, true),
        Field::new("amount", DataType::Int64, true),
    ]))
}

type Order = (Option<String>, i64, Option<i64>);

/// A seeded changelog: inserts, updates (-U, +U) and deletes of live rows, a hot shop, NULL
/// shops and amounts.
fn changelog(seed: u64, n: usize) -> Vec<(RowKind, Order)> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut next = move |m: u64| {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (s >> 33) % m
    };
    let order = |next: &mut dyn FnMut(u64) -> u64| -> Order {
        let shop = match next(10) {
            0..=3 => Some("hot".to_string()),
            4 => None,
            _ => Some(format!("s{}", next(30))),
        };
        let amount = (next(8) != 0).then(|| next(1000) as i64 - 100);
        (shop, next(40) as i64, amount)
    };
    let (mut out, mut live) = (vec![], vec![]);
    while out.len() < n {
        match next(20) {
            x if live.is_empty() || x < 11 => {
                let o = order(&mut next);
                live.push(o.clone());
                out.push((RowKind::Insert, o));
            }
            x if x < 17 => {
                let i = next(live.len() as u64) as usize;
                let new = order(&mut next);
                out.push((RowKind::UpdateBefore, live[i].clone()));
                out.push((RowKind::UpdateAfter, new.clone()));
                live[i] = new;
            }
            _ => {
                let i = next(live.len() as u64) as usize;
                out.push((RowKind::Delete, live.swap_remove(i)));
            }
        }
    }
    out
}

fn batch(rows: &[(RowKind, Order)]) -> Vec<u8> {
    let data = RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(StringArray::from_iter(rows.iter().map(|r| r.1.0.clone()))),
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.1.1))),
            Arc::new(Int64Array::from_iter(rows.iter().map(|r| r.1.2))),
        ],
    )
    .unwrap();
    let kinds: Vec<RowKind> = rows.iter().map(|r| r.0).collect();
    wire::encode(&ChangeBatch::try_new(Some(op_array(&kinds)), data).unwrap()).unwrap()
}

/// The final table, row at a time: per shop, the live rows' count, sum, distinct users and the
/// filtered sum.
fn reference(changes: &[(RowKind, Order)]) -> BTreeMap<Option<String>, String> {
    let mut live: BTreeMap<Option<String>, Vec<(i64, Option<i64>)>> = BTreeMap::new();
    for (kind, (shop, user, amount)) in changes {
        let rows = live.entry(shop.clone()).or_default();
        if kind.is_retract() {
            let at = rows.iter().position(|r| *r == (*user, *amount)).unwrap();
            rows.swap_remove(at);
        } else {
            rows.push((*user, *amount));
        }
    }
    let sum = |it: &mut dyn Iterator<Item = Option<i64>>| {
        let vals: Vec<i64> = it.flatten().collect();
        (!vals.is_empty()).then(|| vals.iter().sum::<i64>())
    };
    live.into_iter()
        .filter(|(_, rows)| !rows.is_empty())
        .map(|(shop, rows)| {
            let mut users: Vec<i64> = rows.iter().map(|r| r.0).collect();
            users.sort_unstable();
            users.dedup();
            let total = sum(&mut rows.iter().map(|r| r.1));
            let early = sum(&mut rows.iter().filter(|r| r.0 < 10).map(|r| r.1));
            (
                shop,
                format!("{} {:?} {} {:?}", rows.len(), total, users.len(), early),
            )
        })
        .collect()
}

fn options(two_phase: bool) -> Vec<(String, String)> {
    let mut o = vec![("pipeline.max-parallelism".to_string(), "16".to_string())];
    if two_phase {
        for (k, v) in [
            ("table.exec.mini-batch.enabled", "true"),
            ("table.exec.mini-batch.allow-latency", "1 h"),
            ("table.exec.mini-batch.size", "37"),
        ] {
            o.push((k.into(), v.into()));
        }
    }
    o
}

fn query(two_phase: bool) -> Query {
    Query::plan(SQL, "orders", &columns(), true, &options(two_phase)).unwrap()
}

/// Applies column batches of changes to a final table keyed by shop.
fn apply(table: &mut BTreeMap<Option<String>, String>, outputs: Vec<Vec<u8>>) {
    let out_schema = Arc::new(Schema::new(vec![
        Field::new("shop", DataType::Utf8, true),
        Field::new("orders", DataType::Int64, false),
        Field::new("total", DataType::Int64, true),
        Field::new("buyers", DataType::Int64, false),
        Field::new("early", DataType::Int64, true),
    ]));
    for bytes in outputs {
        let c = wire::decode(&bytes, &out_schema).unwrap();
        let kinds = c.row_kinds().unwrap();
        let d = &c.data;
        let shop = d.column(0).as_string::<i32>();
        let int = |i: usize, r: usize| {
            let a = d.column(i).as_primitive::<Int64Type>();
            a.is_valid(r).then(|| a.value(r))
        };
        for (r, kind) in kinds.iter().enumerate() {
            let key = shop.is_valid(r).then(|| shop.value(r).to_string());
            let row = format!(
                "{} {:?} {} {:?}",
                int(1, r).unwrap(),
                int(2, r),
                int(3, r).unwrap(),
                int(4, r)
            );
            if kind.is_retract() {
                let had = table.remove(&key);
                assert_eq!(had.as_deref(), Some(row.as_str()), "{kind:?} of {key:?}");
            } else {
                table.insert(key, row);
            }
        }
    }
}

struct Job {
    locals: Vec<LocalPhase>,
    globals: Vec<GlobalPhase>,
    groups: KeyGroups,
    table: BTreeMap<Option<String>, String>,
}

impl Job {
    fn new(two_phase: bool, sources: usize, workers: usize) -> Job {
        let groups = KeyGroups::new(query(two_phase).key_groups(), workers).unwrap();
        Job {
            locals: (0..sources)
                .map(|_| query(two_phase).into_local().unwrap())
                .collect(),
            globals: (0..workers)
                .map(|_| query(two_phase).into_global().unwrap())
                .collect(),
            groups,
            table: BTreeMap::new(),
        }
    }

    /// Flink's exchange: each part to the subtask that owns its key group.
    fn route(&mut self, parts: Vec<Part>) {
        for p in parts {
            let w = (0..self.groups.workers())
                .find(|&w| self.groups.range(w).contains(&(p.key_group as usize)))
                .unwrap();
            let out = self.globals[w].push(&p.bytes).unwrap();
            apply(&mut self.table, out);
        }
    }

    /// One source's rows (a source keeps a key's rows in order: each source takes a share of
    /// the shops), cut into batches of `batch_rows`.
    fn run(&mut self, changes: &[(RowKind, Order)], batch_rows: usize) {
        let sources = self.locals.len();
        let mut shares: Vec<Vec<(RowKind, Order)>> = vec![vec![]; sources];
        for c in changes {
            let s =
                c.1.0
                    .as_ref()
                    .map_or(0, |s| s.len() + s.as_bytes()[s.len() - 1] as usize);
            shares[s % sources].push(c.clone());
        }
        let mut at = vec![0; sources];
        while (0..sources).any(|s| at[s] < shares[s].len()) {
            for s in 0..sources {
                let end = (at[s] + batch_rows).min(shares[s].len());
                if at[s] < end {
                    let parts = self.locals[s].push(&batch(&shares[s][at[s]..end])).unwrap();
                    self.route(parts);
                    at[s] = end;
                }
            }
        }
    }

    /// A checkpoint barrier: every local phase flushes, every global phase fires.
    fn barrier(&mut self) {
        for s in 0..self.locals.len() {
            let parts = self.locals[s].flush().unwrap();
            self.route(parts);
        }
        for w in 0..self.globals.len() {
            let out = self.globals[w].fire().unwrap();
            apply(&mut self.table, out);
        }
    }
}

#[test]
fn every_phase_and_parallelism_gives_the_reference_table() {
    for seed in 0..4 {
        let changes = changelog(seed, 3_000);
        let want = reference(&changes);
        for two_phase in [true, false] {
            for (sources, workers, batch_rows) in [(1, 1, 64), (2, 3, 100), (3, 2, 7)] {
                let mut job = Job::new(two_phase, sources, workers);
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
        let mut a = Job::new(two_phase, 2, 2);
        a.run(first, 50);
        a.barrier();
        let mut parts: Vec<Part> = vec![];
        for g in &mut a.globals {
            parts.extend(g.snapshot().unwrap());
        }
        let mut groups: Vec<u32> = parts.iter().map(|p| p.key_group).collect();
        groups.sort_unstable();
        groups.dedup();
        assert_eq!(groups.len(), parts.len(), "one part per key group");
        for workers in [3, 1] {
            let mut b = Job::new(two_phase, 2, workers);
            for (w, g) in b.globals.iter_mut().enumerate() {
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
        (
            "SELECT n, COUNT(*) FROM (SELECT shop, COUNT(*) AS n FROM orders GROUP BY shop) GROUP BY n",
            "one GROUP BY",
        ),
        ("SELECT shop FROM orders", "one GROUP BY"),
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
    let mut local = query(true).into_local().unwrap();
    let e = local.push(b"TLY1 not a batch").unwrap_err().to_string();
    assert!(e.contains("malformed column batch"), "{e}");
    let mut global = query(true).into_global().unwrap();
    let e = global.push(b"not arrow").unwrap_err().to_string();
    assert!(e.contains("not Arrow IPC"), "{e}");
}
