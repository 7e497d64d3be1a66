-- Sales per shop over the bundled orders: 100,000 orders, one shop holding half of them.
-- Run: cargo run --release -- sql -f data/orders.sql --emit final

CREATE TABLE orders (
  order_id BIGINT,
  shop     STRING,
  user_id  BIGINT,
  amount   BIGINT,
  status   STRING,
  ts       TIMESTAMP(3)
) WITH (
  'connector' = 'filesystem',
  'path'      = 'data/orders.parquet',
  'format'    = 'parquet'
);

SET 'table.exec.mini-batch.enabled' = 'true';
SET 'table.exec.mini-batch.allow-latency' = '1 s';
SET 'table.exec.mini-batch.size' = '5000';

EXPLAIN PLAN_ADVICE
SELECT shop,
       COUNT(*)                                     AS orders,
       SUM(amount) FILTER (WHERE status = 'PAID')   AS paid,
       COUNT(DISTINCT user_id)                      AS buyers,
       MAX(amount)                                  AS biggest
FROM orders
GROUP BY shop
HAVING COUNT(*) >= 1000;

SELECT shop,
       COUNT(*)                                     AS orders,
       SUM(amount) FILTER (WHERE status = 'PAID')   AS paid,
       COUNT(DISTINCT user_id)                      AS buyers,
       MAX(amount)                                  AS biggest
FROM orders
GROUP BY shop
HAVING COUNT(*) >= 1000;
