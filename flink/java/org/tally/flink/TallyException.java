package org.tally.flink;

/** An error from the Tally operator: bad SQL or options, a type that does not cross, bad data. */
public class TallyException extends RuntimeException {
    private static final long serialVersionUID = 1L;

    /** An error with its one-line message. */
    public TallyException(String message) {
        super(message);
    }
}
