package org.tally.flink;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.math.BigDecimal;
import java.math.BigInteger;
import java.math.RoundingMode;
import java.nio.charset.StandardCharsets;
import java.time.LocalDate;
import java.time.LocalDateTime;
import java.time.ZoneOffset;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.function.Consumer;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

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

    /**
     * A column's type as it crosses: its wire tag and parameters, read from the SQL name Tally
     * gives it ({@code BIGINT}, {@code DECIMAL(38, 18)}, {@code TIMESTAMP(9)}, ...).
     */
    static final class Kind {
        private static final Pattern PARAMS = Pattern.compile("(DECIMAL|TIMESTAMP)\\((\\d+)(?:,\\s*(\\d+))?\\)");

        final String name;
        final byte tag;
        /** A decimal's precision, or a timestamp's stored precision (0, 3, 6 or 9). */
        final int precision;
        /** A decimal's scale. */
        final int scale;

        private Kind(String name, int tag, int precision, int scale) {
            this.name = name;
            this.tag = (byte) tag;
            this.precision = precision;
            this.scale = scale;
        }

        static Kind of(String name) {
            switch (name) {
                case "BOOLEAN": return new Kind(name, 1, 0, 0);
                case "TINYINT": return new Kind(name, 2, 0, 0);
                case "SMALLINT": return new Kind(name, 3, 0, 0);
                case "INT": return new Kind(name, 4, 0, 0);
                case "BIGINT": return new Kind(name, 5, 0, 0);
                case "FLOAT": return new Kind(name, 6, 0, 0);
                case "DOUBLE": return new Kind(name, 7, 0, 0);
                case "STRING": return new Kind(name, 8, 0, 0);
                case "DATE": return new Kind(name, 11, 0, 0);
                default:
            }
            Matcher m = PARAMS.matcher(name);
            if (m.matches() && m.group(1).equals("TIMESTAMP") && m.group(3) == null) {
                int p = Integer.parseInt(m.group(2));
                if (p <= 9) {
                    // Stored in the unit the precision needs, as Tally's CREATE TABLE does.
                    return new Kind(name, 9, p == 0 ? 0 : p <= 3 ? 3 : p <= 6 ? 6 : 9, 0);
                }
            }
            if (m.matches() && m.group(1).equals("DECIMAL") && m.group(3) != null) {
                return new Kind(name, 10, Integer.parseInt(m.group(2)), Integer.parseInt(m.group(3)));
            }
            throw new TallyException("type '" + name + "' cannot cross into the Tally operator");
        }

        /** Bytes a row's value takes (STRING: none here, its offsets and bytes are counted apart). */
        int width() {
            switch (tag) {
                case 1: case 2: return 1;
                case 3: return 2;
                case 4: case 6: case 11: return 4;
                case 5: case 7: case 9: return 8;
                case 10: return 16;
                default: return 0;
            }
        }

        /** Bytes of the column's head: the tag, the parameters, the nulls flag. */
        int header() {
            return tag == 9 ? 3 : tag == 10 ? 4 : 2;
        }

        void put(ByteBuffer out) {
            out.put(tag);
            if (tag == 9) {
                out.put((byte) precision);
            } else if (tag == 10) {
                out.put((byte) precision).put((byte) scale);
            }
        }

        /** Units of a timestamp in a second. */
        long perSecond() {
            return perSecond(precision);
        }

        /** Units in a second of a timestamp stored at {@code precision} (0, 3, 6 or 9). */
        static long perSecond(int precision) {
            return precision == 0 ? 1 : precision == 3 ? 1_000 : precision == 6 ? 1_000_000 : 1_000_000_000;
        }
    }

    /** Gathers rows of the given column types into batches; only the columns sent cross. */
    static final class Writer {
        private final Kind[] kinds;
        private final String[] names;
        private final boolean[] sent;
        private final boolean changelog;
        private final Object[][] values;
        /** Per column, whether a gathered row holds NULL there (validity bytes cross only then). */
        private final boolean[] hasNull;
        private byte[] rowKinds;
        private int rows;

        Writer(String[] names, String[] types, boolean[] sent, boolean changelog, int capacity) {
            this.names = names;
            this.sent = sent;
            this.kinds = new Kind[types.length];
            for (int i = 0; i < types.length; i++) {
                kinds[i] = Kind.of(types[i]);
            }
            this.changelog = changelog;
            this.values = new Object[types.length][capacity];
            this.hasNull = new boolean[types.length];
            this.rowKinds = new byte[capacity];
        }

        int size() {
            return rows;
        }

        /** Adds a row (its fields by position); a non-insert row needs a changelog input. */
        void add(Row row) {
            if (row.getArity() != kinds.length) {
                throw new TallyException(
                        "a row with " + row.getArity() + " fields arrived where the input declares " + kinds.length);
            }
            RowKind kind = row.getKind();
            if (!changelog && kind != RowKind.INSERT) {
                throw new TallyException(
                        "a " + kind.shortString() + " row arrived but the input was declared insert-only: call changelog() on the TallyAggregate");
            }
            if (rows == rowKinds.length) {
                int grown = Math.max(16, rows * 2);
                rowKinds = Arrays.copyOf(rowKinds, grown);
                for (int c = 0; c < values.length; c++) {
                    values[c] = Arrays.copyOf(values[c], grown);
                }
            }
            rowKinds[rows] = kind.toByteValue();
            for (int c = 0; c < kinds.length; c++) {
                if (sent[c]) {
                    Object v = row.getField(c);
                    values[c][rows] = v;
                    hasNull[c] |= v == null;
                }
            }
            rows++;
        }

        /** The gathered rows as one batch; the writer starts empty again. */
        byte[] finish() {
            int size = 13 + (changelog ? rows : 0);
            for (int c = 0; c < kinds.length; c++) {
                size += kinds[c].header();
                if (sent[c]) {
                    size += (hasNull[c] ? rows : 0) + valueBytes(c);
                }
            }
            ByteBuffer out = ByteBuffer.allocate(size).order(ByteOrder.LITTLE_ENDIAN);
            out.put(MAGIC).putInt(rows).putInt(kinds.length);
            if (changelog) {
                out.put((byte) 1).put(rowKinds, 0, rows);
            } else {
                out.put((byte) 0);
            }
            for (int c = 0; c < kinds.length; c++) {
                Object[] col = values[c];
                kinds[c].put(out);
                if (!sent[c]) {
                    out.put((byte) 2);
                    continue;
                }
                if (hasNull[c]) {
                    out.put((byte) 1);
                    for (int r = 0; r < rows; r++) {
                        out.put(col[r] == null ? (byte) 0 : (byte) 1);
                    }
                } else {
                    out.put((byte) 0);
                }
                write(c, out);
            }
            for (Object[] col : values) {
                Arrays.fill(col, 0, rows, null);
            }
            Arrays.fill(hasNull, false);
            rows = 0;
            return out.array();
        }

        private int valueBytes(int c) {
            if (kinds[c].tag != 8) {
                return kinds[c].width() * rows;
            }
            int len = 4 * (rows + 1);
            for (int r = 0; r < rows; r++) {
                Object v = values[c][r];
                if (v != null) {
                    len += utf8(c, r, v).length;
                }
            }
            return len;
        }

        private TallyException wrongType(int c, Object v) {
            return new TallyException("column '" + names[c] + "' holds a " + v.getClass().getSimpleName()
                    + " where " + kinds[c].name + " is declared");
        }

        private byte[] utf8(int c, int r, Object v) {
            if (!(v instanceof String)) {
                throw wrongType(c, v);
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
                throw wrongType(c, v);
            }
            return (Number) v;
        }

        /** A timestamp in the column's unit since 1970-01-01 00:00. */
        private long timestamp(int c, Object v) {
            if (v == null) {
                return 0;
            }
            if (!(v instanceof LocalDateTime)) {
                throw wrongType(c, v);
            }
            LocalDateTime t = (LocalDateTime) v;
            long per = kinds[c].perSecond();
            try {
                return Math.addExact(Math.multiplyExact(t.toEpochSecond(ZoneOffset.UTC), per), t.getNano() / (1_000_000_000 / per));
            } catch (ArithmeticException e) {
                throw new TallyException("column '" + names[c] + "' holds " + t + ", beyond the range of " + kinds[c].name);
            }
        }

        private int days(int c, Object v) {
            if (v == null) {
                return 0;
            }
            if (!(v instanceof LocalDate)) {
                throw wrongType(c, v);
            }
            return Math.toIntExact(((LocalDate) v).toEpochDay());
        }

        /** A decimal's unscaled value at the column's scale (rounded half up, as Flink converts). */
        private void putDecimal(int c, Object v, ByteBuffer out) {
            if (v == null) {
                out.putLong(0).putLong(0);
                return;
            }
            if (!(v instanceof BigDecimal)) {
                throw wrongType(c, v);
            }
            BigDecimal d = ((BigDecimal) v).setScale(kinds[c].scale, RoundingMode.HALF_UP);
            if (d.precision() > kinds[c].precision) {
                throw new TallyException("column '" + names[c] + "' holds " + v + ", beyond " + kinds[c].name);
            }
            BigInteger u = d.unscaledValue();
            if (u.bitLength() < 64) {
                long lo = u.longValue();
                out.putLong(lo).putLong(lo < 0 ? -1L : 0L);
                return;
            }
            byte[] be = u.toByteArray(); // big-endian two's complement, at most 16 bytes here
            byte fill = u.signum() < 0 ? (byte) -1 : 0;
            for (int i = 0; i < 16; i++) {
                out.put(i < be.length ? be[be.length - 1 - i] : fill);
            }
        }

        private void write(int c, ByteBuffer out) {
            Object[] col = values[c];
            switch (kinds[c].tag) {
                case 1:
                    for (int r = 0; r < rows; r++) {
                        if (col[r] != null && !(col[r] instanceof Boolean)) throw wrongType(c, col[r]);
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
                    for (int r = 0; r < rows; r++) out.putLong(timestamp(c, col[r]));
                    break;
                case 10:
                    for (int r = 0; r < rows; r++) putDecimal(c, col[r], out);
                    break;
                case 11:
                    for (int r = 0; r < rows; r++) out.putInt(days(c, col[r]));
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
            // A timestamp's precision, a decimal's precision and scale.
            int precision = tag == 9 || tag == 10 ? in.get() : 0;
            int scale = tag == 10 ? in.get() : 0;
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
                case 9: {
                    long per = Kind.perSecond(precision);
                    for (int r = 0; r < rows; r++) {
                        long t = in.getLong();
                        col[r] = LocalDateTime.ofEpochSecond(Math.floorDiv(t, per), (int) (Math.floorMod(t, per) * (1_000_000_000 / per)), ZoneOffset.UTC);
                    }
                    break;
                }
                case 10: {
                    byte[] be = new byte[16];
                    for (int r = 0; r < rows; r++) {
                        for (int i = 15; i >= 0; i--) be[i] = in.get();
                        col[r] = new BigDecimal(new BigInteger(be), scale);
                    }
                    break;
                }
                case 11:
                    for (int r = 0; r < rows; r++) col[r] = LocalDate.ofEpochDay(in.getInt());
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
