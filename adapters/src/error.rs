//! Errors of the elector.

use plexsphere_leader_core::IntervalError;

/// Why a check (connection acquire, grant statement, ping, unlock) failed. The election logs it
/// as the cause and carries on; it never contains the DSN or a password.
///
/// Its `Display` is the whole chain of causes (`error connecting to server: Connection refused`,
/// `db error: FATAL: role "x" does not exist`), so a log line says what went wrong; `source()`
/// is therefore `None`, and [`CheckError::db_error`] gives the server's error, if any.
#[derive(Debug)]
pub enum CheckError {
    /// The pool could not hand out a connection (server unreachable, authentication refused, pool
    /// closed or timed out).
    Pool(deadpool_postgres::PoolError),
    /// The statement failed on the server or the connection broke.
    Query(tokio_postgres::Error),
    /// The server answered something other than the one boolean or integer expected (for
    /// example a transaction-mode pooler or a proxy in the way).
    UnexpectedReply {
        /// Which statement.
        statement: &'static str,
        /// What came back.
        detail: String,
    },
}

impl CheckError {
    /// The error the server reported (SQLSTATE, message), if this is one.
    pub fn db_error(&self) -> Option<&tokio_postgres::error::DbError> {
        match self {
            Self::Pool(deadpool_postgres::PoolError::Backend(error)) | Self::Query(error) => {
                error.as_db_error()
            }
            _ => None,
        }
    }
}

impl From<deadpool_postgres::PoolError> for CheckError {
    fn from(error: deadpool_postgres::PoolError) -> Self {
        Self::Pool(error)
    }
}

impl From<tokio_postgres::Error> for CheckError {
    fn from(error: tokio_postgres::Error) -> Self {
        Self::Query(error)
    }
}

impl std::fmt::Display for CheckError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Pool(deadpool_postgres::PoolError::Backend(error)) => {
                f.write_str("new connection: ")?;
                write_chain(f, error)
            }
            Self::Pool(error) => write_chain(f, error),
            Self::Query(error) => write_chain(f, error),
            Self::UnexpectedReply { statement, detail } => {
                write!(f, "unexpected answer to {statement}: {detail}")
            }
        }
    }
}

impl std::error::Error for CheckError {}

/// Writes `error` and each of its sources, `": "`-separated, skipping a source whose text the
/// previous message already contains.
fn write_chain(f: &mut std::fmt::Formatter<'_>, error: &dyn std::error::Error) -> std::fmt::Result {
    let mut previous = error.to_string();
    f.write_str(&previous)?;
    let mut source = error.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !previous.contains(&text) {
            write!(f, ": {text}")?;
        }
        previous = text;
        source = cause.source();
    }
    Ok(())
}

/// An [`Elector`](crate::Elector) could not be built from its [`Config`](crate::Config).
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// `check_interval` is out of range (below 1 ms, or four intervals do not fit
    /// `idle_session_timeout`).
    #[error(transparent)]
    CheckInterval(#[from] IntervalError),
    /// The `plexsphere_background_leader` gauge could not be registered: another collector of a
    /// different kind uses the name, or the registry refused it.
    #[error("registry: cannot register the plexsphere_background_leader gauge: {0}")]
    Metrics(#[source] prometheus::Error),
}

/// Why [`Elector::run`](crate::Elector::run) returned an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RunError {
    /// Another `run` of the same elector is in progress; this call changed nothing.
    #[error("the elector is already running: never run two `run` calls at once")]
    AlreadyRunning,
}
