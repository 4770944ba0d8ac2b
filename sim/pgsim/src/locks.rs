//! The session advisory lock table, modelled on PostgreSQL's.
//!
//! Pure data: no I/O, no clock. A lock is identified by its database and its key; a
//! session holds it in a mode ([`LockMode`]: `ExclusiveLock`, or `ShareLock` for the
//! `_shared` functions) with a re-entrancy count, as `pg_try_advisory_lock` called twice in
//! one session must be matched by two `pg_advisory_unlock` calls. An exclusive hold excludes
//! every other session's hold of the key in either mode; shared holds exclude only other
//! sessions' exclusive ones, so any number of sessions share a key. A session's own holds
//! never conflict with each other (it may hold a key in both modes). Sessions blocked in
//! `pg_advisory_lock` wait in a FIFO queue per lock; when the last holder frees the lock, the
//! first waiter is granted it at once ([`LockTable::hand_over`]), as PostgreSQL's
//! `ProcLockWakeup` does, so the lock is never free while a session waits for it. A shared
//! try of a key that has an exclusive waiter is refused (PostgreSQL's `waitMask` check: a
//! new request that conflicts with a waiting one queues behind it, and a try does not wait),
//! unless the session holds the key in that mode already (a re-entrant grant).

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

/// The mode of an advisory lock, as `pg_locks.mode` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LockMode {
    /// `ExclusiveLock`: `pg_advisory_lock`, `pg_try_advisory_lock`.
    Exclusive,
    /// `ShareLock`: `pg_try_advisory_lock_shared` (and the other `_shared` functions).
    Shared,
}

impl LockMode {
    /// The name `pg_locks.mode` shows (`ExclusiveLock`, `ShareLock`).
    pub const fn pg_name(self) -> &'static str {
        match self {
            Self::Exclusive => "ExclusiveLock",
            Self::Shared => "ShareLock",
        }
    }
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
    /// The mode it is held in.
    pub mode: LockMode,
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
    /// The count was decremented; the session's hold ends when `remaining` is 0.
    Released { remaining: u64 },
    /// The session does not hold this lock (in that mode).
    NotHeld,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Holder {
    pid: i32,
    count: u64,
}

/// The holds of one lock: at most one exclusive holder, any number of shared ones; a lock
/// with neither is not in the table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Holders {
    exclusive: Option<Holder>,
    /// Shared holders: pid → count.
    shared: BTreeMap<i32, u64>,
}

impl Holders {
    fn is_empty(&self) -> bool {
        self.exclusive.is_none() && self.shared.is_empty()
    }

    /// Whether a session other than `pid` holds the lock in a mode that conflicts with
    /// `mode`.
    fn conflicts(&self, pid: i32, mode: LockMode) -> bool {
        let other_exclusive = self.exclusive.is_some_and(|h| h.pid != pid);
        match mode {
            LockMode::Exclusive => other_exclusive || self.shared.keys().any(|&p| p != pid),
            LockMode::Shared => other_exclusive,
        }
    }

    fn count(&self, pid: i32, mode: LockMode) -> u64 {
        match mode {
            LockMode::Exclusive => self
                .exclusive
                .filter(|h| h.pid == pid)
                .map_or(0, |h| h.count),
            LockMode::Shared => self.shared.get(&pid).copied().unwrap_or(0),
        }
    }

    fn set_count(&mut self, pid: i32, mode: LockMode, count: u64) {
        match (mode, count) {
            (LockMode::Exclusive, 0) => self.exclusive = None,
            (LockMode::Exclusive, count) => self.exclusive = Some(Holder { pid, count }),
            (LockMode::Shared, 0) => {
                self.shared.remove(&pid);
            }
            (LockMode::Shared, count) => {
                self.shared.insert(pid, count);
            }
        }
    }

    /// Every hold, the exclusive one first, then the shared ones in pid order.
    fn all(&self) -> impl Iterator<Item = (i32, u64, LockMode)> + '_ {
        self.exclusive
            .iter()
            .map(|h| (h.pid, h.count, LockMode::Exclusive))
            .chain(
                self.shared
                    .iter()
                    .map(|(&pid, &count)| (pid, count, LockMode::Shared)),
            )
    }
}

/// All granted advisory locks of one server instance, ordered by [`LockId`].
#[derive(Debug, Default)]
pub(crate) struct LockTable {
    held: BTreeMap<LockId, Holders>,
    /// Sessions waiting in `pg_advisory_lock`, oldest first.
    waiting: WaitQueues<LockId>,
}

impl LockTable {
    /// Grants `id` exclusively to `pid` if no other session holds it (re-entrant).
    pub(crate) fn try_lock(&mut self, id: LockId, pid: i32) -> TryLock {
        self.try_mode(id, pid, LockMode::Exclusive)
    }

    /// Grants `id` in shared mode to `pid` if no other session holds it exclusively and no
    /// session waits for it (a re-entrant grant does not look at the waiters).
    pub(crate) fn try_lock_shared(&mut self, id: LockId, pid: i32) -> TryLock {
        let again = self
            .held
            .get(&id)
            .is_some_and(|h| h.count(pid, LockMode::Shared) > 0);
        if !again && self.waiting.is_waited(&id) {
            return TryLock::Refused;
        }
        self.try_mode(id, pid, LockMode::Shared)
    }

    fn try_mode(&mut self, id: LockId, pid: i32, mode: LockMode) -> TryLock {
        let holders = self.held.entry(id.clone()).or_default();
        if holders.conflicts(pid, mode) {
            if holders.is_empty() {
                self.held.remove(&id);
            }
            return TryLock::Refused;
        }
        let count = holders.count(pid, mode).saturating_add(1);
        holders.set_count(pid, mode, count);
        TryLock::Granted { count }
    }

    /// Decrements `pid`'s exclusive count on `id`.
    pub(crate) fn unlock(&mut self, id: &LockId, pid: i32) -> Unlock {
        self.unlock_mode(id, pid, LockMode::Exclusive)
    }

    /// Decrements `pid`'s shared count on `id`.
    pub(crate) fn unlock_shared(&mut self, id: &LockId, pid: i32) -> Unlock {
        self.unlock_mode(id, pid, LockMode::Shared)
    }

    fn unlock_mode(&mut self, id: &LockId, pid: i32, mode: LockMode) -> Unlock {
        let Some(holders) = self.held.get_mut(id) else {
            return Unlock::NotHeld;
        };
        let count = holders.count(pid, mode);
        if count == 0 {
            return Unlock::NotHeld;
        }
        let remaining = count - 1;
        holders.set_count(pid, mode, remaining);
        if holders.is_empty() {
            self.held.remove(id);
        }
        Unlock::Released { remaining }
    }

    /// Whether no session holds `id` in any mode.
    pub(crate) fn is_free(&self, id: &LockId) -> bool {
        !self.held.contains_key(id)
    }

    /// Queues `pid` behind the lock's current waiters.
    pub(crate) fn enqueue(&mut self, id: LockId, pid: i32) {
        self.waiting.enqueue(id, pid);
    }

    /// Takes `pid` out of the queue of `id`; false when it was not waiting there.
    pub(crate) fn cancel_wait(&mut self, id: &LockId, pid: i32) -> bool {
        self.waiting.cancel(id, pid)
    }

    /// Grants a lock `id` nobody holds to its first waiter, if any (exclusively: only
    /// `pg_advisory_lock` waits); returns that waiter.
    pub(crate) fn hand_over(&mut self, id: &LockId) -> Option<i32> {
        if self.held.contains_key(id) {
            return None;
        }
        let pid = self.waiting.pop_front(id)?;
        let mut holders = Holders::default();
        holders.set_count(pid, LockMode::Exclusive, 1);
        self.held.insert(id.clone(), holders);
        Some(pid)
    }

    /// Every waiting request, as `(lock, pid)` in lock order and queue order per lock.
    pub(crate) fn waiters(&self) -> Vec<(LockId, i32)> {
        self.waiting.all()
    }

    /// Frees every lock `pid` holds, in either mode, and returns them with the mode and the
    /// count each had, in lock order (the exclusive hold of a lock first); a request of `pid`
    /// still waiting leaves its queue.
    pub(crate) fn release_session(&mut self, pid: i32) -> Vec<(LockId, LockMode, u64)> {
        self.waiting.cancel_everywhere(pid);
        let mut released = Vec::new();
        for (id, holders) in &mut self.held {
            for mode in [LockMode::Exclusive, LockMode::Shared] {
                let count = holders.count(pid, mode);
                if count > 0 {
                    holders.set_count(pid, mode, 0);
                    released.push((id.clone(), mode, count));
                }
            }
        }
        self.held.retain(|_, holders| !holders.is_empty());
        released
    }

    /// Every granted lock, in [`LockId`] order (per lock the exclusive hold first, then the
    /// shared ones by pid).
    pub(crate) fn held(&self) -> Vec<HeldLock> {
        self.held
            .iter()
            .flat_map(|(id, holders)| {
                holders.all().map(|(pid, count, mode)| HeldLock {
                    id: id.clone(),
                    pid,
                    count,
                    mode,
                })
            })
            .collect()
    }

    /// The locks `pid` holds with their counts, in [`LockId`] order (a lock held in both
    /// modes twice, the exclusive hold first).
    pub(crate) fn held_by(&self, pid: i32) -> Vec<(LockId, u64)> {
        self.held()
            .into_iter()
            .filter(|held| held.pid == pid)
            .map(|held| (held.id, held.count))
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
            vec![
                (id("db", LEADER), LockMode::Exclusive, 2),
                (id("db", LockKey::BigInt(7)), LockMode::Exclusive, 1)
            ]
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

    #[test]
    fn shared_holds_coexist_and_an_exclusive_one_needs_every_other_session_gone() {
        let mut table = LockTable::default();
        let member = id("db", LockKey::Pair(7, -1));
        assert_eq!(
            table.try_lock_shared(member.clone(), 1),
            TryLock::Granted { count: 1 }
        );
        assert_eq!(
            table.try_lock_shared(member.clone(), 2),
            TryLock::Granted { count: 1 }
        );
        assert_eq!(table.try_lock(member.clone(), 3), TryLock::Refused);
        assert_eq!(table.try_lock(member.clone(), 1), TryLock::Refused);
        assert_eq!(table.unlock(&member, 2), Unlock::NotHeld, "wrong mode");
        assert_eq!(
            table.unlock_shared(&member, 2),
            Unlock::Released { remaining: 0 }
        );
        assert_eq!(
            table.try_lock(member.clone(), 1),
            TryLock::Granted { count: 1 },
            "a session's own shared hold does not conflict"
        );
        assert_eq!(table.try_lock_shared(member.clone(), 2), TryLock::Refused);
        let modes: Vec<(i32, LockMode)> = table.held().iter().map(|h| (h.pid, h.mode)).collect();
        assert_eq!(modes, [(1, LockMode::Exclusive), (1, LockMode::Shared)]);
        assert_eq!(
            table.release_session(1),
            vec![
                (member.clone(), LockMode::Exclusive, 1),
                (member.clone(), LockMode::Shared, 1)
            ]
        );
        assert!(table.is_free(&member));
    }

    #[test]
    fn a_queued_exclusive_wait_refuses_new_shared_tries_and_gets_the_lock_last() {
        let mut table = LockTable::default();
        let key = id("db", LockKey::BigInt(9));
        table.try_lock_shared(key.clone(), 1);
        table.enqueue(key.clone(), 2);
        assert_eq!(table.try_lock_shared(key.clone(), 3), TryLock::Refused);
        assert_eq!(
            table.try_lock_shared(key.clone(), 1),
            TryLock::Granted { count: 2 },
            "re-entrant"
        );
        table.unlock_shared(&key, 1);
        assert_eq!(table.hand_over(&key), None, "still held shared");
        table.unlock_shared(&key, 1);
        assert_eq!(table.hand_over(&key), Some(2));
    }
}
