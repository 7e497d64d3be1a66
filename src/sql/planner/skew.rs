//! The automatic split-distinct decision (`tally.optimizer.distinct-agg.split.auto`): the skew
//! of an aggregate's keys, measured on the first rows of its source, and a bucket count from
//! the parallelism; and, for any split on several workers, the hot keys it spreads
//! ([`hot_keys`]), from the same sample.
//!
//! Split-distinct pays when one key holds so much of the input that its worker would do at
//! least twice a fair share (1 / P of the rows): splitting spreads that key's DISTINCT work over
//! the buckets, for the cost of a second aggregate. With several DISTINCT arguments the split's
//! Expand feeds the PARTIAL every row once per group set, so the bar rises with the sets (Nexmark
//! q15, three sets, at P = 2 on the 2-vCPU machine: split 6.5, unsplit 13.6 M events/s). Below
//! that, or on one worker, the unsplit aggregate is faster. The buckets are 8 x P rounded up to a power of two (16 to 1024), enough
//! to spread a hot key evenly over the workers while keeping the PARTIAL's groups few.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion_expr::Expr;
use datafusion_expr::expr::{AggregateFunction, Alias};

use super::context::{Built, Ctx};
use crate::config::{SPLIT_AUTO, SPLIT_BUCKET_NUM};
use crate::error::Result;
use crate::operator::keyed::hash_keys;
use crate::pipeline::{columns_read_by, map_through};
use crate::plan::{AggregatePlan, HotKeys};

/// Source rows the decision reads at least (whole batches of [`SAMPLE_BATCH`] rows: 106,496).
pub(super) const SAMPLE_ROWS: usize = 100_000;

/// Rows per batch of the sample.
const SAMPLE_BATCH: usize = 8192;

/// Split when the hottest key's worker would do this many times a fair share.
const LOAD_TO_SPLIT: f64 = 2.0;

/// A key is hot, and a split spreads its DISTINCT values over the workers, where it holds at
/// least this share of a fair share (1 / P) of the sample. A colder key stays on its own worker
/// ([`HotKeys`]): its few entries a flush would spread cost a PARTIAL row on every worker, and
/// its worker was never the busiest for it. An eighth rather than a half: at a half, q16's four
/// keys of 12.5 % each stayed unspread at P = 2, and its DISTINCT tables took 17 % more bytes
/// for the same pairs (BENCHMARKS.md, thirty-third pass).
pub(super) const HOT_SHARE_OF_FAIR: f64 = 0.125;

/// The decision for one aggregate, and why, in words (for EXPLAIN); with the sample it was
/// made from, for the hot keys ([`hot_keys`]).
pub(super) struct SplitDecision {
    pub(super) split: bool,
    pub(super) buckets: u32,
    pub(super) reason: String,
    pub(super) sample: Option<Sample>,
}

/// The rows per key hash in the first rows of a source, and the source rows read ([`sample`]).
pub(super) struct Sample {
    counts: HashMap<u64, u64, ahash::RandomState>,
    rows: usize,
}

fn has_distinct(agg: &datafusion_expr::logical_plan::Aggregate) -> bool {
    agg.aggr_expr.iter().any(|a| {
        let a = match a {
            Expr::Alias(Alias { expr, .. }) => expr.as_ref(),
            other => other,
        };
        matches!(a, Expr::AggregateFunction(AggregateFunction { params, .. }) if params.distinct)
    })
}

/// The rows per key hash (the query's keys, as [`hash_keys`] hashes them) in the first
/// [`SAMPLE_ROWS`] rows of `built`'s source, through the stages before `agg`, and the source
/// rows read; None where the aggregate's input is not the source's rows (another aggregate's
/// changelog).
///
/// # Errors
/// The source cannot be read, or the stages before the aggregate fail on the sample.
fn sample(agg: &datafusion_expr::logical_plan::Aggregate, built: &Built) -> Result<Option<Sample>> {
    if !built.stages.iter().all(|s| s.per_batch()) {
        return Ok(None);
    }
    // The keys, beside a COUNT(*): the sample needs none of the calls' arguments or FILTERs.
    let input = agg.input.schema();
    let plan = AggregatePlan::try_new_with(
        Arc::new(input.as_arrow().clone()),
        input,
        &agg.group_expr,
        &[crate::aggregates::count_star()],
        built.changelog,
    )?;
    // Only the columns the stages before the aggregate and its keys read are decoded.
    let mut table = built.table.clone();
    if let Some(read) = columns_read_by(&built.stages, Some(plan.calc.columns_read())) {
        table.unread_columns = table.unread_outside(&read);
    }
    // The keys are hashes already: ahash rather than std's SipHash, which took a third of
    // the sample's instructions (15 of 41 M over q15's 106,496 rows).
    let mut counts: HashMap<u64, u64, ahash::RandomState> = HashMap::default();
    let (mut rows, mut hashes) = (0usize, vec![]);
    'read: for batch in table.open(SAMPLE_BATCH)? {
        let batch = batch?;
        rows += batch.num_rows();
        for b in map_through(&built.stages, batch)? {
            let cb = plan.calc.evaluate(&b)?;
            hash_keys(&cb.keys, cb.num_rows, &mut hashes)?;
            for &h in &hashes {
                *counts.entry(h).or_default() += 1;
            }
        }
        if rows >= SAMPLE_ROWS {
            break 'read;
        }
    }
    Ok(Some(Sample { counts, rows }))
}

/// A split PARTIAL's hot keys ([`HotKeys`]) at P workers: the keys that hold at least a
/// [`HOT_SHARE_OF_FAIR`] of a fair share (1 / P) of `taken` (the decision's, [`decide`]) or
/// else of a [`sample`] read here, None where no sample can be taken (every key is then
/// spread, as Flink does). With the keys named, the reason in words for EXPLAIN. One worker
/// takes them too: its state merges the buckets unless the run takes checkpoints (or runs on
/// the ordered runtime), where a cold key then keeps one group instead of one per bucket.
///
/// # Errors
/// As [`sample`].
pub(super) fn hot_keys(
    ctx: &Ctx<'_>,
    agg: &datafusion_expr::logical_plan::Aggregate,
    built: &Built,
    taken: Option<Sample>,
) -> Result<Option<(HotKeys, String)>> {
    let p = ctx.runtime.parallelism();
    if !has_distinct(agg) {
        return Ok(None);
    }
    let taken = match taken {
        Some(t) => Some(t),
        None => sample(agg, built)?,
    };
    let Some(Sample { counts, rows }) = taken else {
        return Ok(None);
    };
    let total: u64 = counts.values().sum();
    let hot = HotKeys::from_hashes(
        counts
            .iter()
            .filter(|&(_, &c)| c as f64 * p as f64 >= HOT_SHARE_OF_FAIR * total as f64)
            .map(|(&h, _)| h),
    );
    let why = format!(
        "{} of the {} keys in the first {rows} source rows (those with at least {:.1} % of them, {HOT_SHARE_OF_FAIR} of a fair share at P = {p})",
        hot.len(),
        counts.len(),
        HOT_SHARE_OF_FAIR * 100.0 / p as f64
    );
    Ok(Some((hot, why)))
}

/// Decides split-distinct for `agg` over `built` (see the module docs).
///
/// # Errors
/// The source cannot be read, or the stages before the aggregate fail on the sample (as the
/// run would).
pub(super) fn decide(
    ctx: &Ctx<'_>,
    agg: &datafusion_expr::logical_plan::Aggregate,
    built: &Built,
) -> Result<SplitDecision> {
    let p = ctx.runtime.parallelism();
    let buckets = if ctx.config.is_set(SPLIT_BUCKET_NUM) {
        ctx.config.split_bucket_num
    } else {
        u32::try_from((8 * p).next_power_of_two().clamp(16, 1024)).unwrap_or(1024)
    };
    let decision = |split: bool, reason: String| SplitDecision {
        split,
        buckets,
        reason: format!("'{SPLIT_AUTO}' = 'true': {reason}"),
        sample: None,
    };
    if !has_distinct(agg) {
        return Ok(decision(false, "no DISTINCT call, nothing to split".into()));
    }
    if p == 1 {
        return Ok(decision(
            false,
            "no split on one worker (a hot key has no other worker to spread to)".into(),
        ));
    }
    let Some(Sample { counts, rows }) = sample(agg, built)? else {
        return Ok(decision(
            false,
            "no split: the aggregate's input is another aggregate's changelog, not the source, so no sample was taken".into(),
        ));
    };
    let total: u64 = counts.values().sum();
    let Some(&top) = counts.values().max() else {
        return Ok(decision(
            false,
            format!("no split: no row reached the aggregate in the first {rows} source rows"),
        ));
    };
    let share = top as f64 / total as f64;
    let load = share * p as f64;
    let sample = if total == rows as u64 {
        format!("the first {rows} source rows")
    } else {
        format!("the {total} rows the first {rows} source rows gave the aggregate")
    };
    // With an Expand, the PARTIAL takes every row once per group set: the hot key's excess has
    // to outweigh that much more work.
    let sets = crate::sql::split::plan_split(agg, buckets)?
        .and_then(|s| s.expand)
        .map_or(1, |e| e.sets.len());
    let needed = LOAD_TO_SPLIT * sets as f64;
    // A load just under the bar is not shown as on it (50 % of the rows at P = 4: 1.9997x).
    let shown = if load < needed
        && format!("{load:.2}")
            .parse::<f64>()
            .is_ok_and(|l| l >= needed)
    {
        format!("{load:.4}")
    } else {
        format!("{load:.2}")
    };
    let measured = format!(
        "the hottest of {} keys holds {:.1} % of {sample}, so its worker would do {shown}x a fair share at P = {p}",
        counts.len(),
        share * 100.0
    );
    let from = if sets > 1 {
        format!(
            "split pays from {needed:.0}x here: its Expand feeds the PARTIAL {sets} copies of every row"
        )
    } else {
        format!("split pays from {needed:.0}x")
    };
    let mut d = if load >= needed {
        decision(true, format!("split into {buckets} buckets: {measured}"))
    } else {
        decision(false, format!("no split: {measured} ({from})"))
    };
    d.sample = Some(Sample { counts, rows });
    Ok(d)
}
