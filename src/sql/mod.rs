//! Flink-style SQL scripts: `SET`/`RESET`, `CREATE TABLE … WITH (…)` over local files,
//! `SELECT` with GROUP BY (nested too), `EXPLAIN [PLAN_ADVICE | CHANGELOG_MODE]` and
//! `EXPLAIN ANALYZE`, which runs the query and annotates the plan with its metrics.
//!
//! Parsing and logical planning use datafusion-sql over sqlparser; scalar functions come from
//! datafusion-functions plus Flink's `DATE_FORMAT` and `MOD` ([`flink_functions`]); expressions are
//! type-coerced with DataFusion's analyzer and evaluated with datafusion-physical-expr. The
//! logical plan is then turned into Tally's pipeline ([`planner`]).
//!
//! ```no_run
//! use tally::sql::{Session, StatementResult};
//! let mut session = Session::new();
//! for stmt in tally::sql::script_statements("SET 'table.exec.mini-batch.enabled' = 'true';")? {
//!     match session.execute(&stmt)? {
//!         StatementResult::Done(msg) => println!("{msg}"),
//!         StatementResult::Explain(text) => println!("{text}"),
//!         StatementResult::Query(query) => { /* query.job().run(...) */ }
//!         StatementResult::Analyze(mut query, details) => {
//!             println!("{}", query.explain_analyze(&details, 8192)?);
//!         }
//!     }
//! }
//! # Ok::<(), tally::Error>(())
//! ```

mod cast_names;
mod catalog;
mod ddl;
mod explain;
pub mod flink_functions;
mod names;
pub mod planner;
pub mod queries;
mod query;
mod script;
mod session;
mod split;
pub mod split_functions;

pub use crate::explain::ExplainDetail;
pub use catalog::Catalog;
pub use ddl::{parse_sql_type, sql_type_name};
pub use query::PlannedQuery;
pub use script::{StatementKind, classify, script_statements};
pub use session::{Session, StatementResult, plan_script};
