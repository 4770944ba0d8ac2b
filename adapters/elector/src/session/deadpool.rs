//! The default backend: deadpool-postgres sessions over tokio-postgres.

use std::time::Duration;

use deadpool::managed::Manager as _;
use deadpool_postgres::{ClientWrapper, Object, Pool, PoolError};
use tokio_postgres::SimpleQueryMessage;
use tokio_postgres::error::SqlState;
use tokio_util::sync::CancellationToken;

use super::setup::{KeptSetups, LateSetups};
use super::{BoxFuture, LockSession, QueryError, Row, SessionEnds, SessionSource};
use crate::error::CheckError;

/// How often a detached session of a pool not built with
/// [`ObservedConnect`](super::ObservedConnect) looks at its client's closed flag:
/// deadpool-postgres's default connector keeps the connection task to itself, so its end
/// cannot be awaited; this poll costs one timer wake-up per period on the leader only.
const SESSION_WATCH_PERIOD: Duration = Duration::from_millis(5);

/// A deadpool-postgres pool as a [`SessionSource`]: what [`Config::new`](crate::Config::new)
/// builds. A lock session is taken out of the pool with `deadpool_postgres::Object::take`
/// while it carries the lock; its end wakes the elector at once when the pool's connector is an
/// [`ObservedConnect`](super::ObservedConnect) registering in the same [`SessionEnds`], and
/// within 5 ms otherwise.
///
/// A connection the pool is still setting up when the check that asked for it gives up is not
/// cancelled: it is kept, and the next check, which begins at once, resumes it
/// ([`late_setups`](Self::late_setups) counts them). At most one is kept per `PoolSessions` and
/// its clones; it is cancelled when the elector closes the connection it was acquiring
/// ([`cancel_kept`](SessionSource::cancel_kept): the run stops, or the replica steps down),
/// once it has run for twice the longer of that check's wait and the last new connection's
/// setup (at least 100 ms; 2 s before the first connection), or when the last clone is dropped.
/// So a cold start of many electors converges at short check intervals, and no backend is
/// forked for an attempt thrown away.
#[derive(Clone)]
pub struct PoolSessions {
    pool: Pool,
    ends: SessionEnds,
    setups: KeptSetups<Object, PoolError>,
    /// The exclusion proof's session outside the pool, kept like a pooled setup when its
    /// proof gives up on it, so that a link slower to connect than half an interval is
    /// proven at a later check.
    outside: KeptSetups<ClientWrapper, deadpool_postgres::tokio_postgres::Error>,
}

impl PoolSessions {
    /// The sessions of `pool`, whose connection ends (if its connector is an
    /// [`ObservedConnect::new`](super::ObservedConnect::new)) are registered in
    /// [`SessionEnds::global`].
    pub fn new(pool: Pool) -> Self {
        Self {
            pool,
            ends: SessionEnds::global(),
            setups: KeptSetups::new(),
            outside: KeptSetups::new(),
        }
    }

    /// Where the pool's connector registers its connections' ends: only a pool built with
    /// [`ObservedConnect::with_ends`](super::ObservedConnect::with_ends) needs it, with the
    /// same registry.
    #[must_use]
    pub fn session_ends(mut self, ends: SessionEnds) -> Self {
        self.ends = ends;
        self
    }

    /// The pool.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// What became, so far, of the connection setups a check gave up on (shared by the clones):
    /// each was kept for the next acquire instead of being cancelled.
    pub fn late_setups(&self) -> LateSetups {
        self.setups.counts()
    }
}

impl std::fmt::Debug for PoolSessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolSessions")
            .field("max_size", &self.pool.status().max_size)
            .finish_non_exhaustive()
    }
}

impl SessionSource for PoolSessions {
    fn acquire(&self) -> BoxFuture<'_, Result<Box<dyn LockSession>, CheckError>> {
        Box::pin(async move {
            let object = self
                .setups
                .run(
                    || {
                        let pool = self.pool.clone();
                        Box::pin(async move { pool.get().await })
                    },
                    // New, made by this setup: one the pool had ready was recycled first.
                    |object| Object::metrics(object).recycle_count == 0,
                )
                .await?;
            let session = PgSession::Pooled(object, self.ends.clone());
            Ok(Box::new(session) as Box<dyn LockSession>)
        })
    }

    /// A new client of the pool's manager (its configuration and connector), never counted
    /// in the pool nor given to it. A setup the proof gives up on is kept for the next proof,
    /// as a pooled one is.
    fn open_outside_pool(&self) -> BoxFuture<'_, Result<Box<dyn LockSession>, CheckError>> {
        Box::pin(async move {
            let client = self
                .outside
                .run(
                    || {
                        let pool = self.pool.clone();
                        Box::pin(async move { pool.manager().create().await })
                    },
                    |_| true,
                )
                .await
                .map_err(|error| CheckError::from(PoolError::Backend(error)))?;
            Ok(Box::new(PgSession::Detached(client, None)) as Box<dyn LockSession>)
        })
    }

    fn cancel_kept(&self) {
        self.setups.cancel();
        self.outside.cancel();
    }
}

/// A deadpool-postgres session: borrowed (dropping it returns it), or taken out of the pool,
/// with the end signal of its connection when the pool observes its connections.
enum PgSession {
    Pooled(Object, SessionEnds),
    Detached(ClientWrapper, Option<CancellationToken>),
}

impl PgSession {
    fn client(&self) -> &tokio_postgres::Client {
        match self {
            Self::Pooled(object, _) => object,
            Self::Detached(client, _) => client,
        }
    }
}

impl LockSession for PgSession {
    fn query<'a>(&'a self, statement: &'a str) -> BoxFuture<'a, Result<Vec<Row>, QueryError>> {
        Box::pin(async move {
            let messages = self
                .client()
                .simple_query(statement)
                .await
                .map_err(classify)?;
            text_rows(messages).map_err(QueryError::Failed)
        })
    }

    fn detach(self: Box<Self>, backend_pid: i32) -> Box<dyn LockSession> {
        match *self {
            Self::Pooled(object, ends) => Box::new(Self::Detached(
                Object::take(object),
                ends.end_of(backend_pid),
            )),
            detached @ Self::Detached(..) => Box::new(detached),
        }
    }

    fn close(self: Box<Self>) {
        match *self {
            Self::Pooled(object, _) => drop(Object::take(object)),
            Self::Detached(client, _) => drop(client),
        }
    }

    fn ended(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            match self {
                // The connection's own end signal ([`ObservedConnect`](super::ObservedConnect)).
                Self::Detached(_, Some(ended)) => ended.cancelled().await,
                Self::Detached(client, None) => {
                    while !client.is_closed() {
                        tokio::time::sleep(SESSION_WATCH_PERIOD).await;
                    }
                }
                Self::Pooled(..) => std::future::pending().await,
            }
        })
    }
}

/// Sorts a tokio-postgres error into the classes the driver tells apart.
fn classify(error: tokio_postgres::Error) -> QueryError {
    let code = error.as_db_error().map(|db| db.code().clone());
    let cause = CheckError::from(error);
    match code {
        Some(code) if code == SqlState::LOCK_NOT_AVAILABLE => QueryError::LockTimeout(cause),
        _ if cause.ends_session() => QueryError::SessionEnded(cause),
        _ => QueryError::Failed(cause),
    }
}

/// The rows of a simple-protocol answer (`tokio_postgres::Client::simple_query`), each column
/// as text, `None` for `NULL`: how every statement of the elector is read, for operators' tools
/// that send statements of their own.
///
/// # Errors
/// The column's value cannot be read (never for a well-formed answer).
pub fn text_rows(messages: Vec<SimpleQueryMessage>) -> Result<Vec<Row>, CheckError> {
    messages
        .into_iter()
        .filter_map(|message| match message {
            SimpleQueryMessage::Row(row) => Some(row),
            _ => None,
        })
        .map(|row| {
            (0..row.len())
                .map(|index| row.try_get(index).map(|value| value.map(str::to_owned)))
                .collect::<Result<Row, _>>()
                .map_err(CheckError::from)
        })
        .collect()
}
