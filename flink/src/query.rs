//! The query as the Flink operator plans it: Tally's SQL front end over the stream's columns (a
//! table that is never opened: rows come from Flink), at parallelism 1 (each Flink subtask is one
//! worker), with the aggregates found among the planned stages; [`crate::phases`] cuts it into
//! the chain of phases.

use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use tally::config::{SPLIT_AUTO, SPLIT_ENABLED};
use tally::operator::key_groups::{KeyGroups, default_key_groups};
use tally::plan::AggregatePlan;
use tally::sql::{PlannedQuery, Session};
use tally::{Config, Error, Result};

use crate::wire::Type;

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

/// The most rows of one column batch from Java.
pub const MAX_BATCH_ROWS: usize = 4096;

/// How long rows wait in the Java batch with mini-batch off: Flink's default
/// `execution.buffer-timeout.interval`, the time its own network buffers hold records.
pub const UNBATCHED_LATENCY_MS: u64 = 100;

/// One aggregate of the query: where it sits among the stages and how it runs.
#[derive(Debug)]
pub(crate) struct Aggregate {
    /// Its position among the pipeline's stages.
    pub(crate) stage: usize,
    pub(crate) plan: Arc<AggregatePlan>,
    pub(crate) config: Config,
    pub(crate) two_phase: bool,
    /// Split-distinct's FINAL under Flink's incremental aggregate: its local side folds each
    /// firing of the PARTIAL's keyed side into delta accumulators, in the PARTIAL's task (Flink's
    /// `IncrementalGroupAggregate`), and its keyed side merges them.
    pub(crate) incremental: bool,
}

/// A query of GROUP BYs planned over the operator's input columns.
#[derive(Debug)]
pub struct Query {
    planned: PlannedQuery,
    pub(crate) aggregates: Vec<Aggregate>,
    pub(crate) input: SchemaRef,
    /// The input columns the query reads.
    read: Vec<usize>,
    pub(crate) key_groups: usize,
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
    /// Bad SQL or options, a column type that does not cross, and what the operator does not
    /// run inside Flink: a query without an aggregate, the automatic split decision.
    pub fn plan(
        sql: &str,
        table: &str,
        columns: &[Column],
        changelog: bool,
        options: &[(String, String)],
    ) -> Result<Query> {
        if options
            .iter()
            .any(|(k, v)| k == SPLIT_AUTO && v.trim().eq_ignore_ascii_case("true"))
        {
            return Err(Error::config(
                SPLIT_AUTO,
                format!(
                    "decides from a sample of a file source, which a Flink stream is not: set '{SPLIT_ENABLED}' instead"
                ),
            ));
        }
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
            ddl.push_str(&c.ty.name());
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
        if let Some(i) = (0..stages.len()).find(|&i| {
            stages[i].as_aggregate().is_none()
                && stages[i].as_incremental().is_none()
                && !stages[i].per_batch()
        }) {
            return Err(Error::plan(format!(
                "the Tally operator in Flink cannot run this query: stage {i} ({:?}) is neither a GROUP BY nor a per-row stage",
                stages[i]
            )));
        }
        let aggregates: Vec<Aggregate> = stages
            .iter()
            .enumerate()
            .filter_map(|(stage, s)| {
                if let Some(a) = s.as_aggregate() {
                    Some(Aggregate {
                        stage,
                        plan: a.shared_plan(),
                        config: a.config().clone(),
                        two_phase: a.is_two_phase(),
                        incremental: false,
                    })
                } else {
                    s.as_incremental().map(|a| Aggregate {
                        stage,
                        plan: a.shared_plan(),
                        config: a.config().clone(),
                        two_phase: true,
                        incremental: true,
                    })
                }
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

    /// The planned pipeline's stages.
    pub(crate) fn stages(&mut self) -> &[Box<dyn tally::pipeline::Stage>] {
        self.planned.job().pipeline().stages()
    }
}
