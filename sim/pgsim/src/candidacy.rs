//! The surveys of ranked replicas (`plexsphere_leader::sql::candidacy`), recognised whole.
//!
//! The adapter builds two statements, each in a standby's form (it publishes its candidacy)
//! and a leader's (it only reads): `survey_sessions` over the advisory lock, which sets the
//! session's `application_name` in a `WITH me AS (SELECT set_config(…))` CTE and reads the
//! other sessions' names from `pg_stat_activity`, and `survey_rows` over the lease, which
//! upserts the standby's row of the unlogged `plexsphere_leader_candidate` and reads the
//! others'. As the lease statements (`lease`), each is matched as a whole: its parameters are
//! read out of the text, the statement is built again by the adapter's own function, and only
//! an identical text is that statement; one that begins like a survey but differs fails with
//! 0A000. What each does is in `exec::candidacy`.

use std::time::Duration;

use plexsphere_leader::LockKey;
use plexsphere_leader::rank::{Candidate, FloorStep, Rank, Version};
use plexsphere_leader::sql::{candidacy, lease};

use super::reply::SqlError;
use super::text::{between, rebuilt, unquote};

/// A candidacy as the statement publishes it: the rank and the age it reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Published {
    /// `<tag> <priority> <version> `: the text before the server's milliseconds.
    pub(crate) prefix: String,
    /// The candidate's priority and version, read from `prefix`.
    pub(crate) rank: (u32, String),
    /// How long its candidacy had gone on, in milliseconds.
    pub(crate) age_ms: u64,
}

/// A survey statement of `plexsphere_leader::sql::candidacy` with its parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CandidacyStatement {
    /// `survey_sessions`: with `mine`, set this session's `application_name` to the
    /// candidacy (its prefix, the server's unix ms, then `" <age> <identity>"`, the identity
    /// as the adapter cut it); then the other sessions of this database named as candidates
    /// of `key`.
    Sessions {
        key: (i32, i32),
        mine: Option<(Published, String)>,
    },
    /// `survey_rows`: with `mine`, upsert `holder`'s row of `key`; forget the rows of `key`
    /// older than an hour; the rows of `key` of other holders, as they were before.
    Rows {
        key: (i32, i32),
        holder: String,
        mine: Option<Published>,
    },
}

/// The survey statement `query` is, if it begins like one: `None` when it does not, `Some(Err)`
/// with 0A000 when it begins like one but is not the text `sql::candidacy` builds.
pub(crate) fn recognise(query: &str) -> Option<Result<CandidacyStatement, SqlError>> {
    let text = query.trim();
    let (name, statement) = if text.starts_with(SESSIONS_MINE) || text.starts_with(SESSIONS) {
        ("survey_sessions", sessions(text))
    } else if text.starts_with(ROWS_MINE) || text.starts_with(ROWS) {
        ("survey_rows", rows(text))
    } else {
        return None;
    };
    let builder = format!("plexsphere_leader::sql::candidacy::{name}");
    Some(rebuilt(text, statement, build, &builder))
}

/// The text `sql::candidacy` builds for `statement` (in the default schema, unqualified).
pub(crate) fn build(statement: &CandidacyStatement) -> String {
    let lock = |(class_id, obj_id): (i32, i32)| LockKey::new(class_id, obj_id);
    match statement {
        CandidacyStatement::Sessions { key, mine } => {
            let mine = mine
                .as_ref()
                .and_then(|(published, identity)| Some((candidate(published)?, identity)));
            candidacy::survey_sessions(
                lock(*key),
                mine.as_ref().map(|(c, identity)| (*c, identity.as_str())),
                (candidacy::FLOOR_TABLE, FloorStep::Off),
            )
        }
        CandidacyStatement::Rows { key, holder, mine } => {
            let table = candidacy::candidate_table(lease::DEFAULT_SCHEMA);
            let mine = mine.as_ref().and_then(candidate);
            super::lease::unqualified(&candidacy::survey_rows(
                &table,
                lock(*key),
                holder,
                mine,
                (candidacy::FLOOR_TABLE, FloorStep::Off),
            ))
        }
    }
}

/// The candidate `published` stands for (`None` for a version the core does not parse).
fn candidate(published: &Published) -> Option<Candidate> {
    let (priority, version) = &published.rank;
    Some(Candidate {
        rank: Rank {
            priority: *priority,
            version: Version::parse(version).ok()?,
        },
        live_for: Duration::from_millis(published.age_ms),
    })
}

const SESSIONS: &str = "SELECT a.application_name, (extract(epoch FROM clock_timestamp()) \
                        * 1000)::bigint FROM pg_stat_activity a";
const SESSIONS_MINE: &str = "WITH me AS (SELECT set_config('application_name', concat(";
const ROWS: &str = "WITH me AS (SELECT 1), gone AS (DELETE FROM ";
const ROWS_MINE: &str = "WITH me AS (INSERT INTO ";
/// Where the server's milliseconds follow a literal.
const NOW_MS: &str = ", (extract(epoch FROM clock_timestamp()) * 1000)::bigint";

/// The key of a candidacy tag `~<class hex>.<obj hex>`.
fn tag_key(tag: &str) -> Option<(i32, i32)> {
    let (class, obj) = tag.strip_prefix('~')?.split_once('.')?;
    let half = |hex: &str| u32::from_str_radix(hex, 16).ok().map(u32::cast_signed);
    Some((half(class)?, half(obj)?))
}

/// The rank and age of a published prefix `<tag> <priority> <version> ` and age.
fn published(prefix: String, age_ms: u64) -> Option<Published> {
    let mut fields = prefix.split(' ');
    let (_tag, priority, version) = (fields.next()?, fields.next()?, fields.next()?);
    let rank = (priority.parse().ok()?, version.to_owned());
    Some(Published {
        prefix,
        rank,
        age_ms,
    })
}

fn sessions(text: &str) -> Option<CandidacyStatement> {
    let key = tag_key(between(text, "a.application_name LIKE '", " %'")?)?;
    let mine = if text.starts_with(SESSIONS_MINE) {
        let prefix = unquote(between(text, SESSIONS_MINE, NOW_MS)?)?;
        let rest = between(text, NOW_MS, "), false))")?.strip_prefix(", ")?;
        let suffix = unquote(rest)?;
        let (age, identity) = suffix.strip_prefix(' ')?.split_once(' ')?;
        Some((published(prefix, age.parse().ok()?)?, identity.to_owned()))
    } else {
        None
    };
    Some(CandidacyStatement::Sessions { key, mine })
}

fn rows(text: &str) -> Option<CandidacyStatement> {
    let class = between(text, "WHERE classid = ", " AND objid = ")?
        .parse()
        .ok()?;
    let obj = between(text, " AND objid = ", " AND seen_ms < ")?
        .parse()
        .ok()?;
    let holder_literal = text.rsplit_once(" AND holder <> ")?.1;
    let holder = unquote(holder_literal)?;
    let mine = if text.starts_with(ROWS_MINE) {
        let values = format!("VALUES ({class}, {obj}, {holder_literal}, ");
        let prefix = unquote(between(text, &values, NOW_MS)?)?;
        let age = between(text, &format!("{NOW_MS}, "), ") ON CONFLICT")?;
        Some(published(prefix, age.parse().ok()?)?)
    } else {
        None
    };
    Some(CandidacyStatement::Rows {
        key: (class, obj),
        holder,
        mine,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::checks;

    fn mine(version: &str, age_ms: u64) -> Published {
        let key = LockKey::new(-7, 16);
        Published {
            prefix: format!("{} 3 {version} ", candidacy::tag(key)),
            rank: (3, version.to_owned()),
            age_ms,
        }
    }

    #[test]
    fn every_survey_is_recognised_with_its_parameters() {
        let cases = [
            CandidacyStatement::Sessions {
                key: (-7, 16),
                mine: None,
            },
            CandidacyStatement::Sessions {
                key: (-7, 16),
                mine: Some((mine("2.0.0-rc.1", 250), "r0.1".to_owned())),
            },
            CandidacyStatement::Rows {
                key: (-7, 16),
                holder: r"r1.2 o'b\rien".to_owned(),
                mine: None,
            },
            CandidacyStatement::Rows {
                key: (-7, 16),
                holder: "r1.2 00ff00ff00ff00ff".to_owned(),
                mine: Some(mine("1.4.2", 0)),
            },
        ];
        checks::recognised_as_built(cases, build, recognise);
    }

    #[test]
    fn a_text_that_begins_like_a_survey_but_differs_is_0a000() {
        let key = LockKey::DEFAULT;
        let leader =
            candidacy::survey_sessions(key, None, (candidacy::FLOOR_TABLE, FloorStep::Off));
        let table = candidacy::candidate_table(lease::DEFAULT_SCHEMA);
        let rows = super::super::lease::unqualified(&candidacy::survey_rows(
            &table,
            key,
            "a",
            None,
            (candidacy::FLOOR_TABLE, FloorStep::Off),
        ));
        checks::refused(
            [
                leader.replace("a.pid <> ", "a.pid = "),
                format!("{rows} ORDER BY 1"),
                rows.replace("3600000", "60000"),
            ],
            recognise,
        );
        assert_eq!(recognise("SELECT 1"), None);
    }
}
