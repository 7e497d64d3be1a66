//! One checkpoint folder on disk: its entries as Arrow IPC streams and its checksummed
//! `MANIFEST` (the format in [`super`]'s docs), written and fsynced, and read back verified.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use arrow::ipc::reader::StreamReader;
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
        let (bytes, hash) = write_ipc(&path, schema, batches)?;
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

/// Writes `batches` as an Arrow IPC stream, fsynced; returns its size and XXH32.
fn write_ipc(path: &Path, schema: &SchemaRef, batches: &[RecordBatch]) -> Result<(u64, u64)> {
    let file = File::create(path).map_err(|e| io_error(path, e))?;
    // The stream format, which (unlike the file format) lets each batch bring its own
    // dictionaries: workers' snapshots of a dictionary key have different ones.
    let mut w = StreamWriter::try_new(BufWriter::new(file), schema)?;
    for b in batches {
        w.write(b)?;
    }
    w.finish()?;
    let file = w
        .into_inner()?
        .into_inner()
        .map_err(|e| io_error(path, e.error()))?;
    file.sync_all().map_err(|e| io_error(path, e))?;
    drop(file);
    let bytes = std::fs::read(path).map_err(|e| io_error(path, e))?;
    Ok((bytes.len() as u64, u64::from(XxHash32::oneshot(0, &bytes))))
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
                        let reader = StreamReader::try_new(std::io::Cursor::new(&data), None)
                            .map_err(|e| bad(format!("{file}: {e}")))?;
                        let schema = reader.schema();
                        let batches = reader
                            .collect::<std::result::Result<Vec<_>, _>>()
                            .map_err(|e| bad(format!("{file}: {e}")))?;
                        Ok((schema, batches))
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
