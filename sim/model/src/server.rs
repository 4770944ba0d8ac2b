//! The server's sessions, shared by every mode, around the mode's own lock table
//! ([`Locks`]): the advisory lock with its queue, the fence and the lease row, or the shards.

use std::fmt::Debug;
use std::hash::Hash;

use plexsphere_leader_core::ConnId;

use crate::clock::Micros;
use crate::rename::Renamed;

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

/// One open server session; `K` is what the lock table marks on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Session<K> {
    /// Whose session it is.
    pub owner: Sess,
    /// Its backend's pid (given at open: a renaming of the replicas leaves it alone).
    pub pid: i32,
    /// Whether the grant (or the registration) set `idle_session_timeout` on it.
    pub idle_limit: bool,
    /// When it last ran a statement.
    pub last_active: Micros,
    /// What the lock table marks on it (the sharded space's member lock).
    pub member: K,
}

/// A mode's lock table on the server.
pub trait Locks: Renamed + Clone + Debug + Eq + Hash + Send + Sync {
    /// What the table marks on a session (nothing, or its membership).
    type Membership: Copy + Debug + Default + Eq + Hash + Send + Sync;

    /// Whether `sess` waits in a lock's queue (its idle timeout does not run meanwhile).
    fn is_waiting(&self, _sess: Sess) -> bool {
        false
    }

    /// When the next queued wait times out, and whose.
    fn next_wait_timeout(&self) -> Option<(Micros, Sess)> {
        None
    }

    /// A restart or failover: what the table loses beyond the sessions' locks.
    fn restart(&mut self) {}
}

/// A value with what the server answered (committed) and what survives a crash (durable).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Durable<T> {
    /// What the server reads and answered.
    pub committed: T,
    /// What a restart comes back with.
    pub durable: T,
}

impl<T: Clone> Durable<T> {
    /// Writes `value`, flushed at once when `durable`.
    pub fn write(&mut self, value: T, durable: bool) {
        if durable {
            self.durable = value.clone();
        }
        self.committed = value;
    }

    /// The WAL writer flushed.
    pub fn flush(&mut self) {
        self.durable = self.committed.clone();
    }

    /// A restart: back to the durable value.
    pub fn recover(&mut self) {
        self.committed = self.durable.clone();
    }
}

/// The server's state.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Server<L: Locks> {
    /// Backends started so far: the next one's pid.
    pub backends: i32,
    /// Open sessions, ordered by owner.
    pub sessions: Vec<Session<L::Membership>>,
    /// The mode's lock table.
    pub locks: L,
}

impl<L: Locks> Server<L> {
    /// A server with no session yet.
    pub fn new(locks: L) -> Self {
        Self {
            backends: 0,
            sessions: Vec::new(),
            locks,
        }
    }

    /// The session of `sess`, if open.
    pub fn session_mut(&mut self, sess: Sess) -> Option<&mut Session<L::Membership>> {
        self.sessions.iter_mut().find(|s| s.owner == sess)
    }

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
            member: L::Membership::default(),
        };
        let at = self.sessions.partition_point(|s| s.owner < sess);
        self.sessions.insert(at, session);
    }

    /// `sess` ran a statement at `now`.
    pub fn touch(&mut self, sess: Sess, now: Micros) {
        if let Some(session) = self.session_mut(sess) {
            session.last_active = now;
        }
    }

    /// The grant set `idle_session_timeout` on `sess`.
    pub fn limit_idle(&mut self, sess: Sess) {
        if let Some(session) = self.session_mut(sess) {
            session.idle_limit = true;
        }
    }

    /// When the server next ends an idle session, and which.
    pub fn next_idle_end(&self, idle_timeout: Micros) -> Option<(Micros, Sess)> {
        self.sessions
            .iter()
            .filter(|s| s.idle_limit && !self.locks.is_waiting(s.owner))
            .map(|s| (s.last_active + idle_timeout, s.owner))
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, PartialEq, Eq, Hash)]
    struct NoLocks;

    impl Renamed for NoLocks {
        fn fingerprint(&self, _: &dyn Fn(u8) -> bool, _: &mut std::hash::DefaultHasher) {}
        fn rename(&mut self, _: &dyn Fn(u8) -> u8) {}
    }

    impl Locks for NoLocks {
        type Membership = ();
    }

    #[test]
    fn sessions_stay_ordered_by_owner_with_a_pid_each() {
        let mut server = Server::new(NoLocks);
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
