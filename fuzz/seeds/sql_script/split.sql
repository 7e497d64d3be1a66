CREATE TABLE t (k STRING, v BIGINT, u INT, s STRING) WITH ('connector' = 'filesystem', 'path' = 't.csv', 'format' = 'csv', 'changelog-column' = 'op');
SET 'table.exec.mini-batch.enabled' = 'true'; SET 'table.exec.mini-batch.allow-latency' = '1 s'; SET 'table.exec.mini-batch.size' = '1000';
SET 'table.optimizer.distinct-agg.split.enabled' = 'true';
EXPLAIN SELECT k, COUNT(*) AS n, COUNT(DISTINCT u) AS users, COUNT(DISTINCT u) FILTER (WHERE s = 'PAID') AS payers, SUM(DISTINCT v) FILTER (WHERE v > 0) AS dv, COUNT(DISTINCT v) AS nv, AVG(v) AS mean, MIN(v) AS lo, MAX(u) AS hi FROM t GROUP BY k;
