//! The statements of a shard space held by leases, recognised whole.
//!
//! `plexsphere_leader::shard_sql::lease` builds six statements besides its setup (register,
//! renew, survey, take, release, leave; the setup's `CREATE SEQUENCE` and `CREATE TABLE`s are
//! the general parser's). Their CTEs, aggregates, `unnest` and `ON CONFLICT … WHERE` are
//! beyond the general parser, so, as the advisory shard statements (`shard`) and the single
//! lease's (`lease`), each is matched as a whole: its parameters (class, member, holder, TTL,
//! shard list, count, lock timeout) are read out of the text, the statement is built again by
//! the adapter's own function, and only an identical text is that statement; a text that begins
//! like one but differs fails with 0A000 naming the statement. What each does is in
//! `exec::shard_lease`.

use plexsphere_leader::rank::FloorStep;
use plexsphere_leader::shard_sql::lease;
use plexsphere_leader::sharded::{MemberId, Shard};

use super::lease::unqualified;
use super::reply::SqlError;
use super::text::{between, rebuilt, unquote};

/// A statement of `plexsphere_leader::shard_sql::lease` with its parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ShardLeaseStatement {
    /// `lease::register`: a new member of space `class` named `holder`, live for `ttl_ms`.
    Register {
        class: i32,
        holder: String,
        ttl_ms: u32,
    },
    /// `lease::renew`: `member`'s unexpired row lives `ttl_ms` from now; the live members.
    Renew {
        class: i32,
        member: i32,
        holder: String,
        ttl_ms: u32,
    },
    /// `lease::survey`: the live members with their shards below `count`.
    Survey { class: i32, count: u32 },
    /// `lease::take`: reap the expired members, then own each free one of `shards` for a live
    /// `member`, advancing its fence row; bounded by `lock_timeout_ms`.
    Take {
        class: i32,
        member: i32,
        shards: Vec<u32>,
        lock_timeout_ms: u32,
    },
    /// `lease::release`: free each of `shards` still `member`'s.
    Release {
        class: i32,
        member: i32,
        shards: Vec<u32>,
    },
    /// `lease::leave`: free every shard of `member` and delete its row.
    Leave { class: i32, member: i32 },
}

/// The shard lease statement `query` is, if it begins like one: `None` when it does not,
/// `Some(Err)` with 0A000 when it begins like one but is not the text `shard_sql::lease`
/// builds.
pub(crate) fn recognise(query: &str) -> Option<Result<ShardLeaseStatement, SqlError>> {
    let text = query.trim();
    let (name, statement) = if text.starts_with(REGISTER) {
        ("register", register(text))
    } else if text.starts_with(RENEW) {
        ("renew", renew(text))
    } else if text.starts_with(SURVEY) {
        ("survey", survey(text))
    } else if text.starts_with(TAKE) && text.contains(TAKE_CTE) {
        ("take", take(text))
    } else if text.starts_with(FREE) && text.contains(LEAVE_DELETE) {
        ("leave", leave(text))
    } else if text.starts_with(FREE) {
        ("release", release(text))
    } else {
        return None;
    };
    let builder = format!("plexsphere_leader::shard_sql::lease::{name}");
    Some(rebuilt(text, statement, build, &builder))
}

/// Where the statement proper begins after the `SET LOCAL`s (and, for a take, the
/// transaction lock) that the general parser reads.
pub(crate) fn proper(statement: &ShardLeaseStatement) -> Option<&'static str> {
    match statement {
        ShardLeaseStatement::Register { .. } => Some("INSERT INTO "),
        ShardLeaseStatement::Renew { .. } => Some("WITH renewed AS ("),
        ShardLeaseStatement::Take { .. } => Some(TAKE_CTE),
        _ => None,
    }
}

/// The text `shard_sql::lease` builds for `statement` (in the default schema, unqualified).
pub(crate) fn build(statement: &ShardLeaseStatement) -> String {
    let schema = plexsphere_leader::sql::lease::DEFAULT_SCHEMA;
    let shards = |numbers: &[u32]| numbers.iter().copied().map(Shard::new).collect::<Vec<_>>();
    unqualified(&match statement {
        ShardLeaseStatement::Register {
            class,
            holder,
            ttl_ms,
        } => lease::register(schema, *class, holder, *ttl_ms, FloorStep::Off),
        ShardLeaseStatement::Renew {
            class,
            member,
            holder,
            ttl_ms,
        } => lease::renew(schema, *class, MemberId::new(*member), holder, *ttl_ms),
        ShardLeaseStatement::Survey { class, count } => {
            lease::survey(schema, *class, *count, FloorStep::Off)
        }
        ShardLeaseStatement::Take {
            class,
            member,
            shards: s,
            lock_timeout_ms,
        } => lease::take(
            schema,
            *class,
            MemberId::new(*member),
            &shards(s),
            *lock_timeout_ms,
        ),
        ShardLeaseStatement::Release {
            class,
            member,
            shards: s,
        } => lease::release(schema, *class, MemberId::new(*member), &shards(s)),
        ShardLeaseStatement::Leave { class, member } => {
            lease::leave(schema, *class, MemberId::new(*member))
        }
    })
}

const REGISTER: &str = "SET LOCAL synchronous_commit = on; INSERT INTO plexsphere_shard_member ";
const RENEW: &str = "SET LOCAL synchronous_commit = on; WITH renewed AS (UPDATE \
     plexsphere_shard_member SET expires_at = now() + ";
const SURVEY: &str = "SELECT m.member, m.holder, string_agg(o.shard::text";
const TAKE: &str = "SET LOCAL lock_timeout = '";
/// What tells a take from the other statements under a `SET LOCAL lock_timeout`: its reap.
const TAKE_CTE: &str = "WITH reaped AS (DELETE FROM plexsphere_shard_member";
const FREE: &str = "UPDATE plexsphere_shard_owner SET member = NULL WHERE classid = ";
const LEAVE_DELETE: &str = "; DELETE FROM plexsphere_shard_member";
/// How the builders write a TTL: `now() + <ms> * interval '1 millisecond'`.
const TTL_UNIT: &str = " * interval '1 millisecond'";

fn number<T: std::str::FromStr>(text: Option<&str>) -> Option<T> {
    text?.parse().ok()
}

/// The numbers of an `int4[]` literal's body (`1,3`; empty for `{}`).
fn list(body: &str) -> Option<Vec<u32>> {
    if body.is_empty() {
        return Some(Vec::new());
    }
    body.split(',').map(|n| n.parse().ok()).collect()
}

fn register(text: &str) -> Option<ShardLeaseStatement> {
    let values = between(text, "VALUES (", TTL_UNIT)?;
    let (class, rest) = values.split_once(", nextval(")?;
    let (_, rest) = rest.split_once("), ")?;
    let (literal, ttl) = rest.rsplit_once(", now() + ")?;
    Some(ShardLeaseStatement::Register {
        class: class.parse().ok()?,
        holder: unquote(literal)?,
        ttl_ms: ttl.parse().ok()?,
    })
}

fn renew(text: &str) -> Option<ShardLeaseStatement> {
    Some(ShardLeaseStatement::Renew {
        class: number(between(text, "WHERE classid = ", " AND member = "))?,
        member: number(between(text, " AND member = ", " AND holder = "))?,
        holder: unquote(between(
            text,
            " AND holder = ",
            " AND expires_at > now() RETURNING 1)",
        )?)?,
        ttl_ms: number(between(text, RENEW, TTL_UNIT))?,
    })
}

fn survey(text: &str) -> Option<ShardLeaseStatement> {
    Some(ShardLeaseStatement::Survey {
        class: number(between(text, "WHERE m.classid = ", " AND m.expires_at"))?,
        count: number(between(text, "AND o.shard < ", " WHERE m.classid = "))?,
    })
}

fn take(text: &str) -> Option<ShardLeaseStatement> {
    Some(ShardLeaseStatement::Take {
        class: number(between(
            text,
            "DELETE FROM plexsphere_shard_member WHERE classid = ",
            " AND",
        ))?,
        member: number(between(text, ", t.s, ", " FROM unnest("))?,
        shards: list(between(text, "unnest('{", "}'::int4[])")?)?,
        lock_timeout_ms: number(between(text, TAKE, "'"))?,
    })
}

fn release(text: &str) -> Option<ShardLeaseStatement> {
    Some(ShardLeaseStatement::Release {
        class: number(between(text, FREE, " AND member = "))?,
        member: number(between(text, " AND member = ", " AND shard = ANY("))?,
        shards: list(between(text, "ANY('{", "}'::int4[])")?)?,
    })
}

fn leave(text: &str) -> Option<ShardLeaseStatement> {
    Some(ShardLeaseStatement::Leave {
        class: number(between(text, FREE, " AND member = "))?,
        member: number(between(text, " AND member = ", LEAVE_DELETE))?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::checks;

    #[test]
    fn every_statement_is_recognised_with_its_parameters() {
        let cases = [
            ShardLeaseStatement::Register {
                class: 1_886_156_916,
                holder: "r0.1 00ff00ff00ff00ff".to_owned(),
                ttl_ms: 300,
            },
            ShardLeaseStatement::Register {
                class: -7,
                holder: r"o'b\rien, now() + 3".to_owned(),
                ttl_ms: 15_000,
            },
            ShardLeaseStatement::Renew {
                class: -2,
                member: 16,
                holder: "it's".to_owned(),
                ttl_ms: 600,
            },
            ShardLeaseStatement::Survey {
                class: i32::MIN,
                count: 12,
            },
            ShardLeaseStatement::Take {
                class: 9,
                member: 3,
                shards: vec![0, 4, 11],
                lock_timeout_ms: 50,
            },
            ShardLeaseStatement::Take {
                class: -9,
                member: i32::MAX,
                shards: Vec::new(),
                lock_timeout_ms: 2_500,
            },
            ShardLeaseStatement::Release {
                class: 5,
                member: 2,
                shards: vec![1],
            },
            ShardLeaseStatement::Leave {
                class: -5,
                member: 1,
            },
        ];
        checks::recognised_as_built(cases, build, recognise);
    }

    #[test]
    fn a_text_that_begins_like_a_shard_lease_statement_but_differs_is_0a000() {
        let schema = plexsphere_leader::sql::lease::DEFAULT_SCHEMA;
        let member = MemberId::new(3);
        let shards = [Shard::new(1)];
        let texts = [
            lease::renew(schema, 5, member, "a", 300).replace(" AND expires_at > now()", ""),
            lease::take(schema, 5, member, &shards, 50)
                .replace("WHERE o.member IS NULL", "WHERE true"),
            lease::release(schema, 5, member, &shards)
                .replace("RETURNING shard", "RETURNING member"),
            format!("{} AND true", lease::survey(schema, 5, 8, FloorStep::Off)),
            lease::register(schema, 5, "a", 300, FloorStep::Off)
                .replace("expires_at > now()", "true"),
        ]
        .map(|text| unqualified(&text));
        checks::refused(texts, recognise);
        assert_eq!(recognise("SELECT 1"), None);
        assert_eq!(
            recognise(&lease::setup(schema)),
            None,
            "the general parser's"
        );
        let claim = plexsphere_leader::sql::lease::claim(
            schema,
            plexsphere_leader::LockKey::DEFAULT,
            "a",
            300,
            50,
        );
        assert_eq!(
            recognise(&unqualified(&claim)),
            None,
            "the single lease's claim"
        );
    }
}
