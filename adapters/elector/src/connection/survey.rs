//! The survey of the candidates ([`Action::SurveyCandidates`](plexsphere_leader_core::Action::SurveyCandidates),
//! [`sql::candidacy`](crate::sql::candidacy)): on the standby's borrowed connection or the
//! leader's lock session (advisory lock), or on a pooled connection borrowed for it (lease).
//! Every well-formed, live candidacy of the key becomes a [`Candidate`]; anything else in the
//! answer is not one, and is left out. A statement that did not run to an answer is
//! [`Event::SurveyFailed`].

use std::sync::Arc;
use std::time::Duration;

use plexsphere_leader_core::rank::Candidate;
use plexsphere_leader_core::{ConnId, Event};

use super::{Completion, Held, Operation, pooled_rows};
use crate::error::CheckError;
use crate::key::LockKey;
use crate::session::{QueryError, Row, SessionSource};
use crate::sql::candidacy;

/// What a survey reads its answer with: the key whose candidacies count, and how long one
/// stays live after its last survey.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reading {
    pub(crate) key: LockKey,
    pub(crate) live: Duration,
}

/// Runs the survey `statement` on the held session `conn`.
pub(crate) fn on_session(
    held: Held,
    conn: ConnId,
    statement: String,
    reading: Reading,
) -> Operation {
    Box::pin(async move {
        let answer = held.query(&statement).await.map_err(QueryError::into_cause);
        Completion::of(event(conn, answer, reading))
    })
}

/// Runs the survey `statement` on a connection of `sessions` borrowed for it.
pub(crate) fn pooled(
    sessions: Arc<dyn SessionSource>,
    conn: ConnId,
    statement: String,
    reading: Reading,
) -> Operation {
    Box::pin(async move {
        let answer = pooled_rows(&*sessions, &statement).await;
        Completion::of(event(conn, answer, reading))
    })
}

fn event(
    conn: ConnId,
    answer: Result<Vec<Row>, CheckError>,
    reading: Reading,
) -> Event<CheckError> {
    match answer {
        Ok(rows) => Event::CandidatesSurveyed {
            conn,
            candidates: candidates(&rows, reading),
            floor: rows
                .iter()
                .find_map(|row| candidacy::floor_of(row.first()?.as_deref()?)),
        },
        Err(cause) => Event::SurveyFailed { conn, cause },
    }
}

/// The live candidacies of `rows` (each: the candidacy's text, the server's unix milliseconds;
/// the floor's row, `=<version>`, is none).
fn candidates(rows: &[Row], reading: Reading) -> Vec<Candidate> {
    rows.iter()
        .filter_map(|row| {
            let text = row.first()?.as_deref()?;
            let now_ms = row.get(1)?.as_deref()?.parse().ok()?;
            candidacy::parse(text, now_ms, reading.key, reading.live).map(|(found, _)| found)
        })
        .collect()
}
