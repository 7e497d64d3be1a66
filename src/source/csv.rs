//! CSV: a header row matched by column name (empty field = NULL), read whole or, for the
//! pipelined runtime, in splits of byte ranges cut at line ends, or in chunks of records dealt
//! to the splits in turn (a changelog, checkpoints), found by one scan of the lines.
//!
//! A split boundary is moved to just after the next newline, so every split holds whole lines.
//! That is only sound when no field spans lines, which a quoted field may do: a file with a
//! double quote anywhere is read as one split. Parse errors name the line in the whole file
//! (arrow's reader counts lines from the start of what it reads, so a split's are shifted by the
//! lines before it, counted only when an error needs them).

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema, SchemaRef};

use super::{FileTable, SourceReader, open};
use crate::error::{Error, Result};

/// The bytes read at a time when scanning the file for quotes, newlines and boundaries.
const SCAN_BLOCK: usize = 1 << 20;

impl FileTable {
    /// The header row: its length in bytes (with its line end) and the schema of the file's
    /// columns (declared ones with their types; the changelog column and undeclared ones as
    /// strings, which `convert` drops).
    pub(super) fn csv_header(&self) -> Result<(u64, SchemaRef)> {
        let mut file = open(&self.path)?;
        let mut header = String::new();
        let len = BufReader::new(&mut file)
            .read_line(&mut header)
            .map_err(|e| Error::io(format!("{}: {e}", self.ctx())))?;
        if header.trim().is_empty() {
            return Err(Error::invalid_input(format!(
                "{}: the CSV file has no header row",
                self.ctx()
            )));
        }
        let names: Vec<String> = header
            .trim_end_matches(['\r', '\n'])
            .split(',')
            .map(|s| s.trim().trim_matches('"').to_string())
            .collect();
        let file_schema = Arc::new(Schema::new(
            names
                .iter()
                .map(|n| {
                    let dt = self
                        .schema
                        .field_with_name(n)
                        .map_or(DataType::Utf8, |f| f.data_type().clone());
                    Field::new(n, dt, true)
                })
                .collect::<Vec<_>>(),
        ));
        self.check_columns(&file_schema)?;
        Ok((len as u64, file_schema))
    }

    pub(super) fn open_csv(&self, batch_size: usize) -> Result<SourceReader> {
        let (_, file_schema) = self.csv_header()?;
        let file = open(&self.path)?;
        let reader = arrow::csv::ReaderBuilder::new(file_schema)
            .with_header(true)
            .with_batch_size(batch_size)
            .build(file)
            .map_err(|e| Error::io(format!("{}: {e}", self.ctx())))?;
        let table = self.clone();
        let ctx = self.ctx();
        Ok(SourceReader {
            inner: Box::new(reader.map(move |b| {
                let b = b.map_err(|e| Error::invalid_input(format!("{ctx}: {e}")))?;
                table.convert(&b)
            })),
            total_rows: None,
        })
    }

    /// Up to `n` splits of whole lines, by byte ranges of near-equal size; one split (the whole
    /// file) when a field may be quoted.
    pub(super) fn csv_splits(&self, batch_size: usize, n: usize) -> Result<Vec<SourceReader>> {
        let (header_len, file_schema) = self.csv_header()?;
        let mut file = open(&self.path)?;
        let len = file
            .metadata()
            .map_err(|e| Error::io(format!("{}: {e}", self.ctx())))?
            .len();
        if n <= 1 || has_quote(&mut file, header_len).map_err(|e| self.io_error(&e))? {
            return Ok(vec![self.open_csv(batch_size)?]);
        }
        let body = len - header_len;
        let mut starts = vec![header_len];
        for i in 1..n as u64 {
            let at = header_len + body * i / n as u64;
            let start = line_start_after(&mut file, at.max(*starts.last().unwrap_or(&0)))
                .map_err(|e| self.io_error(&e))?;
            starts.push(start.min(len));
        }
        starts.push(len);
        let mut splits = vec![];
        for w in starts.windows(2) {
            let (start, end) = (w[0], w[1]);
            if start >= end {
                continue;
            }
            let reader = self.csv_range(&file_schema, start, end, batch_size)?;
            let (table, ctx, path) = (self.clone(), self.ctx(), self.path.clone());
            splits.push(self.guard(SourceReader {
                inner: Box::new(reader.map(move |b| {
                    let b = b.map_err(|e| {
                        // The line in the whole file: the header and the lines before `start`.
                        let before = open(&path)
                            .and_then(|mut f| {
                                lines_between(&mut f, header_len, start)
                                    .map_err(|e| Error::io(e.to_string()))
                            })
                            .unwrap_or(0);
                        Error::invalid_input(format!(
                            "{ctx}: {}",
                            shift_line_numbers(&e.to_string(), before + 1)
                        ))
                    })?;
                    table.convert(&b)
                })),
                total_rows: None,
            }));
        }
        Ok(splits)
    }

    /// A reader of the records in bytes `start..end` of the file (whole lines, after the
    /// header), in batches of `batch_size`.
    fn csv_range(
        &self,
        schema: &SchemaRef,
        start: u64,
        end: u64,
        batch_size: usize,
    ) -> Result<arrow::csv::Reader<std::io::Take<File>>> {
        let mut part = open(&self.path)?;
        part.seek(SeekFrom::Start(start))
            .map_err(|e| self.io_error(&e))?;
        arrow::csv::ReaderBuilder::new(Arc::clone(schema))
            .with_header(false)
            .with_batch_size(batch_size)
            .build(part.take(end - start))
            .map_err(|e| Error::io(format!("{}: {e}", self.ctx())))
    }

    /// The records after the first `start` as up to `n` splits of chunks of `chunk` records
    /// dealt in turn (split `s` reads chunks `s`, `s + n`, …; the layout of
    /// [`crate::operator::pipelined::InputOrder::Chunks`]): one scan of the file finds the line
    /// where every chunk starts (blank lines are no records, as the CSV reader skips them), and
    /// each split reads its chunks' byte ranges. A file with a double quote anywhere (a field may
    /// span lines) is one split reading every record after `start`. `None` when that is so.
    ///
    /// # Errors
    /// Read errors, and a `start` past the file's last record (`past_end`).
    pub(super) fn csv_chunked_splits(
        &self,
        batch_size: usize,
        n: usize,
        chunk: usize,
        start: u64,
        past_end: impl Fn(u64) -> Error,
    ) -> Result<Option<Vec<SourceReader>>> {
        let (header_len, file_schema) = self.csv_header()?;
        let mut file = open(&self.path)?;
        let Some(scan) = scan_chunks(
            &mut file,
            header_len,
            start,
            chunk.max(1) as u64,
            SCAN_BLOCK,
        )
        .map_err(|e| self.io_error(&e))?
        else {
            return Ok(None);
        };
        if start > scan.records {
            return Err(past_end(scan.records));
        }
        let n = n.max(1);
        let mut splits = vec![];
        for s in 0..n.min(scan.chunks.len()) {
            let chunks: Vec<Chunk> = scan.chunks.iter().skip(s).step_by(n).copied().collect();
            let (table, ctx) = (self.clone(), self.ctx());
            let schema = Arc::clone(&file_schema);
            let mut chunks = chunks.into_iter();
            let mut current: Option<(Chunk, arrow::csv::Reader<std::io::Take<File>>)> = None;
            let inner = std::iter::from_fn(move || {
                loop {
                    if let Some((c, reader)) = &mut current {
                        match reader.next() {
                            Some(b) => {
                                let line = c.line;
                                return Some(
                                    b.map_err(|e| {
                                        Error::invalid_input(format!(
                                            "{ctx}: {}",
                                            shift_line_numbers(&e.to_string(), line + 1)
                                        ))
                                    })
                                    .and_then(|b| table.convert(&b)),
                                );
                            }
                            None => current = None,
                        }
                    }
                    let c = chunks.next()?;
                    match table.csv_range(&schema, c.start, c.end, batch_size) {
                        Ok(r) => current = Some((c, r)),
                        Err(e) => {
                            chunks = Vec::new().into_iter();
                            return Some(Err(e));
                        }
                    }
                }
            });
            splits.push(self.guard(SourceReader {
                inner: Box::new(inner),
                total_rows: Some(scan.records),
            }));
        }
        Ok(Some(splits))
    }

    pub(super) fn io_error(&self, e: &std::io::Error) -> Error {
        Error::io(format!("{}: {e}", self.ctx()))
    }
}

/// Whether the bytes after `from` hold a double quote.
pub(super) fn has_quote(file: &mut File, from: u64) -> std::io::Result<bool> {
    file.seek(SeekFrom::Start(from))?;
    let mut buf = vec![0u8; SCAN_BLOCK];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            return Ok(false);
        }
        if memchr::memchr(b'"', &buf[..n]).is_some() {
            return Ok(true);
        }
    }
}

/// A chunk of a CSV file: its byte range (whole lines) and the lines before it after the header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Chunk {
    start: u64,
    end: u64,
    line: usize,
}

/// What [`scan_chunks`] found: the records after the header, and the chunks of the records
/// after the first `start`.
#[derive(Debug)]
struct ChunkScan {
    records: u64,
    chunks: Vec<Chunk>,
}

/// Scans the file after the header (`from`) once, `block` bytes at a time: its records (lines
/// holding a byte other than `\r`) and, from record `start` on, a chunk starting at every
/// `chunk`-th record (the last one ending at the end of the file). `None` when the file holds
/// a double quote.
fn scan_chunks(
    file: &mut File,
    from: u64,
    start: u64,
    chunk: u64,
    block: usize,
) -> std::io::Result<Option<ChunkScan>> {
    file.seek(SeekFrom::Start(from))?;
    let mut buf = vec![0u8; block];
    // The file position of `buf[0]`, the current line's start and whether it holds a record
    // byte so far, and the newlines before it.
    let (mut pos, mut line_start, mut filled, mut line) = (from, from, false, 0usize);
    let (mut records, mut starts) = (0u64, vec![]);
    // A record begins on the current line: count it, and start a chunk where it falls.
    let mut record = |line_start: u64, line: usize, records: &mut u64| {
        if *records >= start && (*records - start).is_multiple_of(chunk) {
            starts.push((line_start, line));
        }
        *records += 1;
    };
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        let block = &buf[..n];
        if memchr::memchr(b'"', block).is_some() {
            return Ok(None);
        }
        let mut at = 0;
        for nl in memchr::memchr_iter(b'\n', block) {
            if !filled && block[at..nl].iter().any(|&b| b != b'\r') {
                record(line_start, line, &mut records);
            }
            (at, filled) = (nl + 1, false);
            line_start = pos + at as u64;
            line += 1;
        }
        if !filled && block[at..].iter().any(|&b| b != b'\r') {
            // The line goes on in the next block; it is a record already.
            record(line_start, line, &mut records);
            filled = true;
        }
        pos += n as u64;
    }
    let mut chunks: Vec<Chunk> = starts
        .windows(2)
        .map(|w| Chunk {
            start: w[0].0,
            end: w[1].0,
            line: w[0].1,
        })
        .collect();
    if let Some(&(start, line)) = starts.last() {
        chunks.push(Chunk {
            start,
            end: pos,
            line,
        });
    }
    Ok(Some(ChunkScan { records, chunks }))
}

/// The offset just after the first newline at or after `at` (the file's length if none).
fn line_start_after(file: &mut File, at: u64) -> std::io::Result<u64> {
    file.seek(SeekFrom::Start(at))?;
    let mut buf = vec![0u8; 64 * 1024];
    let mut pos = at;
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            return Ok(pos);
        }
        if let Some(i) = memchr::memchr(b'\n', &buf[..n]) {
            return Ok(pos + i as u64 + 1);
        }
        pos += n as u64;
    }
}

/// The newlines in bytes `[from, to)`.
fn lines_between(file: &mut File, from: u64, to: u64) -> std::io::Result<usize> {
    file.seek(SeekFrom::Start(from))?;
    let mut left = to.saturating_sub(from);
    let mut buf = vec![0u8; SCAN_BLOCK];
    let mut lines = 0;
    while left > 0 {
        let want = left.min(buf.len() as u64) as usize;
        let n = file.read(&mut buf[..want])?;
        if n == 0 {
            break;
        }
        lines += memchr::memchr_iter(b'\n', &buf[..n]).count();
        left -= n as u64;
    }
    Ok(lines)
}

/// `msg` with the number after each "at line " raised by `by`.
fn shift_line_numbers(msg: &str, by: usize) -> String {
    const AT: &str = "at line ";
    let mut out = String::with_capacity(msg.len() + 8);
    let mut rest = msg;
    while let Some(i) = rest.find(AT) {
        out.push_str(&rest[..i + AT.len()]);
        rest = &rest[i + AT.len()..];
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        match rest[..digits].parse::<usize>() {
            Ok(line) => out.push_str(&(line + by).to_string()),
            Err(_) => out.push_str(&rest[..digits]),
        }
        rest = &rest[digits..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_numbers_shift_in_messages() {
        assert_eq!(
            shift_line_numbers("bad value for column 1 at line 4. Row data: 'x'", 10),
            "bad value for column 1 at line 14. Row data: 'x'"
        );
        assert_eq!(shift_line_numbers("no line here", 3), "no line here");
        assert_eq!(shift_line_numbers("at line 0: x", 1), "at line 1: x");
    }

    /// The chunks found by one scan, whatever the block size, are those of the file's records
    /// (lines with a byte other than `\r`), counted from `start`, each starting at its first
    /// record's line and ending where the next starts.
    #[test]
    fn chunks_start_at_every_chunkth_record() {
        let text = "h\na\n\nb\r\n\r\n\rc\nd\n\n\ne\r\nf";
        let header = 2u64;
        let path = std::env::temp_dir().join(format!("tally-csv-scan-{}.csv", std::process::id()));
        std::fs::write(&path, text).unwrap();
        let bytes = text.as_bytes();
        // The records: (line start, newlines before it after the header).
        let mut records = vec![];
        let mut line_start = header as usize;
        for (line, l) in text[header as usize..].split('\n').enumerate() {
            if l.bytes().any(|b| b != b'\r') {
                records.push((line_start as u64, line));
            }
            line_start += l.len() + 1;
        }
        assert_eq!(records.len(), 6);
        for block in 1..12 {
            for chunk in 1..5u64 {
                for start in 0..=6u64 {
                    let mut file = File::open(&path).unwrap();
                    let scan = scan_chunks(&mut file, header, start, chunk, block)
                        .unwrap()
                        .unwrap();
                    assert_eq!(scan.records, 6);
                    let starts: Vec<(u64, usize)> = records
                        .iter()
                        .skip(start as usize)
                        .step_by(chunk as usize)
                        .copied()
                        .collect();
                    let want: Vec<Chunk> = starts
                        .iter()
                        .enumerate()
                        .map(|(i, &(start, line))| Chunk {
                            start,
                            end: starts.get(i + 1).map_or(bytes.len() as u64, |s| s.0),
                            line,
                        })
                        .collect();
                    assert_eq!(
                        scan.chunks, want,
                        "block {block} chunk {chunk} start {start}"
                    );
                }
            }
        }
        std::fs::write(&path, "h\na\n\"b\"\n").unwrap();
        let mut file = File::open(&path).unwrap();
        assert!(scan_chunks(&mut file, 2, 0, 1, 3).unwrap().is_none());
        std::fs::remove_file(&path).unwrap();
    }
}
