package org.tally.flink;

import org.apache.flink.streaming.runtime.streamrecord.StreamRecord;

/**
 * A phase between two exchanges (an aggregate whose changelog feeds another): it emits the next
 * aggregate's parts, one record per key group.
 */
final class MiddleOperator extends KeyedPhaseOperator<byte[]> {
    private static final long serialVersionUID = 1L;

    private transient StreamRecord<byte[]> reuse;

    MiddleOperator(Spec spec, int phase) {
        super(spec, phase);
    }

    @Override
    void emit(byte[][] parts) {
        if (reuse == null) {
            reuse = new StreamRecord<>(null);
        }
        for (byte[] p : parts) {
            output.collect(reuse.replace(p));
        }
    }
}
