//! Flink-style SQL scripts: `SET`/`RESET`, `CREATE TABLE … WITH (…)` over local files,
//! `SELECT` with GROUP BY (nested too), `EXPLAIN [PLAN_ADVICE | CHANGELOG_MODE]` and
//! `EXPLAIN ANALYZE`, which runs the query and annotates the plan with its metrics.
//!
//! Parsing and logical planning use datafusion-sql over sqlparser; scalar functions come from
//! datafusion-functions plus Flink's `DATE_FORMAT` and `MOD` ([`functions`]); expressions are
//! type-coerced with DataFusion's analyzer and evaluated with datafusion-physical-expr. The
//! logical plan is then turned into Tally's pipeline ([`planner`]).
//!
//! ```no_run
//! use tally::sql::{Session, StatementResult};
//! let mut session = Session::new();
//! for stmt in tally::sql::split_statements("SET 'table.exec.mini-batch.enabled' = 'true';")? {
//!     match session.execute(&stmt)? {
//!         StatementResult::Done(msg) => println!("{msg}"),
//!         StatementResult::Explain(text) => println!("{text}"),
//!         StatementResult::Query(query) => { /* query.run(...) */ }
//!         StatementResult::Analyze(mut query, details) => {
//!             println!("{}", query.explain_analyze(&details, 8192)?);
//!         }
//!     }
//! }
//! # Ok::<(), tally::Error>(())
//! ```

pub mod functions;
mod names;
pub mod planner;
pub mod queries;
mod split;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use datafusion_common::TableReference;
use datafusion_common::config::ConfigOptions;
use datafusion_expr::logical_plan::LogicalTableSource;
use datafusion_expr::planner::{ContextProvider, ExprPlanner};
use datafusion_expr::{AggregateUDF, HigherOrderUDF, ScalarUDF, TableSource, WindowUDF};
use datafusion_optimizer::analyzer::AnalyzerRule;
use datafusion_optimizer::analyzer::type_coercion::TypeCoercion;
use datafusion_sql::parser::{DFParser, Statement as DFStatement};
use datafusion_sql::planner::{ParserOptions, SqlToRel};
use sqlparser::ast::{ColumnDef, DataType as SqlType, ExactNumberInfo, TimezoneInfo};
use sqlparser::dialect::GenericDialect;
use sqlparser::keywords::Keyword;
use sqlparser::parser::Parser;
use sqlparser::tokenizer::Token;

pub use planner::{ExplainDetail, PlannedQuery};

use crate::config::Config;
use crate::error::{Error, Result};
use crate::source::{FileTable, Format};

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
    tables: BTreeMap<String, FileTable>,
    /// Warnings already printed (each is printed once).
    warned: BTreeSet<String>,
}

/// Splits a script into statements at `;` outside quotes and comments; drops empty ones and
/// comments.
///
/// # Errors
/// An unterminated quote or comment.
pub fn split_statements(script: &str) -> Result<Vec<String>> {
    let mut out = vec![];
    let mut cur = String::new();
    let mut chars = script.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' | '"' | '`' => {
                cur.push(c);
                let mut closed = false;
                while let Some(d) = chars.next() {
                    cur.push(d);
                    if d == c {
                        if chars.peek() == Some(&c) {
                            cur.push(chars.next().unwrap_or(c));
                            continue;
                        }
                        closed = true;
                        break;
                    }
                }
                if !closed {
                    return Err(Error::plan(format!("unterminated {c} quote in the script")));
                }
            }
            '-' if chars.peek() == Some(&'-') => {
                for d in chars.by_ref() {
                    if d == '\n' {
                        cur.push('\n');
                        break;
                    }
                }
            }
            '/' if chars.peek() == Some(&'*') => {
                chars.next();
                let mut prev = ' ';
                let mut closed = false;
                for d in chars.by_ref() {
                    if prev == '*' && d == '/' {
                        closed = true;
                        break;
                    }
                    prev = d;
                }
                if !closed {
                    return Err(Error::plan("unterminated /* comment in the script"));
                }
                cur.push(' ');
            }
            ';' => {
                if !cur.trim().is_empty() {
                    out.push(cur.trim().to_string());
                }
                cur.clear();
            }
            _ => cur.push(c),
        }
    }
    if !cur.trim().is_empty() {
        out.push(cur.trim().to_string());
    }
    Ok(out)
}

/// What a statement of a script does, from its first keyword (after any opening parentheses:
/// `(SELECT …)` is a query).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StatementKind {
    /// `SET` (or `SET;`, which lists the options).
    Set,
    /// `RESET`.
    Reset,
    /// `CREATE TABLE`.
    Create,
    /// `EXPLAIN [ANALYZE] …`.
    Explain,
    /// A query (`SELECT`, `WITH`, or either in parentheses): it produces rows.
    Query,
    /// `INSERT INTO`, which Tally refuses with advice.
    Insert,
    /// Anything else (an error when executed).
    Other,
}

/// The kind of `stmt`: the one classification [`Session::execute`] and the command line (which
/// counts a script's queries) both use.
pub fn classify(stmt: &str) -> StatementKind {
    match first_word(stmt).as_str() {
        "SET" => StatementKind::Set,
        "RESET" => StatementKind::Reset,
        "CREATE" => StatementKind::Create,
        "EXPLAIN" => StatementKind::Explain,
        "SELECT" | "WITH" => StatementKind::Query,
        "INSERT" => StatementKind::Insert,
        _ => StatementKind::Other,
    }
}

/// The first word of a statement, upper-cased.
fn first_word(stmt: &str) -> String {
    stmt.split(|c: char| c.is_whitespace() || c == '(' || c == ';')
        .find(|w| !w.is_empty())
        .unwrap_or("")
        .to_ascii_uppercase()
}

/// The statement after its first word (as [`first_word`] finds it).
fn after_first_word(stmt: &str) -> &str {
    let sep = |c: char| c.is_whitespace() || c == '(' || c == ';';
    let start = stmt.find(|c: char| !sep(c)).unwrap_or(stmt.len());
    let rest = &stmt[start..];
    let end = rest.find(sep).unwrap_or(rest.len());
    &rest[end..]
}

fn unquote(s: &str) -> String {
    let s = s.trim();
    for q in ['\'', '"', '`'] {
        if s.len() >= 2 && s.starts_with(q) && s.ends_with(q) {
            return s[1..s.len() - 1].replace(&format!("{q}{q}"), &q.to_string());
        }
    }
    s.to_string()
}

fn sql_error(stmt: &str, e: impl std::fmt::Display) -> Error {
    let short: String = stmt.split_whitespace().collect::<Vec<_>>().join(" ");
    let short = if short.len() > 60 {
        format!("{}…", &short[..short.floor_char_boundary(60)])
    } else {
        short
    };
    Error::plan(format!("{e} (in: {short})"))
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
        if self.tables.contains_key(&name) {
            return Err(sql_error(stmt, format!("table '{name}' already exists")));
        }
        self.tables.insert(name.clone(), table);
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
        let provider = Provider::new(&self.tables);
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
            names::name_columns(q);
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
        planner::plan(self, &plan)
    }

    /// The table named `name`.
    pub fn table(&self, name: &str) -> Option<&FileTable> {
        self.tables.get(name)
    }
}

/// `'key' = 'value'` or `key = value`.
fn split_assignment(s: &str) -> Option<(String, String)> {
    let mut in_quote: Option<char> = None;
    for (i, c) in s.char_indices() {
        match (in_quote, c) {
            (None, '\'' | '"' | '`') => in_quote = Some(c),
            (Some(q), c) if c == q => in_quote = None,
            (None, '=') => {
                let key = unquote(&s[..i]);
                let value = unquote(&s[i + 1..]);
                return (!key.is_empty()).then_some((key, value));
            }
            _ => {}
        }
    }
    None
}

/// Parses `CREATE TABLE name (col TYPE, …) WITH ('k' = 'v', …)`.
fn parse_create_table(stmt: &str) -> Result<FileTable> {
    let dialect = GenericDialect {};
    let err = |e: &dyn std::fmt::Display| sql_error(stmt, e);
    let mut p = Parser::new(&dialect)
        .try_with_sql(stmt)
        .map_err(|e| err(&e))?;
    p.expect_keywords(&[Keyword::CREATE, Keyword::TABLE])
        .map_err(|e| err(&e))?;
    let name = p.parse_object_name(false).map_err(|e| err(&e))?;
    let name = name
        .0
        .last()
        .and_then(|part| part.as_ident())
        .map(|i| i.value.clone())
        .ok_or_else(|| err(&"expected a table name"))?;
    p.expect_token(&Token::LParen).map_err(|e| err(&e))?;
    let mut columns: Vec<ColumnDef> = vec![];
    loop {
        columns.push(p.parse_column_def().map_err(|e| err(&e))?);
        if !p.consume_token(&Token::Comma) {
            break;
        }
    }
    p.expect_token(&Token::RParen).map_err(|e| err(&e))?;
    let mut options: HashMap<String, String> = HashMap::new();
    if p.parse_keyword(Keyword::WITH) {
        p.expect_token(&Token::LParen).map_err(|e| err(&e))?;
        loop {
            let key = p.parse_literal_string().map_err(|e| err(&e))?;
            p.expect_token(&Token::Eq).map_err(|e| err(&e))?;
            let value = p.parse_literal_string().map_err(|e| err(&e))?;
            options.insert(key, value);
            if !p.consume_token(&Token::Comma) {
                break;
            }
        }
        p.expect_token(&Token::RParen).map_err(|e| err(&e))?;
    }
    if p.peek_token().token != Token::EOF {
        return Err(err(&format!(
            "unexpected '{}' after the table definition",
            p.peek_token().token
        )));
    }
    let mut fields = vec![];
    for c in &columns {
        let dt = arrow_type(&c.data_type)
            .map_err(|e| err(&format!("column '{}': {e}", c.name.value)))?;
        fields.push(Field::new(c.name.value.clone(), dt, true));
    }
    let schema: SchemaRef = Arc::new(Schema::new(fields));
    let opt = |k: &str| options.get(k).cloned();
    match opt("connector").as_deref() {
        Some("filesystem") => {}
        Some(other) => {
            return Err(err(&format!(
                "connector '{other}' is not supported (only 'filesystem')"
            )));
        }
        None => return Err(err(&"the WITH clause needs 'connector' = 'filesystem'")),
    }
    for k in options.keys() {
        if ![
            "connector",
            "path",
            "format",
            "changelog-column",
            "time-column",
        ]
        .contains(&k.as_str())
        {
            return Err(err(&format!(
                "unknown table option '{k}' (known: connector, path, format, changelog-column, time-column)"
            )));
        }
    }
    let path = PathBuf::from(opt("path").ok_or_else(|| err(&"the WITH clause needs 'path'"))?);
    let format =
        Format::parse(&opt("format").ok_or_else(|| err(&"the WITH clause needs 'format'"))?)
            .map_err(|e| err(&e))?;
    let time_column = opt("time-column");
    if let Some(t) = &time_column {
        match schema.field_with_name(t).map(|f| f.data_type().clone()) {
            Ok(DataType::Timestamp(_, _) | DataType::Int64 | DataType::Date32) => {}
            Ok(other) => {
                return Err(err(&format!(
                    "time column '{t}' has type {other}; it must be a TIMESTAMP or BIGINT (ms)"
                )));
            }
            Err(_) => return Err(err(&format!("time column '{t}' is not a declared column"))),
        }
    }
    let changelog_column = opt("changelog-column");
    if let Some(c) = &changelog_column
        && schema.field_with_name(c).is_ok()
    {
        return Err(err(&format!(
            "changelog column '{c}' must not be declared as a column: it is read from the file and becomes the row kind"
        )));
    }
    Ok(FileTable {
        name,
        schema,
        path,
        format,
        changelog_column,
        time_column,
    })
}

/// Maps a SQL column type to Arrow.
fn arrow_type(t: &SqlType) -> std::result::Result<DataType, String> {
    Ok(match t {
        SqlType::TinyInt(_) => DataType::Int8,
        SqlType::SmallInt(_) => DataType::Int16,
        SqlType::Int(_) | SqlType::Integer(_) => DataType::Int32,
        SqlType::BigInt(_) => DataType::Int64,
        SqlType::Float(_) | SqlType::Real => DataType::Float32,
        SqlType::Double(_) | SqlType::DoublePrecision => DataType::Float64,
        SqlType::Boolean | SqlType::Bool => DataType::Boolean,
        SqlType::Decimal(info) | SqlType::Numeric(info) | SqlType::Dec(info) => {
            let (p, s) = match info {
                ExactNumberInfo::None => (10, 0),
                ExactNumberInfo::Precision(p) => (*p, 0),
                ExactNumberInfo::PrecisionAndScale(p, s) => (*p, *s),
            };
            if p == 0 || p > 38 || s < 0 || s as u64 > p {
                return Err(format!(
                    "DECIMAL({p}, {s}) is out of range (1 ≤ precision ≤ 38, 0 ≤ scale ≤ precision)"
                ));
            }
            DataType::Decimal128(p as u8, s as i8)
        }
        SqlType::String(_)
        | SqlType::Varchar(_)
        | SqlType::Char(_)
        | SqlType::CharVarying(_)
        | SqlType::CharacterVarying(_)
        | SqlType::Character(_)
        | SqlType::Text => DataType::Utf8,
        SqlType::Date => DataType::Date32,
        SqlType::Time(_, _) => DataType::Time32(TimeUnit::Millisecond),
        SqlType::Timestamp(p, tz) => {
            if !matches!(tz, TimezoneInfo::None | TimezoneInfo::WithoutTimeZone) {
                return Err("TIMESTAMP WITH TIME ZONE is not supported".to_string());
            }
            match p.unwrap_or(6) {
                0 => DataType::Timestamp(TimeUnit::Second, None),
                1..=3 => DataType::Timestamp(TimeUnit::Millisecond, None),
                4..=6 => DataType::Timestamp(TimeUnit::Microsecond, None),
                _ => DataType::Timestamp(TimeUnit::Nanosecond, None),
            }
        }
        other => return Err(format!("type {other} is not supported")),
    })
}

/// Tables, functions and options for DataFusion's SQL planner.
struct Provider {
    tables: HashMap<String, Arc<dyn TableSource>>,
    scalars: HashMap<String, Arc<ScalarUDF>>,
    aggregates: HashMap<String, Arc<AggregateUDF>>,
    planners: Vec<Arc<dyn ExprPlanner>>,
    options: ConfigOptions,
}

impl Provider {
    fn new(tables: &BTreeMap<String, FileTable>) -> Self {
        let mut scalars = HashMap::new();
        for f in datafusion_functions::all_default_functions()
            .into_iter()
            .chain(functions::flink_udfs())
        {
            for alias in f.aliases() {
                scalars.insert(alias.to_ascii_lowercase(), Arc::clone(&f));
            }
            scalars.insert(f.name().to_ascii_lowercase(), f);
        }
        let aggregates = crate::functions::all_udafs()
            .into_iter()
            .map(|f| (f.name().to_ascii_lowercase(), f))
            .collect();
        Self {
            tables: tables
                .iter()
                .map(|(n, t)| {
                    (
                        n.clone(),
                        Arc::new(LogicalTableSource::new(Arc::clone(&t.schema)))
                            as Arc<dyn TableSource>,
                    )
                })
                .collect(),
            scalars,
            aggregates,
            planners: vec![
                Arc::new(datafusion_functions_aggregate::planner::AggregateFunctionPlanner),
                Arc::new(datafusion_functions::core::planner::CoreFunctionPlanner::default()),
                Arc::new(datafusion_functions::unicode::planner::UnicodeFunctionPlanner),
                Arc::new(datafusion_functions::datetime::planner::DatetimeFunctionPlanner),
            ],
            options: ConfigOptions::default(),
        }
    }
}

impl ContextProvider for Provider {
    fn get_table_source(
        &self,
        name: TableReference,
    ) -> datafusion_common::Result<Arc<dyn TableSource>> {
        self.tables.get(name.table()).cloned().ok_or_else(|| {
            datafusion_common::DataFusionError::Plan(format!(
                "table '{}' not found (create it with CREATE TABLE … WITH ('connector' = 'filesystem', …))",
                name.table()
            ))
        })
    }
    fn get_expr_planners(&self) -> &[Arc<dyn ExprPlanner>] {
        &self.planners
    }
    fn get_function_meta(&self, name: &str) -> Option<Arc<ScalarUDF>> {
        self.scalars.get(&name.to_ascii_lowercase()).cloned()
    }
    fn get_higher_order_meta(&self, _name: &str) -> Option<Arc<HigherOrderUDF>> {
        None
    }
    fn get_aggregate_meta(&self, name: &str) -> Option<Arc<AggregateUDF>> {
        self.aggregates.get(&name.to_ascii_lowercase()).cloned()
    }
    fn get_window_meta(&self, _name: &str) -> Option<Arc<WindowUDF>> {
        None
    }
    fn get_variable_type(&self, _names: &[String]) -> Option<DataType> {
        None
    }
    fn options(&self) -> &ConfigOptions {
        &self.options
    }
    fn udf_names(&self) -> Vec<String> {
        self.scalars.keys().cloned().collect()
    }
    fn higher_order_function_names(&self) -> Vec<String> {
        vec![]
    }
    fn udaf_names(&self) -> Vec<String> {
        self.aggregates.keys().cloned().collect()
    }
    fn udwf_names(&self) -> Vec<String> {
        vec![]
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
    for stmt in split_statements(script)? {
        if let StatementResult::Query(q) = session.execute(&stmt)? {
            query = Some(q);
        }
    }
    query
        .map(|q| *q)
        .ok_or_else(|| Error::invalid_input("the script has no SELECT"))
}

/// The SQL type that `CREATE TABLE` maps to `dt` (for writing DDL from a file's schema), if any.
pub fn sql_type_name(dt: &DataType) -> Option<String> {
    Some(match dt {
        DataType::Int8 => "TINYINT".into(),
        DataType::Int16 => "SMALLINT".into(),
        DataType::Int32 => "INT".into(),
        DataType::Int64 => "BIGINT".into(),
        DataType::Float32 => "FLOAT".into(),
        DataType::Float64 => "DOUBLE".into(),
        DataType::Boolean => "BOOLEAN".into(),
        DataType::Decimal128(p, s) => format!("DECIMAL({p}, {s})"),
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => "STRING".into(),
        DataType::Dictionary(_, v) if matches!(v.as_ref(), DataType::Utf8) => "STRING".into(),
        DataType::Date32 => "DATE".into(),
        DataType::Time32(TimeUnit::Millisecond) => "TIME".into(),
        DataType::Timestamp(unit, None) => format!(
            "TIMESTAMP({})",
            match unit {
                TimeUnit::Second => 0,
                TimeUnit::Millisecond => 3,
                TimeUnit::Microsecond => 6,
                TimeUnit::Nanosecond => 9,
            }
        ),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_split_outside_quotes_and_comments() {
        let s = split_statements(
            "SET 'a' = 'x;y'; -- a comment; still\nSELECT 1 /* ; */ FROM t;\n\n;SELECT 'it''s';",
        )
        .unwrap();
        assert_eq!(
            s,
            vec!["SET 'a' = 'x;y'", "SELECT 1   FROM t", "SELECT 'it''s'"]
        );
        assert!(split_statements("SELECT 'oops").is_err());
    }

    #[test]
    fn create_table_options_and_types() {
        let t = parse_create_table(
            "CREATE TABLE o (a INT, b STRING, c DECIMAL(10, 2), d TIMESTAMP(3), e DOUBLE) \
             WITH ('connector' = 'filesystem', 'path' = 'x.csv', 'format' = 'csv', 'changelog-column' = 'op')",
        )
        .unwrap();
        assert_eq!(t.name, "o");
        assert_eq!(t.format, Format::Csv);
        assert_eq!(t.changelog_column.as_deref(), Some("op"));
        let types: Vec<DataType> = t
            .schema
            .fields()
            .iter()
            .map(|f| f.data_type().clone())
            .collect();
        assert_eq!(
            types,
            vec![
                DataType::Int32,
                DataType::Utf8,
                DataType::Decimal128(10, 2),
                DataType::Timestamp(TimeUnit::Millisecond, None),
                DataType::Float64
            ]
        );
        for (bad, needle) in [
            (
                "CREATE TABLE o (a INT) WITH ('connector' = 'kafka', 'path' = 'x', 'format' = 'csv')",
                "kafka",
            ),
            (
                "CREATE TABLE o (a INT) WITH ('connector' = 'filesystem', 'format' = 'csv')",
                "'path'",
            ),
            (
                "CREATE TABLE o (a INT) WITH ('connector' = 'filesystem', 'path' = 'x', 'format' = 'orc')",
                "orc",
            ),
            (
                "CREATE TABLE o (a INT) WITH ('connector' = 'filesystem', 'path' = 'x', 'format' = 'csv', 'colour' = 'red')",
                "colour",
            ),
            (
                "CREATE TABLE o (a BLOB) WITH ('connector' = 'filesystem', 'path' = 'x', 'format' = 'csv')",
                "'a'",
            ),
            (
                "CREATE TABLE o (a INT, op STRING) WITH ('connector' = 'filesystem', 'path' = 'x', 'format' = 'csv', 'changelog-column' = 'op')",
                "must not be declared",
            ),
        ] {
            let e = parse_create_table(bad).unwrap_err().to_string();
            assert!(e.contains(needle), "{e}");
        }
    }

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
