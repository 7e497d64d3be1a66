//! Script text: the statements of a script, and what kind each statement is.

use crate::error::{Error, Result};

/// The statements of a script, cut at `;` outside quotes and comments; drops empty ones and
/// comments.
///
/// # Errors
/// An unterminated quote or comment.
pub fn script_statements(script: &str) -> Result<Vec<String>> {
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

/// The kind of `stmt`: the one classification [`crate::sql::Session::execute`] and the command line (which
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
pub(super) fn first_word(stmt: &str) -> String {
    stmt.split(|c: char| c.is_whitespace() || c == '(' || c == ';')
        .find(|w| !w.is_empty())
        .unwrap_or("")
        .to_ascii_uppercase()
}

/// The statement after its first word (as [`first_word`] finds it).
pub(super) fn after_first_word(stmt: &str) -> &str {
    let sep = |c: char| c.is_whitespace() || c == '(' || c == ';';
    let start = stmt.find(|c: char| !sep(c)).unwrap_or(stmt.len());
    let rest = &stmt[start..];
    let end = rest.find(sep).unwrap_or(rest.len());
    &rest[end..]
}

pub(super) fn unquote(s: &str) -> String {
    let s = s.trim();
    for q in ['\'', '"', '`'] {
        if s.len() >= 2 && s.starts_with(q) && s.ends_with(q) {
            return s[1..s.len() - 1].replace(&format!("{q}{q}"), &q.to_string());
        }
    }
    s.to_string()
}

pub(super) fn sql_error(stmt: &str, e: impl std::fmt::Display) -> Error {
    let short: String = stmt.split_whitespace().collect::<Vec<_>>().join(" ");
    let short = if short.len() > 60 {
        format!("{}…", &short[..short.floor_char_boundary(60)])
    } else {
        short
    };
    Error::plan(format!("{e} (in: {short})"))
}

/// `'key' = 'value'` or `key = value`.
pub(super) fn split_assignment(s: &str) -> Option<(String, String)> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_split_outside_quotes_and_comments() {
        let s = script_statements(
            "SET 'a' = 'x;y'; -- a comment; still\nSELECT 1 /* ; */ FROM t;\n\n;SELECT 'it''s';",
        )
        .unwrap();
        assert_eq!(
            s,
            vec!["SET 'a' = 'x;y'", "SELECT 1   FROM t", "SELECT 'it''s'"]
        );
        assert!(script_statements("SELECT 'oops").is_err());
    }
}
