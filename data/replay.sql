-- Replay of a recorded stream (data/replay.arrow: 20,000 changelog rows with their arrival time
-- in `ts`). The time column drives the mini-batch latency trigger from recorded time instead of
-- the wall clock, so the same recording, query and options give the same changelog, byte for byte.
-- Its final table is data/replay_expected.csv.
-- Run: cargo run --release -- sql -f data/replay.sql --emit final

CREATE TABLE orders (
  order_id BIGINT,
  shop     STRING,
  user_id  BIGINT,
  amount   BIGINT,
  status   STRING,
  ts       TIMESTAMP(3)
) WITH (
  'connector'        = 'filesystem',
  'path'             = 'data/replay.arrow',
  'format'           = 'arrow',
  'changelog-column' = 'op',
  'time-column'      = 'ts'
);

SET 'table.exec.mini-batch.enabled' = 'true';
SET 'table.exec.mini-batch.allow-latency' = '2 s';
SET 'table.exec.mini-batch.size' = '100000';

SELECT shop,
       COUNT(*)                AS orders,
       SUM(amount)             AS total,
       MAX(amount)             AS biggest,
       COUNT(DISTINCT user_id) AS buyers
FROM orders
GROUP BY shop;
