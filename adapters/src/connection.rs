//! The election's one connection: borrowed from the pool for a check, hijacked out of it while
//! it carries the lock, and the statements run on it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use deadpool_postgres::{ClientWrapper, Object, Pool};
use plexsphere_leader_core::{ConnId, Event, LockCheck};
use tokio_postgres::error::SqlState;
use tokio_postgres::{SimpleQueryMessage, SimpleQueryRow};

use crate::error::CheckError;
use crate::key::LockKey;
use crate::sql::{self, outcome};
use crate::term::TermShared;

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

    /// Whether this is the lock connection (taken out of the pool) and its connection task
    /// has ended: the server closed the session, or the socket broke.
    pub(crate) fn lock_session_closed(&self) -> bool {
        matches!(self, Self::Hijacked(client) if client.is_closed())
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

impl Completion {
    pub(crate) fn of(event: Event<CheckError>) -> Self {
        Self {
            event,
            acquired: None,
        }
    }
}

/// An operation in flight on one connection.
pub(crate) type Operation = Pin<Box<dyn Future<Output = Completion> + Send>>;

pub(crate) fn acquire(pool: Pool, conn: ConnId) -> Operation {
    Box::pin(async move {
        match pool.get().await {
            Ok(object) => Completion {
                acquired: Some(object),
                ..Completion::of(Event::ConnectionAcquired { conn })
            },
            Err(error) => Completion::of(Event::AcquireFailed {
                conn,
                cause: error.into(),
            }),
        }
    })
}

/// Runs a grant statement of [`sql`] (`try_lock`, `wait_for_lock`): `(outcome, pid)`.
pub(crate) fn try_lock(held: Arc<Held>, conn: ConnId, statement: String) -> Operation {
    Box::pin(async move {
        let name = "the lock statement";
        let answer = match one_row(held.client(), &statement, name).await {
            Ok(row) => text(&row, 0, name).and_then(|outcome| {
                let pid = text(&row, 1, name)?;
                Ok((outcome, parse_int::<i32>(&pid, name)?))
            }),
            Err(error) => Err(error),
        };
        match answer {
            Ok((granted, backend_pid)) if granted == outcome::GRANTED => {
                Completion::of(Event::LockGranted { conn, backend_pid })
            }
            Ok((refused, _)) if refused == outcome::REFUSED => {
                Completion::of(Event::LockRefused { conn })
            }
            Ok((other, _)) => {
                let cause = match other.as_str() {
                    outcome::IN_RECOVERY => CheckError::InRecovery,
                    outcome::SHARED => CheckError::SharedSession,
                    _ => CheckError::UnexpectedReply {
                        statement: name,
                        detail: format!("{other:?}"),
                    },
                };
                Completion::of(Event::LockQueryFailed { conn, cause })
            }
            // The server's lock_timeout ended a queued wait (the transaction-local setting is
            // gone with the rolled-back statement); the core decides what follows.
            Err(cause) if is_lock_timeout(&cause) => {
                Completion::of(Event::LockWaitTimedOut { conn })
            }
            Err(cause) => Completion::of(Event::LockQueryFailed { conn, cause }),
        }
    })
}

/// After a queued wait timed out: unlocks only if this session holds the lock
/// ([`sql::release_if_held`]).
pub(crate) fn release_if_held(held: Arc<Held>, conn: ConnId, key: LockKey) -> Operation {
    Box::pin(async move {
        let name = "the release after a lock wait timed out";
        Completion::of(
            match boolean(held.client(), &sql::release_if_held(key), name).await {
                Ok(released) => Event::ReleasedIfHeld { conn, released },
                Err(cause) => Event::LockQueryFailed { conn, cause },
            },
        )
    })
}

fn is_lock_timeout(error: &CheckError) -> bool {
    error
        .db_error()
        .is_some_and(|db| *db.code() == SqlState::LOCK_NOT_AVAILABLE)
}

/// The leader's check ([`sql::verify`]): reports what the lock session shows (answering
/// backend, recovery, the lock in `pg_locks`, the grant's marker) for the core to judge. An
/// error that ended the session is reported as [`Event::SessionEnded`].
pub(crate) fn verify(held: Arc<Held>, conn: ConnId, key: LockKey) -> Operation {
    Box::pin(async move {
        Completion::of(match verify_on(held.client(), key).await {
            Ok(found) => Event::PingAnswered { conn, found },
            Err(cause) => check_failed(conn, cause),
        })
    })
}

/// A failed check of the leader: the session's end when the error says so, else a failure.
fn check_failed(conn: ConnId, cause: CheckError) -> Event<CheckError> {
    if cause.ends_session() {
        Event::SessionEnded { conn, cause }
    } else {
        Event::PingFailed { conn, cause }
    }
}

async fn verify_on(client: &tokio_postgres::Client, key: LockKey) -> Result<LockCheck, CheckError> {
    let name = "the lock check";
    let row = one_row(client, &sql::verify(key), name).await?;
    Ok(LockCheck {
        backend_pid: parse_int::<i32>(&text(&row, 0, name)?, name)?,
        in_recovery: text(&row, 1, name)? == "t",
        holds_lock: text(&row, 2, name)? == "t",
        marked_by_grant: row.try_get(3)? == Some(outcome::GRANTED),
    })
}

/// Fencing ([`sql::advance_epoch`]): the new term's epoch.
pub(crate) fn advance_epoch(held: Arc<Held>, conn: ConnId, key: LockKey) -> Operation {
    Box::pin(async move {
        let name = "the fencing epoch";
        let epoch = match single_value(held.client(), &sql::advance_epoch(key), name).await {
            Ok(value) => parse_int::<u64>(&value, name),
            Err(error) => Err(error),
        };
        Completion::of(match epoch {
            Ok(epoch) => Event::EpochAdvanced { conn, epoch },
            Err(cause) => Event::EpochFailed { conn, cause },
        })
    })
}

/// A graceful stop: resolves once no [`Term`](crate::Term) of the stopped term is alive.
pub(crate) fn await_work(term: Arc<TermShared>) -> Operation {
    Box::pin(async move {
        term.drained().await;
        Completion::of(Event::WorkDrained { term: term.id() })
    })
}

/// The spec's `SELECT 1` check, kept for the sabotage variants: an answer is taken as proof
/// that backend `backend_pid` holds the lock, which is exactly what they get wrong.
async fn ping_on(client: &tokio_postgres::Client, conn: ConnId, backend_pid: i32) -> Completion {
    let event = match single_value(client, sql::PING, "SELECT 1").await {
        Ok(value) if value == "1" => Event::PingAnswered {
            conn,
            found: LockCheck::holding(backend_pid),
        },
        Ok(other) => Event::PingFailed {
            conn,
            cause: CheckError::UnexpectedReply {
                statement: "SELECT 1",
                detail: other,
            },
        },
        Err(cause) => Event::PingFailed { conn, cause },
    };
    Completion::of(event)
}

/// Sabotage [`ReturnGrantedToPool`](crate::sabotage::Sabotage::ReturnGrantedToPool): the check
/// runs on whichever pooled connection comes.
pub(crate) fn ping_any_pooled(pool: Pool, conn: ConnId, backend_pid: i32) -> Operation {
    Box::pin(async move {
        match pool.get().await {
            Ok(object) => ping_on(&object, conn, backend_pid).await,
            Err(error) => Completion::of(Event::PingFailed {
                conn,
                cause: error.into(),
            }),
        }
    })
}

/// Sabotage [`KeepTermOnFailedPing`](crate::sabotage::Sabotage::KeepTermOnFailedPing): a
/// failure, or no answer within `patience`, is reported as success.
pub(crate) fn ping_always_ok(
    held: Arc<Held>,
    conn: ConnId,
    backend_pid: i32,
    patience: std::time::Duration,
) -> Operation {
    Box::pin(async move {
        let _ = tokio::time::timeout(patience, ping_on(held.client(), conn, backend_pid)).await;
        Completion::of(Event::PingAnswered {
            conn,
            found: LockCheck::holding(backend_pid),
        })
    })
}

/// Sabotage [`NeverPing`](crate::sabotage::Sabotage::NeverPing): success without a query.
pub(crate) fn ping_skipped(conn: ConnId, backend_pid: i32) -> Operation {
    Box::pin(std::future::ready(Completion::of(Event::PingAnswered {
        conn,
        found: LockCheck::holding(backend_pid),
    })))
}

pub(crate) fn unlock(held: Arc<Held>, conn: ConnId, key: LockKey) -> Operation {
    Box::pin(async move {
        let event = match boolean(held.client(), &sql::unlock(key), "pg_advisory_unlock").await {
            Ok(released) => Event::UnlockDone { conn, released },
            Err(cause) => Event::UnlockFailed { conn, cause },
        };
        Completion::of(event)
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
    text(&one_row(client, statement, name).await?, 0, name)
}

/// The one row `statement` returns.
async fn one_row(
    client: &tokio_postgres::Client,
    statement: &str,
    name: &'static str,
) -> Result<SimpleQueryRow, CheckError> {
    let messages = client.simple_query(statement).await?;
    let mut rows = messages.into_iter().filter_map(|message| match message {
        SimpleQueryMessage::Row(row) => Some(row),
        _ => None,
    });
    let row = rows
        .next()
        .ok_or_else(|| unexpected(name, "no row".into()))?;
    if rows.next().is_some() {
        return Err(unexpected(name, "more than one row".into()));
    }
    Ok(row)
}

/// The text of column `index`, which must not be NULL.
fn text(row: &SimpleQueryRow, index: usize, name: &'static str) -> Result<String, CheckError> {
    let value = row
        .try_get(index)?
        .ok_or_else(|| unexpected(name, format!("NULL in column {index}")))?;
    Ok(value.to_owned())
}

fn parse_int<T: std::str::FromStr>(value: &str, name: &'static str) -> Result<T, CheckError> {
    value
        .parse()
        .map_err(|_| unexpected(name, format!("{value:?} is not an integer")))
}

fn unexpected(statement: &'static str, detail: String) -> CheckError {
    CheckError::UnexpectedReply { statement, detail }
}
