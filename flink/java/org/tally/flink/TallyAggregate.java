package org.tally.flink;

import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

import org.apache.flink.api.common.typeinfo.BasicTypeInfo;
import org.apache.flink.api.common.typeinfo.PrimitiveArrayTypeInfo;
import org.apache.flink.api.common.typeinfo.TypeInformation;
import org.apache.flink.api.common.typeinfo.Types;
import org.apache.flink.api.java.functions.KeySelector;
import org.apache.flink.api.java.typeutils.RowTypeInfo;
import org.apache.flink.runtime.state.KeyGroupRangeAssignment;
import org.apache.flink.streaming.api.datastream.DataStream;
import org.apache.flink.streaming.api.datastream.SingleOutputStreamOperator;
import org.apache.flink.table.api.Table;
import org.apache.flink.table.api.bridge.java.StreamTableEnvironment;
import org.apache.flink.table.catalog.Column;
import org.apache.flink.table.types.logical.DecimalType;
import org.apache.flink.table.types.logical.LogicalType;
import org.apache.flink.table.types.logical.TimestampType;
import org.apache.flink.types.Row;

/**
 * A Flink SQL {@code GROUP BY} run by Tally inside a Flink job.
 *
 * <pre>{@code
 * DataStream<Row> orders = ...;   // a RowTypeInfo with the columns the query reads
 * DataStream<Row> totals = TallyAggregate
 *     .sql("SELECT shop, COUNT(*) AS orders, SUM(amount) AS total FROM orders GROUP BY shop")
 *     .table("orders")
 *     .option("table.exec.mini-batch.enabled", "true")
 *     .option("table.exec.mini-batch.allow-latency", "1 s")
 *     .option("table.exec.mini-batch.size", "1000")
 *     .apply(orders);              // the changelog: rows with RowKind +I, -U, +U, -D
 * }</pre>
 *
 * <p>With mini-batch on (and {@code table.optimizer.agg-phase-strategy} not {@code ONE_PHASE})
 * the aggregate runs in two phases the Flink way: a local phase chained to the input's task, then
 * Flink's keyed exchange by key group, then a global phase per subtask. An aggregate over another
 * aggregate's result is one more keyed operator after one more exchange. Tally's key groups are
 * Flink's: {@code pipeline.max-parallelism} of them (Flink's default rule when unset), the global
 * operator's max parallelism, so Flink snapshots, restores and rescales Tally's state by key group.
 * Options take Flink's and Tally's {@code SET} keys.
 */
public final class TallyAggregate {
    private final String sql;
    private String table = "input";
    private boolean changelog;
    private final Map<String, String> options = new LinkedHashMap<>();
    private String uid;

    private TallyAggregate(String sql) {
        this.sql = sql;
    }

    /** An aggregate running {@code sql}, one {@code SELECT ... GROUP BY} over the input table. */
    public static TallyAggregate sql(String sql) {
        return new TallyAggregate(sql);
    }

    /** An aggregate running {@code sql} under {@code options} ({@code SET} keys, as {@link #option}). */
    public static TallyAggregate sql(String sql, Map<String, String> options) {
        return new TallyAggregate(sql).options(options);
    }

    /** The name the query's {@code FROM} gives the input stream ({@code input} by default). */
    public TallyAggregate table(String name) {
        this.table = name;
        return this;
    }

    /** The input is a changelog: its rows' {@code RowKind}s are +I, -U, +U and -D. */
    public TallyAggregate changelog() {
        this.changelog = true;
        return this;
    }

    /** A {@code SET} option (Flink's key, or Tally's {@code tally.} key). */
    public TallyAggregate option(String key, String value) {
        options.put(key, value);
        return this;
    }

    /** Options, as {@link #option}. */
    public TallyAggregate options(Map<String, String> more) {
        options.putAll(more);
        return this;
    }

    /**
     * The operators' uid prefix ({@code <uid>-local}, {@code <uid>-aggregate<k>} between two
     * aggregates, {@code <uid>-global}), so a job's state
     * restores into a changed job graph.
     */
    public TallyAggregate uid(String uid) {
        this.uid = uid;
        return this;
    }

    /** The type name Tally's SQL gives a Flink type, or an error naming the column. */
    private static String typeName(String column, TypeInformation<?> t) {
        if (t.equals(BasicTypeInfo.STRING_TYPE_INFO)) return "STRING";
        if (t.equals(BasicTypeInfo.LONG_TYPE_INFO)) return "BIGINT";
        if (t.equals(BasicTypeInfo.INT_TYPE_INFO)) return "INT";
        if (t.equals(BasicTypeInfo.DOUBLE_TYPE_INFO)) return "DOUBLE";
        if (t.equals(BasicTypeInfo.FLOAT_TYPE_INFO)) return "FLOAT";
        if (t.equals(BasicTypeInfo.SHORT_TYPE_INFO)) return "SMALLINT";
        if (t.equals(BasicTypeInfo.BYTE_TYPE_INFO)) return "TINYINT";
        if (t.equals(BasicTypeInfo.BOOLEAN_TYPE_INFO)) return "BOOLEAN";
        // As Flink's fromDataStream types them: TIMESTAMP(9), DECIMAL(38, 18).
        if (t.equals(Types.LOCAL_DATE_TIME)) return "TIMESTAMP(9)";
        if (t.equals(Types.LOCAL_DATE)) return "DATE";
        if (t.equals(Types.BIG_DEC)) return "DECIMAL(38, 18)";
        throw new TallyException("column '" + column + "' is of type " + t
                + ", which does not cross into the Tally operator (STRING, BIGINT, INT, DOUBLE, FLOAT, SMALLINT, TINYINT, BOOLEAN, "
                + "BigDecimal as DECIMAL(38, 18), LocalDate as DATE, LocalDateTime as TIMESTAMP(9))");
    }

    private static TypeInformation<?> typeInfo(String name) {
        switch (name) {
            case "STRING": return Types.STRING;
            case "BIGINT": return Types.LONG;
            case "INT": return Types.INT;
            case "DOUBLE": return Types.DOUBLE;
            case "FLOAT": return Types.FLOAT;
            case "SMALLINT": return Types.SHORT;
            case "TINYINT": return Types.BYTE;
            case "BOOLEAN": return Types.BOOLEAN;
            case "DATE": return Types.LOCAL_DATE;
            default:
                if (name.startsWith("TIMESTAMP(")) return Types.LOCAL_DATE_TIME;
                if (name.startsWith("DECIMAL(")) return Types.BIG_DEC;
                throw new TallyException("result type " + name + " has no Flink type here");
        }
    }

    /** The planned query's result: the plan's facts and the result rows' type. */
    static final class Described {
        final int keyGroups;
        /** Per aggregate, two phases or one: one keyed phase each. */
        final boolean[] twoPhase;
        final int batchRows;
        final long latencyMs;
        /** The input columns the query reads: only these cross. */
        final String read;
        final RowTypeInfo output;

        Described(String[] d) {
            keyGroups = Integer.parseInt(d[0]);
            String[] strategies = d[1].split(",");
            twoPhase = new boolean[strategies.length];
            for (int i = 0; i < strategies.length; i++) twoPhase[i] = strategies[i].equals("TWO_PHASE");
            batchRows = Integer.parseInt(d[2]);
            latencyMs = Long.parseLong(d[3]);
            read = d[4];
            int n = (d.length - 5) / 3;
            TypeInformation<?>[] types = new TypeInformation<?>[n];
            String[] names = new String[n];
            for (int i = 0; i < n; i++) {
                names[i] = d[5 + 3 * i];
                types[i] = typeInfo(d[6 + 3 * i]);
            }
            output = new RowTypeInfo(types, names);
        }
    }

    /**
     * Applies the aggregate to {@code input}, whose type must be a {@link RowTypeInfo} with the
     * columns the query reads. Returns the changelog of the result.
     *
     * @throws TallyException bad SQL or options, or a column type that does not cross
     */
    public DataStream<Row> apply(DataStream<Row> input) {
        if (!(input.getType() instanceof RowTypeInfo)) {
            throw new TallyException("the Tally operator's input must be rows with a RowTypeInfo, not " + input.getType()
                    + " (a Table goes through apply(tableEnv, table))");
        }
        RowTypeInfo in = (RowTypeInfo) input.getType();
        String[] names = in.getFieldNames();
        String[] types = new String[names.length];
        for (int i = 0; i < names.length; i++) {
            types[i] = typeName(names[i], in.getTypeAt(i));
        }
        return applyTo(input, names, types);
    }

    /**
     * Applies the aggregate to a {@link Table} (through {@code toChangelogStream}); its columns
     * are the table's. Returns the changelog of the result, which {@code fromChangelogStream}
     * turns back into a table. An updating table needs {@link #changelog()}.
     *
     * @throws TallyException as {@link #apply(DataStream)}
     */
    public DataStream<Row> apply(StreamTableEnvironment tableEnv, Table table) {
        List<Column> cols = table.getResolvedSchema().getColumns();
        String[] names = new String[cols.size()];
        String[] types = new String[cols.size()];
        for (int i = 0; i < names.length; i++) {
            names[i] = cols.get(i).getName();
            types[i] = typeName(names[i], cols.get(i).getDataType().getLogicalType());
        }
        return applyTo(tableEnv.toChangelogStream(table), names, types);
    }

    /** The type name Tally's SQL gives a table column's type, or an error naming the column. */
    private static String typeName(String column, LogicalType t) {
        switch (t.getTypeRoot()) {
            case CHAR: case VARCHAR: return "STRING";
            case BIGINT: return "BIGINT";
            case INTEGER: return "INT";
            case DOUBLE: return "DOUBLE";
            case FLOAT: return "FLOAT";
            case SMALLINT: return "SMALLINT";
            case TINYINT: return "TINYINT";
            case BOOLEAN: return "BOOLEAN";
            case DATE: return "DATE";
            case TIMESTAMP_WITHOUT_TIME_ZONE: return "TIMESTAMP(" + ((TimestampType) t).getPrecision() + ")";
            case DECIMAL:
                DecimalType d = (DecimalType) t;
                return "DECIMAL(" + d.getPrecision() + ", " + d.getScale() + ")";
            default:
                throw new TallyException("column '" + column + "' is of type " + t
                        + ", which does not cross into the Tally operator (STRING, BIGINT, INT, DOUBLE, FLOAT, SMALLINT, TINYINT, BOOLEAN, "
                        + "DECIMAL(p, s), DATE, TIMESTAMP(p))");
        }
    }

    private DataStream<Row> applyTo(DataStream<Row> input, String[] names, String[] types) {
        List<String> columns = new ArrayList<>();
        for (int i = 0; i < names.length; i++) {
            columns.add(names[i]);
            columns.add(types[i]);
            columns.add("NULL");
        }
        List<String> opts = new ArrayList<>();
        for (Map.Entry<String, String> e : options.entrySet()) {
            opts.add(e.getKey());
            opts.add(e.getValue());
        }
        String[] cols = columns.toArray(new String[0]);
        String[] optArray = opts.toArray(new String[0]);
        Described d = new Described(Native.describe(sql, table, cols, changelog, optArray));
        boolean[] sent = new boolean[names.length];
        for (String c : d.read.split(",")) {
            if (!c.isEmpty()) sent[Integer.parseInt(c)] = true;
        }
        Spec spec = new Spec(sql, table, cols, changelog, optArray, d.batchRows, d.latencyMs, sent,
                input.getExecutionEnvironment().getParallelism());

        SingleOutputStreamOperator<byte[]> parts = input.transform(
                "TallyLocal", PrimitiveArrayTypeInfo.BYTE_PRIMITIVE_ARRAY_TYPE_INFO, new LocalOperator(spec))
                .setParallelism(input.getParallelism());
        if (uid != null) {
            parts.uid(uid + "-local");
        }
        int keyed = d.twoPhase.length;
        for (int k = 1; k < keyed; k++) {
            parts = parts.keyBy(new KeyGroupSelector(d.keyGroups), Types.INT)
                    .transform("TallyAggregate" + k, PrimitiveArrayTypeInfo.BYTE_PRIMITIVE_ARRAY_TYPE_INFO, new MiddleOperator(spec, k))
                    .setMaxParallelism(d.keyGroups);
            if (uid != null) {
                parts.uid(uid + "-aggregate" + k);
            }
        }
        SingleOutputStreamOperator<Row> global = parts
                .keyBy(new KeyGroupSelector(d.keyGroups), Types.INT)
                .transform("TallyGlobal", d.output, new GlobalOperator(spec, keyed))
                .setMaxParallelism(d.keyGroups);
        if (uid != null) {
            global.uid(uid + "-global");
        }
        return global;
    }

    /**
     * Keys a part by its Tally key group so that Flink's key group of the key is the same: Flink
     * takes {@code murmur(key.hashCode()) % maxParallelism}, so each key group gets the smallest
     * integer that Flink assigns to it.
     */
    static final class KeyGroupSelector implements KeySelector<byte[], Integer> {
        private static final long serialVersionUID = 1L;

        private final Integer[] keys;

        KeyGroupSelector(int keyGroups) {
            keys = new Integer[keyGroups];
            int found = 0;
            for (int i = 0; found < keyGroups; i++) {
                int g = KeyGroupRangeAssignment.assignToKeyGroup(i, keyGroups);
                if (keys[g] == null) {
                    keys[g] = i;
                    found++;
                }
            }
        }

        @Override
        public Integer getKey(byte[] part) {
            int g = (part[0] & 0xff) | (part[1] & 0xff) << 8 | (part[2] & 0xff) << 16 | (part[3] & 0xff) << 24;
            return keys[g];
        }
    }
}
