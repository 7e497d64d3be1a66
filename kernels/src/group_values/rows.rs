//! Interning any key columns: keys encoded with arrow-row into comparable byte rows.

use arrow_array::{Array, ArrayRef};
use arrow_row::{RowConverter, Rows, SortField};
use arrow_schema::{ArrowError, DataType};
use hashbrown::HashTable;

use super::table::{
    GroupValues, check_ids, check_len, find_or_insert, index_size, key_type_supported,
};

/// Any key columns, encoded with arrow-row into comparable byte rows.
pub struct RowGroupValues {
    types: Vec<DataType>,
    converter: RowConverter,
    map: HashTable<u32>,
    rows: Rows,
    hashes: Vec<u64>,
}

impl std::fmt::Debug for RowGroupValues {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RowGroupValues")
            .field("groups", &self.hashes.len())
            .finish()
    }
}

impl RowGroupValues {
    /// An empty table for keys of the given types.
    ///
    /// # Errors
    /// When arrow-row cannot encode one of the types.
    pub fn try_new(types: &[DataType]) -> Result<Self, ArrowError> {
        for dt in types {
            if !key_type_supported(dt) {
                return Err(ArrowError::NotYetImplemented(format!(
                    "a group key of type {dt} is not supported"
                )));
            }
        }
        let converter =
            RowConverter::new(types.iter().map(|t| SortField::new(t.clone())).collect())?;
        let rows = converter.empty_rows(128, 4096);
        Ok(Self {
            types: types.to_vec(),
            converter,
            map: HashTable::with_capacity(128),
            rows,
            hashes: Vec::with_capacity(128),
        })
    }
}

impl GroupValues for RowGroupValues {
    fn intern(
        &mut self,
        cols: &[ArrayRef],
        hashes: &[u64],
        groups: &mut Vec<u32>,
    ) -> Result<(), ArrowError> {
        check_len(cols, hashes, self.types.len())?;
        let batch_rows = if cols
            .iter()
            .zip(&self.types)
            .all(|(c, t)| c.data_type() == t)
        {
            self.converter.convert_columns(cols)?
        } else {
            // A dictionary of a key's values (as dictionary-encoded Parquet strings arrive):
            // encoded as its values, so that it is the same key as the plain strings.
            let plain = cols
                .iter()
                .zip(&self.types)
                .map(|(c, t)| match c.data_type() {
                    DataType::Dictionary(_, v) if v.as_ref() == t => arrow_cast::cast(c, t),
                    _ => Ok(std::sync::Arc::clone(c)),
                })
                .collect::<Result<Vec<_>, _>>()?;
            self.converter.convert_columns(&plain)?
        };
        groups.clear();
        groups.reserve(hashes.len());
        for (i, &h) in hashes.iter().enumerate() {
            let row = batch_rows.row(i);
            let g = find_or_insert(
                &mut self.map,
                &mut self.hashes,
                h,
                &mut self.rows,
                |stored, g| stored.row(g as usize) == row,
                |stored| stored.push(row),
            );
            groups.push(g);
        }
        Ok(())
    }

    fn len(&self) -> usize {
        self.hashes.len()
    }

    fn size(&self) -> usize {
        index_size(&self.map, &self.hashes) + self.rows.size() + self.converter.size()
    }

    fn clear(&mut self) {
        self.map.clear();
        self.rows.clear();
        self.hashes.clear();
    }

    fn hashes(&self) -> &[u64] {
        &self.hashes
    }

    fn keys(&self, groups: &[u32]) -> Result<Vec<ArrayRef>, ArrowError> {
        check_ids(groups, self.hashes.len())?;
        let cols = self
            .converter
            .convert_rows(groups.iter().map(|&g| self.rows.row(g as usize)))?;
        // arrow-row decodes dictionaries to their value type; give back the declared types.
        cols.into_iter()
            .zip(&self.types)
            .map(|(c, t)| {
                if c.data_type() == t {
                    Ok(c)
                } else {
                    arrow_cast::cast(&c, t)
                }
            })
            .collect()
    }
}
