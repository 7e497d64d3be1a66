//! The accumulators of every aggregate call of a query, indexed by group id (no keys: a
//! [`crate::operator::keyed::KeyedState`] pairs them with its group table).
//!
//! Non-DISTINCT calls get one [`GroupsAccumulator`] each; DISTINCT calls over the same argument
//! share one [`DistinctAccumulator`]. MIN/MAX with DISTINCT are planned as plain MIN/MAX (the
//! result is the same).

use arrow::array::ArrayRef;
use arrow::buffer::BooleanBuffer;
use arrow::datatypes::{DataType, Field};
use tally_kernels::accumulator::{GroupsAccumulator, column_rows};
use tally_kernels::aggregates::{AggregateKind, new_accumulator, new_monotonic_min_max};
use tally_kernels::distinct::{DistinctAccumulator, LiveEntries};

use crate::error::{Error, Result};
use crate::plan::{AggregatePlan, CalcBatch};

enum Slot {
    Plain {
        acc: Box<dyn GroupsAccumulator>,
        /// `acc`'s state columns, counted once (a merge of every part reads it).
        width: usize,
        kind: AggregateKind,
        arg: Option<usize>,
        /// The argument's type (None for `COUNT(*)`).
        arg_type: Option<DataType>,
        filter: Option<usize>,
    },
    Distinct {
        acc: Box<DistinctAccumulator>,
        arg: usize,
        filters: Vec<Option<usize>>,
    },
}

/// DISTINCT calls over one argument: (argument, functions, filters, output positions).
type DistinctGroup = (usize, Vec<AggregateKind>, Vec<Option<usize>>, Vec<usize>);

/// The accumulators of every aggregate call, indexed by group id.
pub(crate) struct Accumulators {
    slots: Vec<Slot>,
    /// Output column `j` is inner aggregate `.1` of slot `.0`.
    outputs: Vec<(usize, usize)>,
    /// A COUNT(*) slot the owner counts itself ([`Accumulators::count_rows_elsewhere`]): not
    /// applied here.
    counted_elsewhere: Option<usize>,
}

impl std::fmt::Debug for Accumulators {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Accumulators")
            .field("slots", &self.slots.len())
            .finish()
    }
}

/// `filter`, or `None` where it selects every row: the same rows, by the kernels' path without
/// a filter (a split's set batch has its FILTERs on the set id folded to TRUE).
fn selecting(filter: Option<&BooleanBuffer>) -> Option<&BooleanBuffer> {
    filter.filter(|f| f.count_set_bits() != f.len())
}

/// `filter & mask`, either possibly absent.
fn and(filter: Option<&BooleanBuffer>, mask: Option<&BooleanBuffer>) -> Option<BooleanBuffer> {
    match (filter, mask) {
        (None, None) => None,
        (Some(f), None) => Some(f.clone()),
        (None, Some(m)) => Some(m.clone()),
        (Some(f), Some(m)) => Some(f & m),
    }
}

impl Accumulators {
    pub(crate) fn try_new(plan: &AggregatePlan) -> Result<Self> {
        let retractable = plan.has_retractions();
        let mut slots: Vec<Slot> = vec![];
        let mut outputs = vec![];
        // DISTINCT calls grouped by argument: arg → (slot index, kinds, filters).
        let mut distinct: Vec<DistinctGroup> = vec![];
        for (j, call) in plan.calls.iter().enumerate() {
            let minmax = matches!(call.kind, AggregateKind::Min | AggregateKind::Max);
            if call.distinct && !minmax {
                let arg = call
                    .arg
                    .ok_or_else(|| Error::internal("DISTINCT without argument"))?;
                match distinct.iter_mut().find(|d| d.0 == arg) {
                    Some(d) => {
                        d.1.push(call.kind);
                        d.2.push(call.filter);
                        d.3.push(j);
                    }
                    None => distinct.push((arg, vec![call.kind], vec![call.filter], vec![j])),
                }
                outputs.push((usize::MAX, 0));
                continue;
            }
            let arg_type = call
                .arg
                .map(|a| plan.calc.args[a].data_type(&plan.input_schema))
                .transpose()?;
            let acc = match (&arg_type, call.monotonic) {
                (Some(dt), true) => new_monotonic_min_max(call.kind, dt),
                _ => new_accumulator(call.kind, arg_type.as_ref(), retractable),
            }
            .map_err(|e| Error::plan(format!("{}: {e}", call.name)))?;
            outputs.push((slots.len(), 0));
            slots.push(Slot::Plain {
                width: acc.state_types().len(),
                acc,
                kind: call.kind,
                arg: call.arg,
                arg_type,
                filter: call.filter,
            });
        }
        for (arg, kinds, filters, js) in distinct {
            let arg_type = plan.calc.args[arg].data_type(&plan.input_schema)?;
            let acc = DistinctAccumulator::try_new(&arg_type, &kinds, retractable)
                .map_err(|e| Error::plan(format!("DISTINCT over {arg_type}: {e}")))?;
            for (inner, j) in js.into_iter().enumerate() {
                outputs[j] = (slots.len(), inner);
            }
            slots.push(Slot::Distinct {
                acc: Box::new(acc),
                arg,
                filters,
            });
        }
        Ok(Self {
            slots,
            outputs,
            counted_elsewhere: None,
        })
    }

    /// Makes these a local phase's accumulators, whose state is only read by flushes: a
    /// DISTINCT argument's inner aggregates are not updated
    /// ([`DistinctAccumulator::for_local_phase`]).
    pub(crate) fn for_local_phase(&mut self) {
        for slot in &mut self.slots {
            if let Slot::Distinct { acc, .. } = slot {
                acc.for_local_phase();
            }
        }
    }

    /// Stops applying rows to the first COUNT(*) without FILTER, whose counts are exactly the
    /// owner's signed row counts (`count1`: +1 per accumulating row, -1 per retracting one), and
    /// returns the position of its column in [`Accumulators::state`], which the owner fills
    /// with those counts (a local phase: one count per row instead of two). `None` when there
    /// is no such call.
    pub(crate) fn count_rows_elsewhere(&mut self) -> Option<usize> {
        let mut at = 0;
        for (i, slot) in self.slots.iter().enumerate() {
            match slot {
                Slot::Plain {
                    kind: AggregateKind::CountStar,
                    filter: None,
                    ..
                } => {
                    self.counted_elsewhere = Some(i);
                    return Some(at);
                }
                Slot::Plain { width, .. } => at += width,
                Slot::Distinct { .. } => at += 1,
            }
        }
        None
    }

    /// Accumulates the rows of `batch` selected by `acc_mask` (all rows when None) and retracts
    /// those selected by `ret_mask` (none when None), each through its call's FILTER.
    pub(crate) fn apply(
        &mut self,
        batch: &CalcBatch,
        groups: &[u32],
        acc_mask: Option<&BooleanBuffer>,
        ret_mask: Option<&BooleanBuffer>,
        total_groups: usize,
    ) -> Result<()> {
        for (i, slot) in self.slots.iter_mut().enumerate() {
            if self.counted_elsewhere == Some(i) {
                continue;
            }
            match slot {
                Slot::Plain {
                    acc, arg, filter, ..
                } => {
                    let values: &[ArrayRef] = match arg {
                        Some(a) => std::slice::from_ref(&batch.args[*a]),
                        None => &[],
                    };
                    let f = selecting(filter.map(|f| &batch.filters[f]));
                    if f.is_some_and(|f| f.count_set_bits() == 0) {
                        // The FILTER drops the whole batch (an Expand hands each group set's
                        // rows to every call, and a call's `$e` FILTER drops the other sets'):
                        // no pass over the rows, a zero-row update that only grows the state.
                        let none: Vec<ArrayRef> = values.iter().map(|v| v.slice(0, 0)).collect();
                        acc.update(&none, &[], None, total_groups)?;
                        continue;
                    }
                    let m = and(f, acc_mask);
                    acc.update(values, groups, m.as_ref(), total_groups)?;
                    if let Some(r) = ret_mask {
                        let m = and(f, Some(r));
                        acc.retract(values, groups, m.as_ref(), total_groups)?;
                    }
                }
                Slot::Distinct { acc, arg, filters } => {
                    let values = &batch.args[*arg];
                    let masks: Vec<Option<BooleanBuffer>> = filters
                        .iter()
                        .map(|f| and(selecting(f.map(|f| &batch.filters[f])), acc_mask))
                        .collect();
                    let refs: Vec<Option<&BooleanBuffer>> =
                        masks.iter().map(Option::as_ref).collect();
                    acc.apply(values, groups, &refs, total_groups, 1)?;
                    if let Some(r) = ret_mask {
                        let masks: Vec<Option<BooleanBuffer>> = filters
                            .iter()
                            .map(|f| and(selecting(f.map(|f| &batch.filters[f])), Some(r)))
                            .collect();
                        let refs: Vec<Option<&BooleanBuffer>> =
                            masks.iter().map(Option::as_ref).collect();
                        acc.apply(values, groups, &refs, total_groups, -1)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// The results of `groups`, one array per aggregate call in output order.
    pub(crate) fn evaluate(&self, groups: &[u32]) -> Result<Vec<ArrayRef>> {
        let mut per_slot: Vec<Vec<ArrayRef>> = Vec::with_capacity(self.slots.len());
        for slot in &self.slots {
            per_slot.push(match slot {
                Slot::Plain { acc, .. } => vec![acc.evaluate(groups)?],
                Slot::Distinct { acc, .. } => acc.evaluate(groups)?,
            });
        }
        Ok(self
            .outputs
            .iter()
            .map(|&(s, i)| per_slot[s][i].clone())
            .collect())
    }

    /// The accumulator columns, named as Flink names accumulators: the function's buffer name
    /// and a running index over all fields (`count1$0` for COUNT(*), `count$1` for COUNT(x),
    /// `sum$2, count$3` for SUM/$SUM0/AVG, `min$4`/`max$5`), then `distinct$0`, `distinct$1`, …
    /// for the DISTINCT value sets, one per argument.
    pub(crate) fn state_fields(&self) -> Vec<Field> {
        let mut fields = vec![];
        let mut distinct = 0;
        for slot in &self.slots {
            match slot {
                Slot::Plain { acc, kind, .. } => {
                    let types = acc.state_types();
                    for (j, dt) in types.into_iter().enumerate() {
                        let name = match (kind, j) {
                            (AggregateKind::CountStar, _) => "count1",
                            (AggregateKind::Count, _) => "count",
                            (AggregateKind::Min, _) => "min",
                            (AggregateKind::Max, _) => "max",
                            (_, 0) => "sum",
                            _ => "count",
                        };
                        fields.push(Field::new(format!("{name}${}", fields.len()), dt, true));
                    }
                }
                Slot::Distinct { acc, .. } => {
                    fields.push(Field::new(
                        format!("distinct${distinct}"),
                        acc.state_type(),
                        true,
                    ));
                    distinct += 1;
                }
            }
        }
        fields
    }

    /// For each aggregate call in output order, the names of its accumulator fields in
    /// [`Accumulators::state_fields`] (a DISTINCT call names its argument's shared value set).
    pub(crate) fn call_state_names(&self) -> Vec<Vec<String>> {
        let fields = self.state_fields();
        let mut per_slot = vec![];
        let mut at = 0;
        for slot in &self.slots {
            let width = match slot {
                Slot::Plain { width, .. } => *width,
                Slot::Distinct { .. } => 1,
            };
            per_slot.push(
                fields[at..at + width]
                    .iter()
                    .map(|f| f.name().clone())
                    .collect::<Vec<_>>(),
            );
            at += width;
        }
        self.outputs
            .iter()
            .map(|&(s, _)| per_slot[s].clone())
            .collect()
    }

    /// The accumulator columns of `groups` (see [`Accumulators::state_fields`]).
    pub(crate) fn state(&self, groups: &[u32]) -> Result<Vec<ArrayRef>> {
        let mut out = vec![];
        for slot in &self.slots {
            match slot {
                Slot::Plain { acc, .. } => out.extend(acc.state(groups)?),
                Slot::Distinct { acc, .. } => out.push(acc.state(groups)?),
            }
        }
        Ok(out)
    }

    /// [`Accumulators::state`] of `groups` cut into runs of `chunk` groups: each run's columns.
    /// A DISTINCT call's table is read once for all the runs
    /// ([`DistinctAccumulator::state_chunks`]).
    pub(crate) fn state_chunks(&self, groups: &[u32], chunk: usize) -> Result<Vec<Vec<ArrayRef>>> {
        let chunk = chunk.max(1);
        let mut runs: Vec<Vec<ArrayRef>> = vec![vec![]; groups.len().div_ceil(chunk)];
        for slot in &self.slots {
            match slot {
                Slot::Plain { acc, .. } => {
                    for (run, ids) in runs.iter_mut().zip(groups.chunks(chunk)) {
                        run.extend(acc.state(ids)?);
                    }
                }
                Slot::Distinct { acc, .. } => {
                    for (run, col) in runs.iter_mut().zip(acc.state_chunks(groups, chunk)?) {
                        run.push(col);
                    }
                }
            }
        }
        Ok(runs)
    }

    /// Merges accumulator columns (as [`Accumulators::state`] produced them) into `groups`.
    pub(crate) fn merge(
        &mut self,
        states: &[ArrayRef],
        groups: &[u32],
        total_groups: usize,
    ) -> Result<()> {
        if states.iter().any(|s| s.len() != groups.len()) {
            return Err(Error::invalid_input(
                "accumulator columns and group ids differ in length",
            ));
        }
        self.merge_at(states, 0, groups, total_groups)
    }

    /// Merges rows `offset..offset + groups.len()` of accumulator columns (a worker's rows of a
    /// flush that several workers share) into `groups`, reading them in place where the
    /// accumulator can ([`GroupsAccumulator::merge_at`]).
    pub(crate) fn merge_at(
        &mut self,
        states: &[ArrayRef],
        offset: usize,
        groups: &[u32],
        total_groups: usize,
    ) -> Result<()> {
        let mut at = 0;
        for slot in &mut self.slots {
            match slot {
                Slot::Plain { acc, width, .. } => {
                    let cols = states.get(at..at + *width).ok_or_else(|| {
                        Error::invalid_input("accumulator batch has too few columns")
                    })?;
                    acc.merge_at(cols, offset, groups, total_groups)?;
                    at += *width;
                }
                Slot::Distinct { acc, .. } => {
                    let col = states.get(at).ok_or_else(|| {
                        Error::invalid_input("accumulator batch has too few columns")
                    })?;
                    let col = column_rows(std::slice::from_ref(col), offset, groups.len())?;
                    acc.merge(&col[0], groups, total_groups)?;
                    at += 1;
                }
            }
        }
        if at != states.len() {
            return Err(Error::invalid_input(
                "accumulator batch has too many columns",
            ));
        }
        Ok(())
    }

    /// Returns `groups` to the empty state.
    pub(crate) fn reset(&mut self, groups: &[u32]) {
        for slot in &mut self.slots {
            match slot {
                Slot::Plain { acc, .. } => acc.reset(groups),
                Slot::Distinct { acc, .. } => acc.reset(groups),
            }
        }
    }

    /// Resets groups `0..groups` to their initial state and forgets the DISTINCT tables'
    /// entries, keeping every allocation (a local phase after a flush).
    pub(crate) fn clear(&mut self, groups: usize) {
        let all: Vec<u32> = (0..groups as u32).collect();
        for slot in &mut self.slots {
            match slot {
                Slot::Plain { acc, .. } => acc.reset(&all),
                Slot::Distinct { acc, .. } => acc.clear(groups),
            }
        }
    }

    /// Per slot (in [`Accumulators::state`]'s order), the group set its calls share by
    /// `call_sets` (per call of the plan, as [`crate::plan::BucketKeys::call_sets`] gives them),
    /// and for a DISTINCT slot its argument: `None` unless every plain slot's calls are of the
    /// set of the keys alone (their rows all go where the key's do) and every DISTINCT slot's
    /// calls are of one set. What a local phase routing DISTINCT entries by their values'
    /// buckets needs (`crate::operator::local`'s entry routes).
    pub(crate) fn slot_sets(
        &self,
        call_sets: &[Option<usize>],
    ) -> Option<Vec<(Option<usize>, Option<usize>)>> {
        if call_sets.len() != self.outputs.len() {
            return None;
        }
        let mut sets: Vec<Option<Option<usize>>> = vec![None; self.slots.len()];
        for (&(slot, _), &set) in self.outputs.iter().zip(call_sets) {
            match sets[slot] {
                Some(s) if s != set => return None,
                _ => sets[slot] = Some(set),
            }
        }
        self.slots
            .iter()
            .zip(sets)
            .map(|(slot, set)| match (slot, set?) {
                (Slot::Plain { .. }, None) => Some((None, None)),
                (Slot::Plain { .. }, Some(_)) => None,
                (Slot::Distinct { arg, .. }, set) => Some((set, Some(*arg))),
            })
            .collect()
    }

    /// The number of state columns of each slot, in [`Accumulators::state`]'s order.
    pub(crate) fn slot_widths(&self) -> Vec<usize> {
        self.slots
            .iter()
            .map(|slot| match slot {
                Slot::Plain { width, .. } => *width,
                Slot::Distinct { .. } => 1,
            })
            .collect()
    }

    /// Each DISTINCT slot's live entries, their groups and values (None for a plain slot), in
    /// slot order ([`DistinctAccumulator::live_entries`]).
    pub(crate) fn live_entries(&self) -> Result<Vec<Option<LiveEntries>>> {
        self.slots
            .iter()
            .map(|slot| match slot {
                Slot::Plain { .. } => Ok(None),
                Slot::Distinct { acc, .. } => Ok(Some(acc.live_entries()?)),
            })
            .collect()
    }

    /// Grows every plain accumulator to `groups` groups (the new ones empty), without rows.
    pub(crate) fn grow_plain(&mut self, groups: usize) -> Result<()> {
        for slot in &mut self.slots {
            if let Slot::Plain { acc, arg_type, .. } = slot {
                let none: Vec<ArrayRef> =
                    arg_type.iter().map(arrow::array::new_empty_array).collect();
                acc.update(&none, &[], None, groups)?;
            }
        }
        Ok(())
    }

    /// [`Accumulators::state`] of output rows that are not groups: a plain slot's row `i` is
    /// group `plain[i]`'s, and a DISTINCT slot's live `entries` (as
    /// [`Accumulators::live_entries`] gave them, nothing applied since) lie in the rows
    /// `rows[slot]` gives them.
    ///
    /// # Errors
    /// A DISTINCT slot without its entries and rows, or rows that do not fit its entries.
    pub(crate) fn state_placed(
        &self,
        plain: &[u32],
        entries: &[Option<LiveEntries>],
        rows: &[Option<Vec<u32>>],
    ) -> Result<Vec<ArrayRef>> {
        let mut out = vec![];
        for ((slot, entries), rows) in self.slots.iter().zip(entries).zip(rows) {
            match (slot, entries, rows) {
                (Slot::Plain { acc, .. }, _, _) => out.extend(acc.state(plain)?),
                (Slot::Distinct { acc, .. }, Some(entries), Some(rows)) => {
                    out.push(acc.state_placed(entries, plain.len(), rows)?);
                }
                (Slot::Distinct { .. }, _, _) => {
                    return Err(Error::internal("DISTINCT entries without their rows"));
                }
            }
        }
        Ok(out)
    }

    /// The DISTINCT accumulators.
    fn distincts(&self) -> impl Iterator<Item = &DistinctAccumulator> {
        self.slots.iter().filter_map(|s| match s {
            Slot::Distinct { acc, .. } => Some(acc.as_ref()),
            Slot::Plain { .. } => None,
        })
    }

    /// Whether there are DISTINCT accumulators.
    pub(crate) fn has_distinct(&self) -> bool {
        self.distincts().next().is_some()
    }

    /// The (group, value) entries the DISTINCT tables hold.
    pub(crate) fn distinct_entries(&self) -> usize {
        self.distincts().map(DistinctAccumulator::entries).sum()
    }

    /// The DISTINCT tables' (group, value) entries and their bytes, from capacity.
    pub(crate) fn distinct_usage(&self) -> (usize, usize) {
        (
            self.distinct_entries(),
            self.distincts().map(DistinctAccumulator::size).sum(),
        )
    }

    /// Bytes held by all accumulators.
    pub(crate) fn size(&self) -> usize {
        self.slots
            .iter()
            .map(|s| match s {
                Slot::Plain { acc, .. } => acc.size(),
                Slot::Distinct { acc, .. } => acc.size(),
            })
            .sum()
    }
}
