#!/usr/bin/env python3
"""The baseline for `tally bench`: the same query over the same Parquet file in DuckDB (a batch
GROUP BY over the whole file, i.e. the final table Tally's changelog materializes).

    scripts/install-duckdb.sh          # once; optional, never needed by tests or CI
    scripts/duckdb_baseline.py NAME "SELECT …" FILE.parquet [--repeat 3] [--threads N]

`tally bench --duckdb` passes the built-in query's own Flink SQL (src/sql/queries.rs); it is
translated here to DuckDB's dialect: `DATE_FORMAT(x, 'yyyy-MM-dd')` becomes `strftime(x,
'%Y-%m-%d')`, backquoted names become double-quoted, and the table is the file's view `t`.

Prints one line: `duckdb NAME rows=N threads=T median_secs=S rows_per_sec=R`.
"""
import argparse
import re
import statistics
import sys
import time

JAVA_TO_STRFTIME = [("yyyy", "%Y"), ("MM", "%m"), ("dd", "%d"), ("HH", "%H"), ("mm", "%M"), ("ss", "%S")]


def duckdb_sql(sql: str) -> str:
    def date_format(m: re.Match) -> str:
        fmt = m.group(2)
        for java, c in JAVA_TO_STRFTIME:
            fmt = fmt.replace(java, c)
        return f"strftime({m.group(1)}, '{fmt}')"

    sql = re.sub(r"DATE_FORMAT\(([^,()]+), '([^']*)'\)", date_format, sql)
    sql = sql.replace("`", '"')
    return re.sub(r"\bFROM\s+\w+", "FROM t", sql)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("name")
    p.add_argument("sql")
    p.add_argument("file")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    try:
        import duckdb
    except ImportError:
        print("error: DuckDB is not installed (run scripts/install-duckdb.sh)", file=sys.stderr)
        return 1
    con = duckdb.connect()
    con.execute(f"SET threads = {a.threads}")
    path = a.file.replace("'", "''")
    con.execute(f"CREATE VIEW t AS SELECT * FROM read_parquet('{path}')")
    rows = con.execute("SELECT COUNT(*) FROM t").fetchone()[0]
    query = duckdb_sql(a.sql)
    times = []
    for _ in range(max(1, a.repeat)):
        start = time.perf_counter()
        con.execute(query).fetchall()
        times.append(time.perf_counter() - start)
    med = statistics.median(times)
    print(f"duckdb {a.name} rows={rows} threads={a.threads} median_secs={med:.3f} rows_per_sec={rows / med:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
