//! Arbitrary bytes read as a Csv file through tally's own source reader (`FileTable`, as behind
//! `CREATE TABLE … WITH ('format' = 'csv')`), all batches drained. The first byte picks the
//! options (see `common::read`). Errors are fine; a panic or a batch that breaks the source's
//! promises (declared schema, valid op codes) is a bug.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tally::source::Format;

mod common;

fuzz_target!(|data: &[u8]| {
    common::read(Format::Csv, "csv", data);
});
