//! Arbitrary text planned as a `tally sql` script: every statement of it is executed in a fresh
//! session (`SET`, `RESET`, `CREATE TABLE`, `EXPLAIN …`, `SELECT`), which parses and plans but
//! never opens a file (a planned query is only explained, never run). Errors are fine; a panic
//! is a bug.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tally::sql::{ExplainDetail, Session, StatementResult, script_statements};

fuzz_target!(|data: &[u8]| {
    let Ok(script) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(statements) = script_statements(script) else {
        return;
    };
    let mut session = Session::new();
    for stmt in statements.iter().take(32) {
        match session.execute(stmt) {
            Ok(StatementResult::Query(query)) => {
                let _ = query.explain(&[]);
                let _ = query.explain(&[ExplainDetail::PlanAdvice, ExplainDetail::ChangelogMode]);
                let _ = (query.output_schema(), query.key_columns(), query.warnings());
            }
            Ok(StatementResult::Analyze(query, details)) => {
                let _ = query.explain(&details);
            }
            Ok(StatementResult::Done(_) | StatementResult::Explain(_)) | Err(_) => {}
        }
    }
});
