//! Nexmark q15 and q16 (COUNT DISTINCT bidders and auctions with FILTERs, by day and by channel
//! and day) as SQL over a generated bid stream in Parquet, with split-distinct off and on, at
//! several worker counts. Prints a Markdown table: events/s (median), the state of the last
//! aggregate (keys, bytes) and its skew ratio.
//!
//! ```text
//! cargo run --release --example nexmark -- [--events N] [--workers 1,2] [--repeat 3]
//!     [--buckets 1024] [--dir target/nexmark]
//! ```
//!
//! The Parquet file is written once per event count (`DIR/bid-N.parquet`) and reused.

use std::path::{Path, PathBuf};
use std::time::Instant;

use tally::datagen::{NexmarkBids, first_rows, write_file};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn write_bids(path: &Path, events: usize) -> Result<(), Box<dyn std::error::Error>> {
    if path.exists() {
        return Ok(());
    }
    std::fs::create_dir_all(path.parent().unwrap_or(Path::new(".")))?;
    let mut bids = NexmarkBids::new(0, 65_536);
    let schema = bids.schema();
    write_file(
        path,
        schema,
        first_rows(events as u64, || bids.next_batch()),
        |_| {},
    )?;
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut events = 10_000_000usize;
    let mut workers = vec![1usize, 2];
    let mut repeat = 3usize;
    let mut buckets = 1024u32;
    let mut dir = PathBuf::from("target/nexmark");
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let v = it.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--events" => events = v.parse()?,
            "--workers" => {
                workers = v.split(',').map(str::parse).collect::<Result<_, _>>()?;
            }
            "--repeat" => repeat = v.parse::<usize>()?.max(1),
            "--buckets" => buckets = v.parse()?,
            "--dir" => dir = PathBuf::from(v),
            other => return Err(format!("unknown flag {other}").into()),
        }
    }
    let path = dir.join(format!("bid-{events}.parquet"));
    let started = Instant::now();
    write_bids(&path, events)?;
    eprintln!(
        "bids: {} ({:.1} s to generate or find)",
        path.display(),
        started.elapsed().as_secs_f64()
    );
    let table = format!(
        "CREATE TABLE bid (auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING, \
         `dateTime` TIMESTAMP(3), extra STRING) WITH ('connector' = 'filesystem', 'path' = '{}', \
         'format' = 'parquet');",
        path.display()
    );
    println!(
        "{events} bid events, median of {repeat}, mini-batch 5000 rows per worker, two-phase (AUTO), {buckets} buckets when split\n"
    );
    println!(
        "| query | split | workers | M events/s | vs no split | final keys | state MB (all aggregates) | skew ratio (partial or only aggregate) |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
    for name in ["q15", "q16"] {
        let query = tally::sql::queries::builtin(name)
            .ok_or("no such query")?
            .sql;
        for &p in &workers {
            let mut base = None;
            for split in [false, true] {
                let script = format!(
                    "SET 'table.exec.resource.default-parallelism' = '{p}';
                     SET 'table.exec.mini-batch.enabled' = 'true';
                     SET 'table.exec.mini-batch.allow-latency' = '1 h';
                     SET 'table.exec.mini-batch.size' = '5000';
                     SET 'table.optimizer.distinct-agg.split.enabled' = '{split}';
                     SET 'table.optimizer.distinct-agg.split.bucket-num' = '{buckets}';
                     {table} {query};"
                );
                let mut times = vec![];
                let mut stats = None;
                for _ in 0..repeat {
                    let mut q = tally::sql::plan_script(&script)?;
                    let start = Instant::now();
                    let s = q.job().run(65_536, &mut tally::sink::Discard, |_, _| {})?;
                    times.push(start.elapsed().as_secs_f64());
                    stats = Some(s);
                }
                times.sort_by(f64::total_cmp);
                let rate = events as f64 / times[times.len() / 2] / 1e6;
                let base_rate = *base.get_or_insert(rate);
                let s = stats.ok_or("no run")?;
                let last = s.aggregates.last().ok_or("no aggregate")?;
                let state: u64 = s.aggregates.iter().map(|m| m.state_bytes).sum();
                let skew = s.aggregates.first().map_or(1.0, |m| m.skew_ratio);
                println!(
                    "| {name} | {} | {p} | {rate:.2} | {:.2}x | {} | {:.1} | {skew:.2} |",
                    if split { "on" } else { "off" },
                    rate / base_rate,
                    last.keys_in_state,
                    state as f64 / 1e6
                );
            }
        }
    }
    Ok(())
}
