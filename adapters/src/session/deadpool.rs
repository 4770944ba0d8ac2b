//! The default backend: deadpool-postgres sessions over tokio-postgres.

use std::time::Duration;

use deadpool_postgres::{ClientWrapper, Object, Pool};
use tokio_postgres::SimpleQueryMessage;
use tokio_postgres::error::SqlState;
use tokio_util::sync::CancellationToken;

use super::{BoxFuture, LockSession, QueryError, Row, SessionEnds, SessionSource};
use crate::error::CheckError;

/// How often a detached session of a pool not built with
/// [`ObservedConnect`](super::ObservedConnect) looks at its client's closed flag:
/// deadpool-postgres's default connector keeps the connection task to itself, so its end
/// cannot be awaited; this poll costs one timer wake-up per period on the leader only.
const SESSION_WATCH_PERIOD: Duration = Duration::from_millis(5);

/// A deadpool-postgres pool as a [`SessionSource`], with the registry its connector (if it is
/// an [`ObservedConnect`](super::ObservedConnect)) signals connection ends to.
#[derive(Clone)]
pub(crate) struct DeadpoolSource {
    pub(crate) pool: Pool,
    pub(crate) ends: SessionEnds,
}

impl SessionSource for DeadpoolSource {
    fn acquire(&self) -> BoxFuture<'_, Result<Box<dyn LockSession>, CheckError>> {
        Box::pin(async move {
            let object = self.pool.get().await?;
            let session = PgSession::Pooled(object, self.ends.clone());
            Ok(Box::new(session) as Box<dyn LockSession>)
        })
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
                        .map_err(|error| QueryError::Failed(error.into()))
                })
                .collect()
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
