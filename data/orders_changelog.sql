-- The same aggregation over a recorded changelog (a fifth of the orders deleted or updated later),
-- and a nested aggregation over its result: how many shops have how many paid orders, by day.
-- Run: cargo run --release -- sql -f data/orders_changelog.sql --emit final

CREATE TABLE orders (
  order_id BIGINT,
  shop     STRING,
  user_id  BIGINT,
  amount   BIGINT,
  status   STRING,
  ts       TIMESTAMP(3)
) WITH (
  'connector'        = 'filesystem',
  'path'             = 'data/orders_changelog.parquet',
  'format'           = 'parquet',
  'changelog-column' = 'op'
);

SET 'table.exec.mini-batch.enabled' = 'true';
SET 'table.exec.mini-batch.allow-latency' = '1 s';
SET 'table.exec.mini-batch.size' = '5000';

SELECT day, paid_orders, COUNT(*) AS shops
FROM (
  SELECT shop, DATE_FORMAT(ts, 'yyyy-MM-dd') AS day, COUNT(*) FILTER (WHERE status = 'PAID') AS paid_orders
  FROM orders
  GROUP BY shop, DATE_FORMAT(ts, 'yyyy-MM-dd')
)
WHERE paid_orders >= 100
GROUP BY day, paid_orders;
