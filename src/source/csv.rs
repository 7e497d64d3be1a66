//! CSV: a header row matched by column name (empty field = NULL), read whole or, for the
//! pipelined runtime, in splits of byte ranges cut at line ends.
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
    fn csv_header(&self) -> Result<(u64, SchemaRef)> {
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
            let mut part = open(&self.path)?;
            part.seek(SeekFrom::Start(start))
                .map_err(|e| self.io_error(&e))?;
            let reader = arrow::csv::ReaderBuilder::new(Arc::clone(&file_schema))
                .with_header(false)
                .with_batch_size(batch_size)
                .build(part.take(end - start))
                .map_err(|e| Error::io(format!("{}: {e}", self.ctx())))?;
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

    fn io_error(&self, e: &std::io::Error) -> Error {
        Error::io(format!("{}: {e}", self.ctx()))
    }
}

/// Whether the bytes after `from` hold a double quote.
fn has_quote(file: &mut File, from: u64) -> std::io::Result<bool> {
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
}
