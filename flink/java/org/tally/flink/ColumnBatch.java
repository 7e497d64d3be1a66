package org.tally.flink;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.time.LocalDateTime;
import java.time.ZoneOffset;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.function.Consumer;

import org.apache.flink.types.Row;
import org.apache.flink.types.RowKind;

/**
 * Rows in the column batch format the Rust side reads and writes ({@code flink/src/wire.rs} has
 * the layout): a {@link Writer} gathers a task's rows column by column and turns them into one
 * byte array per batch; {@link #read} turns a batch of changes back into rows with their kinds.
 */
final class ColumnBatch {
    private static final byte[] MAGIC = {'T', 'L', 'Y', '1'};

    private ColumnBatch() {}

    /** The wire tag of a Flink SQL type name (as {@code flink/src/wire.rs} numbers them). */
    static byte tag(String type) {
        switch (type) {
            case "BOOLEAN": return 1;
            case "TINYINT": return 2;
            case "SMALLINT": return 3;
            case "INT": return 4;
            case "BIGINT": return 5;
            case "FLOAT": return 6;
            case "DOUBLE": return 7;
            case "STRING": return 8;
            case "TIMESTAMP(3)": return 9;
            default: throw new TallyException("type '" + type + "' cannot cross into the Tally operator");
        }
    }

    /** Gathers rows of the given column types into batches; only the columns sent cross. */
    static final class Writer {
        private final byte[] tags;
        private final String[] names;
        private final boolean[] sent;
        private final boolean changelog;
        private final Object[][] values;
        private byte[] kinds;
        private int rows;

        Writer(String[] names, String[] types, boolean[] sent, boolean changelog, int capacity) {
            this.names = names;
            this.sent = sent;
            this.tags = new byte[types.length];
            for (int i = 0; i < types.length; i++) {
                tags[i] = tag(types[i]);
            }
            this.changelog = changelog;
            this.values = new Object[types.length][capacity];
            this.kinds = new byte[capacity];
        }

        int size() {
            return rows;
        }

        /** Adds a row (its fields by position); a non-insert row needs a changelog input. */
        void add(Row row) {
            if (row.getArity() != tags.length) {
                throw new TallyException(
                        "a row with " + row.getArity() + " fields arrived where the input declares " + tags.length);
            }
            RowKind kind = row.getKind();
            if (!changelog && kind != RowKind.INSERT) {
                throw new TallyException(
                        "a " + kind.shortString() + " row arrived but the input was declared insert-only: call changelog() on the TallyAggregate");
            }
            if (rows == kinds.length) {
                int grown = Math.max(16, rows * 2);
                kinds = Arrays.copyOf(kinds, grown);
                for (int c = 0; c < values.length; c++) {
                    values[c] = Arrays.copyOf(values[c], grown);
                }
            }
            kinds[rows] = kind.toByteValue();
            for (int c = 0; c < tags.length; c++) {
                if (sent[c]) {
                    values[c][rows] = row.getField(c);
                }
            }
            rows++;
        }

        /** The gathered rows as one batch; the writer starts empty again. */
        byte[] finish() {
            int size = 13 + (changelog ? rows : 0);
            for (int c = 0; c < tags.length; c++) {
                size += 2;
                if (sent[c]) {
                    size += rows + valueBytes(c);
                }
            }
            ByteBuffer out = ByteBuffer.allocate(size).order(ByteOrder.LITTLE_ENDIAN);
            out.put(MAGIC).putInt(rows).putInt(tags.length);
            if (changelog) {
                out.put((byte) 1).put(kinds, 0, rows);
            } else {
                out.put((byte) 0);
            }
            for (int c = 0; c < tags.length; c++) {
                Object[] col = values[c];
                out.put(tags[c]);
                if (!sent[c]) {
                    out.put((byte) 2);
                    continue;
                }
                out.put((byte) 1);
                for (int r = 0; r < rows; r++) {
                    out.put(col[r] == null ? (byte) 0 : (byte) 1);
                }
                write(c, out);
            }
            for (Object[] col : values) {
                Arrays.fill(col, 0, rows, null);
            }
            rows = 0;
            return out.array();
        }

        private int valueBytes(int c) {
            switch (tags[c]) {
                case 1: case 2: return rows;
                case 3: return 2 * rows;
                case 4: case 6: return 4 * rows;
                case 5: case 7: case 9: return 8 * rows;
                default:
                    int len = 4 * (rows + 1);
                    for (int r = 0; r < rows; r++) {
                        Object v = values[c][r];
                        if (v != null) {
                            len += utf8(c, r, v).length;
                        }
                    }
                    return len;
            }
        }

        private byte[] utf8(int c, int r, Object v) {
            if (!(v instanceof String)) {
                throw new TallyException("column '" + names[c] + "' holds a " + v.getClass().getSimpleName() + " where STRING is declared");
            }
            byte[] b = ((String) v).getBytes(StandardCharsets.UTF_8);
            values[c][r] = b;
            return b;
        }

        private Number number(int c, Object v) {
            if (v == null) {
                return 0;
            }
            if (!(v instanceof Number)) {
                throw new TallyException("column '" + names[c] + "' holds a " + v.getClass().getSimpleName() + " where a number is declared");
            }
            return (Number) v;
        }

        private long millis(int c, Object v) {
            if (v == null) {
                return 0;
            }
            if (!(v instanceof LocalDateTime)) {
                throw new TallyException("column '" + names[c] + "' holds a " + v.getClass().getSimpleName() + " where TIMESTAMP(3) (a LocalDateTime) is declared");
            }
            LocalDateTime t = (LocalDateTime) v;
            return t.toEpochSecond(ZoneOffset.UTC) * 1000 + t.getNano() / 1_000_000;
        }

        private void write(int c, ByteBuffer out) {
            Object[] col = values[c];
            switch (tags[c]) {
                case 1:
                    for (int r = 0; r < rows; r++) {
                        out.put(Boolean.TRUE.equals(col[r]) ? (byte) 1 : (byte) 0);
                    }
                    break;
                case 2:
                    for (int r = 0; r < rows; r++) out.put(number(c, col[r]).byteValue());
                    break;
                case 3:
                    for (int r = 0; r < rows; r++) out.putShort(number(c, col[r]).shortValue());
                    break;
                case 4:
                    for (int r = 0; r < rows; r++) out.putInt(number(c, col[r]).intValue());
                    break;
                case 5:
                    for (int r = 0; r < rows; r++) out.putLong(number(c, col[r]).longValue());
                    break;
                case 6:
                    for (int r = 0; r < rows; r++) out.putFloat(number(c, col[r]).floatValue());
                    break;
                case 7:
                    for (int r = 0; r < rows; r++) out.putDouble(number(c, col[r]).doubleValue());
                    break;
                case 9:
                    for (int r = 0; r < rows; r++) out.putLong(millis(c, col[r]));
                    break;
                default:
                    int offset = 0;
                    out.putInt(0);
                    for (int r = 0; r < rows; r++) {
                        if (col[r] != null) {
                            offset += ((byte[]) col[r]).length;
                        }
                        out.putInt(offset);
                    }
                    for (int r = 0; r < rows; r++) {
                        if (col[r] != null) {
                            out.put((byte[]) col[r]);
                        }
                    }
            }
        }
    }

    /** Reads one batch of changes and hands each row, with its kind, to {@code sink}. */
    static void read(byte[] bytes, Consumer<Row> sink) {
        ByteBuffer in = ByteBuffer.wrap(bytes).order(ByteOrder.LITTLE_ENDIAN);
        byte[] magic = new byte[4];
        in.get(magic);
        if (!Arrays.equals(magic, MAGIC)) {
            throw new TallyException("a batch from Tally does not start with TLY1");
        }
        int rows = in.getInt();
        int columns = in.getInt();
        RowKind[] kinds = new RowKind[rows];
        if (in.get() == 1) {
            for (int r = 0; r < rows; r++) {
                kinds[r] = RowKind.fromByteValue(in.get());
            }
        } else {
            Arrays.fill(kinds, RowKind.INSERT);
        }
        List<Object[]> cols = new ArrayList<>(columns);
        for (int c = 0; c < columns; c++) {
            byte tag = in.get();
            boolean[] valid = new boolean[rows];
            if (in.get() == 1) {
                for (int r = 0; r < rows; r++) {
                    valid[r] = in.get() != 0;
                }
            } else {
                Arrays.fill(valid, true);
            }
            Object[] col = new Object[rows];
            switch (tag) {
                case 1:
                    for (int r = 0; r < rows; r++) col[r] = in.get() != 0;
                    break;
                case 2:
                    for (int r = 0; r < rows; r++) col[r] = in.get();
                    break;
                case 3:
                    for (int r = 0; r < rows; r++) col[r] = in.getShort();
                    break;
                case 4:
                    for (int r = 0; r < rows; r++) col[r] = in.getInt();
                    break;
                case 5:
                    for (int r = 0; r < rows; r++) col[r] = in.getLong();
                    break;
                case 6:
                    for (int r = 0; r < rows; r++) col[r] = in.getFloat();
                    break;
                case 7:
                    for (int r = 0; r < rows; r++) col[r] = in.getDouble();
                    break;
                case 9:
                    for (int r = 0; r < rows; r++) {
                        long ms = in.getLong();
                        col[r] = LocalDateTime.ofEpochSecond(Math.floorDiv(ms, 1000), (int) Math.floorMod(ms, 1000) * 1_000_000, ZoneOffset.UTC);
                    }
                    break;
                case 8:
                    int[] offsets = new int[rows + 1];
                    for (int r = 0; r <= rows; r++) offsets[r] = in.getInt();
                    int base = in.position();
                    for (int r = 0; r < rows; r++) {
                        col[r] = new String(bytes, base + offsets[r], offsets[r + 1] - offsets[r], StandardCharsets.UTF_8);
                    }
                    in.position(base + offsets[rows]);
                    break;
                default:
                    throw new TallyException("a batch from Tally has type tag " + tag);
            }
            for (int r = 0; r < rows; r++) {
                if (!valid[r]) col[r] = null;
            }
            cols.add(col);
        }
        for (int r = 0; r < rows; r++) {
            Row row = new Row(kinds[r], columns);
            for (int c = 0; c < columns; c++) {
                row.setField(c, cols.get(c)[r]);
            }
            sink.accept(row);
        }
    }
}
