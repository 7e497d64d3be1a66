//! The central invariant, checked against a row-at-a-time reference written here.
//!
//! Seeded random streams (insert-only, and changelogs with deletes and `-U/+U` updates; a hot key
//! holding about half the rows; NULL keys and values; FILTERs; DISTINCT) are pushed in random
//! batch sizes through `GroupAggregate` under many configurations. After every push, the result of
//! applying the emitted changelog must equal the reference's from-scratch GROUP BY over the input
//! rows whose mini-batch has fired; after `finish`, over all rows. With `-U` switched off the
//! changelog is applied as upserts by key.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use arrow::array::{
    ArrayRef, BooleanArray, DictionaryArray, Int8Array, Int64Array, RecordBatch, StringArray,
};
use arrow::datatypes::{DataType, Field, Int32Type, Schema, SchemaRef};
use datafusion_expr::{Expr, ExprFunctionExt, col, lit};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tally::aggregates::{avg, count, count_star, max, min, sum};

use crate::common::{Changes, Materialized, build, config, format_changes};
use tally::changelog::ChangeBatch;

/// One input row.
#[derive(Debug, Clone, PartialEq)]
struct Row {
    k: Option<String>,
    k2: i64,
    v: Option<i64>,
    u: Option<i64>,
    s: Option<String>,
    f: Option<bool>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum KeyType {
    Utf8,
    Dictionary,
    Int64,
}

#[derive(Debug, Clone, Copy)]
enum Keys {
    /// `GROUP BY k`
    One,
    /// `GROUP BY k, k2`
    Two,
    /// no GROUP BY
    Global,
}

fn random_row(rng: &mut StdRng, n_keys: usize) -> Row {
    let k = if rng.random_bool(0.05) {
        None
    } else if rng.random_bool(0.5) {
        Some("7".to_string()) // the hot key
    } else {
        Some(rng.random_range(0..n_keys as i64).to_string())
    };
    let opt = |rng: &mut StdRng, p: f64| rng.random_bool(1.0 - p);
    Row {
        k,
        k2: rng.random_range(0..3),
        v: opt(rng, 0.1).then(|| rng.random_range(-50..100)),
        u: opt(rng, 0.1).then(|| rng.random_range(0..15)),
        s: opt(rng, 0.1).then(|| ["x", "yy", "a", "zz", "m"][rng.random_range(0..5)].to_string()),
        f: opt(rng, 0.1).then(|| rng.random_bool(0.5)),
    }
}

/// A stream of (retract?, row): inserts, deletes of live rows, and -U/+U updates of live rows.
fn random_stream(
    rng: &mut StdRng,
    len: usize,
    retractions: bool,
    n_keys: usize,
) -> Vec<(bool, Row)> {
    // An update keeps the key: -U old, +U new.
    crate::common::changelog_stream(
        rng,
        len,
        retractions,
        |rng| random_row(rng, n_keys),
        |old, new| {
            new.k = old.k.clone();
            new.k2 = old.k2;
        },
    )
}

fn schema(key_type: KeyType, changelog: bool) -> SchemaRef {
    let mut fields = vec![];
    if changelog {
        fields.push(Field::new("op", DataType::Int8, false));
    }
    fields.push(Field::new(
        "k",
        match key_type {
            KeyType::Utf8 => DataType::Utf8,
            KeyType::Dictionary => {
                DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8))
            }
            KeyType::Int64 => DataType::Int64,
        },
        true,
    ));
    fields.extend([
        Field::new("k2", DataType::Int64, false),
        Field::new("v", DataType::Int64, true),
        Field::new("u", DataType::Int64, true),
        Field::new("s", DataType::Utf8, true),
        Field::new("f", DataType::Boolean, true),
    ]);
    Arc::new(Schema::new(fields))
}

fn to_batch(
    schema: &SchemaRef,
    key_type: KeyType,
    rows: &[(bool, Row)],
    update_ops: bool,
) -> RecordBatch {
    let mut cols: Vec<ArrayRef> = vec![];
    if schema.field(0).name() == "op" {
        // Retractions as -D or -U, accumulations as +I or +U: both spellings must behave alike.
        cols.push(Arc::new(Int8Array::from_iter_values(rows.iter().map(
            |(r, _)| match (*r, update_ops) {
                (false, false) => 0,
                (true, true) => 1,
                (false, true) => 2,
                (true, false) => 3,
            },
        ))));
    }
    let keys = rows.iter().map(|(_, r)| r.k.clone());
    cols.push(match key_type {
        KeyType::Utf8 => Arc::new(StringArray::from_iter(keys)),
        KeyType::Dictionary => Arc::new(
            keys.collect::<Vec<Option<String>>>()
                .iter()
                .map(|k| k.as_deref())
                .collect::<DictionaryArray<Int32Type>>(),
        ),
        KeyType::Int64 => Arc::new(Int64Array::from_iter(
            keys.map(|k| k.map(|k| k.parse::<i64>().unwrap())),
        )),
    });
    cols.push(Arc::new(Int64Array::from_iter_values(
        rows.iter().map(|(_, r)| r.k2),
    )));
    cols.push(Arc::new(Int64Array::from_iter(
        rows.iter().map(|(_, r)| r.v),
    )));
    cols.push(Arc::new(Int64Array::from_iter(
        rows.iter().map(|(_, r)| r.u),
    )));
    cols.push(Arc::new(StringArray::from_iter(
        rows.iter().map(|(_, r)| r.s.clone()),
    )));
    cols.push(Arc::new(BooleanArray::from_iter(
        rows.iter().map(|(_, r)| r.f),
    )));
    RecordBatch::try_new(schema.clone(), cols).unwrap()
}

fn key_exprs(keys: Keys) -> Vec<Expr> {
    match keys {
        Keys::One => vec![col("k")],
        Keys::Two => vec![col("k"), col("k2")],
        Keys::Global => vec![],
    }
}

fn aggregates() -> Vec<Expr> {
    vec![
        count_star(),
        count(col("v")),
        sum(col("v")),
        avg(col("v")),
        min(col("v")),
        max(col("v")),
        max(col("s")),
        min(col("s")).filter(col("f")).build().unwrap(),
        sum(col("v")).filter(col("f")).build().unwrap(),
        count(col("u")).distinct().build().unwrap(),
        count(col("u"))
            .distinct()
            .filter(col("v").gt(lit(0i64)))
            .build()
            .unwrap(),
        sum(col("u")).distinct().build().unwrap(),
        avg(col("u")).distinct().filter(col("f")).build().unwrap(),
        count_star().filter(col("v").lt(lit(0i64))).build().unwrap(),
    ]
}

fn opt<T: ToString>(v: Option<T>) -> String {
    v.map_or("null".to_string(), |v| v.to_string())
}

/// The reference: a from-scratch GROUP BY over the live rows, one formatted line per group.
fn reference(rows: &[(bool, Row)], keys: Keys) -> Vec<String> {
    // Live multiset per group key (retractions remove one equal row).
    let mut groups: BTreeMap<Vec<String>, Vec<Row>> = BTreeMap::new();
    for (retract, row) in rows {
        let key = match keys {
            Keys::One => vec![opt(row.k.clone())],
            Keys::Two => vec![opt(row.k.clone()), row.k2.to_string()],
            Keys::Global => vec![],
        };
        let g = groups.entry(key).or_default();
        if *retract {
            let i = g
                .iter()
                .position(|r| r == row)
                .expect("stream retracts a live row");
            g.swap_remove(i);
        } else {
            g.push(row.clone());
        }
    }
    let mut out = vec![];
    for (key, rows) in groups {
        if rows.is_empty() {
            continue; // deleted (retraction input) — insert-only groups never empty out
        }
        let vs: Vec<i64> = rows.iter().filter_map(|r| r.v).collect();
        let sum_v = (!vs.is_empty()).then(|| vs.iter().sum::<i64>());
        let avg_v = sum_v.map(|s| s / vs.len() as i64);
        let ss: Vec<&String> = rows.iter().filter_map(|r| r.s.as_ref()).collect();
        let fs: Vec<&String> = rows
            .iter()
            .filter(|r| r.f == Some(true))
            .filter_map(|r| r.s.as_ref())
            .collect();
        let fv: Vec<i64> = rows
            .iter()
            .filter(|r| r.f == Some(true))
            .filter_map(|r| r.v)
            .collect();
        let us: BTreeSet<i64> = rows.iter().filter_map(|r| r.u).collect();
        let us_pos: BTreeSet<i64> = rows
            .iter()
            .filter(|r| r.v.is_some_and(|v| v > 0))
            .filter_map(|r| r.u)
            .collect();
        let us_f: BTreeSet<i64> = rows
            .iter()
            .filter(|r| r.f == Some(true))
            .filter_map(|r| r.u)
            .collect();
        let mut vals = key;
        vals.extend([
            rows.len().to_string(),
            vs.len().to_string(),
            opt(sum_v),
            opt(avg_v),
            opt(vs.iter().min()),
            opt(vs.iter().max()),
            opt(ss.iter().max()),
            opt(fs.iter().min()),
            opt((!fv.is_empty()).then(|| fv.iter().sum::<i64>())),
            us.len().to_string(),
            us_pos.len().to_string(),
            opt((!us.is_empty()).then(|| us.iter().sum::<i64>())),
            opt((!us_f.is_empty()).then(|| us_f.iter().sum::<i64>() / us_f.len() as i64)),
            rows.iter()
                .filter(|r| r.v.is_some_and(|v| v < 0))
                .count()
                .to_string(),
        ]);
        out.push(format!("[{}]", vals.join(", ")));
    }
    out.sort();
    out
}

/// The changelog applied as upserts by key (for `-U`-less output).
#[derive(Default)]
struct Upserted(BTreeMap<String, String>);

impl Upserted {
    fn apply<B: Changes>(&mut self, batches: &[B], n_keys: usize) {
        for line in format_changes(batches) {
            let (kind, row) = line.split_at(2);
            let fields: Vec<&str> = row[1..row.len() - 1].split(", ").collect();
            let key = fields[..n_keys].join(", ");
            match kind {
                "+I" | "+U" => {
                    self.0.insert(key, row.to_string());
                }
                "-D" => {
                    assert_eq!(
                        self.0.remove(&key).as_deref(),
                        Some(row),
                        "-D of a row not there"
                    );
                }
                other => panic!("{other} in an upsert changelog"),
            }
        }
    }
    fn rows(&self) -> Vec<String> {
        let mut v: Vec<String> = self.0.values().cloned().collect();
        v.sort();
        v
    }
}

#[allow(clippy::too_many_arguments)]
fn check(
    seed: u64,
    retractions: bool,
    keys: Keys,
    key_type: KeyType,
    mini_batch: Option<usize>,
    update_before: bool,
    len: usize,
    n_keys: usize,
) {
    check_with(
        seed,
        retractions,
        keys,
        key_type,
        mini_batch,
        update_before,
        len,
        n_keys,
        None,
    );
}

#[allow(clippy::too_many_arguments)]
fn check_with(
    seed: u64,
    retractions: bool,
    keys: Keys,
    key_type: KeyType,
    mini_batch: Option<usize>,
    update_before: bool,
    len: usize,
    n_keys: usize,
    ttl: Option<&str>,
) {
    let ctx = format!(
        "seed {seed} retractions {retractions} keys {keys:?} {key_type:?} mini-batch {mini_batch:?} ub {update_before} ttl {ttl:?}"
    );
    let mut cfg = config(mini_batch, update_before);
    if let Some(ttl) = ttl {
        cfg.set("table.exec.state.ttl", ttl).unwrap();
    }
    let mut rng = StdRng::seed_from_u64(seed);
    let stream = random_stream(&mut rng, len, retractions, n_keys);
    let schema = schema(key_type, retractions);
    let (mut agg, _clock) = build(&schema, key_exprs(keys), aggregates(), cfg);
    let n_out_keys = key_exprs(keys).len();
    let mut retract_view = Materialized::default();
    let mut upsert_view = Upserted::default();
    let apply = |rv: &mut Materialized, uv: &mut Upserted, batches: &[ChangeBatch]| {
        if update_before {
            rv.apply(batches);
        } else {
            uv.apply(batches, n_out_keys);
        }
    };
    let view = |rv: &Materialized, uv: &Upserted| if update_before { rv.rows() } else { uv.rows() };
    let mut pushed = 0;
    while pushed < stream.len() {
        let n = rng.random_range(0..=40).min(stream.len() - pushed);
        let batch = to_batch(
            &schema,
            key_type,
            &stream[pushed..pushed + n],
            rng.random_bool(0.5),
        );
        let out = agg.push(&batch).unwrap();
        apply(&mut retract_view, &mut upsert_view, &out);
        pushed += n;
        // Rows whose mini-batch has fired (the clock never moves, so only the size trigger fires).
        let fired = match mini_batch {
            None => pushed,
            Some(size) => pushed / size * size,
        };
        assert_eq!(
            view(&retract_view, &upsert_view),
            reference(&stream[..fired], keys),
            "{ctx}: after {pushed} rows"
        );
    }
    let out = agg.finish().unwrap();
    apply(&mut retract_view, &mut upsert_view, &out);
    assert_eq!(
        view(&retract_view, &upsert_view),
        reference(&stream, keys),
        "{ctx}: at the end"
    );
    let live_groups = reference(&stream, keys).len() as u64;
    assert_eq!(
        agg.metrics().keys_in_state,
        live_groups,
        "{ctx}: keys in state"
    );
}

const MINI_BATCHES: [Option<usize>; 5] = [None, Some(1), Some(3), Some(17), Some(100_000)];

#[test]
fn insert_only_matches_reference() {
    for (i, mb) in MINI_BATCHES.into_iter().enumerate() {
        for (j, kt) in [KeyType::Utf8, KeyType::Dictionary, KeyType::Int64]
            .into_iter()
            .enumerate()
        {
            check(
                100 + (i * 3 + j) as u64,
                false,
                Keys::One,
                kt,
                mb,
                true,
                300,
                12,
            );
        }
        check(
            200 + i as u64,
            false,
            Keys::Two,
            KeyType::Utf8,
            mb,
            true,
            300,
            12,
        );
        check(
            300 + i as u64,
            false,
            Keys::Global,
            KeyType::Utf8,
            mb,
            true,
            200,
            12,
        );
    }
}

#[test]
fn retractions_match_reference() {
    for (i, mb) in MINI_BATCHES.into_iter().enumerate() {
        for (j, kt) in [KeyType::Utf8, KeyType::Dictionary, KeyType::Int64]
            .into_iter()
            .enumerate()
        {
            check(
                400 + (i * 3 + j) as u64,
                true,
                Keys::One,
                kt,
                mb,
                true,
                400,
                10,
            );
        }
        check(
            500 + i as u64,
            true,
            Keys::Two,
            KeyType::Dictionary,
            mb,
            true,
            400,
            6,
        );
        check(
            600 + i as u64,
            true,
            Keys::Global,
            KeyType::Utf8,
            mb,
            true,
            250,
            6,
        );
    }
}

#[test]
fn upsert_changelog_without_update_before_matches_reference() {
    for (i, mb) in MINI_BATCHES.into_iter().enumerate() {
        check(
            700 + i as u64,
            true,
            Keys::One,
            KeyType::Utf8,
            mb,
            false,
            400,
            10,
        );
        check(
            800 + i as u64,
            false,
            Keys::Two,
            KeyType::Int64,
            mb,
            false,
            300,
            10,
        );
    }
}

/// Few keys and long streams: groups are deleted and come back many times.
#[test]
fn groups_deleted_and_reborn_match_reference() {
    for (i, mb) in MINI_BATCHES.into_iter().enumerate() {
        check(
            900 + i as u64,
            true,
            Keys::One,
            KeyType::Utf8,
            mb,
            true,
            1500,
            2,
        );
    }
}

/// A TTL that never expires (the clock does not move) changes the changelog (unchanged values are
/// re-emitted) but not the result.
#[test]
fn unexpired_ttl_matches_reference() {
    for (i, mb) in MINI_BATCHES.into_iter().enumerate() {
        check_with(
            1000 + i as u64,
            true,
            Keys::One,
            KeyType::Utf8,
            mb,
            true,
            300,
            6,
            Some("1 h"),
        );
        check_with(
            1100 + i as u64,
            false,
            Keys::One,
            KeyType::Utf8,
            mb,
            false,
            300,
            6,
            Some("1 h"),
        );
    }
}

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
    let mut rng = StdRng::seed_from_u64(seed);
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

/// Group keys and key types the parallel tests cover.
const KEY_CASES: [(Keys, KeyType); 4] = [
    (Keys::One, KeyType::Utf8),
    (Keys::One, KeyType::Dictionary),
    (Keys::Two, KeyType::Int64),
    (Keys::Global, KeyType::Utf8),
];

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

/// The parallel aggregate of [`aggregates`] by `keys`, on a clock that stands still, spreading
/// even small batches over every worker and local phase.
fn parallel_aggregate(
    schema: &SchemaRef,
    keys: Keys,
    cfg: tally::Config,
    clock: &tally::clock::ManualClock,
) -> tally::ParallelAggregate {
    tally::GroupAggregate::builder(schema.clone())
        .group_by(key_exprs(keys))
        .aggregate(aggregates())
        .config(cfg)
        .clock(Arc::new(clock.clone()))
        .build_parallel()
        .unwrap()
        .with_min_slice_rows(1)
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
    let mut rng = StdRng::seed_from_u64(seed);
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
        bypasses > 20 && probes > 10 && bypassed_rows > 1000,
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
    assert!(local.bypass_decisions > 0, "{m}");
    assert!(local.probes > 0, "{m}");
    assert!(local.rows_bypassed > 0 && local.rows_in > 0, "{m}");
    assert_eq!(local.rows_in + local.rows_bypassed, 300, "{m}");
    assert!(local.last_ratio.is_some_and(|r| r > 0.3), "{m}");
    // Adaptive off: the local phase folds every row.
    let par = Parallel {
        adaptive: None,
        ..par
    };
    let m = check_parallel(1, true, Keys::Two, KeyType::Utf8, Some(17), par);
    let local = m.local.unwrap();
    assert_eq!(
        (local.rows_in, local.rows_bypassed, local.bypass_decisions),
        (300, 0, 0)
    );
}

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
