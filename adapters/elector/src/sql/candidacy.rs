//! The candidacy of a ranked replica ([`Config::version`](crate::Config::version)), published
//! where every replica of the election reads it without a coordinator, and the survey that
//! reads the others'.
//!
//! A candidacy reads, in either place,
//!
//! ```text
//! ~<class hex>.<obj hex> <priority> <version> <seen ms> <age ms> <identity>
//! ```
//!
//! `<seen ms>` is the server's unix time in milliseconds of the standby's last survey and
//! `<age ms>` how long its candidacy had gone on then: a candidacy is live while its last survey
//! is at most two intervals old, and has been live for `age + (now - seen)`.
//!
//! - **Advisory lock**: the standby's connection's `application_name` (63 bytes: the identity is
//!   cut to fit), read from `pg_stat_activity`, whose cost grows with the server's connections,
//!   not with its lock table. Sessions of another role show only when the reader may see them
//!   (the same role, a superuser, or `pg_read_all_stats`).
//! - **Lease**: a row of the unlogged table `plexsphere_leader_candidate` (no WAL; a crash
//!   empties it and the candidates publish again within an interval), written and read in one
//!   autocommit statement, so a transaction-mode pooler carries it.

use std::time::Duration;

use plexsphere_leader_core::rank::{Candidate, Rank, Version};

use super::quote_literal;
use crate::key::LockKey;

/// The unlogged table of the lease mechanism's candidacies.
pub const CANDIDATE_TABLE: &str = "plexsphere_leader_candidate";

/// How many intervals a candidacy stays live after its last survey.
pub const LIVE_INTERVALS: u32 = 2;

/// The server's unix time in whole milliseconds.
const NOW_MS: &str = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint";

/// `application_name`'s length.
const NAME_LEN: usize = 63;

/// The tag of `key`'s candidacies: `~<class hex>.<obj hex>`.
pub fn tag(key: LockKey) -> String {
    format!(
        "~{:x}.{:x}",
        key.class_id.cast_unsigned(),
        key.obj_id.cast_unsigned()
    )
}

/// The candidacy's text before its two times: `<tag> <priority> <version> `.
fn prefix(key: LockKey, rank: Rank) -> String {
    format!("{} {} {} ", tag(key), rank.priority, rank.version)
}

/// The standby's survey over the advisory lock: publishes `mine` in this session's
/// `application_name` (the identity cut to fit its 63 bytes) and reads every other live-looking
/// candidacy of `key` in this database, one row each: the candidacy and the server's unix
/// milliseconds. The leader's survey (`mine` `None`) only reads.
pub fn survey_sessions(key: LockKey, mine: Option<(Candidate, &str)>) -> String {
    let others = format!(
        "SELECT a.application_name, {NOW_MS} FROM pg_stat_activity a \
         WHERE a.datname = current_database() AND a.pid <> pg_backend_pid() \
         AND a.application_name LIKE {}",
        quote_literal(&format!("{} %", tag(key)))
    );
    let Some((candidate, identity)) = mine else {
        return others;
    };
    let prefix = prefix(key, candidate.rank);
    let age = millis(candidate.live_for);
    let fixed = prefix.len() + 13 + 1 + age.to_string().len() + 1;
    let identity = crate::identity::sanitize(identity);
    let identity: String = identity
        .chars()
        .take(NAME_LEN.saturating_sub(fixed))
        .collect();
    format!(
        "WITH me AS (SELECT set_config('application_name', concat({}, {NOW_MS}, {}), false)) \
         {others} AND EXISTS (SELECT 1 FROM me)",
        quote_literal(&prefix),
        quote_literal(&format!(" {age} {identity}"))
    )
}

/// The lease mechanism's survey, in `table` (the schema-qualified [`CANDIDATE_TABLE`]):
/// publishes `mine` as `holder`'s row (the standby's), reads every other candidacy of `key`
/// seen within an hour in the same form as [`survey_sessions`], and forgets the ones older.
pub fn survey_rows(table: &str, key: LockKey, holder: &str, mine: Option<Candidate>) -> String {
    let (c, o, holder) = (key.class_id, key.obj_id, quote_literal(holder));
    let publish = match mine {
        Some(candidate) => format!(
            "INSERT INTO {table} AS t (classid, objid, holder, candidacy, seen_ms, age_ms) \
             VALUES ({c}, {o}, {holder}, {prefix}, {NOW_MS}, {age}) \
             ON CONFLICT (classid, objid, holder) DO UPDATE SET candidacy = EXCLUDED.candidacy, \
             seen_ms = EXCLUDED.seen_ms, age_ms = EXCLUDED.age_ms RETURNING 1",
            prefix = quote_literal(&prefix(key, candidate.rank)),
            age = millis(candidate.live_for),
        ),
        None => "SELECT 1".to_owned(),
    };
    // Data-modifying `WITH` statements run once and to completion, read or not.
    format!(
        "WITH me AS ({publish}), \
         gone AS (DELETE FROM {table} WHERE classid = {c} AND objid = {o} \
         AND seen_ms < {NOW_MS} - 3600000 RETURNING 1) \
         SELECT concat(candidacy, seen_ms, ' ', age_ms, ' ', holder), {NOW_MS} FROM {table} \
         WHERE classid = {c} AND objid = {o} AND holder <> {holder}"
    )
}

/// `schema`'s candidate table, qualified.
pub fn candidate_table(schema: &str) -> String {
    format!("{schema}.{CANDIDATE_TABLE}")
}

/// The setup of [`CANDIDATE_TABLE`] as `table`: part of the lease's setup.
pub fn setup(table: &str) -> String {
    format!(
        "CREATE UNLOGGED TABLE IF NOT EXISTS {table} (\
         classid int4 NOT NULL, objid int4 NOT NULL, holder text NOT NULL, \
         candidacy text NOT NULL, seen_ms int8 NOT NULL, age_ms int8 NOT NULL, \
         PRIMARY KEY (classid, objid, holder));"
    )
}

/// A surveyed candidacy of `key` (a row: its text and the server's unix milliseconds), when it
/// is well formed, of `key`, and live: its last survey at most `live` before `now_ms`.
pub fn parse(text: &str, now_ms: i64, key: LockKey, live: Duration) -> Option<Candidate> {
    let mut fields = text.splitn(6, ' ');
    if fields.next()? != tag(key) {
        return None;
    }
    let priority = fields.next()?.parse().ok()?;
    let version = Version::parse(fields.next()?).ok()?;
    let seen: i64 = fields.next()?.parse().ok()?;
    let age: u64 = fields.next()?.parse().ok()?;
    let since_seen = u64::try_from(now_ms.saturating_sub(seen)).unwrap_or(0);
    if u128::from(since_seen) > live.as_millis() {
        return None;
    }
    Some(Candidate {
        rank: Rank { priority, version },
        live_for: Duration::from_millis(age.saturating_add(since_seen)),
    })
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn candidate(version: &str, live_ms: u64) -> Candidate {
        Candidate {
            rank: Rank {
                priority: 2,
                version: Version::parse(version).unwrap_or_else(|e| panic!("{e}")),
            },
            live_for: Duration::from_millis(live_ms),
        }
    }

    #[test]
    fn a_candidacy_reads_back_with_its_age_when_live() {
        let key = LockKey::DEFAULT;
        let text = "~706c7873.1 2 1.4.0-rc.1 1000000 250 billing@web-3";
        let live = Duration::from_secs(2);
        assert_eq!(
            parse(text, 1_000_100, key, live),
            Some(candidate("1.4.0-rc.1", 350))
        );
        // Stale: last surveyed more than two intervals ago.
        assert_eq!(parse(text, 1_002_001, key, live), None);
        // Another key's, or malformed.
        assert_eq!(parse(text, 1_000_100, LockKey::new(1, 2), live), None);
        for bad in [
            "",
            "billing@web-3 since 1700000000",
            "~706c7873.1 x 1.4.0 1000000 250 a",
            "~706c7873.1 2 1..4 1000000 250 a",
            "~706c7873.1 2 1.4.0 1000000",
        ] {
            assert_eq!(parse(bad, 1_000_100, key, live), None, "{bad}");
        }
    }

    #[test]
    fn the_published_name_fits_application_name_and_names_the_key() {
        let statement = survey_sessions(
            LockKey::DEFAULT,
            Some((candidate("10.20.30", 1_234), &"x".repeat(60))),
        );
        assert!(
            statement.contains("'~706c7873.1 2 10.20.30 '"),
            "{statement}"
        );
        // The prefix (23 bytes), 13 digits, " 1234 " (6) and the identity cut to 21: 63.
        assert!(
            statement.contains(&format!("' 1234 {}'", "x".repeat(21))),
            "{statement}"
        );
        assert!(statement.contains("LIKE '~706c7873.1 %'"), "{statement}");
        let leader = survey_sessions(LockKey::DEFAULT, None);
        assert!(!leader.contains("set_config"), "{leader}");
    }
}
