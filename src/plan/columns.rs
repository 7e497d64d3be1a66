//! Which input columns expressions read, and which of them may arrive dictionary-encoded.
//!
//! A string column that is only a group key or compared with a literal gives the same results
//! read as `Dictionary(Int32, Utf8)`: the key tables intern a dictionary by its values, once per
//! distinct value of a batch, and a comparison runs over the dictionary's values and is gathered
//! by the keys. Any other use (a function argument, an aggregate argument, a comparison of two
//! columns) needs the plain strings.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use arrow::datatypes::DataType;
use datafusion_expr::Operator;
use datafusion_physical_expr::PhysicalExpr;
use datafusion_physical_expr::expressions::{BinaryExpr, Column, Literal};

/// The input columns (by index) that `exprs` read.
pub fn columns_read<'a>(
    exprs: impl IntoIterator<Item = &'a Arc<dyn PhysicalExpr>>,
) -> BTreeSet<usize> {
    exprs
        .into_iter()
        .flat_map(datafusion_physical_expr::utils::collect_columns)
        .map(|c| c.index())
        .collect()
}

/// Whether a column of this type may be handed over dictionary-encoded where
/// [`ColumnUses::dictionary_safe`] allows it.
pub fn dictionary_capable(dt: &DataType) -> bool {
    *dt == DataType::Utf8
}

/// Whether `got` is `want` or, where `dictionary` allows, a dictionary of `want`'s values.
pub fn same_or_dictionary_of(got: &DataType, want: &DataType, dictionary: bool) -> bool {
    got == want
        || (dictionary
            && dictionary_capable(want)
            && matches!(got, DataType::Dictionary(k, v)
                if k.is_dictionary_key_type() && v.as_ref() == want))
}

/// How the columns of some expressions are used: `true` for a column whose every use reads it
/// as a whole value (a bare group key, one side of a comparison with a literal).
#[derive(Debug, Default, Clone)]
pub struct ColumnUses(BTreeMap<usize, bool>);

impl ColumnUses {
    fn note(&mut self, column: usize, whole_value: bool) {
        let e = self.0.entry(column).or_insert(true);
        *e &= whole_value;
    }

    /// Notes group key expressions: a bare column is read as a whole value.
    pub fn keys<'a>(&mut self, exprs: impl IntoIterator<Item = &'a Arc<dyn PhysicalExpr>>) {
        for e in exprs {
            match e.downcast_ref::<Column>() {
                Some(c) => self.note(c.index(), true),
                None => self.within(e),
            }
        }
    }

    /// Notes predicates (filters): comparisons of a column with a literal read it whole.
    pub fn predicates<'a>(&mut self, exprs: impl IntoIterator<Item = &'a Arc<dyn PhysicalExpr>>) {
        for e in exprs {
            self.within(e);
        }
    }

    /// Notes expressions whose columns need their plain form wherever they appear (aggregate
    /// arguments, projections).
    pub fn plain<'a>(&mut self, exprs: impl IntoIterator<Item = &'a Arc<dyn PhysicalExpr>>) {
        for c in columns_read(exprs) {
            self.note(c, false);
        }
    }

    /// The columns of `e` (not `e` itself) by the way `e` uses them.
    fn within(&mut self, e: &Arc<dyn PhysicalExpr>) {
        if let Some(c) = e.downcast_ref::<Column>() {
            self.note(c.index(), false);
            return;
        }
        if let Some(b) = e.downcast_ref::<BinaryExpr>()
            && matches!(
                b.op(),
                Operator::Eq
                    | Operator::NotEq
                    | Operator::Lt
                    | Operator::LtEq
                    | Operator::Gt
                    | Operator::GtEq
            )
        {
            let is_literal = |x: &Arc<dyn PhysicalExpr>| x.downcast_ref::<Literal>().is_some();
            let column = |x: &Arc<dyn PhysicalExpr>| x.downcast_ref::<Column>().map(Column::index);
            match (column(b.left()), column(b.right())) {
                (Some(c), None) if is_literal(b.right()) => return self.note(c, true),
                (None, Some(c)) if is_literal(b.left()) => return self.note(c, true),
                _ => {}
            }
        }
        for child in e.children() {
            self.within(child);
        }
    }

    /// The columns read only as whole values.
    pub fn dictionary_safe(&self) -> BTreeSet<usize> {
        self.0
            .iter()
            .filter(|&(_, &whole)| whole)
            .map(|(&c, _)| c)
            .collect()
    }

    /// Whether column `c` may be a dictionary as far as these uses go: read only whole, or
    /// not at all.
    pub fn allows_dictionary(&self, c: usize) -> bool {
        self.0.get(&c) != Some(&false)
    }
}
