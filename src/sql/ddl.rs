//! DDL: `CREATE TABLE … WITH ('connector' = 'filesystem', …)` parsed into a file table, and the
//! mapping between SQL column types and Arrow types.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use sqlparser::ast::{ColumnDef, DataType as SqlType, ExactNumberInfo, TimezoneInfo};
use sqlparser::dialect::GenericDialect;
use sqlparser::keywords::Keyword;
use sqlparser::parser::Parser;
use sqlparser::tokenizer::Token;

use super::script::sql_error;
use crate::error::Result;
use crate::source::{FileTable, Format};

/// Parses `CREATE TABLE name (col TYPE, …) WITH ('k' = 'v', …)`.
pub(super) fn parse_create_table(stmt: &str) -> Result<FileTable> {
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
        unread_columns: vec![],
        dictionary_columns: vec![],
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

/// The Arrow type that `CREATE TABLE` gives a column declared as `name` (`BIGINT`,
/// `DECIMAL(10, 2)`, `TIMESTAMP(6)`, …): the inverse of [`sql_type_name`].
///
/// # Errors
/// A name that is not a SQL type, or one Tally does not support, named in the message.
pub fn parse_sql_type(name: &str) -> Result<DataType> {
    let dialect = GenericDialect {};
    let err = |e: &dyn std::fmt::Display| sql_error(name, e);
    let mut p = Parser::new(&dialect)
        .try_with_sql(name)
        .map_err(|e| err(&e))?;
    let t = p.parse_data_type().map_err(|e| err(&e))?;
    if p.peek_token().token != Token::EOF {
        return Err(err(&format!(
            "unexpected '{}' after the type",
            p.peek_token().token
        )));
    }
    arrow_type(&t).map_err(|e| err(&e))
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
    fn type_names_parse_back_to_their_arrow_types() {
        for dt in [
            DataType::Int64,
            DataType::Utf8,
            DataType::Decimal128(38, 18),
            DataType::Date32,
            DataType::Timestamp(TimeUnit::Second, None),
            DataType::Timestamp(TimeUnit::Nanosecond, None),
        ] {
            let name = sql_type_name(&dt).unwrap();
            assert_eq!(parse_sql_type(&name).unwrap(), dt, "{name}");
        }
        assert_eq!(
            parse_sql_type("timestamp").unwrap(),
            DataType::Timestamp(TimeUnit::Microsecond, None)
        );
        for bad in ["DECIMAL(40, 2)", "NOPE", "INT INT"] {
            assert!(parse_sql_type(bad).is_err(), "{bad}");
        }
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
}
