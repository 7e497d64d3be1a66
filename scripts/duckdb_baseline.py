#!/usr/bin/env python3
"""The baseline for `tally bench`: the same built-in query over the same Parquet file in DuckDB
(a batch GROUP BY over the whole file, i.e. the final table Tally's changelog materializes).

    scripts/install-duckdb.sh          # once; optional, never needed by tests or CI
    scripts/duckdb_baseline.py QUERY FILE.parquet [--repeat 3] [--threads N]

Prints one line: `duckdb QUERY rows=N threads=T median_secs=S rows_per_sec=R`.
"""
import argparse
import statistics
import sys
import time

RANKS = """COUNT(*) AS total_bids,
    COUNT(*) FILTER (WHERE price < 10000) AS rank1_bids,
    COUNT(*) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_bids,
    COUNT(*) FILTER (WHERE price >= 1000000) AS rank3_bids,
    COUNT(DISTINCT bidder) AS total_bidders,
    COUNT(DISTINCT bidder) FILTER (WHERE price < 10000) AS rank1_bidders,
    COUNT(DISTINCT bidder) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_bidders,
    COUNT(DISTINCT bidder) FILTER (WHERE price >= 1000000) AS rank3_bidders,
    COUNT(DISTINCT auction) AS total_auctions,
    COUNT(DISTINCT auction) FILTER (WHERE price < 10000) AS rank1_auctions,
    COUNT(DISTINCT auction) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_auctions,
    COUNT(DISTINCT auction) FILTER (WHERE price >= 1000000) AS rank3_auctions"""

# The built-in queries of src/sql/queries.rs in DuckDB's dialect (strftime for DATE_FORMAT).
QUERIES = {
    "orders-count": "SELECT shop, COUNT(*) AS orders, SUM(amount) AS total, "
    "SUM(amount) FILTER (WHERE status = 'PAID') AS paid FROM t GROUP BY shop",
    "orders-distinct": "SELECT shop, COUNT(DISTINCT user_id) AS buyers FROM t GROUP BY shop",
    "q15": f"SELECT strftime(dateTime, '%Y-%m-%d') AS day, {RANKS} FROM t "
    "GROUP BY strftime(dateTime, '%Y-%m-%d')",
    "q16": f"SELECT channel, strftime(dateTime, '%Y-%m-%d') AS day, "
    f"MAX(strftime(dateTime, '%H:%M')) AS minute, {RANKS} FROM t "
    "GROUP BY channel, strftime(dateTime, '%Y-%m-%d')",
    "q17": "SELECT auction, strftime(dateTime, '%Y-%m-%d') AS day, COUNT(*) AS total_bids, "
    "COUNT(*) FILTER (WHERE price < 10000) AS rank1_bids, "
    "COUNT(*) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_bids, "
    "COUNT(*) FILTER (WHERE price >= 1000000) AS rank3_bids, MIN(price) AS min_price, "
    "MAX(price) AS max_price, AVG(price) AS avg_price, SUM(price) AS sum_price FROM t "
    "GROUP BY auction, strftime(dateTime, '%Y-%m-%d')",
}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("query", choices=sorted(QUERIES))
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
    times = []
    for _ in range(max(1, a.repeat)):
        start = time.perf_counter()
        con.execute(QUERIES[a.query]).fetchall()
        times.append(time.perf_counter() - start)
    med = statistics.median(times)
    print(f"duckdb {a.query} rows={rows} threads={a.threads} median_secs={med:.3f} rows_per_sec={rows / med:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
