//! Flink's `SplitAggregateITCase` (flink-table-planner, runtime/stream/sql) transcribed: its table
//! `T` of 16 rows, its queries and the final tables Flink's retract sink ends with. Flink runs each
//! with split-distinct on (and off in older versions), local-global off and on, mini-batch on; here
//! every query also runs with split off, 7 and 1,024 buckets, the incremental aggregate on and
//! off, the automatic decision, one and two phases, and one and three workers: the final table is
//! Flink's in every case.

use crate::common::tally_run;
use crate::scratch::Scratch;

/// `T(a BIGINT, b INT, c STRING)`; an empty `c` is NULL.
const T: &str = "a,b,c\n1,1,Hello 0\n1,2,Hello 1\n2,3,Hello 1\n3,5,Hello 1\n2,3,Hello 2\n\
                 2,4,Hello 3\n2,4,\n2,5,Hello 4\n3,5,Hello 0\n2,4,Hello 3\n4,5,Hello 2\n\
                 2,4,Hello 3\n4,5,\n4,5,Hello 3\n2,2,Hello 0\n4,6,Hello 1\n";

/// (Flink's test, the query, the final table as Flink prints it).
const CASES: &[(&str, &str, &[&str])] = &[
    (
        "testSingleDistinctAgg",
        "SELECT COUNT(DISTINCT c) FROM T",
        &["5"],
    ),
    (
        "testMultiCountDistinctAgg",
        "SELECT COUNT(DISTINCT b), COUNT(DISTINCT c) FROM T",
        &["6,5"],
    ),
    (
        "testSingleDistinctAggAndOneOrMultiNonDistinctAgg",
        "SELECT a, SUM(b), COUNT(DISTINCT c), avg(b) FROM T GROUP BY a",
        &["1,3,2,1", "2,29,5,3", "3,10,2,5", "4,21,3,5"],
    ),
    (
        "testSingleDistinctAggWithGroupBy",
        "SELECT a, COUNT(DISTINCT c) FROM T GROUP BY a",
        &["1,2", "2,5", "3,2", "4,3"],
    ),
    (
        "testSingleDistinctAggWithAndNonDistinctAggOnSameColumn",
        "SELECT a, COUNT(DISTINCT b), MAX(b), MIN(b) FROM T GROUP BY a",
        &["1,2,2,1", "2,4,5,2", "3,1,5,5", "4,2,6,5"],
    ),
    (
        "testSomeColumnsBothInDistinctAggAndGroupBy",
        "SELECT a, COUNT(DISTINCT a), COUNT(b) FROM T GROUP BY a",
        &["1,1,2", "2,1,8", "3,1,2", "4,1,4"],
    ),
    (
        "testAggWithFilterClause",
        "SELECT a, COUNT(DISTINCT b) filter (where not b = 2), MAX(b) filter (where not b = 5), \
         MIN(b) filter (where not b = 2) FROM T GROUP BY a",
        &["1,1,2,1", "2,3,4,3", "3,1,null,5", "4,2,6,5"],
    ),
    (
        "testMinMaxWithRetraction",
        "SELECT c, MIN(b), MAX(b), COUNT(DISTINCT a) FROM (SELECT a, COUNT(DISTINCT b) as b, \
         MAX(b) as c FROM T GROUP BY a) GROUP BY c",
        &["2,2,2,1", "5,1,4,2", "6,2,2,1"],
    ),
    (
        "testCountWithSingleDistinctAndRetraction",
        "SELECT b, COUNT(DISTINCT b1), COUNT(1) FROM (SELECT a, COUNT(b) as b, MAX(b) as b1 \
         FROM T GROUP BY a) GROUP BY b",
        &["2,2,2", "4,1,1", "8,1,1"],
    ),
    (
        "testSumCountWithSingleDistinctAndRetraction",
        "SELECT b, SUM(b1), COUNT(DISTINCT b1), COUNT(1) FROM (SELECT a, COUNT(b) as b, \
         MAX(b) as b1 FROM T GROUP BY a) GROUP BY b",
        &["2,7,2,2", "4,6,1,1", "8,5,1,1"],
    ),
    (
        "testMultipleDistinctAggOnSameColumn",
        "SELECT a, COUNT(DISTINCT b), COUNT(DISTINCT b) filter (where not b = 2), \
         MAX(b) filter (where not b = 5), MIN(b) filter (where not b = 2) FROM T GROUP BY a",
        &["1,2,1,2,1", "2,4,3,4,3", "3,1,1,null,5", "4,2,2,6,5"],
    ),
    (
        "testAggFilterClauseBothWithAvgAndCount",
        "SELECT a, COUNT(DISTINCT b) FILTER (WHERE NOT b = 2), SUM(b) FILTER (WHERE NOT b = 5), \
         COUNT(b), SUM(b), AVG(b) FROM T GROUP BY a",
        &[
            "1,1,3,2,3,1",
            "2,3,24,8,29,3",
            "3,1,null,2,10,5",
            "4,2,6,4,21,5",
        ],
    ),
];

/// The split settings every case runs under.
const SPLITS: &[&str] = &[
    "",
    "SET 'table.optimizer.distinct-agg.split.enabled' = 'true';",
    "SET 'table.optimizer.distinct-agg.split.enabled' = 'true'; \
     SET 'table.optimizer.distinct-agg.split.bucket-num' = '7';",
    "SET 'table.optimizer.distinct-agg.split.enabled' = 'true'; \
     SET 'table.optimizer.incremental-agg-enabled' = 'false';",
    "SET 'tally.optimizer.distinct-agg.split.auto' = 'true';",
];

/// `T` as a CSV file, removed when dropped.
fn table_file() -> Scratch {
    let path = Scratch::file("split-flink-t.csv");
    std::fs::write(&path, T).unwrap();
    path
}

#[test]
fn flink_split_aggregate_cases() {
    let path = table_file();
    for (name, query, want) in CASES {
        let mut want: Vec<String> = want.iter().map(|r| r.to_string()).collect();
        want.sort();
        for split in SPLITS {
            for phase in ["ONE_PHASE", "TWO_PHASE"] {
                for workers in [1, 3] {
                    let script = format!(
                        "CREATE TABLE T (a BIGINT, b INT, c STRING) WITH ('connector' = \
                         'filesystem', 'path' = '{}', 'format' = 'csv'); \
                         SET 'table.exec.mini-batch.enabled' = 'true'; \
                         SET 'table.exec.mini-batch.allow-latency' = '1 s'; \
                         SET 'table.exec.mini-batch.size' = '2'; \
                         SET 'table.optimizer.agg-phase-strategy' = '{phase}'; \
                         SET 'table.exec.resource.default-parallelism' = '{workers}'; \
                         {split} {query};",
                        path.display()
                    );
                    let (code, out, err) =
                        tally_run(&["sql", "-e", &script, "--emit", "final", "--format", "csv"]);
                    assert_eq!(code, 0, "{name}: {err}");
                    let mut got: Vec<String> = out
                        .lines()
                        .skip(1)
                        .map(|l| {
                            l.split(',')
                                .map(|v| if v.is_empty() { "null" } else { v })
                                .collect::<Vec<_>>()
                                .join(",")
                        })
                        .collect();
                    got.sort();
                    assert_eq!(got, want, "{name} [{split}] {phase}, {workers} workers");
                }
            }
        }
    }
}
