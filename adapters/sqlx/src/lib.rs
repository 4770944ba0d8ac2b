//! The sqlx backend of [plexsphere-leader](plexsphere_leader): the same elector, the same core and
//! the same statements, with the lock sessions taken from an `sqlx::PgPool` instead of a
//! deadpool-postgres pool, so an sqlx service needs no second pool and no second driver.
//!
//! **One bound differs from the default backend: a leader whose lock session the server ended
//! while it sat idle (`pg_terminate_backend`, `idle_session_timeout`, a server restart) learns
//! of it only at its next check, up to one check interval later** (5 s by default), while a
//! standby may already lead: two replicas then believe they lead for up to one interval. sqlx
//! reads a connection only while a statement runs, and its one reader of idle connections
//! (`PgListener`) returns its connection to the pool when dropped, which must never happen to a
//! session carrying the lock; with deadpool-postgres and `ObservedConnect` the leader learns
//! within milliseconds. Guard writes that must not overlap with fencing
//! ([`fencing::check`]), or shorten the interval.
//!
//! This crate re-exports plexsphere-leader whole (without its deadpool-postgres backend), so an
//! sqlx service depends on it alone:
//!
//! ```no_run
//! use plexsphere_leader_sqlx::{CancellationToken, Elector};
//!
//! # async fn embed(shutdown: CancellationToken) -> Result<(), Box<dyn std::error::Error>> {
//! let pool = sqlx::postgres::PgPoolOptions::new()
//!     .max_connections(4)
//!     .connect("postgres://postgres@127.0.0.1/app")
//!     .await?;
//! let elector = Elector::new(plexsphere_leader_sqlx::config(pool))?;
//! let election = tokio::spawn({
//!     let (elector, shutdown) = (elector.clone(), shutdown.clone());
//!     async move { elector.run(shutdown).await }
//! });
//! while let Ok(term) = elector.next_term(&shutdown).await {
//!     // ... the leader's work, until term.cancelled() ...
//!     let why = term.ended().await;
//!     println!("term {} ended: {why}", term.id());
//! }
//! election.await??;
//! # Ok(()) }
//! ```
//!
//! How it maps onto sqlx: a check borrows a `sqlx::pool::PoolConnection` (dropping it gives it
//! back); the session that carries the lock leaves the pool with `PoolConnection::detach` (the
//! pool may open a replacement), and closing it drops the connection, which closes its socket:
//! the server ends the session and releases the lock. Every statement runs over the simple
//! query protocol (`sqlx::raw_sql`), as with tokio-postgres, so it also passes through a
//! session-mode pooler.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod fencing;
pub mod floor;
pub mod lease;

/// Everything of plexsphere-leader, so that an sqlx service depends on this crate alone (and
/// compiles no deadpool-postgres): `Elector`, `Config`, `Term`, `CancellationToken`, … This
/// crate's own [`fencing`], [`floor`] and [`lease`] take the place of the tokio-postgres ones.
#[doc(no_inline)]
pub use plexsphere_leader::*;

use std::fmt;

use plexsphere_leader::session::{
    BoxFuture, CheckError, KeptSetups, LateSetups, LockSession, QueryError, Row, SessionSource,
    Setup,
};
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnection, PgPool, PgRow};
use sqlx::{Postgres, Row as _, ValueRef as _};
use tokio::sync::Mutex;

/// A configuration with the spec's defaults whose lock sessions come from `pool`: the sqlx
/// counterpart of plexsphere-leader's `Config::new` (its deadpool-postgres backend, which this
/// crate leaves out). Chain the other settings on it as usual.
///
/// ```no_run
/// use std::time::Duration;
/// use plexsphere_leader::Elector;
///
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// let pool = sqlx::PgPool::connect("postgres://app@db/app").await?; // the service's own pool
/// let config = plexsphere_leader_sqlx::config(pool).check_interval(Duration::from_secs(2));
/// let elector = Elector::new(config)?;
/// # let _ = elector; Ok(()) }
/// ```
pub fn config(pool: PgPool) -> Config {
    Config::with_sessions(PgPoolSessions::new(pool))
}

/// An sqlx `PgPool` as the elector's [`SessionSource`].
///
/// As with the default backend, a connection the pool is still setting up when the check that
/// asked for it gives up is not cancelled: it is kept ([`KeptSetups`]) and the next check, which
/// begins at once, resumes it ([`late_setups`](Self::late_setups) counts them), within the same
/// bounds. Without that, a setup slower than one check interval (a slow network, many replicas
/// starting at once at a short interval) would be begun and cancelled at every check, and the
/// elector would never lead.
#[derive(Clone)]
pub struct PgPoolSessions {
    pool: PgPool,
    /// The checkout a check gave up on, with whether the pool had to open a connection for it.
    setups: KeptSetups<(PoolConnection<Postgres>, bool), sqlx::Error>,
    /// The exclusion proof's connection outside the pool that a proof gave up on.
    outside: KeptSetups<PgConnection, sqlx::Error>,
}

impl PgPoolSessions {
    /// The sessions of `pool`.
    pub fn new(pool: PgPool) -> Self {
        Self {
            pool,
            setups: KeptSetups::new(),
            outside: KeptSetups::new(),
        }
    }

    /// The pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// What became, so far, of the connection setups a check gave up on (shared by the clones):
    /// each was kept for the next acquire instead of being cancelled.
    pub fn late_setups(&self) -> LateSetups {
        self.setups.counts()
    }
}

impl fmt::Debug for PgPoolSessions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgPoolSessions")
            .field("size", &self.pool.size())
            .field(
                "max_connections",
                &self.pool.options().get_max_connections(),
            )
            .finish()
    }
}

/// How long an acquire that must open a connection waits before it asks the network why not:
/// longer than a local connection takes, shorter than any check interval (50 ms at least).
const PROBE_AFTER: std::time::Duration = std::time::Duration::from_millis(10);

/// How long such an acquire waits before it asks the server itself, with a session of its own,
/// why not ([`refusal`]): longer than a new session to a healthy server takes (a few
/// milliseconds locally, tens to a busy one), so that a healthy pool is never probed this way;
/// checks at intervals up to this long get no answer instead of the server's reason.
const SESSION_PROBE_AFTER: std::time::Duration = std::time::Duration::from_millis(100);

impl SessionSource for PgPoolSessions {
    fn acquire(&self) -> BoxFuture<'_, Result<Box<dyn LockSession>, CheckError>> {
        Box::pin(async move {
            let pool = self.pool.clone();
            let begin = move || -> Setup<_, _> {
                Box::pin(async move {
                    let new = pool.num_idle() == 0;
                    pool.acquire().await.map(|connection| (connection, new))
                })
            };
            let checkout = self.setups.run(begin, |(_, new)| *new);
            // sqlx's pool retries a refused connection silently until its acquire timeout, so
            // the check would only say it got no answer: when the pool must open a connection,
            // a probe of the server reports why it cannot ([`refusal`]).
            let (connection, _) = if self.pool.num_idle() > 0 {
                checkout.await
            } else {
                let probed = tokio::select! {
                    biased;
                    connection = checkout => Ok(connection),
                    refused = refusal(&self.pool) => Err(refused),
                };
                match probed {
                    Ok(connection) => connection,
                    Err(refused) => {
                        // The server said why it takes no connection: the setup it refused is
                        // not kept (sqlx would go on retrying it in a growing backoff), so the
                        // next check begins a new one, as with the default backend.
                        self.setups.cancel();
                        return Err(refused);
                    }
                }
            }
            .map_err(check_error)?;
            Ok(Box::new(PgSession {
                connection: Mutex::new(Connection::Pooled(connection)),
            }) as Box<dyn LockSession>)
        })
    }

    /// A connection of the pool's connect options, never counted in the pool nor given to it.
    /// A setup the proof gives up on is kept for the next proof, as a pooled one is.
    fn open_outside_pool(&self) -> BoxFuture<'_, Result<Box<dyn LockSession>, CheckError>> {
        Box::pin(async move {
            let connection = self
                .outside
                .run(
                    || {
                        let options = self.pool.connect_options();
                        Box::pin(async move { sqlx::ConnectOptions::connect(&*options).await })
                    },
                    |_| true,
                )
                .await
                .map_err(check_error)?;
            Ok(Box::new(PgSession {
                connection: Mutex::new(Connection::Detached(connection)),
            }) as Box<dyn LockSession>)
        })
    }

    fn cancel_kept(&self) {
        self.setups.cancel();
        self.outside.cancel();
    }
}

/// Resolves with the reason the pool's server does not take a new connection, as far as a
/// probe can tell; never resolves when it does (the pool's own acquire then goes on):
///
/// - [`PROBE_AFTER`] from now, a plain connect to its address (TCP, or its Unix socket): a
///   refused or unreachable address is the reason. The connection is closed before any
///   startup message, so the server logs nothing.
/// - [`SESSION_PROBE_AFTER`] from now, when the address accepts but the pool still has no
///   connection, a session of the probe's own: sqlx's pool retries, until its acquire timeout
///   and without saying why, a refusal it takes for transient (`too many clients`, SQLSTATE
///   class 53; the server starting up, 57P03), so the check would only say it got no answer.
///   The server's refusal is the reason; a session it accepts is closed at once.
async fn refusal(pool: &PgPool) -> CheckError {
    let began = tokio::time::Instant::now();
    tokio::time::sleep(PROBE_AFTER).await;
    let options = pool.connect_options();
    let (host, port) = (options.get_host().to_owned(), options.get_port());
    let socket = options
        .get_socket()
        .map(|dir| dir.display().to_string())
        .or_else(|| host.starts_with('/').then(|| host.clone()));
    let refused = match socket {
        #[cfg(unix)]
        Some(dir) => {
            let path = format!("{dir}/.s.PGSQL.{port}");
            tokio::net::UnixStream::connect(&path)
                .await
                .err()
                .map(|error| format!("connect to {path}: {error}"))
        }
        #[cfg(not(unix))]
        Some(_) => None,
        None => tokio::net::TcpStream::connect((host.as_str(), port))
            .await
            .err()
            .map(|error| format!("connect to {host}:{port}: {error}")),
    };
    if let Some(text) = refused {
        return CheckError::backend(text, None);
    }
    tokio::time::sleep_until(began + SESSION_PROBE_AFTER).await;
    match sqlx::ConnectOptions::connect(&*options).await {
        Err(error) if error.as_database_error().is_some() => check_error(error),
        Ok(session) => {
            let _closed = sqlx::Connection::close(session).await;
            std::future::pending().await
        }
        // Anything else (a broken socket, TLS) is the pool's to report.
        Err(_) => std::future::pending().await,
    }
}

/// One session: borrowed from the pool, or detached from it while it carries the lock.
struct PgSession {
    /// One statement at a time: the driver never runs two on one session.
    connection: Mutex<Connection>,
}

enum Connection {
    Pooled(PoolConnection<Postgres>),
    Detached(PgConnection),
}

impl Connection {
    fn get(&mut self) -> &mut PgConnection {
        match self {
            Self::Pooled(connection) => connection,
            Self::Detached(connection) => connection,
        }
    }
}

impl LockSession for PgSession {
    fn query<'a>(&'a self, statement: &'a str) -> BoxFuture<'a, Result<Vec<Row>, QueryError>> {
        Box::pin(async move {
            let mut connection = self.connection.lock().await;
            let rows = run(connection.get(), statement).await.map_err(classify)?;
            rows.iter()
                .map(text_row)
                .collect::<Result<_, _>>()
                .map_err(QueryError::Failed)
        })
    }

    fn detach(self: Box<Self>, _backend_pid: i32) -> Box<dyn LockSession> {
        let connection = match self.connection.into_inner() {
            Connection::Pooled(connection) => Connection::Detached(connection.detach()),
            detached @ Connection::Detached(_) => detached,
        };
        Box::new(PgSession {
            connection: Mutex::new(connection),
        })
    }

    fn close(self: Box<Self>) {
        // Dropping a connection closes its socket; the server then ends the session and
        // releases its locks. A pooled one is detached first so that it never goes back.
        match self.connection.into_inner() {
            Connection::Pooled(connection) => drop(connection.detach()),
            Connection::Detached(connection) => drop(connection),
        }
    }

    fn ended(&self) -> BoxFuture<'_, ()> {
        // sqlx reads a connection only while a statement runs: no end signal (see the crate
        // docs); the next check finds the end.
        Box::pin(std::future::pending())
    }
}

/// Runs `statement` over the simple query protocol.
fn run<'c>(
    connection: &'c mut PgConnection,
    statement: &'c str,
) -> BoxFuture<'c, Result<Vec<PgRow>, sqlx::Error>> {
    // A `&str` without arguments goes over the simple query protocol (sqlx's `run` sends a
    // `Query` message when there are no arguments), as `sqlx::raw_sql` would.
    sqlx::Executor::fetch_all(connection, statement)
}

/// Each column of `row` as text (the simple query protocol answers in text), `None` for NULL.
fn text_row(row: &PgRow) -> Result<Row, CheckError> {
    (0..row.len())
        .map(|index| {
            let value = row.try_get_raw(index).map_err(check_error)?;
            if value.is_null() {
                return Ok(None);
            }
            value
                .as_str()
                .map(|text| Some(text.to_owned()))
                .map_err(|error| CheckError::backend(error, None))
        })
        .collect()
}

/// The error as the elector's [`CheckError`], with the server's SQLSTATE if it reported one.
fn check_error(error: sqlx::Error) -> CheckError {
    let sqlstate = error
        .as_database_error()
        .and_then(|db| db.code())
        .map(|code| code.into_owned());
    CheckError::backend(error, sqlstate)
}

/// Sorts an sqlx error into the classes the driver tells apart: `lock_timeout` (55P03), the
/// session's end (the socket broke, or the server ended the session: SQLSTATE class 57P), and
/// everything else.
fn classify(error: sqlx::Error) -> QueryError {
    let broken = matches!(error, sqlx::Error::Io(_) | sqlx::Error::Protocol(_));
    let cause = check_error(error);
    match cause.sqlstate() {
        Some("55P03") => QueryError::LockTimeout(cause),
        Some(code) if code.starts_with("57P") => QueryError::SessionEnded(cause),
        _ if broken => QueryError::SessionEnded(cause),
        _ => QueryError::Failed(cause),
    }
}

/// Compiles the package README's example.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeExample;
