//! Soak test: a long stream whose key space churns under a state TTL, replayed on a recorded-time
//! clock, with memory sampled as it runs. With a TTL, expired keys are compacted away, so state
//! bytes and the process's resident memory stay flat however long the stream; without one they
//! grow with every new key.
//!
//! ```text
//! cargo run --release --example soak -- [--rows 100000000] [--ttl-ms 2000] [--window 100000]
//!     [--rows-per-ms 1000] [--workers 2] [--batch-size 65536] [--samples 20] [--ttl-off]
//! ```
//!
//! `--ttl-off` keeps the same stream but sets no TTL, for contrast.
//!
//! The stream (generated as it goes, seeded): row `i` arrives at recorded time
//! `i / rows-per-ms` ms; its key is drawn from a window of `window` consecutive key ids that
//! slides forward one id every `rows-per-ms * ttl-ms / window / 2` rows, so each key is written
//! for about half a TTL, then never again, and expires a TTL after its last write. The query is
//! `SELECT k, COUNT(*), SUM(amount), MAX(amount), COUNT(DISTINCT user) FROM s GROUP BY k` with
//! mini-batch on (size 10000 per worker, 1 s latency on the recorded clock), two-phase.
//! Prints one line per sample (rows, recorded time, keys in state, state MB, RSS MB,
//! compactions, rows/s), then the peak RSS of each half of the run.

use std::sync::Arc;
use std::time::Instant;

use arrow::array::{Int64Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema};
use datafusion_expr::{ExprFunctionExt, col};
use tally::aggregates::{count, count_star, max, sum};
use tally::clock::ManualClock;
use tally::{Config, GroupAggregate};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

struct Args {
    rows: u64,
    ttl_ms: i64,
    window: u64,
    rows_per_ms: u64,
    workers: usize,
    batch_size: usize,
    samples: u64,
    /// Keep the stream (its key churn follows `ttl_ms`) but set no TTL: the contrast run.
    ttl_off: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        rows: 100_000_000,
        ttl_ms: 2_000,
        window: 100_000,
        rows_per_ms: 1_000,
        workers: 2,
        batch_size: 65_536,
        samples: 20,
        ttl_off: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--ttl-off" {
            a.ttl_off = true;
            continue;
        }
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        let num = |v: &str| {
            v.parse::<u64>()
                .map_err(|_| format!("{flag}: '{v}' is not a count"))
        };
        match flag.as_str() {
            "--rows" => a.rows = num(&value)?,
            "--ttl-ms" => a.ttl_ms = num(&value)? as i64,
            "--window" => a.window = num(&value)?.max(1),
            "--rows-per-ms" => a.rows_per_ms = num(&value)?.max(1),
            "--workers" => a.workers = num(&value)?.max(1) as usize,
            "--batch-size" => a.batch_size = num(&value)?.max(1) as usize,
            "--samples" => a.samples = num(&value)?.max(1),
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(a)
}

/// Resident and peak resident memory of this process in MB (Linux), or zeros.
fn rss_mb() -> (f64, f64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<f64>().ok())
            .map_or(0.0, |kb| kb / 1024.0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// SplitMix64: a fast seeded generator for the stream.
struct Mix(u64);

impl Mix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = parse_args()?;
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("amount", DataType::Int64, false),
        Field::new("user", DataType::Int64, false),
    ]));
    let config = Config::from_pairs([
        ("table.exec.mini-batch.enabled", "true".to_string()),
        ("table.exec.mini-batch.allow-latency", "1 s".to_string()),
        ("table.exec.mini-batch.size", "10000".to_string()),
        (
            "table.exec.resource.default-parallelism",
            args.workers.to_string(),
        ),
        (
            "table.exec.state.ttl",
            format!("{} ms", if args.ttl_off { 0 } else { args.ttl_ms }),
        ),
    ])?;
    let clock = ManualClock::new(0);
    let mut agg = GroupAggregate::builder(schema.clone())
        .group_by([col("k")])
        .aggregate([
            count_star().alias("n"),
            sum(col("amount")).alias("total"),
            max(col("amount")).alias("biggest"),
            count(col("user")).distinct().build()?.alias("users"),
        ])
        .config(config)
        .clock(Arc::new(clock.clone()))
        .build_parallel()?;
    // The window slides one key id per `step` rows: a key is written for about
    // `window * step` rows, i.e. `window * step / rows_per_ms` ms of recorded time. A step of
    // `rows_per_ms * ttl_ms / window / 2` (at least 1) makes a key live for about half a TTL.
    let step = (args.rows_per_ms * args.ttl_ms.max(1) as u64 / args.window / 2).max(1);
    println!(
        "soak: {} rows, {} rows per recorded ms, TTL {}, key window {} sliding 1 id per {} rows, {} workers, batches of {}",
        args.rows,
        args.rows_per_ms,
        if args.ttl_off {
            "off".to_string()
        } else {
            format!("{} ms", args.ttl_ms)
        },
        args.window,
        step,
        args.workers,
        args.batch_size
    );
    println!(
        "| rows (M) | recorded s | keys in state | state MB | peak state MB | RSS MB | compactions | M rows/s |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut rng = Mix(42);
    let started = Instant::now();
    let every = args.rows / args.samples;
    let mut next_sample = every;
    let mut halves = [0.0f64; 2];
    let mut out_rows = 0u64;
    let mut i = 0u64;
    let (mut ks, mut amounts, mut users) = (vec![], vec![], vec![]);
    while i < args.rows {
        let n = (args.rows - i).min(args.batch_size as u64);
        ks.clear();
        amounts.clear();
        users.clear();
        for j in i..i + n {
            let r = rng.next();
            ks.push((j / step + r % args.window) as i64);
            amounts.push(((r >> 20) % 10_000) as i64);
            users.push(((r >> 40) % 64) as i64);
        }
        i += n;
        clock.set_ms((i / args.rows_per_ms) as i64);
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Int64Array::from(std::mem::take(&mut ks))),
                Arc::new(Int64Array::from(std::mem::take(&mut amounts))),
                Arc::new(Int64Array::from(std::mem::take(&mut users))),
            ],
        )?;
        out_rows += agg
            .push(&batch)?
            .iter()
            .map(|b| b.num_rows() as u64)
            .sum::<u64>();
        if i >= next_sample || i == args.rows {
            next_sample += every;
            let m = agg.metrics()?;
            let (rss, _) = rss_mb();
            halves[usize::from(i * 2 > args.rows)] =
                halves[usize::from(i * 2 > args.rows)].max(rss);
            println!(
                "| {:.0} | {:.1} | {} | {:.1} | {:.1} | {:.0} | {} | {:.2} |",
                i as f64 / 1e6,
                i as f64 / args.rows_per_ms as f64 / 1e3,
                m.keys_in_state,
                m.state_bytes as f64 / 1e6,
                m.peak_state_bytes as f64 / 1e6,
                rss,
                m.compactions,
                i as f64 / started.elapsed().as_secs_f64() / 1e6
            );
        }
    }
    out_rows += agg
        .finish()?
        .iter()
        .map(|b| b.num_rows() as u64)
        .sum::<u64>();
    let (_, hwm) = rss_mb();
    println!(
        "\n{} rows in {:.1} s ({:.2} M rows/s), {} changelog rows; peak RSS {:.0} MB; largest RSS sample in the first half {:.0} MB, in the second half {:.0} MB",
        args.rows,
        started.elapsed().as_secs_f64(),
        args.rows as f64 / started.elapsed().as_secs_f64() / 1e6,
        out_rows,
        hwm,
        halves[0],
        halves[1]
    );
    Ok(())
}
