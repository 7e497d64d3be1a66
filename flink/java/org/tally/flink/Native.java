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

    /**
     * Plans the query and opens phase {@code phase} of its chain (0 before the first exchange),
     * which sends to a keyed operator of {@code receivers} subtasks (0: not known).
     */
    static native long open(
            String sql, String table, String[] columns, boolean changelog, String[] options,
            int phase, int receivers);

    /**
     * Plans the query: key groups, the strategy of each aggregate (comma-separated), the rows of a
     * column batch, the latency in milliseconds, then name, type, nullability per result column.
     */
    static native String[] describe(
            String sql, String table, String[] columns, boolean changelog, String[] options);

    /** Phase 0: a column batch in; a keyed phase: a part in. Out: parts, or the last phase's column batches. */
    static native byte[][] push(long handle, byte[] bytes);

    /** Fires everything the phase holds: its mini-batch, then the next aggregate's local side. */
    static native byte[][] flush(long handle);

    /** A keyed phase's state, one part per key group. */
    static native byte[][] snapshot(long handle);

    /** Loads parts of a snapshot into a fresh keyed phase. */
    static native void restore(long handle, byte[][] parts);

    /** A phase's bytes of keyed state. */
    static native long stateBytes(long handle);

    /** Frees the phase. */
    static native void close(long handle);
}
