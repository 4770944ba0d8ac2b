//! Transactions: `BEGIN`, `COMMIT`, `ROLLBACK`, the end of an implicit transaction and what
//! an error does to the transaction it happens in (settings restored, row locks ended, a
//! committed fence check logged).

use super::Ctx;
use crate::guc::Gucs;
use crate::log::Event;
use crate::reply::{SqlError, TransactionStatus, sqlstate};

impl Ctx<'_> {
    /// Ends an implicit transaction that succeeded: transaction-local values revert and its
    /// row locks end.
    pub(super) fn commit_implicit(&mut self) {
        let Some(session) = self.state.sessions.get_mut(&self.pid) else {
            return;
        };
        if session.transaction != TransactionStatus::Idle {
            return;
        }
        if let Some(base) = session.local_base.take() {
            session.gucs = base;
        }
        self.state.end_row_locks(self.pid);
    }

    /// Sends `error`; an open block becomes failed (keeping its row locks until it ends), an
    /// implicit transaction is undone and its row locks end.
    pub(super) fn fail(&mut self, error: &SqlError, before: &Gucs) {
        self.reply.error(error);
        let Some(session) = self.state.sessions.get_mut(&self.pid) else {
            return;
        };
        match session.transaction {
            TransactionStatus::InBlock => session.transaction = TransactionStatus::Failed,
            TransactionStatus::Idle => {
                session.gucs = before.clone();
                session.local_base = None;
                self.state.end_row_locks(self.pid);
            }
            TransactionStatus::Failed => {}
        }
    }

    /// The session's transaction status (idle when the session is gone).
    pub(super) fn transaction(&self) -> TransactionStatus {
        self.state
            .sessions
            .get(&self.pid)
            .map_or(TransactionStatus::Idle, |s| s.transaction)
    }

    /// `BEGIN`: opens a block saving the settings; inside one, a WARNING.
    pub(super) fn begin(&mut self) {
        let Some(session) = self.state.sessions.get_mut(&self.pid) else {
            return;
        };
        if session.transaction == TransactionStatus::Idle {
            session.transaction = TransactionStatus::InBlock;
            session.saved_gucs = Some(session.gucs.clone());
        } else {
            self.notify(&SqlError::warning(
                sqlstate::ACTIVE_SQL_TRANSACTION,
                "there is already a transaction in progress",
            ));
        }
        self.reply.command_complete("BEGIN");
    }

    /// `COMMIT` (`commit` true) or `ROLLBACK`; a failed block's COMMIT rolls back. The
    /// block's row locks end; a committed block that checked a fence row is logged
    /// ([`Event::FencedCommit`]).
    pub(super) fn end_block(&mut self, commit: bool) {
        let Some(session) = self.state.sessions.get_mut(&self.pid) else {
            return;
        };
        let committed = commit && session.transaction == TransactionStatus::InBlock;
        let fence_check = session.fence_check.take();
        let tag = match session.transaction {
            TransactionStatus::Idle => {
                if session.gucs.sends_notice(true) {
                    self.reply.notice(&SqlError::warning(
                        sqlstate::NO_ACTIVE_SQL_TRANSACTION,
                        "there is no transaction in progress",
                    ));
                }
                if commit { "COMMIT" } else { "ROLLBACK" }
            }
            TransactionStatus::InBlock if commit => {
                session.saved_gucs = None;
                if let Some(base) = session.local_base.take() {
                    session.gucs = base;
                }
                "COMMIT"
            }
            TransactionStatus::InBlock | TransactionStatus::Failed => {
                if let Some(saved) = session.saved_gucs.take() {
                    session.gucs = saved;
                }
                session.local_base = None;
                "ROLLBACK"
            }
        };
        session.transaction = TransactionStatus::Idle;
        self.reply.command_complete(tag);
        if let Some(check) = fence_check.filter(|_| committed) {
            let current = self.committed_epoch(&check.row);
            let event = Event::FencedCommit {
                pid: self.pid,
                epoch: check.epoch,
                checked_at: check.at,
                current,
                row: check.row,
            };
            self.state.record(self.at, event);
        }
        self.state.end_row_locks(self.pid);
    }
}
