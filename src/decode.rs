//! Decoding untrusted bytes: Arrow IPC files, streams and checkpoint entries, Parquet and CSV
//! files, whatever a user or a disk hands over.
//!
//! Two defences, each against a failure the fuzzers found (see `fuzz/README.md`):
//! [`guarded`] runs a decoder step and turns a panic inside arrow-ipc, parquet or arrow-csv into
//! a one-line error; [`check_ipc_lengths`] and [`check_ipc_stream`] check the lengths an Arrow
//! IPC file or stream declares before arrow-ipc allocates them.

use std::fs::File;
use std::io::{Cursor, Read, Seek, SeekFrom};

use crate::error::{Error, Result};

thread_local! {
    /// Set while [`guarded`] runs a decoder on this thread: its panics are reported as errors,
    /// not printed.
    static IN_DECODER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs a decoder step (arrow-ipc, parquet, arrow-csv over untrusted bytes), turning a panic in
/// it into a one-line error naming `ctx` (the table, the checkpoint): those crates panic on some
/// malformed files (see
/// `fuzz/README.md`), and bad input must not bring the process down. The panic hook in force
/// (the default one prints the message) is skipped for these panics; under `panic = "abort"` a
/// panic still aborts.
pub(crate) fn guarded<T>(ctx: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !IN_DECODER.with(std::cell::Cell::get) {
                previous(info);
            }
        }));
    });
    let outer = IN_DECODER.with(|d| d.replace(true));
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    IN_DECODER.with(|d| d.set(outer));
    result.unwrap_or_else(|payload| {
        let msg = payload
            .downcast_ref::<&str>()
            .map(|s| (*s).to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "no message".to_string());
        let msg = msg.lines().next().unwrap_or("").to_string();
        Err(Error::io(format!(
            "{ctx}: the file is corrupt: its decoder failed ({msg})"
        )))
    })
}

/// Checks that the lengths an Arrow IPC file (`is_file`: its footer's blocks) or stream (each
/// message's metadata and body) declares lie within the file, when it is a regular file.
/// arrow-ipc allocates (and zeroes) a declared length before reading it, so a corrupt length,
/// or the first bytes of a file of another format read as one (`PAR1`: 0.8 GB), would cost that
/// much memory, or abort the process, before the read fails.
pub(crate) fn check_ipc_lengths(file: &mut File, is_file: bool) -> std::result::Result<(), String> {
    let size = match file.metadata() {
        Ok(m) if m.is_file() => m.len(),
        _ => return Ok(()),
    };
    let result = if is_file {
        check_file_blocks(file, size)
    } else {
        check_stream_messages(file, size)
    };
    file.seek(SeekFrom::Start(0)).map_err(|e| e.to_string())?;
    result
}

fn read_at(file: &mut (impl Read + Seek), pos: u64, buf: &mut [u8]) -> bool {
    file.seek(SeekFrom::Start(pos)).is_ok() && file.read_exact(buf).is_ok()
}

/// The footer's blocks; a footer that cannot be read is left to arrow-ipc to report.
fn check_file_blocks(file: &mut (impl Read + Seek), size: u64) -> std::result::Result<(), String> {
    let mut tail = [0u8; 10];
    if size < 18 || !read_at(file, size - 10, &mut tail) {
        return Ok(());
    }
    let footer_len = i32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]);
    if footer_len < 0 || footer_len as u64 > size - 18 {
        return Err(format!(
            "its footer declares {footer_len} bytes, more than the file's {size} bytes"
        ));
    }
    let mut footer = vec![0u8; footer_len as usize];
    if !read_at(file, size - 10 - footer_len as u64, &mut footer) {
        return Ok(());
    }
    let Ok(footer) = arrow::ipc::root_as_footer(&footer) else {
        return Ok(());
    };
    let blocks = footer.dictionaries().into_iter().flatten();
    for b in blocks.chain(footer.recordBatches().into_iter().flatten()) {
        let (offset, meta, body) = (b.offset(), b.metaDataLength(), b.bodyLength());
        let end = i128::from(offset) + i128::from(meta) + i128::from(body);
        if offset < 0 || meta < 0 || body < 0 || end > i128::from(size) {
            return Err(format!(
                "a block of {meta} + {body} bytes at byte {offset} lies outside the file's {size} bytes"
            ));
        }
    }
    Ok(())
}

/// Every message up to the end-of-stream marker; a message that cannot be parsed is left to
/// arrow-ipc to report.
fn check_stream_messages(
    file: &mut (impl Read + Seek),
    size: u64,
) -> std::result::Result<(), String> {
    let mut pos = 0u64;
    loop {
        let mut word = [0u8; 4];
        if !read_at(file, pos, &mut word) {
            return Ok(());
        }
        // A message starts with the continuation marker 0xFFFFFFFF and the metadata length, or
        // (the pre-1.0 format) with the length alone; a length of 0 ends the stream.
        let mut prefix = 4;
        if word == [0xff; 4] {
            if !read_at(file, pos + 4, &mut word) {
                return Ok(());
            }
            prefix = 8;
        }
        let len = i32::from_le_bytes(word);
        if len == 0 {
            return Ok(());
        }
        if len < 0 || pos + prefix + len as u64 > size {
            return Err(format!(
                "the message at byte {pos} declares {len} bytes of metadata, more than the file's {size} bytes"
            ));
        }
        let mut meta = vec![0u8; len as usize];
        if !read_at(file, pos + prefix, &mut meta) {
            return Ok(());
        }
        let Ok(message) = arrow::ipc::root_as_message(&meta) else {
            return Ok(());
        };
        let body = message.bodyLength();
        pos += prefix + len as u64;
        if body < 0 || body as u64 > size - pos {
            return Err(format!(
                "the message at byte {pos} declares a body of {body} bytes, more than the file's {size} bytes"
            ));
        }
        pos += body as u64;
    }
}

/// [`check_ipc_lengths`] for an Arrow IPC stream held in memory (a checkpoint entry).
pub(crate) fn check_ipc_stream(bytes: &[u8]) -> std::result::Result<(), String> {
    check_stream_messages(&mut Cursor::new(bytes), bytes.len() as u64)
}
