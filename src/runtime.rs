//! The worker pool the parallel stages run on.
//!
//! A [`Runtime`] owns a rayon thread pool of `parallelism` threads (none for a parallelism of 1,
//! where every task runs inline on the caller's thread). Stages hand it one task per slice or per
//! worker and wait for all of them: a barrier per step, which keeps results deterministic for a
//! given input and configuration.

use std::sync::Arc;

use rayon::prelude::*;

use crate::error::{Error, Result};

/// A pool of `parallelism` workers.
#[derive(Debug)]
pub struct Runtime {
    parallelism: usize,
    pool: Option<rayon::ThreadPool>,
}

impl Runtime {
    /// A runtime with `parallelism` workers (at least 1).
    ///
    /// # Errors
    /// When the operating system refuses the threads.
    pub fn new(parallelism: usize) -> Result<Arc<Self>> {
        let parallelism = parallelism.max(1);
        let pool = if parallelism > 1 {
            Some(
                rayon::ThreadPoolBuilder::new()
                    .num_threads(parallelism)
                    .thread_name(|i| format!("tally-worker-{i}"))
                    .build()
                    .map_err(|e| {
                        Error::internal(format!("cannot start {parallelism} worker threads: {e}"))
                    })?,
            )
        } else {
            None
        };
        Ok(Arc::new(Self { parallelism, pool }))
    }

    /// The number of workers.
    pub fn parallelism(&self) -> usize {
        self.parallelism
    }

    /// Runs `f` on a worker of the pool (inline without a pool). Work that calls
    /// [`Runtime::map`] many times runs inside one `install`, so that its tasks are forked from a
    /// worker (cheap work stealing) rather than injected from outside and waited for on a lock,
    /// which costs a thread wake-up per call.
    pub fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        match &self.pool {
            Some(pool) => pool.install(f),
            None => f(),
        }
    }

    /// Runs `f` on every item, one task each, and returns the results in item order.
    pub fn map<T, R, F>(&self, items: Vec<T>, f: F) -> Vec<R>
    where
        T: Send,
        R: Send,
        F: Fn(T) -> R + Sync + Send,
    {
        match &self.pool {
            Some(pool) if items.len() > 1 => {
                pool.install(|| items.into_par_iter().with_max_len(1).map(f).collect())
            }
            _ => items.into_iter().map(f).collect(),
        }
    }
}
