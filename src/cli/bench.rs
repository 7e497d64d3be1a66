//! `tally bench`: a query over a Parquet (or Arrow) file under several strategies and worker
//! counts, in one process, with a table on standard output and optionally JSON.

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde_json::json;
use tally::sql::queries::{BUILTINS, Builtin, builtin};
use tally::sql::{plan_script, sql_type_name};
use tally::{Error, Result};

/// Options of `tally bench`.
#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// A built-in query (orders-count, orders-distinct, q15, q16, q17) or a SELECT over the table
    /// named by --table.
    #[arg(long)]
    query: String,
    /// The input file (.parquet or .arrow); its columns become the table's.
    #[arg(long)]
    input: PathBuf,
    /// The table name for a SELECT given with --query (built-ins name their own).
    #[arg(long, default_value = "input")]
    table: String,
    /// An option for every run, as key=value (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// Strategies to run, comma-separated: off (mini-batch off), one-phase, two-phase, split
    /// (two-phase with split-distinct), split-auto (two-phase, split decided by Tally from the
    /// keys' skew on a sample).
    #[arg(long, default_value = "off,one-phase,two-phase,split")]
    matrix: String,
    /// Worker counts, comma-separated.
    #[arg(long, default_value = "1")]
    workers: String,
    /// Runs per configuration (the median is reported).
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// Mini-batch size per worker for the strategies that use mini-batch.
    #[arg(long, default_value_t = 5000)]
    mini_batch: u64,
    /// Rows per input batch, at most: a Parquet read also stops at each data page of a column
    /// read as a dictionary where those pages hold fewer rows (8,192 or more).
    #[arg(long, default_value_t = 65_536)]
    batch_size: usize,
    /// Write the results as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Also run the same built-in query over the same file in DuckDB (with as many threads as
    /// workers) through `scripts/duckdb_baseline.py` (install it with
    /// `scripts/install-duckdb.sh`), and report Tally's best rate / DuckDB's.
    #[arg(long)]
    duckdb: bool,
}

/// DuckDB's rows/s for `query` over `input` with `threads` threads, from the baseline script.
fn duckdb_rate(query: &Builtin, input: &Path, threads: usize, repeat: usize) -> Result<f64> {
    let script = std::env::var_os("TALLY_DUCKDB_SCRIPT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("scripts/duckdb_baseline.py"));
    let out = std::process::Command::new("python3")
        .arg(&script)
        .arg(query.name)
        .arg(query.sql)
        .arg(input)
        .args([
            "--repeat",
            &repeat.to_string(),
            "--threads",
            &threads.to_string(),
        ])
        .output()
        .map_err(|e| Error::io(format!("python3 {}: {e}", script.display())))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(Error::invalid_input(format!(
            "DuckDB baseline failed: {}",
            err.lines().last().unwrap_or("no output")
        )));
    }
    text.split_whitespace()
        .find_map(|w| w.strip_prefix("rows_per_sec="))
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| Error::internal(format!("unexpected baseline output: {text}")))
}

fn strategy_settings(name: &str, mini_batch: u64) -> Result<Vec<(String, String)>> {
    let mb = |v: &mut Vec<(String, String)>| {
        v.push(("table.exec.mini-batch.enabled".into(), "true".into()));
        v.push(("table.exec.mini-batch.allow-latency".into(), "1 s".into()));
        v.push(("table.exec.mini-batch.size".into(), mini_batch.to_string()));
    };
    let mut v = vec![];
    match name {
        "off" => v.push(("table.exec.mini-batch.enabled".into(), "false".into())),
        "one-phase" => {
            mb(&mut v);
            v.push((
                "table.optimizer.agg-phase-strategy".into(),
                "ONE_PHASE".into(),
            ));
        }
        "two-phase" => {
            mb(&mut v);
            v.push((
                "table.optimizer.agg-phase-strategy".into(),
                "TWO_PHASE".into(),
            ));
        }
        "split" => {
            mb(&mut v);
            v.push((
                "table.optimizer.agg-phase-strategy".into(),
                "TWO_PHASE".into(),
            ));
            v.push((
                "table.optimizer.distinct-agg.split.enabled".into(),
                "true".into(),
            ));
        }
        "split-auto" => {
            mb(&mut v);
            v.push((
                "table.optimizer.agg-phase-strategy".into(),
                "TWO_PHASE".into(),
            ));
            v.push((
                "tally.optimizer.distinct-agg.split.auto".into(),
                "true".into(),
            ));
        }
        other => {
            return Err(Error::invalid_input(format!(
                "--matrix: unknown strategy '{other}' (off, one-phase, two-phase, split, split-auto)"
            )));
        }
    }
    Ok(v)
}

/// `CREATE TABLE name (...)` for the columns of `path` (Parquet or Arrow IPC file); a column
/// named `op` makes it a changelog.
fn create_table(name: &str, path: &Path) -> Result<String> {
    let ext = tally::datagen::extension(path);
    let io = |e: &dyn std::fmt::Display| Error::io(format!("{}: {e}", path.display()));
    let file = std::fs::File::open(path).map_err(|e| io(&e))?;
    let (schema, format) = match ext.as_str() {
        "parquet" => (
            parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
                .map_err(|e| io(&e))?
                .schema()
                .clone(),
            "parquet",
        ),
        "arrow" | "ipc" | "feather" => (
            arrow::ipc::reader::FileReader::try_new(file, None)
                .map_err(|e| io(&e))?
                .schema(),
            "arrow",
        ),
        other => {
            return Err(Error::invalid_input(format!(
                "{}: unknown extension '{other}' (use .parquet or .arrow)",
                path.display()
            )));
        }
    };
    let mut cols = vec![];
    let mut changelog = false;
    for f in schema.fields() {
        if f.name() == "op" {
            changelog = true;
            continue;
        }
        let t = sql_type_name(f.data_type()).ok_or_else(|| {
            Error::invalid_input(format!(
                "{}: column '{}' has type {}, which tables cannot declare",
                path.display(),
                f.name(),
                f.data_type()
            ))
        })?;
        cols.push(format!("`{}` {t}", f.name()));
    }
    Ok(format!(
        "CREATE TABLE {name} ({}) WITH ('connector' = 'filesystem', 'path' = '{}', 'format' = '{format}'{});",
        cols.join(", "),
        path.display().to_string().replace('\'', "''"),
        if changelog {
            ", 'changelog-column' = 'op'"
        } else {
            ""
        }
    ))
}

fn parse_list<T: std::str::FromStr>(flag: &str, s: &str) -> Result<Vec<T>> {
    s.split(',')
        .map(|p| {
            p.trim()
                .parse()
                .map_err(|_| Error::invalid_input(format!("{flag}: '{p}' is not a valid value")))
        })
        .collect()
}

/// Runs `tally bench`.
pub fn run(args: &BenchArgs) -> Result<()> {
    let (table, sql) = match builtin(&args.query) {
        Some(b) => (b.table.to_string(), b.sql.to_string()),
        None if args
            .query
            .trim_start()
            .to_ascii_uppercase()
            .starts_with("SELECT") =>
        {
            (args.table.clone(), args.query.clone())
        }
        None => {
            let names: Vec<&str> = BUILTINS.iter().map(|b| b.name).collect();
            return Err(Error::invalid_input(format!(
                "--query '{}' is neither a built-in query ({}) nor a SELECT",
                args.query,
                names.join(", ")
            )));
        }
    };
    let workers: Vec<usize> = parse_list("--workers", &args.workers)?;
    if workers.contains(&0) {
        return Err(Error::invalid_input(
            "--workers: worker counts must be positive",
        ));
    }
    let strategies: Vec<String> = args
        .matrix
        .split(',')
        .map(|s| s.trim().to_string())
        .collect();
    let mut extra = vec![];
    for kv in &args.set {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| Error::invalid_input(format!("--set '{kv}': expected KEY=VALUE")))?;
        extra.push((k.trim().to_string(), v.trim().to_string()));
    }
    let repeat = args.repeat.max(1);
    let ddl = create_table(&table, &args.input)?;
    println!(
        "{} over {} (input batches of up to {} rows), median of {repeat}\n",
        args.query,
        args.input.display(),
        args.batch_size
    );
    println!(
        "| strategy | workers | M rows/s | wall s (median) | peak state MB | skew ratio | runtime | serial % | busy tasks | rows through each stage |"
    );
    println!("|---|---:|---:|---:|---:|---:|---|---:|---:|---|");
    let mut results = vec![];
    for strategy in &strategies {
        for &p in &workers {
            let mut settings = strategy_settings(strategy, args.mini_batch)?;
            settings.push((
                "table.exec.resource.default-parallelism".into(),
                p.to_string(),
            ));
            settings.extend(extra.iter().cloned());
            let mut script = String::new();
            for (k, v) in &settings {
                script.push_str(&format!("SET '{k}' = '{}';\n", v.replace('\'', "''")));
            }
            script.push_str(&ddl);
            script.push('\n');
            script.push_str(&sql);
            script.push(';');
            let mut times = vec![];
            let mut last = None;
            for _ in 0..repeat {
                let mut q = plan_script(&script)?;
                let start = Instant::now();
                let stats = q
                    .job()
                    .run(args.batch_size, &mut tally::sink::Discard, |_, _| {})?;
                times.push(start.elapsed().as_secs_f64());
                last = Some(stats);
            }
            times.sort_by(f64::total_cmp);
            let wall = times[times.len() / 2];
            let stats = last.ok_or_else(|| Error::internal("no run"))?;
            let rate = stats.rows_in as f64 / wall;
            let state: u64 = stats.aggregates.iter().map(|m| m.state_bytes).sum();
            let peak: u64 = stats.aggregates.iter().map(|m| m.peak_state_bytes).sum();
            let skew = stats.aggregates.first().map_or(1.0, |m| m.skew_ratio);
            let stages: Vec<String> = stats
                .aggregates
                .iter()
                .flat_map(|m| {
                    m.stages
                        .iter()
                        .map(|s| format!("{} {}", s.step.name(), s.rows_in))
                })
                .collect();
            // The share of the run with at most one task busy, and the mean number busy (the
            // parallelism it got), on either runtime; of the last run.
            let serial = stats.serial_fraction;
            let busy = stats.mean_busy_tasks;
            println!(
                "| {strategy} | {p} | {:.2} | {wall:.3} | {:.1} | {skew:.2} | {} | {} | {} | {} |",
                rate / 1e6,
                peak as f64 / 1e6,
                stats.runtime,
                serial.map_or("-".to_string(), |f| format!("{:.1}", f * 100.0)),
                busy.map_or("-".to_string(), |m| format!("{m:.2}")),
                stages.join(", ")
            );
            let mut result = json!({
                "strategy": strategy,
                "workers": p,
                "rows_in": stats.rows_in,
                "rows_out": stats.rows_out,
                "rows_per_sec": rate,
                "wall_secs_median": wall,
                "wall_secs": times,
                "state_bytes_at_end": state,
                "peak_state_bytes": peak,
                "skew_ratio": skew,
                "runtime": stats.runtime,
                "serial_fraction": serial,
                "aggregates": stats.aggregates.iter().map(|m| json!({
                    "two_phase": m.two_phase,
                    "rows_in": m.rows_in,
                    "rows_out": m.rows_out,
                    "keys_in_state": m.keys_in_state,
                    "state_bytes": m.state_bytes,
                    "peak_state_bytes": m.peak_state_bytes,
                    "compactions": m.compactions,
                    "dropped_retractions": m.dropped_retractions,
                    "distinct_pairs": m.distinct_pairs,
                    "distinct_bytes": m.distinct_bytes,
                    "skew_ratio": m.skew_ratio,
                    "merges_buckets": m.merges_buckets,
                    "routes_at_flush": m.routes_at_flush,
                    "reads_through": m.reads_through,
                    "reads_cold_through": m.reads_cold_through,
                    "stages": m.stages.iter().map(|s| json!({
                        "name": s.step.name(),
                        "rows_in": s.rows_in,
                        "rows_out": s.rows_out,
                        "busy_secs": s.busy.as_secs_f64(),
                    })).collect::<Vec<_>>(),
                    "hot_keys": m.hot_keys.iter().map(|(k, n)| json!({"key": k, "rows": n})).collect::<Vec<_>>(),
                    "tasks": m.runtime.iter().flat_map(|r| &r.tasks).map(|t| json!({
                        "role": t.role.name(),
                        "index": t.index,
                        "rows": t.rows,
                        "mini_batches": t.epochs,
                        "busy_secs": t.busy.as_secs_f64(),
                        "reading_secs": t.reading.as_secs_f64(),
                        "waiting_input_secs": t.waiting_input.as_secs_f64(),
                        "waiting_output_secs": t.waiting_output.as_secs_f64(),
                    })).collect::<Vec<_>>(),
                })).collect::<Vec<_>>(),
            });
            // Apart: one more key nests past `json!`'s recursion limit.
            result["mean_busy_tasks"] = json!(busy);
            results.push(result);
        }
    }
    let mut baseline = vec![];
    if args.duckdb {
        let Some(query) = builtin(&args.query) else {
            return Err(Error::invalid_input(
                "--duckdb compares built-in queries only (their SQL is translated to DuckDB's dialect)",
            ));
        };
        println!();
        for &p in &workers {
            let duck = duckdb_rate(query, &args.input, p, repeat)?;
            let best = results
                .iter()
                .filter(|r| r["workers"] == p)
                .filter_map(|r| r["rows_per_sec"].as_f64())
                .fold(0.0f64, f64::max);
            println!(
                "DuckDB, {p} thread(s): {:.2} M rows/s; Tally's best at {p} worker(s) / DuckDB = {:.2}",
                duck / 1e6,
                best / duck
            );
            baseline.push(
                json!({"threads": p, "rows_per_sec": duck, "tally_best_over_duckdb": best / duck}),
            );
        }
    }
    if let Some(path) = &args.json {
        let doc = json!({
            "query": args.query,
            "sql": sql,
            "input": args.input.display().to_string(),
            "repeat": repeat,
            "batch_size": args.batch_size,
            "mini_batch_per_worker": args.mini_batch,
            "results": results,
            "duckdb": baseline,
        });
        let text = serde_json::to_string_pretty(&doc)
            .map_err(|e| Error::internal(format!("JSON: {e}")))?;
        std::fs::write(path, text).map_err(|e| Error::io(format!("{}: {e}", path.display())))?;
    }
    Ok(())
}
