//! Every statement of a sharded election and the reading of its rows into the core's types
//! ([`plexsphere_leader_core::shards`]), public so that operators, tests and the simulation
//! replay exactly what goes over the wire.
//!
//! A shard space is one advisory-lock class id `class`: shard `s` (`0..K`) is the two-`int4` lock
//! `(class, s)`, held exclusively by its owner, and the member lock is `(class, -1)`
//! ([`MEMBER_OBJ_ID`]), held in shared mode by every live replica on its one lock session.
//!
//! Every statement here:
//!
//! - is **one** statement (no `;` batch), so its answer is atomic: a reply either arrives
//!   whole or the session's state is unknown (and the driver closes it);
//! - runs over the simple query protocol with every value inlined as a literal (no parameter,
//!   no prepared statement, no temporary object), so a session-mode pooler carries it;
//! - passes shard lists as one `int4[]` literal (`'{1,2,3}'::int4[]`), so a statement stays
//!   short and one round trip whatever the list's length (1,024 shards are about 5 KB);
//! - reads `pg_locks` at most once. Each read of `pg_locks` (`pg_lock_status()`) copies the
//!   whole lock table while holding every lock-manager partition lock (shared), so it briefly
//!   delays every lock taken on the server; its cost grows with the lock table, not with the
//!   space.
//!
//! In `pg_locks` a two-`int4` key shows as `classid` = the first int, `objid` = the second and
//! `objsubid = 2`; `classid` and `objid` are `oid`s, so a negative int shows as itself plus
//! 2³² (the member lock's `objid` is `4294967295`). Advisory locks are per database: every
//! reading is limited to the current database. Rows without a `pid` (locks held by a prepared
//! transaction) are left out: such a shard looks free and a take of it is refused.

pub mod lease;
pub mod standing;

use std::collections::BTreeMap;
use std::str::FromStr;

use plexsphere_leader_core::rank::{FloorStep, Rank, Version};
use plexsphere_leader_core::shards::{MemberId, Shard, Survey, SurveyError};

use crate::session::Row;
use crate::sql::{DURABLE_COMMIT, quote_literal};

/// The second `int4` of the member lock `(class, -1)`, which every live replica holds in shared
/// mode. It shows in `pg_locks` as `objid = 4294967295`.
pub const MEMBER_OBJ_ID: i32 = -1;

/// The names of the statements, as [`ShardSqlError`] reports them.
pub mod statement {
    /// [`register`](super::register).
    pub const REGISTER: &str = "register";
    /// [`survey`](super::survey).
    pub const SURVEY: &str = "survey";
    /// [`take`](super::take).
    pub const TAKE: &str = "take";
    /// [`unlock`](super::unlock).
    pub const UNLOCK: &str = "unlock";
    /// [`owners`](super::owners).
    pub const OWNERS: &str = "owners";
    /// [`advance_epochs`](super::advance_epochs).
    pub const ADVANCE_EPOCHS: &str = "advance epochs";
}

/// Why the rows of a shard statement do not read as its contract says.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ShardSqlError {
    /// The statement returned no row where it always returns one.
    #[error("{statement} statement returned no row")]
    NoRow {
        /// The statement ([`statement`]).
        statement: &'static str,
    },
    /// The statement returned more rows than its contract allows.
    #[error("{statement} statement returned {rows} rows, expected one")]
    ExtraRows {
        /// The statement ([`statement`]).
        statement: &'static str,
        /// How many.
        rows: usize,
    },
    /// A row is shorter than the statement's columns.
    #[error("{statement} statement: column {column} missing")]
    MissingColumn {
        /// The statement ([`statement`]).
        statement: &'static str,
        /// The column's name.
        column: &'static str,
    },
    /// A column that is never `NULL` by contract is `NULL`.
    #[error("{statement} statement: column {column} is NULL")]
    NullColumn {
        /// The statement ([`statement`]).
        statement: &'static str,
        /// The column's name.
        column: &'static str,
    },
    /// A column's text does not parse as its type (or is out of its range).
    #[error("{statement} statement: column {column} reads {value:?}, not {expected}")]
    Unparsable {
        /// The statement ([`statement`]).
        statement: &'static str,
        /// The column's name.
        column: &'static str,
        /// The text read.
        value: String,
        /// What it should have been.
        expected: &'static str,
    },
    /// The rows contradict one another (a row without holder beside holders, two answering
    /// backends, a shard count that is not the list's length).
    #[error("{statement} statement: inconsistent rows: {what}")]
    Inconsistent {
        /// The statement ([`statement`]).
        statement: &'static str,
        /// What disagrees.
        what: &'static str,
    },
    /// The survey's rows do not describe the space (a shard out of range, two holders of one
    /// shard).
    #[error("survey statement: {0}")]
    Survey(#[from] SurveyError),
}

/// What [`register`] answered ([`parse_registered`]): the fields of the core's
/// `ShardEvent::Registered`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Registered {
    /// `pg_backend_pid()` of the session: the member it now is.
    pub backend: MemberId,
    /// Whether the shared member lock was granted (`false`: another session holds
    /// `(class, -1)` exclusively, or the server is in recovery).
    pub granted: bool,
    /// The server's lock-table slots as documented: `max_locks_per_transaction ×
    /// (max_connections + max_prepared_transactions)`.
    pub lock_capacity: u64,
    /// The members of the space, this session included when granted.
    pub members: u32,
    /// Whether the server is a hot standby (then the lock is never taken: a standby's
    /// advisory locks exclude nobody on the primary).
    pub in_recovery: bool,
}

/// What [`survey`] answered ([`parse_survey`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SurveyRows {
    /// The members, the shards' holders and the answering backend.
    pub survey: Survey,
    /// The `application_name` of every holder that has a non-empty one.
    pub names: BTreeMap<MemberId, String>,
    /// The version floor, when the survey read one.
    pub floor: Option<Version>,
}

/// One holder of a lock of the space, as `shard_sql::owners` shows it
/// (`shard_sql::parse_owners`; feature `wire`): what
/// [`status::shard_owners`](crate::status::shard_owners) returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerRow {
    /// The holding backend.
    pub pid: MemberId,
    /// Its `application_name` (the identity a member registered with, without the rank
    /// published before it); `None` when `NULL` or empty (the backend ended between the two
    /// readings, or never set one).
    pub name: Option<String>,
    /// Whether it holds the member lock (shared).
    pub member: bool,
    /// The shards it holds, ascending.
    pub shards: Vec<Shard>,
    /// The rank it published (before its identity in `application_name`), if any.
    pub rank: Option<Rank>,
}

impl OwnerRow {
    /// The row of `pid` whose published name is `published` ([`standing::parse`]).
    pub(crate) fn named(
        pid: MemberId,
        published: Option<&str>,
        member: bool,
        shards: Vec<Shard>,
    ) -> Self {
        let (standing, name) = published.map_or((Default::default(), None), |text| {
            let (standing, name) = standing::parse(text);
            (standing, Some(name.to_owned()))
        });
        Self {
            pid,
            name,
            member,
            shards,
            rank: standing.rank,
        }
    }
}

/// Joins the space on the lock session, in one statement returning one row:
///
/// | column | what |
/// |---|---|
/// | 1 | `pg_backend_pid()` |
/// | 2 | whether `pg_try_advisory_lock_shared(class, -1)` granted the member lock |
/// | 3 | `max_locks_per_transaction × (max_connections + max_prepared_transactions)`, `int8` |
/// | 4 | the **other** backends (`pid <> pg_backend_pid()`) holding the member lock (shared) in this database |
/// | 5 | `pg_is_in_recovery()` |
///
/// Only when granted, and in the same `CASE` (whose branches run in order), the session is
/// bounded with `idle_session_timeout` and `idle_in_transaction_session_timeout` of
/// `idle_timeout_ms` and named (`application_name` = `identity`, made printable ASCII and cut
/// to [`MAX_IDENTITY_LEN`](crate::config::MAX_IDENTITY_LEN) bytes), session-level, so a reply lost on
/// the way back never leaves an unbounded member. A server in recovery is refused before the
/// lock call. Column 4 excludes this session, so it does not depend on whether the server
/// evaluates the lock call or the `pg_locks` subquery first; a replica joining at the same
/// instant may or may not be counted. `idle_timeout_ms` above `i32::MAX` fails at the server.
pub fn register(class: i32, identity: &str, idle_timeout_ms: u32) -> String {
    let name = quote_literal(&crate::identity::sanitize(identity));
    format!(
        "SELECT pg_backend_pid(), CASE \
         WHEN pg_is_in_recovery() THEN false \
         WHEN NOT pg_try_advisory_lock_shared({class}, {MEMBER_OBJ_ID}) THEN false \
         WHEN set_config('idle_session_timeout', '{idle_timeout_ms}', false) IS NULL THEN true \
         WHEN set_config('idle_in_transaction_session_timeout', '{idle_timeout_ms}', false) \
         IS NULL THEN true \
         WHEN set_config('application_name', {name}, false) IS NULL THEN true \
         ELSE true END, \
         current_setting('max_locks_per_transaction')::int8 * \
         (current_setting('max_connections')::int8 \
         + current_setting('max_prepared_transactions')::int8), \
         (SELECT count(DISTINCT l.pid) FROM pg_locks l WHERE {space} AND {member} \
         AND l.pid <> pg_backend_pid()), \
         pg_is_in_recovery()",
        space = space_rows(class),
        member = MEMBER_ROW,
    )
}

/// Reads the one row of [`register`]. `members` is the others plus one when granted.
///
/// # Errors
/// No row or more than one, a column missing, `NULL` or unparsable.
pub fn parse_registered(rows: &[Row]) -> Result<Registered, ShardSqlError> {
    let row = one_row(statement::REGISTER, rows)?;
    let cols = Columns::new(statement::REGISTER, row);
    let backend = MemberId::new(cols.number(0, "pg_backend_pid")?);
    let granted = cols.boolean(1, "granted")?;
    let lock_capacity = cols.number(2, "lock_capacity")?;
    let others: u32 = cols.number(3, "members")?;
    let in_recovery = cols.boolean(4, "pg_is_in_recovery")?;
    Ok(Registered {
        backend,
        granted,
        lock_capacity,
        members: others.saturating_add(u32::from(granted)),
        in_recovery,
    })
}

/// Reads the space of `count` shards, in one statement with one read of `pg_locks`: one row per
/// backend holding a lock of the space in the current database (granted rows only), ascending
/// by pid, with the columns
///
/// | column | what |
/// |---|---|
/// | `pid` | the holding backend |
/// | `member` | whether it holds the member lock `(class, -1)` in shared mode (`t`/`f`) |
/// | `shards` | the shards in `0..count` it holds exclusively, ascending, comma-separated; `NULL` when none |
/// | `application_name` | from `pg_stat_activity`; `NULL` when that backend ended meanwhile |
/// | `backend` | `pg_backend_pid()` of the answering session, on every row |
///
/// or exactly one row with `NULL` in the first four columns when nobody holds a lock of the
/// space, so the answering backend is always known. Locks of the class outside the protocol
/// are not shown: an `objid` at or above `count` (or negative, other than the member lock), a
/// shard held in shared mode, the member lock held exclusively, a prepared transaction's lock.
/// Such a shard looks free; a take of it is refused by the server. The names come from one
/// read of `pg_stat_activity`, which takes no lock-manager lock.
///
/// With the version floor on (`floor` not [`FloorStep::Off`]), a sixth column `floor` on every
/// row reads the space's floor (the row `(class, -1)` of the unqualified
/// [`FLOOR_TABLE`](crate::floor::FLOOR_TABLE)) after the step, which a raise or a set takes
/// first, durably, in the same statement (an advisory member's first survey after it joined).
pub fn survey(class: i32, count: u32, floor: FloorStep) -> String {
    let (with, floor_column) = floor_parts(crate::floor::FLOOR_TABLE, class, floor);
    format!(
        "{with}SELECT h.pid, h.member, h.shards, a.application_name, me.backend{floor_column} \
         FROM (SELECT pg_backend_pid() AS backend) AS me \
         LEFT JOIN ({holders}) AS h ON true \
         LEFT JOIN pg_stat_activity a ON a.pid = h.pid \
         ORDER BY h.pid",
        holders = holders(class, count)
    )
}

/// The version floor's parts of a shard survey in `table` ([`survey`], the lease's survey):
/// the statement's head (the durable commit and the `WITH` of a step that writes) and the
/// column `, <floor> AS floor`; both empty with the floor off.
pub(crate) fn floor_parts(table: &str, class: i32, floor: FloorStep) -> (String, String) {
    let key = crate::key::LockKey::new(class, MEMBER_OBJ_ID);
    match crate::sql::candidacy::floor_step(table, key, floor) {
        None => (String::new(), String::new()),
        Some((entry, version)) => {
            let written = entry.is_some();
            (
                crate::sql::candidacy::with(&[entry], written),
                format!(", {version} AS floor"),
            )
        }
    }
}

/// Reads the rows of [`survey`] of `count` shards into the core's [`Survey`] and the holders'
/// names.
///
/// # Errors
/// No row, a column missing or unparsable, a `NULL` `member` or `backend`, rows with different
/// answering backends, a `NULL`-pid row beside holder rows, and the core's [`SurveyError`] (a
/// shard outside `0..count`, two holders of one shard).
pub fn parse_survey(
    count: u32,
    rows: &[Row],
    reads_floor: bool,
) -> Result<SurveyRows, ShardSqlError> {
    const S: &str = statement::SURVEY;
    let first = rows.first().ok_or(ShardSqlError::NoRow { statement: S })?;
    let backend: i32 = Columns::new(S, first).number(4, "backend")?;
    let floor = if reads_floor {
        floor_of(&Columns::new(S, first), 5)?
    } else {
        None
    };
    let mut holders = Vec::with_capacity(rows.len());
    let mut names = BTreeMap::new();
    for row in rows {
        let cols = Columns::new(S, row);
        if cols.number::<i32>(4, "backend")? != backend {
            return Err(inconsistent(S, "two answering backends"));
        }
        let Some(pid) = cols.optional_number::<i32>(0, "pid")? else {
            if rows.len() > 1 {
                return Err(inconsistent(S, "a row without holder beside holders"));
            }
            continue;
        };
        let pid = MemberId::new(pid);
        let member = cols.boolean(1, "member")?;
        let shards = cols.shard_list(2, "shards")?;
        if let Some(name) = cols
            .optional(3, "application_name")?
            .filter(|n| !n.is_empty())
        {
            names.insert(pid, name.to_owned());
        }
        holders.push((pid, member, shards));
    }
    let survey = Survey::new(count, MemberId::new(backend), holders)?;
    Ok(SurveyRows {
        survey,
        names,
        floor,
    })
}

/// The floor in column `index`: `None` for `NULL` (none recorded).
///
/// # Errors
/// A version that does not parse.
fn floor_of(cols: &Columns<'_>, index: usize) -> Result<Option<Version>, ShardSqlError> {
    cols.optional(index, "floor")?
        .map(|text| {
            Version::parse(text).map_err(|_| cols.unparsable("floor", text, "a release number"))
        })
        .transpose()
}

/// Tries the lock of each of `shards` on this session, in one statement, and returns one row
/// (`s`, the shard) per lock granted; the others are held by another session. The shards are
/// tried in ascending order, each once (the list is sorted and deduplicated: a second try on
/// the same session would count the lock twice, and one unlock would not free it). Try-locks
/// never wait, so two sessions racing for overlapping sets get disjoint grants and never
/// deadlock. A shard this session already holds is granted again and then needs two unlocks:
/// ask only for shards the survey showed free. An empty list returns no row. A shard above
/// `i32::MAX` (none exists: [`MAX_SHARDS`](plexsphere_leader_core::shards::MAX_SHARDS)) fails
/// at the server.
///
/// A take that fails part-way (a full lock table raises SQLSTATE 53200, out of shared memory)
/// keeps the locks granted before the failure: session-level advisory locks are not released
/// when their statement fails. After a failed take the session holds an unknown set of shards;
/// close it (or clear it with [`unlock_all`]).
pub fn take(class: i32, shards: &[Shard]) -> String {
    format!(
        "SELECT t.s FROM unnest({}) AS t(s) WHERE pg_try_advisory_lock({class}, t.s)",
        int4_array(shards)
    )
}

/// Reads the rows of [`take`]: the shards granted, ascending.
///
/// # Errors
/// A column missing, `NULL` or not a shard number.
pub fn parse_taken(rows: &[Row]) -> Result<Vec<Shard>, ShardSqlError> {
    shard_rows(statement::TAKE, rows)
}

/// With fencing, run on the lock session right after a take: the next epoch of every granted
/// shard in the fence table ([`FENCE_SETUP`](crate::sql::FENCE_SETUP); shard `s` of `class` is
/// the row `(class, s)`, the same row [`fencing::check`](crate::fencing::check) reads for the
/// key `LockKey::new(class, s)`), one row `(objid, epoch)` per shard, in one statement. It runs
/// after `SET LOCAL lock_timeout` of `lock_timeout_ms` in the same query string: a fenced
/// transaction of a cut-off former owner holding a fence row (`FOR SHARE`) makes the server end
/// the wait (SQLSTATE 55P03) instead of holding the session past the interval, and after
/// [`DURABLE_COMMIT`], so that a crash of a server with `synchronous_commit = off` cannot roll
/// back epochs already handed out. The implicit transaction ends with the string, so the
/// session keeps its own settings.
pub fn advance_epochs(class: i32, shards: &[Shard], lock_timeout_ms: u32) -> String {
    format!(
        "SET LOCAL lock_timeout = '{lock_timeout_ms}'; {DURABLE_COMMIT}\
         INSERT INTO plexsphere_leader_fence AS f (classid, objid, epoch) \
         SELECT {class}, t.s, 1 FROM unnest({}) AS t(s) \
         ON CONFLICT (classid, objid) DO UPDATE SET epoch = f.epoch + 1 \
         RETURNING f.objid, f.epoch",
        int4_array(shards)
    )
}

/// Reads the rows of [`advance_epochs`]: each shard with its new epoch, ascending by shard.
///
/// # Errors
/// A column missing, `NULL` or unparsable.
pub fn parse_epochs(rows: &[Row]) -> Result<Vec<(Shard, u64)>, ShardSqlError> {
    let mut epochs = rows
        .iter()
        .map(|row| {
            let cols = Columns::new(statement::ADVANCE_EPOCHS, row);
            Ok((
                Shard::new(cols.number(0, "objid")?),
                cols.number(1, "epoch")?,
            ))
        })
        .collect::<Result<Vec<_>, ShardSqlError>>()?;
    epochs.sort_unstable();
    Ok(epochs)
}

/// Unlocks each of `shards` on this session (`pg_advisory_unlock(class, s)`, sorted and
/// deduplicated), in one statement, and returns one row (`s`) per shard whose unlock returned
/// `false`: this session did not hold it (the server also sends a WARNING for each). An empty
/// list returns no row.
pub fn unlock(class: i32, shards: &[Shard]) -> String {
    format!(
        "SELECT t.s FROM unnest({}) AS t(s) WHERE NOT pg_advisory_unlock({class}, t.s)",
        int4_array(shards)
    )
}

/// Reads the rows of [`unlock`]: the shards that were not held, ascending.
///
/// # Errors
/// A column missing, `NULL` or not a shard number.
pub fn parse_unlocked(rows: &[Row]) -> Result<Vec<Shard>, ShardSqlError> {
    shard_rows(statement::UNLOCK, rows)
}

/// Releases every advisory lock of this session, the member lock and every shard (of any
/// space), however many times each was taken. It returns one row (`void`, empty text); only its
/// success matters.
pub fn unlock_all() -> String {
    "SELECT pg_advisory_unlock_all()".to_owned()
}

/// Who owns what in the space of `count` shards, for operators and status pages, from any
/// session of the database (it takes no lock): one row per backend holding a lock of the space,
/// ascending by pid, with the columns
///
/// | column | what |
/// |---|---|
/// | `pid` | the holding backend |
/// | `application_name` | its name (a member's identity); `NULL` when it ended meanwhile |
/// | `member` | whether it holds the member lock in shared mode (`t`/`f`) |
/// | `shard_count` | how many shards in `0..count` it holds exclusively |
/// | `shards` | those shards, ascending, comma-separated; `NULL` when none |
///
/// and no row when nobody holds a lock of the space. The same rows as [`survey`], with the
/// same exclusions and the same single read of `pg_locks`; `pg_locks` and `application_name`
/// are visible to every role.
pub fn owners(class: i32, count: u32) -> String {
    format!(
        "SELECT h.pid, a.application_name, h.member, h.shard_count, h.shards \
         FROM ({holders}) AS h \
         LEFT JOIN pg_stat_activity a ON a.pid = h.pid \
         ORDER BY h.pid",
        holders = holders(class, count)
    )
}

/// Reads the rows of [`owners`].
///
/// # Errors
/// A column missing or unparsable, a `NULL` `pid`, `member` or `shard_count`, a shard count
/// that is not the length of the list.
pub fn parse_owners(rows: &[Row]) -> Result<Vec<OwnerRow>, ShardSqlError> {
    const S: &str = statement::OWNERS;
    rows.iter()
        .map(|row| {
            let cols = Columns::new(S, row);
            let pid = MemberId::new(cols.number(0, "pid")?);
            let name = cols
                .optional(1, "application_name")?
                .filter(|n| !n.is_empty());
            let member = cols.boolean(2, "member")?;
            let count: usize = cols.number(3, "shard_count")?;
            let shards: Vec<Shard> = cols
                .shard_list(4, "shards")?
                .into_iter()
                .map(Shard::new)
                .collect();
            if shards.len() != count {
                return Err(inconsistent(S, "shard_count is not the length of shards"));
            }
            Ok(OwnerRow::named(pid, name, member, shards))
        })
        .collect()
}

/// A row of `pg_locks` (alias `l`) that is the member lock held in shared mode.
const MEMBER_ROW: &str = "l.objid = 4294967295::oid AND l.mode = 'ShareLock'";

/// The granted rows of `pg_locks` (alias `l`) of class `class` in the current database, in the
/// two-`int4` form, held by a backend.
fn space_rows(class: i32) -> String {
    format!(
        "l.locktype = 'advisory' AND l.granted AND l.pid IS NOT NULL \
         AND l.classid = {}::oid AND l.objsubid = 2 \
         AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())",
        as_oid(class)
    )
}

/// A row of `pg_locks` (alias `l`) that is a shard in `0..count` held exclusively.
fn shard_row(count: u32) -> String {
    format!("l.objid < {count}::oid AND l.mode = 'ExclusiveLock'")
}

/// The space's holders grouped by pid, from one read of `pg_locks`: `pid`, `member`,
/// `shard_count`, `shards` (comma list, `NULL` when none).
fn holders(class: i32, count: u32) -> String {
    let shard = shard_row(count);
    format!(
        "SELECT l.pid, bool_or({MEMBER_ROW}) AS member, \
         count(*) FILTER (WHERE {shard}) AS shard_count, \
         string_agg(l.objid::text, ',' ORDER BY l.objid) FILTER (WHERE {shard}) AS shards \
         FROM pg_locks l \
         WHERE {space} AND (({MEMBER_ROW}) OR ({shard})) \
         GROUP BY l.pid",
        space = space_rows(class),
    )
}

/// How `pg_locks` shows an `int4` key half: as an `oid`, a negative value plus 2³².
fn as_oid(value: i32) -> u32 {
    u32::from_ne_bytes(value.to_ne_bytes())
}

/// `shards`, sorted and deduplicated, as an `int4[]` literal: `'{1,2,3}'::int4[]`.
fn int4_array(shards: &[Shard]) -> String {
    let mut numbers: Vec<u32> = shards.iter().map(|s| s.get()).collect();
    numbers.sort_unstable();
    numbers.dedup();
    let list: Vec<String> = numbers.iter().map(u32::to_string).collect();
    format!("'{{{}}}'::int4[]", list.join(","))
}

fn inconsistent(statement: &'static str, what: &'static str) -> ShardSqlError {
    ShardSqlError::Inconsistent { statement, what }
}

fn one_row<'r>(statement: &'static str, rows: &'r [Row]) -> Result<&'r Row, ShardSqlError> {
    match rows {
        [row] => Ok(row),
        [] => Err(ShardSqlError::NoRow { statement }),
        _ => Err(ShardSqlError::ExtraRows {
            statement,
            rows: rows.len(),
        }),
    }
}

/// One shard per row in the first column, ascending and deduplicated.
fn shard_rows(statement: &'static str, rows: &[Row]) -> Result<Vec<Shard>, ShardSqlError> {
    let mut shards = rows
        .iter()
        .map(|row| Columns::new(statement, row).number(0, "s").map(Shard::new))
        .collect::<Result<Vec<_>, _>>()?;
    shards.sort_unstable();
    shards.dedup();
    Ok(shards)
}

/// The columns of one row of `statement`, read by index with their names for errors.
struct Columns<'r> {
    statement: &'static str,
    row: &'r Row,
}

impl<'r> Columns<'r> {
    fn new(statement: &'static str, row: &'r Row) -> Self {
        Self { statement, row }
    }

    fn optional(
        &self,
        index: usize,
        column: &'static str,
    ) -> Result<Option<&'r str>, ShardSqlError> {
        self.row
            .get(index)
            .map(Option::as_deref)
            .ok_or(ShardSqlError::MissingColumn {
                statement: self.statement,
                column,
            })
    }

    fn required(&self, index: usize, column: &'static str) -> Result<&'r str, ShardSqlError> {
        self.optional(index, column)?
            .ok_or(ShardSqlError::NullColumn {
                statement: self.statement,
                column,
            })
    }

    fn unparsable(
        &self,
        column: &'static str,
        value: &str,
        expected: &'static str,
    ) -> ShardSqlError {
        ShardSqlError::Unparsable {
            statement: self.statement,
            column,
            value: value.to_owned(),
            expected,
        }
    }

    fn number<T: FromStr>(&self, index: usize, column: &'static str) -> Result<T, ShardSqlError> {
        let text = self.required(index, column)?;
        text.parse()
            .map_err(|_| self.unparsable(column, text, "an integer in range"))
    }

    fn optional_number<T: FromStr>(
        &self,
        index: usize,
        column: &'static str,
    ) -> Result<Option<T>, ShardSqlError> {
        match self.optional(index, column)? {
            None => Ok(None),
            Some(_) => self.number(index, column).map(Some),
        }
    }

    fn boolean(&self, index: usize, column: &'static str) -> Result<bool, ShardSqlError> {
        match self.required(index, column)? {
            "t" | "true" => Ok(true),
            "f" | "false" => Ok(false),
            other => Err(self.unparsable(column, other, "a boolean (t or f)")),
        }
    }

    /// A comma list (`1,2,3`) or `int4[]` text (`{1,2,3}`) of shard numbers; `NULL` or empty is
    /// no shard.
    fn shard_list(&self, index: usize, column: &'static str) -> Result<Vec<u32>, ShardSqlError> {
        let Some(text) = self.optional(index, column)? else {
            return Ok(Vec::new());
        };
        let list = text
            .strip_prefix('{')
            .and_then(|t| t.strip_suffix('}'))
            .unwrap_or(text);
        if list.is_empty() {
            return Ok(Vec::new());
        }
        list.split(',')
            .map(|n| {
                n.parse()
                    .map_err(|_| self.unparsable(column, text, "a list of shard numbers"))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(cols: &[Option<&str>]) -> Row {
        cols.iter().map(|c| c.map(str::to_owned)).collect()
    }

    fn shards(numbers: &[u32]) -> Vec<Shard> {
        numbers.iter().copied().map(Shard::new).collect()
    }

    fn one_statement(statement: &str) {
        assert!(!statement.contains(';'), "{statement}");
        assert!(!statement.contains('$'), "no parameter: {statement}");
    }

    #[test]
    fn register_takes_the_shared_member_lock_and_bounds_and_names_only_when_granted() {
        let statement = register(-7, "svc@host", 20_000);
        one_statement(&statement);
        assert_eq!(
            statement,
            "SELECT pg_backend_pid(), CASE WHEN pg_is_in_recovery() THEN false \
             WHEN NOT pg_try_advisory_lock_shared(-7, -1) THEN false \
             WHEN set_config('idle_session_timeout', '20000', false) IS NULL THEN true \
             WHEN set_config('idle_in_transaction_session_timeout', '20000', false) \
             IS NULL THEN true \
             WHEN set_config('application_name', 'svc@host', false) IS NULL THEN true \
             ELSE true END, \
             current_setting('max_locks_per_transaction')::int8 * \
             (current_setting('max_connections')::int8 \
             + current_setting('max_prepared_transactions')::int8), \
             (SELECT count(DISTINCT l.pid) FROM pg_locks l WHERE l.locktype = 'advisory' \
             AND l.granted AND l.pid IS NOT NULL AND l.classid = 4294967289::oid \
             AND l.objsubid = 2 \
             AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
             AND l.objid = 4294967295::oid AND l.mode = 'ShareLock' \
             AND l.pid <> pg_backend_pid()), pg_is_in_recovery()"
        );
        assert_eq!(statement.matches("pg_locks").count(), 1);
    }

    #[test]
    fn register_quotes_and_sanitizes_the_identity() {
        assert!(register(1, "o'brien", 1).contains("'application_name', 'o''brien', false"));
        assert!(register(1, r"a\b", 1).contains(r"'application_name', E'a\\b', false"));
        assert!(register(1, "naïve", 1).contains("'application_name', 'na?ve', false"));
        let long = register(1, &"z".repeat(80), 1);
        assert!(long.contains(&format!(
            "'{}'",
            "z".repeat(crate::config::MAX_IDENTITY_LEN)
        )));
        assert!(!long.contains(&"z".repeat(crate::config::MAX_IDENTITY_LEN + 1)));
    }

    #[test]
    fn the_survey_reads_pg_locks_once_and_always_names_the_answering_backend() {
        let statement = survey(1_886_156_915, 16, FloorStep::Off);
        one_statement(&statement);
        assert_eq!(statement.matches("pg_locks").count(), 1, "{statement}");
        assert!(statement.starts_with(
            "SELECT h.pid, h.member, h.shards, a.application_name, me.backend \
             FROM (SELECT pg_backend_pid() AS backend) AS me LEFT JOIN ("
        ));
        for part in [
            "l.classid = 1886156915::oid AND l.objsubid = 2",
            "l.objid < 16::oid AND l.mode = 'ExclusiveLock'",
            "l.objid = 4294967295::oid AND l.mode = 'ShareLock'",
            "l.granted AND l.pid IS NOT NULL",
            "datname = current_database()",
            "string_agg(l.objid::text, ',' ORDER BY l.objid)",
            "GROUP BY l.pid) AS h ON true",
            "LEFT JOIN pg_stat_activity a ON a.pid = h.pid ORDER BY h.pid",
        ] {
            assert!(statement.contains(part), "{part} in {statement}");
        }
        let owners = owners(-2, 8);
        one_statement(&owners);
        assert_eq!(owners.matches("pg_locks").count(), 1, "{owners}");
        assert!(owners.contains("l.classid = 4294967294::oid"), "{owners}");
        assert!(owners.contains(&holders(-2, 8)));
    }

    #[test]
    fn take_and_unlock_pass_one_sorted_deduplicated_int4_array() {
        let asked = shards(&[5, 1, 3, 1]);
        assert_eq!(
            take(-7, &asked),
            "SELECT t.s FROM unnest('{1,3,5}'::int4[]) AS t(s) \
             WHERE pg_try_advisory_lock(-7, t.s)"
        );
        assert_eq!(
            unlock(42, &asked),
            "SELECT t.s FROM unnest('{1,3,5}'::int4[]) AS t(s) \
             WHERE NOT pg_advisory_unlock(42, t.s)"
        );
        assert!(take(1, &[]).contains("unnest('{}'::int4[])"));
        let all: Vec<Shard> = (0..1024).map(Shard::new).collect();
        let long = take(1, &all);
        one_statement(&long);
        assert!(long.contains("'{0,1,2,"));
        assert!(long.contains(",1022,1023}'::int4[]"));
        assert_eq!(unlock_all(), "SELECT pg_advisory_unlock_all()");
    }

    #[test]
    fn negative_halves_show_as_oids_plus_two_to_the_32() {
        assert_eq!(as_oid(-1), 4_294_967_295);
        assert_eq!(as_oid(-7), 4_294_967_289);
        assert_eq!(as_oid(i32::MIN), 2_147_483_648);
        assert_eq!(as_oid(7), 7);
        assert_eq!(as_oid(MEMBER_OBJ_ID).to_string(), "4294967295");
        assert!(MEMBER_ROW.contains(&as_oid(MEMBER_OBJ_ID).to_string()));
    }

    #[test]
    fn a_registration_counts_itself_only_when_granted() {
        let granted = [row(&[
            Some("42"),
            Some("t"),
            Some("6400"),
            Some("2"),
            Some("f"),
        ])];
        assert_eq!(
            parse_registered(&granted),
            Ok(Registered {
                backend: MemberId::new(42),
                granted: true,
                lock_capacity: 6400,
                members: 3,
                in_recovery: false,
            })
        );
        let refused = [row(&[
            Some("42"),
            Some("f"),
            Some("6400"),
            Some("2"),
            Some("t"),
        ])];
        let refused = parse_registered(&refused).expect("parses");
        assert_eq!(
            (refused.granted, refused.members, refused.in_recovery),
            (false, 2, true)
        );
    }

    #[test]
    fn a_bad_registration_row_is_a_typed_error() {
        let good = [Some("42"), Some("t"), Some("6400"), Some("0"), Some("f")];
        assert_eq!(
            parse_registered(&[]),
            Err(ShardSqlError::NoRow {
                statement: statement::REGISTER
            })
        );
        assert!(matches!(
            parse_registered(&[row(&good), row(&good)]),
            Err(ShardSqlError::ExtraRows { rows: 2, .. })
        ));
        assert!(matches!(
            parse_registered(&[row(&good[..4])]),
            Err(ShardSqlError::MissingColumn {
                column: "pg_is_in_recovery",
                ..
            })
        ));
        let cases: [(usize, Option<&str>, &str); 6] = [
            (0, None, "pg_backend_pid"),
            (1, Some("yes"), "granted"),
            (2, Some("-1"), "lock_capacity"),
            (2, Some("6.4e3"), "lock_capacity"),
            (3, Some("99999999999"), "members"),
            (1, None, "granted"),
        ];
        for (index, value, column) in cases {
            let mut bad = row(&good);
            bad[index] = value.map(str::to_owned);
            let error = parse_registered(&[bad]).expect_err("bad row");
            match (&error, value) {
                (ShardSqlError::NullColumn { column: c, .. }, None) => assert_eq!(*c, column),
                (ShardSqlError::Unparsable { column: c, .. }, Some(_)) => assert_eq!(*c, column),
                _ => panic!("{index} {value:?}: {error}"),
            }
        }
    }

    #[test]
    fn with_the_floor_the_survey_takes_the_join_step_durably_and_reads_the_floor_on_every_row() {
        let version = Version::new(1, 10, 0);
        let raise = survey(7, 4, FloorStep::Raise(version));
        assert!(raise.starts_with(&format!(
            "{DURABLE_COMMIT}WITH floor_step AS (INSERT INTO plexsphere_leader_floor AS f"
        )));
        assert!(raise.contains("VALUES (7, -1, '1.10.0', "), "{raise}");
        assert!(raise.contains(
            ", coalesce((SELECT version FROM floor_step), (SELECT version FROM \
             plexsphere_leader_floor WHERE classid = 7 AND objid = -1)) AS floor FROM"
        ));
        let read = survey(7, 4, FloorStep::Read);
        one_statement(&read);
        assert!(read.contains(
            "me.backend, (SELECT version FROM plexsphere_leader_floor WHERE classid = 7 AND \
             objid = -1) AS floor FROM"
        ));
        let with_floor = |floor: Option<&str>| {
            let mut row = survey_row("10", "t", Some("0"), Some("~0:1.10.0 a@host"));
            row.push(floor.map(str::to_owned));
            row
        };
        let parsed = parse_survey(4, &[with_floor(Some("1.10.0"))], true).expect("parses");
        assert_eq!(parsed.floor, Some(version));
        assert_eq!(
            parse_survey(4, &[with_floor(None)], true).map(|r| r.floor),
            Ok(None)
        );
        assert!(parse_survey(4, &[with_floor(Some("new"))], true).is_err());
        // Off, the floor column is neither asked for nor read.
        assert_eq!(
            parse_survey(4, &[survey_row("10", "t", None, None)], false).map(|r| r.floor),
            Ok(None)
        );
    }

    fn survey_row(pid: &str, member: &str, shards: Option<&str>, name: Option<&str>) -> Row {
        row(&[Some(pid), Some(member), shards, name, Some("10")])
    }

    #[test]
    fn a_survey_reads_members_holders_and_names() {
        let rows = [
            survey_row("10", "t", Some("0,2"), Some("a@host")),
            survey_row("11", "t", None, Some("")),
            survey_row("12", "f", Some("{3}"), None),
        ];
        let read = parse_survey(4, &rows, false).expect("parses");
        let survey = read.survey;
        assert_eq!(survey.backend(), MemberId::new(10));
        assert_eq!(survey.members(), &[MemberId::new(10), MemberId::new(11)]);
        assert_eq!(survey.held_by(MemberId::new(10)), shards(&[0, 2]));
        assert_eq!(survey.holder(Shard::new(1)), None);
        assert_eq!(survey.holder(Shard::new(3)), Some(MemberId::new(12)));
        assert_eq!(
            read.names,
            BTreeMap::from([(MemberId::new(10), "a@host".to_owned())])
        );
    }

    #[test]
    fn an_empty_space_is_one_row_without_holder() {
        let read =
            parse_survey(3, &[row(&[None, None, None, None, Some("77")])], false).expect("parses");
        assert_eq!(read.survey.backend(), MemberId::new(77));
        assert!(read.survey.members().is_empty());
        assert_eq!(read.survey.held_count(), 0);
        assert!(read.names.is_empty());
    }

    #[test]
    fn bad_survey_rows_are_typed_errors() {
        let empty = row(&[None, None, None, None, Some("10")]);
        let holder = survey_row("11", "t", Some("1"), None);
        let cases: Vec<(Vec<Row>, &str)> = vec![
            (vec![], "no row"),
            (vec![empty.clone(), holder.clone()], "a row without holder"),
            (
                vec![
                    row(&[Some("11"), Some("t"), None, None, Some("9")]),
                    holder.clone(),
                ],
                "two answering",
            ),
            (
                vec![row(&[Some("11"), Some("t"), None, None, None])],
                "backend is NULL",
            ),
            (
                vec![row(&[Some("11"), None, None, None, Some("10")])],
                "member is NULL",
            ),
            (vec![survey_row("x", "t", None, None)], "pid reads"),
            (
                vec![survey_row("11", "t", Some("1,,2"), None)],
                "shards reads",
            ),
            (
                vec![survey_row("11", "t", Some("-1"), None)],
                "shards reads",
            ),
            (vec![survey_row("11", "t", Some("4"), None)], "outside 0..4"),
            (
                vec![
                    survey_row("11", "t", Some("1"), None),
                    survey_row("12", "t", Some("1"), None),
                ],
                "two holders",
            ),
            (
                vec![row(&[Some("11"), Some("t"), None, None])],
                "backend missing",
            ),
        ];
        for (rows, message) in cases {
            let error = parse_survey(4, &rows, false).expect_err(message);
            assert!(error.to_string().contains(message), "{message}: {error}");
        }
        assert!(matches!(
            parse_survey(4, &[survey_row("11", "t", Some("9"), None)], false),
            Err(ShardSqlError::Survey(SurveyError::ShardOutOfRange {
                shard: 9,
                count: 4
            }))
        ));
    }

    #[test]
    fn taken_and_unlocked_shards_read_ascending_and_reject_garbage() {
        let rows = [row(&[Some("7")]), row(&[Some("2")]), row(&[Some("5")])];
        assert_eq!(parse_taken(&rows), Ok(shards(&[2, 5, 7])));
        assert_eq!(parse_unlocked(&rows), Ok(shards(&[2, 5, 7])));
        assert_eq!(parse_taken(&[]), Ok(Vec::new()));
        for bad in [
            row(&[None]),
            row(&[Some("-3")]),
            row(&[Some("x")]),
            row(&[]),
        ] {
            assert!(parse_taken(std::slice::from_ref(&bad)).is_err(), "{bad:?}");
            assert!(
                parse_unlocked(std::slice::from_ref(&bad)).is_err(),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn owners_read_with_their_names_and_a_checked_count() {
        let rows = [
            row(&[Some("10"), Some("a@h"), Some("t"), Some("2"), Some("0,3")]),
            row(&[Some("11"), None, Some("t"), Some("0"), None]),
        ];
        assert_eq!(
            parse_owners(&rows),
            Ok(vec![
                OwnerRow {
                    pid: MemberId::new(10),
                    name: Some("a@h".to_owned()),
                    member: true,
                    shards: shards(&[0, 3]),
                    rank: None,
                },
                OwnerRow {
                    pid: MemberId::new(11),
                    name: None,
                    member: true,
                    shards: Vec::new(),
                    rank: None,
                },
            ])
        );
        assert_eq!(parse_owners(&[]), Ok(Vec::new()));
        let wrong_count = row(&[Some("10"), None, Some("t"), Some("3"), Some("0,3")]);
        assert!(matches!(
            parse_owners(&[wrong_count]),
            Err(ShardSqlError::Inconsistent { .. })
        ));
        let null_pid = row(&[None, None, Some("t"), Some("0"), None]);
        assert!(matches!(
            parse_owners(&[null_pid]),
            Err(ShardSqlError::NullColumn { column: "pid", .. })
        ));
    }

    #[test]
    fn the_epoch_advance_bounds_its_wait_commits_durably_and_returns_every_shards_epoch() {
        let sql = advance_epochs(7, &shards(&[3, 1, 3]), 250);
        assert!(
            sql.starts_with(
                "SET LOCAL lock_timeout = '250'; SET LOCAL synchronous_commit = on; \
                 INSERT INTO plexsphere_leader_fence"
            ),
            "{sql}"
        );
        assert!(
            sql.contains("SELECT 7, t.s, 1 FROM unnest('{1,3}'::int4[]) AS t(s)"),
            "{sql}"
        );
        assert!(sql.ends_with("RETURNING f.objid, f.epoch"), "{sql}");
        assert_eq!(
            parse_epochs(&[row(&[Some("3"), Some("9")]), row(&[Some("1"), Some("2")])]),
            Ok(vec![(Shard::new(1), 2), (Shard::new(3), 9)])
        );
        assert!(matches!(
            parse_epochs(&[row(&[Some("1"), None])]),
            Err(ShardSqlError::NullColumn {
                column: "epoch",
                ..
            })
        ));
    }
}
