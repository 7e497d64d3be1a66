//! Flink's names for the columns of a SELECT list, applied to the parsed query before planning.
//!
//! Flink (through Calcite) names each output column of a query: an alias wins, a plain column
//! (`k`, `t.k`) keeps its name, and any other expression is `EXPR$n`, `n` being its position in
//! the select list (from 0). A name already taken gets the first free suffix `0`, `1`, … (Calcite's
//! `SqlValidatorUtil.uniquify`): `SELECT k, k` gives `k, k0`. Every item then has a unique alias,
//! so `SELECT COUNT(1), COUNT(1)` plans (DataFusion needs unique names in a projection) and the
//! result's header shows Flink's names rather than DataFusion's (`count(*)`, `max(t.v) +
//! Int64(1)`). Subqueries in FROM and in WITH are named the same way.

use std::collections::HashSet;

use sqlparser::ast::{Expr, Ident, Query, Select, SelectItem, SetExpr, TableFactor};

/// Names every item of every select list in `query` (see the module docs).
pub(crate) fn name_columns(query: &mut Query) {
    if let Some(with) = &mut query.with {
        for cte in &mut with.cte_tables {
            name_columns(&mut cte.query);
        }
    }
    name_set_expr(&mut query.body);
}

fn name_set_expr(body: &mut SetExpr) {
    match body {
        SetExpr::Select(select) => name_select(select),
        SetExpr::Query(query) => name_columns(query),
        SetExpr::SetOperation { left, right, .. } => {
            name_set_expr(left);
            name_set_expr(right);
        }
        _ => {}
    }
}

fn name_table(factor: &mut TableFactor) {
    match factor {
        TableFactor::Derived { subquery, .. } => name_columns(subquery),
        TableFactor::NestedJoin {
            table_with_joins, ..
        } => {
            name_table(&mut table_with_joins.relation);
            for j in &mut table_with_joins.joins {
                name_table(&mut j.relation);
            }
        }
        _ => {}
    }
}

/// The name a plain column reference keeps, if `expr` is one.
fn column_name(expr: &Expr) -> Option<&str> {
    match expr {
        Expr::Identifier(id) => Some(&id.value),
        Expr::CompoundIdentifier(parts) => parts.last().map(|id| id.value.as_str()),
        Expr::Nested(inner) => column_name(inner),
        _ => None,
    }
}

fn name_select(select: &mut Select) {
    for t in &mut select.from {
        name_table(&mut t.relation);
        for j in &mut t.joins {
            name_table(&mut j.relation);
        }
    }
    let mut taken: HashSet<String> = HashSet::new();
    for (i, item) in select.projection.iter_mut().enumerate() {
        let (expr, wanted, aliased) = match item {
            SelectItem::UnnamedExpr(expr) => {
                let name = column_name(expr).map_or_else(|| format!("EXPR${i}"), str::to_string);
                let aliased = column_name(expr).is_none();
                (expr.clone(), name, aliased)
            }
            SelectItem::ExprWithAlias { expr, alias } => (expr.clone(), alias.value.clone(), true),
            // `*` and `t.*` expand to the columns' own names; Aliases lists are not ours to
            // rename.
            _ => continue,
        };
        let name = if taken.contains(&wanted) {
            (0..)
                .map(|j| format!("{wanted}{j}"))
                .find(|n| !taken.contains(n))
                .unwrap_or(wanted)
        } else {
            wanted
        };
        let unchanged = match item {
            SelectItem::ExprWithAlias { alias, .. } => alias.value == name,
            _ => !aliased && column_name(&expr) == Some(name.as_str()),
        };
        if !unchanged {
            *item = SelectItem::ExprWithAlias {
                expr,
                alias: Ident::with_quote('`', name.clone()),
            };
        }
        taken.insert(name);
    }
}

#[cfg(test)]
mod tests {
    use sqlparser::dialect::GenericDialect;
    use sqlparser::parser::Parser;

    use super::*;

    fn named(sql: &str) -> String {
        let mut stmts = Parser::parse_sql(&GenericDialect {}, sql).unwrap();
        let sqlparser::ast::Statement::Query(q) = &mut stmts[0] else {
            panic!("not a query")
        };
        name_columns(q);
        q.to_string()
    }

    #[test]
    fn expressions_get_their_position_plain_columns_keep_their_names() {
        assert_eq!(
            named("SELECT COUNT(1), COUNT(1) FROM t"),
            "SELECT COUNT(1) AS `EXPR$0`, COUNT(1) AS `EXPR$1` FROM t"
        );
        assert_eq!(
            named("SELECT k, t.v, SUM(v) + 1, MAX(v) AS m FROM t GROUP BY k, t.v"),
            "SELECT k, t.v, SUM(v) + 1 AS `EXPR$2`, MAX(v) AS m FROM t GROUP BY k, t.v"
        );
        // Duplicates get Calcite's suffixes; subqueries and CTEs are named too.
        assert_eq!(
            named("SELECT k, k, v AS k FROM (SELECT k, COUNT(*) FROM t GROUP BY k) s"),
            "SELECT k, k AS `k0`, v AS `k1` FROM (SELECT k, COUNT(*) AS `EXPR$1` FROM t GROUP BY k) s"
        );
        assert_eq!(
            named("WITH c AS (SELECT SUM(v) FROM t) SELECT * FROM c"),
            "WITH c AS (SELECT SUM(v) AS `EXPR$0` FROM t) SELECT * FROM c"
        );
    }
}
