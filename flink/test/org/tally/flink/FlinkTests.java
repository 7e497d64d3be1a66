package org.tally.flink;

import java.math.BigDecimal;
import java.time.LocalDate;
import java.time.LocalDateTime;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.TreeMap;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.function.BiFunction;

import org.apache.flink.api.common.functions.MapFunction;
import org.apache.flink.api.common.state.CheckpointListener;
import org.apache.flink.api.common.typeinfo.TypeInformation;
import org.apache.flink.api.common.typeinfo.Types;
import org.apache.flink.api.java.typeutils.RowTypeInfo;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.streaming.api.datastream.DataStream;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.table.api.Table;
import org.apache.flink.table.api.bridge.java.StreamTableEnvironment;
import org.apache.flink.types.Row;
import org.apache.flink.types.RowKind;
import org.apache.flink.util.CloseableIterator;

/**
 * The Flink operator's tests: each runs a job in a local MiniCluster and checks the Tally
 * operator's result against Flink's own SQL over the same input in the same cluster (the final
 * table, and where Flink's changelog is deterministic, the changelog row by row). Ends with a
 * plain {@code N passed, M failed} line and a non-zero exit status on any failure.
 */
public final class FlinkTests {
    private static final RowTypeInfo ORDERS = new RowTypeInfo(
            new TypeInformation<?>[] {Types.LONG, Types.STRING, Types.LONG, Types.LONG, Types.STRING},
            new String[] {"id", "shop", "user_id", "amount", "status"});

    /** Orders with a decimal price, a day and a timestamp to the nanosecond. */
    private static final RowTypeInfo TYPED = new RowTypeInfo(
            new TypeInformation<?>[] {Types.LONG, Types.STRING, Types.BIG_DEC, Types.LOCAL_DATE, Types.LOCAL_DATE_TIME},
            new String[] {"id", "shop", "price", "sold_on", "ts"});

    private static final String[] MINI_BATCH = {
        "table.exec.mini-batch.enabled", "true",
        "table.exec.mini-batch.allow-latency", "1 s",
        "table.exec.mini-batch.size", "100",
    };

    private static int passed;
    private static int failed;

    private FlinkTests() {}

    public static void main(String[] args) throws Exception {
        String only = args.length > 0 ? args[0] : "";
        run(only, "insert-only orders, two phases, P = 2", () -> insertOnly(2, MINI_BATCH));
        run(only, "insert-only orders, one phase, P = 2", () -> insertOnly(2, new String[0]));
        run(only, "a changelog with updates and deletes, two phases, P = 2", () -> changelog(2, MINI_BATCH));
        run(only, "a changelog, one phase, P = 3", () -> changelog(3, new String[0]));
        run(only, "WHERE and HAVING around the GROUP BY, P = 2", FlinkTests::whereAndHaving);
        run(only, "the changelog equals Flink's row for row at P = 1 (mini-batch off)", FlinkTests::changelogAtOne);
        run(only, "an injected failure after a checkpoint restores exactly, P = 2", FlinkTests::restoresAfterFailure);
        run(only, "a checkpoint at P = 2 restores at P = 3 and at P = 1", FlinkTests::rescales);
        run(only, "a nested aggregate over a changelog, two phases, P = 2", () -> nested(2, MINI_BATCH));
        run(only, "a nested aggregate, one phase, P = 3", () -> nested(3, new String[0]));
        run(only, "split-distinct with FILTER over a changelog, two phases, P = 2", () -> splitDistinct(2, MINI_BATCH));
        run(only, "split-distinct without Flink's incremental aggregate, two phases, P = 2", () -> splitDistinct(2,
                concat(MINI_BATCH, "table.optimizer.incremental-agg-enabled", "false")));
        run(only, "split-distinct, one phase, P = 3", () -> splitDistinct(3, new String[0]));
        run(only, "a Table in, the changelog back as a Table under Flink SQL, P = 2", FlinkTests::tableInAndOut);
        run(only, "DECIMAL, DATE and TIMESTAMP(9) columns of a DataStream, two phases, P = 2", FlinkTests::typedStream);
        run(only, "DECIMAL(10, 2) and TIMESTAMP(6) columns of a Table, one phase, P = 2", FlinkTests::typedTable);
        run(only, "an unsupported query is a one-line error at job construction", FlinkTests::badQuery);
        run(only, "a keyed parallelism other than the one apply() saw is a clear error", FlinkTests::parallelismChanged);
        System.out.println(passed + " passed, " + failed + " failed");
        System.exit(failed == 0 ? 0 : 1);
    }

    interface Case {
        void run() throws Exception;
    }

    private static void run(String only, String name, Case c) {
        if (!name.contains(only)) {
            return;
        }
        long start = System.nanoTime();
        try {
            c.run();
            passed++;
            System.out.printf("ok   %s (%.1f s)%n", name, (System.nanoTime() - start) / 1e9);
        } catch (Throwable t) {
            failed++;
            System.out.printf("FAIL %s: %s%n", name, t);
            t.printStackTrace(System.out);
        }
    }

    static void check(boolean ok, String what) {
        if (!ok) {
            throw new AssertionError(what);
        }
    }

    // ---- inputs ---------------------------------------------------------------------------

    /** Seeded orders: a hot shop with a third of the rows, NULL amounts, two statuses. */
    static List<Row> orders(long seed, int n) {
        Random r = new Random(seed);
        List<Row> rows = new ArrayList<>(n);
        for (int i = 0; i < n; i++) {
            rows.add(order(r, i));
        }
        return rows;
    }

    static Row order(Random r, long id) {
        String shop = r.nextInt(3) == 0 ? "hot" : "s" + r.nextInt(20);
        Long amount = r.nextInt(10) == 0 ? null : (long) r.nextInt(1000);
        return Row.ofKind(RowKind.INSERT, id, shop, (long) r.nextInt(200), amount, r.nextInt(5) < 3 ? "PAID" : "NEW");
    }

    /** A seeded changelog over orders: inserts, updates (-U then +U) and deletes of earlier rows. */
    static List<Row> changes(long seed, int n) {
        return changes(seed, n, FlinkTests::order);
    }

    /** A seeded changelog of rows that {@code make} draws (field 0 an id, field 1 the key). */
    static List<Row> changes(long seed, int n, BiFunction<Random, Long, Row> make) {
        Random r = new Random(seed);
        List<Row> out = new ArrayList<>();
        List<Row> live = new ArrayList<>();
        long next = 0;
        while (out.size() < n) {
            int op = r.nextInt(20);
            if (live.isEmpty() || op < 11) {
                Row row = make.apply(r, next++);
                live.add(row);
                out.add(row);
            } else if (op < 17) {
                int i = r.nextInt(live.size());
                Row old = live.get(i);
                Row now = make.apply(r, (Long) old.getField(0));
                if (r.nextBoolean()) {
                    now.setField(1, old.getField(1)); // most updates keep the key
                }
                out.add(withKind(old, RowKind.UPDATE_BEFORE));
                out.add(withKind(now, RowKind.UPDATE_AFTER));
                live.set(i, now);
            } else {
                int i = r.nextInt(live.size());
                out.add(withKind(live.remove(i), RowKind.DELETE));
            }
        }
        return out;
    }

    static Row withKind(Row row, RowKind kind) {
        Row copy = Row.copy(row);
        copy.setKind(kind);
        return copy;
    }

    // ---- running both sides ----------------------------------------------------------------

    static StreamExecutionEnvironment env(int parallelism) {
        Configuration conf = new Configuration();
        conf.setString("rest.bind-port", "0");
        StreamExecutionEnvironment env = StreamExecutionEnvironment.getExecutionEnvironment(conf);
        env.setParallelism(parallelism);
        return env;
    }

    static TallyAggregate tally(String sql, String[] options) {
        Map<String, String> map = new java.util.LinkedHashMap<>();
        for (int i = 0; i < options.length; i += 2) {
            map.put(options[i], options[i + 1]);
        }
        return TallyAggregate.sql(sql, map).table("orders");
    }

    static List<Row> collect(DataStream<Row> stream) throws Exception {
        List<Row> out = new ArrayList<>();
        try (CloseableIterator<Row> it = stream.executeAndCollect()) {
            it.forEachRemaining(out::add);
        }
        return out;
    }

    /** The Tally operator's changelog over {@code input}. */
    static List<Row> runTally(List<Row> input, int p, String sql, String[] options, boolean changelog) throws Exception {
        StreamExecutionEnvironment env = env(p);
        DataStream<Row> in = env.fromData(input, ORDERS);
        TallyAggregate t = tally(sql, options);
        if (changelog) {
            t.changelog();
        }
        return collect(t.apply(in));
    }

    /** Flink SQL's changelog of the same query over the same input. */
    static List<Row> runFlink(List<Row> input, int p, String sql, boolean changelog) throws Exception {
        StreamExecutionEnvironment env = env(p);
        StreamTableEnvironment tEnv = StreamTableEnvironment.create(env);
        DataStream<Row> in = env.fromData(input, ORDERS);
        Table t = changelog ? tEnv.fromChangelogStream(in) : tEnv.fromDataStream(in);
        tEnv.createTemporaryView("orders", t);
        List<Row> out = new ArrayList<>();
        try (CloseableIterator<Row> it = tEnv.executeSql(sql).collect()) {
            it.forEachRemaining(out::add);
        }
        return out;
    }

    static String fields(Row r) {
        StringBuilder b = new StringBuilder();
        for (int i = 0; i < r.getArity(); i++) {
            b.append(i == 0 ? "" : ", ").append(r.getField(i));
        }
        return b.toString();
    }

    /** The final table of a changelog, as a sorted multiset of rows; fails on a retraction of a row that is not there. */
    static Map<String, Integer> finalTable(List<Row> changelog) {
        Map<String, Integer> table = new TreeMap<>();
        for (Row r : changelog) {
            String f = fields(r);
            if (r.getKind() == RowKind.INSERT || r.getKind() == RowKind.UPDATE_AFTER) {
                table.merge(f, 1, Integer::sum);
            } else {
                Integer had = table.get(f);
                check(had != null, "a " + r.getKind().shortString() + " of a row not in the table: " + f);
                if (had == 1) {
                    table.remove(f);
                } else {
                    table.put(f, had - 1);
                }
            }
        }
        return table;
    }

    static void sameFinalTable(List<Row> tally, List<Row> flink) {
        Map<String, Integer> a = finalTable(tally);
        Map<String, Integer> b = finalTable(flink);
        check(!b.isEmpty(), "Flink's result is empty: the case checks nothing");
        check(a.equals(b), "final tables differ:\n tally " + a + "\n flink " + b);
    }

    // ---- cases -----------------------------------------------------------------------------

    static final String ORDERS_QUERY = "SELECT shop, COUNT(*) AS orders, SUM(amount) AS total, MAX(amount) AS top, "
            + "COUNT(DISTINCT user_id) AS buyers, SUM(amount) FILTER (WHERE status = 'PAID') AS paid "
            + "FROM orders GROUP BY shop";

    static void insertOnly(int p, String[] options) throws Exception {
        List<Row> input = orders(7, 20_000);
        sameFinalTable(runTally(input, p, ORDERS_QUERY, options, false), runFlink(input, p, ORDERS_QUERY, false));
    }

    static final String CHANGELOG_QUERY = "SELECT shop, COUNT(*) AS orders, SUM(amount) AS total, MIN(amount) AS low, "
            + "COUNT(DISTINCT user_id) AS buyers, COUNT(*) FILTER (WHERE status = 'NEW') AS fresh "
            + "FROM orders GROUP BY shop";

    static void changelog(int p, String[] options) throws Exception {
        List<Row> input = changes(11, 20_000);
        sameFinalTable(runTally(input, p, CHANGELOG_QUERY, options, true), runFlink(input, p, CHANGELOG_QUERY, true));
    }

    static void whereAndHaving() throws Exception {
        String sql = "SELECT shop, COUNT(*) AS big, SUM(amount) AS total FROM orders "
                + "WHERE amount > 500 GROUP BY shop HAVING COUNT(*) > 150";
        List<Row> input = changes(5, 10_000);
        sameFinalTable(runTally(input, 2, sql, MINI_BATCH, true), runFlink(input, 2, sql, true));
    }

    /** Each key's changes in order, as Flink guarantees them at any parallelism. */
    static Map<Object, List<String>> perKey(List<Row> changelog) {
        Map<Object, List<String>> out = new TreeMap<>();
        for (Row r : changelog) {
            out.computeIfAbsent(r.getField(0), k -> new ArrayList<>()).add(r.getKind().shortString() + " " + fields(r));
        }
        return out;
    }

    /**
     * At parallelism 1 with mini-batch off Flink's changelog is deterministic (one subtask, each
     * row in input order): Tally's must be the same, row for row, for a plain and a nested
     * aggregate.
     */
    static void changelogAtOne() throws Exception {
        String plain = "SELECT shop, COUNT(*) AS orders, SUM(amount) AS total FROM orders GROUP BY shop";
        String nested = "SELECT orders, COUNT(*) AS shops, MAX(total) AS best FROM (" + plain + ") GROUP BY orders";
        List<Row> input = changes(3, 3_000);
        for (String sql : new String[] {plain, nested}) {
            List<Row> tally = runTally(input, 1, sql, new String[0], true);
            List<Row> flink = runFlink(input, 1, sql, true);
            check(flink.size() > 1000, "Flink's changelog has only " + flink.size() + " rows");
            for (int i = 0; i < Math.max(tally.size(), flink.size()); i++) {
                String x = i < tally.size() ? tally.get(i).getKind().shortString() + " " + fields(tally.get(i)) : "none";
                String y = i < flink.size() ? flink.get(i).getKind().shortString() + " " + fields(flink.get(i)) : "none";
                check(x.equals(y), "change " + i + " of " + sql + ": tally " + x + ", flink " + y);
            }
        }
    }

    /** Throws once, after the job's first completed checkpoint. */
    static final class FailOnce implements MapFunction<Long, Row>, CheckpointListener {
        private static final long serialVersionUID = 1L;
        static final AtomicBoolean CHECKPOINTED = new AtomicBoolean();
        static final AtomicBoolean FAILED = new AtomicBoolean();

        @Override
        public Row map(Long i) throws Exception {
            if (i % 50 == 0) {
                Thread.sleep(1);
            }
            if (CHECKPOINTED.get() && i % 97 == 0 && FAILED.compareAndSet(false, true)) {
                throw new RuntimeException("injected failure");
            }
            return order(new Random(i), i);
        }

        @Override
        public void notifyCheckpointComplete(long checkpointId) {
            CHECKPOINTED.set(true);
        }
    }

    static void restoresAfterFailure() throws Exception {
        int n = 30_000;
        Configuration conf = new Configuration();
        conf.setString("restart-strategy.type", "fixed-delay");
        conf.setString("restart-strategy.fixed-delay.attempts", "3");
        conf.setString("restart-strategy.fixed-delay.delay", "200 ms");
        conf.setString("rest.bind-port", "0");
        StreamExecutionEnvironment env = StreamExecutionEnvironment.getExecutionEnvironment(conf);
        env.setParallelism(2);
        env.enableCheckpointing(100);
        DataStream<Row> in = env.fromSequence(0, n - 1).map(new FailOnce()).returns(ORDERS);
        String sql = "SELECT shop, COUNT(*) AS orders, SUM(amount) AS total FROM orders GROUP BY shop";
        List<Row> tally = collect(tally(sql, MINI_BATCH).apply(in));
        check(FailOnce.FAILED.get(), "the failure was never injected: no checkpoint completed in time");
        List<Row> input = new ArrayList<>(n);
        for (long i = 0; i < n; i++) {
            input.add(order(new Random(i), i));
        }
        sameFinalTable(tally, runFlink(input, 2, sql, false));
    }

    /** Stops job A for good once a checkpoint has completed and a third of the rows passed. */
    static final class StopOnce implements MapFunction<Long, Row>, CheckpointListener {
        private static final long serialVersionUID = 1L;
        static volatile boolean armed;
        static final AtomicBoolean CHECKPOINTED = new AtomicBoolean();
        private final long after;

        StopOnce(long after) {
            this.after = after;
        }

        @Override
        public Row map(Long i) throws Exception {
            if (i % 50 == 0) {
                Thread.sleep(1);
            }
            if (armed && CHECKPOINTED.get() && i > after) {
                throw new RuntimeException("job A stops here");
            }
            return order(new Random(i), i);
        }

        @Override
        public void notifyCheckpointComplete(long checkpointId) {
            CHECKPOINTED.set(true);
        }
    }

    static DataStream<Row> stoppable(StreamExecutionEnvironment env, int n, String sql) {
        DataStream<Row> in = env.fromSequence(0, n - 1).uid("numbers")
                .map(new StopOnce(n / 3)).uid("orders").returns(ORDERS);
        return tally(sql, MINI_BATCH).uid("tally").apply(in);
    }

    /** The newest retained checkpoint under {@code dir}. */
    static java.io.File newestCheckpoint(java.io.File dir) {
        java.io.File best = null;
        long id = -1;
        java.io.File[] jobs = dir.listFiles();
        for (java.io.File job : jobs == null ? new java.io.File[0] : jobs) {
            java.io.File[] chks = job.listFiles();
            for (java.io.File chk : chks == null ? new java.io.File[0] : chks) {
                if (chk.getName().startsWith("chk-") && new java.io.File(chk, "_metadata").exists()) {
                    long n = Long.parseLong(chk.getName().substring(4));
                    if (n > id) {
                        id = n;
                        best = chk;
                    }
                }
            }
        }
        check(best != null, "job A left no checkpoint under " + dir);
        return best;
    }

    /** The final table of a changelog read as upserts by the first column (the group key). */
    static Map<String, Integer> upserted(List<Row> changelog) {
        Map<Object, String> byKey = new HashMap<>();
        for (Row r : changelog) {
            if (r.getKind() == RowKind.INSERT || r.getKind() == RowKind.UPDATE_AFTER) {
                byKey.put(r.getField(0), fields(r));
            } else if (r.getKind() == RowKind.DELETE) {
                byKey.remove(r.getField(0));
            }
        }
        Map<String, Integer> table = new TreeMap<>();
        for (String f : byKey.values()) {
            table.merge(f, 1, Integer::sum);
        }
        return table;
    }

    static void rescales() throws Exception {
        int n = 30_000;
        String sql = "SELECT shop, COUNT(*) AS orders, SUM(amount) AS total, MAX(amount) AS top FROM orders GROUP BY shop";
        java.io.File dir = java.nio.file.Files.createTempDirectory("tally-flink-chk").toFile();
        Configuration a = new Configuration();
        a.setString("restart-strategy.type", "none");
        a.setString("execution.checkpointing.dir", dir.toURI().toString());
        a.setString("execution.checkpointing.externalized-checkpoint-retention", "RETAIN_ON_CANCELLATION");
        a.setString("rest.bind-port", "0");
        StreamExecutionEnvironment envA = StreamExecutionEnvironment.getExecutionEnvironment(a);
        envA.setParallelism(2);
        envA.enableCheckpointing(100);
        StopOnce.armed = true;
        try {
            collect(stoppable(envA, n, sql));
            throw new AssertionError("job A did not stop");
        } catch (Exception expected) {
            // job A failed for good after its checkpoints
        }
        StopOnce.armed = false;
        java.io.File chk = newestCheckpoint(dir);
        List<Row> input = new ArrayList<>(n);
        for (long i = 0; i < n; i++) {
            input.add(order(new Random(i), i));
        }
        Map<String, Integer> expected = finalTable(runFlink(input, 2, sql, false));
        for (int p : new int[] {3, 1}) {
            Configuration b = new Configuration();
            b.setString("execution.state-recovery.path", chk.toURI().toString());
            b.setString("execution.state-recovery.ignore-unclaimed-state", "true");
            b.setString("rest.bind-port", "0");
            StreamExecutionEnvironment envB = StreamExecutionEnvironment.getExecutionEnvironment(b);
            envB.setParallelism(p);
            List<Row> out = collect(stoppable(envB, n, sql));
            long restoredKeys = perKey(out).values().stream().filter(c -> c.get(0).startsWith("-U")).count();
            check(restoredKeys > 0, "job B at P = " + p + " began every key with +I: it restored no state");
            Map<String, Integer> got = upserted(out);
            check(got.equals(expected), "restored at P = " + p + " from " + chk.getName() + ":\n tally " + got + "\n flink " + expected);
        }
        deleteRecursively(dir.toPath());
    }

    /** Removes a test's scratch directory and everything under it. */
    static void deleteRecursively(java.nio.file.Path root) throws java.io.IOException {
        try (java.util.stream.Stream<java.nio.file.Path> paths = java.nio.file.Files.walk(root)) {
            for (java.nio.file.Path p : (Iterable<java.nio.file.Path>) paths.sorted(java.util.Comparator.reverseOrder())::iterator) {
                java.nio.file.Files.delete(p);
            }
        }
    }

    /** A Table in, Tally's changelog back into a Table, and Flink SQL over it. */
    static void tableInAndOut() throws Exception {
        List<Row> input = changes(21, 10_000);
        String sql = "SELECT shop, COUNT(*) AS orders, SUM(amount) AS total FROM orders GROUP BY shop";
        String top = "SELECT COUNT(*) AS shops, SUM(orders) AS orders, MAX(total) AS best FROM totals";
        StreamExecutionEnvironment env = env(2);
        StreamTableEnvironment tEnv = StreamTableEnvironment.create(env);
        Table orders = tEnv.fromChangelogStream(env.fromData(input, ORDERS));
        DataStream<Row> totals = tally(sql, MINI_BATCH).changelog().apply(tEnv, orders);
        tEnv.createTemporaryView("totals", tEnv.fromChangelogStream(totals));
        List<Row> tally = new ArrayList<>();
        try (CloseableIterator<Row> it = tEnv.executeSql(top).collect()) {
            it.forEachRemaining(tally::add);
        }
        StreamExecutionEnvironment env2 = env(2);
        StreamTableEnvironment tEnv2 = StreamTableEnvironment.create(env2);
        tEnv2.createTemporaryView("orders", tEnv2.fromChangelogStream(env2.fromData(input, ORDERS)));
        tEnv2.createTemporaryView("totals", tEnv2.sqlQuery(sql));
        List<Row> flink = new ArrayList<>();
        try (CloseableIterator<Row> it = tEnv2.executeSql(top).collect()) {
            it.forEachRemaining(flink::add);
        }
        sameFinalTable(tally, flink);
    }

    /** Split-distinct: a PARTIAL aggregate by key and bucket, then the FINAL after a second exchange. */
    static void splitDistinct(int p, String[] options) throws Exception {
        String sql = "SELECT shop, COUNT(DISTINCT user_id) AS buyers, "
                + "COUNT(DISTINCT user_id) FILTER (WHERE status = 'PAID') AS paying, SUM(amount) AS total FROM orders GROUP BY shop";
        String[] split = concat(options, "table.optimizer.distinct-agg.split.enabled", "true",
                "table.optimizer.distinct-agg.split.bucket-num", "16");
        List<Row> input = changes(17, 20_000);
        sameFinalTable(runTally(input, p, sql, split, true), runFlink(input, p, sql, true));
    }

    static String[] concat(String[] options, String... more) {
        String[] all = java.util.Arrays.copyOf(options, options.length + more.length);
        System.arraycopy(more, 0, all, options.length, more.length);
        return all;
    }

    /** An aggregate over another's changelog: a second exchange, keyed by the outer keys. */
    static void nested(int p, String[] options) throws Exception {
        String sql = "SELECT orders, COUNT(*) AS shops, MAX(total) AS best FROM "
                + "(SELECT shop, COUNT(*) AS orders, SUM(amount) AS total FROM orders GROUP BY shop) GROUP BY orders";
        List<Row> input = changes(13, 20_000);
        sameFinalTable(runTally(input, p, sql, options, true), runFlink(input, p, sql, true));
    }

    /**
     * A typed order: prices of up to 7 digits with 2 decimals (NULL in one of ten; beyond a long
     * once scaled to 18 digits, and below), days over a month, timestamps that differ by a
     * microsecond or by 250 ns. Each lies a millisecond or more past its second: Flink's
     * narrowing CAST leaves a fraction written in fewer digits than the target precision as it
     * is (its DateTimeUtils.truncate counts the digits of the nanoseconds without their leading
     * zeros), so .000001750 would stay .000001750 as a TIMESTAMP(6).
     */
    static Row typed(Random r, long id) {
        String shop = r.nextInt(3) == 0 ? "hot" : "s" + r.nextInt(10);
        BigDecimal price = r.nextInt(10) == 0 ? null : BigDecimal.valueOf(r.nextInt(2_000_000) - 1_000_000, 2);
        LocalDate day = LocalDate.of(2024, 1, 1).plusDays(r.nextInt(30));
        LocalDateTime ts = day.atStartOfDay().plusSeconds(r.nextInt(3))
                .plusNanos(1_000_000 + 1_000L * r.nextInt(3) + 250L * r.nextInt(4));
        return Row.ofKind(RowKind.INSERT, id, shop, price, day, ts);
    }

    static final String TYPED_QUERY = "SELECT shop, SUM(price) AS total, MAX(price) AS top, AVG(price) AS mean, "
            + "MIN(sold_on) AS first_day, MAX(ts) AS last_ts, COUNT(DISTINCT ts) AS moments, COUNT(DISTINCT sold_on) AS days, "
            + "SUM(price) FILTER (WHERE sold_on > DATE '2024-01-15') AS late FROM orders GROUP BY shop";

    /** DECIMAL(38, 18), DATE and TIMESTAMP(9), as Flink types a DataStream's BigDecimal, LocalDate and LocalDateTime. */
    static void typedStream() throws Exception {
        List<Row> input = changes(23, 10_000, FlinkTests::typed);
        StreamExecutionEnvironment env = env(2);
        List<Row> tally = collect(tally(TYPED_QUERY, MINI_BATCH).changelog().apply(env.fromData(input, TYPED)));
        StreamExecutionEnvironment env2 = env(2);
        StreamTableEnvironment tEnv = StreamTableEnvironment.create(env2);
        tEnv.createTemporaryView("orders", tEnv.fromChangelogStream(env2.fromData(input, TYPED)));
        List<Row> flink = new ArrayList<>();
        try (CloseableIterator<Row> it = tEnv.executeSql(TYPED_QUERY).collect()) {
            it.forEachRemaining(flink::add);
        }
        sameFinalTable(tally, flink);
    }

    /** A Table's own precisions: DECIMAL(10, 2) and TIMESTAMP(6) (its CAST drops the nanoseconds). */
    static void typedTable() throws Exception {
        List<Row> input = changes(29, 10_000, FlinkTests::typed);
        String narrow = "SELECT id, shop, CAST(price AS DECIMAL(10, 2)) AS price, sold_on, CAST(ts AS TIMESTAMP(6)) AS ts FROM typed_orders";
        List<List<Row>> results = new ArrayList<>();
        for (boolean viaTally : new boolean[] {true, false}) {
            StreamExecutionEnvironment env = env(2);
            StreamTableEnvironment tEnv = StreamTableEnvironment.create(env);
            tEnv.createTemporaryView("typed_orders", tEnv.fromChangelogStream(env.fromData(input, TYPED)));
            Table orders = tEnv.sqlQuery(narrow);
            if (viaTally) {
                results.add(collect(tally(TYPED_QUERY, new String[0]).changelog().apply(tEnv, orders)));
            } else {
                tEnv.createTemporaryView("orders", orders);
                List<Row> flink = new ArrayList<>();
                try (CloseableIterator<Row> it = tEnv.executeSql(TYPED_QUERY).collect()) {
                    it.forEachRemaining(flink::add);
                }
                results.add(flink);
            }
        }
        sameFinalTable(results.get(0), results.get(1));
    }

    /** Built at parallelism 1 (whole batches to one keyed subtask), then run at 2. */
    static void parallelismChanged() throws Exception {
        StreamExecutionEnvironment env = env(1);
        DataStream<Row> out = tally("SELECT shop, COUNT(*) AS orders FROM orders GROUP BY shop", new String[0])
                .apply(env.fromData(orders(1, 100), ORDERS));
        ((org.apache.flink.streaming.api.datastream.SingleOutputStreamOperator<Row>) out).setParallelism(2);
        try {
            collect(out);
            throw new AssertionError("the job ran");
        } catch (Exception e) {
            Throwable t = e;
            while (t != null && !(t instanceof TallyException)) {
                t = t.getCause();
            }
            check(t != null && t.getMessage().contains("built for one keyed subtask"), "the job failed with " + e);
        }
    }

    static void badQuery() {
        StreamExecutionEnvironment env = env(1);
        DataStream<Row> in = env.fromData(orders(1, 10), ORDERS);
        String[][] cases = {
            {"SELECT shop, COUNT(*) FROM orders GROUP BY nope", "nope"},
            {"SELECT shop, COUNT(*) FILTER (WHERE user_id < 5 AND amount) FROM orders GROUP BY shop", "amount"},
            {"SELECT shop, COUNT(DISTINCT user_id) FROM orders GROUP BY shop", "split.enabled",
                "tally.optimizer.distinct-agg.split.auto", "true"},
            {"SELECT shop, COUNT(*) FROM orders GROUP BY shop", "table.exec.mini-batch.size",
                "table.exec.mini-batch.size", "lots"},
            {"SELEC shop FROM orders", "SELEC"},
        };
        for (String[] c : cases) {
            try {
                tally(c[0], java.util.Arrays.copyOfRange(c, 2, c.length)).apply(in);
                throw new AssertionError("no error for " + c[0]);
            } catch (TallyException e) {
                check(e.getMessage().contains(c[1]) && !e.getMessage().contains("\n"),
                        "the error for " + c[0] + " is " + e.getMessage());
            }
        }
    }
}
