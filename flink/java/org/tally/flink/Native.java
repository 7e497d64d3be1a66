package org.tally.flink;

/**
 * The JNI calls into Tally's Rust library ({@code libtally_flink}, the crate in {@code flink/}).
 *
 * <p>The library is loaded from the path in the system property {@code tally.flink.library}
 * when it is set, otherwise by name from {@code java.library.path}. Each call moves one batch or
 * one checkpoint's parts, never a row; every failure is a {@link TallyException}.
 */
final class Native {
    static {
        String path = System.getProperty("tally.flink.library");
        if (path != null && !path.isEmpty()) {
            System.load(path);
        } else {
            System.loadLibrary("tally_flink");
        }
    }

    private Native() {}

    /** Plans the query and opens its local ({@code global = false}) or global phase. */
    static native long open(
            String sql, String table, String[] columns, boolean changelog, String[] options,
            boolean global);

    /** Plans the query: key groups, phase strategy, then name, type, nullability per result column. */
    static native String[] describe(
            String sql, String table, String[] columns, boolean changelog, String[] options);

    /** Local: a column batch in, due parts out. Global: a part in, column batches of changes out. */
    static native byte[][] push(long handle, byte[] bytes);

    /** Local: flushes its parts. Global: fires its pending mini-batch. */
    static native byte[][] flush(long handle);

    /** Global: fires the pending mini-batch if its latency has passed. */
    static native byte[][] poll(long handle);

    /** Global: its state, one part per key group. */
    static native byte[][] snapshot(long handle);

    /** Global: loads parts of a snapshot into a fresh phase. */
    static native void restore(long handle, byte[][] parts);

    /** Global: bytes of keyed state. */
    static native long stateBytes(long handle);

    /** Frees the phase. */
    static native void close(long handle);
}
