SET 'table.exec.resource.default-parallelism' = '2'; CREATE TABLE orders (order_id BIGINT, shop STRING, user_id BIGINT, amount BIGINT, status STRING, ts TIMESTAMP(3)) WITH ('connector' = 'filesystem', 'path' = 'orders.parquet', 'format' = 'parquet');
SET 'table.exec.mini-batch.enabled' = 'true'; SET 'table.exec.mini-batch.allow-latency' = '1 s'; SET 'table.exec.mini-batch.size' = '1000';
EXPLAIN CHANGELOG_MODE SELECT orders, COUNT(*) AS shops FROM (SELECT shop, COUNT(*) AS orders FROM orders WHERE amount > 100 GROUP BY shop) GROUP BY orders;
EXPLAIN ANALYZE SELECT COUNT(*) AS n, SUM(amount) AS total FROM orders;
RESET 'table.exec.mini-batch.size'; RESET; SET;
