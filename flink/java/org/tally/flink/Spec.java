package org.tally.flink;

import java.io.Serializable;

import org.apache.flink.streaming.runtime.tasks.ProcessingTimeService;

/** A planned Tally query as the operators of a job carry it: what each phase opens with. */
final class Spec implements Serializable {
    private static final long serialVersionUID = 1L;

    final String sql;
    final String table;
    /** Name, Flink SQL type, {@code NULL} or {@code NOT NULL}, per input column. */
    final String[] columns;
    final boolean changelog;
    /** Keys and values in turn. */
    final String[] options;
    /** Rows a local phase gathers before it crosses into Rust. */
    final int batchRows;
    /** Milliseconds rows may wait in a phase before it flushes (the mini-batch latency). */
    final long latencyMs;
    /** Per input column, whether the query reads it (the others do not cross). */
    final boolean[] sent;
    /**
     * The parallelism the keyed operators were built with (the environment's): with 1, a
     * one-phase local side sends whole batches in input order, which only one subtask may take.
     */
    final int keyedParallelism;

    Spec(String sql, String table, String[] columns, boolean changelog, String[] options, int batchRows, long latencyMs,
            boolean[] sent, int keyedParallelism) {
        this.sql = sql;
        this.table = table;
        this.columns = columns;
        this.changelog = changelog;
        this.options = options;
        this.batchRows = batchRows;
        this.latencyMs = latencyMs;
        this.sent = sent;
        this.keyedParallelism = keyedParallelism;
    }

    String[] names() {
        String[] n = new String[columns.length / 3];
        for (int i = 0; i < n.length; i++) n[i] = columns[3 * i];
        return n;
    }

    String[] types() {
        String[] t = new String[columns.length / 3];
        for (int i = 0; i < t.length; i++) t[i] = columns[3 * i + 1];
        return t;
    }

    /**
     * Runs {@code flush} every mini-batch latency interval on the task's thread (Flink's
     * processing-time timers), as Flink's mini-batch operators fire.
     */
    void everyLatency(ProcessingTimeService time, Runnable flush) {
        time.registerTimer(time.getCurrentProcessingTime() + latencyMs, t -> {
            flush.run();
            everyLatency(time, flush);
        });
    }

    /**
     * Checks that a keyed operator runs with the parallelism its senders assume (one subtask
     * when they send whole batches).
     */
    void checkKeyedParallelism(int subtasks) {
        if (keyedParallelism == 1 && subtasks != 1) {
            throw new TallyException("the Tally operator was built for one keyed subtask (the environment's parallelism was 1 at apply()) "
                    + "but runs " + subtasks + ": set the parallelism before apply()");
        }
    }

    /** Opens phase {@code phase} of the query's chain (0 before the first exchange). */
    long open(int phase) {
        return Native.open(sql, table, columns, changelog, options, phase, keyedParallelism);
    }
}
