//! The election's one session: borrowed from the source for a check, detached from its pool
//! while it carries the lock, and the statements run on it. Backend-neutral: every statement
//! comes from [`sql`] and every answer is read here, over the [`LockSession`] seam.

use std::sync::Arc;

use plexsphere_leader_core::{ConnId, Event, LockCheck};

use crate::error::CheckError;
use crate::key::LockKey;
use crate::session::{LockSession, QueryError, Row};
use crate::sql::{self, outcome};
use crate::term::TermShared;

pub(crate) mod fitness;
pub(crate) mod lease;
pub(crate) mod pool;
pub(crate) mod survey;

/// A borrowed session that is closed, not given back, unless its statement answered (a
/// statement given up would leave the next one queued behind it on that session).
struct ClosedUnlessAnswered(Option<Box<dyn LockSession>>);

impl ClosedUnlessAnswered {
    /// The statement answered: the session goes back to its pool.
    fn answered(&mut self) {
        drop(self.0.take());
    }
}

impl Drop for ClosedUnlessAnswered {
    fn drop(&mut self) {
        if let Some(session) = self.0.take() {
            session.close();
        }
    }
}

/// Runs `statement` on a connection borrowed from `sessions` for it alone: the rows, or how
/// the statement failed; the outer error is the borrow's. The connection goes back to its pool
/// once the statement answered; a statement given up (the future dropped, at its deadline or
/// by a stop) closes its connection instead, so that no later statement queues behind the
/// unanswered one on it.
pub(crate) async fn on_pooled(
    sessions: &dyn crate::session::SessionSource,
    statement: &str,
) -> Result<Result<Vec<Row>, QueryError>, CheckError> {
    let session = sessions.acquire().await?;
    let mut borrowed = ClosedUnlessAnswered(Some(session));
    let rows = match &borrowed.0 {
        Some(session) => session.query(statement).await,
        None => Ok(Vec::new()),
    };
    borrowed.answered();
    Ok(rows)
}

/// [`on_pooled`]'s answer flattened: the rows, or the borrow's or the statement's failure as
/// the check's cause.
pub(crate) async fn pooled_rows(
    sessions: &dyn crate::session::SessionSource,
    statement: &str,
) -> Result<Vec<Row>, CheckError> {
    on_pooled(sessions, statement)
        .await
        .and_then(|rows| rows.map_err(QueryError::into_cause))
}

/// The session an operation runs on, shared with the driver until the operation ends.
pub(crate) type Held = Arc<Box<dyn LockSession>>;

/// What an operation of the single election produces: its event, the session of an acquire,
/// and the database a grant statement ran in (`current_database()`), for the log lines.
pub(crate) type Completion = crate::operation::Completion<Event<CheckError>, Option<String>>;

/// An operation of the single election in flight on one connection.
pub(crate) type Operation = crate::operation::Operation<Event<CheckError>, Option<String>>;

/// Runs a grant statement of [`sql`] (`try_lock`, `wait_for_lock`): `(outcome, pid,
/// database)`.
pub(crate) fn try_lock(held: Held, conn: ConnId, statement: String) -> Operation {
    Box::pin(async move {
        let name = "the lock statement";
        let mut database = None;
        let mut checked_secs_ago = None;
        let answer = match one_row(&**held, &statement, name).await {
            Ok(row) => text(&row, 0, name).and_then(|outcome| {
                let pid = text(&row, 1, name)?;
                database = row.get(2).cloned().flatten();
                checked_secs_ago = seconds_between(&row, 3, 4);
                Ok((outcome, parse_int::<i32>(&pid, name)?))
            }),
            Err(QueryError::LockTimeout(_)) => {
                // The server's lock_timeout ended a queued wait (the transaction-local setting
                // is gone with the rolled-back statement); the core decides what follows.
                return Completion::of(Event::LockWaitTimedOut { conn });
            }
            Err(error) => Err(error.into_cause()),
        };
        let event = match answer {
            Ok((granted, backend_pid)) if granted == outcome::GRANTED => {
                Event::LockGranted { conn, backend_pid }
            }
            Ok((refused, _)) if refused == outcome::REFUSED => Event::LockRefused { conn },
            // The core tells a live leader sharing the session from a stranded lock.
            Ok((shared, _)) if shared == outcome::SHARED => Event::LockHeldBySession {
                conn,
                checked_secs_ago,
            },
            // The statement answered without trying the lock: nothing is held on the session.
            Ok((other, _)) if other == outcome::IN_RECOVERY => Event::LockNotTried {
                conn,
                cause: CheckError::InRecovery,
            },
            Ok((other, _)) if other == outcome::READ_ONLY => Event::LockNotTried {
                conn,
                cause: CheckError::ReadOnly,
            },
            Ok((other, _)) => Event::LockQueryFailed {
                conn,
                cause: unexpected(name, format!("{other:?}")),
            },
            Err(cause) => Event::LockQueryFailed { conn, cause },
        };
        Completion {
            extra: database,
            ..Completion::of(event)
        }
    })
}

/// The queued wait: arms the session's idle bound in a query of its own
/// ([`sql::bound_idle_before_wait`]), then runs `statement` ([`sql::wait_for_lock`]) as
/// [`try_lock`] does. A failure to arm is reported as the grant's failure: whether the session
/// holds the lock is then known (it does not), but the core closes the connection all the same.
pub(crate) fn wait_for_lock(
    held: Held,
    conn: ConnId,
    bound: String,
    statement: String,
) -> Operation {
    Box::pin(async move {
        if let Err(error) = held.query(&bound).await {
            return Completion::of(Event::LockQueryFailed {
                conn,
                cause: error.into_cause(),
            });
        }
        try_lock(held, conn, statement).await
    })
}

/// After a queued wait timed out: unlocks only if this session holds the lock
/// ([`sql::release_if_held`]).
pub(crate) fn release_if_held(held: Held, conn: ConnId, key: LockKey) -> Operation {
    Box::pin(async move {
        let name = "the release after a lock wait timed out";
        Completion::of(
            match boolean(&**held, &sql::release_if_held(key), name).await {
                Ok(released) => Event::ReleasedIfHeld { conn, released },
                Err(cause) => Event::LockQueryFailed { conn, cause },
            },
        )
    })
}

/// The leader's check ([`sql::verify`]): reports what the lock session shows (answering
/// backend, recovery, the lock in `pg_locks`, the grant's marker) for the core to judge. An
/// error that ended the session is reported as [`Event::SessionEnded`].
pub(crate) fn verify(held: Held, conn: ConnId, key: LockKey) -> Operation {
    Box::pin(async move {
        let name = "the lock check";
        let found = match one_row(&**held, &sql::verify(key), name).await {
            Ok(row) => lock_check(&row, name),
            Err(QueryError::SessionEnded(cause)) => {
                return Completion::of(Event::SessionEnded { conn, cause });
            }
            Err(error) => Err(error.into_cause()),
        };
        Completion::of(match found {
            Ok(found) => Event::PingAnswered { conn, found },
            Err(cause) => Event::PingFailed { conn, cause },
        })
    })
}

fn lock_check(row: &Row, name: &'static str) -> Result<LockCheck, CheckError> {
    Ok(LockCheck {
        backend_pid: parse_int::<i32>(&text(row, 0, name)?, name)?,
        in_recovery: text(row, 1, name)? == "t",
        holds_lock: text(row, 2, name)? == "t",
        marked_by_grant: column(row, 3, name)?.as_deref() == Some(outcome::GRANTED),
    })
}

/// Fencing ([`sql::advance_epoch`]): the new term's epoch.
/// `statement` is [`sql::advance_epoch_within`].
pub(crate) fn advance_epoch(held: Held, conn: ConnId, statement: String) -> Operation {
    Box::pin(async move {
        let name = "the fencing epoch";
        let epoch = match single_value(&**held, &statement, name).await {
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

pub(crate) fn unlock(held: Held, conn: ConnId, key: LockKey) -> Operation {
    Box::pin(async move {
        let event = match boolean(&**held, &sql::unlock(key), "pg_advisory_unlock").await {
            Ok(released) => Event::UnlockDone { conn, released },
            Err(cause) => Event::UnlockFailed { conn, cause },
        };
        Completion::of(event)
    })
}

async fn boolean(
    session: &dyn LockSession,
    statement: &str,
    name: &'static str,
) -> Result<bool, CheckError> {
    match single_value(session, statement, name).await?.as_str() {
        "t" => Ok(true),
        "f" => Ok(false),
        other => Err(unexpected(name, format!("{other:?}"))),
    }
}

/// The text of the first column of the one row `statement` returns.
async fn single_value(
    session: &dyn LockSession,
    statement: &str,
    name: &'static str,
) -> Result<String, CheckError> {
    let row = one_row(session, statement, name)
        .await
        .map_err(QueryError::into_cause)?;
    text(&row, 0, name)
}

/// The one row `statement` returns.
async fn one_row(
    session: &dyn LockSession,
    statement: &str,
    name: &'static str,
) -> Result<Row, QueryError> {
    let mut rows = session.query(statement).await?.into_iter();
    let row = rows
        .next()
        .ok_or_else(|| QueryError::Failed(unexpected(name, "no row".into())))?;
    if rows.next().is_some() {
        return Err(QueryError::Failed(unexpected(
            name,
            "more than one row".into(),
        )));
    }
    Ok(row)
}

/// Seconds from the unix time in column `earlier` to the one in column `later`, when both are
/// whole numbers (`None` when the earlier one is missing: no check ever stamped the session).
fn seconds_between(row: &Row, earlier: usize, later: usize) -> Option<u64> {
    let seconds = |index: usize| {
        row.get(index)
            .cloned()
            .flatten()
            .and_then(|text| text.parse::<i64>().ok())
    };
    let (earlier, later) = (seconds(earlier)?, seconds(later)?);
    Some(u64::try_from(later.saturating_sub(earlier)).unwrap_or(0))
}

/// Column `index` of `row`, which must exist (it may be `NULL`).
fn column(row: &Row, index: usize, name: &'static str) -> Result<Option<String>, CheckError> {
    row.get(index)
        .cloned()
        .ok_or_else(|| unexpected(name, format!("no column {index}")))
}

/// The text of column `index`, which must not be NULL.
fn text(row: &Row, index: usize, name: &'static str) -> Result<String, CheckError> {
    column(row, index, name)?.ok_or_else(|| unexpected(name, format!("NULL in column {index}")))
}

fn parse_int<T: std::str::FromStr>(value: &str, name: &'static str) -> Result<T, CheckError> {
    value
        .parse()
        .map_err(|_| unexpected(name, format!("{value:?} is not an integer")))
}

pub(super) fn unexpected(statement: &'static str, detail: String) -> CheckError {
    CheckError::UnexpectedReply { statement, detail }
}
