//! The control and observation handle of one server instance.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use super::locks::{HeldLock, LockId, LockKey};
use super::log::{LogEntry, LogViolation, check_mutual_exclusion};
use super::rows::RowId;
use super::state::{Control, QueryRecord, Shared};
use super::storage::FENCE_TABLE;

pub use super::reply::TransactionStatus;

/// A snapshot of one live session, as `pg_stat_activity` and `pg_locks` would show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionInfo {
    /// Backend pid.
    pub pid: i32,
    /// The session's database.
    pub database: String,
    /// The session's user.
    pub user: String,
    /// Current `application_name`.
    pub application_name: String,
    /// When the session completed its startup (simulated time since the simulation start).
    pub started_at: Duration,
    /// When the session's last simple Query arrived, if any.
    pub last_query_at: Option<Duration>,
    /// Current `idle_session_timeout`; zero means disabled.
    pub idle_session_timeout: Duration,
    /// Transaction state.
    pub transaction: TransactionStatus,
    /// Advisory locks the session holds, with their re-entrancy counts, in key order.
    pub locks: Vec<(LockKey, u64)>,
}

/// Controls and observes one [`SimPostgres`](super::SimPostgres) instance from the test or
/// from any simulated host. Cheap to clone; all clones share the instance.
///
/// Controls (`terminate_backend`, `crash`, `restart`) are requests: the server host
/// carries them out the next time it runs (within the next `Sim::step`), stamped with
/// the server's simulated time, as a signal to a real server would be. Observations
/// (`sessions`, `locks`, `log`) read the current state immediately. The handle, the log,
/// the pid counter and the latency setting survive crashes and host restarts.
#[derive(Debug, Clone)]
pub struct ServerHandle {
    pub(crate) shared: Shared,
}

impl ServerHandle {
    /// Asks the backend `pid` to terminate, like `pg_terminate_backend`: the session
    /// sends FATAL 57P01 "terminating connection due to administrator command", releases
    /// its locks and closes the socket (a query in progress fails with that error).
    /// Returns false when no live session has that pid.
    pub fn terminate_backend(&self, pid: i32) -> bool {
        self.shared.borrow_mut().request_terminate(pid)
    }

    /// Crashes the server: every session is dropped without a message (peers see the
    /// socket close), the lock table is lost, and the server accepts no connection
    /// (connects are refused) until [`restart`](Self::restart).
    pub fn crash(&self) {
        self.control(Control::Crash);
    }

    /// Restarts a crashed server: it accepts connections again, with an empty lock table
    /// and new pids. A no-op when the server runs.
    pub fn restart(&self) {
        self.control(Control::Restart);
    }

    fn control(&self, control: Control) {
        let mut state = self.shared.borrow_mut();
        state.controls.push_back(control);
        state.server_wake.notify_one();
    }

    /// Promotes a hot standby: `pg_is_in_recovery()` is false from now on and writes
    /// succeed. A no-op on a primary.
    pub fn promote(&self) {
        self.shared.borrow_mut().in_recovery = false;
    }

    /// Puts the instance into recovery (a hot standby, as after `pg_rewind` and a restart
    /// with `standby.signal`); sessions see it at their next statement.
    pub fn demote_to_standby(&self) {
        self.shared.borrow_mut().in_recovery = true;
    }

    /// Whether the instance is in recovery (`pg_is_in_recovery()`).
    pub fn is_in_recovery(&self) -> bool {
        self.shared.borrow().in_recovery
    }

    /// Makes `standby` a synchronous replica of this instance: from now on both hold the
    /// same committed tables (this instance's; `standby`'s own are dropped), so a failover
    /// to `standby` keeps every committed fencing epoch, across crashes and restarts of
    /// either. Sessions and advisory locks are not replicated (PostgreSQL does not
    /// WAL-log advisory locks), nor are row locks (`FOR SHARE`): a fenced transaction on one
    /// instance does not hold back an epoch advance on the other.
    ///
    /// Not modelled: a write on one instance while the other is cut off. A real
    /// synchronous primary would wait for its standby's acknowledgement; here the write
    /// commits and the other instance sees it at once. Call it once, when the instances
    /// are built.
    pub fn replicate_to(&self, standby: &ServerHandle) {
        let storage = Rc::clone(&self.shared.borrow().storage);
        standby.shared.borrow_mut().storage = storage;
    }

    /// Stops replicating: this instance keeps a copy of what is committed now, and what it
    /// commits from now on is its own. A primary deposed by a failover: its later commits are
    /// not on the promoted standby's timeline (they are rewound when it rejoins, see
    /// [`replicate_to`](Self::replicate_to)).
    pub fn detach_storage(&self) {
        let copy = self.shared.borrow().storage.borrow().clone();
        self.shared.borrow_mut().storage = Rc::new(RefCell::new(copy));
    }

    /// The committed fencing epoch of `(classid, objid)` in table `plexsphere_leader_fence`
    /// of `database`; `None` when the table or the row does not exist.
    pub fn fence_epoch(&self, database: &str, classid: i32, objid: i32) -> Option<i64> {
        let state = self.shared.borrow();
        let storage = state.storage.borrow();
        storage
            .fence(database, FENCE_TABLE)?
            .get(&(classid, objid))
            .copied()
    }

    /// The sessions waiting in `pg_advisory_lock`, as `(lock, pid)` in lock order and queue
    /// order per lock (the rows of `pg_locks` with `granted = false`).
    pub fn waiters(&self) -> Vec<(LockId, i32)> {
        self.shared.borrow().locks.waiters()
    }

    /// The share locks on fence rows (`SELECT … FOR SHARE`), as `(row, pid)` in row and pid
    /// order (the rows of `pg_locks` of locktype `tuple` and `transactionid` tell the same in
    /// PostgreSQL).
    pub fn row_locks(&self) -> Vec<(RowId, i32)> {
        self.shared.borrow().rows.shared()
    }

    /// The epoch advances waiting for other sessions' share locks on their row, as
    /// `(row, pid)` in row and queue order.
    pub fn row_waiters(&self) -> Vec<(RowId, i32)> {
        self.shared.borrow().rows.waiters()
    }

    /// Whether the server accepts connections (started and not crashed).
    pub fn is_running(&self) -> bool {
        self.shared.borrow().running
    }

    /// Sets the delay before each simple Query is executed, for queries that arrive from
    /// now on.
    pub fn set_query_latency(&self, latency: Duration) {
        self.shared.borrow_mut().config.query_latency = latency;
    }

    /// The live sessions, by pid.
    pub fn sessions(&self) -> Vec<SessionInfo> {
        let state = self.shared.borrow();
        state
            .sessions
            .iter()
            .map(|(&pid, s)| SessionInfo {
                pid,
                database: s.database.clone(),
                user: s.user.clone(),
                application_name: s.gucs.application_name.clone(),
                started_at: s.started_at,
                last_query_at: s.last_query_at,
                idle_session_timeout: s.gucs.idle_session_timeout,
                transaction: s.transaction,
                locks: state
                    .locks
                    .held_by(pid)
                    .into_iter()
                    .map(|(id, count)| (id.key, count))
                    .collect(),
            })
            .collect()
    }

    /// The live session with backend `pid`, if any.
    pub fn session(&self, pid: i32) -> Option<SessionInfo> {
        self.sessions().into_iter().find(|s| s.pid == pid)
    }

    /// Every granted advisory lock, in (database, key) order.
    pub fn locks(&self) -> Vec<HeldLock> {
        self.shared.borrow().locks.held()
    }

    /// The pid holding `key` in `database`, if any.
    pub fn holder(&self, database: &str, key: LockKey) -> Option<i32> {
        let id = LockId {
            database: database.to_owned(),
            key,
        };
        self.locks().into_iter().find(|l| l.id == id).map(|l| l.pid)
    }

    /// A copy of the ground-truth log, oldest first.
    pub fn log(&self) -> Vec<LogEntry> {
        self.shared.borrow().log.clone()
    }

    /// A copy of the statement log: every simple Query, when it arrived and when it was
    /// answered, oldest first. A session is idle (and its `idle_session_timeout` runs) from
    /// an answer to the arrival of its next query.
    pub fn queries(&self) -> Vec<QueryRecord> {
        self.shared.borrow().queries.clone()
    }

    /// Checks the ground-truth log with [`check_mutual_exclusion`].
    pub fn check_mutual_exclusion(&self) -> Result<(), LogViolation> {
        check_mutual_exclusion(&self.shared.borrow().log)
    }
}
