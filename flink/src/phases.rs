//! A GROUP BY query planned for Flink's tasks, and its two halves: the phase before Flink's
//! keyed exchange ([`LocalPhase`], chained to the upstream task) and the one after it
//! ([`GlobalPhase`], one per subtask of the keyed operator, its state in Flink's raw keyed state
//! per key group).
//!
//! Two phases (mini-batch on, the strategy not `ONE_PHASE`): the local phase folds each
//! mini-batch of input rows into one accumulator row per key and hands them over per key group;
//! the global phase merges them and fires its own mini-batches, as Flink's
//! `MiniBatchLocalGroupAggFunction` and `MiniBatchGlobalGroupAggFunction` do. One phase: the
//! local phase only cuts the input rows by key group, and the global phase is the whole keyed
//! aggregate. Either way a part crosses Flink's exchange as one record: a key group and the
//! Arrow IPC bytes of its rows.
//!
//! The key group of a row is Tally's ([`tally::operator::KeyGroups::of_hash`] of the key hash),
//! over `pipeline.max-parallelism` key groups: the Java side keys the exchange so that Flink's
//! key group of each part is this one, so Flink routes, snapshots and rescales Tally's state
//! per key group.

use std::sync::Arc;

use arrow::array::{ArrayRef, Int8Array, RecordBatch, UInt32Array};
use arrow::compute::take_record_batch;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::ipc::reader::StreamReader;
use arrow::ipc::writer::StreamWriter;
use tally::changelog::ChangeBatch;
use tally::clock::SystemClock;
use tally::operator::LocalGroupAggregate;
use tally::operator::key_groups::{KeyGroups, default_key_groups};
use tally::pipeline::map_through;
use tally::plan::AggregatePlan;
use tally::sql::{PlannedQuery, Session};
use tally::{Config, Error, GroupAggregate, Result};

use crate::wire::{self, Type};

/// A column of the operator's input or output: its name, type and nullability.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    /// The column's name.
    pub name: String,
    /// Its type.
    pub ty: Type,
    /// Whether it may hold NULL.
    pub nullable: bool,
}

/// The rows of one key group, as they cross Flink's exchange or sit in its raw keyed state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    /// The key group (Tally's and Flink's).
    pub key_group: u32,
    /// Arrow IPC stream bytes of its rows.
    pub bytes: Vec<u8>,
}

/// The most rows of one column batch from Java.
pub const MAX_BATCH_ROWS: usize = 4096;

/// How long rows wait in the Java batch with mini-batch off: Flink's default
/// `execution.buffer-timeout.interval`, the time its own network buffers hold records.
pub const UNBATCHED_LATENCY_MS: u64 = 100;

/// The name of the row kind column of a one-phase part (Int8 codes, Flink's byte values).
const KIND_COLUMN: &str = "$kind";

/// A GROUP BY query planned over the operator's input columns.
#[derive(Debug)]
pub struct Query {
    planned: PlannedQuery,
    /// The position of the aggregate among the pipeline's stages.
    aggregate: usize,
    plan: Arc<AggregatePlan>,
    config: Config,
    input: SchemaRef,
    two_phase: bool,
    key_groups: usize,
    output: Vec<Column>,
}

fn identifier(name: &str) -> Result<&str> {
    let mut chars = name.chars();
    let ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if ok {
        Ok(name)
    } else {
        Err(Error::plan(format!(
            "'{name}' cannot name a column or table of the Tally operator: use letters, digits and _"
        )))
    }
}

impl Query {
    /// Plans `sql`, a query over the table `table` whose columns are `columns` (a changelog when
    /// `changelog`), under Flink's and Tally's `options` (`SET` keys). Each Flink subtask runs
    /// one worker, so the parallelism is always 1 here; Flink's is the job's.
    ///
    /// # Errors
    /// Bad SQL or options, a column type that does not cross, and queries the operator does not
    /// run yet: anything but one GROUP BY over per-row stages (WHERE, projections), with
    /// per-row stages after it.
    pub fn plan(
        sql: &str,
        table: &str,
        columns: &[Column],
        changelog: bool,
        options: &[(String, String)],
    ) -> Result<Query> {
        let mut session = Session::new();
        for (k, v) in options {
            session.set(k, v)?;
        }
        session.set(tally::config::DEFAULT_PARALLELISM, "1")?;
        if columns.is_empty() {
            return Err(Error::plan("the Tally operator's input has no columns"));
        }
        let mut ddl = format!("CREATE TABLE {} (", identifier(table)?);
        for (i, c) in columns.iter().enumerate() {
            if i > 0 {
                ddl.push_str(", ");
            }
            ddl.push_str(identifier(&c.name)?);
            ddl.push(' ');
            ddl.push_str(c.ty.name());
            if !c.nullable {
                ddl.push_str(" NOT NULL");
            }
        }
        // The table is never opened: rows come from Flink. Its path only satisfies the DDL.
        ddl.push_str(
            ") WITH ('connector' = 'filesystem', 'path' = 'flink-input', 'format' = 'arrow'",
        );
        if changelog {
            ddl.push_str(", 'changelog-column' = '$op'");
        }
        ddl.push(')');
        session.execute(&ddl)?;
        let input = session
            .table(table)
            .map(|t| Arc::clone(&t.schema))
            .ok_or_else(|| Error::internal("the operator's input table was not created"))?;
        let mut planned = session.plan_query(sql)?;
        let stages = planned.job().pipeline().stages();
        let aggregates: Vec<usize> = (0..stages.len())
            .filter(|&i| stages[i].as_aggregate().is_some())
            .collect();
        let [aggregate] = aggregates[..] else {
            return Err(Error::plan(format!(
                "the Tally operator in Flink runs one GROUP BY; this query has {} aggregates (nested aggregates and split-distinct run in `tally sql`, not yet inside Flink)",
                aggregates.len()
            )));
        };
        if let Some(i) = (0..stages.len()).find(|&i| i != aggregate && !stages[i].per_batch()) {
            return Err(Error::plan(format!(
                "the Tally operator in Flink runs per-row stages around its GROUP BY; stage {i} ({:?}) is not one",
                stages[i]
            )));
        }
        let agg = stages[aggregate]
            .as_aggregate()
            .ok_or_else(|| Error::internal("the aggregate stage lost its aggregate"))?;
        let plan = agg.shared_plan();
        let config = agg.config().clone();
        let two_phase = agg.is_two_phase();
        let key_groups = match config.max_parallelism {
            n if n > 0 => n as usize,
            _ => default_key_groups(1),
        };
        KeyGroups::new(key_groups, 1)?;
        let output = planned
            .output_schema()
            .fields()
            .iter()
            .map(|f| {
                let ty = Type::of(f.data_type()).ok_or_else(|| {
                    Error::plan(format!(
                        "result column '{}' is of type {}, which does not cross into Flink yet",
                        f.name(),
                        f.data_type()
                    ))
                })?;
                Ok(Column {
                    name: f.name().clone(),
                    ty,
                    nullable: f.is_nullable(),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Query {
            planned,
            aggregate,
            plan,
            config,
            input,
            two_phase,
            key_groups,
            output,
        })
    }

    /// The result columns, in order.
    pub fn output(&self) -> &[Column] {
        &self.output
    }

    /// The key groups (Flink's max parallelism of the keyed operator).
    pub fn key_groups(&self) -> usize {
        self.key_groups
    }

    /// Whether the aggregate runs in two phases (a local phase before the exchange).
    pub fn two_phase(&self) -> bool {
        self.two_phase
    }

    /// Rows the Java side gathers into one column batch before crossing into Rust: the
    /// mini-batch size (at most [`MAX_BATCH_ROWS`]), or [`MAX_BATCH_ROWS`] with mini-batch off.
    pub fn batch_rows(&self) -> usize {
        if self.config.mini_batch_enabled {
            usize::try_from(self.config.mini_batch_size)
                .unwrap_or(1)
                .clamp(1, MAX_BATCH_ROWS)
        } else {
            MAX_BATCH_ROWS
        }
    }

    /// The longest rows wait in a phase before it flushes, in milliseconds: the mini-batch
    /// latency (`table.exec.mini-batch.allow-latency`), or with mini-batch off Flink's default
    /// network buffer timeout ([`UNBATCHED_LATENCY_MS`]).
    pub fn latency_ms(&self) -> u64 {
        if self.config.mini_batch_enabled {
            (self.config.mini_batch_allow_latency.as_millis() as u64).max(1)
        } else {
            UNBATCHED_LATENCY_MS
        }
    }

    /// The phase before Flink's exchange.
    ///
    /// # Errors
    /// When the local phase cannot be built.
    pub fn into_local(self) -> Result<LocalPhase> {
        let local = if self.two_phase {
            Some(LocalGroupAggregate::try_new(Arc::clone(&self.plan))?)
        } else {
            None
        };
        let size = u64::try_from(self.config.mini_batch_size)
            .unwrap_or(1)
            .max(1);
        let groups = KeyGroups::new(self.key_groups, 1)?;
        Ok(LocalPhase {
            query: self,
            local,
            groups,
            pending: 0,
            size,
            hashes: vec![],
        })
    }

    /// The phase after Flink's exchange, one per subtask.
    ///
    /// # Errors
    /// When the aggregate cannot be built.
    pub fn into_global(self) -> Result<GlobalPhase> {
        let clock = Arc::new(SystemClock);
        let agg = if self.two_phase {
            GroupAggregate::try_new_global(Arc::clone(&self.plan), self.config.clone(), clock)?
        } else {
            GroupAggregate::try_new(Arc::clone(&self.plan), self.config.clone(), clock)?
        };
        let groups = KeyGroups::new(self.key_groups, 1)?;
        Ok(GlobalPhase {
            query: self,
            agg,
            groups,
            hashes: vec![],
        })
    }

    fn stages(&mut self) -> &[Box<dyn tally::pipeline::Stage>] {
        self.planned.job().pipeline().stages()
    }
}

/// Cuts `batch` (whose first `keys` columns are the group keys, or whose `keys` are given) into
/// one part per key group, in key group order, the rows of each in input order.
fn cut_by_key_group(
    batch: &RecordBatch,
    keys: &[ArrayRef],
    groups: &KeyGroups,
    hashes: &mut Vec<u64>,
) -> Result<Vec<Part>> {
    let n = batch.num_rows();
    tally_hash(keys, n, hashes)?;
    let mut counts = vec![0u32; groups.count() + 1];
    let kgs: Vec<u32> = hashes.iter().map(|&h| groups.of_hash(h) as u32).collect();
    for &g in &kgs {
        counts[g as usize + 1] += 1;
    }
    for g in 1..counts.len() {
        counts[g] += counts[g - 1];
    }
    let starts = counts.clone();
    let mut order = vec![0u32; n];
    for (row, &g) in kgs.iter().enumerate() {
        let at = &mut counts[g as usize];
        order[*at as usize] = row as u32;
        *at += 1;
    }
    let order = UInt32Array::from(order);
    let sorted = take_record_batch(batch, &order)?;
    let mut parts = vec![];
    for g in 0..groups.count() {
        let (start, end) = (starts[g] as usize, starts[g + 1] as usize);
        if start < end {
            parts.push(Part {
                key_group: g as u32,
                bytes: to_ipc(&sorted.slice(start, end - start))?,
            });
        }
    }
    Ok(parts)
}

/// The key hash Tally's operators compute (and so its key groups).
fn tally_hash(keys: &[ArrayRef], n: usize, hashes: &mut Vec<u64>) -> Result<()> {
    tally_kernels::hash::hash_columns(keys, hashes)?;
    if keys.is_empty() {
        hashes.clear();
        hashes.resize(n, 0);
    }
    Ok(())
}

fn to_ipc(batch: &RecordBatch) -> Result<Vec<u8>> {
    let mut out = vec![];
    let mut w = StreamWriter::try_new(&mut out, &batch.schema())?;
    w.write(batch)?;
    w.finish()?;
    drop(w);
    Ok(out)
}

fn from_ipc(bytes: &[u8]) -> Result<Vec<RecordBatch>> {
    let reader = StreamReader::try_new(bytes, None).map_err(|e| {
        Error::invalid_input(format!(
            "a part from Flink's exchange or state is not Arrow IPC: {e}"
        ))
    })?;
    reader
        .map(|b| {
            b.map_err(|e| {
                Error::invalid_input(format!(
                    "a part from Flink's exchange or state is corrupt: {e}"
                ))
            })
        })
        .collect()
}

/// The rows of a changelog with their kinds as a last Int8 column (a one-phase part).
fn with_kinds(changes: &ChangeBatch) -> Result<RecordBatch> {
    let Some(_) = &changes.op else {
        return Ok(changes.data.clone());
    };
    let codes: Int8Array = changes
        .row_kinds()?
        .iter()
        .map(|k| Some(k.code()))
        .collect();
    let mut fields: Vec<Field> = changes
        .data
        .schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    fields.push(Field::new(KIND_COLUMN, DataType::Int8, false));
    let mut columns = changes.data.columns().to_vec();
    columns.push(Arc::new(codes));
    Ok(RecordBatch::try_new(
        Arc::new(Schema::new(fields)),
        columns,
    )?)
}

fn without_kinds(batch: RecordBatch, input: &SchemaRef) -> Result<ChangeBatch> {
    let n = batch.num_columns();
    let schema = batch.schema();
    let (data, op) = if n > 0 && schema.field(n - 1).name() == KIND_COLUMN {
        let mut b = batch;
        let op = b.remove_column(n - 1);
        (b, Some(op))
    } else {
        (batch, None)
    };
    let data = RecordBatch::try_new(Arc::clone(input), data.columns().to_vec()).map_err(|e| {
        Error::invalid_input(format!(
            "a part from Flink's exchange does not match the input: {e}"
        ))
    })?;
    ChangeBatch::try_new(op, data)
}

/// The phase before Flink's keyed exchange: the per-row stages, then the local phase (or, with
/// one phase, the rows cut by key group).
#[derive(Debug)]
pub struct LocalPhase {
    query: Query,
    local: Option<LocalGroupAggregate>,
    groups: KeyGroups,
    /// Rows folded since the last flush, against the mini-batch size.
    pending: u64,
    size: u64,
    hashes: Vec<u64>,
}

impl LocalPhase {
    /// Takes one column batch from Java; returns the parts that became due (a full mini-batch
    /// flushes the local phase; with one phase every batch is cut at once).
    ///
    /// # Errors
    /// A malformed batch, and evaluation errors.
    pub fn push(&mut self, bytes: &[u8]) -> Result<Vec<Part>> {
        let batch = wire::decode(bytes, &self.query.input)?;
        let aggregate = self.query.aggregate;
        let inputs = map_through(&self.query.stages()[..aggregate], batch)?;
        let mut parts = vec![];
        for b in inputs {
            match &mut self.local {
                Some(local) => {
                    local.push_changes(&b)?;
                    self.pending += b.num_rows() as u64;
                }
                None => {
                    let keys = self.query.plan.calc.evaluate(&b)?.keys;
                    parts.extend(cut_by_key_group(
                        &with_kinds(&b)?,
                        &keys,
                        &self.groups,
                        &mut self.hashes,
                    )?);
                }
            }
        }
        if self.pending >= self.size {
            parts.extend(self.flush()?);
        }
        Ok(parts)
    }

    /// Flushes the local phase (before a checkpoint barrier, at the end of input, on the latency
    /// trigger): one accumulator row per key folded since the last flush, by key group.
    ///
    /// # Errors
    /// When the accumulators cannot be exported (a bug).
    pub fn flush(&mut self) -> Result<Vec<Part>> {
        self.pending = 0;
        let Some(local) = &mut self.local else {
            return Ok(vec![]);
        };
        let Some(batch) = local.flush()? else {
            return Ok(vec![]);
        };
        let k = self.query.plan.key_types.len();
        let keys = batch.columns()[..k].to_vec();
        cut_by_key_group(&batch, &keys, &self.groups, &mut self.hashes)
    }
}

/// The phase after Flink's keyed exchange: the keyed aggregate of one subtask's key groups, then
/// the per-row stages after it.
#[derive(Debug)]
pub struct GlobalPhase {
    query: Query,
    agg: GroupAggregate,
    groups: KeyGroups,
    hashes: Vec<u64>,
}

impl GlobalPhase {
    /// Takes one part from Flink's exchange; returns the changes that became due, each as a
    /// column batch for Java.
    ///
    /// # Errors
    /// A corrupt part, and evaluation errors.
    pub fn push(&mut self, part: &[u8]) -> Result<Vec<Vec<u8>>> {
        let mut out = vec![];
        for batch in from_ipc(part)? {
            let changes = if self.query.two_phase {
                self.agg.push_accumulators(&batch)?
            } else {
                let input = Arc::clone(&self.agg.plan().input_schema);
                self.agg.push_changes(&without_kinds(batch, &input)?)?
            };
            out.extend(changes);
        }
        self.emit(out)
    }

    /// Fires the pending mini-batch if its latency has passed.
    ///
    /// # Errors
    /// As [`GlobalPhase::push`].
    pub fn poll(&mut self) -> Result<Vec<Vec<u8>>> {
        let changes = self.agg.poll()?;
        self.emit(changes)
    }

    /// Fires the pending mini-batch (before a checkpoint barrier, at the end of input).
    ///
    /// # Errors
    /// As [`GlobalPhase::push`].
    pub fn fire(&mut self) -> Result<Vec<Vec<u8>>> {
        let changes = self.agg.finish()?;
        self.emit(changes)
    }

    fn emit(&mut self, changes: Vec<ChangeBatch>) -> Result<Vec<Vec<u8>>> {
        let after = self.query.aggregate + 1;
        let mut out = vec![];
        for c in changes {
            for c in map_through(&self.query.stages()[after..], c)? {
                if c.num_rows() > 0 {
                    out.push(wire::encode(&c)?);
                }
            }
        }
        Ok(out)
    }

    /// The state, one part per key group that holds keys (taken after [`GlobalPhase::fire`]).
    ///
    /// # Errors
    /// A mini-batch still pending.
    pub fn snapshot(&mut self) -> Result<Vec<Part>> {
        let k = self.query.plan.key_types.len();
        let mut by_group: Vec<Vec<RecordBatch>> = vec![];
        for batch in self.agg.snapshot()? {
            let keys = batch.columns()[..k].to_vec();
            for part in cut_by_key_group(&batch, &keys, &self.groups, &mut self.hashes)? {
                let g = part.key_group as usize;
                if by_group.len() <= g {
                    by_group.resize(g + 1, vec![]);
                }
                by_group[g].extend(from_ipc(&part.bytes)?);
            }
        }
        let mut parts = vec![];
        for (g, batches) in by_group.into_iter().enumerate() {
            if batches.is_empty() {
                continue;
            }
            let batch = arrow::compute::concat_batches(&batches[0].schema(), &batches)?;
            parts.push(Part {
                key_group: g as u32,
                bytes: to_ipc(&batch)?,
            });
        }
        Ok(parts)
    }

    /// Loads the parts of the key groups Flink assigned to this subtask (from
    /// [`GlobalPhase::snapshot`] of the same query, at any parallelism).
    ///
    /// # Errors
    /// State of another query, a corrupt part, or an aggregate that already holds state.
    pub fn restore(&mut self, parts: &[&[u8]]) -> Result<()> {
        let mut batches = vec![];
        for p in parts {
            batches.extend(from_ipc(p)?);
        }
        self.agg.restore_snapshot(&batches)
    }

    /// Bytes of keyed state.
    pub fn state_bytes(&self) -> u64 {
        self.agg.metrics().state_bytes
    }
}
