//! The state one server instance shares between its host software, its sessions and
//! its [`ServerHandle`](super::ServerHandle).
//!
//! turmoil runs every host on one thread, so the state is an `Rc<RefCell<State>>`. No
//! borrow is ever held across an `.await`. The state outlives the host software: the lock
//! table and sessions die with a crash; the log, the pid counter, the handle's settings,
//! the recovery flag and the committed tables ([`Storage`]) do not.

use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::rc::Rc;
use std::time::Duration;

use tokio::sync::Notify;

use super::config::ServerConfig;
use super::guc::Gucs;
use super::locks::{LockId, LockKey, LockMode, LockTable, TryLock, Unlock};
use super::log::{EndReason, Event, LogEntry, ReleaseReason};
use super::prepared::Prepared;
use super::reply::TransactionStatus;
use super::rows::{RowId, RowLocks};
use super::storage::Storage;

/// How a lock wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WaitEnd {
    /// The advisory lock was handed over to the session, or the row it waits for is no
    /// longer share-locked by another session.
    Granted,
    /// `lock_timeout` expired first: the statement fails with 55P03.
    TimedOut,
}

/// The shared state of one instance.
pub(crate) type Shared = Rc<RefCell<State>>;

/// A request from the handle that the server host carries out when it next runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Control {
    Crash,
    Restart,
}

/// One simple Query in the statement log of [`ServerHandle::queries`](super::ServerHandle::queries).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueryRecord {
    /// Backend pid of the session that sent it.
    pub pid: i32,
    /// When the server read it (simulated time since the simulation start).
    pub received: Duration,
    /// When the server executed it and sent the reply; `None` when the session ended
    /// first (terminated or crashed during the query latency).
    pub answered: Option<Duration>,
}

/// What a session announced in its startup message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Startup {
    pub(crate) user: String,
    pub(crate) database: String,
    pub(crate) application_name: String,
}

/// One live session (backend).
#[derive(Debug)]
pub(crate) struct Session {
    pub(crate) secret: i32,
    pub(crate) database: String,
    pub(crate) user: String,
    pub(crate) started_at: Duration,
    pub(crate) last_query_at: Option<Duration>,
    pub(crate) gucs: Gucs,
    /// The values at `BEGIN`, restored by `ROLLBACK`.
    pub(crate) saved_gucs: Option<Gucs>,
    /// While transaction-local values (`set_config(…, true)`) are in effect: the values the
    /// session returns to when the transaction commits.
    pub(crate) local_base: Option<Gucs>,
    /// What this session's statement waits for, if it waits.
    pub(crate) waiting: Option<Wait>,
    /// Set when the wait [`Self::waiting`] names is over: the advisory lock was handed over
    /// to this session, or no other session share-locks the row any more.
    pub(crate) wait_granted: bool,
    /// The first fence check (`SELECT … FOR SHARE` of a fence row) of the open transaction
    /// block, logged again when the block commits.
    pub(crate) fence_check: Option<FenceCheck>,
    /// Prepared statements and portals of the extended query protocol.
    pub(crate) prepared: Prepared,
    pub(crate) transaction: TransactionStatus,
    pub(crate) terminate_requested: bool,
    pub(crate) wake: Rc<Notify>,
}

/// What a blocked statement waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Wait {
    /// Its turn in the queue of an advisory lock (`pg_advisory_lock`).
    Advisory(LockId),
    /// The end of other sessions' share locks on a row (an update of a `FOR SHARE`d row).
    Row(RowId),
}

/// A fence check made in a transaction block: which row, the epoch read, and when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FenceCheck {
    pub(crate) row: RowId,
    pub(crate) epoch: i64,
    pub(crate) at: Duration,
}

/// Everything one instance knows.
#[derive(Debug)]
pub(crate) struct State {
    pub(crate) config: ServerConfig,
    pub(crate) running: bool,
    pub(crate) controls: VecDeque<Control>,
    pub(crate) server_wake: Rc<Notify>,
    next_pid: i32,
    pub(crate) sessions: BTreeMap<i32, Session>,
    pub(crate) locks: LockTable,
    /// Row locks on the fence table (`FOR SHARE`).
    pub(crate) rows: RowLocks,
    pub(crate) log: Vec<LogEntry>,
    pub(crate) queries: Vec<QueryRecord>,
    /// The latest simulated time the server has read; stamps events when no host clock
    /// can be read (the host's software being dropped by a turmoil crash).
    pub(crate) last_time: Duration,
    /// Whether the instance is a hot standby (`pg_is_in_recovery()`).
    pub(crate) in_recovery: bool,
    /// The committed tables, shared with the instances it replicates to.
    pub(crate) storage: Rc<RefCell<Storage>>,
    /// The rows of the unlogged candidate table (`plexsphere_leader_candidate`) by database,
    /// key and holder: the instance's own, as an unlogged table's data is not in the WAL, so
    /// neither replicated (a promoted standby finds the table empty) nor kept by a crash.
    pub(crate) candidates: Candidates,
}

/// One row of the unlogged candidate table: the candidacy's text before its times, when it
/// was last seen (server unix ms), and its age then (ms).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CandidateRow {
    pub(crate) candidacy: String,
    pub(crate) seen_ms: i64,
    pub(crate) age_ms: i64,
}

/// The candidate table's rows of one instance, by (database, key, holder).
pub(crate) type Candidates = BTreeMap<(String, (i32, i32), String), CandidateRow>;

/// Outcome of [`State::lock_or_wait`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LockWait {
    /// Granted at once (free, or re-entrant).
    Granted,
    /// Another session holds it: the session is queued for it.
    Queued(LockId),
}

/// Which idle timeout is armed while a session waits for its next message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IdleKind {
    /// `idle_session_timeout`, outside a transaction block.
    Session,
    /// `idle_in_transaction_session_timeout`, inside an open or failed block.
    InTransaction,
}

impl State {
    pub(crate) fn new(config: ServerConfig) -> Self {
        Self {
            next_pid: config.first_pid,
            in_recovery: config.in_recovery,
            config,
            running: false,
            controls: VecDeque::new(),
            server_wake: Rc::new(Notify::new()),
            sessions: BTreeMap::new(),
            locks: LockTable::default(),
            rows: RowLocks::default(),
            log: Vec::new(),
            queries: Vec::new(),
            last_time: Duration::ZERO,
            storage: Rc::new(RefCell::new(Storage::default())),
            candidates: Candidates::new(),
        }
    }

    /// Reads the simulated clock. Call only from the server host's software, where
    /// [`turmoil::sim_elapsed`] is the host's current time; never decreases.
    pub(crate) fn clock(&mut self) -> Duration {
        if let Some(now) = turmoil::sim_elapsed() {
            self.last_time = self.last_time.max(now);
        }
        self.last_time
    }

    pub(crate) fn record(&mut self, at: Duration, event: Event) {
        self.log.push(LogEntry { at, event });
    }

    /// The server (re)starts and accepts connections.
    pub(crate) fn start(&mut self, at: Duration) {
        self.running = true;
        self.record(at, Event::ServerStarted);
    }

    /// The server crashes: every session ends and every lock goes, reason `Crash`.
    pub(crate) fn crash(&mut self, at: Duration) {
        if !self.running {
            return;
        }
        // Down first, so that no lock is handed over to a session that dies with the server.
        self.running = false;
        // An unlogged table is truncated by the recovery after a crash.
        self.candidates.clear();
        let pids: Vec<i32> = self.sessions.keys().copied().collect();
        for pid in pids {
            self.end_session(pid, EndReason::Crash, at);
        }
        self.record(at, Event::ServerCrashed);
    }

    /// Registers a session that completed its startup; returns its pid.
    pub(crate) fn open_session(&mut self, startup: Startup, at: Duration) -> i32 {
        let pid = self.next_pid;
        self.next_pid = self.next_pid.wrapping_add(1);
        self.record(
            at,
            Event::SessionStarted {
                pid,
                database: startup.database.clone(),
                user: startup.user.clone(),
                application_name: startup.application_name.clone(),
            },
        );
        let session = Session {
            secret: pid.wrapping_mul(7919) ^ 0x5eed,
            database: startup.database,
            user: startup.user,
            started_at: at,
            last_query_at: None,
            gucs: Gucs {
                application_name: startup.application_name,
                server: self.config.lock_table,
                ..Gucs::default()
            },
            saved_gucs: None,
            local_base: None,
            waiting: None,
            wait_granted: false,
            fence_check: None,
            prepared: Prepared::default(),
            transaction: TransactionStatus::Idle,
            terminate_requested: false,
            wake: Rc::new(Notify::new()),
        };
        self.sessions.insert(pid, session);
        pid
    }

    /// Ends session `pid`: releases its locks, then forgets it. A no-op when the session
    /// is already gone (ended by a crash before its task was dropped).
    pub(crate) fn end_session(&mut self, pid: i32, reason: EndReason, at: Duration) {
        let Some(session) = self.sessions.remove(&pid) else {
            return;
        };
        self.end_row_locks(pid);
        let released = self.release_all(pid, ReleaseReason::SessionEnd(reason), at);
        self.record(
            at,
            Event::SessionEnded {
                pid,
                database: session.database,
                reason,
            },
        );
        for lock in released {
            self.hand_over(&lock, at);
        }
    }

    /// Releases every lock of session `pid`, in either mode, logged with `reason`; the locks,
    /// to [`Self::hand_over`].
    fn release_all(&mut self, pid: i32, reason: ReleaseReason, at: Duration) -> Vec<LockId> {
        let released = self.locks.release_session(pid);
        for (lock, mode, _count) in &released {
            self.record(
                at,
                Event::LockReleased {
                    pid,
                    lock: lock.clone(),
                    remaining: 0,
                    reason,
                    mode: *mode,
                },
            );
        }
        released
            .into_iter()
            .map(|(lock, _mode, _count)| lock)
            .collect()
    }

    /// Grants the lock `lock`, if nobody holds it, to its first waiter, if any, and wakes that
    /// session.
    fn hand_over(&mut self, lock: &LockId, at: Duration) {
        if !self.running || !self.locks.is_free(lock) {
            return;
        }
        let Some(pid) = self.locks.hand_over(lock) else {
            return;
        };
        self.record(
            at,
            Event::LockGranted {
                pid,
                lock: lock.clone(),
                count: 1,
                mode: LockMode::Exclusive,
            },
        );
        if let Some(session) = self.sessions.get_mut(&pid) {
            session.wait_granted = true;
            session.wake.notify_one();
        }
    }

    /// `pg_advisory_lock` for session `pid`: granted at once if free or held by `pid`,
    /// else `pid` joins the lock's queue and waits for [`Session::wait_granted`].
    pub(crate) fn lock_or_wait(&mut self, pid: i32, key: LockKey, at: Duration) -> LockWait {
        let Some(lock) = self.lock_id(pid, key) else {
            return LockWait::Granted;
        };
        if self.try_lock(pid, key, at) {
            return LockWait::Granted;
        }
        self.locks.enqueue(lock.clone(), pid);
        if let Some(session) = self.sessions.get_mut(&pid) {
            session.waiting = Some(Wait::Advisory(lock.clone()));
            session.wait_granted = false;
        }
        LockWait::Queued(lock)
    }

    /// An update of `row` by session `pid`: true when it may go on now, false when another
    /// session share-locks the row and `pid` was queued to wait for [`Session::wait_granted`].
    /// With row locks switched off ([`ServerConfig::with_row_locks`]) it never waits.
    ///
    /// [`ServerConfig::with_row_locks`]: super::ServerConfig::with_row_locks
    pub(crate) fn update_or_wait(&mut self, pid: i32, row: &RowId) -> bool {
        if !self.config.row_locks || !self.rows.others_share(row, pid) {
            return true;
        }
        self.rows.enqueue(row.clone(), pid);
        if let Some(session) = self.sessions.get_mut(&pid) {
            session.waiting = Some(Wait::Row(row.clone()));
            session.wait_granted = false;
        }
        false
    }

    /// `SELECT … FOR SHARE` of `row` by session `pid`: a share lock until its transaction
    /// ends (none with row locks switched off).
    pub(crate) fn share_row(&mut self, pid: i32, row: RowId) {
        if self.config.row_locks {
            self.rows.share(row, pid);
        }
    }

    /// Ends session `pid`'s row locks (its transaction or session ended), and its own row
    /// waits; wakes the updates nothing blocks any more.
    pub(crate) fn end_row_locks(&mut self, pid: i32) {
        for (_row, waiter) in self.rows.release(pid) {
            if let Some(session) = self.sessions.get_mut(&waiter) {
                session.wait_granted = true;
                session.wake.notify_one();
            }
        }
    }

    /// Ends session `pid`'s wait: true when it may go on (the advisory lock was handed over
    /// to it, or the row is no longer share-locked by others), false when it left the queue
    /// without that (lock timeout, termination).
    pub(crate) fn end_wait(&mut self, pid: i32) -> bool {
        let Some(session) = self.sessions.get_mut(&pid) else {
            return false;
        };
        let granted = std::mem::take(&mut session.wait_granted);
        let Some(wait) = session.waiting.take() else {
            return granted;
        };
        if !granted {
            match wait {
                Wait::Advisory(lock) => {
                    self.locks.cancel_wait(&lock, pid);
                }
                Wait::Row(row) => {
                    self.rows.cancel_wait(&row, pid);
                }
            }
        }
        granted
    }

    /// Ends session `pid`'s lock wait, granted or not, at `at`; `expired` when its
    /// `lock_timeout` is due in this instant. A wait granted in the instant its timeout is due
    /// still fails with 55P03, as in PostgreSQL: the timeout's interrupt is already pending
    /// when the grant wakes the backend, and `LockErrorCleanup` keeps the grant. An advisory
    /// lock so granted stays with the session (a session-level lock outlives the failed
    /// statement), logged as [`Event::GrantedAtLockTimeout`]; a row so freed is not updated
    /// (its transaction-level lock goes with the failed statement).
    pub(crate) fn finish_wait(&mut self, pid: i32, expired: bool, at: Duration) -> WaitEnd {
        let waited = self.sessions.get(&pid).and_then(|s| s.waiting.clone());
        match (self.end_wait(pid), expired, waited) {
            (true, false, _) => WaitEnd::Granted,
            (true, true, Some(Wait::Advisory(lock))) => {
                self.record(at, Event::GrantedAtLockTimeout { pid, lock });
                WaitEnd::TimedOut
            }
            _ => WaitEnd::TimedOut,
        }
    }

    /// Whether session `pid`'s wait is over (see [`Session::wait_granted`]).
    pub(crate) fn wait_granted(&self, pid: i32) -> bool {
        self.sessions.get(&pid).is_some_and(|s| s.wait_granted)
    }

    fn lock_id(&self, pid: i32, key: LockKey) -> Option<LockId> {
        let database = self.sessions.get(&pid)?.database.clone();
        Some(LockId { database, key })
    }

    /// Whether no session but `pid` holds `key` in the session's database.
    pub(crate) fn free_for(&self, pid: i32, key: LockKey) -> bool {
        self.lock_id(pid, key).is_some_and(|lock| {
            self.locks.is_free(&lock) || self.locks.held_by(pid).iter().any(|(id, _)| *id == lock)
        })
    }

    /// `pg_try_advisory_lock` for session `pid`.
    pub(crate) fn try_lock(&mut self, pid: i32, key: LockKey, at: Duration) -> bool {
        self.try_lock_in(pid, key, LockMode::Exclusive, at)
    }

    /// `pg_try_advisory_lock` (`Exclusive`) or `pg_try_advisory_lock_shared` (`Shared`) for
    /// session `pid`.
    pub(crate) fn try_lock_in(
        &mut self,
        pid: i32,
        key: LockKey,
        mode: LockMode,
        at: Duration,
    ) -> bool {
        let Some(lock) = self.lock_id(pid, key) else {
            return false;
        };
        let tried = match mode {
            LockMode::Exclusive => self.locks.try_lock(lock.clone(), pid),
            LockMode::Shared => self.locks.try_lock_shared(lock.clone(), pid),
        };
        match tried {
            TryLock::Granted { count } => {
                let event = Event::LockGranted {
                    pid,
                    lock,
                    count,
                    mode,
                };
                self.record(at, event);
                true
            }
            TryLock::Refused => false,
        }
    }

    /// `pg_advisory_unlock` for session `pid`; false when the session does not hold it.
    pub(crate) fn unlock(&mut self, pid: i32, key: LockKey, at: Duration) -> bool {
        self.unlock_in(pid, key, LockMode::Exclusive, at)
    }

    /// `pg_advisory_unlock` (`Exclusive`) or `pg_advisory_unlock_shared` (`Shared`) for
    /// session `pid`; false when the session does not hold it in that mode.
    pub(crate) fn unlock_in(
        &mut self,
        pid: i32,
        key: LockKey,
        mode: LockMode,
        at: Duration,
    ) -> bool {
        let Some(lock) = self.lock_id(pid, key) else {
            return false;
        };
        let unlocked = match mode {
            LockMode::Exclusive => self.locks.unlock(&lock, pid),
            LockMode::Shared => self.locks.unlock_shared(&lock, pid),
        };
        match unlocked {
            Unlock::Released { remaining } => {
                self.record(
                    at,
                    Event::LockReleased {
                        pid,
                        lock: lock.clone(),
                        remaining,
                        reason: ReleaseReason::Unlock,
                        mode,
                    },
                );
                if remaining == 0 {
                    self.hand_over(&lock, at);
                }
                true
            }
            Unlock::NotHeld => false,
        }
    }

    /// `pg_advisory_unlock_all` for session `pid`: every lock, in either mode.
    pub(crate) fn unlock_all(&mut self, pid: i32, at: Duration) {
        for lock in self.release_all(pid, ReleaseReason::UnlockAll, at) {
            self.hand_over(&lock, at);
        }
    }

    /// Asks session `pid` to terminate (FATAL 57P01); false when no live session has it.
    pub(crate) fn request_terminate(&mut self, pid: i32) -> bool {
        let Some(session) = self.sessions.get_mut(&pid) else {
            return false;
        };
        session.terminate_requested = true;
        session.wake.notify_one();
        true
    }

    /// Logs the arrival of a simple Query; returns its index for [`Self::query_answered`].
    pub(crate) fn query_received(&mut self, pid: i32, at: Duration) -> usize {
        self.queries.push(QueryRecord {
            pid,
            received: at,
            answered: None,
        });
        self.queries.len() - 1
    }

    /// Logs the answer to the query at `index`.
    pub(crate) fn query_answered(&mut self, index: usize, at: Duration) {
        if let Some(query) = self.queries.get_mut(index) {
            query.answered = Some(at);
        }
    }

    /// Takes a pending terminate request of session `pid`.
    pub(crate) fn take_terminate(&mut self, pid: i32) -> bool {
        self.sessions
            .get_mut(&pid)
            .is_some_and(|s| std::mem::take(&mut s.terminate_requested))
    }

    /// The idle timeout armed while session `pid` waits for its next message:
    /// `idle_session_timeout` outside a transaction block, `idle_in_transaction_session_timeout`
    /// inside an open or failed one (PostgreSQL's `PostgresMain`).
    pub(crate) fn idle_timeout(&self, pid: i32) -> Option<(Duration, IdleKind)> {
        let session = self.sessions.get(&pid)?;
        let (timeout, kind) = match session.transaction {
            TransactionStatus::Idle => (session.gucs.idle_session_timeout, IdleKind::Session),
            TransactionStatus::InBlock | TransactionStatus::Failed => (
                session.gucs.idle_in_transaction_session_timeout,
                IdleKind::InTransaction,
            ),
        };
        (!timeout.is_zero()).then_some((timeout, kind))
    }
}
