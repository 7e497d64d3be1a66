//! Checkpoints on disk: named Arrow batches and a manifest, written atomically and verified on
//! read.
//!
//! # Layout
//! A checkpoint directory holds one folder per checkpoint, `chk-00000001`, `chk-00000002`, …
//! Each holds one Arrow IPC stream per entry (`entry-0.arrows`, …) and a `MANIFEST`, a text
//! file:
//!
//! ```text
//! tally-checkpoint 1
//! id 2
//! created-unix-ms 1764470000000
//! meta source.rows 120000
//! entry stage-0 entry-0.arrows rows=5000 bytes=204800 xxh32=8c1a2f0e
//! manifest-xxh32 01234567
//! ```
//!
//! The first line names the format and its version; `meta` lines carry the caller's key/value
//! pairs (source position, sink position, …); each `entry` line gives an entry's name, file, row
//! count, byte size and the XXH32 checksum of its bytes; the last line is the checksum of every
//! line before it.
//!
//! # Atomicity
//! A checkpoint is written into a temporary folder (`.tmp-chk-…`): every file is written and
//! fsynced, the manifest last, then the folder is renamed to its final name and the parent
//! directory fsynced. A crash at any moment leaves either the complete checkpoint or none (a
//! leftover temporary folder is ignored, and removed by the next write). Older checkpoints beyond
//! the number to retain are removed after the new one is in place.
//!
//! # Verification
//! Reading checks the format line and version, the manifest checksum, and each entry's size and
//! checksum before decoding it; any mismatch (a truncated file, a flipped byte, a missing entry)
//! is an error naming the checkpoint and the file. There is no partial restore.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;

use crate::error::{Error, Result};

mod folder;

use folder::{read_folder, sync_dir};

/// The format version this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;

const MAGIC: &str = "tally-checkpoint";
const MANIFEST: &str = "MANIFEST";
const PREFIX: &str = "chk-";
const TMP_PREFIX: &str = ".tmp-chk-";

/// One checkpoint: named entries (each a schema and its batches) and key/value metadata.
#[derive(Debug, Clone, Default)]
pub struct Checkpoint {
    /// The checkpoint's number (increasing within a directory).
    pub id: u64,
    /// Key/value pairs for the caller (keys and values without line breaks; keys without
    /// spaces).
    pub meta: BTreeMap<String, String>,
    /// Named entries, in order: each entry's schema and batches.
    pub entries: Vec<(String, SchemaRef, Vec<RecordBatch>)>,
}

impl Checkpoint {
    /// The batches of the entry `name`.
    ///
    /// # Errors
    /// When there is no such entry.
    pub fn entry(&self, name: &str) -> Result<&[RecordBatch]> {
        self.entries
            .iter()
            .find(|e| e.0 == name)
            .map(|e| e.2.as_slice())
            .ok_or_else(|| checkpoint_error(format!("it has no entry '{name}'")))
    }

    /// The metadata value of `key`.
    ///
    /// # Errors
    /// When the key is missing.
    pub fn meta(&self, key: &str) -> Result<&str> {
        self.meta
            .get(key)
            .map(String::as_str)
            .ok_or_else(|| checkpoint_error(format!("its manifest has no '{key}'")))
    }
}

fn checkpoint_error(message: impl std::fmt::Display) -> Error {
    Error::invalid_input(format!("checkpoint: {message}"))
}

fn io_error(path: &Path, e: impl std::fmt::Display) -> Error {
    Error::io(format!("{}: {e}", path.display()))
}

/// A directory of checkpoints.
///
/// # Examples
/// ```
/// use std::sync::Arc;
/// use arrow::array::{Int64Array, RecordBatch};
/// use arrow::datatypes::{DataType, Field, Schema};
/// use tally::checkpoint::{Checkpoint, CheckpointDir};
///
/// let dir = std::env::temp_dir().join(format!("tally-doc-{}", std::process::id()));
/// let store = CheckpointDir::new(&dir);
/// let schema = Arc::new(Schema::new(vec![Field::new("n", DataType::Int64, false)]));
/// let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(Int64Array::from(vec![1, 2]))]).unwrap();
/// let mut chk = Checkpoint { id: store.next_id().unwrap(), ..Checkpoint::default() };
/// chk.meta.insert("source.rows".into(), "2".into());
/// chk.entries.push(("state".into(), schema, vec![batch]));
/// let path = store.write(&chk).unwrap();
/// let back = CheckpointDir::read(&path).unwrap();
/// assert_eq!(back.meta("source.rows").unwrap(), "2");
/// assert_eq!(back.entry("state").unwrap()[0].num_rows(), 2);
/// # std::fs::remove_dir_all(&dir).unwrap();
/// ```
#[derive(Debug, Clone)]
pub struct CheckpointDir {
    root: PathBuf,
    retain: usize,
}

impl CheckpointDir {
    /// Checkpoints under `root` (created on the first write), keeping the 2 newest.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            retain: 2,
        }
    }

    /// Keeps the `n` newest checkpoints (at least 1).
    pub fn retain(mut self, n: usize) -> Self {
        self.retain = n.max(1);
        self
    }

    /// The directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The complete checkpoints, oldest first: (id, folder).
    ///
    /// # Errors
    /// When the directory exists but cannot be listed.
    pub fn list(&self) -> Result<Vec<(u64, PathBuf)>> {
        let mut out = vec![];
        let entries = match std::fs::read_dir(&self.root) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(io_error(&self.root, e)),
        };
        for e in entries {
            let e = e.map_err(|e| io_error(&self.root, e))?;
            let name = e.file_name();
            let Some(id) = name
                .to_str()
                .and_then(|n| n.strip_prefix(PREFIX))
                .and_then(|n| n.parse::<u64>().ok())
            else {
                continue;
            };
            out.push((id, e.path()));
        }
        out.sort();
        Ok(out)
    }

    /// The id for the next checkpoint (one past the newest).
    ///
    /// # Errors
    /// As [`CheckpointDir::list`].
    pub fn next_id(&self) -> Result<u64> {
        Ok(self.list()?.last().map_or(1, |(id, _)| id + 1))
    }

    /// The newest checkpoint's folder, if any.
    ///
    /// # Errors
    /// As [`CheckpointDir::list`].
    pub fn latest(&self) -> Result<Option<PathBuf>> {
        Ok(self.list()?.pop().map(|(_, p)| p))
    }

    /// Writes `chk` atomically as `chk-<id>` and removes checkpoints older than the newest
    /// `retain`. Returns its folder.
    ///
    /// # Errors
    /// I/O errors; an id that already exists; metadata with line breaks.
    pub fn write(&self, chk: &Checkpoint) -> Result<PathBuf> {
        std::fs::create_dir_all(&self.root).map_err(|e| io_error(&self.root, e))?;
        let final_path = self.root.join(format!("{PREFIX}{:08}", chk.id));
        if final_path.exists() {
            return Err(checkpoint_error(format!(
                "{} already exists",
                final_path.display()
            )));
        }
        // Leftovers of a write that crashed.
        for e in std::fs::read_dir(&self.root)
            .map_err(|e| io_error(&self.root, e))?
            .flatten()
        {
            if e.file_name().to_string_lossy().starts_with(TMP_PREFIX) {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
        let tmp = self
            .root
            .join(format!("{TMP_PREFIX}{:08}-{}", chk.id, std::process::id()));
        std::fs::create_dir_all(&tmp).map_err(|e| io_error(&tmp, e))?;
        folder::write(&tmp, chk)?;
        std::fs::rename(&tmp, &final_path).map_err(|e| io_error(&final_path, e))?;
        sync_dir(&self.root)?;
        let all = self.list()?;
        if all.len() > self.retain {
            for (_, old) in &all[..all.len() - self.retain] {
                std::fs::remove_dir_all(old).map_err(|e| io_error(old, e))?;
            }
        }
        Ok(final_path)
    }

    /// Reads and verifies the checkpoint in folder `path`, or the newest under `path` when
    /// `path` is a checkpoint directory.
    ///
    /// # Errors
    /// No checkpoint there; an unknown format or version; a manifest or entry that is missing,
    /// truncated or fails its checksum; an entry that does not decode.
    pub fn read(path: &Path) -> Result<Checkpoint> {
        let folder = if path.join(MANIFEST).exists() {
            path.to_path_buf()
        } else {
            CheckpointDir::new(path)
                .latest()?
                .ok_or_else(|| checkpoint_error(format!("no checkpoint in {}", path.display())))?
        };
        read_folder(&folder).map_err(|e| {
            let older = CheckpointDir::new(folder.parent().unwrap_or(Path::new(".")))
                .list()
                .ok()
                .and_then(|l| l.into_iter().rev().map(|(_, p)| p).find(|p| p != &folder));
            match older {
                Some(o) => e.with_note(format!(
                    "an older checkpoint is {}; restore it explicitly to resume from there",
                    o.display()
                )),
                None => e,
            }
        })
    }
}

/// An operator whose keyed state can be snapshotted as Arrow batches and checkpointed:
/// [`crate::GroupAggregate`] and [`crate::ParallelAggregate`].
///
/// # Examples
/// ```
/// use std::sync::Arc;
/// use arrow::array::{Int64Array, RecordBatch, StringArray};
/// use arrow::datatypes::{DataType, Field, Schema};
/// use datafusion_expr::col;
/// use tally::checkpoint::{CheckpointDir, Checkpointed};
/// use tally::aggregates::count_star;
/// use tally::GroupAggregate;
///
/// let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Utf8, true)]));
/// let build = || GroupAggregate::builder(schema.clone()).group_by([col("k")])
///     .aggregate([count_star()]).build().unwrap();
/// let mut agg = build();
/// let batch = RecordBatch::try_new(schema.clone(),
///     vec![Arc::new(StringArray::from(vec!["a", "b", "a"]))]).unwrap();
/// agg.push(&batch).unwrap();
/// let dir = CheckpointDir::new(std::env::temp_dir().join(format!("tally-op-doc-{}", std::process::id())));
/// agg.checkpoint(&dir, [("source.rows".to_string(), "3".to_string())].into()).unwrap();
/// let mut resumed = build();
/// let chk = resumed.restore(dir.root()).unwrap();
/// assert_eq!(chk.meta("source.rows").unwrap(), "3");
/// assert_eq!(resumed.metrics().keys_in_state, 2);
/// # std::fs::remove_dir_all(dir.root()).unwrap();
/// ```
pub trait Checkpointed {
    /// The schema of the snapshot batches.
    fn snapshot_schema(&self) -> SchemaRef;

    /// The keyed state as batches; nothing may be pending (fire and deliver it first).
    ///
    /// # Errors
    /// A mini-batch pending.
    fn snapshot(&self) -> Result<Vec<RecordBatch>>;

    /// Loads snapshot batches of the same query into this operator, which holds no state.
    ///
    /// # Errors
    /// An operator with state; batches of another query.
    fn restore_snapshot(&mut self, batches: &[RecordBatch]) -> Result<()>;

    /// Writes the state as the entry `state` of a new checkpoint in `dir`, with the caller's
    /// `meta` (its source position, say); returns the checkpoint's folder.
    ///
    /// # Errors
    /// A mini-batch pending; I/O errors.
    fn checkpoint(&self, dir: &CheckpointDir, meta: BTreeMap<String, String>) -> Result<PathBuf> {
        let chk = Checkpoint {
            id: dir.next_id()?,
            meta,
            entries: vec![("state".into(), self.snapshot_schema(), self.snapshot()?)],
        };
        dir.write(&chk)
    }

    /// Restores this fresh operator from the checkpoint at `path` (a checkpoint folder, or the
    /// newest in a checkpoint directory) written by [`Checkpointed::checkpoint`] of an operator
    /// of the same query (any parallelism); returns the checkpoint, for its metadata.
    ///
    /// # Errors
    /// A missing or corrupt checkpoint, one of another query, an operator with state.
    fn restore(&mut self, path: &Path) -> Result<Checkpoint> {
        let chk = CheckpointDir::read(path)?;
        self.restore_snapshot(chk.entry("state")?)?;
        Ok(chk)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::ipc::writer::StreamWriter;
    use twox_hash::XxHash32;

    use arrow::array::{Int64Array, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};

    use super::*;

    fn sample(id: u64) -> Checkpoint {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Utf8, true),
            Field::new("n", DataType::Int64, false),
        ]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(StringArray::from(vec![Some("a"), None, Some("c")])),
                Arc::new(Int64Array::from(vec![1, 2, 3])),
            ],
        )
        .unwrap();
        let mut meta = BTreeMap::new();
        meta.insert("source.rows".to_string(), "42".to_string());
        meta.insert("note".to_string(), "with spaces in it".to_string());
        Checkpoint {
            id,
            meta,
            entries: vec![
                ("stage-0".into(), schema.clone(), vec![batch.clone(), batch]),
                ("empty".into(), schema, vec![]),
            ],
        }
    }

    fn temp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("tally-chk-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn round_trip_retention_and_latest() {
        let root = temp("rt");
        let store = CheckpointDir::new(&root).retain(2);
        for _ in 0..3 {
            let id = store.next_id().unwrap();
            store.write(&sample(id)).unwrap();
        }
        let ids: Vec<u64> = store.list().unwrap().iter().map(|c| c.0).collect();
        assert_eq!(ids, vec![2, 3]);
        let chk = CheckpointDir::read(&root).unwrap();
        assert_eq!(chk.id, 3);
        assert_eq!(chk.meta("note").unwrap(), "with spaces in it");
        assert_eq!(chk.entry("stage-0").unwrap().len(), 2);
        assert_eq!(chk.entry("stage-0").unwrap()[1].num_rows(), 3);
        assert!(chk.entry("empty").unwrap().is_empty());
        assert!(chk.entry("nope").is_err());
        assert!(store.write(&sample(3)).is_err(), "ids are not reused");
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn corruption_is_a_clear_error() {
        let root = temp("bad");
        let store = CheckpointDir::new(&root).retain(5);
        store.write(&sample(1)).unwrap();
        type Corruption = Box<dyn Fn(&Path)>;
        let cases: Vec<(&str, Corruption)> = vec![
            (
                "truncated",
                Box::new(|p: &Path| {
                    let f = p.join("entry-0.arrows");
                    let len = std::fs::metadata(&f).unwrap().len();
                    let file = std::fs::OpenOptions::new().write(true).open(&f).unwrap();
                    file.set_len(len / 2).unwrap();
                }),
            ),
            (
                "fails its checksum",
                Box::new(|p: &Path| {
                    let f = p.join("entry-0.arrows");
                    let mut data = std::fs::read(&f).unwrap();
                    let mid = data.len() / 2;
                    data[mid] ^= 0x40;
                    std::fs::write(&f, data).unwrap();
                }),
            ),
            (
                "MANIFEST fails its checksum",
                Box::new(|p: &Path| {
                    let f = p.join(MANIFEST);
                    let text = std::fs::read_to_string(&f).unwrap();
                    std::fs::write(&f, text.replace("source.rows 42", "source.rows 43")).unwrap();
                }),
            ),
            (
                "MANIFEST is truncated",
                Box::new(|p: &Path| {
                    let f = p.join(MANIFEST);
                    let text = std::fs::read_to_string(&f).unwrap();
                    std::fs::write(&f, &text[..text.len() - 30]).unwrap();
                }),
            ),
            (
                "entry-1.arrows",
                Box::new(|p: &Path| std::fs::remove_file(p.join("entry-1.arrows")).unwrap()),
            ),
        ];
        for (i, (needle, corrupt)) in cases.iter().enumerate() {
            let id = i as u64 + 2;
            let path = store.write(&sample(id)).unwrap();
            corrupt(&path);
            let e = CheckpointDir::read(&path).unwrap_err().to_string();
            assert!(e.contains(needle) && e.contains("corrupt"), "{needle}: {e}");
            assert!(!e.contains('\n'), "{e}");
            // Restoring the directory picks the newest, which is corrupt: an error naming an
            // older checkpoint, never a silent fallback.
            let e = CheckpointDir::read(&root).unwrap_err().to_string();
            assert!(e.contains("older checkpoint"), "{e}");
            std::fs::remove_dir_all(&path).unwrap();
        }
        // A future version is refused by name.
        let path = store.write(&sample(20)).unwrap();
        let f = path.join(MANIFEST);
        let text = std::fs::read_to_string(&f).unwrap();
        let body = text
            .replace("tally-checkpoint 1\n", "tally-checkpoint 2\n")
            .lines()
            .filter(|l| !l.starts_with("manifest-xxh32"))
            .map(|l| format!("{l}\n"))
            .collect::<String>();
        let sum = XxHash32::oneshot(0, body.as_bytes());
        std::fs::write(&f, format!("{body}manifest-xxh32 {sum:08x}\n")).unwrap();
        let e = CheckpointDir::read(&path).unwrap_err().to_string();
        assert!(e.contains("version 2"), "{e}");
        assert!(CheckpointDir::read(&root.join("nothing")).is_err());
        std::fs::remove_dir_all(&root).unwrap();
    }

    /// A checkpoint whose entry is crafted, with checksums that hold: the Arrow IPC inputs
    /// `fuzz/` found to crash arrow-ipc (as streams: a file's messages follow its 8-byte
    /// magic), read as a checkpoint entry, are errors, not panics or huge allocations.
    #[test]
    fn crafted_entries_with_valid_checksums_are_errors() {
        let root = temp("crafted");
        let regressions = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/regressions/ipc_reader");
        let mut inputs: Vec<Vec<u8>> = vec![];
        for entry in std::fs::read_dir(regressions).unwrap() {
            let input = std::fs::read(entry.unwrap().path()).unwrap();
            let file = &input[1..];
            inputs.push(file.to_vec());
            if let Some(stream) = file.strip_prefix(b"ARROW1\0\0") {
                inputs.push(stream.to_vec());
            }
        }
        // A valid stream whose buffer is declared longer than the message body: arrow-ipc
        // slices it out of range (a panic) once the checksums let it through.
        let schema = Arc::new(Schema::new(vec![Field::new("n", DataType::Int64, false)]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![Arc::new(Int64Array::from(vec![1, 2, 3]))],
        )
        .unwrap();
        let mut stream = vec![];
        let mut w = StreamWriter::try_new(&mut stream, &schema).unwrap();
        w.write(&batch).unwrap();
        w.finish().unwrap();
        drop(w);
        let mut spec = 0i64.to_le_bytes().to_vec();
        spec.extend(24i64.to_le_bytes());
        let at = stream.windows(16).position(|w| w == spec).unwrap();
        stream[at + 8..at + 16].copy_from_slice(&4096i64.to_le_bytes());
        inputs.push(stream);
        assert!(inputs.len() >= 15, "{} inputs", inputs.len());
        for (i, bytes) in inputs.iter().enumerate() {
            let folder = root.join(format!("chk-{:08}", i + 1));
            std::fs::create_dir_all(&folder).unwrap();
            std::fs::write(folder.join("entry-0.arrows"), bytes).unwrap();
            let mut manifest = format!(
                "{MAGIC} {FORMAT_VERSION}\nid {}\nentry stage-0 entry-0.arrows rows=1 bytes={} xxh32={:08x}\n",
                i + 1,
                bytes.len(),
                XxHash32::oneshot(0, bytes)
            );
            let sum = XxHash32::oneshot(0, manifest.as_bytes());
            manifest.push_str(&format!("manifest-xxh32 {sum:08x}\n"));
            std::fs::write(folder.join(MANIFEST), manifest).unwrap();
            let e = CheckpointDir::read(&folder).unwrap_err().to_string();
            assert!(
                e.contains("entry-0.arrows") && !e.contains('\n'),
                "input {i}: {e}"
            );
        }
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_crashed_write_leaves_no_checkpoint() {
        let root = temp("crash");
        std::fs::create_dir_all(root.join(".tmp-chk-00000001-1")).unwrap();
        let store = CheckpointDir::new(&root);
        assert!(store.latest().unwrap().is_none());
        store.write(&sample(1)).unwrap();
        assert!(!root.join(".tmp-chk-00000001-1").exists());
        std::fs::remove_dir_all(&root).unwrap();
    }
}
