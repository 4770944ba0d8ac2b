//! The single lock's table on the server: the advisory lock with its FIFO queue of waiters,
//! the fence table's epoch and the lease row, each row with what is committed and what is
//! durable.

use std::hash::{DefaultHasher, Hash};

use plexsphere_leader_core::rank::Rank;

use crate::clock::Micros;
use crate::engine::Renamed;
use crate::engine::canon::{own, sess};
pub use crate::server::Durable;
use crate::server::{Locks, Sess};

/// A session waiting in the lock's queue (`pg_advisory_lock` under `lock_timeout`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Waiter {
    /// The waiting session.
    pub owner: Sess,
    /// When its `lock_timeout` ends the wait.
    pub timeout_at: Micros,
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

/// A ranked replica's published candidacy, as its last survey wrote it: with the advisory
/// lock in its session's `application_name` (gone with the session), with a lease in a row of
/// the unlogged candidate table (kept by the run, emptied by a restart).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Candidacy {
    /// The session (advisory lock) or the operation (lease) that published it.
    pub owner: Sess,
    /// Its rank.
    pub rank: Rank,
    /// When it was last published, by the server's clock.
    pub seen: Micros,
    /// How long it had been a candidate then.
    pub age: Micros,
}

/// The lock table.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct LockTable {
    /// Restarts and failovers so far.
    pub generation: u32,
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
    /// The ranked replicas' candidacies, one per session (advisory lock) or per run (lease),
    /// ordered by owner.
    pub candidates: Vec<Candidacy>,
}

impl Locks for LockTable {
    type Membership = ();

    fn is_waiting(&self, sess: Sess) -> bool {
        self.waiters.iter().any(|w| w.owner == sess)
    }

    fn next_wait_timeout(&self) -> Option<(Micros, Sess)> {
        self.waiters.iter().map(|w| (w.timeout_at, w.owner)).min()
    }

    /// The lock table is gone; what was committed and not yet durable is lost.
    fn restart(&mut self) {
        self.waiters.clear();
        self.holder = None;
        self.queued_grant = None;
        self.lease.recover();
        self.fence.recover();
        self.candidates.clear();
        self.generation += 1;
    }
}

impl Renamed for LockTable {
    fn fingerprint(&self, mine: &dyn Fn(u8) -> bool, hasher: &mut DefaultHasher) {
        (own(self.holder, mine), own(self.queued_grant, mine)).hash(hasher);
        for (place, waiter) in self.waiters.iter().enumerate() {
            if mine(waiter.owner.replica) {
                let owner = waiter.owner;
                (place, owner.run, owner.conn, waiter.timeout_at).hash(hasher);
            }
        }
        for candidacy in self.candidates.iter().filter(|c| mine(c.owner.replica)) {
            let owner = candidacy.owner;
            (
                owner.run,
                owner.conn,
                candidacy.rank,
                candidacy.seen,
                candidacy.age,
            )
                .hash(hasher);
        }
        for row in [self.lease.committed, self.lease.durable] {
            row.filter(|row| mine(row.holder.0))
                .map(|row| (row.holder.1, row.epoch, row.expires, row.took_over))
                .hash(hasher);
        }
    }

    fn rename(&mut self, rename: &dyn Fn(u8) -> u8) {
        self.holder = self.holder.map(|s| sess(s, rename));
        self.queued_grant = self.queued_grant.map(|s| sess(s, rename));
        for waiter in &mut self.waiters {
            waiter.owner = sess(waiter.owner, rename);
        }
        for candidacy in &mut self.candidates {
            candidacy.owner = sess(candidacy.owner, rename);
        }
        self.candidates.sort_by_key(|c| c.owner);
        for row in [&mut self.lease.committed, &mut self.lease.durable]
            .into_iter()
            .flatten()
        {
            row.holder.0 = rename(row.holder.0);
        }
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
}
