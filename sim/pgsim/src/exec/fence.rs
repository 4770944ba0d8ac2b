//! The fence table: the epoch advance (waiting for other sessions' `FOR SHARE` row locks),
//! the fence read, and the fence check a transaction block's first `FOR SHARE` read makes.

use std::time::Duration;

use super::{Ctx, Stop, no_table};
use crate::log::Event;
use crate::reply::{PgType, SqlError, TransactionStatus, sqlstate};
use crate::rows::RowId;
use crate::state::FenceCheck;

impl Ctx<'_> {
    /// The committed epoch of a fence row, if the row exists.
    pub(super) fn committed_epoch(&self, row: &RowId) -> Option<i64> {
        self.storage()
            .fence(&row.database, &row.table)?
            .get(&row.key)
            .copied()
    }

    /// The epoch upsert. When the row exists and another session share-locks it, the
    /// statement waits ([`Stop::Blocked`]) and, resumed, reads the committed epoch again.
    pub(super) fn advance_epoch(
        &mut self,
        table: &str,
        key: (i64, i64),
        initial: i64,
    ) -> Result<(), Stop> {
        let database = self.database()?;
        if self.storage().fence(&database, table).is_none() {
            return Err(no_table(table).into());
        }
        self.read_only("INSERT")?;
        let key = int4_key(key)?;
        let row = RowId {
            database,
            table: table.to_owned(),
            key,
        };
        if self.committed_epoch(&row).is_some() && !self.state.update_or_wait(self.pid, &row) {
            return Err(Stop::Blocked);
        }
        let epoch = self.write_epoch(row, initial)?;
        self.send_result(&EPOCH_COLUMN, &[[Some(epoch.to_string())]], "INSERT");
        Ok(())
    }

    /// Commits the advance of fence row `row` (to `initial` when it is missing) and logs it
    /// with how long the statement waited for the row; the new epoch. The caller waited for
    /// other sessions' share locks.
    pub(super) fn write_epoch(&mut self, row: RowId, initial: i64) -> Result<i64, Stop> {
        let epoch = {
            let mut storage = self.state.storage.borrow_mut();
            let rows = storage
                .fence_mut(&row.database, &row.table)
                .ok_or_else(|| no_table(&row.table))?;
            let epoch = match rows.get(&row.key) {
                None => initial,
                Some(epoch) => epoch.checked_add(1).ok_or_else(|| {
                    SqlError::error(sqlstate::NUMERIC_VALUE_OUT_OF_RANGE, "bigint out of range")
                })?,
            };
            rows.insert(row.key, epoch);
            epoch
        };
        let waited = self
            .blocked_since
            .map_or(Duration::ZERO, |since| self.at.saturating_sub(since));
        let event = Event::EpochAdvanced {
            pid: self.pid,
            row,
            epoch,
            waited,
        };
        self.state.record(self.at, event);
        Ok(epoch)
    }

    /// The fence read. `FOR SHARE` share-locks the row it returns until the transaction ends
    /// (see `rows`); in a transaction block the first such read is the block's fence check,
    /// logged ([`Event::FenceChecked`]) and logged again if the block commits.
    pub(super) fn select_epoch(
        &mut self,
        table: &str,
        key: (i64, i64),
        for_share: bool,
    ) -> Result<(), SqlError> {
        let database = self.database()?;
        let epoch = {
            let storage = self.storage();
            let rows = storage
                .fence(&database, table)
                .ok_or_else(|| no_table(table))?;
            int4_key(key).ok().and_then(|key| rows.get(&key).copied())
        };
        if for_share {
            self.read_only("SELECT FOR SHARE")?;
            if let (Some(epoch), Ok(key)) = (epoch, int4_key(key)) {
                let row = RowId {
                    database,
                    table: table.to_owned(),
                    key,
                };
                self.lock_for_share(row, epoch);
            }
        }
        let row = epoch.map(|epoch| [Some(epoch.to_string())]);
        self.send_result(&EPOCH_COLUMN, row.as_slice(), "SELECT");
        Ok(())
    }

    /// Share-locks `row`, read at `epoch`; in a block, the first one is the fence check.
    fn lock_for_share(&mut self, row: RowId, epoch: i64) {
        self.state.share_row(self.pid, row.clone());
        let Some(session) = self.state.sessions.get_mut(&self.pid) else {
            return;
        };
        if session.transaction != TransactionStatus::InBlock || session.fence_check.is_some() {
            return;
        }
        session.fence_check = Some(FenceCheck {
            row: row.clone(),
            epoch,
            at: self.at,
        });
        let event = Event::FenceChecked {
            pid: self.pid,
            row,
            epoch,
        };
        self.state.record(self.at, event);
    }
}

/// The one column the fence statements return.
pub(super) const EPOCH_COLUMN: [(&str, PgType); 1] = [("epoch", PgType::Int8)];

/// An `int4` key pair of the fence table; 22003 when a value does not fit.
fn int4_key((classid, objid): (i64, i64)) -> Result<(i32, i32), SqlError> {
    match (i32::try_from(classid), i32::try_from(objid)) {
        (Ok(classid), Ok(objid)) => Ok((classid, objid)),
        _ => Err(SqlError::error(
            sqlstate::NUMERIC_VALUE_OUT_OF_RANGE,
            "integer out of range",
        )),
    }
}
