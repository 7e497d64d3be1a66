//! A SQL session: the configuration, the catalog, and statements executed one at a time.

use std::collections::BTreeSet;

use datafusion_common::config::ConfigOptions;
use datafusion_optimizer::analyzer::AnalyzerRule;
use datafusion_optimizer::analyzer::type_coercion::TypeCoercion;
use datafusion_sql::parser::{DFParser, Statement as DFStatement};
use datafusion_sql::planner::{ParserOptions, SqlToRel};
use sqlparser::dialect::GenericDialect;

use super::catalog::Catalog;
use super::ddl::parse_create_table;
use super::planner;
use super::query::PlannedQuery;
use super::script::{
    StatementKind, after_first_word, classify, first_word, script_statements, split_assignment,
    sql_error, unquote,
};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::explain::ExplainDetail;
use crate::source::FileTable;

/// What a statement produced.
#[derive(Debug)]
pub enum StatementResult {
    /// A statement with no rows (`SET`, `RESET`, `CREATE TABLE`); a message for the user.
    Done(String),
    /// The text of an `EXPLAIN`.
    Explain(String),
    /// A planned query, ready to run.
    Query(Box<PlannedQuery>),
    /// `EXPLAIN ANALYZE`: a planned query to run with [`PlannedQuery::explain_analyze`], and the
    /// details asked for.
    Analyze(Box<PlannedQuery>, Vec<ExplainDetail>),
}

/// A SQL session: the configuration and the tables created so far.
#[derive(Debug, Default)]
pub struct Session {
    config: Config,
    catalog: Catalog,
    /// Warnings already printed (each is printed once).
    warned: BTreeSet<String>,
}

impl Session {
    /// A session with the default configuration and no tables.
    pub fn new() -> Self {
        Self::default()
    }

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Sets an option as `SET 'key' = 'value'` does.
    ///
    /// # Errors
    /// An unknown key or a bad value.
    pub fn set(&mut self, key: &str, value: &str) -> Result<()> {
        self.config.set(key, value)
    }

    /// Records a warning; returns it the first time it is seen, `None` after.
    pub fn warn_once(&mut self, warning: &str) -> Option<String> {
        self.warned
            .insert(warning.to_string())
            .then(|| warning.to_string())
    }

    /// Runs one statement (without its `;`).
    ///
    /// # Errors
    /// Bad SQL, unknown tables or columns, bad options, unsupported constructs: each a one-line
    /// error naming the problem.
    pub fn execute(&mut self, stmt: &str) -> Result<StatementResult> {
        match classify(stmt) {
            StatementKind::Set => self.execute_set(stmt),
            StatementKind::Reset => self.execute_reset(stmt),
            StatementKind::Create => self.execute_create(stmt),
            StatementKind::Explain => self.execute_explain(stmt),
            StatementKind::Query => {
                let query = self.plan_query(stmt)?;
                Ok(StatementResult::Query(Box::new(query)))
            }
            StatementKind::Insert => Err(sql_error(
                stmt,
                "INSERT INTO is not supported: run the SELECT and choose the output with --output/--format",
            )),
            StatementKind::Other => Err(sql_error(
                stmt,
                format!("unsupported statement '{}'", first_word(stmt)),
            )),
        }
    }

    fn execute_set(&mut self, stmt: &str) -> Result<StatementResult> {
        let rest = after_first_word(stmt).trim();
        if rest.is_empty() {
            let lines: Vec<String> = self
                .config
                .entries()
                .into_iter()
                .map(|(k, v)| format!("'{k}' = '{v}'"))
                .collect();
            return Ok(StatementResult::Done(lines.join("\n")));
        }
        let (key, value) = split_assignment(rest)
            .ok_or_else(|| sql_error(stmt, "expected SET 'key' = 'value'"))?;
        self.set(&key, &value)?;
        Ok(StatementResult::Done(format!(
            "[INFO] Execute statement succeeded. ('{key}' = '{value}')"
        )))
    }

    fn execute_reset(&mut self, stmt: &str) -> Result<StatementResult> {
        let rest = after_first_word(stmt).trim();
        if rest.is_empty() {
            self.config = Config::default();
            return Ok(StatementResult::Done(
                "[INFO] Execute statement succeeded. (all options reset)".into(),
            ));
        }
        let key = unquote(rest);
        self.config.reset(&key)?;
        Ok(StatementResult::Done(format!(
            "[INFO] Execute statement succeeded. ('{key}' reset)"
        )))
    }

    fn execute_create(&mut self, stmt: &str) -> Result<StatementResult> {
        let table = parse_create_table(stmt)?;
        let name = table.name.clone();
        if !self.catalog.add(table) {
            return Err(sql_error(stmt, format!("table '{name}' already exists")));
        }
        Ok(StatementResult::Done(format!(
            "[INFO] Execute statement succeeded. (table '{name}' created)"
        )))
    }

    fn execute_explain(&mut self, stmt: &str) -> Result<StatementResult> {
        let mut rest = after_first_word(stmt).trim_start();
        let mut details = vec![];
        let mut analyze = false;
        loop {
            let word = rest
                .split(|c: char| c.is_whitespace() || c == ',')
                .next()
                .unwrap_or("")
                .to_ascii_uppercase();
            let detail = match word.as_str() {
                "PLAN_ADVICE" => ExplainDetail::PlanAdvice,
                "CHANGELOG_MODE" => ExplainDetail::ChangelogMode,
                "ANALYZE" if !analyze && details.is_empty() => {
                    analyze = true;
                    rest = rest[word.len()..].trim_start();
                    continue;
                }
                "ESTIMATED_COST" | "JSON_EXECUTION_PLAN" => {
                    return Err(sql_error(stmt, format!("EXPLAIN {word} is not supported")));
                }
                _ => break,
            };
            details.push(detail);
            rest = rest[word.len()..]
                .trim_start()
                .trim_start_matches(',')
                .trim_start();
        }
        if matches!(first_word(rest).as_str(), "PLAN" | "FOR") {
            // EXPLAIN PLAN FOR <query>
            let lower = rest.to_ascii_lowercase();
            if let Some(i) = lower.find("for") {
                rest = rest[i + 3..].trim_start();
            }
        }
        let query = self.plan_query(rest)?;
        if analyze {
            return Ok(StatementResult::Analyze(Box::new(query), details));
        }
        Ok(StatementResult::Explain(query.explain(&details)))
    }

    /// Parses and plans a query.
    ///
    /// # Errors
    /// As [`Session::execute`].
    pub fn plan_query(&mut self, sql: &str) -> Result<PlannedQuery> {
        let provider = self.catalog.provider();
        let mut statements = DFParser::parse_sql_with_dialect(sql, &GenericDialect {})
            .map_err(|e| sql_error(sql, e.strip_backtrace()))?;
        if statements.len() != 1 {
            return Err(sql_error(sql, "expected one query"));
        }
        let mut statement: DFStatement = statements
            .pop_front()
            .ok_or_else(|| sql_error(sql, "empty query"))?;
        if let DFStatement::Statement(s) = &mut statement
            && let sqlparser::ast::Statement::Query(q) = s.as_mut()
        {
            // Flink's output names: aliases, column names, `EXPR$n`.
            super::names::name_columns(q);
        }
        let options = ParserOptions {
            enable_ident_normalization: false,
            ..ParserOptions::default()
        };
        let plan = SqlToRel::new_with_options(&provider, options)
            .statement_to_plan(statement)
            .map_err(|e| sql_error(sql, e.strip_backtrace()))?;
        let plan = TypeCoercion::new()
            .analyze(plan, &ConfigOptions::default())
            .map_err(|e| sql_error(sql, e.strip_backtrace()))?;
        planner::plan(&self.catalog, &self.config, &plan)
    }

    /// The table named `name`.
    pub fn table(&self, name: &str) -> Option<&FileTable> {
        self.catalog.table(name)
    }

    /// The tables created so far.
    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }
}

/// Runs a script's statements in a fresh session and returns its last query, planned (for
/// harnesses that run one query under settings given as `SET` statements).
///
/// # Errors
/// As [`Session::execute`]; a script without a query.
pub fn plan_script(script: &str) -> Result<PlannedQuery> {
    let mut session = Session::new();
    let mut query = None;
    for stmt in script_statements(script)? {
        if let StatementResult::Query(q) = session.execute(&stmt)? {
            query = Some(q);
        }
    }
    query
        .map(|q| *q)
        .ok_or_else(|| Error::invalid_input("the script has no SELECT"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by `fuzz/` (sql_script): statements whose keyword follows `(` and a multi-byte
    /// space were sliced at a fixed offset, inside a character.
    #[test]
    fn keywords_after_parentheses_and_wide_spaces_do_not_panic() {
        for stmt in [
            "(\u{3000}SET a",
            "(((\u{3000}RESET",
            "((((((\u{3000}EXPLAIN",
            "(\u{3000}SET 'tally.strict' = 'true'",
        ] {
            let _ = Session::new().execute(stmt);
        }
        let mut s = Session::new();
        s.execute("(\u{3000}SET 'table.exec.mini-batch.size' = '7'")
            .unwrap();
        assert_eq!(s.config().mini_batch_size, 7);
    }

    #[test]
    fn set_and_reset() {
        let mut s = Session::new();
        s.execute("SET 'table.exec.mini-batch.size' = '100'")
            .unwrap();
        assert_eq!(s.config().mini_batch_size, 100);
        s.execute("SET table.exec.mini-batch.enabled = true")
            .unwrap();
        assert!(s.config().mini_batch_enabled);
        s.execute("RESET 'table.exec.mini-batch.size'").unwrap();
        assert_eq!(s.config().mini_batch_size, -1);
        s.execute("RESET").unwrap();
        assert!(!s.config().mini_batch_enabled);
        let e = s
            .execute("SET 'table.exec.nope' = '1'")
            .unwrap_err()
            .to_string();
        assert!(e.contains("table.exec.nope"), "{e}");
        let e = s
            .execute("SET 'tally.strict' = 'sometimes'")
            .unwrap_err()
            .to_string();
        assert!(e.contains("tally.strict"), "{e}");
    }
}
