//! The default backend: deadpool-postgres sessions over tokio-postgres.

use std::time::Duration;

use deadpool_postgres::{ClientWrapper, Object, Pool};
use tokio_postgres::SimpleQueryMessage;
use tokio_postgres::error::SqlState;

use super::{BoxFuture, LockSession, QueryError, Row, SessionSource};
use crate::error::CheckError;

/// How often a detached session looks at its client's closed flag: deadpool-postgres owns the
/// connection task, so its end cannot be awaited; this poll costs one timer wake-up per period
/// on the leader only.
const SESSION_WATCH_PERIOD: Duration = Duration::from_millis(5);

/// A deadpool-postgres pool as a [`SessionSource`].
#[derive(Clone)]
pub(crate) struct DeadpoolSource(pub(crate) Pool);

impl SessionSource for DeadpoolSource {
    fn acquire(&self) -> BoxFuture<'_, Result<Box<dyn LockSession>, CheckError>> {
        Box::pin(async move {
            let object = self.0.get().await?;
            Ok(Box::new(PgSession::Pooled(object)) as Box<dyn LockSession>)
        })
    }
}

/// A deadpool-postgres session: borrowed (dropping it returns it), or taken out of the pool.
enum PgSession {
    Pooled(Object),
    Detached(ClientWrapper),
}

impl PgSession {
    fn client(&self) -> &tokio_postgres::Client {
        match self {
            Self::Pooled(object) => object,
            Self::Detached(client) => client,
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

    fn detach(self: Box<Self>) -> Box<dyn LockSession> {
        match *self {
            Self::Pooled(object) => Box::new(Self::Detached(Object::take(object))),
            detached @ Self::Detached(_) => Box::new(detached),
        }
    }

    fn close(self: Box<Self>) {
        match *self {
            Self::Pooled(object) => drop(Object::take(object)),
            Self::Detached(client) => drop(client),
        }
    }

    fn ended(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            match self {
                Self::Detached(client) => {
                    while !client.is_closed() {
                        tokio::time::sleep(SESSION_WATCH_PERIOD).await;
                    }
                }
                Self::Pooled(_) => std::future::pending().await,
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
