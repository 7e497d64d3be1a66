//! Split-distinct in `tally sql`: final tables against a reference under every bucket count,
//! phase and worker count, its EXPLAIN, and Nexmark q15 and q16.

use std::collections::{BTreeMap, BTreeSet};

use arrow::array::AsArray;
use arrow::datatypes::{Int64Type, TimestampMillisecondType};

use super::{
    CsvRow, MINI_BATCH, csv_file, csv_rows, csv_stream, csv_table, live_rows, ok, opt, scratch,
    tally, write_csv,
};

/// Reference for [`SPLIT_QUERY`] over the live rows of `rows`.
fn split_reference(rows: &[CsvRow]) -> Vec<String> {
    let live = live_rows(rows);
    let mut groups: BTreeMap<&str, Vec<&CsvRow>> = BTreeMap::new();
    for r in &live {
        groups.entry(r.1.as_str()).or_default().push(r);
    }
    groups
        .into_iter()
        .map(|(k, rs)| {
            let users: BTreeSet<i64> = rs.iter().map(|r| r.3).collect();
            let payers: BTreeSet<i64> = rs.iter().filter(|r| r.4 == "PAID").map(|r| r.3).collect();
            let vs: Vec<i64> = rs.iter().filter_map(|r| r.2).collect();
            let distinct_v: BTreeSet<i64> = vs.iter().copied().collect();
            let positive: BTreeSet<i64> = distinct_v.iter().copied().filter(|&v| v > 0).collect();
            let dv = (!positive.is_empty()).then(|| positive.iter().sum::<i64>());
            let mean = (!vs.is_empty()).then(|| vs.iter().sum::<i64>() / vs.len() as i64);
            let lo = vs.iter().min().copied();
            let hi = rs.iter().map(|r| r.3).max().unwrap();
            format!(
                "{k},{},{},{},{},{},{},{},{hi}",
                rs.len(),
                users.len(),
                payers.len(),
                opt(dv),
                distinct_v.len(),
                opt(mean),
                opt(lo)
            )
        })
        .collect()
}

const SPLIT_QUERY: &str = "SELECT k, COUNT(*) AS n, COUNT(DISTINCT u) AS users, \
     COUNT(DISTINCT u) FILTER (WHERE s = 'PAID') AS payers, \
     SUM(DISTINCT v) FILTER (WHERE v > 0) AS dv, COUNT(DISTINCT v) AS nv, AVG(v) AS mean, \
     MIN(v) AS lo, MAX(u) AS hi FROM t GROUP BY k;";

/// The split-distinct invariant: two DISTINCT arguments (an Expand of three group sets), FILTERs,
/// AVG, MIN and MAX give the reference's final table with split on and off, bucket-num 1, 7 and
/// 1024, mini-batch off, one and two phases, 1, 2 and 4 workers, insert-only and changelog input.
#[test]
fn split_distinct_matches_the_reference() {
    let dir = scratch("split");
    for changelog in [false, true] {
        let (rows, path) = csv_file(&dir, changelog);
        let expected = split_reference(&rows);
        let table = csv_table(&path, changelog);
        let phases = [
            "",
            "SET 'table.optimizer.agg-phase-strategy' = 'ONE_PHASE';",
            "SET 'table.optimizer.agg-phase-strategy' = 'TWO_PHASE';",
        ];
        for (i, phase) in phases.iter().enumerate() {
            let mb = if i == 0 { "" } else { MINI_BATCH };
            for workers in [1, 2, 4] {
                for split in [
                    "false",
                    "1",
                    "7",
                    "1024",
                    "7 without the incremental aggregate",
                    "auto",
                ] {
                    let split_settings = match split {
                        "false" => String::new(),
                        "auto" => {
                            "SET 'tally.optimizer.distinct-agg.split.auto' = 'true';".to_string()
                        }
                        "7 without the incremental aggregate" => {
                            "SET 'table.optimizer.distinct-agg.split.enabled' = 'true'; \
                             SET 'table.optimizer.distinct-agg.split.bucket-num' = '7'; \
                             SET 'table.optimizer.incremental-agg-enabled' = 'false';"
                                .to_string()
                        }
                        n => format!(
                            "SET 'table.optimizer.distinct-agg.split.enabled' = 'true'; \
                             SET 'table.optimizer.distinct-agg.split.bucket-num' = '{n}';"
                        ),
                    };
                    let script = format!(
                        "SET 'table.exec.resource.default-parallelism' = '{workers}'; {table} \
                         {mb} {phase} {split_settings} {SPLIT_QUERY}"
                    );
                    let out = ok(&script, &["--emit", "final", "--format", "csv"]);
                    assert_eq!(
                        csv_rows(&out),
                        expected,
                        "changelog {changelog}, {phase} mini-batch {}, {workers} workers, split {split}",
                        !mb.is_empty()
                    );
                }
            }
        }
    }
}

/// A group key that is not a column (`CONCAT(k, '!')`) under split with an Expand: the Calc
/// before the Expand computes it once per input row (EXPLAIN shows it there, and the PARTIAL
/// grouped by its column), and the final table is the reference's with the key so computed,
/// split on and off, one and two phases, 1 and 3 workers, insert-only and changelog input.
#[test]
fn split_distinct_computes_an_expression_key_before_the_expand() {
    let dir = scratch("split-key");
    let query = SPLIT_QUERY
        .replacen("SELECT k,", "SELECT CONCAT(k, '!') AS k,", 1)
        .replace("GROUP BY k;", "GROUP BY CONCAT(k, '!');");
    for changelog in [false, true] {
        let (rows, path) = csv_file(&dir, changelog);
        let expected: Vec<String> = split_reference(&rows)
            .into_iter()
            .map(|r| r.replacen(',', "!,", 1))
            .collect();
        let table = csv_table(&path, changelog);
        for phase in ["ONE_PHASE", "TWO_PHASE"] {
            for workers in [1, 3] {
                for split in [false, true] {
                    let script = format!(
                        "SET 'table.exec.resource.default-parallelism' = '{workers}'; {table} \
                         {MINI_BATCH} SET 'table.optimizer.agg-phase-strategy' = '{phase}'; \
                         SET 'table.optimizer.distinct-agg.split.enabled' = '{split}'; \
                         SET 'table.optimizer.distinct-agg.split.bucket-num' = '7'; {query}"
                    );
                    let out = ok(&script, &["--emit", "final", "--format", "csv"]);
                    assert_eq!(
                        csv_rows(&out),
                        expected,
                        "changelog {changelog}, {phase}, {workers} workers, split {split}"
                    );
                }
            }
        }
    }
    let out = ok(
        &format!(
            "{} SET 'table.optimizer.distinct-agg.split.enabled' = 'true'; EXPLAIN {query}",
            csv_table(&dir.join("tfalse.csv"), false)
        ),
        &[],
    );
    for want in [
        "Calc(select=[v, u, CONCAT(k, '!') AS $f2, MOD(HASH_CODE(u), 1024) AS $f3",
        "GroupAggregate(groupBy=[$f2, $f3, $f4], partialFinalType=[PARTIAL]",
    ] {
        assert!(out.contains(want), "missing {want} in\n{out}");
    }
}

#[test]
fn split_distinct_explain_shows_partial_and_final() {
    let dir = scratch("split-explain");
    let path = dir.join("t.csv");
    write_csv(&path, &csv_stream(false));
    let out = ok(
        &format!(
            "SET 'table.exec.resource.default-parallelism' = '2'; {} \
             SET 'table.optimizer.distinct-agg.split.enabled' = 'true'; EXPLAIN {SPLIT_QUERY}",
            csv_table(&path, false)
        ),
        &[],
    );
    for want in [
        "GroupAggregate(groupBy=[k], partialFinalType=[FINAL], select=[k, $SUM0_RETRACT($p0) AS $q0",
        "GroupAggregate(groupBy=[k, $f3, $f4], partialFinalType=[PARTIAL]",
        "Exchange(distribution=[hash[k, $f3, $f4]])",
        // The columns the aggregate reads, the buckets, then the FILTER conditions (once per
        // input row, before the Expand; `s` only feeds a condition, so it stays behind).
        "Calc(select=[k, v, u, MOD(HASH_CODE(u), 1024) AS $f3, MOD(HASH_CODE(v), 1024) AS $f4, (s = 'PAID') AS $f5, (v > 0) AS $f6])",
        "($f5 AND ($e = 1)) IS TRUE AS $f9",
        "Expand(projects=[{",
        "IF(($q5_count = 0), null, ($q5_sum / $q5_count)) AS mean",
        "split-distinct applies",
    ] {
        assert!(out.contains(want), "missing {want} in\n{out}");
    }
    // Split requested where it cannot apply says why, once, as a warning.
    let (code, _, err) = tally(
        &format!(
            "{} SET 'table.optimizer.distinct-agg.split.enabled' = 'true'; SELECT k, COUNT(DISTINCT k) AS n FROM t GROUP BY k;",
            csv_table(&path, false)
        ),
        &["--emit", "final"],
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("its DISTINCT arguments are group keys"),
        "{err}"
    );
}

/// Nexmark q15 and q16 over generated bids: with split-distinct off and on (1 and 1024
/// buckets), one or two phases, 1 or 3 workers, the final tables match references computed from
/// the bids.
#[test]
fn nexmark_q15_q16_split_matches() {
    let dir = scratch("nexmark");
    let path = dir.join("bid.parquet");
    let mut bids = tally::datagen::NexmarkBids::new(0, 6000);
    let batches: Vec<_> = (0..2).map(|_| bids.next_batch()).collect();
    tally::datagen::write_file(&path, bids.schema(), batches.clone(), |_| {}).unwrap();
    let table = format!(
        "CREATE TABLE bid (auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING, \
         `dateTime` TIMESTAMP(3), extra STRING) WITH ('connector' = 'filesystem', 'path' = '{}', \
         'format' = 'parquet');",
        path.display()
    );
    let ranks = "COUNT(*) AS total_bids, COUNT(*) FILTER (WHERE price < 10000) AS rank1_bids, \
        COUNT(DISTINCT bidder) AS total_bidders, \
        COUNT(DISTINCT bidder) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_bidders, \
        COUNT(DISTINCT auction) AS total_auctions, \
        COUNT(DISTINCT auction) FILTER (WHERE price >= 1000000) AS rank3_auctions";
    let q15 = format!(
        "SELECT DATE_FORMAT(dateTime, 'yyyy-MM-dd') AS `day`, {ranks} FROM bid \
         GROUP BY DATE_FORMAT(dateTime, 'yyyy-MM-dd');"
    );
    let q16 = format!(
        "SELECT channel, DATE_FORMAT(dateTime, 'yyyy-MM-dd') AS `day`, \
         MAX(DATE_FORMAT(dateTime, 'HH:mm')) AS `minute`, {ranks} FROM bid \
         GROUP BY channel, DATE_FORMAT(dateTime, 'yyyy-MM-dd');"
    );
    // The references, row by row: q15 by day (all bids fall on one day), q16 by channel and
    // day, each with its minute (the latest HH:mm).
    #[derive(Default)]
    struct Ranks {
        minute: String,
        total: i64,
        rank1: i64,
        bidders: BTreeSet<i64>,
        rank2: BTreeSet<i64>,
        auctions: BTreeSet<i64>,
        rank3: BTreeSet<i64>,
    }
    impl Ranks {
        fn line(&self) -> String {
            format!(
                "{},{},{},{},{},{}",
                self.total,
                self.rank1,
                self.bidders.len(),
                self.rank2.len(),
                self.auctions.len(),
                self.rank3.len()
            )
        }
    }
    let mut by_day: BTreeMap<String, Ranks> = BTreeMap::new();
    let mut by_channel_day: BTreeMap<(String, String), Ranks> = BTreeMap::new();
    for b in &batches {
        let cols: Vec<_> = (0..3)
            .map(|i| b.column(i).as_primitive::<Int64Type>().clone())
            .collect();
        let channel = b.column(3).as_string::<i32>();
        let time = b.column(5).as_primitive::<TimestampMillisecondType>();
        for r in 0..b.num_rows() {
            let (auction, bidder, price) = (cols[0].value(r), cols[1].value(r), cols[2].value(r));
            let at = chrono::DateTime::from_timestamp_millis(time.value(r)).unwrap();
            let day = at.format("%Y-%m-%d").to_string();
            let minute = at.format("%H:%M").to_string();
            for ranks in [
                by_day.entry(day.clone()).or_default(),
                by_channel_day
                    .entry((channel.value(r).to_string(), day))
                    .or_default(),
            ] {
                ranks.minute = ranks.minute.clone().max(minute.clone());
                ranks.total += 1;
                ranks.rank1 += i64::from(price < 10000);
                ranks.bidders.insert(bidder);
                if (10000..1000000).contains(&price) {
                    ranks.rank2.insert(bidder);
                }
                ranks.auctions.insert(auction);
                if price >= 1000000 {
                    ranks.rank3.insert(auction);
                }
            }
        }
    }
    let q15_expected: Vec<String> = by_day
        .iter()
        .map(|(day, r)| format!("{day},{}", r.line()))
        .collect();
    assert_eq!(q15_expected.len(), 1, "all bids on one day");
    let mut q16_expected: Vec<String> = by_channel_day
        .iter()
        .map(|((channel, day), r)| format!("{channel},{day},{},{}", r.minute, r.line()))
        .collect();
    q16_expected.sort();
    assert!(q16_expected.len() > 10, "{q16_expected:?}");
    for (query, expected) in [(&q15, &q15_expected), (&q16, &q16_expected)] {
        let name = &query[..40];
        for workers in [1, 3] {
            for phase in ["ONE_PHASE", "TWO_PHASE"] {
                for split in ["false", "1", "1024"] {
                    let split_settings = match split {
                        "false" => String::new(),
                        n => format!(
                            "SET 'table.optimizer.distinct-agg.split.enabled' = 'true'; \
                             SET 'table.optimizer.distinct-agg.split.bucket-num' = '{n}';"
                        ),
                    };
                    let script = format!(
                        "SET 'table.exec.resource.default-parallelism' = '{workers}'; \
                         SET 'table.exec.mini-batch.enabled' = 'true'; \
                         SET 'table.exec.mini-batch.allow-latency' = '1 s'; \
                         SET 'table.exec.mini-batch.size' = '500'; \
                         SET 'table.optimizer.agg-phase-strategy' = '{phase}'; {split_settings} \
                         {table} {query}"
                    );
                    let rows = csv_rows(&ok(&script, &["--emit", "final", "--format", "csv"]));
                    assert_eq!(&rows, expected, "{name} {workers} {phase} split {split}");
                }
            }
        }
    }
}
