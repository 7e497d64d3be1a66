//! The one error type of the engine.
//!
//! An [`Error`] is either a *user* error (bad configuration, bad query, bad input data: the
//! caller can fix it) or an *internal* one (a bug in Tally or a failure underneath it). Both
//! print as one line that names the problem.

use std::fmt;

use arrow::error::ArrowError;

/// The result type of the engine.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An error from Tally. See [`ErrorKind`] for what went wrong.
#[derive(Debug)]
pub struct Error(Box<ErrorKind>);

/// What went wrong.
#[derive(Debug)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A configuration option has an unknown key or a bad value, or options contradict.
    Config {
        /// The option's key.
        key: String,
        /// What is wrong with it.
        message: String,
    },
    /// The query cannot be planned: unknown column, wrong argument type, unsupported function.
    Plan(String),
    /// Input data does not fit the query: wrong schema, bad changelog op code.
    InvalidInput(String),
    /// An input or output file could not be read or written.
    Io(String),
    /// A bug in Tally, or an unexpected failure in a library beneath it.
    Internal(String),
}

impl Error {
    /// The same error with `note` appended to its message (in parentheses).
    pub fn with_note(mut self, note: impl fmt::Display) -> Self {
        let message = match self.0.as_mut() {
            ErrorKind::Config { message, .. }
            | ErrorKind::Plan(message)
            | ErrorKind::InvalidInput(message)
            | ErrorKind::Io(message)
            | ErrorKind::Internal(message) => message,
        };
        message.push_str(&format!(" ({note})"));
        self
    }

    /// The kind of error.
    pub fn kind(&self) -> &ErrorKind {
        &self.0
    }

    /// Whether the caller can fix this (configuration, query or input), as opposed to a bug.
    pub fn is_user_error(&self) -> bool {
        !matches!(*self.0, ErrorKind::Internal(_))
    }

    /// A configuration error for option `key`.
    pub fn config(key: impl Into<String>, message: impl Into<String>) -> Self {
        Self(Box::new(ErrorKind::Config {
            key: key.into(),
            message: message.into(),
        }))
    }

    /// A planning error.
    pub fn plan(message: impl Into<String>) -> Self {
        Self(Box::new(ErrorKind::Plan(message.into())))
    }

    /// An input-data error.
    pub fn invalid_input(message: impl Into<String>) -> Self {
        Self(Box::new(ErrorKind::InvalidInput(message.into())))
    }

    /// A file error.
    pub fn io(message: impl Into<String>) -> Self {
        Self(Box::new(ErrorKind::Io(message.into())))
    }

    /// An internal error (a bug).
    pub fn internal(message: impl Into<String>) -> Self {
        Self(Box::new(ErrorKind::Internal(message.into())))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let one_line = |s: &str| s.replace('\n', " ");
        match &*self.0 {
            ErrorKind::Config { key, message } => {
                write!(f, "config error: '{key}': {}", one_line(message))
            }
            ErrorKind::Plan(m) => write!(f, "plan error: {}", one_line(m)),
            ErrorKind::InvalidInput(m) => write!(f, "invalid input: {}", one_line(m)),
            ErrorKind::Io(m) => write!(f, "i/o error: {}", one_line(m)),
            ErrorKind::Internal(m) => write!(f, "internal error: {}", one_line(m)),
        }
    }
}

impl std::error::Error for Error {}

impl From<ArrowError> for Error {
    /// Arrow errors that reach the engine unclassified come from data (a cast that fails, an
    /// overflow) more often than from bugs; they count as invalid input unless they are I/O.
    fn from(e: ArrowError) -> Self {
        match e {
            ArrowError::IoError(m, _) => Error::io(m),
            ArrowError::ParquetError(m) => Error::io(m),
            other => Error::invalid_input(other.to_string()),
        }
    }
}

impl From<datafusion_common::DataFusionError> for Error {
    fn from(e: datafusion_common::DataFusionError) -> Self {
        use datafusion_common::DataFusionError as D;
        match e {
            D::Internal(m) => Error::internal(m),
            D::ArrowError(a, _) => Error::from(*a),
            D::Context(c, inner) => {
                let inner = Error::from(*inner);
                match *inner.0 {
                    ErrorKind::Internal(m) => Error::internal(format!("{c}: {m}")),
                    ErrorKind::InvalidInput(m) => Error::invalid_input(format!("{c}: {m}")),
                    ErrorKind::Io(m) => Error::io(format!("{c}: {m}")),
                    _ => Error::plan(format!("{c}: {inner}")),
                }
            }
            D::Execution(m) => Error::invalid_input(m),
            other => Error::plan(other.strip_backtrace()),
        }
    }
}

impl From<parquet::errors::ParquetError> for Error {
    fn from(e: parquet::errors::ParquetError) -> Self {
        Error::io(format!("parquet: {e}"))
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::io(e.to_string())
    }
}
