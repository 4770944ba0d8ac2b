//! The lease mechanism's operations: one statement of [`sql::lease`](crate::sql::lease) each,
//! on a connection borrowed from the source for it alone and given back as it answers (it
//! carries nothing).

use std::sync::Arc;

use plexsphere_leader_core::{ConnId, Event};

use super::{Completion, Operation, parse_int, pooled_rows};
use crate::error::CheckError;
use crate::session::{Row, SessionSource};

/// What a lease statement's rows mean, or its failure: the event to report.
type Answer = Box<dyn FnOnce(Result<Vec<Row>, CheckError>) -> Event<CheckError> + Send>;

/// Runs `statement` on a connection of `sessions` ([`pooled_rows`]), and reports what `answer`
/// makes of it.
fn statement(sessions: Arc<dyn SessionSource>, statement: String, answer: Answer) -> Operation {
    Box::pin(async move {
        let rows = pooled_rows(&*sessions, &statement).await;
        Completion::of(answer(rows))
    })
}

/// The claim: the new epoch, refused, or refused for good because another schema holds the
/// key's election (its last row: the epoch or `NULL`, the other schemas or `NULL`).
pub(crate) fn claim(
    sessions: Arc<dyn SessionSource>,
    conn: ConnId,
    sql: String,
    schema: String,
    key: crate::key::LockKey,
) -> Operation {
    statement(
        sessions,
        sql,
        Box::new(move |rows| {
            let name = "the lease claim";
            let answer = rows.and_then(|rows| {
                let row = rows
                    .last()
                    .ok_or_else(|| super::unexpected(name, "no row".into()))?;
                let epoch = match row.first().cloned().flatten() {
                    Some(epoch) => Some(parse_int::<u64>(&epoch, name)?),
                    None => None,
                };
                Ok((epoch, row.get(1).cloned().flatten()))
            });
            match answer {
                Ok((Some(epoch), _)) => Event::LeaseClaimed { conn, epoch },
                Ok((None, Some(elsewhere))) => Event::LockQueryFailed {
                    conn,
                    cause: CheckError::ElectionElsewhere {
                        schema: schema.clone(),
                        elsewhere,
                        key,
                    },
                },
                Ok((None, None)) => Event::LockRefused { conn },
                Err(cause) => Event::LockQueryFailed { conn, cause },
            }
        }),
    )
}

/// The renewal: renewed, or the row is another's.
pub(crate) fn renew(sessions: Arc<dyn SessionSource>, conn: ConnId, sql: String) -> Operation {
    statement(
        sessions,
        sql,
        Box::new(move |rows| match rows {
            Ok(rows) if rows.is_empty() => Event::LeaseLost { conn },
            Ok(_) => Event::LeaseRenewed { conn },
            Err(cause) => Event::PingFailed { conn, cause },
        }),
    )
}

/// The release: whether the lease was this run's and is now expired.
pub(crate) fn release(sessions: Arc<dyn SessionSource>, conn: ConnId, sql: String) -> Operation {
    statement(
        sessions,
        sql,
        Box::new(move |rows| match rows {
            Ok(rows) => Event::UnlockDone {
                conn,
                released: !rows.is_empty(),
            },
            Err(cause) => Event::UnlockFailed { conn, cause },
        }),
    )
}
