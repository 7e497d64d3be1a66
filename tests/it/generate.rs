//! `tally gen`: seeded files, the same bytes for the same options, readable by `tally sql`.

use std::path::Path;
use std::process::Command;

use crate::scratch::Scratch;
use arrow::array::AsArray;
use arrow::datatypes::Int8Type;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

const BIN: &str = env!("CARGO_BIN_EXE_tally");

fn tally_gen(args: &[&str]) -> (i32, String) {
    let out = Command::new(BIN).arg("gen").args(args).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stderr).unwrap(),
    )
}

fn dir(name: &str) -> Scratch {
    Scratch::dir(&format!("gen-{name}"))
}

fn parquet_rows(path: &Path) -> Vec<arrow::array::RecordBatch> {
    let r = ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(path).unwrap())
        .unwrap()
        .build()
        .unwrap();
    r.map(Result::unwrap).collect()
}

#[test]
fn orders_are_seeded_and_form_a_valid_changelog() {
    let d = dir("orders");
    let (a, b, c) = (
        d.join("a.parquet"),
        d.join("b.parquet"),
        d.join("c.parquet"),
    );
    for (path, seed) in [(&a, "7"), (&b, "7"), (&c, "8")] {
        let (code, err) = tally_gen(&[
            "orders",
            "--rows",
            "70000",
            "--keys",
            "50",
            "--updates",
            "0.2",
            "--seed",
            seed,
            "--out",
            path.to_str().unwrap(),
        ]);
        assert_eq!(code, 0, "{err}");
        assert!(err.contains("wrote 70000 rows"), "{err}");
    }
    let bytes = |p: &Path| std::fs::read(p).unwrap();
    assert_eq!(bytes(&a), bytes(&b), "same seed, same file");
    assert_ne!(bytes(&a), bytes(&c), "another seed, another file");
    let batches = parquet_rows(&a);
    let schema = batches[0].schema();
    assert_eq!(schema.field(0).name(), "op");
    assert_eq!(batches.iter().map(|b| b.num_rows()).sum::<usize>(), 70000);
    let mut kinds = [0usize; 4];
    for b in &batches {
        let ops = b.column(0).as_primitive::<Int8Type>();
        for i in 0..ops.len() {
            kinds[ops.value(i) as usize] += 1;
        }
    }
    assert!(
        kinds.iter().all(|&k| k > 0),
        "every row kind appears: {kinds:?}"
    );
    assert_eq!(kinds[1], kinds[2], "-U and +U come in pairs");
    // The changelog is consistent: `tally sql` consumes it, and what it leaves per shop adds up
    // to the inserts minus the deletes.
    let script = format!(
        "CREATE TABLE o (order_id BIGINT, shop STRING, user_id BIGINT, amount BIGINT, status STRING, ts TIMESTAMP(3)) \
         WITH ('connector' = 'filesystem', 'path' = '{}', 'format' = 'parquet', 'changelog-column' = 'op'); \
         SELECT COUNT(*) AS n FROM o;",
        a.display()
    );
    let out =
        crate::common::tally_ok(&["sql", "--emit", "final", "--format", "csv", "-e", &script]);
    let n: usize = out.lines().nth(1).unwrap().parse().unwrap();
    assert_eq!(n, kinds[0] - kinds[3]);
}

#[test]
fn nexmark_bids_have_the_bid_schema() {
    let d = dir("nexmark");
    let path = d.join("bids.arrow");
    let (code, err) = tally_gen(&[
        "nexmark",
        "--events",
        "1000",
        "--out",
        path.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    let r =
        arrow::ipc::reader::FileReader::try_new(std::fs::File::open(&path).unwrap(), None).unwrap();
    let names: Vec<String> = r
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    assert_eq!(
        names,
        [
            "auction", "bidder", "price", "channel", "url", "dateTime", "extra"
        ]
    );
    assert_eq!(r.map(|b| b.unwrap().num_rows()).sum::<usize>(), 1000);
}

#[test]
fn bad_gen_options_are_one_line_errors() {
    let d = dir("bad");
    let out = |name: &str| d.join(name).to_str().unwrap().to_string();
    for (args, want) in [
        (
            vec!["orders", "--rows", "10", "--out", &out("x.csv")],
            "unknown extension 'csv'",
        ),
        (
            vec!["orders", "--rows", "0", "--out", &out("x.parquet")],
            "must be positive",
        ),
        (
            vec![
                "orders",
                "--rows",
                "10",
                "--hot-share",
                "1.5",
                "--out",
                &out("x.parquet"),
            ],
            "--hot-share",
        ),
        (
            vec![
                "orders",
                "--rows",
                "10",
                "--keys",
                "0",
                "--out",
                &out("x.parquet"),
            ],
            "--keys",
        ),
        (
            vec![
                "orders",
                "--rows",
                "10",
                "--out",
                "/nonexistent-dir/x.parquet",
            ],
            "/nonexistent-dir/x.parquet",
        ),
        (
            vec!["orders", "--rows", "ten", "--out", &out("x.parquet")],
            "ten",
        ),
    ] {
        let (code, err) = tally_gen(&args);
        assert_eq!(code, 1, "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
    // Nothing half-written is left behind.
    assert!(std::fs::read_dir(&d).unwrap().next().is_none());
}

#[test]
fn bench_runs_a_matrix_and_writes_json() {
    let d = dir("bench");
    let json = d.join("out.json");
    let table = crate::common::tally_ok(&[
        "bench",
        "--query",
        "orders-distinct",
        "--input",
        "data/orders.parquet",
        "--matrix",
        "one-phase,split",
        "--workers",
        "1,2",
        "--repeat",
        "1",
        "--json",
        &json.display().to_string(),
    ]);
    assert_eq!(
        table
            .lines()
            .filter(|l| l.starts_with("| one-phase") || l.starts_with("| split"))
            .count(),
        4,
        "{table}"
    );
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let results = doc["results"].as_array().unwrap();
    assert_eq!(results.len(), 4);
    for r in results {
        assert_eq!(r["rows_in"], 100_000);
        assert!(r["rows_per_sec"].as_f64().unwrap() > 0.0);
    }
    // Split runs a PARTIAL and a FINAL aggregate.
    assert_eq!(results[2]["aggregates"].as_array().unwrap().len(), 2);
    assert_eq!(results[0]["aggregates"].as_array().unwrap().len(), 1);
    // A bad strategy or query is a one-line error.
    for (args, want) in [
        (
            vec!["--query", "orders-count", "--matrix", "fast"],
            "unknown strategy 'fast'",
        ),
        (vec!["--query", "nope"], "neither a built-in query"),
    ] {
        let out = Command::new(BIN)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .args(["bench", "--input", "data/orders.parquet"])
            .args(&args)
            .output()
            .unwrap();
        let err = String::from_utf8(out.stderr).unwrap();
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(
            err.contains(want) && err.trim().lines().count() == 1,
            "{err}"
        );
    }
}
