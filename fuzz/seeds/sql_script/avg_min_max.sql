SET 'table.exec.resource.default-parallelism' = '2'; CREATE TABLE orders (order_id BIGINT, shop STRING, user_id BIGINT, amount BIGINT, status STRING, ts TIMESTAMP(3)) WITH ('connector' = 'filesystem', 'path' = 'orders.parquet', 'format' = 'parquet');
SET 'table.exec.mini-batch.enabled' = 'true'; SET 'table.exec.mini-batch.allow-latency' = '1 s'; SET 'table.exec.mini-batch.size' = '1000';
SET 'tally.exec.local-agg.adaptive.enabled' = 'false';
EXPLAIN SELECT status, AVG(amount) AS mean, MIN(amount) AS low, MAX(amount) FILTER (WHERE shop <> 'shop-0000') AS high, COUNT(DISTINCT user_id) AS buyers, SUM(DISTINCT amount) FILTER (WHERE amount > 10) AS distinct_sum FROM orders GROUP BY status;
