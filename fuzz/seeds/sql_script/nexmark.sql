CREATE TABLE bid (auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING, `dateTime` TIMESTAMP(3), extra STRING) WITH ('connector' = 'filesystem', 'path' = 'bid.parquet', 'format' = 'parquet');
SET 'table.optimizer.distinct-agg.split.enabled' = 'true'; SET 'table.optimizer.distinct-agg.split.bucket-num' = '16';
EXPLAIN PLAN_ADVICE SELECT channel, DATE_FORMAT(dateTime, 'yyyy-MM-dd') AS `day`, MAX(DATE_FORMAT(dateTime, 'HH:mm')) AS `minute`, COUNT(*) AS total_bids, COUNT(*) FILTER (WHERE price < 10000) AS rank1_bids, COUNT(DISTINCT bidder) AS total_bidders, COUNT(DISTINCT bidder) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_bidders FROM bid GROUP BY channel, DATE_FORMAT(dateTime, 'yyyy-MM-dd');
SET 'tally.exec.emit.update-before' = 'false'; SELECT COUNT(*) AS n, channel FROM bid GROUP BY channel;
WITH x AS (SELECT auction, COUNT(*) AS n FROM bid GROUP BY auction) SELECT n, COUNT(*) FROM x GROUP BY n;
