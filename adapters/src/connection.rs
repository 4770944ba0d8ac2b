//! The election's one connection: borrowed from the pool for a check, hijacked out of it while
//! it carries the lock, and the statements run on it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use deadpool_postgres::{ClientWrapper, Object, Pool};
use plexsphere_leader_core::{ConnId, Event};
use tokio_postgres::SimpleQueryMessage;

use crate::error::CheckError;
use crate::sql;

/// A connection of the election.
pub(crate) enum Held {
    /// Borrowed from the pool: dropping it returns it there.
    Pooled(Object),
    /// Taken out of the pool: dropping it closes it.
    Hijacked(ClientWrapper),
}

impl Held {
    fn client(&self) -> &tokio_postgres::Client {
        match self {
            Self::Pooled(object) => object,
            Self::Hijacked(client) => client,
        }
    }

    /// Closes the connection without returning it to the pool: the server then ends the session
    /// and releases its locks.
    pub(crate) fn close(self) {
        match self {
            Self::Pooled(object) => drop(Object::take(object)),
            Self::Hijacked(client) => drop(client),
        }
    }

    /// Takes a borrowed connection out of the pool for good.
    pub(crate) fn hijack(self) -> Self {
        match self {
            Self::Pooled(object) => Self::Hijacked(Object::take(object)),
            hijacked @ Self::Hijacked(_) => hijacked,
        }
    }
}

/// What an operation in flight produces: the event to report and, for an acquire, the
/// connection.
pub(crate) struct Completion {
    pub(crate) event: Event<CheckError>,
    pub(crate) acquired: Option<Object>,
}

/// An operation in flight on one connection.
pub(crate) type Operation = Pin<Box<dyn Future<Output = Completion> + Send>>;

pub(crate) fn acquire(pool: Pool, conn: ConnId) -> Operation {
    Box::pin(async move {
        match pool.get().await {
            Ok(object) => Completion {
                event: Event::ConnectionAcquired { conn },
                acquired: Some(object),
            },
            Err(error) => Completion {
                event: Event::AcquireFailed {
                    conn,
                    cause: error.into(),
                },
                acquired: None,
            },
        }
    })
}

pub(crate) fn try_lock(held: Arc<Held>, conn: ConnId, statement: String) -> Operation {
    Box::pin(async move {
        let event = match boolean(held.client(), &statement, "the lock statement").await {
            Ok(true) => Event::LockGranted { conn },
            Ok(false) => Event::LockRefused { conn },
            Err(cause) => Event::LockQueryFailed { conn, cause },
        };
        Completion {
            event,
            acquired: None,
        }
    })
}

pub(crate) fn ping(held: Arc<Held>, conn: ConnId) -> Operation {
    Box::pin(async move { ping_on(held.client(), conn).await })
}

async fn ping_on(client: &tokio_postgres::Client, conn: ConnId) -> Completion {
    let event = match single_value(client, sql::PING, "SELECT 1").await {
        Ok(value) if value == "1" => Event::PingOk { conn },
        Ok(other) => Event::PingFailed {
            conn,
            cause: CheckError::UnexpectedReply {
                statement: "SELECT 1",
                detail: other,
            },
        },
        Err(cause) => Event::PingFailed { conn, cause },
    };
    Completion {
        event,
        acquired: None,
    }
}

/// Sabotage [`ReturnGrantedToPool`](crate::sabotage::Sabotage::ReturnGrantedToPool): the check
/// runs on whichever pooled connection comes.
pub(crate) fn ping_any_pooled(pool: Pool, conn: ConnId) -> Operation {
    Box::pin(async move {
        match pool.get().await {
            Ok(object) => ping_on(&object, conn).await,
            Err(error) => Completion {
                event: Event::PingFailed {
                    conn,
                    cause: error.into(),
                },
                acquired: None,
            },
        }
    })
}

/// Sabotage [`KeepTermOnFailedPing`](crate::sabotage::Sabotage::KeepTermOnFailedPing): a
/// failure, or no answer within `patience`, is reported as success.
pub(crate) fn ping_always_ok(
    held: Arc<Held>,
    conn: ConnId,
    patience: std::time::Duration,
) -> Operation {
    Box::pin(async move {
        let _ = tokio::time::timeout(patience, ping_on(held.client(), conn)).await;
        Completion {
            event: Event::PingOk { conn },
            acquired: None,
        }
    })
}

/// Sabotage [`NeverPing`](crate::sabotage::Sabotage::NeverPing): success without a query.
pub(crate) fn ping_skipped(conn: ConnId) -> Operation {
    Box::pin(std::future::ready(Completion {
        event: Event::PingOk { conn },
        acquired: None,
    }))
}

pub(crate) fn unlock(held: Arc<Held>, conn: ConnId) -> Operation {
    Box::pin(async move {
        let event = match boolean(held.client(), &sql::unlock(), "pg_advisory_unlock").await {
            Ok(released) => Event::UnlockDone { conn, released },
            Err(cause) => Event::UnlockFailed { conn, cause },
        };
        Completion {
            event,
            acquired: None,
        }
    })
}

async fn boolean(
    client: &tokio_postgres::Client,
    statement: &str,
    name: &'static str,
) -> Result<bool, CheckError> {
    match single_value(client, statement, name).await?.as_str() {
        "t" => Ok(true),
        "f" => Ok(false),
        other => Err(CheckError::UnexpectedReply {
            statement: name,
            detail: format!("{other:?}"),
        }),
    }
}

/// The text of the first column of the one row `statement` returns.
async fn single_value(
    client: &tokio_postgres::Client,
    statement: &str,
    name: &'static str,
) -> Result<String, CheckError> {
    let messages = client.simple_query(statement).await?;
    let mut rows = messages.iter().filter_map(|message| match message {
        SimpleQueryMessage::Row(row) => Some(row),
        _ => None,
    });
    let unexpected = |detail: String| CheckError::UnexpectedReply {
        statement: name,
        detail,
    };
    let row = rows.next().ok_or_else(|| unexpected("no row".into()))?;
    if rows.next().is_some() {
        return Err(unexpected("more than one row".into()));
    }
    let value = row.try_get(0)?.ok_or_else(|| unexpected("NULL".into()))?;
    Ok(value.to_owned())
}
