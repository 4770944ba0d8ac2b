//! The session advisory lock table, modelled on PostgreSQL's.
//!
//! Pure data: no I/O, no clock. A lock is identified by its database and its key; a
//! session holds it with a re-entrancy count, as `pg_try_advisory_lock` called twice in
//! one session must be matched by two `pg_advisory_unlock` calls. Sessions blocked in
//! `pg_advisory_lock` wait in a FIFO queue per lock; when the holder frees the lock, the
//! first waiter is granted it at once ([`LockTable::hand_over`]), as PostgreSQL's
//! `ProcLockWakeup` does, so the lock is never free while a session waits for it.

use std::collections::BTreeMap;

use super::queues::WaitQueues;

/// The key of an advisory lock.
///
/// PostgreSQL keeps the two forms apart: `pg_locks` shows a two-int4 key with
/// `objsubid = 2` and a bigint key with `objsubid = 1`, so `Pair(a, b)` never collides
/// with `BigInt((a << 32) | b)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LockKey {
    /// The two-int4 form, `pg_try_advisory_lock(key1 int4, key2 int4)`.
    Pair(i32, i32),
    /// The single-bigint form, `pg_try_advisory_lock(key bigint)`.
    BigInt(i64),
}

/// The identity of an advisory lock on a server: advisory locks are scoped to one database.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LockId {
    /// The database the lock lives in (the session's database).
    pub database: String,
    /// The key within that database.
    pub key: LockKey,
}

/// One granted lock, as `pg_locks` would show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldLock {
    /// Which lock.
    pub id: LockId,
    /// The backend pid of the holding session.
    pub pid: i32,
    /// The session's re-entrancy count, at least 1.
    pub count: u64,
}

/// Outcome of [`LockTable::try_lock`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TryLock {
    /// Granted; `count` is the session's count after this grant (1 for a first grant).
    Granted { count: u64 },
    /// Another session holds the lock.
    Refused,
}

/// Outcome of [`LockTable::unlock`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unlock {
    /// The count was decremented; the lock is free when `remaining` is 0.
    Released { remaining: u64 },
    /// The session does not hold this lock.
    NotHeld,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Holder {
    pid: i32,
    count: u64,
}

/// All granted advisory locks of one server instance, ordered by [`LockId`].
#[derive(Debug, Default)]
pub(crate) struct LockTable {
    held: BTreeMap<LockId, Holder>,
    /// Sessions waiting in `pg_advisory_lock`, oldest first.
    waiting: WaitQueues<LockId>,
}

impl LockTable {
    /// Grants `id` to `pid` if free or already held by `pid` (re-entrant).
    pub(crate) fn try_lock(&mut self, id: LockId, pid: i32) -> TryLock {
        let holder = self.held.entry(id).or_insert(Holder { pid, count: 0 });
        if holder.pid != pid {
            return TryLock::Refused;
        }
        holder.count = holder.count.saturating_add(1);
        TryLock::Granted {
            count: holder.count,
        }
    }

    /// Decrements `pid`'s count on `id`, freeing the lock at 0.
    pub(crate) fn unlock(&mut self, id: &LockId, pid: i32) -> Unlock {
        let Some(holder) = self.held.get_mut(id) else {
            return Unlock::NotHeld;
        };
        if holder.pid != pid {
            return Unlock::NotHeld;
        }
        holder.count -= 1;
        let remaining = holder.count;
        if remaining == 0 {
            self.held.remove(id);
        }
        Unlock::Released { remaining }
    }

    /// Queues `pid` behind the lock's current waiters.
    pub(crate) fn enqueue(&mut self, id: LockId, pid: i32) {
        self.waiting.enqueue(id, pid);
    }

    /// Takes `pid` out of the queue of `id`; false when it was not waiting there.
    pub(crate) fn cancel_wait(&mut self, id: &LockId, pid: i32) -> bool {
        self.waiting.cancel(id, pid)
    }

    /// Grants a free lock `id` to its first waiter, if any; returns that waiter.
    pub(crate) fn hand_over(&mut self, id: &LockId) -> Option<i32> {
        if self.held.contains_key(id) {
            return None;
        }
        let pid = self.waiting.pop_front(id)?;
        self.held.insert(id.clone(), Holder { pid, count: 1 });
        Some(pid)
    }

    /// Every waiting request, as `(lock, pid)` in lock order and queue order per lock.
    pub(crate) fn waiters(&self) -> Vec<(LockId, i32)> {
        self.waiting.all()
    }

    /// Frees every lock `pid` holds and returns them with the count each had; a request
    /// of `pid` still waiting leaves its queue.
    pub(crate) fn release_session(&mut self, pid: i32) -> Vec<(LockId, u64)> {
        self.waiting.cancel_everywhere(pid);
        let mine: Vec<LockId> = self
            .held
            .iter()
            .filter(|(_, holder)| holder.pid == pid)
            .map(|(id, _)| id.clone())
            .collect();
        mine.into_iter()
            .filter_map(|id| self.held.remove(&id).map(|holder| (id, holder.count)))
            .collect()
    }

    /// Every granted lock, in [`LockId`] order.
    pub(crate) fn held(&self) -> Vec<HeldLock> {
        self.held
            .iter()
            .map(|(id, holder)| HeldLock {
                id: id.clone(),
                pid: holder.pid,
                count: holder.count,
            })
            .collect()
    }

    /// The locks `pid` holds with their counts, in [`LockId`] order.
    pub(crate) fn held_by(&self, pid: i32) -> Vec<(LockId, u64)> {
        self.held
            .iter()
            .filter(|(_, holder)| holder.pid == pid)
            .map(|(id, holder)| (id.clone(), holder.count))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(database: &str, key: LockKey) -> LockId {
        LockId {
            database: database.to_owned(),
            key,
        }
    }

    const LEADER: LockKey = LockKey::Pair(1_886_156_915, 1);

    #[test]
    fn first_grant_counts_one_and_other_session_is_refused() {
        let mut table = LockTable::default();
        assert_eq!(
            table.try_lock(id("db", LEADER), 1),
            TryLock::Granted { count: 1 }
        );
        assert_eq!(table.try_lock(id("db", LEADER), 2), TryLock::Refused);
        assert_eq!(table.held_by(2), vec![]);
    }

    #[test]
    fn re_entrant_grant_needs_as_many_unlocks() {
        let mut table = LockTable::default();
        table.try_lock(id("db", LEADER), 1);
        assert_eq!(
            table.try_lock(id("db", LEADER), 1),
            TryLock::Granted { count: 2 }
        );
        assert_eq!(
            table.unlock(&id("db", LEADER), 1),
            Unlock::Released { remaining: 1 }
        );
        assert_eq!(table.try_lock(id("db", LEADER), 2), TryLock::Refused);
        assert_eq!(
            table.unlock(&id("db", LEADER), 1),
            Unlock::Released { remaining: 0 }
        );
        assert_eq!(
            table.try_lock(id("db", LEADER), 2),
            TryLock::Granted { count: 1 }
        );
    }

    #[test]
    fn unlock_by_non_holder_or_of_free_lock_is_not_held() {
        let mut table = LockTable::default();
        assert_eq!(table.unlock(&id("db", LEADER), 1), Unlock::NotHeld);
        table.try_lock(id("db", LEADER), 1);
        assert_eq!(table.unlock(&id("db", LEADER), 2), Unlock::NotHeld);
        assert_eq!(table.held().len(), 1);
    }

    #[test]
    fn pair_and_bigint_with_same_bits_do_not_collide() {
        let mut table = LockTable::default();
        let big = LockKey::BigInt((1_886_156_915_i64 << 32) | 1);
        table.try_lock(id("db", LEADER), 1);
        assert_eq!(
            table.try_lock(id("db", big), 2),
            TryLock::Granted { count: 1 }
        );
    }

    #[test]
    fn same_key_in_other_database_is_another_lock() {
        let mut table = LockTable::default();
        table.try_lock(id("a", LEADER), 1);
        assert_eq!(
            table.try_lock(id("b", LEADER), 2),
            TryLock::Granted { count: 1 }
        );
    }

    #[test]
    fn release_session_frees_only_that_sessions_locks() {
        let mut table = LockTable::default();
        table.try_lock(id("db", LEADER), 1);
        table.try_lock(id("db", LEADER), 1);
        table.try_lock(id("db", LockKey::BigInt(7)), 1);
        table.try_lock(id("db", LockKey::BigInt(8)), 2);
        let released = table.release_session(1);
        assert_eq!(
            released,
            vec![(id("db", LEADER), 2), (id("db", LockKey::BigInt(7)), 1)]
        );
        assert_eq!(table.held().len(), 1);
        assert_eq!(table.held()[0].pid, 2);
    }

    #[test]
    fn freed_lock_goes_to_the_first_waiter_in_fifo_order() {
        let mut table = LockTable::default();
        table.try_lock(id("db", LEADER), 1);
        table.enqueue(id("db", LEADER), 2);
        table.enqueue(id("db", LEADER), 3);
        assert_eq!(table.hand_over(&id("db", LEADER)), None, "still held");
        table.unlock(&id("db", LEADER), 1);
        assert_eq!(table.hand_over(&id("db", LEADER)), Some(2));
        assert_eq!(table.try_lock(id("db", LEADER), 1), TryLock::Refused);
        assert_eq!(table.waiters(), vec![(id("db", LEADER), 3)]);
        table.release_session(2);
        assert_eq!(table.hand_over(&id("db", LEADER)), Some(3));
        assert_eq!(table.waiters(), vec![]);
    }

    #[test]
    fn cancelled_or_ended_waiter_leaves_the_queue() {
        let mut table = LockTable::default();
        table.try_lock(id("db", LEADER), 1);
        table.enqueue(id("db", LEADER), 2);
        table.enqueue(id("db", LEADER), 3);
        assert!(table.cancel_wait(&id("db", LEADER), 2));
        assert!(!table.cancel_wait(&id("db", LEADER), 2));
        table.release_session(3);
        table.release_session(1);
        assert_eq!(table.hand_over(&id("db", LEADER)), None);
        assert_eq!(table.held(), vec![]);
    }
}
