//! A shard space held by leases ([`ShardConfig::lease`](super::ShardConfig::lease)): each of
//! the member's statements ([`shard_sql::lease`]) on a connection borrowed from the source for
//! it alone and given back as it answers, its rows read into the core's events.

use std::collections::BTreeMap;
use std::sync::Arc;

use plexsphere_leader_core::ConnId;
use plexsphere_leader_core::rank::FloorStep;
use plexsphere_leader_core::shards::{MemberId, Shard, ShardEvent};

use super::statement::{Completion, Operation, failed, surveyed, unexpected};
use crate::clock::now;
use crate::connection::pooled_rows;
use crate::error::CheckError;
use crate::session::{Row, SessionSource};
use crate::shard_sql::ShardSqlError;
use crate::shard_sql::lease;

/// How a lease space's statements are named: its schema, this run's holder and, once
/// registered, the member it is.
pub(super) struct LeaseMember {
    pub(super) schema: String,
    pub(super) holder: String,
    pub(super) member: Option<MemberId>,
}

/// Runs `sql` on a pooled connection and reads its rows with `read` into the event to
/// report; a failed borrow or statement, or unreadable rows, is a failed statement (the
/// member goes on).
fn statement<R>(
    sessions: Arc<dyn SessionSource>,
    conn: ConnId,
    sql: String,
    name: &'static str,
    read: R,
) -> Operation
where
    R: FnOnce(&[Row]) -> Result<ShardEvent<CheckError>, ShardSqlError> + Send + 'static,
{
    Box::pin(async move {
        let rows = pooled_rows(&*sessions, &sql).await;
        Completion::of(match rows {
            Ok(rows) => {
                read(&rows).unwrap_or_else(|error| failed(conn, unexpected(name, &error), false))
            }
            Err(cause) => failed(conn, cause, false),
        })
    })
}

/// The member's statements for space `class` of `count` shards.
pub(super) struct Statements<'a> {
    pub(super) sessions: Arc<dyn SessionSource>,
    pub(super) class: i32,
    pub(super) count: u32,
    pub(super) naming: &'a LeaseMember,
}

impl Statements<'_> {
    fn member(&self) -> MemberId {
        // Every statement but the registration follows a registration's answer.
        self.naming.member.unwrap_or(MemberId::new(0))
    }

    pub(super) fn register(&self, conn: ConnId, ttl_ms: u32, floor: FloorStep) -> Operation {
        let sql = lease::register(
            &self.naming.schema,
            self.class,
            &self.naming.holder,
            ttl_ms,
            floor,
        );
        statement(
            self.sessions.clone(),
            conn,
            sql,
            "lease register",
            move |rows| {
                let registered = lease::parse_registered(rows)?;
                Ok(ShardEvent::Registered {
                    conn,
                    backend: registered.member,
                    granted: true,
                    lock_capacity: u64::MAX,
                    members: registered.others.saturating_add(1),
                })
            },
        )
    }

    pub(super) fn renew(&self, conn: ConnId, ttl_ms: u32) -> Operation {
        let sql = lease::renew(
            &self.naming.schema,
            self.class,
            self.member(),
            &self.naming.holder,
            ttl_ms,
        );
        statement(
            self.sessions.clone(),
            conn,
            sql,
            "lease renew",
            move |rows| {
                let renewed = lease::parse_renewed(rows)?;
                Ok(ShardEvent::Renewed {
                    conn,
                    renewed: renewed.renewed,
                    members: renewed.members,
                })
            },
        )
    }

    pub(super) fn take(&self, conn: ConnId, shards: &[Shard], lock_timeout_ms: u32) -> Operation {
        let sql = lease::take(
            &self.naming.schema,
            self.class,
            self.member(),
            shards,
            lock_timeout_ms,
        );
        statement(
            self.sessions.clone(),
            conn,
            sql,
            "lease take",
            move |rows| {
                let taken = lease::parse_taken(rows)?;
                Ok(ShardEvent::TookLeases {
                    conn,
                    live: taken.live,
                    taken: taken.shards,
                })
            },
        )
    }

    pub(super) fn release(&self, conn: ConnId, shards: Vec<Shard>) -> Operation {
        let sql = lease::release(&self.naming.schema, self.class, self.member(), &shards);
        statement(
            self.sessions.clone(),
            conn,
            sql,
            "lease release",
            move |rows| {
                let released = lease::parse_released(rows)?;
                let not_held = shards
                    .into_iter()
                    .filter(|shard| !released.contains(shard))
                    .collect();
                Ok(ShardEvent::Unlocked { conn, not_held })
            },
        )
    }

    pub(super) fn leave(&self, conn: ConnId) -> Operation {
        let sql = lease::leave(&self.naming.schema, self.class, self.member());
        statement(self.sessions.clone(), conn, sql, "lease leave", move |_| {
            Ok(ShardEvent::UnlockedAll { conn })
        })
    }

    /// The survey, with the view it shows and how long it took.
    pub(super) fn survey(&self, conn: ConnId, floor: FloorStep) -> Operation {
        let sql = lease::survey(&self.naming.schema, self.class, self.count, floor);
        let (sessions, count, me) = (self.sessions.clone(), self.count, self.member());
        let reads_floor = floor != FloorStep::Off;
        Box::pin(async move {
            let started = now();
            let rows = pooled_rows(&*sessions, &sql).await;
            let took = now().saturating_duration_since(started);
            let read = |rows: &[Row]| {
                let members = lease::parse_survey(rows)?;
                let survey = lease::to_survey(count, me, &members)?;
                let floor = if reads_floor {
                    lease::parse_floor(rows)?
                } else {
                    None
                };
                let names: BTreeMap<MemberId, String> = members
                    .into_iter()
                    .map(|row| (row.member, row.holder))
                    .collect();
                Ok::<_, ShardSqlError>((survey, names, floor))
            };
            match rows.map(|rows| read(&rows)) {
                Ok(Ok((survey, names, floor))) => surveyed(conn, survey, &names, floor, took),
                Ok(Err(error)) => {
                    Completion::of(failed(conn, unexpected("lease survey", &error), false))
                }
                Err(cause) => Completion::of(failed(conn, cause, false)),
            }
        })
    }
}
