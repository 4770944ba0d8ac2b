//! The pool proof ([`Action::ProbePool`](plexsphere_leader_core::Action::ProbePool)): two
//! connections of the pool, held at once, each asked for its server backend.

use std::sync::Arc;
use std::time::Duration;

use plexsphere_leader_core::{ConnId, Event};

use super::{ClosedUnlessAnswered, Completion, Operation, one_row, parse_int, text};
use crate::error::CheckError;
use crate::session::{QueryError, SessionSource};
use crate::sql;

/// Borrows a connection of `sessions` and asks it for its backend, then a second one while the
/// first is still borrowed (the second, with its answer, given up after `second_within`: a
/// pool of one connection, or a pooler with one server session in session mode); both go back to the pool once answered (a proof given up closes what it
/// borrowed). Reports [`Event::PoolProbed`], or [`Event::AcquireFailed`] with the first
/// failure.
pub(crate) fn probe(
    sessions: Arc<dyn SessionSource>,
    conn: ConnId,
    second_within: Duration,
) -> Operation {
    Box::pin(async move {
        let event = match backends(&*sessions, second_within).await {
            Ok((first, second)) => Event::PoolProbed {
                conn,
                first,
                second,
            },
            Err(cause) => Event::AcquireFailed { conn, cause },
        };
        Completion::of(event)
    })
}

async fn backends(
    sessions: &dyn SessionSource,
    second_within: Duration,
) -> Result<(i32, Option<i32>), CheckError> {
    let mut first = ClosedUnlessAnswered(Some(sessions.acquire().await?));
    let first_pid = backend(&first).await?;
    // The second connection and its answer within `second_within`, or nothing is proven: a
    // pool of one connection, or a session-mode pooler with one server session (its second
    // client waits for the first one's server session) cannot hand one client's statements
    // to another.
    let second = async {
        let mut second = ClosedUnlessAnswered(Some(sessions.acquire().await?));
        let pid = backend(&second).await?;
        second.answered();
        Ok::<_, CheckError>(pid)
    };
    let second_pid = match tokio::time::timeout(second_within, second).await {
        Ok(answer) => Some(answer?),
        Err(_) => None,
    };
    first.answered();
    Ok((first_pid, second_pid))
}

async fn backend(borrowed: &ClosedUnlessAnswered) -> Result<i32, CheckError> {
    let name = "the pool proof";
    let Some(session) = &borrowed.0 else {
        return Err(CheckError::SessionEnded);
    };
    let row = one_row(&**session, sql::BACKEND_PID, name)
        .await
        .map_err(QueryError::into_cause)?;
    parse_int(&text(&row, 0, name)?, name)
}
