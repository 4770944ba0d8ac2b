//! Row locks on the fence table, modelled on PostgreSQL's tuple locks for the two lockers the
//! fencing statements are.
//!
//! - `SELECT … FOR SHARE` takes a share lock on each row it returns, held until the
//!   transaction ends (`COMMIT`, `ROLLBACK`, the end of an implicit transaction, the session's
//!   end). Share locks never wait here: PostgreSQL grants one at once when the row is only
//!   share-locked, even while an update waits for it (so a stream of share lockers can starve
//!   an update, as in PostgreSQL).
//! - The epoch advance's `ON CONFLICT DO UPDATE` must wait while another session holds a share
//!   lock on the row ([`RowLocks::others_share`]); it queues ([`RowLocks::enqueue`]) and may
//!   go on once no other session share-locks the row ([`RowLocks::release`] hands back the
//!   waiters that may). The update itself commits at once in the model, so it never holds a
//!   lock another statement could see.
//!
//! Pure data: no I/O, no clock. Row locks belong to one instance: a synchronous standby shares
//! the committed rows, never the locks, as in PostgreSQL.

use std::collections::{BTreeMap, BTreeSet};

use super::queues::WaitQueues;

/// One row of a table: a fence table's row is named by its `(classid, objid)` key.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RowId {
    /// The database of the table.
    pub database: String,
    /// The table's (lowercased) name.
    pub table: String,
    /// The row's primary key.
    pub key: (i32, i32),
}

/// The row locks of one server instance.
#[derive(Debug, Default)]
pub(crate) struct RowLocks {
    /// The sessions holding a share lock on each row; never empty for a row present.
    shared: BTreeMap<RowId, BTreeSet<i32>>,
    /// Sessions whose update waits for a row, oldest first.
    waiting: WaitQueues<RowId>,
}

impl RowLocks {
    /// `pid` share-locks `row` (again, if it already does).
    pub(crate) fn share(&mut self, row: RowId, pid: i32) {
        self.shared.entry(row).or_default().insert(pid);
    }

    /// Whether a session other than `pid` holds a share lock on `row`: an update by `pid`
    /// must wait.
    pub(crate) fn others_share(&self, row: &RowId, pid: i32) -> bool {
        others_share(&self.shared, row, pid)
    }

    /// Queues `pid`'s update behind the row's other waiters.
    pub(crate) fn enqueue(&mut self, row: RowId, pid: i32) {
        self.waiting.enqueue(row, pid);
    }

    /// Takes `pid` out of the queue of `row`; false when it was not waiting there.
    pub(crate) fn cancel_wait(&mut self, row: &RowId, pid: i32) -> bool {
        self.waiting.cancel(row, pid)
    }

    /// Ends `pid`'s share locks (its transaction ended) and takes its own waits out of every
    /// queue; returns the waiters that may go on now, as `(row, pid)` in row and queue order,
    /// and takes them out of their queues.
    pub(crate) fn release(&mut self, pid: i32) -> Vec<(RowId, i32)> {
        self.shared.retain(|_, holders| {
            holders.remove(&pid);
            !holders.is_empty()
        });
        self.waiting.cancel_everywhere(pid);
        self.wakeable()
    }

    /// The waiters no other session blocks any more, taken out of their queues.
    fn wakeable(&mut self) -> Vec<(RowId, i32)> {
        let shared = &self.shared;
        self.waiting
            .take_where(|row, waiter| !others_share(shared, row, waiter))
    }

    /// Every share lock, as `(row, pid)` in row and pid order.
    pub(crate) fn shared(&self) -> Vec<(RowId, i32)> {
        self.shared
            .iter()
            .flat_map(|(row, holders)| holders.iter().map(move |&pid| (row.clone(), pid)))
            .collect()
    }

    /// Every waiting update, as `(row, pid)` in row and queue order.
    pub(crate) fn waiters(&self) -> Vec<(RowId, i32)> {
        self.waiting.all()
    }
}

/// Whether a session other than `pid` holds a share lock on `row` in `shared`.
fn others_share(shared: &BTreeMap<RowId, BTreeSet<i32>>, row: &RowId, pid: i32) -> bool {
    shared
        .get(row)
        .is_some_and(|holders| holders.iter().any(|&holder| holder != pid))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(key: i32) -> RowId {
        RowId {
            database: "db".to_owned(),
            table: "plexsphere_leader_fence".to_owned(),
            key: (1_886_156_915, key),
        }
    }

    #[test]
    fn an_update_waits_only_for_other_sessions_share_locks() {
        let mut locks = RowLocks::default();
        locks.share(row(1), 1);
        assert!(locks.others_share(&row(1), 2));
        assert!(!locks.others_share(&row(1), 1), "its own lock");
        assert!(!locks.others_share(&row(2), 2), "another row");
    }

    #[test]
    fn a_waiter_goes_on_once_every_other_share_lock_ended() {
        let mut locks = RowLocks::default();
        locks.share(row(1), 1);
        locks.share(row(1), 3);
        locks.enqueue(row(1), 2);
        assert_eq!(locks.release(1), vec![], "3 still shares the row");
        assert_eq!(locks.waiters(), vec![(row(1), 2)]);
        assert_eq!(locks.release(3), vec![(row(1), 2)]);
        assert_eq!(locks.waiters(), vec![]);
        assert_eq!(locks.shared(), vec![]);
    }

    #[test]
    fn a_share_lock_is_granted_while_an_update_waits() {
        let mut locks = RowLocks::default();
        locks.share(row(1), 1);
        locks.enqueue(row(1), 2);
        locks.share(row(1), 3);
        assert_eq!(locks.shared(), vec![(row(1), 1), (row(1), 3)]);
        assert_eq!(locks.release(1), vec![]);
        assert_eq!(locks.shared(), vec![(row(1), 3)]);
    }

    #[test]
    fn an_ended_waiter_leaves_the_queue_and_a_cancelled_one_is_not_woken() {
        let mut locks = RowLocks::default();
        locks.share(row(1), 1);
        locks.enqueue(row(1), 2);
        locks.enqueue(row(1), 3);
        assert!(locks.cancel_wait(&row(1), 2));
        assert!(!locks.cancel_wait(&row(1), 2));
        assert_eq!(locks.release(3), vec![], "3 left the queue; 1 still shares");
        assert_eq!(locks.release(1), vec![]);
        assert_eq!(locks.waiters(), vec![]);
    }
}
