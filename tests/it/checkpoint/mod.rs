//! Checkpoints and exactly-once resumption: a query stopped at any checkpoint, or killed
//! mid-replay, and resumed gives the same final table as an uninterrupted run; corrupt
//! checkpoints and mismatched resumptions are clear errors.

mod errors;
mod killed;
mod resume;

use std::path::Path;

use crate::common::Materialized;
use crate::scratch::Scratch;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A fresh directory of this test process, removed when dropped (a failing test's too).
fn scratch(name: &str) -> Scratch {
    Scratch::dir(&format!("chk-{name}"))
}

/// A bundled script without its comments, with `settings` in front and paths made absolute.
fn script(file: &str, settings: &str) -> String {
    let text = std::fs::read_to_string(root().join(file)).unwrap();
    let body: Vec<&str> = text.lines().filter(|l| !l.starts_with("--")).collect();
    let data = root().join("data").display().to_string();
    format!("{settings}\n{}", body.join("\n")).replace("'data/", &format!("'{data}/"))
}

fn table(lines: &[String]) -> Vec<(String, i64)> {
    let mut m = Materialized::default();
    m.apply_lines(lines);
    m.0.into_iter().collect()
}

/// Runs `tally sql ARGS…` from the repository root.
fn tally(args: &[&str]) -> (i32, String, String) {
    crate::common::tally_command(args)
}
