//! Tables of one primitive key column ([`PrimitiveGroupValues`]: values in a `Vec`) and of no
//! key column at all ([`NoKeyGroupValues`]: a global aggregate's one group).

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, ArrowPrimitiveType, PrimitiveArray};
use arrow_buffer::{NullBuffer, ScalarBuffer};
use arrow_schema::{ArrowError, DataType};
use hashbrown::HashTable;

use super::table::{GroupValues, check_len, find_or_insert, index_size, out_of_range};
use crate::hash::KeyNative;

/// A global aggregate's table: one group, id 0, with no key columns.
#[derive(Debug, Default)]
pub struct NoKeyGroupValues {
    seen: bool,
}

impl GroupValues for NoKeyGroupValues {
    fn intern(
        &mut self,
        cols: &[ArrayRef],
        hashes: &[u64],
        groups: &mut Vec<u32>,
    ) -> Result<(), ArrowError> {
        check_len(cols, hashes, 0)?;
        groups.clear();
        groups.resize(hashes.len(), 0);
        self.seen |= !hashes.is_empty();
        Ok(())
    }
    fn len(&self) -> usize {
        usize::from(self.seen)
    }
    fn size(&self) -> usize {
        0
    }
    fn clear(&mut self) {
        self.seen = false;
    }
    fn hashes(&self) -> &[u64] {
        // Rows without keys all hash to 0 (see `hash_columns`).
        if self.seen { &[0] } else { &[] }
    }
    fn keys(&self, groups: &[u32]) -> Result<Vec<ArrayRef>, ArrowError> {
        if let Some(&g) = groups.iter().find(|&&g| g != 0) {
            return Err(out_of_range(g));
        }
        Ok(vec![])
    }
}

/// One primitive key column: values in a `Vec`, a `HashTable` of group ids.
#[derive(Debug)]
pub struct PrimitiveGroupValues<T: ArrowPrimitiveType> {
    data_type: DataType,
    map: HashTable<u32>,
    values: Vec<T::Native>,
    hashes: Vec<u64>,
    null_group: Option<u32>,
}

impl<T: ArrowPrimitiveType> PrimitiveGroupValues<T>
where
    T::Native: KeyNative,
{
    /// An empty table for keys of `data_type` (which must be `T`'s type, parameters included).
    pub fn new(data_type: DataType) -> Self {
        Self {
            data_type,
            map: HashTable::with_capacity(128),
            values: Vec::with_capacity(128),
            hashes: Vec::with_capacity(128),
            null_group: None,
        }
    }
}

impl<T: ArrowPrimitiveType + std::fmt::Debug> GroupValues for PrimitiveGroupValues<T>
where
    T::Native: KeyNative,
{
    fn intern(
        &mut self,
        cols: &[ArrayRef],
        hashes: &[u64],
        groups: &mut Vec<u32>,
    ) -> Result<(), ArrowError> {
        check_len(cols, hashes, 1)?;
        let arr = cols[0]
            .as_primitive_opt::<T>()
            .ok_or_else(|| ArrowError::InvalidArgumentError("unexpected key type".into()))?;
        groups.clear();
        groups.reserve(arr.len());
        let values = arr.values();
        let nulls = arr.nulls().filter(|n| n.null_count() > 0);
        for (i, &h) in hashes.iter().enumerate() {
            if nulls.is_some_and(|n| n.is_null(i)) {
                let g = match self.null_group {
                    Some(g) => g,
                    None => {
                        let g = self.values.len() as u32;
                        self.values.push(T::Native::default());
                        self.hashes.push(h);
                        self.null_group = Some(g);
                        g
                    }
                };
                groups.push(g);
                continue;
            }
            let v = values[i];
            let null_group = self.null_group;
            let g = find_or_insert(
                &mut self.map,
                &mut self.hashes,
                h,
                &mut self.values,
                |stored, g| stored[g as usize].key_eq(v) && Some(g) != null_group,
                |stored| stored.push(v),
            );
            groups.push(g);
        }
        Ok(())
    }

    fn len(&self) -> usize {
        self.values.len()
    }

    fn size(&self) -> usize {
        index_size(&self.map, &self.hashes)
            + self.values.capacity() * std::mem::size_of::<T::Native>()
    }

    fn clear(&mut self) {
        self.map.clear();
        self.values.clear();
        self.hashes.clear();
        self.null_group = None;
    }

    fn hashes(&self) -> &[u64] {
        &self.hashes
    }

    fn keys(&self, groups: &[u32]) -> Result<Vec<ArrayRef>, ArrowError> {
        let mut out = Vec::with_capacity(groups.len());
        for &g in groups {
            out.push(*self.values.get(g as usize).ok_or_else(|| out_of_range(g))?);
        }
        let nulls = self.null_group.map(|ng| {
            NullBuffer::new(arrow_buffer::BooleanBuffer::collect_bool(
                groups.len(),
                |i| groups[i] != ng,
            ))
        });
        let arr = PrimitiveArray::<T>::new(ScalarBuffer::from(out), nulls)
            .with_data_type(self.data_type.clone());
        Ok(vec![Arc::new(arr)])
    }
}
