//! The candidates of a ranked election ([`Config::version`](crate::Config::version)) as the
//! server shows them: each live candidacy's rank, identity and age, read with the leader's
//! read-only survey ([`sql::candidacy`](crate::sql::candidacy)).

use std::time::Duration;

use crate::key::LockKey;
use crate::rank::{FloorStep, Rank};
use crate::session::{LockSession, Row};
use crate::sql::candidacy;

use super::StatusError;

/// One live candidate: a standby that published its rank within the live window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CandidateStatus {
    /// Its rank (priority, then version).
    pub rank: Rank,
    /// How long it has been a candidate without a break.
    pub live_for: Duration,
    /// The identity it published (cut to fit `application_name` with the advisory lock).
    pub identity: String,
}

/// Where an election's candidacies are published.
#[derive(Debug, Clone, Copy)]
pub enum Published<'a> {
    /// The advisory lock: the standbys' `application_name`s.
    Sessions,
    /// The lease: the candidate table of this schema.
    Rows {
        /// The lease's schema.
        schema: &'a str,
    },
}

/// The read-only survey of `key`'s candidacies where `published`.
fn survey(key: LockKey, published: Published<'_>) -> String {
    let floor = (candidacy::FLOOR_TABLE, FloorStep::Off);
    match published {
        Published::Sessions => candidacy::survey_sessions(key, None, floor),
        Published::Rows { schema } => {
            let table = candidacy::candidate_table(schema);
            candidacy::survey_rows(&table, key, "", None, floor)
        }
    }
}

/// The live candidates of `key` (published within `live` of the server's clock) in a
/// survey's `rows`, one per identity (its longest-live candidacy), best rank first.
fn candidates_of(rows: &[Row], key: LockKey, live: Duration) -> Vec<CandidateStatus> {
    let mut found: Vec<CandidateStatus> = Vec::new();
    for row in rows {
        let (Some(Some(text)), Some(Some(now))) = (row.first(), row.get(1)) else {
            continue;
        };
        let Some((candidate, identity)) = now
            .parse()
            .ok()
            .and_then(|now_ms| candidacy::parse(text, now_ms, key, live))
        else {
            continue;
        };
        match found.iter_mut().find(|known| known.identity == identity) {
            Some(known) if known.live_for >= candidate.live_for => {}
            Some(known) => {
                known.rank = candidate.rank;
                known.live_for = candidate.live_for;
            }
            None => found.push(CandidateStatus {
                rank: candidate.rank,
                live_for: candidate.live_for,
                identity: identity.to_owned(),
            }),
        }
    }
    found.sort_by(|a, b| b.rank.cmp(&a.rank).then(b.live_for.cmp(&a.live_for)));
    found
}

/// The live candidates of the election `key` in `client`'s current database, published within
/// `live` (two of the election's check intervals are its own window), one per identity, best
/// rank first; empty for an unranked election. One statement over the simple query protocol.
///
/// # Errors
/// [`StatusError::Query`] when the survey fails (with a lease: the candidate table missing,
/// `42P01`). Cancel-safe.
#[cfg(feature = "deadpool")]
pub async fn candidates(
    client: &tokio_postgres::Client,
    key: LockKey,
    published: Published<'_>,
    live: Duration,
) -> Result<Vec<CandidateStatus>, StatusError> {
    let messages = client.simple_query(&survey(key, published)).await?;
    Ok(candidates_of(
        &crate::session::text_rows(messages)?,
        key,
        live,
    ))
}

/// [`candidates`] on a session of any backend.
///
/// # Errors
/// As [`candidates`].
pub(crate) async fn candidates_on(
    session: &dyn LockSession,
    key: LockKey,
    published: Published<'_>,
    live: Duration,
) -> Result<Vec<CandidateStatus>, StatusError> {
    let rows = session
        .query(&survey(key, published))
        .await
        .map_err(crate::session::QueryError::into_cause)?;
    Ok(candidates_of(&rows, key, live))
}
