//! The server: sessions, the advisory lock with its FIFO queue of waiters, the fence table's
//! epoch and the lease row, each row with what is committed and what is durable.

use plexsphere_leader_core::ConnId;

use crate::clock::Micros;

/// A session of one run of one replica: the run keeps the sessions of a crashed process apart
/// from its successor's, whose connection ids start again at one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Sess {
    /// The replica's index in the state.
    pub replica: u8,
    /// The replica's run (its process incarnation).
    pub run: u32,
    /// The election's connection id.
    pub conn: ConnId,
}

/// One open server session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Session {
    /// Whose session it is.
    pub owner: Sess,
    /// Its backend's pid (given at open: a renaming of the replicas leaves it alone).
    pub pid: i32,
    /// Whether the grant set `idle_session_timeout` on it.
    pub idle_limit: bool,
    /// When it last ran a statement.
    pub last_active: Micros,
}

/// A session waiting in the lock's queue (`pg_advisory_lock` under `lock_timeout`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Waiter {
    /// The waiting session.
    pub owner: Sess,
    /// When its `lock_timeout` ends the wait.
    pub timeout_at: Micros,
}

/// A value with what the server answered (committed) and what survives a crash (durable).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Durable<T> {
    /// What the server reads and answered.
    pub committed: T,
    /// What a restart comes back with.
    pub durable: T,
}

impl<T: Copy> Durable<T> {
    /// Writes `value`, flushed at once when `durable`.
    pub fn write(&mut self, value: T, durable: bool) {
        self.committed = value;
        if durable {
            self.durable = value;
        }
    }

    /// The WAL writer flushed.
    pub fn flush(&mut self) {
        self.durable = self.committed;
    }

    /// A restart: back to the durable value.
    pub fn recover(&mut self) {
        self.committed = self.durable;
    }
}

/// The lease row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Row {
    /// The holder: a replica's index and its run.
    pub holder: (u8, u32),
    /// The epoch of the holder's term.
    pub epoch: u64,
    /// When the row expires, by the server's clock.
    pub expires: Micros,
    /// Whether this claim took the row over from another holder after it expired.
    pub took_over: bool,
}

/// The server's state.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Server {
    /// Restarts and failovers so far.
    pub generation: u32,
    /// Backends started so far: the next one's pid.
    pub backends: i32,
    /// Open sessions, ordered by owner.
    pub sessions: Vec<Session>,
    /// The session holding the advisory lock.
    pub holder: Option<Sess>,
    /// The lock's queue, first first.
    pub waiters: Vec<Waiter>,
    /// The last grant that went to a waiter of the queue.
    pub queued_grant: Option<Sess>,
    /// The fence table's epoch (advisory mechanism).
    pub fence: Durable<u64>,
    /// The lease row (lease mechanism).
    pub lease: Durable<Option<Row>>,
}

impl Server {
    /// The backend pid of `sess` (0 when it is not open).
    pub fn backend_pid(&self, sess: Sess) -> i32 {
        self.sessions
            .iter()
            .find(|s| s.owner == sess)
            .map_or(0, |s| s.pid)
    }

    /// Whether `sess` is open.
    pub fn is_open(&self, sess: Sess) -> bool {
        self.sessions.iter().any(|s| s.owner == sess)
    }

    /// Opens `sess` (a connection borrowed from the pool).
    pub fn open(&mut self, sess: Sess, now: Micros) {
        self.backends = self.backends.saturating_add(1);
        let session = Session {
            pid: self.backends,
            owner: sess,
            idle_limit: false,
            last_active: now,
        };
        let at = self.sessions.partition_point(|s| s.owner < sess);
        self.sessions.insert(at, session);
    }

    /// `sess` ran a statement at `now`.
    pub fn touch(&mut self, sess: Sess, now: Micros) {
        if let Some(session) = self.sessions.iter_mut().find(|s| s.owner == sess) {
            session.last_active = now;
        }
    }

    /// The grant set `idle_session_timeout` on `sess`.
    pub fn limit_idle(&mut self, sess: Sess) {
        if let Some(session) = self.sessions.iter_mut().find(|s| s.owner == sess) {
            session.idle_limit = true;
        }
    }

    /// Whether `sess` waits in the lock's queue.
    pub fn is_waiting(&self, sess: Sess) -> bool {
        self.waiters.iter().any(|w| w.owner == sess)
    }

    /// When the server next ends an idle session, and which.
    pub fn next_idle_end(&self, idle_timeout: Micros) -> Option<(Micros, Sess)> {
        self.sessions
            .iter()
            .filter(|s| s.idle_limit && !self.is_waiting(s.owner))
            .map(|s| (s.last_active + idle_timeout, s.owner))
            .min()
    }

    /// When the next queued wait times out, and whose.
    pub fn next_wait_timeout(&self) -> Option<(Micros, Sess)> {
        self.waiters.iter().map(|w| (w.timeout_at, w.owner)).min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_not_flushed_is_lost_by_a_restart_and_a_durable_one_is_kept() {
        let mut value = Durable::<u64>::default();
        value.write(1, true);
        value.write(2, false);
        assert_eq!(value.committed, 2);
        value.recover();
        assert_eq!(value.committed, 1);
        value.write(3, false);
        value.flush();
        value.recover();
        assert_eq!(value.committed, 3);
    }

    #[test]
    fn sessions_stay_ordered_by_owner_with_a_pid_each() {
        let mut server = Server::default();
        let sess = |replica, conn| Sess {
            replica,
            run: 0,
            conn: ConnId::new(conn),
        };
        server.open(sess(2, 1), 0);
        server.open(sess(0, 1), 0);
        server.open(sess(1, 1), 0);
        let owners: Vec<u8> = server.sessions.iter().map(|s| s.owner.replica).collect();
        assert_eq!(owners, vec![0, 1, 2]);
        assert_eq!(server.backend_pid(sess(2, 1)), 1);
        assert_eq!(server.backend_pid(sess(1, 1)), 3);
        assert_eq!(server.backend_pid(sess(1, 2)), 0);
    }
}
