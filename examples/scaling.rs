//! How throughput scales with workers: one-phase vs two-phase aggregation (adaptive local phase
//! on and off) over generated orders held in memory, for a hot key, uniform keys and
//! high-cardinality keys. Prints a Markdown table: median input rows/s over the repeats, the
//! skew ratio (busiest worker's rows received / mean), the local phase's reduction ratio and
//! decision, and the state size.
//!
//! ```text
//! cargo run --release --example scaling -- [--rows N] [--workers 1,2,4] [--repeat 3]
//!     [--datasets hot,uniform,high-card] [--strategies one-phase,two-phase,two-phase-fixed]
//!     [--mini-batch 10000] [--batch-size 131072] [--min-slice-rows 1024]
//!     [--runtimes ordered,pipelined]
//! ```
//!
//! Datasets (seeded, `tally::datagen`): `hot` — 200 shops, `shop-0000` holding half the rows,
//! the rest Zipf(1.1), `GROUP BY shop`; `uniform` — 200 shops with equal shares, `GROUP BY shop`;
//! `high-card` — `GROUP BY user_id` over as many possible users as rows (about 63% distinct).
//! `users:N` — `GROUP BY user_id` over N equally likely users (to set the local phase's reduction
//! ratio). The query is `COUNT(*), SUM(amount)`. `two-phase-fixed` is two-phase with the adaptive
//! local phase off; `bypass` is two-phase whose local phase is bypassed after the first
//! mini-batch. The mini-batch size is per worker, as in Flink.
//!
//! Runtimes: `ordered` pushes the batches one by one (`ParallelAggregate::push`, a barrier per
//! step); `pipelined` hands the workers contiguous shares of the batches as input splits
//! (`ParallelAggregate::run_splits`: a source task per split, mini-batches per worker, no
//! barrier), and the table adds its serial fraction (the share of the wall time with at most
//! one task busy) and the mean number of tasks busy.

use std::sync::Arc;
use std::time::Instant;

use arrow::array::RecordBatch;
use datafusion_expr::col;
use tally::aggregates::{count_star, sum};
use tally::changelog::ChangeBatch;
use tally::clock::ManualClock;
use tally::datagen::{OrdersConfig, OrdersGenerator};
use tally::operator::pipelined::{InputOrder, Split};
use tally::{Config, GroupAggregate};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

struct Args {
    rows: usize,
    workers: Vec<usize>,
    repeat: usize,
    datasets: Vec<String>,
    strategies: Vec<String>,
    mini_batch: usize,
    batch_size: usize,
    /// The smallest slice worth a task of its own (None: the operator's default).
    min_slice_rows: Option<usize>,
    runtimes: Vec<String>,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        rows: 10_000_000,
        workers: vec![1, 2],
        repeat: 3,
        datasets: vec!["hot".into(), "uniform".into(), "high-card".into()],
        strategies: vec![
            "one-phase".into(),
            "two-phase".into(),
            "two-phase-fixed".into(),
        ],
        mini_batch: 10_000,
        batch_size: 131_072,
        min_slice_rows: None,
        runtimes: vec!["ordered".into(), "pipelined".into()],
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        let num = |v: &str| {
            v.parse::<usize>()
                .map_err(|_| format!("{flag}: bad number {v}"))
        };
        match flag.as_str() {
            "--rows" => a.rows = num(&value)?,
            "--repeat" => a.repeat = num(&value)?.max(1),
            "--mini-batch" => a.mini_batch = num(&value)?.max(1),
            "--batch-size" => a.batch_size = num(&value)?.max(1),
            "--min-slice-rows" => a.min_slice_rows = Some(num(&value)?.max(1)),
            "--workers" => {
                a.workers = value.split(',').map(num).collect::<Result<_, _>>()?;
            }
            "--datasets" => a.datasets = value.split(',').map(String::from).collect(),
            "--strategies" => a.strategies = value.split(',').map(String::from).collect(),
            "--runtimes" => {
                a.runtimes = value.split(',').map(String::from).collect();
                if let Some(bad) = a
                    .runtimes
                    .iter()
                    .find(|r| !matches!(r.as_str(), "ordered" | "pipelined"))
                {
                    return Err(format!(
                        "--runtimes: unknown runtime {bad} (ordered, pipelined)"
                    ));
                }
            }
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(a)
}

fn data(
    name: &str,
    rows: usize,
    batch_size: usize,
) -> Result<(Vec<RecordBatch>, &'static str), String> {
    let base = OrdersConfig {
        batch_size,
        ..OrdersConfig::default()
    };
    let (config, key) = match name {
        "hot" => (base, "shop"),
        "uniform" => (
            OrdersConfig {
                hot_share: 0.0,
                zipf: 0.0,
                keys: 201,
                ..base
            },
            "shop",
        ),
        "high-card" => (
            OrdersConfig {
                users: rows as i64,
                ..base
            },
            "user_id",
        ),
        other => match other.strip_prefix("users:").map(str::parse::<i64>) {
            // `GROUP BY user_id` over N equally likely users: the local phase's reduction ratio
            // follows from N and the rows per slice.
            Some(Ok(n)) if n > 0 => (OrdersConfig { users: n, ..base }, "user_id"),
            _ => return Err(format!("unknown dataset {other}")),
        },
    };
    Ok((OrdersGenerator::new(config).batches(rows), key))
}

fn config(strategy: &str, workers: usize, mini_batch: usize) -> Result<Config, String> {
    let mut pairs = vec![
        ("table.exec.mini-batch.enabled", "true".to_string()),
        ("table.exec.mini-batch.allow-latency", "1 h".to_string()),
        ("table.exec.mini-batch.size", mini_batch.to_string()),
        (
            "table.exec.resource.default-parallelism",
            workers.to_string(),
        ),
    ];
    match strategy {
        "one-phase" => pairs.push(("table.optimizer.agg-phase-strategy", "ONE_PHASE".into())),
        "two-phase" => pairs.push(("table.optimizer.agg-phase-strategy", "TWO_PHASE".into())),
        "two-phase-fixed" => {
            pairs.push(("table.optimizer.agg-phase-strategy", "TWO_PHASE".into()));
            pairs.push(("tally.exec.local-agg.adaptive.enabled", "false".into()));
        }
        "bypass" => {
            // Two-phase whose local phase steps aside after its first mini-batch, for good.
            pairs.push(("table.optimizer.agg-phase-strategy", "TWO_PHASE".into()));
            pairs.push(("tally.exec.local-agg.adaptive.threshold", "0.000001".into()));
            pairs.push(("tally.exec.local-agg.adaptive.min-rows", "1".into()));
            pairs.push((
                "tally.exec.local-agg.adaptive.probe-interval",
                u64::MAX.to_string(),
            ));
        }
        other => return Err(format!("unknown strategy {other}")),
    }
    Config::from_pairs(pairs).map_err(|e| e.to_string())
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "{} rows per run, median of {}, mini-batch {} rows per worker, {} rows per push, {cores} cores available\n",
        args.rows, args.repeat, args.mini_batch, args.batch_size
    );
    println!(
        "| dataset | strategy | runtime | workers | M rows/s | vs 1 worker | skew ratio | local phase | state MB | serial % | busy tasks |"
    );
    println!("|---|---|---|---:|---:|---:|---:|---|---:|---:|---:|");
    for dataset in &args.datasets {
        let (batches, key) = match data(dataset, args.rows, args.batch_size) {
            Ok(d) => d,
            Err(e) => {
                eprintln!("error: {e}");
                std::process::exit(1);
            }
        };
        let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
        for (strategy, runtime) in args
            .strategies
            .iter()
            .flat_map(|s| args.runtimes.iter().map(move |r| (s, r)))
        {
            let mut base = None;
            for &workers in &args.workers {
                let cfg = match config(strategy, workers, args.mini_batch) {
                    Ok(c) => c,
                    Err(e) => {
                        eprintln!("error: {e}");
                        std::process::exit(1);
                    }
                };
                let mut times = vec![];
                let mut metrics = None;
                for _ in 0..args.repeat {
                    let mut agg = GroupAggregate::builder(batches[0].schema())
                        .group_by([col(key)])
                        .aggregate([count_star(), sum(col("amount"))])
                        .config(cfg.clone())
                        .clock(Arc::new(ManualClock::new(0)))
                        .build_parallel()
                        .expect("aggregate");
                    if let Some(rows) = args.min_slice_rows {
                        agg.set_min_slice_rows(rows);
                    }
                    let start = Instant::now();
                    let mut out = 0usize;
                    if runtime == "pipelined" {
                        // Contiguous shares of the batches, one split per worker.
                        let splits: Vec<Split> = (0..workers)
                            .map(|w| -> Split {
                                let (lo, hi) = (
                                    batches.len() * w / workers,
                                    batches.len() * (w + 1) / workers,
                                );
                                let share = batches[lo..hi].to_vec();
                                Box::new(share.into_iter().map(|b| Ok(ChangeBatch::inserts(b))))
                            })
                            .collect();
                        agg.run_splits(splits, InputOrder::Any, &|b| Ok(vec![b]), &mut |_| {
                            out += 1;
                            Ok(())
                        })
                        .expect("run");
                    } else {
                        for b in &batches {
                            out += agg.push(b).expect("push").len();
                        }
                        out += agg.finish().expect("finish").len();
                    }
                    times.push(start.elapsed().as_secs_f64());
                    std::hint::black_box(out);
                    metrics = Some(agg.metrics().expect("metrics"));
                }
                if std::env::var_os("SCALING_TIMES").is_some() {
                    let ms: Vec<String> = times.iter().map(|t| format!("{:.0}", t * 1e3)).collect();
                    eprintln!(
                        "{dataset} {strategy} {runtime} {workers}: {} ms",
                        ms.join(" ")
                    );
                }
                times.sort_by(f64::total_cmp);
                let median = times[times.len() / 2];
                let rate = rows as f64 / median / 1e6;
                let base_rate = *base.get_or_insert(rate);
                let m = metrics.expect("at least one run");
                if std::env::var_os("SCALING_METRICS").is_some() {
                    eprintln!("{dataset} {strategy} {runtime} {workers}: {m}");
                }
                let local = match &m.local {
                    None => "-".to_string(),
                    Some(l) => {
                        // The ratio over every row the local phase folded.
                        let ratio = if l.rows_in > 0 {
                            format!("{:.3}", l.rows_out as f64 / l.rows_in as f64)
                        } else {
                            "-".to_string()
                        };
                        format!(
                            "{} (ratio {ratio})",
                            if l.bypassed { "bypassed" } else { "active" }
                        )
                    }
                };
                let serial = m.runtime.as_ref().map_or("-".to_string(), |r| {
                    format!("{:.1}", r.serial_fraction * 100.0)
                });
                let busy = m
                    .runtime
                    .as_ref()
                    .map_or("-".to_string(), |r| format!("{:.2}", r.mean_busy_tasks));
                println!(
                    "| {dataset} | {strategy} | {runtime} | {workers} | {rate:.1} | {:.2}x | {:.2} | {local} | {:.1} | {serial} | {busy} |",
                    rate / base_rate,
                    m.skew_ratio,
                    m.state_bytes as f64 / 1e6
                );
            }
        }
    }
}
