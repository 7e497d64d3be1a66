package org.tally.flink;

import java.time.LocalDateTime;
import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

import org.apache.flink.api.common.functions.MapFunction;
import org.apache.flink.api.common.typeinfo.TypeInformation;
import org.apache.flink.api.common.typeinfo.Types;
import org.apache.flink.api.java.typeutils.RowTypeInfo;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.streaming.api.datastream.DataStream;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.streaming.api.functions.sink.v2.DiscardingSink;
import org.apache.flink.table.api.bridge.java.StreamTableEnvironment;
import org.apache.flink.types.Row;

/**
 * The Tally operator against Flink's own SQL, side by side in one MiniCluster: the same
 * generated input (a sequence mapped to rows, identical for both), the same query, mini-batch and
 * two phases on both (and for q15 split-distinct on both too, Tally under Flink's incremental
 * aggregate as Flink runs it by default), each job's net runtime from Flink.
 *
 * <pre>
 *   FlinkBench WORKLOAD ROWS PARALLELISM REPEAT [ENGINES]     WORKLOAD: orders-count, q15, q17
 * </pre>
 *
 * ENGINES (comma-separated, all by default): {@code source}, {@code tally}, {@code flink}, and
 * for q15 {@code tally-split} and {@code flink-split}; one alone is what a profiler wants.
 *
 * Prints each run and, per engine, the median events/s and events/s per core (per task slot).
 * The engine {@code source} runs the input alone into the sink: what generating the rows costs
 * both engines.
 */
public final class FlinkBench {
    private FlinkBench() {}

    static long mix(long x) {
        x += 0x9E3779B97F4A7C15L;
        x = (x ^ (x >>> 30)) * 0xBF58476D1CE4E5B9L;
        x = (x ^ (x >>> 27)) * 0x94D049BB133111EBL;
        return x ^ (x >>> 31);
    }

    static final RowTypeInfo ORDERS = new RowTypeInfo(
            new TypeInformation<?>[] {Types.STRING, Types.LONG, Types.LONG, Types.STRING},
            new String[] {"shop", "user_id", "amount", "status"});

    /** Orders: a hot shop with a third of the rows and 199 others, 100k users, two statuses. */
    static final class Orders implements MapFunction<Long, Row> {
        private static final long serialVersionUID = 1L;
        private static final String[] SHOPS = new String[200];

        static {
            for (int i = 0; i < SHOPS.length; i++) SHOPS[i] = "shop-" + i;
        }

        @Override
        public Row map(Long i) {
            long h = mix(i);
            String shop = (h & 3) == 0 ? SHOPS[0] : SHOPS[(int) ((h >>> 2) % 200)];
            return Row.of(shop, (h >>> 12) % 100_000, (h >>> 32) % 10_000, ((h >>> 40) & 1) == 0 ? "PAID" : "NEW");
        }
    }

    static final RowTypeInfo BIDS = new RowTypeInfo(
            new TypeInformation<?>[] {Types.LONG, Types.LONG, Types.LONG, Types.STRING, Types.LOCAL_DATE_TIME},
            new String[] {"auction", "bidder", "price", "channel", "dateTime"});

    /**
     * Nexmark-like bids: 10k auctions, 100k bidders, prices over Nexmark's three ranks, four
     * channels, a bid every millisecond from 2026-01-01 (a million bids a quarter hour: one day).
     */
    static final class Bids implements MapFunction<Long, Row> {
        private static final long serialVersionUID = 1L;
        private static final String[] CHANNELS = {"Apple", "Google", "Facebook", "Baidu"};
        private static final LocalDateTime START = LocalDateTime.of(2026, 1, 1, 0, 0);

        @Override
        public Row map(Long i) {
            long h = mix(i);
            long price = (h & 7) == 0 ? 1_000_000 + (h >>> 8) % 9_000_000 : ((h & 7) < 4 ? (h >>> 8) % 10_000 : 10_000 + (h >>> 8) % 990_000);
            return Row.of(1000 + (h >>> 24) % 10_000, (h >>> 40) % 100_000, price, CHANNELS[(int) ((h >>> 3) & 3)],
                    START.plusNanos(i * 1_000_000L));
        }
    }

    static final String RANKS = "COUNT(*) AS total_bids, "
            + "COUNT(*) FILTER (WHERE price < 10000) AS rank1_bids, "
            + "COUNT(*) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_bids, "
            + "COUNT(*) FILTER (WHERE price >= 1000000) AS rank3_bids, "
            + "COUNT(DISTINCT bidder) AS total_bidders, "
            + "COUNT(DISTINCT bidder) FILTER (WHERE price < 10000) AS rank1_bidders, "
            + "COUNT(DISTINCT bidder) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_bidders, "
            + "COUNT(DISTINCT bidder) FILTER (WHERE price >= 1000000) AS rank3_bidders, "
            + "COUNT(DISTINCT auction) AS total_auctions, "
            + "COUNT(DISTINCT auction) FILTER (WHERE price < 10000) AS rank1_auctions, "
            + "COUNT(DISTINCT auction) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_auctions, "
            + "COUNT(DISTINCT auction) FILTER (WHERE price >= 1000000) AS rank3_auctions";

    static final Map<String, String> SQL = new LinkedHashMap<>();

    static {
        SQL.put("orders-count", "SELECT shop, COUNT(*) AS orders, SUM(amount) AS total, "
                + "SUM(amount) FILTER (WHERE status = 'PAID') AS paid FROM orders GROUP BY shop");
        SQL.put("q15", "SELECT DATE_FORMAT(`dateTime`, 'yyyy-MM-dd') AS `day`, " + RANKS
                + " FROM bid GROUP BY DATE_FORMAT(`dateTime`, 'yyyy-MM-dd')");
        SQL.put("q17", "SELECT auction, DATE_FORMAT(`dateTime`, 'yyyy-MM-dd') AS `day`, COUNT(*) AS total_bids, "
                + "COUNT(*) FILTER (WHERE price < 10000) AS rank1_bids, "
                + "COUNT(*) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_bids, "
                + "COUNT(*) FILTER (WHERE price >= 1000000) AS rank3_bids, "
                + "MIN(price) AS min_price, MAX(price) AS max_price, AVG(price) AS avg_price, SUM(price) AS sum_price "
                + "FROM bid GROUP BY auction, DATE_FORMAT(`dateTime`, 'yyyy-MM-dd')");
    }

    /** Mini-batch and two phases, as Nexmark runs Flink. */
    static final String[][] OPTIONS = {
        {"table.exec.mini-batch.enabled", "true"},
        {"table.exec.mini-batch.allow-latency", "2 s"},
        {"table.exec.mini-batch.size", "50000"},
        {"table.optimizer.agg-phase-strategy", "TWO_PHASE"},
    };

    static DataStream<Row> input(StreamExecutionEnvironment env, String workload, long rows) {
        boolean orders = workload.startsWith("orders");
        return env.fromSequence(0, rows - 1)
                .map(orders ? new Orders() : new Bids())
                .returns(orders ? ORDERS : BIDS);
    }

    /** Runs one job; returns its net runtime in milliseconds. */
    static long run(String engine, String workload, long rows, int p) throws Exception {
        Configuration conf = new Configuration();
        conf.setString("rest.bind-port", "0");
        conf.setString("taskmanager.numberOfTaskSlots", Integer.toString(p));
        StreamExecutionEnvironment env = StreamExecutionEnvironment.getExecutionEnvironment(conf);
        env.setParallelism(p);
        String table = workload.startsWith("orders") ? "orders" : "bid";
        String sql = SQL.get(workload);
        DataStream<Row> in = input(env, workload, rows);
        DataStream<Row> out;
        if (engine.equals("source")) {
            out = in;
        } else if (engine.startsWith("tally")) {
            TallyAggregate t = TallyAggregate.sql(sql).table(table);
            for (String[] o : OPTIONS) t.option(o[0], o[1]);
            if (engine.equals("tally-split")) {
                // Split-distinct under Flink's incremental aggregate (its default), as Flink's split runs.
                t.option("table.optimizer.distinct-agg.split.enabled", "true");
            }
            out = t.apply(in);
        } else {
            StreamTableEnvironment tEnv = StreamTableEnvironment.create(env);
            for (String[] o : OPTIONS) tEnv.getConfig().set(o[0], o[1].replace(" ", ""));
            if (engine.equals("flink-split")) {
                tEnv.getConfig().set("table.optimizer.distinct-agg.split.enabled", "true");
            }
            tEnv.createTemporaryView(table, tEnv.fromDataStream(in));
            out = tEnv.toChangelogStream(tEnv.sqlQuery(sql));
        }
        out.sinkTo(new DiscardingSink<>());
        return env.execute(engine + " " + workload).getNetRuntime();
    }

    public static void main(String[] args) throws Exception {
        String workload = args[0];
        long rows = Long.parseLong(args[1]);
        int p = Integer.parseInt(args[2]);
        int repeat = Integer.parseInt(args[3]);
        if (!SQL.containsKey(workload)) {
            throw new IllegalArgumentException("workload " + workload + " is not one of " + SQL.keySet());
        }
        List<String> engines = new ArrayList<>(List.of("source", "tally", "flink"));
        if (workload.equals("q15")) {
            engines.add("tally-split");
            engines.add("flink-split");
        }
        if (args.length > 4) {
            List<String> chosen = List.of(args[4].split(","));
            for (String e : chosen) {
                if (!engines.contains(e)) {
                    throw new IllegalArgumentException("engine " + e + " is not one of " + engines);
                }
            }
            engines.retainAll(chosen);
        }
        Map<String, List<Double>> rates = new LinkedHashMap<>();
        for (int r = 0; r < repeat; r++) {
            for (String e : engines) {
                long ms = run(e, workload, rows, p);
                double rate = rows / (ms / 1000.0);
                rates.computeIfAbsent(e, k -> new ArrayList<>()).add(rate);
                System.out.printf("run %d %-11s %s P=%d: %d ms, %.3f M events/s%n", r, e, workload, p, ms, rate / 1e6);
            }
        }
        double tally = rates.containsKey("tally") ? median(rates.get("tally")) : Double.NaN;
        for (Map.Entry<String, List<Double>> e : rates.entrySet()) {
            double m = median(e.getValue());
            System.out.printf("median %-11s %s P=%d: %.3f M events/s, %.3f M per core, tally/this %.2fx%n",
                    e.getKey(), workload, p, m / 1e6, m / p / 1e6, tally / m);
        }
    }

    static double median(List<Double> xs) {
        List<Double> s = new ArrayList<>(xs);
        Collections.sort(s);
        int n = s.size();
        return n % 2 == 1 ? s.get(n / 2) : (s.get(n / 2 - 1) + s.get(n / 2)) / 2;
    }
}
