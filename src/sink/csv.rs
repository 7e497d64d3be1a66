//! CSV output formatted off the writing thread ([`CsvWriter`]): each batch is formatted on
//! rayon's pool as it comes, and its bytes are written in the order the batches came.
//!
//! Without it a changelog written as CSV is formatted on the caller's thread, the pipelined
//! runtime's one serial stage: formatting q16's changelog took most of that thread's time
//! (BENCHMARKS.md, "The changelog formatted on the pool").

use std::collections::VecDeque;
use std::io::Write;
use std::sync::mpsc::{Receiver, TryRecvError, sync_channel};
use std::time::{Duration, Instant};

use arrow::array::RecordBatch;

use crate::error::{Error, Result};

/// Batches of fewer rows than this are formatted on the writing thread: handing one to the
/// pool and taking its bytes back costs more than formatting it.
const POOL_MIN_ROWS: usize = 256;

/// Batches of more rows than this are formatted in pieces of this many, side by side on the
/// pool (a final table written at the end is one batch).
pub const PIECE_ROWS: usize = 16_384;

/// The pieces (offset, rows) a batch of `rows` rows is formatted in: one for an empty batch,
/// which still carries the header line where it is the first.
pub fn pieces(rows: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..rows.max(1))
        .step_by(PIECE_ROWS)
        .map(move |off| (off, PIECE_ROWS.min(rows - off)))
}

/// A batch's CSV bytes: formatted already, or still being formatted on the pool.
enum Formatted {
    Done(Result<Vec<u8>>),
    Running(Receiver<Result<Vec<u8>>>),
}

/// Writes record batches as CSV (arrow-csv's format, a header line before the first batch
/// where asked) to `out`, formatting them on rayon's pool: [`CsvWriter::write`] hands a batch
/// to the pool and returns; the bytes of each batch are written in the order the batches came,
/// once formatted. At most a window of batches (twice the pool's threads) is formatted at once:
/// past it, a write waits for the oldest. The bytes are byte for byte those of one arrow-csv
/// writer over the same batches.
///
/// [`CsvWriter::flush`] writes every batch taken and flushes `out`; dropping the writer writes
/// those it can (an error formatting one ends the output there), so the batches taken before an
/// error elsewhere are written, as an unbuffered writer would have.
pub struct CsvWriter<'a> {
    out: Box<dyn Write + 'a>,
    /// Whether the next batch taken carries the header line.
    header: bool,
    /// The batches taken and not yet written, oldest first.
    pending: VecDeque<Formatted>,
    /// The most batches formatting at once.
    window: usize,
    /// A batch failed to format or be written: the output ends before it.
    failed: bool,
    /// The time spent waiting for batches formatting on the pool.
    waited: Duration,
}

impl std::fmt::Debug for CsvWriter<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CsvWriter")
            .field("header", &self.header)
            .field("pending", &self.pending.len())
            .finish_non_exhaustive()
    }
}

impl<'a> CsvWriter<'a> {
    /// A writer to `out`, with a header line before the first batch where `header`.
    pub fn new(out: Box<dyn Write + 'a>, header: bool) -> Self {
        Self {
            out,
            header,
            pending: VecDeque::new(),
            window: 2 * rayon::current_num_threads().max(1),
            failed: false,
            waited: Duration::ZERO,
        }
    }

    /// Takes one batch: formats it on the pool and writes its bytes after those of the
    /// batches before it.
    ///
    /// # Errors
    /// An error formatting or writing an earlier batch.
    pub fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        for (off, rows) in pieces(batch.num_rows()) {
            self.write_with(batch.slice(off, rows), rows, Ok)?;
        }
        Ok(())
    }

    /// Takes `item` (of `rows` rows), which `to_batch` turns into the batch to write: on the
    /// pool, with its formatting, where the batch is large enough to go there. One item is
    /// formatted as one piece: a caller cuts large ones ([`pieces`]).
    ///
    /// # Errors
    /// As [`CsvWriter::write`].
    pub fn write_with<T: Send + 'static>(
        &mut self,
        item: T,
        rows: usize,
        to_batch: fn(T) -> Result<RecordBatch>,
    ) -> Result<()> {
        self.check()?;
        let header = std::mem::take(&mut self.header);
        let format = move || to_batch(item).and_then(|b| format(&b, header));
        // A writer on a thread of a rayon pool formats on it: waiting there for a job of the
        // same pool could wait for ever (a pool of one thread).
        let here = rows < POOL_MIN_ROWS || rayon::current_thread_index().is_some();
        if here && self.pending.is_empty() {
            let written = format().and_then(|bytes| Ok(self.out.write_all(&bytes)?));
            self.failed = written.is_err();
            return written;
        }
        if here {
            self.pending.push_back(Formatted::Done(format()));
        } else {
            let (tx, rx) = sync_channel(1);
            rayon::spawn(move || {
                let bytes = std::panic::catch_unwind(std::panic::AssertUnwindSafe(format))
                    .unwrap_or_else(|_| Err(Error::internal("formatting CSV panicked")));
                // The writer may be gone (dropped after an error): nothing waits for the bytes.
                let _ = tx.send(bytes);
            });
            self.pending.push_back(Formatted::Running(rx));
        }
        self.write_formatted(self.window)
    }

    /// An error where a batch failed before: the output ended there.
    fn check(&self) -> Result<()> {
        if self.failed {
            return Err(Error::internal(
                "the CSV output ended at a batch that failed before",
            ));
        }
        Ok(())
    }

    /// Writes the oldest batches while they are formatted, and waits for them while more
    /// than `keep` are pending. At the first that fails, the output ends: the batches after it
    /// are dropped.
    fn write_formatted(&mut self, keep: usize) -> Result<()> {
        let written = self.write_formatted_until_error(keep);
        if written.is_err() {
            self.failed = true;
            self.pending.clear();
        }
        written
    }

    fn write_formatted_until_error(&mut self, keep: usize) -> Result<()> {
        loop {
            let wait = self.pending.len() > keep;
            let Some(front) = self.pending.front_mut() else {
                return Ok(());
            };
            let bytes = match front {
                Formatted::Done(_) => match self.pending.pop_front() {
                    Some(Formatted::Done(bytes)) => bytes,
                    _ => unreachable!("the front was formatted"),
                },
                Formatted::Running(rx) => {
                    let got = if wait {
                        let start = Instant::now();
                        let got = rx.recv().map_err(|_| TryRecvError::Disconnected);
                        self.waited += start.elapsed();
                        got
                    } else {
                        rx.try_recv()
                    };
                    match got {
                        Ok(bytes) => {
                            self.pending.pop_front();
                            bytes
                        }
                        Err(TryRecvError::Empty) => return Ok(()),
                        Err(TryRecvError::Disconnected) => {
                            self.pending.pop_front();
                            Err(Error::internal("a CSV batch was lost on the pool"))
                        }
                    }
                }
            };
            self.out.write_all(&bytes?)?;
        }
    }

    /// The time the writer has waited for batches formatting on the pool (the output's
    /// backpressure: the pool formats more slowly than batches come).
    pub fn waited(&self) -> Duration {
        self.waited
    }

    /// Writes every batch taken, then flushes the output.
    ///
    /// # Errors
    /// An error formatting or writing a batch.
    pub fn flush(&mut self) -> Result<()> {
        self.check()?;
        self.write_formatted(0)?;
        Ok(self.out.flush()?)
    }

    /// Writes every batch taken and flushes.
    ///
    /// # Errors
    /// As [`CsvWriter::flush`].
    pub fn finish(mut self) -> Result<()> {
        self.flush()
    }
}

impl Drop for CsvWriter<'_> {
    fn drop(&mut self) {
        // The batches taken before an error elsewhere are written, as far as they format.
        if !self.failed {
            let _ = self.flush();
        }
    }
}

/// One batch as CSV, with the header line where `header`.
fn format(batch: &RecordBatch, header: bool) -> Result<Vec<u8>> {
    // Some 16 bytes a value: one allocation for most batches.
    let guess = batch.num_rows() * batch.num_columns().max(1) * 16;
    let mut w = arrow::csv::WriterBuilder::new()
        .with_header(header)
        .build(Vec::with_capacity(guess));
    w.write(batch)?;
    Ok(w.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    use arrow::array::{Int64Array, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};

    /// An output that can be read after the writer that holds it is gone.
    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn batch(start: i64, rows: usize) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Utf8, true),
            Field::new("v", DataType::Int64, true),
        ]));
        let k: StringArray = (0..rows)
            .map(|i| (i % 7 != 3).then(|| format!("key, \"{}\"", start + i as i64)))
            .collect();
        let v: Int64Array = (0..rows)
            .map(|i| (i % 5 != 0).then_some(start * 1_000 + i as i64))
            .collect();
        RecordBatch::try_new(schema, vec![Arc::new(k), Arc::new(v)]).unwrap()
    }

    /// What one arrow-csv writer writes for `batches`.
    fn one_writer(batches: &[RecordBatch], header: bool) -> Vec<u8> {
        let mut w = arrow::csv::WriterBuilder::new()
            .with_header(header)
            .build(vec![]);
        for b in batches {
            w.write(b).unwrap();
        }
        w.into_inner()
    }

    /// Batches large and small, formatted on the pool or not, out of a window of one or many:
    /// the bytes are one arrow-csv writer's, in order, the header once.
    #[test]
    fn bytes_are_one_writers_in_order() {
        let sizes = [0, 1, 300, 5, 2_000, 255, 256, 3, 40_000, 1, 1, 4_096, 0, 9];
        let batches: Vec<RecordBatch> = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| batch(i as i64, n))
            .collect();
        for header in [true, false] {
            for window in [1, 2, 64] {
                let out = Shared::default();
                let mut w = CsvWriter::new(Box::new(out.clone()), header);
                w.window = window;
                for b in &batches {
                    w.write(b).unwrap();
                }
                w.finish().unwrap();
                let got = out.0.lock().unwrap().clone();
                assert_eq!(got, one_writer(&batches, header), "window {window}");
            }
        }
    }

    /// Pieces cover a batch's rows once, in order, none longer than [`PIECE_ROWS`].
    #[test]
    fn pieces_cover_a_batch() {
        assert_eq!(pieces(0).collect::<Vec<_>>(), vec![(0, 0)]);
        assert_eq!(pieces(5).collect::<Vec<_>>(), vec![(0, 5)]);
        for rows in [PIECE_ROWS, PIECE_ROWS + 1, 3 * PIECE_ROWS - 7] {
            let p: Vec<_> = pieces(rows).collect();
            assert!(p.iter().all(|&(_, n)| n > 0 && n <= PIECE_ROWS));
            let mut next = 0;
            for (off, n) in p {
                assert_eq!(off, next);
                next += n;
            }
            assert_eq!(next, rows);
        }
    }

    /// A writer on a thread of a pool of one formats there rather than wait for its own pool.
    #[test]
    fn a_writer_inside_a_pool_of_one_thread_formats_there() {
        let batches = [batch(0, 1_000), batch(1, 3_000)];
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        let out = Shared::default();
        pool.install(|| {
            let mut w = CsvWriter::new(Box::new(out.clone()), true);
            w.window = 1;
            for b in &batches {
                w.write(b).unwrap();
            }
            w.finish().unwrap();
        });
        assert_eq!(*out.0.lock().unwrap(), one_writer(&batches, true));
    }

    /// A writer dropped without `finish` (the run failed elsewhere) still writes what it took.
    #[test]
    fn a_dropped_writer_writes_what_it_took() {
        let batches = [batch(0, 1_000), batch(1, 10), batch(2, 3_000)];
        let out = Shared::default();
        {
            let mut w = CsvWriter::new(Box::new(out.clone()), true);
            for b in &batches {
                w.write(b).unwrap();
            }
        }
        assert_eq!(*out.0.lock().unwrap(), one_writer(&batches, true));
    }

    /// A batch that cannot be formatted is an error, on the pool or not, and the batches before
    /// it are written.
    #[test]
    fn a_batch_that_cannot_be_formatted_is_an_error() {
        for rows in [10, 1_000] {
            let out = Shared::default();
            let mut w = CsvWriter::new(Box::new(out.clone()), false);
            w.write(&batch(0, 400)).unwrap();
            let failed = w
                .write_with((), rows, |()| Err(Error::invalid_input("no such batch")))
                .and_then(|()| w.flush());
            assert!(
                failed.unwrap_err().to_string().contains("no such batch"),
                "rows {rows}"
            );
            // The output ends there: later batches are refused, and none is written.
            assert!(w.write(&batch(1, 400)).is_err());
            drop(w);
            assert_eq!(*out.0.lock().unwrap(), one_writer(&[batch(0, 400)], false));
        }
    }
}
