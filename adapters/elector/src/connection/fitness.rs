//! The fitness probe ([`Config::fitness_probe`](crate::Config::fitness_probe)): the service's
//! statement, run on the connection that is about to try the lock, on the lock session after
//! each check that proved it, or (a lease, which holds no connection) on a pooled connection
//! borrowed for it. The server's refusal (an error with an SQLSTATE) is [`Event::Unfit`]; an
//! answer of any rows is [`Event::Fit`]; anything else (the session ended, the pool failed) is
//! [`Event::ProbeFailed`], which says nothing of the replica's fitness.

use std::sync::Arc;

use plexsphere_leader_core::{ConnId, Event};

use super::{Completion, Held, Operation, on_pooled};
use crate::error::CheckError;
use crate::session::{QueryError, Row, SessionSource};

/// Runs `probe` on the held session `conn`.
pub(crate) fn on_session(held: Held, conn: ConnId, probe: Arc<str>) -> Operation {
    Box::pin(async move {
        let answer = held.query(&probe).await;
        Completion::of(verdict(conn, &probe, answer))
    })
}

/// Runs `probe` on a connection of `sessions` ([`on_pooled`]); a failed borrow says nothing
/// of fitness.
pub(crate) fn pooled(sessions: Arc<dyn SessionSource>, conn: ConnId, probe: Arc<str>) -> Operation {
    Box::pin(async move {
        match on_pooled(&*sessions, &probe).await {
            Ok(answer) => Completion::of(verdict(conn, &probe, answer)),
            Err(cause) => Completion::of(Event::ProbeFailed { conn, cause }),
        }
    })
}

/// What the probe's answer says: refused by the server (an SQLSTATE) is unfit.
fn verdict(conn: ConnId, probe: &str, answer: Result<Vec<Row>, QueryError>) -> Event<CheckError> {
    match answer {
        Ok(_) => Event::Fit { conn },
        Err(QueryError::Failed(error)) if error.sqlstate().is_some() => Event::Unfit {
            conn,
            cause: CheckError::Unfit {
                probe: probe.to_owned(),
                error: Box::new(error),
            },
        },
        Err(error) => Event::ProbeFailed {
            conn,
            cause: error.into_cause(),
        },
    }
}
