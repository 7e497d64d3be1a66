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
import org.apache.flink.types.Row;

/**
 * The phase after Flink's keyed exchange: Tally's keyed aggregate over this subtask's key
 * groups. It takes the parts the local phases send, fires Tally's mini-batches (on size, on the
 * latency, before every checkpoint barrier and at the end of input) and emits the changelog as
 * rows with their {@code RowKind}. Its state is Tally's snapshot, one blob per key group in
 * Flink's raw keyed state, so Flink restores and rescales it by key group.
 */
final class GlobalOperator extends AbstractStreamOperator<Row>
        implements OneInputStreamOperator<byte[], Row>, BoundedOneInput {
    private static final long serialVersionUID = 1L;

    private final Spec spec;
    private transient long handle;
    private transient StreamRecord<Row> reuse;

    GlobalOperator(Spec spec) {
        this.spec = spec;
    }

    @Override
    protected boolean isUsingCustomRawKeyedState() {
        return true;
    }

    @Override
    public void initializeState(StateInitializationContext context) throws Exception {
        super.initializeState(context);
        handle = spec.open(true);
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
        reuse = new StreamRecord<>(null);
        schedulePoll();
    }

    private void schedulePoll() {
        long now = getProcessingTimeService().getCurrentProcessingTime();
        getProcessingTimeService().registerTimer(now + spec.latencyMs, t -> {
            emit(Native.poll(handle));
            schedulePoll();
        });
    }

    @Override
    public void processElement(StreamRecord<byte[]> element) {
        emit(Native.push(handle, element.getValue()));
    }

    private void emit(byte[][] batches) {
        for (byte[] b : batches) {
            ColumnBatch.read(b, row -> output.collect(reuse.replace(row)));
        }
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
