CREATE TABLE e (name STRING, qty INT, price DOUBLE, d DATE, t TIME, c DECIMAL(10, 2), b BOOLEAN, f FLOAT, sm SMALLINT, ti TINYINT) WITH ('connector' = 'filesystem', 'path' = 'e.csv', 'format' = 'csv', 'time-column' = 'd');
SELECT SUBSTRING(name, 1, 2) AS p, SUM(CASE WHEN MOD(qty, 2) = 1 THEN qty ELSE 0 END) AS odd_qty, COUNT(qty) AS with_qty, MAX(CAST(price * 100 AS BIGINT)) AS top_cents, SUM(c) AS sc, AVG(c) AS ac FROM e WHERE name <> 'gamma' GROUP BY SUBSTRING(name, 1, 2) HAVING COUNT(*) > 1;
SELECT name IS NULL AS missing, COUNT(*) AS n, MIN(d) AS d0, MAX(t) AS t1, COUNT(DISTINCT b) AS nb FROM e GROUP BY name IS NULL;
SELECT COUNT(*) AS n, COUNT(name) AS nk, COUNT(qty) AS nv, MIN(name) AS mk, SUM(qty) AS s FROM e;
EXPLAIN PLAN FOR SELECT qty, COUNT(*) FROM e GROUP BY qty;
