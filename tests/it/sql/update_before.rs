//! `tally.exec.emit.update-before = false` in `tally sql`: final tables built by upserts, and
//! `-U` rows kept where an aggregate or a HAVING needs them.

use std::collections::BTreeMap;

use super::{
    CSV_QUERY, MINI_BATCH, csv_reference, csv_rows, csv_stream, csv_table, ok, scratch, tally,
    write_csv,
};

/// Without `-U` rows the final table is built by upserts on the group keys.
#[test]
fn final_table_without_update_before() {
    let dir = scratch("upsert");
    let rows = csv_stream(true);
    let path = dir.join("t.csv");
    write_csv(&path, &rows);
    let no_ub = "SET 'tally.exec.emit.update-before' = 'false';";
    let table = csv_table(&path, true);
    let out = ok(
        &format!("{table} {no_ub} {MINI_BATCH} {CSV_QUERY}"),
        &["--emit", "final", "--format", "csv"],
    );
    assert_eq!(csv_rows(&out), csv_reference(&rows));
    let changelog = ok(
        &format!("{table} {no_ub} {CSV_QUERY}"),
        &["--format", "csv"],
    );
    assert!(!changelog.lines().any(|l| l.starts_with("-U")));
    // Keys moved behind the values are found; keys dropped from the SELECT cannot be upserted.
    let out = ok(
        &format!("{table} {no_ub} SELECT COUNT(*) AS n, k FROM t GROUP BY k;"),
        &["--emit", "final", "--format", "csv"],
    );
    let expected: Vec<String> = csv_reference(&rows)
        .iter()
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            format!("{},{}", f[1], f[0])
        })
        .collect();
    let mut expected = expected;
    expected.sort();
    assert_eq!(csv_rows(&out), expected);
    // Without its keys in the SELECT, nothing could upsert the changes: the aggregate keeps
    // its -U rows (a warning says so) and the final table is the multiset of counts.
    let (code, out, err) = tally(
        &format!("{table} {no_ub} SELECT COUNT(*) AS n FROM t GROUP BY k;"),
        &["--emit", "final", "--format", "csv"],
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("has no effect on GroupAggregate(groupBy=[k])")
            && err.contains("without its group keys"),
        "{err}"
    );
    let mut counts: Vec<String> = csv_reference(&rows)
        .iter()
        .map(|l| l.split(',').nth(1).unwrap().to_string())
        .collect();
    counts.sort();
    assert_eq!(csv_rows(&out), counts);
}

/// `tally.exec.emit.update-before = false` drops `-U` rows only where the aggregate's changes go
/// straight to the sink; an aggregate feeding another one or a HAVING keeps them (Flink's
/// changelog-mode inference), which the plan shows and a warning says. The example:
/// both queries used to lose rows.
#[test]
fn update_before_is_dropped_only_where_the_sink_upserts() {
    let dir = scratch("ub-nested");
    let path = dir.join("t.csv");
    std::fs::write(&path, "k,v\na,1\na,2\nb,3\na,4\nb,5\n").unwrap();
    let table = format!(
        "CREATE TABLE t (k STRING, v BIGINT) WITH ('connector' = 'filesystem', 'path' = '{}', 'format' = 'csv');",
        path.display()
    );
    let no_ub = "SET 'tally.exec.emit.update-before' = 'false';";
    let nested =
        "SELECT c, COUNT(*) AS n FROM (SELECT k, COUNT(*) AS c FROM t GROUP BY k) GROUP BY c;";
    let having = "SELECT k, COUNT(*) AS c FROM t GROUP BY k HAVING COUNT(*) < 3;";
    for settings in ["", MINI_BATCH] {
        for (query, want) in [(nested, vec!["2,1", "3,1"]), (having, vec!["b,2"])] {
            let script = format!("{table} {no_ub} {settings} {query}");
            let (code, out, err) = tally(&script, &["--emit", "final", "--format", "csv"]);
            assert_eq!(code, 0, "{err}");
            assert_eq!(csv_rows(&out), want, "{query} {settings}");
            assert!(err.contains("which needs the -U rows"), "{err}");
            // The changelog applied as a multiset gives the same table.
            let changelog = ok(&script, &["--format", "csv"]);
            let mut table: BTreeMap<String, i64> = BTreeMap::new();
            for line in changelog.lines().skip(1) {
                let (op, row) = line.split_once(',').unwrap();
                let d = if op.starts_with('+') { 1 } else { -1 };
                *table.entry(row.to_string()).or_default() += d;
            }
            let rows: Vec<String> = table
                .into_iter()
                .filter(|(_, c)| *c != 0)
                .map(|(r, _)| r)
                .collect();
            assert_eq!(rows, want, "{query} {settings}: changelog");
        }
    }
    // EXPLAIN: the outer aggregate drops -U, the inner one keeps them, and says why.
    let out = ok(
        &format!("{table} {no_ub} EXPLAIN CHANGELOG_MODE, PLAN_ADVICE {nested}"),
        &[],
    );
    assert!(
        out.contains("groupBy=[c], select=[c, COUNT(*) AS n], changelogMode=[I,UA,D])"),
        "{out}"
    );
    assert!(
        out.contains("groupBy=[k], select=[k, COUNT(*) AS c], changelogMode=[I,UB,UA])"),
        "{out}"
    );
    assert!(
        out.contains(
            "GroupAggregate(groupBy=[k]): keeps its -U rows: its changes feed another aggregate"
        ),
        "{out}"
    );
    assert!(
        out.contains("GroupAggregate(groupBy=[c]): emits no -U rows"),
        "{out}"
    );
    // Under tally.strict, keeping -U where they were asked away is an error.
    let (code, _, err) = tally(
        &format!("{table} {no_ub} SET 'tally.strict' = 'true'; {having}"),
        &[],
    );
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("tally.exec.emit.update-before") && err.contains("HAVING"),
        "{err}"
    );
}
