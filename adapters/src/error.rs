//! Errors of the elector.

use plexsphere_leader_core::IntervalError;

/// Why a check (connection acquire, grant statement, ping, unlock) failed. The election logs it
/// as the cause and carries on; it never contains the DSN or a password.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// The pool could not hand out a connection (server unreachable, authentication refused, pool
    /// closed or timed out).
    #[error("{0}")]
    Pool(#[from] deadpool_postgres::PoolError),
    /// The statement failed on the server or the connection broke.
    #[error("{0}")]
    Query(#[from] tokio_postgres::Error),
    /// The server answered something other than the one boolean or integer expected (for
    /// example a transaction-mode pooler or a proxy in the way).
    #[error("unexpected answer to {statement}: {detail}")]
    UnexpectedReply {
        /// Which statement.
        statement: &'static str,
        /// What came back.
        detail: String,
    },
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
