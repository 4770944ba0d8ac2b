//! What the statements of a lease shard space do (`plexsphere_leader::shard_sql::lease`,
//! recognised by `shard_lease`): the answers PostgreSQL gives them, over the committed members'
//! and owners' tables, the members' sequence and the fence table.
//!
//! `now()` is the server's clock at the statement's start, as for the single lease. Each
//! statement runs whole in the instant it executes, one session after the other, which is what
//! PostgreSQL's row locks make of the race between a renewal and a take's reap (the module doc
//! of `shard_sql::lease`): a renewal that runs first extends a row the reap then finds live; a
//! reap that runs first deletes the row, and a renewal after it, whenever its client sent it,
//! finds no row and renews nothing (`0`). Takes of a space run one at a time under their
//! transaction lock (`pg_advisory_xact_lock(take_lock)`, the general parser's, waited for as
//! any). A take that would advance a fence row another session share-locks waits, having
//! written nothing, under its `SET LOCAL lock_timeout`, and resumed reads everything again
//! with its first `now()`. Every write is committed at once into the storage that survives a
//! crash and follows a failover (the statements' `synchronous_commit = on`), and is logged.

use std::time::Duration;

use plexsphere_leader::shard_sql::lease::{MEMBER_SEQUENCE, MEMBER_TABLE, OWNER_TABLE};

use super::{Ctx, Stop, no_table, server_micros};
use crate::config::ShardLeaseFlaw;
use crate::log::Event;
use crate::reply::{PgType, SqlError, sqlstate};
use crate::rows::RowId;
use crate::shard_lease::ShardLeaseStatement;
use crate::storage::{FENCE_TABLE, LeaseRow, TableKind};

const REGISTER_COLUMNS: [(&str, PgType); 2] = [("member", PgType::Int4), ("count", PgType::Int8)];
/// The renewal's and the take's row: a count and a list.
const COUNT_AND_LIST: [(&str, PgType); 2] = [("count", PgType::Int8), ("string_agg", PgType::Text)];
const SURVEY_COLUMNS: [(&str, PgType); 3] = [
    ("member", PgType::Int4),
    ("holder", PgType::Text),
    ("string_agg", PgType::Text),
];
const SHARD_COLUMN: [(&str, PgType); 1] = [("shard", PgType::Int4)];
const RETURNING_ONE: [(&str, PgType); 1] = [("?column?", PgType::Int4)];

/// The result columns of `statement` (its last result), as a Describe reports them.
pub(super) fn columns(statement: &ShardLeaseStatement) -> &'static [(&'static str, PgType)] {
    match statement {
        ShardLeaseStatement::Register { .. } => &REGISTER_COLUMNS,
        ShardLeaseStatement::Renew { .. } | ShardLeaseStatement::Take { .. } => &COUNT_AND_LIST,
        ShardLeaseStatement::Survey { .. } => &SURVEY_COLUMNS,
        ShardLeaseStatement::Release { .. } => &SHARD_COLUMN,
        ShardLeaseStatement::Leave { .. } => &RETURNING_ONE,
    }
}

/// `numbers` as `string_agg(…, ',')` writes them; `NULL` for none.
fn joined<T: ToString>(numbers: impl IntoIterator<Item = T>) -> Option<String> {
    let texts: Vec<String> = numbers.into_iter().map(|n| n.to_string()).collect();
    (!texts.is_empty()).then(|| texts.join(","))
}

impl Ctx<'_> {
    pub(super) fn shard_lease(&mut self, statement: &ShardLeaseStatement) -> Result<(), Stop> {
        let database = self.database()?;
        self.shard_tables(&database)?;
        match statement {
            ShardLeaseStatement::Register {
                class,
                holder,
                ttl_ms,
            } => self.register_member(&database, *class, holder, ms(*ttl_ms)),
            ShardLeaseStatement::Renew {
                class,
                member,
                holder,
                ttl_ms,
            } => self.renew_member(&database, *class, *member, holder, ms(*ttl_ms)),
            ShardLeaseStatement::Survey { class, count } => {
                self.survey_members(&database, *class, *count);
                Ok(())
            }
            ShardLeaseStatement::Take {
                class,
                member,
                shards,
                ..
            } => self.take_shards(&database, *class, *member, shards),
            ShardLeaseStatement::Release {
                class,
                member,
                shards,
            } => self.release_shards(&database, (*class, *member), Some(shards)),
            ShardLeaseStatement::Leave { class, member } => {
                self.release_shards(&database, (*class, *member), None)
            }
        }
    }

    /// Fails with 42P01 unless the members' and owners' tables exist.
    fn shard_tables(&self, database: &str) -> Result<(), SqlError> {
        let storage = self.storage();
        if storage
            .leases(database, MEMBER_TABLE, TableKind::Members)
            .is_none()
        {
            return Err(no_table(MEMBER_TABLE));
        }
        if storage.owners(database, OWNER_TABLE).is_none() {
            return Err(no_table(OWNER_TABLE));
        }
        Ok(())
    }

    /// The live members of `class` (unexpired at `now()`), ascending.
    fn live_members(&self, database: &str, class: i32) -> Vec<(i32, LeaseRow)> {
        let now = server_micros(self.statement_start());
        let storage = self.storage();
        let Some(rows) = storage.leases(database, MEMBER_TABLE, TableKind::Members) else {
            return Vec::new();
        };
        rows.range((class, i32::MIN)..=(class, i32::MAX))
            .filter(|(_, row)| row.expires_at > now)
            .map(|(&(_, member), row)| (member, row.clone()))
            .collect()
    }

    /// Writes member row `(class, member)` (a new one when `joined`), live until `expires`.
    fn write_member(
        &mut self,
        database: &str,
        (class, member): (i32, i32),
        holder: &str,
        expires: Duration,
        joined: bool,
    ) {
        if let Some(rows) =
            self.state
                .storage
                .borrow_mut()
                .leases_mut(database, MEMBER_TABLE, TableKind::Members)
        {
            let (holder, expires_at) = (holder.to_owned(), server_micros(expires));
            rows.insert((class, member), LeaseRow { holder, expires_at });
        }
        let event = Event::MemberLive {
            pid: self.pid,
            class,
            member,
            holder: holder.to_owned(),
            expires,
            joined,
        };
        self.state.record(self.at, event);
    }

    /// The registration: the sequence's next id, a row live for `ttl`; one row, the id and
    /// the other live members (the `RETURNING` subquery sees the table before the insert).
    fn register_member(
        &mut self,
        database: &str,
        class: i32,
        holder: &str,
        ttl: Duration,
    ) -> Result<(), Stop> {
        self.read_only("INSERT")?;
        let others = self.live_members(database, class).len();
        let member = self
            .state
            .storage
            .borrow_mut()
            .next_value(database, MEMBER_SEQUENCE)
            .ok_or_else(|| no_table(MEMBER_SEQUENCE))?;
        let taken = self
            .storage()
            .leases(database, MEMBER_TABLE, TableKind::Members)
            .is_some_and(|rows| rows.contains_key(&(class, member)));
        if taken {
            return Err(SqlError::error(
                sqlstate::UNIQUE_VIOLATION,
                format!("duplicate key value violates unique constraint \"{MEMBER_TABLE}_pkey\""),
            )
            .into());
        }
        let expires = self.statement_start() + ttl;
        self.write_member(database, (class, member), holder, expires, true);
        let row = [Some(member.to_string()), Some(others.to_string())];
        self.send_result(&REGISTER_COLUMNS, &[row], "INSERT");
        Ok(())
    }

    /// The renewal: `member`'s row, when it is `holder`'s and unexpired, lives `ttl` from now;
    /// one row, whether it renewed and the live members (as the statement's snapshot saw them,
    /// before the renewal: the renewed member was live then).
    fn renew_member(
        &mut self,
        database: &str,
        class: i32,
        member: i32,
        holder: &str,
        ttl: Duration,
    ) -> Result<(), Stop> {
        self.read_only("UPDATE")?;
        let live = self.live_members(database, class);
        let renewed = live
            .iter()
            .any(|(id, row)| *id == member && row.holder == holder);
        if renewed {
            let expires = self.statement_start() + ttl;
            self.write_member(database, (class, member), holder, expires, false);
        }
        let row = [
            Some(u8::from(renewed).to_string()),
            joined(live.iter().map(|(id, _)| *id)),
        ];
        self.send_result(&COUNT_AND_LIST, &[row], "SELECT");
        Ok(())
    }

    /// The survey: a row per live member, ascending, with its holder and its shards below
    /// `count`.
    fn survey_members(&mut self, database: &str, class: i32, count: u32) {
        let live = self.live_members(database, class);
        let owners = self.owned(database, class);
        let rows: Vec<[Option<String>; 3]> = live
            .into_iter()
            .map(|(member, row)| {
                let shards = owners
                    .iter()
                    .filter(|(shard, owner)| *owner == member && *shard < count)
                    .map(|(shard, _)| *shard);
                [Some(member.to_string()), Some(row.holder), joined(shards)]
            })
            .collect();
        self.send_result(&SURVEY_COLUMNS, &rows, "SELECT");
    }

    /// Every owned shard row of `class`: (shard, member), ascending by shard.
    fn owned(&self, database: &str, class: i32) -> Vec<(u32, i32)> {
        let storage = self.storage();
        let Some(rows) = storage.owners(database, OWNER_TABLE) else {
            return Vec::new();
        };
        rows.range((class, i32::MIN)..=(class, i32::MAX))
            .filter_map(|(&(_, shard), member)| Some((u32::try_from(shard).ok()?, (*member)?)))
            .collect()
    }

    /// Sets the owner of shard row `(class, shard)` to `member` (`None`: frees it), logging
    /// the change made by a session of the space's member `by`.
    fn set_owner(&mut self, database: &str, class: i32, shard: u32, member: Option<i32>, by: i32) {
        let key = (class, shard.cast_signed());
        if let Some(rows) = self
            .state
            .storage
            .borrow_mut()
            .owners_mut(database, OWNER_TABLE)
        {
            rows.insert(key, member);
        }
        let pid = self.pid;
        let event = match member {
            Some(member) => Event::ShardOwned {
                pid,
                class,
                member,
                shard,
            },
            None => Event::ShardFreed {
                pid,
                class,
                member: by,
                shard,
            },
        };
        self.state.record(self.at, event);
    }

    /// Deletes member row `(class, member)` and logs it.
    fn delete_member(&mut self, database: &str, class: i32, member: i32, reaped: bool) -> bool {
        let deleted = self
            .state
            .storage
            .borrow_mut()
            .leases_mut(database, MEMBER_TABLE, TableKind::Members)
            .and_then(|rows| rows.remove(&(class, member)))
            .is_some();
        if deleted {
            let event = Event::MemberGone {
                pid: self.pid,
                class,
                member,
                reaped,
            };
            self.state.record(self.at, event);
        }
        deleted
    }

    /// The take (after its transaction lock): reaps the members expired by `now()` and frees
    /// their shards, then, when `member` is live, owns each asked shard whose row is missing
    /// or free and advances its fence row. It waits, with nothing written, while another
    /// session share-locks one of those fence rows. Two results: the reap's `UPDATE n`, and
    /// the row of whether `member` was live and the `shard:epoch` pairs taken.
    fn take_shards(
        &mut self,
        database: &str,
        class: i32,
        member: i32,
        shards: &[u32],
    ) -> Result<(), Stop> {
        self.read_only("UPDATE")?;
        if self.storage().fence(database, FENCE_TABLE).is_none() {
            return Err(no_table(FENCE_TABLE).into());
        }
        let now = server_micros(self.statement_start());
        let flaw = self.state.config.shard_lease_flaw;
        let expired: Vec<i32> = self
            .storage()
            .leases(database, MEMBER_TABLE, TableKind::Members)
            .into_iter()
            .flat_map(|rows| rows.range((class, i32::MIN)..=(class, i32::MAX)))
            .filter(|(_, row)| row.expires_at <= now && flaw != Some(ShardLeaseFlaw::NoReap))
            .map(|(&(_, id), _)| id)
            .collect();
        let owned = self.owned(database, class);
        let freed: Vec<(u32, i32)> = owned
            .iter()
            .copied()
            .filter(|(_, owner)| expired.contains(owner))
            .collect();
        let live = !expired.contains(&member)
            && self
                .live_members(database, class)
                .iter()
                .any(|(id, _)| *id == member);
        let taken: Vec<u32> = if live {
            let held = |shard: u32| {
                owned.iter().any(|&(s, owner)| {
                    s == shard
                        && !expired.contains(&owner)
                        && flaw != Some(ShardLeaseFlaw::TakesLiveShards)
                })
            };
            shards.iter().copied().filter(|&s| !held(s)).collect()
        } else {
            Vec::new()
        };
        let fence_row = |shard: u32| RowId {
            database: database.to_owned(),
            table: FENCE_TABLE.to_owned(),
            key: (class, shard.cast_signed()),
        };
        for &shard in &taken {
            let row = fence_row(shard);
            if self.committed_epoch(&row).is_some() && !self.state.update_or_wait(self.pid, &row) {
                return Err(Stop::Blocked);
            }
        }
        for &gone in &expired {
            self.delete_member(database, class, gone, true);
        }
        for &(shard, owner) in &freed {
            self.set_owner(database, class, shard, None, owner);
        }
        self.reply
            .command_complete(&format!("UPDATE {}", freed.len()));
        let mut epochs = Vec::with_capacity(taken.len());
        for shard in taken {
            self.set_owner(database, class, shard, Some(member), member);
            let epoch = match flaw {
                Some(ShardLeaseFlaw::KeepsEpochs) => {
                    self.committed_epoch(&fence_row(shard)).unwrap_or(1)
                }
                _ => self.write_epoch(fence_row(shard), 1)?,
            };
            epochs.push(format!("{shard}:{epoch}"));
        }
        let row = [Some(u8::from(live).to_string()), joined(epochs)];
        self.send_result(&COUNT_AND_LIST, &[row], "SELECT");
        Ok(())
    }

    /// The release (`shards`: frees each that is still `member`'s, a row per shard freed,
    /// ascending), or the leave (`None`: frees every shard of `member`, `UPDATE n`, and
    /// deletes its row, `1`, none when it was reaped already, expired or not).
    fn release_shards(
        &mut self,
        database: &str,
        (class, member): (i32, i32),
        shards: Option<&[u32]>,
    ) -> Result<(), Stop> {
        self.read_only("UPDATE")?;
        let freed: Vec<u32> = self
            .owned(database, class)
            .into_iter()
            .filter(|(shard, owner)| *owner == member && shards.is_none_or(|s| s.contains(shard)))
            .map(|(shard, _)| shard)
            .collect();
        for &shard in &freed {
            self.set_owner(database, class, shard, None, member);
        }
        if shards.is_some() {
            let rows: Vec<[Option<String>; 1]> = freed
                .iter()
                .map(|shard| [Some(shard.to_string())])
                .collect();
            self.send_result(&SHARD_COLUMN, &rows, "UPDATE");
            return Ok(());
        }
        self.reply
            .command_complete(&format!("UPDATE {}", freed.len()));
        let deleted = self.delete_member(database, class, member, false);
        let row = deleted.then(|| [Some("1".to_owned())]);
        self.send_result(&RETURNING_ONE, row.as_slice(), "DELETE");
        Ok(())
    }
}

fn ms(ms: u32) -> Duration {
    Duration::from_millis(u64::from(ms))
}
