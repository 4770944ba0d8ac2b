//! What the statements of the lease mechanism do (`plexsphere_leader::sql::lease`, recognised
//! by `lease`): the answers PostgreSQL gives them, over the committed lease and fence tables.
//!
//! `now()` is the server's clock (`CLOCK_BASE` plus the simulated time) at the start of the
//! statement's transaction: its arrival, and for a claim resumed after a wait, the moment it
//! first ran. A claim takes the lease row when it is missing, expired (`expires_at <= now()`)
//! or its own holder's, and then advances the fence row in the same statement: when another
//! session share-locks that row (a fenced transaction's `FOR SHARE`), the claim waits as an
//! epoch advance does, under its `SET LOCAL lock_timeout` (55P03), and writes nothing before
//! the wait ends; resumed, it reads the lease row again. Not modelled: the row lock the
//! waiting claim holds on the lease row in PostgreSQL (there a renewal or another claim of the
//! row waits for the claim's end; here it is answered at once against the committed row, as if
//! it had come first). A renewal extends its holder's row to `now() + ttl`, expired or not; a
//! release sets an unexpired row of its holder to `now()`. Every change is logged. A claim's
//! transaction lock (`pg_advisory_xact_lock` of the key, before the claim proper) is the
//! general parser's; the claim's check that no other schema holds the key always passes, since
//! the simulated server has one schema, and its answer is PostgreSQL's: the epoch (`NULL` when
//! refused) and `NULL` for the other schemas.

use std::time::Duration;

use super::eval::Value;
use super::{Ctx, Stop, no_table, server_micros};
use crate::lease::LeaseStatement;
use crate::log::Event;
use crate::reply::PgType;
use crate::rows::RowId;
use crate::storage::{FENCE_TABLE, LeaseRow};

/// The lease table's name.
pub(crate) const LEASE_TABLE: &str = plexsphere_leader::sql::lease::LEASE_TABLE;

const RETURNING_ONE: [(&str, PgType); 1] = [("?column?", PgType::Int4)];
/// The claim's one row: the new epoch (`NULL`: refused), and the other schemas that hold the
/// key (always `NULL`: the simulated server has one schema).
const CLAIM_COLUMNS: [(&str, PgType); 2] = [("epoch", PgType::Int8), ("schemas", PgType::Text)];
const WHO_HOLDS_COLUMNS: [(&str, PgType); 4] = [
    ("holder", PgType::Text),
    ("epoch", PgType::Int8),
    ("date_part", PgType::Float8),
    ("?column?", PgType::Bool),
];

/// The result columns of `statement`, as a Describe reports them.
pub(super) fn columns(statement: &LeaseStatement) -> &'static [(&'static str, PgType)] {
    match statement {
        LeaseStatement::Claim { .. } => &CLAIM_COLUMNS,
        LeaseStatement::Renew { .. } | LeaseStatement::Release { .. } => &RETURNING_ONE,
        LeaseStatement::WhoHolds { .. } => &WHO_HOLDS_COLUMNS,
    }
}

impl Ctx<'_> {
    pub(super) fn lease(&mut self, statement: &LeaseStatement) -> Result<(), Stop> {
        let database = self.database()?;
        let row = |table: &str| RowId {
            database: database.clone(),
            table: table.to_owned(),
            key: statement.key(),
        };
        let (lease, fence) = (row(LEASE_TABLE), row(FENCE_TABLE));
        match statement {
            LeaseStatement::Claim { holder, ttl_ms, .. } => {
                self.claim(lease, fence, holder, ms(*ttl_ms))
            }
            LeaseStatement::Renew { holder, ttl_ms, .. } => self.renew(lease, holder, ms(*ttl_ms)),
            LeaseStatement::Release { holder, .. } => self.release_lease(lease, holder),
            LeaseStatement::WhoHolds { .. } => self.who_holds(&lease, &fence),
        }
    }

    /// `now()` on the simulated clock: the start of the statement.
    pub(super) fn statement_start(&self) -> Duration {
        self.blocked_since.unwrap_or(self.at)
    }

    /// Fails with 42P01 unless both tables exist (the lease table first, as PostgreSQL
    /// resolves the statement's relations in order).
    fn lease_tables(&self, lease: &RowId, fence: Option<&RowId>) -> Result<(), Stop> {
        let storage = self.storage();
        if storage.lease(&lease.database, &lease.table).is_none() {
            return Err(no_table(&lease.table).into());
        }
        match fence {
            Some(fence) if storage.fence(&fence.database, &fence.table).is_none() => {
                Err(no_table(&fence.table).into())
            }
            _ => Ok(()),
        }
    }

    /// The committed lease row `row`, if any.
    fn lease_row(&self, row: &RowId) -> Option<LeaseRow> {
        self.storage()
            .lease(&row.database, &row.table)?
            .get(&row.key)
            .cloned()
    }

    /// Writes lease row `row`.
    fn write_lease(&mut self, row: &RowId, holder: &str, expires: Duration) {
        let mut storage = self.state.storage.borrow_mut();
        if let Some(rows) = storage.lease_mut(&row.database, &row.table) {
            let expires_at = server_micros(expires);
            let holder = holder.to_owned();
            rows.insert(row.key, LeaseRow { holder, expires_at });
        }
    }

    /// The claim: the lease row if it is free, expired or `holder`'s, then the fence row's
    /// advance (waiting, with nothing written yet, while another session share-locks it).
    fn claim(
        &mut self,
        lease: RowId,
        fence: RowId,
        holder: &str,
        ttl: Duration,
    ) -> Result<(), Stop> {
        self.lease_tables(&lease, Some(&fence))?;
        self.read_only("INSERT")?;
        let now = self.statement_start();
        let takes = self
            .lease_row(&lease)
            .is_none_or(|row| row.expires_at <= server_micros(now) || row.holder == holder);
        if !takes {
            self.send_result(&CLAIM_COLUMNS, &[[None, None]], "SELECT");
            return Ok(());
        }
        if self.committed_epoch(&fence).is_some() && !self.state.update_or_wait(self.pid, &fence) {
            return Err(Stop::Blocked);
        }
        let expires = now + ttl;
        self.write_lease(&lease, holder, expires);
        let event = Event::LeaseClaimed {
            pid: self.pid,
            row: lease,
            holder: holder.to_owned(),
            expires,
        };
        self.state.record(self.at, event);
        let epoch = self.write_epoch(fence, 1)?;
        self.send_result(&CLAIM_COLUMNS, &[[Some(epoch.to_string()), None]], "SELECT");
        Ok(())
    }

    /// The renewal: `holder`'s unexpired row now expires `ttl` from now.
    fn renew(&mut self, lease: RowId, holder: &str, ttl: Duration) -> Result<(), Stop> {
        let expires = self.statement_start() + ttl;
        self.update_lease(lease, holder, expires, |pid, row, holder| {
            Event::LeaseRenewed {
                pid,
                row,
                holder,
                expires,
            }
        })
    }

    /// The release: `holder`'s unexpired row now expires now.
    fn release_lease(&mut self, lease: RowId, holder: &str) -> Result<(), Stop> {
        let now = self.statement_start();
        self.update_lease(lease, holder, now, |pid, row, holder| {
            Event::LeaseReleased { pid, row, holder }
        })
    }

    /// `UPDATE … RETURNING 1` of `holder`'s unexpired row to expire at `expires`, logged as
    /// `event` (of the pid, the row and the holder) when the row matched.
    fn update_lease(
        &mut self,
        lease: RowId,
        holder: &str,
        expires: Duration,
        event: impl FnOnce(i32, RowId, String) -> Event,
    ) -> Result<(), Stop> {
        self.lease_tables(&lease, None)?;
        self.read_only("UPDATE")?;
        let now = server_micros(self.statement_start());
        let matched = self
            .lease_row(&lease)
            .is_some_and(|row| row.holder == holder && row.expires_at > now);
        if matched {
            self.write_lease(&lease, holder, expires);
            let event = event(self.pid, lease, holder.to_owned());
            self.state.record(self.at, event);
        }
        let row = matched.then(|| [Some("1".to_owned())]);
        self.send_result(&RETURNING_ONE, row.as_slice(), "UPDATE");
        Ok(())
    }

    /// The lease row with its fence epoch (NULL without a fence row), its expiry as unix
    /// seconds, and whether it is unexpired; no row when the key was never claimed.
    fn who_holds(&mut self, lease: &RowId, fence: &RowId) -> Result<(), Stop> {
        self.lease_tables(lease, Some(fence))?;
        let now = server_micros(self.statement_start());
        let row = self.lease_row(lease);
        let epoch = self.committed_epoch(fence);
        let texts = row.map(|row| {
            [
                Some(row.holder),
                epoch.map(|epoch| epoch.to_string()),
                Value::Float(row.expires_at as f64 / 1e6).text(),
                Value::Bool(row.expires_at > now).text(),
            ]
        });
        self.send_result(&WHO_HOLDS_COLUMNS, texts.as_slice(), "SELECT");
        Ok(())
    }
}

fn ms(ms: u32) -> Duration {
    Duration::from_millis(u64::from(ms))
}
