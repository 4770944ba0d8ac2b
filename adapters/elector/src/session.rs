//! The lock-session seam: the I/O the driver performs, behind two small traits.
//!
//! The driver borrows sessions from a [`SessionSource`] (a connection pool), runs statements on
//! them through [`LockSession::query`], and either gives a session back (drops it), takes it
//! out of the pool for good ([`LockSession::detach`], while it carries the lock), or closes it
//! ([`LockSession::close`]). The end of a detached session is an event
//! ([`LockSession::ended`]). Every statement and every reading of its rows is shared code; a
//! backend only moves text rows and classifies its own errors ([`QueryError`]).
//!
//! The default backend is deadpool-postgres over tokio-postgres ([`Config::new`], which builds
//! a [`PoolSessions`]); any other source goes in with [`Config::with_sessions`]. Tests drive
//! the elector against in-memory doubles of these traits, and the simulation wraps the default
//! backend to break it on purpose. Build the pool with
//! [`ObservedConnect`] so that the end of the lock session wakes the elector at once; with
//! deadpool's default connector the elector looks at the client's closed flag every 5 ms.
//!
//! [`Config::new`]: crate::Config::new
//! [`Config::with_sessions`]: crate::Config::with_sessions

#[cfg(feature = "deadpool")]
mod deadpool;
#[cfg(feature = "deadpool")]
mod observed;
mod setup;

use std::fmt;
use std::future::Future;
use std::pin::Pin;

pub use crate::error::CheckError;

#[cfg(feature = "deadpool")]
pub use self::deadpool::PoolSessions;
#[cfg(feature = "deadpool")]
pub use self::deadpool::text_rows;
#[cfg(feature = "deadpool")]
pub use self::observed::{ConnectionEnd, ObservedConnect, SessionEnds, observe_connection};
pub use self::setup::{KeptSetups, LateSetups, Setup};

/// A boxed, sendable future borrowing for `'a`.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// One row of a simple-protocol answer: each column's text, `None` for `NULL`.
pub type Row = Vec<Option<String>>;

/// Why a statement failed, as the backend classifies it.
#[derive(Debug)]
#[non_exhaustive]
pub enum QueryError {
    /// The server's `lock_timeout` ended the statement (SQLSTATE 55P03).
    LockTimeout(CheckError),
    /// The session ended: the connection closed, or the server ended the session (SQLSTATE
    /// class 57P: terminated, shut down, `idle_session_timeout`).
    SessionEnded(CheckError),
    /// Any other failure.
    Failed(CheckError),
}

impl QueryError {
    /// The error, whatever its class.
    pub fn cause(&self) -> &CheckError {
        match self {
            Self::LockTimeout(cause) | Self::SessionEnded(cause) | Self::Failed(cause) => cause,
        }
    }

    /// The error, whatever its class.
    pub fn into_cause(self) -> CheckError {
        match self {
            Self::LockTimeout(cause) | Self::SessionEnded(cause) | Self::Failed(cause) => cause,
        }
    }
}

impl fmt::Display for QueryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.cause().fmt(f)
    }
}

/// Where lock sessions come from: a pool of PostgreSQL sessions.
pub trait SessionSource: std::fmt::Debug + Send + Sync + 'static {
    /// Borrows a session. Dropping the future gives up the borrow; a source may keep work in
    /// progress for its next borrow rather than cancel it (a source built on [`KeptSetups`] keeps
    /// a connection it is setting up, bounded), until [`cancel_kept`](Self::cancel_kept).
    ///
    /// # Errors
    /// The pool's error (unreachable server, refused authentication, pool closed).
    fn acquire(&self) -> BoxFuture<'_, Result<Box<dyn LockSession>, CheckError>>;

    /// Opens a session of its own, outside the pool, for the exclusion proof
    /// ([`plexsphere_leader_core::proof`]): a client connection distinct from every pooled
    /// one, even when the pool holds a single connection, closed when dropped. The proof runs
    /// once a run (and after a lost term), so this costs one short-lived session each time.
    /// The default borrows a second pooled session instead ([`acquire`](Self::acquire)), which
    /// proves a pool of one connection only when it can open another.
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire): the server's refusal (a connection limit, a full
    /// server), an unreachable server.
    fn open_outside_pool(&self) -> BoxFuture<'_, Result<Box<dyn LockSession>, CheckError>> {
        self.acquire()
    }

    /// Cancels what a dropped [`acquire`](Self::acquire) left for the next one. The elector
    /// calls it when it closes the connection it was acquiring (the election stops, is
    /// dropped or panics, or the replica steps down); when it only gives that connection back
    /// (its check timed out, and the next check begins at once), the work is kept. The default
    /// keeps nothing, so it does nothing.
    fn cancel_kept(&self) {}
}

/// One session borrowed from a [`SessionSource`]. Dropping it gives it back to its pool, as it
/// is; a detached session closes instead.
pub trait LockSession: Send + Sync + 'static {
    /// Runs `statement` over the simple query protocol (no parameters, no prepared statement)
    /// and returns the rows of its result. Dropping the future abandons the statement (the
    /// driver then closes the session: its state is unknown).
    ///
    /// # Errors
    /// [`QueryError`], classified by the backend.
    fn query<'a>(&'a self, statement: &'a str) -> BoxFuture<'a, Result<Vec<Row>, QueryError>>;

    /// Takes the session out of its pool for good: it now carries the lock, granted to backend
    /// `backend_pid` (by which a backend may find the session's end signal), and only
    /// [`close`](Self::close) (or dropping it) ends it.
    fn detach(self: Box<Self>, backend_pid: i32) -> Box<dyn LockSession>;

    /// Closes the session without giving it back to the pool; the server ends it and releases
    /// its locks.
    fn close(self: Box<Self>);

    /// Resolves once a detached session has ended on its own (the server closed it, or the
    /// socket broke); never resolves for a session still in its pool's hands. Cancel-safe.
    fn ended(&self) -> BoxFuture<'_, ()>;
}

/// A source that never hands out a session: for tests of the state a running driver would
/// drive, with no driver.
#[cfg(test)]
#[derive(Debug)]
pub(crate) struct NoSessions;

#[cfg(test)]
impl SessionSource for NoSessions {
    fn acquire(&self) -> BoxFuture<'_, Result<Box<dyn LockSession>, CheckError>> {
        Box::pin(std::future::pending())
    }
}
