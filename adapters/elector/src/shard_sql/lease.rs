//! The statements of a shard space held by leases instead of advisory locks (issue 40), for the
//! transaction-mode poolers that cannot carry a session lock: rows of three tables, each
//! statement an autocommit query string in the simple query protocol with every value inlined,
//! no session state (no session-level `SET`, no prepared statement, no temporary object), so it
//! runs unchanged on any pooled connection.
//!
//! | table | row | written |
//! |---|---|---|
//! | `plexsphere_shard_member` | a live replica of space `classid`: its server-assigned `member` id, its `holder` (identity and per-run nonce) and its `expires_at` on the server's clock | [`register`], every interval by [`renew`], by [`leave`] |
//! | `plexsphere_shard_owner` | shard `shard` of `classid` and its owning `member` (`NULL`: free) | only when ownership changes: [`take`], [`release`], [`leave`] |
//! | `plexsphere_leader_fence` | shard `s` of `classid` is the fence row `(classid, s)`, as in the advisory sharded mode | by [`take`], in the same transaction |
//!
//! **Steady-state cost is independent of the number of shards.** A member's renewal touches its
//! own row only (a HOT update: `expires_at` is not indexed) and reads the space's live members,
//! `R` rows. The shard rows are read ([`survey`]) and written ([`take`], [`release`]) only while
//! ownership changes.
//!
//! **At most one owner per shard.** A shard is taken only when its row is missing, free, or
//! owned by a member that [`take`] has just reaped. Takes of one space run one after the other
//! (each first takes the transaction-level advisory lock [`take_lock`]). A reap deletes the
//! rows of the members whose lease expired by the server's clock and frees their shards, and
//! the row locks decide each race with a renewal in flight:
//! - the renewal commits first: the reap's `DELETE` waits for the row, re-reads it, and finds it
//!   live; the member keeps its shards;
//! - the reap commits first: the renewal finds its row gone, renews nothing and answers
//!   `renewed = 0`; its member has lost every shard. The member's own trust ended before the
//!   reap, since it trusts a renewal for less than its TTL from the instant it sent it (the
//!   margin of [`Lease`](plexsphere_leader_core::Lease)).
//!
//! A member releases its shards itself ([`release`], [`leave`]): nobody else ever frees a live
//! member's shard.

use plexsphere_leader_core::rank::{FloorStep, Version};
use plexsphere_leader_core::shards::{MemberId, Shard, Survey};

use super::{Columns, ShardSqlError, int4_array, one_row};
use crate::session::Row;
use crate::sql::lease::fence_table;
use crate::sql::{DURABLE_COMMIT, FENCE_SETUP, FENCE_TABLE, quote_literal};

/// The members' table.
pub const MEMBER_TABLE: &str = "plexsphere_shard_member";

/// The owners' table.
pub const OWNER_TABLE: &str = "plexsphere_shard_owner";

/// The sequence that numbers members (an `int4` that cycles).
pub const MEMBER_SEQUENCE: &str = "plexsphere_shard_member_id";

/// The names of the statements, as [`ShardSqlError`] reports them.
pub mod statement {
    /// [`register`](super::register).
    pub const REGISTER: &str = "lease register";
    /// [`renew`](super::renew).
    pub const RENEW: &str = "lease renew";
    /// [`survey`](super::survey).
    pub const SURVEY: &str = "lease survey";
    /// [`take`](super::take).
    pub const TAKE: &str = "lease take";
    /// [`release`](super::release).
    pub const RELEASE: &str = "lease release";
}

fn member_table(schema: &str) -> String {
    format!("{schema}.{MEMBER_TABLE}")
}

fn owner_table(schema: &str) -> String {
    format!("{schema}.{OWNER_TABLE}")
}

/// `now() + <ms> milliseconds`, the server's clock.
fn expiry(ttl_ms: u32) -> String {
    format!("now() + {ttl_ms} * interval '1 millisecond'")
}

/// The one-`bigint` transaction-level advisory lock that serializes the takes of space
/// `class` in every schema: `class` in the high half and `0x706c_7374` (`plst`) in the low
/// half, a key space apart from the elections' two-`int4` session locks and from the single
/// lease's claim lock of a key `(class, objid)` only when `objid` is `0x706c_7374`.
pub fn take_lock(class: i32) -> i64 {
    (i64::from(class) << 32) | 0x706c_7374
}

/// The idempotent setup of a lease shard space, run once per database (by a migration or the
/// elector at its start): the members' sequence and table, the owners' table and the fence
/// table, in `schema` (which must exist), [serialized](crate::sql::lease::serialized_setup) so
/// that replicas starting together do not race.
pub fn setup(schema: &str) -> String {
    let fence = FENCE_SETUP.replacen(FENCE_TABLE, &fence_table(schema), 1);
    crate::sql::lease::serialized_setup(&format!(
        "CREATE SEQUENCE IF NOT EXISTS {schema}.{MEMBER_SEQUENCE} AS int4 MINVALUE 1 CYCLE; \
         CREATE TABLE IF NOT EXISTS {members} (\
         classid int4 NOT NULL, member int4 NOT NULL, holder text NOT NULL, \
         expires_at timestamptz NOT NULL, PRIMARY KEY (classid, member)); \
         CREATE TABLE IF NOT EXISTS {owners} (\
         classid int4 NOT NULL, shard int4 NOT NULL, member int4, \
         PRIMARY KEY (classid, shard)); {fence}; {floor}",
        members = member_table(schema),
        owners = owner_table(schema),
        floor = crate::sql::candidacy::floor_setup(&floor_table(schema)),
    ))
}

/// `schema`'s version floor table, qualified ([`FLOOR_TABLE`](crate::floor::FLOOR_TABLE)): the
/// space's floor is its row `(class, -1)`.
pub fn floor_table(schema: &str) -> String {
    format!("{schema}.{}", crate::floor::FLOOR_TABLE)
}

/// Joins space `class` as a new member named `holder`, whose lease lasts `ttl_ms` on the
/// server's clock, durably ([`DURABLE_COMMIT`]). One row: the new member's id, and how many
/// **other** members are live.
///
/// With the version floor (`floor` a raise or a set), the same transaction takes the step on
/// the space's floor row first: no survey sees the member without the floor it raised.
pub fn register(schema: &str, class: i32, holder: &str, ttl_ms: u32, floor: FloorStep) -> String {
    let members = member_table(schema);
    let key = crate::key::LockKey::new(class, super::MEMBER_OBJ_ID);
    let step = crate::sql::candidacy::floor_step(&floor_table(schema), key, floor)
        .and_then(|(entry, _)| entry)
        .map_or_else(String::new, |entry| format!("WITH {entry} "));
    format!(
        "{DURABLE_COMMIT}{step}INSERT INTO {members} (classid, member, holder, expires_at) \
         VALUES ({class}, nextval('{schema}.{MEMBER_SEQUENCE}'), {holder}, {expiry}) \
         RETURNING member, (SELECT count(*) FROM {members} \
         WHERE classid = {class} AND expires_at > now())",
        holder = quote_literal(holder),
        expiry = expiry(ttl_ms),
    )
}

/// What [`register`] answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Registered {
    /// The new member.
    pub member: MemberId,
    /// The other live members.
    pub others: u32,
}

/// Reads the row of [`register`].
///
/// # Errors
/// Not exactly one row, or a column missing, `NULL` or unparsable.
pub fn parse_registered(rows: &[Row]) -> Result<Registered, ShardSqlError> {
    let cols = Columns::new(statement::REGISTER, one_row(statement::REGISTER, rows)?);
    Ok(Registered {
        member: MemberId::new(cols.number(0, "member")?),
        others: cols.number(1, "others")?,
    })
}

/// The member's check, every interval: extends the lease of `member` (named `holder`) to
/// `now() + ttl_ms` while it has not expired, durably, and reads the live members. One row:
/// whether it renewed (`1`; `0`: the lease expired, or a take reaped it, and every shard of the
/// member is lost) and the live members' ids, ascending, comma-separated. A renewal that arrives
/// after its lease expired cannot revive it.
pub fn renew(schema: &str, class: i32, member: MemberId, holder: &str, ttl_ms: u32) -> String {
    let members = member_table(schema);
    format!(
        "{DURABLE_COMMIT}WITH renewed AS (UPDATE {members} SET expires_at = {expiry} \
         WHERE classid = {class} AND member = {id} AND holder = {holder} \
         AND expires_at > now() RETURNING 1) \
         SELECT (SELECT count(*) FROM renewed), \
         string_agg(member::text, ',' ORDER BY member) FROM {members} \
         WHERE classid = {class} AND expires_at > now()",
        id = member.get(),
        holder = quote_literal(holder),
        expiry = expiry(ttl_ms),
    )
}

/// What [`renew`] answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Renewed {
    /// Whether the member's lease was extended.
    pub renewed: bool,
    /// The live members, ascending (the renewed member among them).
    pub members: Vec<MemberId>,
}

/// Reads the row of [`renew`].
///
/// # Errors
/// Not exactly one row, or a column missing or unparsable.
pub fn parse_renewed(rows: &[Row]) -> Result<Renewed, ShardSqlError> {
    let cols = Columns::new(statement::RENEW, one_row(statement::RENEW, rows)?);
    let renewed: u32 = cols.number(0, "renewed")?;
    let members = cols
        .shard_list(1, "members")?
        .into_iter()
        .map(|id| i32::try_from(id).map(MemberId::new))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| cols.unparsable("members", "", "member ids in int4 range"))?;
    Ok(Renewed {
        renewed: renewed > 0,
        members,
    })
}

/// Who owns what among `count` shards: one row per live member, ascending by id — its id, its
/// holder and its shards in `0..count` (ascending, comma-separated; `NULL` when none). A shard of
/// no row is free (never taken, released, or owned by a member whose lease expired). It reads
/// the owners' rows of the space: run only while ownership changes.
///
/// With the version floor on (`floor` not [`FloorStep::Off`]), a fourth column `floor` reads
/// the space's floor after the step, as [`survey`](super::survey) does.
pub fn survey(schema: &str, class: i32, count: u32, floor: FloorStep) -> String {
    let (with, floor_column) = super::floor_parts(&floor_table(schema), class, floor);
    format!(
        "{with}SELECT m.member, m.holder, string_agg(o.shard::text, ',' ORDER BY o.shard){floor_column} \
         FROM {members} m LEFT JOIN {owners} o ON o.classid = m.classid \
         AND o.member = m.member AND o.shard < {count} \
         WHERE m.classid = {class} AND m.expires_at > now() \
         GROUP BY m.member, m.holder ORDER BY m.member",
        members = member_table(schema),
        owners = owner_table(schema),
    )
}

/// One live member as [`survey`] shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberRow {
    /// The member.
    pub member: MemberId,
    /// Its holder (identity and nonce).
    pub holder: String,
    /// Its shards, ascending.
    pub shards: Vec<Shard>,
}

/// Reads the rows of [`survey`].
///
/// # Errors
/// A column missing, `NULL` or unparsable.
pub fn parse_survey(rows: &[Row]) -> Result<Vec<MemberRow>, ShardSqlError> {
    rows.iter()
        .map(|row| {
            let cols = Columns::new(statement::SURVEY, row);
            Ok(MemberRow {
                member: MemberId::new(cols.number(0, "member")?),
                holder: cols.required(1, "holder")?.to_owned(),
                shards: cols
                    .shard_list(2, "shards")?
                    .into_iter()
                    .map(Shard::new)
                    .collect(),
            })
        })
        .collect()
}

/// The version floor [`survey`]'s rows read (its fourth column, on every row): `None`
/// without a row or with none recorded.
///
/// # Errors
/// A version that does not parse.
pub fn parse_floor(rows: &[Row]) -> Result<Option<Version>, ShardSqlError> {
    rows.first().map_or(Ok(None), |row| {
        super::floor_of(&Columns::new(statement::SURVEY, row), 3)
    })
}

/// The core's [`Survey`] of `count` shards as `me` sees it, from [`parse_survey`]'s rows.
///
/// # Errors
/// A shard out of range or owned twice (the rows did not come from [`survey`]).
pub fn to_survey(count: u32, me: MemberId, rows: &[MemberRow]) -> Result<Survey, ShardSqlError> {
    Ok(Survey::new(
        count,
        me,
        rows.iter()
            .map(|row| (row.member, true, row.shards.iter().map(|s| s.get()))),
    )?)
}

/// Takes `shards` of space `class` for `member`, in one transaction bounded by a
/// transaction-local `lock_timeout` of `lock_timeout_ms` (SQLSTATE 55P03 then, and nothing
/// changed), durably:
///
/// 1. takes [`take_lock`], so the takes and reaps of the space run one at a time;
/// 2. reaps: deletes the members whose lease expired by the server's clock and frees their
///    shards (see the module's race argument);
/// 3. when `member` is live, owns each asked shard whose row is missing or free, and advances
///    each taken shard's fence epoch.
///
/// Its last result is one row: whether `member` was live (`1`, else `0` and nothing was taken)
/// and the taken shards with their new epochs, `shard:epoch` ascending, comma-separated
/// (`NULL` when none).
pub fn take(
    schema: &str,
    class: i32,
    member: MemberId,
    shards: &[Shard],
    lock_timeout_ms: u32,
) -> String {
    let (members, owners, fence) = (
        member_table(schema),
        owner_table(schema),
        fence_table(schema),
    );
    let id = member.get();
    format!(
        "SET LOCAL lock_timeout = '{lock_timeout_ms}'; {DURABLE_COMMIT}\
         SELECT pg_advisory_xact_lock({lock}); \
         WITH reaped AS (DELETE FROM {members} WHERE classid = {class} \
         AND expires_at <= now() RETURNING member) \
         UPDATE {owners} SET member = NULL WHERE classid = {class} \
         AND member IN (SELECT member FROM reaped); \
         WITH me AS (SELECT 1 FROM {members} WHERE classid = {class} AND member = {id} \
         AND expires_at > now()), \
         taken AS (INSERT INTO {owners} AS o (classid, shard, member) \
         SELECT {class}, t.s, {id} FROM unnest({asked}) AS t(s), me \
         ON CONFLICT (classid, shard) DO UPDATE SET member = EXCLUDED.member \
         WHERE o.member IS NULL RETURNING o.shard), \
         fenced AS (INSERT INTO {fence} AS f (classid, objid, epoch) \
         SELECT {class}, shard, 1 FROM taken \
         ON CONFLICT (classid, objid) DO UPDATE SET epoch = f.epoch + 1 \
         RETURNING f.objid, f.epoch) \
         SELECT (SELECT count(*) FROM me), \
         (SELECT string_agg(objid || ':' || epoch, ',' ORDER BY objid) FROM fenced)",
        lock = take_lock(class),
        asked = int4_array(shards),
    )
}

/// What [`take`] answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Taken {
    /// Whether the taking member was live (`false`: its lease expired and nothing was taken).
    pub live: bool,
    /// The shards taken, ascending, each with its new fence epoch.
    pub shards: Vec<(Shard, u64)>,
}

/// Reads the last row of [`take`] (a query string of several statements: the rows of its
/// last one).
///
/// # Errors
/// No row, or a column missing or unparsable.
pub fn parse_taken(rows: &[Row]) -> Result<Taken, ShardSqlError> {
    let row = rows.last().ok_or(ShardSqlError::NoRow {
        statement: statement::TAKE,
    })?;
    let cols = Columns::new(statement::TAKE, row);
    let live: u32 = cols.number(0, "live")?;
    let shards = match cols.optional(1, "taken")? {
        None => Vec::new(),
        Some(list) => list
            .split(',')
            .map(|pair| {
                pair.split_once(':')
                    .and_then(|(shard, epoch)| Some((shard.parse().ok()?, epoch.parse().ok()?)))
                    .map(|(shard, epoch)| (Shard::new(shard), epoch))
                    .ok_or_else(|| cols.unparsable("taken", list, "shard:epoch pairs"))
            })
            .collect::<Result<_, _>>()?,
    };
    Ok(Taken {
        live: live > 0,
        shards,
    })
}

/// Gives `shards` of `member` back: frees each that is still `member`'s, and returns one row
/// (`s`) per shard freed, ascending. A shard missing from the answer was not `member`'s.
pub fn release(schema: &str, class: i32, member: MemberId, shards: &[Shard]) -> String {
    format!(
        "UPDATE {} SET member = NULL WHERE classid = {class} AND member = {} \
         AND shard = ANY({}) RETURNING shard",
        owner_table(schema),
        member.get(),
        int4_array(shards),
    )
}

/// Reads the rows of [`release`]: the shards freed, ascending.
///
/// # Errors
/// A column missing, `NULL` or not a shard number.
pub fn parse_released(rows: &[Row]) -> Result<Vec<Shard>, ShardSqlError> {
    super::shard_rows(statement::RELEASE, rows)
}

/// The graceful leave of `member`: frees every shard it owns and deletes its row, in one
/// transaction, so that the other members see it gone at their next renewal and take its
/// shards at once. Its last result is the deleted member row (`1`), none when the member was
/// already reaped.
pub fn leave(schema: &str, class: i32, member: MemberId) -> String {
    let id = member.get();
    format!(
        "UPDATE {owners} SET member = NULL WHERE classid = {class} AND member = {id}; \
         DELETE FROM {members} WHERE classid = {class} AND member = {id} RETURNING 1",
        owners = owner_table(schema),
        members = member_table(schema),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(cols: &[Option<&str>]) -> Row {
        cols.iter().map(|c| c.map(str::to_owned)).collect()
    }

    #[test]
    fn with_the_floor_the_registration_raises_it_in_its_transaction_and_the_survey_reads_it() {
        let version = Version::new(2, 0, 0);
        let register = register("app", 5, "svc@h 0f", 3_000, FloorStep::Raise(version));
        assert!(register.starts_with(&format!(
            "{DURABLE_COMMIT}WITH floor_step AS (INSERT INTO app.plexsphere_leader_floor AS f"
        )));
        assert!(
            register.contains(") INSERT INTO app.plexsphere_shard_member"),
            "{register}"
        );
        let set = super::register("app", 5, "svc@h 0f", 3_000, FloorStep::Set(version));
        assert!(
            !set.contains("WHERE f.sort_key"),
            "a set lowers the floor too: {set}"
        );
        let survey = survey("app", 5, 16, FloorStep::Read);
        assert!(survey.contains(
            "(SELECT version FROM app.plexsphere_leader_floor WHERE classid = 5 AND objid = -1) \
             AS floor FROM"
        ));
        let row = |floor: Option<&str>| -> Row {
            [Some("3"), Some("h 0f"), Some("0,1"), floor]
                .iter()
                .map(|c| c.map(str::to_owned))
                .collect()
        };
        assert_eq!(parse_floor(&[row(Some("2.0.0"))]), Ok(Some(version)));
        assert_eq!(parse_floor(&[row(None)]), Ok(None));
        assert_eq!(parse_floor(&[]), Ok(None));
        assert!(setup("app").contains("CREATE TABLE IF NOT EXISTS app.plexsphere_leader_floor"));
    }

    #[test]
    fn every_statement_names_its_schema_and_keeps_no_session_state() {
        let member = MemberId::new(7);
        let shards = [Shard::new(3), Shard::new(1)];
        let statements = [
            setup("app"),
            register("app", 5, "svc@h 0f", 3_000, FloorStep::Off),
            renew("app", 5, member, "it's", 3_000),
            survey("app", 5, 16, FloorStep::Off),
            take("app", 5, member, &shards, 500),
            release("app", 5, member, &shards),
            leave("app", 5, member),
        ];
        for statement in &statements {
            assert!(!statement.contains("SET SESSION") && !statement.contains("set_config"));
            assert!(!statement.contains("PREPARE") && !statement.contains("LISTEN"));
            assert!(!statement.contains('$'), "no parameter: {statement}");
            assert!(
                !statement.contains(" plexsphere_"),
                "every table named with its schema: {statement}"
            );
        }
        assert!(statements[2].contains("holder = 'it''s'"));
        assert!(statements[4].contains("unnest('{1,3}'::int4[])"));
        assert!(statements[4].starts_with(
            "SET LOCAL lock_timeout = '500'; SET LOCAL synchronous_commit = on; \
             SELECT pg_advisory_xact_lock(23360992116); "
        ));
        assert_eq!(take_lock(5), 5 * (1 << 32) + 0x706c_7374);
        assert!(take_lock(-1) < 0);
    }

    #[test]
    fn the_answers_read_as_their_contracts_say() {
        assert_eq!(
            parse_registered(&[row(&[Some("12"), Some("3")])]),
            Ok(Registered {
                member: MemberId::new(12),
                others: 3
            })
        );
        assert_eq!(
            parse_renewed(&[row(&[Some("1"), Some("4,12")])]),
            Ok(Renewed {
                renewed: true,
                members: vec![MemberId::new(4), MemberId::new(12)]
            })
        );
        assert_eq!(
            parse_renewed(&[row(&[Some("0"), None])]),
            Ok(Renewed {
                renewed: false,
                members: Vec::new()
            })
        );
        assert!(parse_renewed(&[row(&[Some("1"), Some("9999999999")])]).is_err());
        assert_eq!(
            parse_taken(&[row(&[Some("1"), Some("2:5,9:1")])]),
            Ok(Taken {
                live: true,
                shards: vec![(Shard::new(2), 5), (Shard::new(9), 1)]
            })
        );
        assert_eq!(
            parse_taken(&[row(&[Some("0"), None])]),
            Ok(Taken {
                live: false,
                shards: Vec::new()
            })
        );
        assert!(parse_taken(&[row(&[Some("1"), Some("2-5")])]).is_err());
        assert!(parse_taken(&[]).is_err());
        let rows = parse_survey(&[
            row(&[Some("4"), Some("a"), Some("0,2")]),
            row(&[Some("12"), Some("b"), None]),
        ])
        .unwrap();
        let survey = to_survey(4, MemberId::new(12), &rows).unwrap();
        assert_eq!(survey.members(), &[MemberId::new(4), MemberId::new(12)]);
        assert_eq!(survey.holder(Shard::new(2)), Some(MemberId::new(4)));
        assert_eq!(survey.holder(Shard::new(1)), None);
        assert!(
            to_survey(2, MemberId::new(12), &rows).is_err(),
            "shard 2 of 2"
        );
    }
}
