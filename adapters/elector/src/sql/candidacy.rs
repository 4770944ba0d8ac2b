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

use plexsphere_leader_core::rank::{Candidate, FloorStep, Rank, Version};

use super::{DURABLE_COMMIT, quote_literal};
use crate::key::LockKey;

/// The unlogged table of the lease mechanism's candidacies.
pub const CANDIDATE_TABLE: &str = "plexsphere_leader_candidate";

/// The table of the version floors ([`Config::version_floor`](crate::Config::version_floor)):
/// per election key, the newest version that has led, and its
/// [sort key](plexsphere_leader_core::rank::Version::sort_key). Logged: a floor outlives a
/// crash and a failover. Created by [`lease::setup`](crate::lease::setup) in the lease's
/// schema, and by [`floor::setup`](crate::floor::setup) (unqualified, as the fence table is)
/// for the advisory lock.
pub const FLOOR_TABLE: &str = "plexsphere_leader_floor";

/// The setup of a floor table named `table`.
pub fn floor_setup(table: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {table} (\
         classid int4 NOT NULL, objid int4 NOT NULL, version text NOT NULL, \
         sort_key text NOT NULL, PRIMARY KEY (classid, objid))"
    )
}

/// The floor of `key` in `table` after `step`, for a statement to read: a `WITH` entry
/// (`floor_step AS (…)`, raising or setting the floor, durably with [`with`]) when the step
/// writes, and the SQL expression of the floor's version text after it (`NULL` when none is
/// recorded); `None` when the floor is off. Also the shard space's floor, under the key
/// `(class, -1)` of its member lock.
pub(crate) fn floor_step(
    table: &str,
    key: LockKey,
    step: FloorStep,
) -> Option<(Option<String>, String)> {
    let (c, o) = (key.class_id, key.obj_id);
    let written = |version: Version, only_newer: bool| {
        format!(
            "floor_step AS (INSERT INTO {table} AS f (classid, objid, version, sort_key) \
             VALUES ({c}, {o}, {}, {}) ON CONFLICT (classid, objid) DO UPDATE \
             SET version = EXCLUDED.version, sort_key = EXCLUDED.sort_key{} RETURNING version)",
            quote_literal(&version.to_string()),
            quote_literal(&version.sort_key()),
            if only_newer {
                " WHERE f.sort_key COLLATE \"C\" < EXCLUDED.sort_key COLLATE \"C\""
            } else {
                ""
            }
        )
    };
    let recorded = format!("(SELECT version FROM {table} WHERE classid = {c} AND objid = {o})");
    let after_step = format!("coalesce((SELECT version FROM floor_step), {recorded})");
    match step {
        FloorStep::Off => None,
        FloorStep::Read => Some((None, recorded)),
        FloorStep::Raise(version) => Some((Some(written(version, true)), after_step)),
        FloorStep::Set(version) => Some((Some(written(version, false)), after_step)),
    }
}

/// The floor's part of a candidates' survey, in `table`: [`floor_step`]'s `WITH` entry, and
/// the row that reads it (`=<version>` and the server's unix milliseconds) when the floor is on.
fn floor_parts(table: &str, key: LockKey, step: FloorStep) -> (Option<String>, String) {
    match floor_step(table, key, step) {
        None => (None, String::new()),
        Some((entry, version)) => (
            entry,
            format!(
                " UNION ALL SELECT concat('=', v), {NOW_MS} FROM (SELECT {version} AS v) floor \
                 WHERE v IS NOT NULL"
            ),
        ),
    }
}

/// `WITH` over `entries`, and the durable commit before it when the floor is written.
pub(crate) fn with(entries: &[Option<String>], floor_written: bool) -> String {
    let entries: Vec<&str> = entries.iter().flatten().map(String::as_str).collect();
    let durable = if floor_written { DURABLE_COMMIT } else { "" };
    if entries.is_empty() {
        durable.to_owned()
    } else {
        format!("{durable}WITH {} ", entries.join(", "))
    }
}

/// The version floor a survey's rows carry (`=<version>`), if any.
pub fn floor_of(text: &str) -> Option<Version> {
    Version::parse(text.strip_prefix('=')?).ok()
}

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
/// milliseconds. The leader's survey (`mine` `None`) only reads. With the floor on (`floor`:
/// its table and step), one more row reads `=<version>`, after the leader's step raised or set
/// it (durably).
pub fn survey_sessions(
    key: LockKey,
    mine: Option<(Candidate, &str)>,
    floor: (&str, FloorStep),
) -> String {
    let (floor_step, floor_row) = floor_parts(floor.0, key, floor.1);
    let me = mine.map(|(candidate, identity)| {
        let prefix = prefix(key, candidate.rank);
        let age = millis(candidate.live_for);
        let fixed = prefix.len() + 13 + 1 + age.to_string().len() + 1;
        let identity = crate::identity::sanitize(identity);
        let identity: String = identity
            .chars()
            .take(NAME_LEN.saturating_sub(fixed))
            .collect();
        format!(
            "me AS (SELECT set_config('application_name', concat({}, {NOW_MS}, {}), false))",
            quote_literal(&prefix),
            quote_literal(&format!(" {age} {identity}"))
        )
    });
    let published = if me.is_some() {
        " AND EXISTS (SELECT 1 FROM me)"
    } else {
        ""
    };
    format!(
        "{}SELECT a.application_name, {NOW_MS} FROM pg_stat_activity a \
         WHERE a.datname = current_database() AND a.pid <> pg_backend_pid() \
         AND a.application_name LIKE {}{published}{floor_row}",
        with(&[me, floor_step.clone()], floor_step.is_some()),
        quote_literal(&format!("{} %", tag(key)))
    )
}

/// The lease mechanism's survey, in `table` (the schema-qualified [`CANDIDATE_TABLE`]):
/// publishes `mine` as `holder`'s row (the standby's), reads every other candidacy of `key`
/// seen within an hour in the same form as [`survey_sessions`], and forgets the ones older;
/// with the floor on, as [`survey_sessions`] does.
pub fn survey_rows(
    table: &str,
    key: LockKey,
    holder: &str,
    mine: Option<Candidate>,
    floor: (&str, FloorStep),
) -> String {
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
    let (floor_step, floor_row) = floor_parts(floor.0, key, floor.1);
    // Data-modifying `WITH` statements run once and to completion, read or not.
    let entries = [
        Some(format!("me AS ({publish})")),
        Some(format!(
            "gone AS (DELETE FROM {table} WHERE classid = {c} AND objid = {o} \
             AND seen_ms < {NOW_MS} - 3600000 RETURNING 1)"
        )),
        floor_step.clone(),
    ];
    format!(
        "{}SELECT concat(candidacy, seen_ms, ' ', age_ms, ' ', holder), {NOW_MS} FROM {table} \
         WHERE classid = {c} AND objid = {o} AND holder <> {holder}{floor_row}",
        with(&entries, floor_step.is_some())
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
/// is well formed, of `key`, and live: its last survey at most `live` before `now_ms`; with the
/// identity it names (cut to fit `application_name` with the advisory lock).
pub fn parse(text: &str, now_ms: i64, key: LockKey, live: Duration) -> Option<(Candidate, &str)> {
    let mut fields = text.splitn(6, ' ');
    if fields.next()? != tag(key) {
        return None;
    }
    let priority = fields.next()?.parse().ok()?;
    let version = Version::parse(fields.next()?).ok()?;
    let seen: i64 = fields.next()?.parse().ok()?;
    let age: u64 = fields.next()?.parse().ok()?;
    let identity = fields.next().unwrap_or("");
    let since_seen = u64::try_from(now_ms.saturating_sub(seen)).unwrap_or(0);
    if u128::from(since_seen) > live.as_millis() {
        return None;
    }
    let candidate = Candidate {
        rank: Rank { priority, version },
        live_for: Duration::from_millis(age.saturating_add(since_seen)),
    };
    Some((candidate, identity))
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
            Some((candidate("1.4.0-rc.1", 350), "billing@web-3"))
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
            (FLOOR_TABLE, FloorStep::Off),
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
        let leader = survey_sessions(LockKey::DEFAULT, None, (FLOOR_TABLE, FloorStep::Off));
        assert!(!leader.contains("set_config"), "{leader}");
    }
}
