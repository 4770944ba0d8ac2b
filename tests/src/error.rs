//! The harness's error type.

use std::process::ExitStatus;
use std::time::Duration;

/// Why a harness operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HarnessError {
    /// A connection to PostgreSQL or a query on it failed.
    #[error("postgres: {0}")]
    Postgres(#[from] tokio_postgres::Error),
    /// A socket, file or process-spawn operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What the harness was doing.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// Building a `deadpool_postgres::Pool` failed.
    #[error("build pool: {0}")]
    Pool(#[from] deadpool_postgres::BuildError),
    /// An external program (`initdb`, `pg_ctl`, `pg_basebackup`, …) exited unsuccessfully.
    #[error("{program} exited with {status}: {stderr}")]
    Command {
        /// The program and its arguments.
        program: String,
        /// Its exit status.
        status: ExitStatus,
        /// The tail of what it wrote to stderr (and stdout).
        stderr: String,
    },
    /// A setup the harness cannot build (for example an sqlx pool on several hosts).
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// Something the harness waited for did not happen in time.
    #[error("timed out after {after:?} waiting for {what}")]
    Timeout {
        /// What the harness waited for.
        what: String,
        /// How long it waited.
        after: Duration,
    },
    /// A setting (DSN, environment, name) is not usable.
    #[error("invalid {what}: {detail}")]
    Invalid {
        /// Which setting.
        what: &'static str,
        /// Why it is not usable.
        detail: String,
    },
}

impl HarnessError {
    /// Wraps an I/O error with what the harness was doing.
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io {
            context: context.into(),
            source,
        }
    }
}
