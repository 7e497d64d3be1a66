//! What the Flink operator's Rust tests share: seeded changelogs of orders, their column
//! batches, a row-at-a-time reference, and a Flink job's chain of phases without a JVM (parts
//! routed to the owner of their key group as Flink routes them).
#![allow(dead_code)] // each test binary uses its own share

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{Array, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use arrow::util::display::array_value_to_string;
use tally::changelog::{ChangeBatch, RowKind, op_array};
use tally::operator::key_groups::KeyGroups;
use tally_flink::{Column, Output, Phase, Query, Type, wire};

pub const SQL: &str = "SELECT shop, COUNT(*) AS orders, SUM(amount) AS total, \
    COUNT(DISTINCT user_id) AS buyers, SUM(amount) FILTER (WHERE user_id < 10) AS early \
    FROM orders GROUP BY shop";

pub fn columns() -> Vec<Column> {
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

pub fn schema() -> Arc<Schema> {
    Arc::new(Schema::new(vec![
        Field::new("shop", DataType::Utf8, true),
        Field::new("user_id", DataType::Int64, true),
        Field::new("amount", DataType::Int64, true),
    ]))
}

pub type Order = (Option<String>, i64, Option<i64>);

/// A seeded changelog: inserts, updates (-U, +U) and deletes of live rows, a hot shop, NULL
/// shops and amounts.
pub fn changelog(seed: u64, n: usize) -> Vec<(RowKind, Order)> {
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

pub fn batch(rows: &[(RowKind, Order)]) -> Vec<u8> {
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
    let changes = if kinds.iter().all(|k| *k == RowKind::Insert) {
        ChangeBatch::inserts(data) // as Java sends an insert-only input: no kinds
    } else {
        ChangeBatch::try_new(Some(op_array(&kinds)), data).unwrap()
    };
    wire::encode(&changes).unwrap()
}

/// The final table, row at a time: per shop, the live rows' count, sum, distinct users and the
/// filtered sum.
pub fn reference(changes: &[(RowKind, Order)]) -> BTreeMap<Option<String>, String> {
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
            let text = |v: Option<i64>| v.map_or("NULL".to_string(), |v| v.to_string());
            let row = format!(
                "{} {} {} {}",
                rows.len(),
                text(total),
                users.len(),
                text(early)
            );
            (shop, row)
        })
        .collect()
}

pub fn options(two_phase: bool) -> Vec<(String, String)> {
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

pub fn query(sql: &str, two_phase: bool) -> Query {
    query_over(sql, two_phase, true)
}

pub fn query_over(sql: &str, two_phase: bool, changelog: bool) -> Query {
    Query::plan(sql, "orders", &columns(), changelog, &options(two_phase)).unwrap()
}

/// Applies column batches of changes (of `schema`) to a final table keyed by the first column,
/// checking that each retraction takes back the row the table holds, and appends each change
/// to `changelog` (`+I key columns...`).
pub fn apply(
    schema: &Arc<Schema>,
    table: &mut BTreeMap<Option<String>, String>,
    changelog: &mut Vec<String>,
    outputs: Vec<Vec<u8>>,
) {
    for bytes in outputs {
        let c = wire::decode(&bytes, schema).unwrap();
        let kinds = c.row_kinds().unwrap();
        let d = &c.data;
        let cell = |i: usize, r: usize| {
            let a = d.column(i);
            a.is_valid(r).then(|| array_value_to_string(a, r).unwrap())
        };
        for (r, kind) in kinds.iter().enumerate() {
            let key = cell(0, r);
            let row = (1..d.num_columns())
                .map(|i| cell(i, r).unwrap_or_else(|| "NULL".into()))
                .collect::<Vec<_>>()
                .join(" ");
            let shown = key.as_deref().unwrap_or("NULL");
            changelog.push(format!("{} {shown} {row}", kind.short()));
            if kind.is_retract() {
                let had = table.remove(&key);
                assert_eq!(had.as_deref(), Some(row.as_str()), "{kind:?} of {key:?}");
            } else {
                table.insert(key, row);
            }
        }
    }
}

/// A Flink job's chain: phase 0 on each source, every later phase on each of `workers`
/// subtasks, parts routed to the subtask that owns their key group as Flink routes them.
pub struct Job {
    pub phases: Vec<Vec<Phase>>,
    pub groups: KeyGroups,
    pub output: Arc<Schema>,
    pub table: BTreeMap<Option<String>, String>,
    /// Every change the last phase emitted, in order.
    pub changelog: Vec<String>,
}

impl Job {
    pub fn new(sql: &str, two_phase: bool, sources: usize, workers: usize) -> Job {
        let q = query(sql, two_phase);
        let phases = (0..q.phases())
            .map(|k| {
                let n = if k == 0 { sources } else { workers };
                (0..n)
                    .map(|_| query(sql, two_phase).into_phase(k).unwrap())
                    .collect()
            })
            .collect();
        Job::with(phases, &q, workers)
    }

    /// A job of the given phase instances of query `q`.
    pub fn with(phases: Vec<Vec<Phase>>, q: &Query, workers: usize) -> Job {
        let output = Arc::new(Schema::new(
            q.output()
                .iter()
                .map(|c| Field::new(&c.name, c.ty.arrow(), c.nullable))
                .collect::<Vec<_>>(),
        ));
        Job {
            phases,
            groups: KeyGroups::new(q.key_groups(), workers).unwrap(),
            output,
            table: BTreeMap::new(),
            changelog: vec![],
        }
    }

    /// What phase `k`'s instance handed on: parts into phase k + 1, rows into the table.
    pub fn hand_on(&mut self, k: usize, out: Output) {
        apply(&self.output, &mut self.table, &mut self.changelog, out.rows);
        for p in out.parts {
            let w = (0..self.groups.workers())
                .find(|&w| self.groups.range(w).contains(&(p.key_group as usize)))
                .unwrap();
            let next = self.phases[k + 1][w].push(&p.bytes).unwrap();
            self.hand_on(k + 1, next);
        }
    }

    /// One source's rows (a source keeps a key's rows in order: each source takes a share of
    /// the shops), cut into batches of `batch_rows`.
    pub fn run(&mut self, changes: &[(RowKind, Order)], batch_rows: usize) {
        let sources = self.phases[0].len();
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
                    let out = self.phases[0][s]
                        .push(&batch(&shares[s][at[s]..end]))
                        .unwrap();
                    self.hand_on(0, out);
                    at[s] = end;
                }
            }
        }
    }

    /// A checkpoint barrier, or the end of input: every phase flushes, in chain order.
    pub fn barrier(&mut self) {
        for k in 0..self.phases.len() {
            for i in 0..self.phases[k].len() {
                let out = self.phases[k][i].flush().unwrap();
                self.hand_on(k, out);
            }
        }
    }
}
