//! The statements of a sharded election, recognised whole.
//!
//! `plexsphere_leader::shard_sql` builds five statements (register, survey, take, unlock,
//! owners; its `unlock_all` is the plain `SELECT pg_advisory_unlock_all()` the general parser
//! knows). Their joins, aggregates and `unnest` are far beyond the general parser of `sql`,
//! and the simulation needs them only as the adapter sends them, so each is matched as a
//! whole: its parameters (class id, shard count, shard list, identity, idle timeout) are read
//! out of the text, the statement is built again with those parameters by the adapter's own
//! function, and only an identical text is that statement. A text that begins like one of
//! them but differs (a new `shard_sql`, a typo in a test) fails with 0A000 naming the
//! statement, instead of being executed as something it is not. What each statement does is
//! in `exec::shards`.

use plexsphere_leader::rank::FloorStep;
use plexsphere_leader::shard_sql;
use plexsphere_leader::sharded::Shard;

use super::reply::SqlError;
use super::text::{between, rebuilt, unquote};

/// A statement of `plexsphere_leader::shard_sql` with its parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ShardStatement {
    /// `shard_sql::register`: join the space of `class` (the shared member lock), bounded by
    /// `idle_timeout_ms` and named `identity` when granted.
    Register {
        class: i32,
        identity: String,
        idle_timeout_ms: u32,
    },
    /// `shard_sql::survey`: the space's holders, with the answering backend.
    Survey { class: i32, count: u32 },
    /// `shard_sql::owners`: the space's holders, for any session.
    Owners { class: i32, count: u32 },
    /// `shard_sql::take`: try each shard's lock; a row per grant.
    Take { class: i32, shards: Vec<u32> },
    /// `shard_sql::unlock`: unlock each shard; a row per shard not held.
    Unlock { class: i32, shards: Vec<u32> },
}

/// The shard statement `query` is, if it begins like one: `None` when it does not (the
/// general parser takes it), `Some(Err)` with 0A000 when it begins like one but is not the
/// text `shard_sql` builds.
pub(crate) fn recognise(query: &str) -> Option<Result<ShardStatement, SqlError>> {
    let text = query.trim();
    let (name, statement) = if text.starts_with(REGISTER) {
        ("register", register(text))
    } else if text.starts_with(SURVEY) {
        (
            "survey",
            space(text).map(|(class, count)| ShardStatement::Survey { class, count }),
        )
    } else if text.starts_with(OWNERS) {
        (
            "owners",
            space(text).map(|(class, count)| ShardStatement::Owners { class, count }),
        )
    } else if text.starts_with(LIST) && text.contains(UNLOCK_CALL) {
        (
            "unlock",
            list(text, UNLOCK_CALL).map(|(class, shards)| ShardStatement::Unlock { class, shards }),
        )
    } else if text.starts_with(LIST) {
        (
            "take",
            list(text, TAKE_CALL).map(|(class, shards)| ShardStatement::Take { class, shards }),
        )
    } else {
        return None;
    };
    let builder = format!("plexsphere_leader::shard_sql::{name}");
    Some(rebuilt(text, statement, build, &builder))
}

/// The text `shard_sql` builds for `statement`.
pub(crate) fn build(statement: &ShardStatement) -> String {
    let shards = |numbers: &[u32]| numbers.iter().copied().map(Shard::new).collect::<Vec<_>>();
    match statement {
        ShardStatement::Register {
            class,
            identity,
            idle_timeout_ms,
        } => shard_sql::register(*class, identity, *idle_timeout_ms),
        ShardStatement::Survey { class, count } => {
            shard_sql::survey(*class, *count, FloorStep::Off)
        }
        ShardStatement::Owners { class, count } => shard_sql::owners(*class, *count),
        ShardStatement::Take { class, shards: s } => shard_sql::take(*class, &shards(s)),
        ShardStatement::Unlock { class, shards: s } => shard_sql::unlock(*class, &shards(s)),
    }
}

const REGISTER: &str = "SELECT pg_backend_pid(), CASE WHEN pg_is_in_recovery()";
const SURVEY: &str = "SELECT h.pid, h.member, h.shards, a.application_name, me.backend";
const OWNERS: &str = "SELECT h.pid, a.application_name, h.member, h.shard_count, h.shards";
const LIST: &str = "SELECT t.s FROM unnest('{";
const TAKE_CALL: &str = "pg_try_advisory_lock(";
const UNLOCK_CALL: &str = "WHERE NOT pg_advisory_unlock(";

fn register(text: &str) -> Option<ShardStatement> {
    let class = between(text, "pg_try_advisory_lock_shared(", ", -1)")?
        .parse()
        .ok()?;
    let idle_timeout_ms = between(text, "set_config('idle_session_timeout', '", "'")?
        .parse()
        .ok()?;
    let literal = between(
        text,
        "set_config('application_name', ",
        ", false) IS NULL THEN true ELSE true END",
    )?;
    Some(ShardStatement::Register {
        class,
        identity: unquote(literal)?,
        idle_timeout_ms,
    })
}

/// The class id and shard count of a survey or owners statement: `l.classid = <oid>::oid`
/// and `l.objid < <count>::oid`.
fn space(text: &str) -> Option<(i32, u32)> {
    let oid: u32 = between(text, "l.classid = ", "::oid")?.parse().ok()?;
    let count = between(text, "l.objid < ", "::oid")?.parse().ok()?;
    Some((i32::from_ne_bytes(oid.to_ne_bytes()), count))
}

/// The class id and the shard list of a take or unlock statement.
fn list(text: &str, call: &str) -> Option<(i32, Vec<u32>)> {
    let numbers = between(text, LIST, "}'::int4[])")?;
    let shards = if numbers.is_empty() {
        Vec::new()
    } else {
        numbers
            .split(',')
            .map(str::parse)
            .collect::<Result<Vec<u32>, _>>()
            .ok()?
    };
    let class = between(text, call, ", t.s)")?.parse().ok()?;
    Some((class, shards))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::checks;

    fn shards(numbers: &[u32]) -> Vec<Shard> {
        numbers.iter().copied().map(Shard::new).collect()
    }

    #[test]
    fn every_statement_is_recognised_with_its_parameters() {
        let cases = [
            ShardStatement::Register {
                class: -7,
                identity: "r0.1".to_owned(),
                idle_timeout_ms: 400,
            },
            ShardStatement::Register {
                class: 1,
                identity: r"o'b\rien".to_owned(),
                idle_timeout_ms: 20_000,
            },
            ShardStatement::Survey {
                class: -2,
                count: 16,
            },
            ShardStatement::Owners {
                class: 1_886_155_624,
                count: 1024,
            },
            ShardStatement::Take {
                class: 9,
                shards: vec![0, 3, 7],
            },
            ShardStatement::Take {
                class: 9,
                shards: vec![],
            },
            ShardStatement::Unlock {
                class: i32::MIN,
                shards: vec![5],
            },
        ];
        checks::recognised_as_built(cases, build, recognise);
    }

    #[test]
    fn a_text_that_begins_like_a_shard_statement_but_differs_is_0a000() {
        let take = shard_sql::take(3, &shards(&[1, 2]));
        let unsorted = take.replace("{1,2}", "{2,1}");
        let lower = shard_sql::survey(3, 8, FloorStep::Off).replace("ORDER BY", "order by");
        checks::refused([unsorted, lower, format!("{take} AND true")], recognise);
        assert_eq!(recognise("SELECT 1"), None);
        assert_eq!(
            recognise(&shard_sql::unlock_all()),
            None,
            "the general parser's"
        );
    }
}
