package org.tally.flink.examples;

import java.util.Map;
import java.util.TreeMap;

import org.apache.flink.api.common.typeinfo.TypeInformation;
import org.apache.flink.api.common.typeinfo.Types;
import org.apache.flink.api.java.typeutils.RowTypeInfo;
import org.apache.flink.streaming.api.datastream.DataStream;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.types.Row;
import org.apache.flink.types.RowKind;
import org.apache.flink.util.CloseableIterator;
import org.tally.flink.TallyAggregate;

/**
 * A Flink job whose GROUP BY runs in Tally: a million generated orders at parallelism 2, totals
 * per shop in two phases (a local phase chained to the source, Flink's keyed exchange, a global
 * phase per subtask), checkpointed every second. Prints the final table from the changelog.
 *
 * <pre>scripts/flink-example.sh [ROWS]</pre>
 */
public final class ShopTotals {
    private ShopTotals() {}

    public static void main(String[] args) throws Exception {
        long rows = args.length > 0 ? Long.parseLong(args[0]) : 1_000_000;
        StreamExecutionEnvironment env = StreamExecutionEnvironment.getExecutionEnvironment();
        env.setParallelism(2);
        env.enableCheckpointing(1000);

        RowTypeInfo orders = new RowTypeInfo(
                new TypeInformation<?>[] {Types.STRING, Types.LONG, Types.LONG, Types.STRING},
                new String[] {"shop", "user_id", "amount", "status"});
        DataStream<Row> input = env.fromSequence(0, rows - 1)
                .map(i -> Row.of("shop-" + (i % 7 == 0 ? 0 : i % 50), i % 10_000, i % 1_000, i % 3 == 0 ? "NEW" : "PAID"))
                .returns(orders);

        DataStream<Row> totals = TallyAggregate
                .sql("SELECT shop, COUNT(*) AS orders, SUM(amount) FILTER (WHERE status = 'PAID') AS paid, "
                        + "COUNT(DISTINCT user_id) AS buyers FROM orders GROUP BY shop")
                .table("orders")
                .option("table.exec.mini-batch.enabled", "true")
                .option("table.exec.mini-batch.allow-latency", "1 s")
                .option("table.exec.mini-batch.size", "10000")
                .uid("shop-totals")
                .apply(input);

        Map<String, Row> table = new TreeMap<>();
        long changes = 0;
        try (CloseableIterator<Row> it = totals.executeAndCollect("shop totals")) {
            while (it.hasNext()) {
                Row r = it.next();
                changes++;
                if (r.getKind() == RowKind.INSERT || r.getKind() == RowKind.UPDATE_AFTER) {
                    table.put((String) r.getField(0), r);
                } else if (r.getKind() == RowKind.DELETE) {
                    table.remove((String) r.getField(0));
                }
            }
        }
        System.out.println(changes + " changes; the final table (shop, orders, paid, buyers):");
        for (Row r : table.values()) {
            System.out.println("  " + r.getField(0) + " " + r.getField(1) + " " + r.getField(2) + " " + r.getField(3));
        }
    }
}
