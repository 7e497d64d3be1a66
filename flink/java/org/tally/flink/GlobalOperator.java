package org.tally.flink;

import org.apache.flink.streaming.runtime.streamrecord.StreamRecord;
import org.apache.flink.types.Row;

/** The last phase of the chain: it emits the result's changelog as rows with their {@code RowKind}. */
final class GlobalOperator extends KeyedPhaseOperator<Row> {
    private static final long serialVersionUID = 1L;

    private transient StreamRecord<Row> reuse;

    GlobalOperator(Spec spec, int phase) {
        super(spec, phase);
    }

    @Override
    void emit(byte[][] batches) {
        if (reuse == null) {
            reuse = new StreamRecord<>(null);
        }
        for (byte[] b : batches) {
            ColumnBatch.read(b, row -> output.collect(reuse.replace(row)));
        }
    }
}
