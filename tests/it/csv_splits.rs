//! CSV in splits: byte ranges cut at line ends, read by the pipelined runtime's source tasks;
//! a file with quotes stays one split; a parse error names the line in the whole file.

use rand::SeedableRng;
use rand::rngs::StdRng;
use tally::changelog::ChangeBatch;
use tally::source::Format;

use crate::pipelined::{Settings, job, random_rows, table, temp, write_csv};

fn settings(workers: usize) -> Settings {
    Settings {
        workers,
        two_phase: true,
        size: 100,
        adaptive_probe: false,
        pipelined: true,
        batch: 64,
        filter: false,
        splits: 1,
    }
}

#[test]
fn csv_is_split_by_lines_and_quotes_keep_one_split() {
    let mut rng = StdRng::seed_from_u64(31);
    let rows = random_rows(&mut rng, 3000);
    let path = temp("split.csv");
    write_csv(&path, &rows);
    for workers in [2, 3, 4] {
        let splits = table(&path, Format::Csv).open_splits(256, workers).unwrap();
        assert_eq!(splits.len(), workers);
        let read: usize = splits
            .into_iter()
            .flat_map(|s| s.map(|b| b.unwrap().num_rows()))
            .sum();
        assert_eq!(read, rows.len(), "{workers} workers");
    }
    // A quoted field may hold a newline: the file is read whole.
    let quoted = temp("quoted.csv");
    let text = std::fs::read_to_string(&path).unwrap();
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    let rest = lines[1][lines[1].find(',').unwrap()..].to_string();
    lines[1] = format!("\"hot\"{rest}");
    std::fs::write(&quoted, lines.join("\n") + "\n").unwrap();
    let splits = table(&quoted, Format::Csv).open_splits(256, 3).unwrap();
    assert_eq!(splits.len(), 1);
    let mut sink = |_: &ChangeBatch| -> tally::Result<()> { Ok(()) };
    let stats = job(table(&quoted, Format::Csv), &settings(3))
        .run(64, &mut sink, |_, _| {})
        .unwrap();
    assert_eq!(
        stats.runtime, "ordered: the csv source is read as one split",
        "{stats:?}"
    );
}

#[test]
fn a_parse_error_in_a_split_names_its_line_in_the_file() {
    let mut rng = StdRng::seed_from_u64(32);
    let rows = random_rows(&mut rng, 3000);
    let path = temp("bad.csv");
    write_csv(&path, &rows);
    // Row 2500 (line 2502 of the file, after the header) gets a value that is no number.
    let text = std::fs::read_to_string(&path).unwrap();
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    let fields: Vec<&str> = lines[2501].split(',').collect();
    lines[2501] = format!("{},{},x7,{}", fields[0], fields[1], fields[3]);
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    let mut messages = vec![];
    for workers in [1, 3] {
        let mut sink = |_: &ChangeBatch| -> tally::Result<()> { Ok(()) };
        let err = job(table(&path, Format::Csv), &settings(workers))
            .run(64, &mut sink, |_, _| {})
            .unwrap_err()
            .to_string();
        assert!(err.contains("'x7'"), "{workers} workers: {err}");
        messages.push(err);
    }
    assert!(messages[0].contains("at line 2501"), "{}", messages[0]);
    assert_eq!(messages[0], messages[1], "the same line, split or not");
}
