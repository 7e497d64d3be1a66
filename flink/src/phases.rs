//! A query of GROUP BYs planned for Flink's tasks, cut at Flink's keyed exchanges into a chain
//! of [`Phase`]s: phase 0 chained to the upstream task, then one per aggregate, each a keyed
//! operator whose state Flink keeps per key group.
//!
//! Phase 0 runs the per-row stages before the first aggregate (WHERE, projections) and that
//! aggregate's local side; phase k (k >= 1) runs aggregate k's keyed side, the per-row stages
//! after it, and the next aggregate's local side, if any. An aggregate's local side with two
//! phases (mini-batch on, the strategy not `ONE_PHASE`) folds each mini-batch of rows into one
//! accumulator row per key and hands them over per key group, as Flink's
//! `MiniBatchLocalGroupAggFunction`; its keyed side merges them and fires its own mini-batches,
//! as `MiniBatchGlobalGroupAggFunction`. With one phase the local side only cuts the rows by key
//! group and the keyed side is the whole aggregate. A part crosses Flink's exchange as one
//! record: a key group and the Arrow IPC bytes of its rows. A nested aggregate (over another's
//! changelog) is one more phase after one more exchange, keyed by its own keys.
//!
//! The key group of a row is Tally's ([`KeyGroups::of_hash`] of the key hash), over
//! `pipeline.max-parallelism` key groups: the Java side keys each exchange so that Flink's key
//! group of a part is this one, so Flink routes, snapshots and rescales Tally's state per key
//! group.

use std::sync::Arc;

use arrow::array::{ArrayRef, Int8Array, RecordBatch, UInt32Array};
use arrow::compute::take_record_batch;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::ipc::reader::StreamReader;
use arrow::ipc::writer::StreamWriter;
use tally::changelog::ChangeBatch;
use tally::clock::SystemClock;
use tally::config::INCREMENTAL_AGG;
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

/// One aggregate of the query: where it sits among the stages and how it runs.
#[derive(Debug)]
struct Aggregate {
    /// Its position among the pipeline's stages.
    stage: usize,
    plan: Arc<AggregatePlan>,
    config: Config,
    two_phase: bool,
}

/// A query of GROUP BYs planned over the operator's input columns.
#[derive(Debug)]
pub struct Query {
    planned: PlannedQuery,
    aggregates: Vec<Aggregate>,
    input: SchemaRef,
    /// The input columns the query reads.
    read: Vec<usize>,
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
        // Split-distinct's FINAL runs as an aggregate of its own after its own exchange, not as
        // Flink's incremental aggregate (results are the same; see the README).
        if !options.iter().any(|(k, _)| k == INCREMENTAL_AGG) {
            session.set(INCREMENTAL_AGG, "false")?;
        }
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
        if let Some(i) = (0..stages.len())
            .find(|&i| stages[i].as_aggregate().is_none() && !stages[i].per_batch())
        {
            let what = if stages[i].keeps_state() {
                format!(
                    "Flink's incremental aggregate (split-distinct's FINAL fused with its PARTIAL) runs in `tally sql`, not yet inside Flink: leave '{INCREMENTAL_AGG}' unset or 'false' (the FINAL then runs after an exchange of its own)"
                )
            } else {
                format!(
                    "stage {i} ({:?}) is neither a GROUP BY nor a per-row stage",
                    stages[i]
                )
            };
            return Err(Error::plan(format!(
                "the Tally operator in Flink cannot run this query: {what}"
            )));
        }
        let aggregates: Vec<Aggregate> = stages
            .iter()
            .enumerate()
            .filter_map(|(stage, s)| {
                s.as_aggregate().map(|a| Aggregate {
                    stage,
                    plan: a.shared_plan(),
                    config: a.config().clone(),
                    two_phase: a.is_two_phase(),
                })
            })
            .collect();
        let Some(first) = aggregates.first() else {
            return Err(Error::plan(
                "the Tally operator in Flink runs GROUP BY queries; this query has no aggregate",
            ));
        };
        let key_groups = match first.config.max_parallelism {
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
        let read = match planned.job().pipeline().columns_read() {
            Some(set) => set.into_iter().collect(),
            None => (0..input.fields().len()).collect(),
        };
        Ok(Query {
            planned,
            aggregates,
            input,
            read,
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

    /// The input columns (by position) the query reads: the Java side sends only these (the
    /// others arrive as NULLs, which nothing looks at).
    pub fn columns_read(&self) -> &[usize] {
        &self.read
    }

    /// The phases of the chain: one before the first exchange, one per aggregate.
    pub fn phases(&self) -> usize {
        self.aggregates.len() + 1
    }

    /// Whether each aggregate runs in two phases (a local side before its exchange).
    pub fn two_phase(&self) -> Vec<bool> {
        self.aggregates.iter().map(|a| a.two_phase).collect()
    }

    /// Rows the Java side gathers into one column batch before crossing into Rust: the first
    /// aggregate's mini-batch size (at most [`MAX_BATCH_ROWS`]), or [`MAX_BATCH_ROWS`] with
    /// mini-batch off.
    pub fn batch_rows(&self) -> usize {
        let config = &self.aggregates[0].config;
        if config.mini_batch_enabled {
            usize::try_from(config.mini_batch_size)
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
        let config = &self.aggregates[0].config;
        if config.mini_batch_enabled {
            (config.mini_batch_allow_latency.as_millis() as u64).max(1)
        } else {
            UNBATCHED_LATENCY_MS
        }
    }

    /// Phase `k` of the chain (0 before the first exchange; k >= 1 after exchange k).
    ///
    /// # Errors
    /// No such phase, or an operator that cannot be built.
    pub fn into_phase(mut self, k: usize) -> Result<Phase> {
        if k >= self.phases() {
            return Err(Error::invalid_input(format!(
                "this query has phases 0 to {}, not {k}",
                self.phases() - 1
            )));
        }
        let groups = KeyGroups::new(self.key_groups, 1)?;
        let clock = Arc::new(SystemClock);
        let keyed = match k.checked_sub(1).map(|i| &self.aggregates[i]) {
            None => None,
            Some(a) if a.two_phase => Some(Keyed::Merge(GroupAggregate::try_new_global(
                Arc::clone(&a.plan),
                a.config.clone(),
                clock,
            )?)),
            Some(a) => Some(Keyed::Rows(GroupAggregate::try_new(
                Arc::clone(&a.plan),
                a.config.clone(),
                clock,
            )?)),
        };
        let from = k.checked_sub(1).map_or(0, |i| self.aggregates[i].stage + 1);
        let stages_len = self.planned_stages_len();
        let next = match self.aggregates.get(k) {
            None => Next::Rows,
            Some(a) => Next::Parts(Box::new(LocalSide {
                local: if a.two_phase {
                    Some(LocalGroupAggregate::try_new(Arc::clone(&a.plan))?)
                } else {
                    None
                },
                plan: Arc::clone(&a.plan),
                pending: 0,
                size: u64::try_from(a.config.mini_batch_size).unwrap_or(1).max(1),
            })),
        };
        let to = self.aggregates.get(k).map_or(stages_len, |a| a.stage);
        Ok(Phase {
            query: self,
            keyed,
            stages: from..to,
            next,
            groups,
            hashes: vec![],
        })
    }

    fn planned_stages_len(&mut self) -> usize {
        self.stages().len()
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

/// What a phase's keyed side takes from its exchange.
#[derive(Debug)]
enum Keyed {
    /// Accumulator rows of a two-phase aggregate's local sides.
    Merge(GroupAggregate),
    /// Rows (with their kinds) of a one-phase aggregate.
    Rows(GroupAggregate),
}

impl Keyed {
    fn agg(&self) -> &GroupAggregate {
        match self {
            Keyed::Merge(a) | Keyed::Rows(a) => a,
        }
    }

    fn agg_mut(&mut self) -> &mut GroupAggregate {
        match self {
            Keyed::Merge(a) | Keyed::Rows(a) => a,
        }
    }
}

/// The local side of the next aggregate: a local phase, or with one phase the rows themselves,
/// cut by key group.
#[derive(Debug)]
struct LocalSide {
    local: Option<LocalGroupAggregate>,
    plan: Arc<AggregatePlan>,
    /// Rows folded since the last flush, against the mini-batch size.
    pending: u64,
    size: u64,
}

/// Where a phase's output goes.
#[derive(Debug)]
enum Next {
    /// Into the next exchange, as parts.
    Parts(Box<LocalSide>),
    /// Out of the chain, as column batches of changes for Java.
    Rows,
}

/// What a phase hands on: parts for the next exchange, or column batches of the result's
/// changes (the last phase).
#[derive(Debug, Default)]
pub struct Output {
    /// Parts for the next exchange.
    pub parts: Vec<Part>,
    /// Column batches of changes ([`crate::wire`]).
    pub rows: Vec<Vec<u8>>,
}

/// One link of the chain: phase 0 takes column batches from Java; a later phase takes parts
/// from its exchange into its keyed aggregate. Each runs the per-row stages up to the next
/// aggregate and that aggregate's local side, or, the last, emits the result's changes.
#[derive(Debug)]
pub struct Phase {
    query: Query,
    keyed: Option<Keyed>,
    stages: std::ops::Range<usize>,
    next: Next,
    groups: KeyGroups,
    hashes: Vec<u64>,
}

impl Phase {
    /// Whether it is a keyed phase (after an exchange), which takes parts and keeps state.
    pub fn is_keyed(&self) -> bool {
        self.keyed.is_some()
    }

    /// Takes one column batch from Java (phase 0) or one part from the exchange (a later
    /// phase); returns what became due.
    ///
    /// # Errors
    /// A malformed batch or corrupt part, and evaluation errors.
    pub fn push(&mut self, bytes: &[u8]) -> Result<Output> {
        let changes = match &mut self.keyed {
            None => vec![wire::decode(bytes, &self.query.input)?],
            Some(keyed) => {
                let mut out = vec![];
                for batch in from_ipc(bytes)? {
                    out.extend(match keyed {
                        Keyed::Merge(agg) => agg.push_accumulators(&batch)?,
                        Keyed::Rows(agg) => {
                            let input = Arc::clone(&agg.plan().input_schema);
                            agg.push_changes(&without_kinds(batch, &input)?)?
                        }
                    });
                }
                out
            }
        };
        let mut out = Output::default();
        self.forward(changes, &mut out)?;
        self.flush_if_due(&mut out)?;
        Ok(out)
    }

    /// Fires the keyed side's pending mini-batch if its latency has passed.
    ///
    /// # Errors
    /// As [`Phase::push`].
    pub fn poll(&mut self) -> Result<Output> {
        let mut out = Output::default();
        if let Some(keyed) = &mut self.keyed {
            let changes = keyed.agg_mut().poll()?;
            self.forward(changes, &mut out)?;
            self.flush_if_due(&mut out)?;
        }
        Ok(out)
    }

    /// Fires everything pending (before a checkpoint barrier, at the end of input, on the
    /// latency trigger): the keyed side's mini-batch, then the next local side's accumulators.
    ///
    /// # Errors
    /// As [`Phase::push`].
    pub fn flush(&mut self) -> Result<Output> {
        let mut out = Output::default();
        if let Some(keyed) = &mut self.keyed {
            let changes = keyed.agg_mut().finish()?;
            self.forward(changes, &mut out)?;
        }
        self.flush_local(&mut out)?;
        Ok(out)
    }

    /// Changes through the per-row stages, into the next local side or out as rows.
    fn forward(&mut self, changes: Vec<ChangeBatch>, out: &mut Output) -> Result<()> {
        let range = self.stages.clone();
        for c in changes {
            for b in map_through(&self.query.stages()[range.clone()], c)? {
                match &mut self.next {
                    Next::Rows => {
                        if b.num_rows() > 0 {
                            out.rows.push(wire::encode(&b)?);
                        }
                    }
                    Next::Parts(side) => match &mut side.local {
                        Some(local) => {
                            local.push_changes(&b)?;
                            side.pending += b.num_rows() as u64;
                        }
                        None => {
                            let keys = side.plan.calc.evaluate(&b)?.keys;
                            out.parts.extend(cut_by_key_group(
                                &with_kinds(&b)?,
                                &keys,
                                &self.groups,
                                &mut self.hashes,
                            )?);
                        }
                    },
                }
            }
        }
        Ok(())
    }

    fn flush_if_due(&mut self, out: &mut Output) -> Result<()> {
        if matches!(&self.next, Next::Parts(side) if side.pending >= side.size) {
            self.flush_local(out)?;
        }
        Ok(())
    }

    fn flush_local(&mut self, out: &mut Output) -> Result<()> {
        let Next::Parts(side) = &mut self.next else {
            return Ok(());
        };
        side.pending = 0;
        let Some(local) = &mut side.local else {
            return Ok(());
        };
        let Some(batch) = local.flush()? else {
            return Ok(());
        };
        let k = side.plan.key_types.len();
        let keys = batch.columns()[..k].to_vec();
        out.parts.extend(cut_by_key_group(
            &batch,
            &keys,
            &self.groups,
            &mut self.hashes,
        )?);
        Ok(())
    }

    /// The keyed state, one part per key group that holds keys (taken after
    /// [`Phase::flush`]); nothing for phase 0, which keeps none.
    ///
    /// # Errors
    /// A mini-batch still pending.
    pub fn snapshot(&mut self) -> Result<Vec<Part>> {
        let Some(keyed) = &self.keyed else {
            return Ok(vec![]);
        };
        let agg = keyed.agg();
        let k = agg.plan().key_types.len();
        let mut by_group: Vec<Vec<RecordBatch>> = vec![];
        for batch in agg.snapshot()? {
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
    /// [`Phase::snapshot`] of the same phase of the same query, at any parallelism).
    ///
    /// # Errors
    /// Phase 0 (it keeps no state), state of another query, a corrupt part, or an aggregate
    /// that already holds state.
    pub fn restore(&mut self, parts: &[&[u8]]) -> Result<()> {
        let Some(keyed) = &mut self.keyed else {
            return if parts.is_empty() {
                Ok(())
            } else {
                Err(Error::invalid_input(
                    "the phase before the first exchange keeps no state to restore",
                ))
            };
        };
        let mut batches = vec![];
        for p in parts {
            batches.extend(from_ipc(p)?);
        }
        keyed.agg_mut().restore_snapshot(&batches)
    }

    /// Bytes of keyed state.
    pub fn state_bytes(&self) -> u64 {
        self.keyed
            .as_ref()
            .map_or(0, |k| k.agg().metrics().state_bytes)
    }
}
