package org.tally.flink;

import org.apache.flink.streaming.api.operators.AbstractStreamOperator;
import org.apache.flink.streaming.api.operators.BoundedOneInput;
import org.apache.flink.streaming.api.operators.OneInputStreamOperator;
import org.apache.flink.streaming.runtime.streamrecord.StreamRecord;
import org.apache.flink.types.Row;

/**
 * The phase before Flink's keyed exchange, chained to the upstream task: it gathers rows into
 * column batches, hands each to Tally's local phase, and emits the parts that come back (one
 * key group's accumulator rows, or with one phase its input rows) as single records. It flushes
 * on Tally's mini-batch size, on the mini-batch latency, before every checkpoint barrier and at
 * the end of input, so it holds nothing at a checkpoint.
 */
final class LocalOperator extends AbstractStreamOperator<byte[]>
        implements OneInputStreamOperator<Row, byte[]>, BoundedOneInput {
    private static final long serialVersionUID = 1L;

    private final Spec spec;
    private transient long handle;
    private transient ColumnBatch.Writer writer;
    private transient StreamRecord<byte[]> reuse;

    LocalOperator(Spec spec) {
        this.spec = spec;
    }

    @Override
    public void open() throws Exception {
        super.open();
        handle = spec.open(0);
        writer = new ColumnBatch.Writer(spec.names(), spec.types(), spec.sent, spec.changelog, spec.batchRows);
        reuse = new StreamRecord<>(null);
        spec.everyLatency(getProcessingTimeService(), () -> {
            if (handle != 0) { // not closed
                flushAll();
            }
        });
    }


    @Override
    public void processElement(StreamRecord<Row> element) {
        writer.add(element.getValue());
        if (writer.size() >= spec.batchRows) {
            pushBatch();
        }
    }

    private void pushBatch() {
        if (writer.size() > 0) {
            emit(Native.push(handle, writer.finish()));
        }
    }

    private void flushAll() {
        pushBatch();
        emit(Native.flush(handle));
    }

    private void emit(byte[][] parts) {
        for (byte[] p : parts) {
            output.collect(reuse.replace(p));
        }
    }

    @Override
    public void prepareSnapshotPreBarrier(long checkpointId) throws Exception {
        super.prepareSnapshotPreBarrier(checkpointId);
        flushAll();
    }

    @Override
    public void endInput() {
        flushAll();
    }

    @Override
    public void close() throws Exception {
        if (handle != 0) {
            Native.close(handle);
            handle = 0;
        }
        super.close();
    }
}
