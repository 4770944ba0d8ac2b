//! What the statements of a sharded election do (`plexsphere_leader::shard_sql`, recognised by
//! `shard`): the answers PostgreSQL gives them, computed from the lock table and the sessions.
//!
//! The survey and owners statements read `pg_locks` as the adapter's SQL filters it: granted
//! advisory locks of the session's database in the two-`int4` form with the space's class id,
//! the member lock `(class, -1)` only when held in shared mode, a shard `(class, s)` only for
//! `0 <= s < count` (as an `oid`: a negative second half is at or above 2³¹) and only when held
//! exclusively; one row per backend holding such a lock, in pid order, its name from the
//! session's current `application_name` (`pg_stat_activity`). A take tries each shard in the
//! list's order and returns the granted ones; an unlock unlocks each and returns the ones not
//! held, each with its WARNING before its row, as PostgreSQL's executor raises it while
//! filtering that row.

use std::collections::BTreeMap;

use super::eval::Value;
use super::{Ctx, Stop};
use crate::guc::Guc;
use crate::locks::{LockKey, LockMode};
use crate::reply::{PgType, SqlError, sqlstate};
use crate::shard::ShardStatement;

/// The second half of the member lock `(class, -1)`.
const MEMBER: i32 = plexsphere_leader::shard_sql::MEMBER_OBJ_ID;

const REGISTER_COLUMNS: [(&str, PgType); 5] = [
    ("pg_backend_pid", PgType::Int4),
    ("case", PgType::Bool),
    ("?column?", PgType::Int8),
    ("count", PgType::Int8),
    ("pg_is_in_recovery", PgType::Bool),
];
const SURVEY_COLUMNS: [(&str, PgType); 5] = [
    ("pid", PgType::Int4),
    ("member", PgType::Bool),
    ("shards", PgType::Text),
    ("application_name", PgType::Text),
    ("backend", PgType::Int4),
];
const OWNERS_COLUMNS: [(&str, PgType); 5] = [
    ("pid", PgType::Int4),
    ("application_name", PgType::Text),
    ("member", PgType::Bool),
    ("shard_count", PgType::Int8),
    ("shards", PgType::Text),
];
const SHARD_COLUMN: [(&str, PgType); 1] = [("s", PgType::Int4)];

/// The result columns of `statement`, as a Describe reports them.
pub(super) fn columns(statement: &ShardStatement) -> &'static [(&'static str, PgType)] {
    match statement {
        ShardStatement::Register { .. } => &REGISTER_COLUMNS,
        ShardStatement::Survey { .. } => &SURVEY_COLUMNS,
        ShardStatement::Owners { .. } => &OWNERS_COLUMNS,
        ShardStatement::Take { .. } | ShardStatement::Unlock { .. } => &SHARD_COLUMN,
    }
}

/// One backend holding locks of a space: whether it is a member, and its shards ascending.
#[derive(Default)]
struct Holding {
    member: bool,
    shards: Vec<u32>,
}

impl Ctx<'_> {
    pub(super) fn shard(&mut self, statement: &ShardStatement) -> Result<(), Stop> {
        match statement {
            ShardStatement::Register {
                class,
                identity,
                idle_timeout_ms,
            } => self.register(*class, identity, *idle_timeout_ms),
            ShardStatement::Survey { class, count } => self.survey(*class, *count),
            ShardStatement::Owners { class, count } => self.owners(*class, *count),
            ShardStatement::Take { class, shards } => self.take(*class, shards),
            ShardStatement::Unlock { class, shards } => self.unlock_shards(*class, shards),
        }
    }

    /// Joins the space: the `CASE` takes the shared member lock unless the server is in
    /// recovery and, only when granted, sets the idle timeouts and the name (session-level).
    /// A setting that fails (an idle timeout above `INT_MAX` ms) fails the statement after
    /// the lock was taken, which the session keeps, as in PostgreSQL.
    fn register(&mut self, class: i32, identity: &str, idle_ms: u32) -> Result<(), Stop> {
        let in_recovery = self.state.in_recovery;
        let granted = match self.join(class, identity, idle_ms, in_recovery) {
            Ok(granted) => granted,
            Err(error) => {
                self.describe_row(&REGISTER_COLUMNS);
                return Err(error.into());
            }
        };
        let session = self.state.sessions.get(&self.pid).ok_or_else(super::gone)?;
        let capacity = session.gucs.server.capacity();
        let database = session.database.clone();
        let others = self
            .state
            .locks
            .held()
            .into_iter()
            .filter(|l| {
                l.id.database == database
                    && l.id.key == LockKey::Pair(class, MEMBER)
                    && l.mode == LockMode::Shared
                    && l.pid != self.pid
            })
            .count();
        let row = [
            Some(self.pid.to_string()),
            Value::Bool(granted).text(),
            Some(capacity.to_string()),
            Some(others.to_string()),
            Value::Bool(in_recovery).text(),
        ];
        self.send_result(&REGISTER_COLUMNS, &[row], "SELECT");
        Ok(())
    }

    fn join(
        &mut self,
        class: i32,
        identity: &str,
        idle_ms: u32,
        in_recovery: bool,
    ) -> Result<bool, SqlError> {
        if in_recovery {
            return Ok(false);
        }
        let member = LockKey::Pair(class, MEMBER);
        if !self
            .state
            .try_lock_in(self.pid, member, LockMode::Shared, self.at)
        {
            return Ok(false);
        }
        let idle = idle_ms.to_string();
        self.set_guc(&Guc::IdleSessionTimeout, &idle, false)?;
        self.set_guc(&Guc::IdleInTransactionSessionTimeout, &idle, false)?;
        self.set_guc(&Guc::ApplicationName, identity, false)?;
        Ok(true)
    }

    /// The holders of the space of `count` shards of `class` in the session's database, by
    /// pid.
    fn holders(&self, class: i32, count: u32) -> Result<BTreeMap<i32, Holding>, SqlError> {
        let database = self.database()?;
        let mut holders: BTreeMap<i32, Holding> = BTreeMap::new();
        for lock in self.state.locks.held() {
            let LockKey::Pair(held_class, objid) = lock.id.key else {
                continue;
            };
            if lock.id.database != database || held_class != class {
                continue;
            }
            let as_oid = objid.cast_unsigned();
            let member = objid == MEMBER && lock.mode == LockMode::Shared;
            let shard = as_oid < count && lock.mode == LockMode::Exclusive;
            if !member && !shard {
                continue;
            }
            let holding = holders.entry(lock.pid).or_default();
            holding.member |= member;
            if shard {
                holding.shards.push(as_oid);
            }
        }
        for holding in holders.values_mut() {
            holding.shards.sort_unstable();
        }
        Ok(holders)
    }

    /// The `application_name` `pg_stat_activity` shows for `pid`; `None` when no such backend.
    fn name_of(&self, pid: i32) -> Option<String> {
        self.state
            .sessions
            .get(&pid)
            .map(|session| session.gucs.application_name.clone())
    }

    fn survey(&mut self, class: i32, count: u32) -> Result<(), Stop> {
        let holders = self.holders(class, count)?;
        let backend = Some(self.pid.to_string());
        let rows: Vec<[Option<String>; 5]> = if holders.is_empty() {
            vec![[None, None, None, None, backend]]
        } else {
            holders
                .iter()
                .map(|(&pid, holding)| {
                    [
                        Some(pid.to_string()),
                        Value::Bool(holding.member).text(),
                        shard_list(&holding.shards),
                        self.name_of(pid),
                        backend.clone(),
                    ]
                })
                .collect()
        };
        self.send_result(&SURVEY_COLUMNS, &rows, "SELECT");
        Ok(())
    }

    fn owners(&mut self, class: i32, count: u32) -> Result<(), Stop> {
        let holders = self.holders(class, count)?;
        let rows: Vec<[Option<String>; 5]> = holders
            .iter()
            .map(|(&pid, holding)| {
                [
                    Some(pid.to_string()),
                    self.name_of(pid),
                    Value::Bool(holding.member).text(),
                    Some(holding.shards.len().to_string()),
                    shard_list(&holding.shards),
                ]
            })
            .collect();
        self.send_result(&OWNERS_COLUMNS, &rows, "SELECT");
        Ok(())
    }

    /// `pg_try_advisory_lock(class, s)` for each shard in the list's order; a row per grant.
    fn take(&mut self, class: i32, shards: &[u32]) -> Result<(), Stop> {
        let keys = int4_list(class, shards)?;
        let mut granted = Vec::new();
        for (shard, key) in shards.iter().zip(keys) {
            if self.state.try_lock(self.pid, key, self.at) {
                granted.push([Some(shard.to_string())]);
            }
        }
        self.send_result(&SHARD_COLUMN, &granted, "SELECT");
        Ok(())
    }

    /// `pg_advisory_unlock(class, s)` for each shard in the list's order; a WARNING and a row
    /// per shard the session did not hold.
    fn unlock_shards(&mut self, class: i32, shards: &[u32]) -> Result<(), Stop> {
        let keys = int4_list(class, shards)?;
        self.describe_row(&SHARD_COLUMN);
        let mut not_held = 0;
        for (shard, key) in shards.iter().zip(keys) {
            if !self.state.unlock(self.pid, key, self.at) {
                self.reply.notice(&super::not_owned(LockMode::Exclusive));
                self.send_row(&SHARD_COLUMN, &[Some(shard.to_string())]);
                not_held += 1;
            }
        }
        self.reply.command_complete(&format!("SELECT {not_held}"));
        Ok(())
    }
}

/// The keys `(class, s)` of `'{…}'::int4[]`; 22003 (at the cast, before anything runs) for a
/// shard above `i32::MAX`.
fn int4_list(class: i32, shards: &[u32]) -> Result<Vec<LockKey>, SqlError> {
    shards
        .iter()
        .map(|&shard| {
            i32::try_from(shard)
                .map(|s| LockKey::Pair(class, s))
                .map_err(|_| {
                    SqlError::error(
                        sqlstate::NUMERIC_VALUE_OUT_OF_RANGE,
                        format!("value \"{shard}\" is out of range for type integer"),
                    )
                })
        })
        .collect()
}

/// `string_agg(objid::text, ',' ORDER BY objid)`: `NULL` for no shard.
fn shard_list(shards: &[u32]) -> Option<String> {
    (!shards.is_empty()).then(|| {
        shards
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(",")
    })
}
