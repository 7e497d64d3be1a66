//! Flink's `IncrementalGroupAggregateTestPrograms`, transcribed once: their source rows
//! (`a INT, b BIGINT, c VARCHAR`) before and after a restore, their queries, and the changelogs
//! their sinks must consume before and after it. Read by `tests/it/incremental.rs` (through
//! `tally sql`) and `flink/tests/incremental.rs` (through the Flink operator's chain).

/// The source rows before the restore, as CSV.
pub const BEFORE: &str = "1,1,hi\n2,2,hello\n3,2,hello world\n";
/// The source rows after the restore, as CSV.
pub const AFTER: &str = "3,2,foo\n4,4,bar\n5,2,foo bar\n";

/// `incremental-group-aggregate-simple`.
pub const SIMPLE: &str = "SELECT b, COUNT(DISTINCT a) AS a FROM source_t GROUP BY b";
/// What its sink consumes before and after the restore.
pub const SIMPLE_CHANGES: (&[&str], &[&str]) = (
    &["+I[1, 1]", "+I[2, 1]", "-U[2, 1]", "+U[2, 2]"],
    &["-U[2, 2]", "+U[2, 3]", "+I[4, 1]"],
);

/// `incremental-group-aggregate-complex`.
pub const COMPLEX: &str = "SELECT b, SUM(b1) AS sum_b, COUNT(DISTINCT b1) AS cnt_distinct_b, \
                           COUNT(1) AS cnt_1 FROM (SELECT a, COUNT(b) AS b, MAX(b) AS b1 \
                           FROM source_t GROUP BY a) GROUP BY b";
/// What its sink consumes before and after the restore.
pub const COMPLEX_CHANGES: (&[&str], &[&str]) = (
    &[
        "+I[1, 1, 1, 1]",
        "-U[1, 1, 1, 1]",
        "+U[1, 3, 2, 2]",
        "-U[1, 3, 2, 2]",
        "+U[1, 5, 2, 3]",
    ],
    &[
        "-U[1, 5, 2, 3]",
        "+U[1, 3, 2, 2]",
        "+I[2, 2, 1, 1]",
        "-U[1, 3, 2, 2]",
        "+U[1, 7, 3, 3]",
        "-U[1, 7, 3, 3]",
        "+U[1, 9, 3, 4]",
    ],
);
