package org.tally.flink;

import java.io.DataInputStream;
import java.io.DataOutputStream;
import java.io.EOFException;
import java.io.InputStream;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.ArrayList;
import java.util.List;

import org.apache.flink.runtime.state.KeyGroupStatePartitionStreamProvider;
import org.apache.flink.runtime.state.KeyGroupsList;
import org.apache.flink.runtime.state.KeyedStateCheckpointOutputStream;
import org.apache.flink.runtime.state.StateInitializationContext;
import org.apache.flink.runtime.state.StateSnapshotContext;
import org.apache.flink.streaming.api.operators.AbstractStreamOperator;
import org.apache.flink.streaming.api.operators.BoundedOneInput;
import org.apache.flink.streaming.api.operators.OneInputStreamOperator;
import org.apache.flink.streaming.runtime.streamrecord.StreamRecord;

/**
 * A phase after one of Flink's keyed exchanges: Tally's keyed aggregate over this subtask's key
 * groups, the per-row stages after it and, unless it is the last phase, the next aggregate's
 * local side. It takes the parts the phase before sends, fires Tally's mini-batches (on size, on
 * the mini-batch latency, before every checkpoint barrier and at the end of input) and hands on
 * what comes out ({@link #emit}). Its state is Tally's snapshot, one blob per key group in
 * Flink's raw keyed state, so Flink restores and rescales it by key group.
 */
abstract class KeyedPhaseOperator<OUT> extends AbstractStreamOperator<OUT>
        implements OneInputStreamOperator<byte[], OUT>, BoundedOneInput {
    private static final long serialVersionUID = 1L;

    private final Spec spec;
    private final int phase;
    private transient long handle;

    KeyedPhaseOperator(Spec spec, int phase) {
        this.spec = spec;
        this.phase = phase;
    }

    /** Hands on what the phase returned: parts for the next exchange, or the result's rows. */
    abstract void emit(byte[][] out);

    @Override
    protected boolean isUsingCustomRawKeyedState() {
        return true;
    }

    @Override
    public void initializeState(StateInitializationContext context) throws Exception {
        super.initializeState(context);
        spec.checkKeyedParallelism(getRuntimeContext().getTaskInfo().getNumberOfParallelSubtasks());
        handle = spec.open(phase);
        if (!context.isRestored()) {
            return;
        }
        List<byte[]> parts = new ArrayList<>();
        for (KeyGroupStatePartitionStreamProvider p : context.getRawKeyedStateInputs()) {
            try (InputStream in = p.getStream()) {
                DataInputStream data = new DataInputStream(in);
                int len;
                try {
                    len = data.readInt();
                } catch (EOFException e) {
                    continue;
                }
                if (len == 0) {
                    continue;
                }
                byte[] part = new byte[len];
                data.readFully(part);
                int keyGroup = ByteBuffer.wrap(part).order(ByteOrder.LITTLE_ENDIAN).getInt();
                if (keyGroup != p.getKeyGroupId()) {
                    throw new TallyException("the state of key group " + p.getKeyGroupId() + " holds key group " + keyGroup);
                }
                parts.add(part);
            }
        }
        Native.restore(handle, parts.toArray(new byte[0][]));
    }

    @Override
    public void open() throws Exception {
        super.open();
        spec.everyLatency(getProcessingTimeService(), () -> {
            if (handle != 0) { // not closed
                emit(Native.flush(handle));
            }
        });
    }


    @Override
    public void processElement(StreamRecord<byte[]> element) {
        emit(Native.push(handle, element.getValue()));
    }

    @Override
    public void prepareSnapshotPreBarrier(long checkpointId) throws Exception {
        super.prepareSnapshotPreBarrier(checkpointId);
        emit(Native.flush(handle));
    }

    @Override
    public void snapshotState(StateSnapshotContext context) throws Exception {
        super.snapshotState(context);
        byte[][] parts = Native.snapshot(handle);
        KeyedStateCheckpointOutputStream out = context.getRawKeyedOperatorStateOutput();
        KeyGroupsList groups = out.getKeyGroupList();
        byte[][] byGroup = new byte[groups.getNumberOfKeyGroups()][];
        int first = groups.getKeyGroupId(0);
        for (byte[] p : parts) {
            int keyGroup = ByteBuffer.wrap(p).order(ByteOrder.LITTLE_ENDIAN).getInt();
            if (!groups.contains(keyGroup)) {
                throw new TallyException("key group " + keyGroup + " is not this subtask's: its rows were routed wrong");
            }
            byGroup[keyGroup - first] = p;
        }
        DataOutputStream data = new DataOutputStream(out);
        for (int i = 0; i < groups.getNumberOfKeyGroups(); i++) {
            out.startNewKeyGroup(groups.getKeyGroupId(i));
            byte[] p = byGroup[i];
            data.writeInt(p == null ? 0 : p.length);
            if (p != null) {
                data.write(p);
            }
            data.flush();
        }
    }

    @Override
    public void endInput() {
        emit(Native.flush(handle));
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
