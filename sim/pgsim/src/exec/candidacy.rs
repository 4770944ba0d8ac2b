//! What the surveys of ranked replicas do (`plexsphere_leader::sql::candidacy`, recognised by
//! `candidacy`): the answers PostgreSQL gives them.
//!
//! The server's milliseconds are `(extract(epoch FROM clock_timestamp()) * 1000)::bigint`: the
//! server's clock when the statement runs, rounded to the millisecond as the cast rounds.
//!
//! - `survey_sessions`: the standby's form sets its session's `application_name` (session
//!   level, reported with ParameterStatus as any change of it) to the candidacy with the
//!   server's milliseconds: the CTE's `set_config` is an uncorrelated `EXISTS`, which
//!   PostgreSQL evaluates once, as a one-time filter, before it scans `pg_stat_activity`.
//!   The rows: every other session of this database whose current `application_name` begins
//!   with the key's tag and a space (the `LIKE`), by pid, each with the server's milliseconds.
//!   A session that ended is gone from `pg_stat_activity`.
//! - `survey_rows`: on a hot standby, 0A000 (an unlogged table cannot be read in recovery); no
//!   candidate table, 42P01. The rows are those of other holders of the key as the statement
//!   found them (the main query of a `WITH` does not see its data-modifying CTEs' changes), by
//!   holder; then the standby's form upserts its row, and the rows of the key seen more than
//!   an hour ago are deleted. The rows belong to the instance (`State::candidates`): a crash
//!   empties them, and a standby never had them.

use super::{Ctx, Stop, no_table, server_micros};
use crate::candidacy::{CandidacyStatement, Published};
use crate::guc::Guc;
use crate::reply::{PgType, SqlError, sqlstate};
use crate::state::CandidateRow;

/// The candidate table's name.
const CANDIDATE_TABLE: &str = plexsphere_leader::sql::candidacy::CANDIDATE_TABLE;

const SESSIONS_COLUMNS: [(&str, PgType); 2] =
    [("application_name", PgType::Text), ("int8", PgType::Int8)];
const ROWS_COLUMNS: [(&str, PgType); 2] = [("concat", PgType::Text), ("int8", PgType::Int8)];

/// How long a candidacy row is kept after it was last seen: an hour.
const FORGET_MS: i64 = 3_600_000;

/// The result columns of `statement`, as a Describe reports them.
pub(super) fn columns(statement: &CandidacyStatement) -> &'static [(&'static str, PgType)] {
    match statement {
        CandidacyStatement::Sessions { .. } => &SESSIONS_COLUMNS,
        CandidacyStatement::Rows { .. } => &ROWS_COLUMNS,
    }
}

/// The candidacy's tag of `key` and a space: what the `LIKE '<tag> %'` matches the start of.
fn tag_of((class, obj): (i32, i32)) -> String {
    format!("~{:x}.{:x} ", class.cast_unsigned(), obj.cast_unsigned())
}

impl Ctx<'_> {
    pub(super) fn candidacy(&mut self, statement: &CandidacyStatement) -> Result<(), Stop> {
        match statement {
            CandidacyStatement::Sessions { key, mine } => self.survey_sessions(*key, mine.as_ref()),
            CandidacyStatement::Rows { key, holder, mine } => {
                self.survey_rows(*key, holder, mine.as_ref())
            }
        }
    }

    /// The server's unix milliseconds now, as `::bigint` rounds them.
    fn now_ms(&self) -> i64 {
        (server_micros(self.at) + 500).div_euclid(1000)
    }

    fn survey_sessions(
        &mut self,
        key: (i32, i32),
        mine: Option<&(Published, String)>,
    ) -> Result<(), Stop> {
        let now_ms = self.now_ms();
        if let Some((published, identity)) = mine {
            let name = format!(
                "{}{now_ms} {} {identity}",
                published.prefix, published.age_ms
            );
            self.set_guc(&Guc::ApplicationName, &name, false)?;
        }
        let database = self.database()?;
        let tag = tag_of(key);
        let rows: Vec<[Option<String>; 2]> = self
            .state
            .sessions
            .iter()
            .filter(|(pid, session)| {
                **pid != self.pid
                    && session.database == database
                    && session.gucs.application_name.starts_with(&tag)
            })
            .map(|(_, session)| {
                [
                    Some(session.gucs.application_name.clone()),
                    Some(now_ms.to_string()),
                ]
            })
            .collect();
        self.send_result(&SESSIONS_COLUMNS, &rows, "SELECT");
        Ok(())
    }

    fn survey_rows(
        &mut self,
        key: (i32, i32),
        holder: &str,
        mine: Option<&Published>,
    ) -> Result<(), Stop> {
        if self.state.in_recovery {
            return Err(SqlError::error(
                sqlstate::FEATURE_NOT_SUPPORTED,
                "cannot access temporary or unlogged relations during recovery",
            )
            .into());
        }
        let database = self.database()?;
        if !self.storage().has_candidates(&database, CANDIDATE_TABLE) {
            return Err(no_table(CANDIDATE_TABLE).into());
        }
        let now_ms = self.now_ms();
        let of_key = |(db, k, _): &(String, (i32, i32), String)| *db == database && *k == key;
        let rows: Vec<[Option<String>; 2]> = self
            .state
            .candidates
            .iter()
            .filter(|(id, _)| of_key(id) && id.2 != holder)
            .map(|((_, _, other), row)| {
                let text = format!("{}{} {} {other}", row.candidacy, row.seen_ms, row.age_ms);
                [Some(text), Some(now_ms.to_string())]
            })
            .collect();
        if let Some(published) = mine {
            let row = CandidateRow {
                candidacy: published.prefix.clone(),
                seen_ms: now_ms,
                age_ms: i64::try_from(published.age_ms).unwrap_or(i64::MAX),
            };
            let id = (database.clone(), key, holder.to_owned());
            self.state.candidates.insert(id, row);
        }
        self.state
            .candidates
            .retain(|id, row| !(of_key(id) && row.seen_ms < now_ms - FORGET_MS));
        self.send_result(&ROWS_COLUMNS, &rows, "SELECT");
        Ok(())
    }
}
