//! Arbitrary bytes as the one entry of a checkpoint whose manifest and checksums hold (what a
//! crafted checkpoint, or damage that a checksum misses, hands to the reader), read with
//! `tally::checkpoint::CheckpointDir::read`. Errors are fine; a panic or an allocation far beyond
//! the input's size is a bug.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tally::checkpoint::CheckpointDir;
use twox_hash::XxHash32;

fuzz_target!(|data: &[u8]| {
    let folder = std::env::temp_dir()
        .join(format!("tally-fuzz-checkpoint-{}", std::process::id()))
        .join("chk-00000001");
    std::fs::create_dir_all(&folder).expect("cannot create the checkpoint folder");
    std::fs::write(folder.join("entry-0.arrows"), data).expect("cannot write the entry");
    let mut manifest = format!(
        "tally-checkpoint 1\nid 1\nentry stage-0 entry-0.arrows rows=0 bytes={} xxh32={:08x}\n",
        data.len(),
        XxHash32::oneshot(0, data)
    );
    let sum = XxHash32::oneshot(0, manifest.as_bytes());
    manifest.push_str(&format!("manifest-xxh32 {sum:08x}\n"));
    std::fs::write(folder.join("MANIFEST"), manifest).expect("cannot write the manifest");
    let _ = CheckpointDir::read(&folder);
});
