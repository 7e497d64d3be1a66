//! One checkpoint folder on disk: its entries as Arrow IPC streams and its checksummed
//! `MANIFEST` (the format in [`super`]'s docs), written and fsynced, and read back verified.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use arrow::array::RecordBatch;
use arrow::buffer::Buffer;
use arrow::datatypes::SchemaRef;
use arrow::error::ArrowError;
use arrow::ipc::reader::StreamDecoder;
use arrow::ipc::writer::StreamWriter;
use twox_hash::XxHash32;

use super::{Checkpoint, FORMAT_VERSION, MAGIC, MANIFEST, checkpoint_error, io_error};
use crate::error::Result;

/// Writes `chk`'s entries and then its manifest into `folder` (a fresh temporary folder),
/// every file fsynced, and the folder too.
pub(super) fn write(folder: &Path, chk: &Checkpoint) -> Result<()> {
    let mut manifest = format!(
        "{MAGIC} {FORMAT_VERSION}\nid {}\ncreated-unix-ms {}\n",
        chk.id,
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis())
    );
    for (k, v) in &chk.meta {
        if k.is_empty() || k.contains(char::is_whitespace) || v.contains(['\n', '\r']) {
            return Err(checkpoint_error(format!("bad metadata key or value '{k}'")));
        }
        manifest.push_str(&format!("meta {k} {v}\n"));
    }
    for (i, (name, schema, batches)) in chk.entries.iter().enumerate() {
        if name.is_empty() || name.contains(char::is_whitespace) {
            return Err(checkpoint_error(format!("bad entry name '{name}'")));
        }
        let file = format!("entry-{i}.arrows");
        let path = folder.join(&file);
        let (bytes, hash) = write_ipc(&path, schema, batches, PIECE_BYTES)?;
        let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
        manifest.push_str(&format!(
            "entry {name} {file} rows={rows} bytes={bytes} xxh32={hash:08x}\n"
        ));
    }
    let sum = XxHash32::oneshot(0, manifest.as_bytes());
    manifest.push_str(&format!("manifest-xxh32 {sum:08x}\n"));
    let mpath = folder.join(MANIFEST);
    let mut f = File::create(&mpath).map_err(|e| io_error(&mpath, e))?;
    f.write_all(manifest.as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(|e| io_error(&mpath, e))?;
    sync_dir(folder)
}

/// Writes `batches` as an Arrow IPC stream, in messages of about `piece_bytes` ([`pieces`]),
/// fsynced; returns its size and XXH32, taken from the bytes as they are written (reading the
/// file back would hold all of it in memory).
fn write_ipc(
    path: &Path,
    schema: &SchemaRef,
    batches: &[RecordBatch],
    piece_bytes: usize,
) -> Result<(u64, u64)> {
    let file = File::create(path).map_err(|e| io_error(path, e))?;
    // The stream format, which (unlike the file format) lets each batch bring its own
    // dictionaries: workers' snapshots of a dictionary key have different ones.
    let mut w = StreamWriter::try_new(HashingWriter::new(BufWriter::new(file)), schema)?;
    for b in batches {
        for piece in pieces(b, piece_bytes) {
            w.write(&piece)?;
        }
    }
    w.finish()?;
    let hashing = w.into_inner()?;
    let (bytes, hash) = (hashing.hasher.total_len(), hashing.hasher.finish_32());
    let file = hashing
        .inner
        .into_inner()
        .map_err(|e| io_error(path, e.error()))?;
    file.sync_all().map_err(|e| io_error(path, e))?;
    Ok((bytes, u64::from(hash)))
}

/// The most bytes of a batch that one IPC message of an entry holds, roughly: the writer
/// encodes a whole message in memory before it writes it, so a snapshot's batch (a split
/// PARTIAL's hot key may hold millions of DISTINCT entries) goes out in row slices of about
/// this size rather than costing its own size again.
const PIECE_BYTES: usize = 8 << 20;

/// `batch` in row slices of about `piece_bytes` each, supposing its rows of equal size (a
/// row is never cut, so one larger row makes a larger slice).
fn pieces(batch: &RecordBatch, piece_bytes: usize) -> impl Iterator<Item = RecordBatch> + '_ {
    let rows = batch.num_rows();
    let bytes = batch.get_array_memory_size();
    let step = if bytes <= piece_bytes || rows == 0 {
        rows.max(1)
    } else {
        (rows * piece_bytes / bytes).max(1)
    };
    (0..rows.max(1))
        .step_by(step)
        .map(move |start| batch.slice(start, step.min(rows - start)))
}

/// A writer that hashes (XXH32) and counts the bytes it passes on.
struct HashingWriter<W> {
    inner: W,
    hasher: XxHash32,
}

impl<W: Write> HashingWriter<W> {
    fn new(inner: W) -> Self {
        Self {
            inner,
            hasher: XxHash32::with_seed(0),
        }
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        std::hash::Hasher::write(&mut self.hasher, &buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

pub(super) fn sync_dir(path: &Path) -> Result<()> {
    File::open(path)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_error(path, e))
}

pub(super) fn read_folder(folder: &Path) -> Result<Checkpoint> {
    let name = folder.display();
    let bad = |what: String| checkpoint_error(format!("{name} is corrupt: {what}"));
    let mpath = folder.join(MANIFEST);
    let text = std::fs::read(&mpath).map_err(|e| io_error(&mpath, e))?;
    let text = String::from_utf8(text).map_err(|_| bad("MANIFEST is not text".into()))?;
    // The last line checks the rest.
    let body_end = text
        .trim_end_matches('\n')
        .rfind('\n')
        .map(|i| i + 1)
        .ok_or_else(|| bad("MANIFEST is truncated".into()))?;
    let (body, last) = text.split_at(body_end);
    let stored = last
        .trim_end()
        .strip_prefix("manifest-xxh32 ")
        .ok_or_else(|| bad("MANIFEST is truncated (no checksum line)".into()))?;
    if format!("{:08x}", XxHash32::oneshot(0, body.as_bytes())) != stored {
        return Err(bad("MANIFEST fails its checksum".into()));
    }
    let mut lines = body.lines();
    let head = lines.next().unwrap_or("");
    let version = head
        .strip_prefix(MAGIC)
        .map(str::trim)
        .ok_or_else(|| bad(format!("not a Tally checkpoint (first line '{head}')")))?;
    if version != FORMAT_VERSION.to_string() {
        return Err(checkpoint_error(format!(
            "{name} has format version {version}; this build reads version {FORMAT_VERSION}"
        )));
    }
    let mut chk = Checkpoint::default();
    for line in lines {
        let mut parts = line.splitn(2, ' ');
        let (tag, rest) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        match tag {
            "id" => {
                chk.id = rest.parse().map_err(|_| bad(format!("bad id '{rest}'")))?;
            }
            "created-unix-ms" => {}
            "meta" => {
                let (k, v) = rest.split_once(' ').unwrap_or((rest, ""));
                chk.meta.insert(k.to_string(), v.to_string());
            }
            "entry" => {
                let f: Vec<&str> = rest.split(' ').collect();
                let field = |i: usize, key: &str| -> Result<u64> {
                    let v = f
                        .get(i)
                        .and_then(|s| s.strip_prefix(key))
                        .ok_or_else(|| bad(format!("bad entry line '{line}'")))?;
                    if key == "xxh32=" {
                        u64::from_str_radix(v, 16)
                    } else {
                        v.parse()
                    }
                    .map_err(|_| bad(format!("bad entry line '{line}'")))
                };
                let (entry, file) = match (f.first(), f.get(1)) {
                    (Some(e), Some(file)) if !file.contains(['/', '\\']) && *file != ".." => {
                        (*e, *file)
                    }
                    _ => return Err(bad(format!("bad entry line '{line}'"))),
                };
                let (rows, bytes, hash) =
                    (field(2, "rows=")?, field(3, "bytes=")?, field(4, "xxh32=")?);
                let path = folder.join(file);
                let data = std::fs::read(&path).map_err(|e| bad(format!("{file}: {e}")))?;
                if data.len() as u64 != bytes {
                    return Err(bad(format!(
                        "{file} has {} bytes, the manifest says {bytes} (truncated?)",
                        data.len()
                    )));
                }
                if u64::from(XxHash32::oneshot(0, &data)) != hash {
                    return Err(bad(format!("{file} fails its checksum")));
                }
                // The checksums hold, but the bytes may still be crafted: the declared lengths
                // are checked and arrow-ipc's panics caught, as for any input file.
                let (schema, batches) =
                    crate::decode::guarded(&format!("checkpoint {name}, {file}"), || {
                        crate::decode::check_ipc_stream(&data)
                            .map_err(|e| bad(format!("{file}: {e}")))?;
                        decode_stream(data).map_err(|e| bad(format!("{file}: {e}")))
                    })?;
                let got: usize = batches.iter().map(RecordBatch::num_rows).sum();
                if got as u64 != rows {
                    return Err(bad(format!(
                        "{file} has {got} rows, the manifest says {rows}"
                    )));
                }
                chk.entries.push((entry.to_string(), schema, batches));
            }
            other => return Err(bad(format!("unknown manifest line '{other}'"))),
        }
    }
    Ok(chk)
}

/// The schema and batches of the Arrow IPC stream in `data`, whose arrays are slices of it
/// (decoding into arrays of their own would hold the entry twice while a restore reads it).
fn decode_stream(data: Vec<u8>) -> std::result::Result<(SchemaRef, Vec<RecordBatch>), ArrowError> {
    let mut buffer = Buffer::from_vec(data);
    let mut decoder = StreamDecoder::new();
    let mut batches = vec![];
    while let Some(batch) = decoder.decode(&mut buffer)? {
        batches.push(batch);
    }
    decoder.finish()?;
    let schema = decoder
        .schema()
        .ok_or_else(|| ArrowError::IpcError("no schema".into()))?;
    Ok((schema, batches))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{
        ArrayRef, DictionaryArray, Int64Array, Int64Builder, ListBuilder, StructBuilder,
    };
    use arrow::compute::concat_batches;
    use arrow::datatypes::{DataType, Field, Int32Type, Schema};

    use super::*;

    /// Groups with lists of `{value, count}` entries of very different lengths (a snapshot of
    /// DISTINCT state, a hot key among them) and a dictionary-encoded key.
    fn snapshot_like(rows: usize) -> RecordBatch {
        let entry = vec![
            Field::new("value", DataType::Int64, false),
            Field::new("count0", DataType::Int64, false),
        ];
        let mut lists = ListBuilder::new(StructBuilder::from_fields(entry, 0));
        for r in 0..rows {
            let len = if r == rows / 2 { 5000 } else { r % 7 };
            for v in 0..len {
                let s = lists.values();
                s.field_builder::<Int64Builder>(0)
                    .unwrap()
                    .append_value((r * 10_000 + v) as i64);
                s.field_builder::<Int64Builder>(1).unwrap().append_value(1);
                s.append(true);
            }
            lists.append(true);
        }
        let keys: DictionaryArray<Int32Type> = (0..rows).map(|r| ["a", "b", "c"][r % 3]).collect();
        let n = Int64Array::from_iter((0..rows).map(|r| (r % 5 != 0).then_some(r as i64)));
        let columns: Vec<ArrayRef> = vec![Arc::new(keys), Arc::new(n), Arc::new(lists.finish())];
        let fields: Vec<Field> = ["k", "n", "lists"]
            .iter()
            .zip(&columns)
            .map(|(name, c)| Field::new(*name, c.data_type().clone(), true))
            .collect();
        RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap()
    }

    #[test]
    fn a_large_batch_is_written_in_pieces_that_read_back_as_it_was() {
        let dir = std::env::temp_dir().join(format!("tally-pieces-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("entry.arrows");
        let batches = [snapshot_like(3000), snapshot_like(0), snapshot_like(10)];
        let schema = batches[0].schema();
        let (bytes, hash) = write_ipc(&path, &schema, &batches, 4096).unwrap();

        let data = std::fs::read(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(bytes, data.len() as u64, "the size is the bytes written");
        assert_eq!(
            hash,
            u64::from(XxHash32::oneshot(0, &data)),
            "so is the hash"
        );
        let start = data.as_ptr() as usize..data.as_ptr() as usize + data.len();
        let (read_schema, read) = decode_stream(data).unwrap();
        assert_eq!(read_schema, schema);
        let values = read[0].column(1).to_data().buffers()[0].as_ptr() as usize;
        assert!(
            start.contains(&values),
            "decoded arrays are slices of the bytes read"
        );
        assert!(
            read.len() > 20,
            "written in pieces: {} messages",
            read.len()
        );
        assert_eq!(
            concat_batches(&schema, &read).unwrap(),
            concat_batches(&schema, &batches).unwrap()
        );
    }

    #[test]
    fn a_small_batch_is_one_message() {
        let batch = snapshot_like(10);
        assert_eq!(pieces(&batch, PIECE_BYTES).count(), 1);
        assert_eq!(pieces(&snapshot_like(0), PIECE_BYTES).count(), 1);
    }
}
