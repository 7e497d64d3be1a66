//! The `tally` command.
//!
//! ```text
//! tally sql -f SCRIPT.sql [--emit changelog|final] [--output PATH|-] [--format csv|parquet|arrow|table]
//! tally sql -e "STATEMENTS" (same flags; --replay-speed X|max replays a recorded stream)
//! tally gen orders --rows N [--keys K] [--skew S] [--hot-share H] [--users U] [--updates F] [--seed X] --out PATH
//! tally gen nexmark --events N [--first-event E] --out PATH
//! tally bench --query NAME|SELECT --input FILE [--set k=v]... [--matrix off,one-phase,two-phase,split]
//!             [--workers 1,2] [--repeat 3] [--json OUT]
//! ```

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::{Parser, Subcommand, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use tally::checkpoint::CheckpointDir;
use tally::replay::ReplayStats;
use tally::run::{Job, RunStats};
use tally::sink::{ChangelogWriter, OutputFormat, Sink, Writer};
use tally::sql::{
    PlannedQuery, Session, StatementKind, StatementResult, classify, script_statements,
};
use tally::{Error, Result};

#[path = "cli/bench.rs"]
mod bench;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser, Debug)]
#[command(
    name = "tally",
    version,
    about = "Streaming GROUP BY with Flink SQL semantics over Apache Arrow"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a Flink-style SQL script (SET, RESET, CREATE TABLE, EXPLAIN, SELECT).
    Sql(SqlArgs),
    /// Generate a seeded input file (Parquet or Arrow, by the extension of --out).
    #[command(subcommand)]
    Gen(GenWhat),
    /// Benchmark a query over a file under several strategies and worker counts.
    Bench(bench::BenchArgs),
}

#[derive(Subcommand, Debug)]
enum GenWhat {
    /// Orders for a skewed GROUP BY: order_id, shop (Zipf-like, with one hot shop), user_id,
    /// amount, status, ts; with --updates, a changelog with an `op` column.
    Orders {
        /// Rows to write (a changelog's -U/+U and -D rows included).
        #[arg(long)]
        rows: u64,
        /// Distinct shops.
        #[arg(long, default_value_t = 200)]
        keys: usize,
        /// Zipf exponent of the shops other than the hot one (0 = uniform).
        #[arg(long, default_value_t = 1.1)]
        skew: f64,
        /// Share of rows on the hot shop `shop-0000`, 0 to 1.
        #[arg(long, default_value_t = 0.5)]
        hot_share: f64,
        /// Distinct user ids (the high-cardinality column).
        #[arg(long, default_value_t = 1_000_000)]
        users: i64,
        /// Share of orders later deleted or updated (-D, -U/+U), 0 to 1; 0 = insert-only.
        #[arg(long, default_value_t = 0.0)]
        updates: f64,
        /// Seed: the same seed and options give the same file.
        #[arg(long, default_value_t = 42)]
        seed: u64,
        /// The file to write (.parquet or .arrow).
        #[arg(long)]
        out: PathBuf,
    },
    /// The Nexmark bid stream (auction, bidder, price, channel, url, dateTime, extra).
    Nexmark {
        /// Bid events to write.
        #[arg(long)]
        events: u64,
        /// The number of the first bid (the stream is a function of it).
        #[arg(long, default_value_t = 0)]
        first_event: u64,
        /// The file to write (.parquet or .arrow).
        #[arg(long)]
        out: PathBuf,
    },
}

/// A replay speed: `max` (None) or a positive factor.
#[derive(Debug, Clone, Copy)]
struct Speed(Option<f64>);

fn parse_speed(s: &str) -> std::result::Result<Speed, String> {
    if s.eq_ignore_ascii_case("max") {
        return Ok(Speed(None));
    }
    let range = tally::replay::SPEED_RANGE;
    match s.parse::<f64>() {
        Ok(x) if range.contains(&x) => Ok(Speed(Some(x))),
        _ => Err(format!(
            "'{s}' is not 'max' or a speed from {} to {} (times the recorded speed)",
            range.start(),
            range.end()
        )),
    }
}

/// Runs the job, or replays it when `--replay-speed` is given (its figures go to `replay`).
fn run_or_replay(
    job: &mut Job,
    args: &SqlArgs,
    sink: &mut impl Sink,
    progress: impl FnMut(u64, Option<u64>),
    replay: &mut Option<ReplayStats>,
) -> Result<RunStats> {
    Ok(match args.replay_speed {
        Some(Speed(speed)) => {
            let (stats, r) = job.replay(args.batch_size, speed, sink, progress)?;
            *replay = Some(r);
            stats
        }
        None => job.run(args.batch_size, sink, progress)?,
    })
}

/// Rows per generated batch (`tally gen`; a divisor of the row group, BENCHMARKS.md, "Tuning
/// constants").
const GEN_BATCH: usize = 65_536;

fn run_gen(what: &GenWhat) -> Result<()> {
    use tally::datagen::{NexmarkBids, OrdersConfig, OrdersGenerator, first_rows, write_file};
    let started = Instant::now();
    let (out, total) = match what {
        GenWhat::Orders { out, rows, .. } => (out, *rows),
        GenWhat::Nexmark { out, events, .. } => (out, *events),
    };
    if total == 0 {
        return Err(Error::invalid_input(
            "the number of rows to generate must be positive",
        ));
    }
    let bar = progress_bar(Some(total));
    let progress = |rows: u64| {
        if let Some(b) = &bar {
            b.set_position(rows);
            let secs = started.elapsed().as_secs_f64().max(1e-3);
            b.set_message(format!("{:.0} rows/s", rows as f64 / secs));
        }
    };
    let written = match what {
        GenWhat::Orders {
            keys,
            skew,
            hot_share,
            users,
            updates,
            seed,
            ..
        } => {
            let checks = [
                (*keys >= 1, "--keys must be at least 1"),
                (
                    skew.is_finite() && *skew >= 0.0,
                    "--skew must be a number >= 0",
                ),
                (
                    (0.0..=1.0).contains(hot_share),
                    "--hot-share must be between 0 and 1",
                ),
                (*users >= 1, "--users must be at least 1"),
                (
                    (0.0..=1.0).contains(updates),
                    "--updates must be between 0 and 1",
                ),
            ];
            if let Some((_, msg)) = checks.iter().find(|c| !c.0) {
                return Err(Error::invalid_input(*msg));
            }
            let mut g = OrdersGenerator::new(OrdersConfig {
                seed: *seed,
                keys: *keys,
                hot_share: *hot_share,
                zipf: *skew,
                users: *users,
                updates: *updates,
                batch_size: GEN_BATCH,
                ..OrdersConfig::default()
            });
            let schema = g.schema();
            write_file(out, schema, first_rows(total, || g.next_batch()), progress)?
        }
        GenWhat::Nexmark { first_event, .. } => {
            let mut g = NexmarkBids::new(*first_event, GEN_BATCH);
            let schema = g.schema();
            write_file(out, schema, first_rows(total, || g.next_batch()), progress)?
        }
    };
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    eprintln!(
        "[INFO] wrote {written} rows to {} in {:.1} s",
        out.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

#[derive(clap::Args, Debug)]
struct SqlArgs {
    /// The script file.
    #[arg(
        short = 'f',
        long = "file",
        conflicts_with = "execute",
        required_unless_present = "execute"
    )]
    file: Option<PathBuf>,
    /// Statements given inline.
    #[arg(short = 'e', long = "execute")]
    execute: Option<String>,
    /// What to write for each SELECT: the changelog (an op column, then the rows), or the final
    /// table it materializes, sorted.
    #[arg(long, value_enum, default_value_t = Emit::Changelog)]
    emit: Emit,
    /// Where to write query results ('-' for standard output).
    #[arg(long, short = 'o', default_value = "-")]
    output: String,
    /// The output format (default: table on standard output, else from the file extension).
    #[arg(long, value_enum)]
    format: Option<OutputFormat>,
    /// Rows per input batch, at most: a Parquet read also stops at each data page of a column
    /// read as a dictionary where those pages hold fewer rows (8,192 or more).
    #[arg(long, default_value_t = 8192)]
    batch_size: usize,
    /// Print each statement's status on standard error.
    #[arg(long, short = 'v')]
    verbose: bool,
    /// Replay the query's recorded stream (a table with a 'time-column') at this many times its
    /// recorded speed, or `max` (as fast as possible), and report throughput and end-to-end latency
    /// percentiles on standard error.
    #[arg(long, value_parser = parse_speed)]
    replay_speed: Option<Speed>,
    /// After each query, print its metrics on standard error: rows in and out and busy time per
    /// stage, rows and busy time per worker, the skew ratio, state keys and bytes, the local
    /// phase's reduction ratio and decision, the hot keys.
    #[arg(long)]
    metrics: bool,
    /// Write checkpoints of the query's state here (Arrow IPC files and a manifest per
    /// checkpoint, written atomically; the two newest are kept). With --emit changelog the
    /// output must be a CSV file, which a resumed run truncates to the checkpoint and appends to.
    #[arg(long)]
    checkpoint_dir: Option<PathBuf>,
    /// Source rows between checkpoints.
    #[arg(long, default_value_t = 1_000_000, requires = "checkpoint_dir")]
    checkpoint_every: u64,
    /// Resume from a checkpoint: a checkpoint directory (its newest checkpoint) or one
    /// checkpoint folder in it. The script, input and output must be those of the run that
    /// wrote it (options such as the parallelism may change).
    #[arg(long)]
    restore: Option<PathBuf>,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Emit {
    Changelog,
    Final,
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind as K;
            if matches!(
                e.kind(),
                K::DisplayHelp | K::DisplayVersion | K::DisplayHelpOnMissingArgumentOrSubcommand
            ) {
                e.exit();
            }
            // One line: clap's first line names the problem, and the indented lines after it
            // (before the usage) name the arguments it is about.
            let msg = e.to_string();
            let mut lines = msg.lines();
            let mut line = lines.next().unwrap_or("bad arguments").to_string();
            for l in lines.take_while(|l| l.starts_with("  ")) {
                line.push(' ');
                line.push_str(l.trim());
            }
            eprintln!("{line} (see tally --help)");
            return ExitCode::from(1);
        }
    };
    let result = match cli.command {
        Command::Sql(args) => run_sql(&args),
        Command::Gen(what) => run_gen(&what),
        Command::Bench(args) => bench::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            if e.is_user_error() {
                ExitCode::from(1)
            } else {
                ExitCode::from(2)
            }
        }
    }
}

fn run_sql(args: &SqlArgs) -> Result<()> {
    let script = match (&args.file, &args.execute) {
        (Some(f), _) => {
            std::fs::read_to_string(f).map_err(|e| Error::io(format!("{}: {e}", f.display())))?
        }
        (None, Some(s)) => s.clone(),
        (None, None) => {
            return Err(Error::invalid_input(
                "give a script with -f FILE or -e STATEMENTS",
            ));
        }
    };
    if args.batch_size == 0 {
        return Err(Error::invalid_input("--batch-size must be positive"));
    }
    let format = args
        .format
        .unwrap_or_else(|| OutputFormat::for_output(&args.output));
    let statements = script_statements(&script)?;
    let queries = statements
        .iter()
        .filter(|s| classify(s) == StatementKind::Query)
        .count();
    if queries > 1 && args.output != "-" {
        return Err(Error::invalid_input(format!(
            "the script has {queries} queries but --output names one file; write to standard output or run one query"
        )));
    }
    if (args.checkpoint_dir.is_some() || args.restore.is_some()) && queries != 1 {
        return Err(Error::invalid_input(format!(
            "--checkpoint-dir and --restore need a script with one query (this one has {queries})"
        )));
    }
    let mut session = Session::new();
    let mut stdout = std::io::stdout().lock();
    for stmt in &statements {
        match session.execute(stmt)? {
            StatementResult::Done(msg) => {
                if args.verbose {
                    eprintln!("{msg}");
                }
            }
            StatementResult::Explain(text) => {
                writeln!(stdout, "{text}")?;
            }
            StatementResult::Query(mut query) => {
                for w in query.warnings().to_vec() {
                    if let Some(w) = session.warn_once(&w) {
                        eprintln!("warning: {w}");
                    }
                }
                run_query(&mut query, args, format, &mut stdout)?;
            }
            StatementResult::Analyze(mut query, details) => {
                for w in query.warnings().to_vec() {
                    if let Some(w) = session.warn_once(&w) {
                        eprintln!("warning: {w}");
                    }
                }
                let text = query.explain_analyze(&details, args.batch_size)?;
                writeln!(stdout, "{text}")?;
            }
        }
    }
    stdout.flush()?;
    Ok(())
}

fn progress_bar(total: Option<u64>) -> Option<ProgressBar> {
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = match total {
        Some(n) => ProgressBar::new(n).with_style(
            ProgressStyle::with_template(
                "{bar:30} {human_pos}/{human_len} rows, {msg}, {eta} left",
            )
            .ok()?,
        ),
        None => ProgressBar::new_spinner()
            .with_style(ProgressStyle::with_template("{spinner} {human_pos} rows, {msg}").ok()?),
    };
    Some(bar)
}

fn run_query(
    query: &mut PlannedQuery,
    args: &SqlArgs,
    format: OutputFormat,
    stdout: &mut dyn Write,
) -> Result<()> {
    // The bar starts with the first batch, when the source has said how many rows it holds.
    let mut bar: Option<Option<ProgressBar>> = None;
    let started = Instant::now();
    let progress = |rows: u64, total: Option<u64>| {
        if let Some(b) = bar.get_or_insert_with(|| progress_bar(total)) {
            b.set_position(rows);
            let secs = started.elapsed().as_secs_f64().max(1e-3);
            b.set_message(format!("{:.0} rows/s", rows as f64 / secs));
        }
    };
    let mut replay = None;
    let restored = match &args.restore {
        Some(path) => {
            let job = query.job();
            let chk = job.restore(path)?;
            if let (Ok(then), Some(now)) = (chk.meta("source.bytes"), job.input_bytes())
                && then != now.to_string()
            {
                eprintln!(
                    "warning: the input has changed since the checkpoint ({then} bytes then, {now} now); resuming after its first {} rows",
                    chk.meta("source.rows").unwrap_or("?")
                );
            }
            Some(chk)
        }
        None => None,
    };
    if let Some(dir) = &args.checkpoint_dir {
        query
            .job()
            .checkpoint_every(CheckpointDir::new(dir), args.checkpoint_every)?;
    }
    let checkpointing = args.checkpoint_dir.is_some() || args.restore.is_some();
    // The time a CSV changelog's writer waited for its pool during the run.
    let mut sink_waited = None;
    let stats = match args.emit {
        Emit::Changelog => {
            let mut sink = if checkpointing {
                if format != OutputFormat::Csv || args.output == "-" {
                    return Err(Error::invalid_input(
                        "--checkpoint-dir and --restore with --emit changelog need --output FILE in CSV (a resumed run truncates it to the checkpoint and appends); use --emit final for other outputs",
                    ));
                }
                ChangelogWriter::durable_csv(&args.output, restored.as_ref())?
            } else {
                ChangelogWriter::try_new(format, &args.output, &query.output_schema(), stdout)?
            };
            let stats = run_or_replay(query.job(), args, &mut sink, progress, &mut replay)?;
            sink_waited = sink.waited();
            sink.finish()?;
            stats
        }
        Emit::Final => {
            let mut table = query.result_table()?;
            if let Some(chk) = &restored {
                table.restore(chk)?;
            }
            let stats = run_or_replay(query.job(), args, &mut table, progress, &mut replay)?;
            // Sorted and decoded in pieces, each written as it comes: the table is never
            // decoded whole.
            let mut writer = Writer::try_new(format, &args.output, &table.schema(), stdout)?;
            table.for_each_sorted(|piece| writer.write(&piece))?;
            writer.finish()?;
            stats
        }
    };
    if let Some(chk) = &restored {
        eprintln!(
            "[INFO] resumed from checkpoint {} at source row {}",
            chk.id,
            chk.meta("source.rows").unwrap_or("?")
        );
    }
    if let Some(Some(b)) = bar {
        b.finish_and_clear();
    }
    if args.verbose || args.metrics {
        eprintln!(
            "[INFO] {} rows in, {} rows out in {:.3} s",
            stats.rows_in,
            stats.rows_out,
            started.elapsed().as_secs_f64()
        );
    }
    if let Some(r) = replay {
        eprintln!("[INFO] {r}");
    }
    if args.metrics {
        for (i, m) in stats.aggregates.iter().enumerate() {
            eprint!("aggregate {i}: {m}");
        }
        if let Some(waited) = sink_waited {
            eprintln!(
                "sink: CSV formatted on {} pool threads; the consumer waited {:.1} ms for them (counted in its busy time)",
                rayon::current_num_threads(),
                waited.as_secs_f64() * 1e3
            );
        }
    }
    Ok(())
}
