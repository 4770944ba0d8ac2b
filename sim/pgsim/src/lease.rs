//! The statements of the lease mechanism, recognised whole.
//!
//! `plexsphere_leader::sql::lease` builds four statements besides its setup (claim, renew,
//! release, who holds; the setup's `CREATE TABLE`s are the general parser's). Their CTE,
//! `ON CONFLICT … WHERE`, join and interval arithmetic are beyond the general parser of `sql`,
//! and the simulation needs them only as the adapter sends them, so, as the shard statements
//! (`shard`), each is matched as a whole: its parameters (key, holder, TTL, lock timeout) are
//! read out of the text, the statement is built again with those parameters by the adapter's
//! own function, and only an identical text is that statement. A text that begins like one of
//! them but differs fails with 0A000 naming the statement. What each statement does is in
//! `exec::lease`.

use plexsphere_leader::LockKey;
use plexsphere_leader::sql::lease;

use super::reply::SqlError;
use super::text::{between, rebuilt, unquote};

/// A statement of `plexsphere_leader::sql::lease` with its parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LeaseStatement {
    /// `lease::claim`: take the lease of `key` for `holder` for `ttl_ms` when it is free,
    /// expired or `holder`'s, and advance the fence row; the claim's fence wait is bounded by
    /// `lock_timeout_ms` (the `SET LOCAL` before it).
    Claim {
        key: (i32, i32),
        holder: String,
        ttl_ms: u32,
        lock_timeout_ms: u32,
    },
    /// `lease::renew`: extend `holder`'s unexpired lease of `key` to `now() + ttl_ms`.
    Renew {
        key: (i32, i32),
        holder: String,
        ttl_ms: u32,
    },
    /// `lease::release`: expire `holder`'s unexpired lease of `key` now.
    Release { key: (i32, i32), holder: String },
    /// `lease::who_holds`: the lease row of `key` with its fence epoch.
    WhoHolds { key: (i32, i32) },
}

impl LeaseStatement {
    /// The lease row's key.
    pub(crate) fn key(&self) -> (i32, i32) {
        match self {
            Self::Claim { key, .. }
            | Self::Renew { key, .. }
            | Self::Release { key, .. }
            | Self::WhoHolds { key } => *key,
        }
    }
}

/// The lease statement `query` is, if it begins like one: `None` when it does not (the
/// general parser takes it), `Some(Err)` with 0A000 when it begins like one but is not the
/// text `sql::lease` builds.
pub(crate) fn recognise(query: &str) -> Option<Result<LeaseStatement, SqlError>> {
    let text = query.trim();
    let (name, statement) = if text.starts_with(CLAIM) && text.contains(CLAIM_CTE) {
        ("claim", claim(text))
    } else if text.starts_with(RENEW) {
        ("renew", renew(text))
    } else if text.starts_with(RELEASE) {
        ("release", release(text))
    } else if text.starts_with(WHO_HOLDS) {
        (
            "who_holds",
            key(text, "WHERE l.classid = ", " AND l.objid = ", None)
                .map(|key| LeaseStatement::WhoHolds { key }),
        )
    } else {
        return None;
    };
    let builder = format!("plexsphere_leader::sql::lease::{name}");
    Some(rebuilt(text, statement, build, &builder))
}

/// `query` with the tables of the default schema named without it: the simulated server has
/// one schema, `public`, so `public.plexsphere_leader_lease` and `plexsphere_leader_lease` are
/// one table, and so are a lease shard space's `public.plexsphere_shard_*` (a statement naming
/// another schema meets 0A000 or 42P01).
pub(crate) fn unqualified(query: &str) -> String {
    let schema = lease::DEFAULT_SCHEMA;
    ["plexsphere_leader_", "plexsphere_shard_"]
        .into_iter()
        .fold(query.to_owned(), |query, prefix| {
            query.replace(&format!("{schema}.{prefix}"), prefix)
        })
}

/// The text `sql::lease` builds for `statement` (in the default schema, [`unqualified`]).
pub(crate) fn build(statement: &LeaseStatement) -> String {
    unqualified(&built(statement))
}

fn built(statement: &LeaseStatement) -> String {
    let lock = |(class_id, obj_id): (i32, i32)| LockKey::new(class_id, obj_id);
    let schema = lease::DEFAULT_SCHEMA;
    match statement {
        LeaseStatement::Claim {
            key,
            holder,
            ttl_ms,
            lock_timeout_ms,
        } => lease::claim(schema, lock(*key), holder, *ttl_ms, *lock_timeout_ms),
        LeaseStatement::Renew {
            key,
            holder,
            ttl_ms,
        } => lease::renew(schema, lock(*key), holder, *ttl_ms),
        LeaseStatement::Release { key, holder } => lease::release(schema, lock(*key), holder),
        LeaseStatement::WhoHolds { key } => lease::who_holds(schema, lock(*key)),
    }
}

const CLAIM: &str = "SET LOCAL lock_timeout = '";
/// What tells a claim from another statement under a `SET LOCAL lock_timeout` (the advisory
/// mechanism's epoch advance): the claim proper, after its settings and its transaction lock.
pub(crate) const CLAIM_CTE: &str = "WITH elsewhere AS (";
const RENEW: &str =
    "SET LOCAL synchronous_commit = on; UPDATE plexsphere_leader_lease SET expires_at = now() + ";
const RELEASE: &str = "UPDATE plexsphere_leader_lease SET expires_at = now() WHERE";
const WHO_HOLDS: &str = "SELECT l.holder, f.epoch, date_part('epoch', l.expires_at)";
/// How the builders write a TTL: `now() + <ms> * interval '1 millisecond'`.
const TTL_UNIT: &str = " * interval '1 millisecond'";

fn claim(text: &str) -> Option<LeaseStatement> {
    let lock_timeout_ms = between(text, CLAIM, "'")?.parse().ok()?;
    let values = between(
        text,
        "(classid, objid, holder, expires_at) SELECT ",
        TTL_UNIT,
    )?;
    let (class_id, rest) = values.split_once(", ")?;
    let (obj_id, rest) = rest.split_once(", ")?;
    let (literal, ttl) = rest.rsplit_once(", now() + ")?;
    Some(LeaseStatement::Claim {
        key: (class_id.parse().ok()?, obj_id.parse().ok()?),
        holder: unquote(literal)?,
        ttl_ms: ttl.parse().ok()?,
        lock_timeout_ms,
    })
}

fn renew(text: &str) -> Option<LeaseStatement> {
    let (key, holder) = holders_row(text)?;
    let ttl_ms = between(text, RENEW, TTL_UNIT)?.parse().ok()?;
    Some(LeaseStatement::Renew {
        key,
        holder,
        ttl_ms,
    })
}

fn release(text: &str) -> Option<LeaseStatement> {
    let (key, holder) = holders_row(text)?;
    Some(LeaseStatement::Release { key, holder })
}

/// The key and holder of a renewal's or release's `WHERE`: the holder's unexpired row.
fn holders_row(text: &str) -> Option<((i32, i32), String)> {
    const HOLDER: &str = " AND holder = ";
    let key = key(text, "WHERE classid = ", " AND objid = ", Some(HOLDER))?;
    Some((
        key,
        unquote(between(text, HOLDER, " AND expires_at > now()")?)?,
    ))
}

/// The key written `<class><objid><after>` (to the end of the text without `after`).
fn key(text: &str, class: &str, objid: &str, after: Option<&str>) -> Option<(i32, i32)> {
    let class_id = between(text, class, objid)?.parse().ok()?;
    let start = text.find(objid)? + objid.len();
    let rest = &text[start..];
    let obj_id = match after {
        Some(after) => &rest[..rest.find(after)?],
        None => rest,
    };
    Some((class_id, obj_id.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::checks;

    #[test]
    fn every_statement_is_recognised_with_its_parameters() {
        let cases = [
            LeaseStatement::Claim {
                key: (1_886_156_915, 1),
                holder: "r0.1 00ff00ff00ff00ff".to_owned(),
                ttl_ms: 300,
                lock_timeout_ms: 50,
            },
            LeaseStatement::Claim {
                key: (-7, i32::MIN),
                holder: r"o'b\rien, now() + 3".to_owned(),
                ttl_ms: 15_000,
                lock_timeout_ms: 2_500,
            },
            LeaseStatement::Renew {
                key: (-2, 16),
                holder: "it's".to_owned(),
                ttl_ms: 600,
            },
            LeaseStatement::Release {
                key: (9, -1),
                holder: "r2.3 0123456789abcdef".to_owned(),
            },
            LeaseStatement::WhoHolds { key: (i32::MAX, 0) },
        ];
        checks::recognised_as_built(cases, build, recognise);
    }

    #[test]
    fn a_text_that_begins_like_a_lease_statement_but_differs_is_0a000() {
        let key = LockKey::DEFAULT;
        let claim = lease::claim(
            plexsphere_leader::sql::lease::DEFAULT_SCHEMA,
            key,
            "a",
            300,
            50,
        )
        .replace("l.expires_at <= now()", "true");
        let renew = format!(
            "{} AND true",
            lease::renew(plexsphere_leader::sql::lease::DEFAULT_SCHEMA, key, "a", 300)
        );
        let release = lease::release(plexsphere_leader::sql::lease::DEFAULT_SCHEMA, key, "a")
            .replace("> now()", ">= now()");
        // As the parser hands them over: in the one schema, unqualified.
        let texts = [claim, renew, release].map(|text| unqualified(&text));
        checks::refused(texts, recognise);
        assert_eq!(recognise("SELECT 1"), None);
        assert_eq!(
            recognise(&lease::setup(plexsphere_leader::sql::lease::DEFAULT_SCHEMA)),
            None,
            "the general parser's"
        );
        let advance = plexsphere_leader::sql::advance_epoch_within(key, 50);
        assert_eq!(recognise(&advance), None, "the advisory epoch advance");
        assert_eq!(recognise("SET LOCAL lock_timeout = '5s'"), None);
    }
}
