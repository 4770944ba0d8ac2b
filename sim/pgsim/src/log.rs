//! The ground-truth log of one simulated server, and a mutual-exclusion check over it.
//!
//! The server appends an entry for every session start and end, every lock grant and
//! every release, every fencing epoch advance, every fence check and commit of a fenced
//! transaction, and every lease claim, renewal and release, with the simulated time ([`turmoil::sim_elapsed`]) at which it happened.
//! A checker replays it with [`check_mutual_exclusion`].

use std::collections::BTreeMap;
use std::time::Duration;

use super::locks::{LockId, LockKey, LockMode};
use super::rows::RowId;

/// One event of the ground-truth log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogEntry {
    /// Simulated time since the start of the simulation.
    pub at: Duration,
    /// What happened.
    pub event: Event,
}

/// Something the server did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The server started accepting connections (first start or restart).
    ServerStarted,
    /// The server crashed: every session and lock is gone; it accepts nothing until restarted.
    ServerCrashed,
    /// A session completed its startup and got a backend pid.
    SessionStarted {
        /// Backend pid.
        pid: i32,
        /// Database named in the startup message.
        database: String,
        /// User named in the startup message.
        user: String,
        /// `application_name` from the startup message (empty when absent).
        application_name: String,
    },
    /// A session ended; its locks were released just before (with the same reason).
    SessionEnded {
        /// Backend pid.
        pid: i32,
        /// The session's database.
        database: String,
        /// Why it ended.
        reason: EndReason,
    },
    /// A lock was granted (first grant or a re-entrant one).
    LockGranted {
        /// Backend pid of the session it was granted to.
        pid: i32,
        /// The lock.
        lock: LockId,
        /// The session's count in `mode` after the grant; 1 means the session did not hold
        /// it in that mode before (for an exclusive grant: the lock was free before).
        count: u64,
        /// The mode granted.
        mode: LockMode,
    },
    /// A queued `pg_advisory_lock` was granted in the instant its `lock_timeout` expired
    /// (PostgreSQL's grant-at-timeout race): the statement failed with 55P03 all the same,
    /// and the session holds the lock, whose [`Event::LockGranted`] came just before. A
    /// session-level lock outlives the failed statement; the client must release it.
    GrantedAtLockTimeout {
        /// Backend pid of the session that holds the lock and got 55P03.
        pid: i32,
        /// The lock.
        lock: LockId,
    },
    /// A session's count on a lock went down.
    LockReleased {
        /// Backend pid of the holding session.
        pid: i32,
        /// The lock.
        lock: LockId,
        /// The count left in `mode`; 0 means the session's hold ended (for an exclusive
        /// hold: the lock is free now).
        remaining: u64,
        /// Why.
        reason: ReleaseReason,
        /// The mode of the hold.
        mode: LockMode,
    },
    /// A fencing epoch advance (the fence table's upsert) committed.
    EpochAdvanced {
        /// Backend pid of the session that ran it.
        pid: i32,
        /// The fence row.
        row: RowId,
        /// The epoch it committed.
        epoch: i64,
        /// How long it waited for other sessions' share locks on the row (zero if it did not).
        waited: Duration,
    },
    /// A transaction block read a fence row `FOR SHARE`: a fenced transaction's check. Only
    /// the first such read of a block is logged.
    FenceChecked {
        /// Backend pid.
        pid: i32,
        /// The fence row.
        row: RowId,
        /// The epoch read.
        epoch: i64,
    },
    /// A lease claim (`plexsphere_leader::sql::lease::claim`) took the lease row for its
    /// holder; the fence advance of the same statement follows as [`Event::EpochAdvanced`].
    LeaseClaimed {
        /// Backend pid of the session that ran it.
        pid: i32,
        /// The lease row.
        row: RowId,
        /// The holder it names now.
        holder: String,
        /// When the lease expires, on the simulated clock (the server's clock minus its base).
        expires: Duration,
    },
    /// A renewal (`lease::renew`) extended its holder's lease.
    LeaseRenewed {
        /// Backend pid of the session that ran it.
        pid: i32,
        /// The lease row.
        row: RowId,
        /// The holder it names.
        holder: String,
        /// The new expiry, on the simulated clock.
        expires: Duration,
    },
    /// A release (`lease::release`) expired its holder's lease at once.
    LeaseReleased {
        /// Backend pid of the session that ran it.
        pid: i32,
        /// The lease row.
        row: RowId,
        /// The holder it named.
        holder: String,
    },
    /// A member of lease shard space `class` joined (`shard_sql::lease::register`) or
    /// renewed its unexpired row (`renew`): it is live until `expires`.
    MemberLive {
        /// Backend pid of the session that ran it.
        pid: i32,
        /// The space.
        class: i32,
        /// The member's id (from the members' sequence).
        member: i32,
        /// Its holder (identity and nonce).
        holder: String,
        /// When its lease expires, on the simulated clock.
        expires: Duration,
        /// A registration (else a renewal).
        joined: bool,
    },
    /// A member's row was deleted: by its own leave, or by a take's reap once it expired.
    MemberGone {
        /// Backend pid of the session that ran it.
        pid: i32,
        /// The space.
        class: i32,
        /// The member.
        member: i32,
        /// Reaped by a take (else its own leave).
        reaped: bool,
    },
    /// A take owned shard `shard` for `member`; its fence advance follows as
    /// [`Event::EpochAdvanced`].
    ShardOwned {
        /// Backend pid of the session that ran it.
        pid: i32,
        /// The space.
        class: i32,
        /// The new owner.
        member: i32,
        /// The shard.
        shard: u32,
    },
    /// Shard `shard`'s owner row was freed: its member's release or leave, or a take's reap.
    ShardFreed {
        /// Backend pid of the session that ran it.
        pid: i32,
        /// The space.
        class: i32,
        /// The member that owned it.
        member: i32,
        /// The shard.
        shard: u32,
    },
    /// A transaction block that had checked a fence row committed.
    FencedCommit {
        /// Backend pid.
        pid: i32,
        /// The fence row.
        row: RowId,
        /// The epoch its check read.
        epoch: i64,
        /// When its check ran (its [`Event::FenceChecked`]).
        checked_at: Duration,
        /// The row's committed epoch at the commit; `None` when the row is gone.
        current: Option<i64>,
    },
}

/// Why a session ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EndReason {
    /// The client sent Terminate (`X`).
    ClientTerminate,
    /// The client closed the socket (EOF, a FIN) without Terminate.
    ClientClosed,
    /// Reading or writing the socket failed (for example a reset).
    ConnectionError,
    /// The client sent something the protocol forbids; the server sent FATAL 08P01.
    ProtocolViolation,
    /// `idle_session_timeout` expired; the server sent FATAL 57P05.
    IdleSessionTimeout,
    /// `idle_in_transaction_session_timeout` expired in an open transaction block; the
    /// server sent FATAL 25P03.
    IdleInTransactionSessionTimeout,
    /// [`ServerHandle::terminate_backend`](super::ServerHandle::terminate_backend); the
    /// server sent FATAL 57P01.
    Terminated,
    /// The server crashed; nothing was sent.
    Crash,
}

/// Why a lock's count went down.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ReleaseReason {
    /// `pg_advisory_unlock` (one count).
    Unlock,
    /// `pg_advisory_unlock_all()` (every count).
    UnlockAll,
    /// The session ended (every count).
    SessionEnd(EndReason),
}

/// An inconsistency found by [`check_mutual_exclusion`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LogViolation {
    /// A lock was granted to a session while another session held it in a conflicting mode
    /// (exclusive against anything; shared against exclusive).
    #[error(
        "at {at:?}: lock {key:?} in {database:?} granted to pid {intruder} while pid {holder} held it"
    )]
    DoubleGrant {
        /// When.
        at: Duration,
        /// The lock's database.
        database: String,
        /// The lock's key.
        key: LockKey,
        /// The session that held it.
        holder: i32,
        /// The session it was granted to as well.
        intruder: i32,
    },
    /// A release by a session that did not hold the lock, or with a wrong count.
    #[error("at {at:?}: pid {pid} released {key:?} in {database:?} it did not hold that way")]
    BadRelease {
        /// When.
        at: Duration,
        /// The lock's database.
        database: String,
        /// The lock's key.
        key: LockKey,
        /// The releasing session.
        pid: i32,
    },
    /// An entry is stamped earlier than the one before it.
    #[error("entry {index} at {at:?} is earlier than the entry before it")]
    TimeWentBackwards {
        /// Index of the entry in the log.
        index: usize,
        /// Its time.
        at: Duration,
    },
}

/// Replays `log` and checks that no lock was ever held by two sessions at once in conflicting
/// modes (an exclusive hold beside any other session's hold), that every release matches a
/// grant, and that time never goes backwards.
pub fn check_mutual_exclusion(log: &[LogEntry]) -> Result<(), LogViolation> {
    let mut holders: BTreeMap<&LockId, Holds> = BTreeMap::new();
    let mut last = Duration::ZERO;
    for (index, entry) in log.iter().enumerate() {
        if entry.at < last {
            return Err(LogViolation::TimeWentBackwards {
                index,
                at: entry.at,
            });
        }
        last = entry.at;
        match &entry.event {
            Event::LockGranted {
                pid,
                lock,
                count,
                mode,
            } => {
                grant(&mut holders, entry.at, *pid, lock, *count, *mode)?;
            }
            Event::LockReleased {
                pid,
                lock,
                remaining,
                mode,
                ..
            } => release(&mut holders, entry.at, *pid, lock, *remaining, *mode)?,
            Event::ServerCrashed => holders.clear(),
            _ => {}
        }
    }
    Ok(())
}

/// The holds of one lock during the replay: (pid, mode) → count.
type Holds = BTreeMap<(i32, LockMode), u64>;

fn grant<'a>(
    holders: &mut BTreeMap<&'a LockId, Holds>,
    at: Duration,
    pid: i32,
    lock: &'a LockId,
    count: u64,
    mode: LockMode,
) -> Result<(), LogViolation> {
    let holds = holders.entry(lock).or_default();
    let conflict = holds.keys().find(|&&(holder, held)| {
        holder != pid && (mode == LockMode::Exclusive || held == LockMode::Exclusive)
    });
    if let Some(&(holder, _)) = conflict {
        return Err(LogViolation::DoubleGrant {
            at,
            database: lock.database.clone(),
            key: lock.key,
            holder,
            intruder: pid,
        });
    }
    holds.insert((pid, mode), count);
    Ok(())
}

fn release(
    holders: &mut BTreeMap<&LockId, Holds>,
    at: Duration,
    pid: i32,
    lock: &LockId,
    remaining: u64,
    mode: LockMode,
) -> Result<(), LogViolation> {
    let held = holders
        .get(lock)
        .and_then(|holds| holds.get(&(pid, mode)))
        .copied();
    match (held, holders.get_mut(lock)) {
        (Some(count), Some(holds)) if remaining < count => {
            if remaining == 0 {
                holds.remove(&(pid, mode));
            } else {
                holds.insert((pid, mode), remaining);
            }
            if holds.is_empty() {
                holders.remove(lock);
            }
            Ok(())
        }
        _ => Err(LogViolation::BadRelease {
            at,
            database: lock.database.clone(),
            key: lock.key,
            pid,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lock() -> LockId {
        LockId {
            database: "db".to_owned(),
            key: LockKey::Pair(1, 2),
        }
    }

    fn at(ms: u64, event: Event) -> LogEntry {
        LogEntry {
            at: Duration::from_millis(ms),
            event,
        }
    }

    fn granted(pid: i32, count: u64) -> Event {
        Event::LockGranted {
            pid,
            lock: lock(),
            count,
            mode: LockMode::Exclusive,
        }
    }

    fn shared(pid: i32, count: u64) -> Event {
        Event::LockGranted {
            pid,
            lock: lock(),
            count,
            mode: LockMode::Shared,
        }
    }

    fn released(pid: i32, remaining: u64) -> Event {
        Event::LockReleased {
            pid,
            lock: lock(),
            remaining,
            reason: ReleaseReason::Unlock,
            mode: LockMode::Exclusive,
        }
    }

    fn released_shared(pid: i32, remaining: u64) -> Event {
        Event::LockReleased {
            pid,
            lock: lock(),
            remaining,
            reason: ReleaseReason::Unlock,
            mode: LockMode::Shared,
        }
    }

    #[test]
    fn shared_holds_coexist_and_exclude_an_exclusive_grant_until_the_last_goes() {
        let log = [
            at(1, shared(1, 1)),
            at(2, shared(2, 1)),
            at(3, shared(1, 2)),
            at(4, released_shared(1, 1)),
            at(5, released_shared(1, 0)),
            at(6, granted(3, 1)),
        ];
        assert!(matches!(
            check_mutual_exclusion(&log),
            Err(LogViolation::DoubleGrant {
                holder: 2,
                intruder: 3,
                ..
            })
        ));
        let log = [
            at(1, shared(1, 1)),
            at(2, shared(2, 1)),
            at(3, released_shared(2, 0)),
            at(4, granted(1, 1)),
            at(5, released(1, 0)),
            at(5, released_shared(1, 0)),
            at(6, granted(3, 1)),
        ];
        assert_eq!(
            check_mutual_exclusion(&log),
            Ok(()),
            "a session's own holds"
        );
    }

    #[test]
    fn a_shared_grant_beside_an_exclusive_holder_is_a_double_grant() {
        let log = [at(1, granted(1, 1)), at(2, shared(2, 1))];
        assert!(matches!(
            check_mutual_exclusion(&log),
            Err(LogViolation::DoubleGrant {
                holder: 1,
                intruder: 2,
                ..
            })
        ));
        let log = [at(1, shared(1, 1)), at(2, released(1, 0))];
        assert!(
            matches!(
                check_mutual_exclusion(&log),
                Err(LogViolation::BadRelease { pid: 1, .. })
            ),
            "a release in the wrong mode"
        );
    }

    #[test]
    fn handover_after_release_is_accepted() {
        let log = [
            at(1, granted(1, 1)),
            at(2, granted(1, 2)),
            at(3, released(1, 1)),
            at(4, released(1, 0)),
            at(4, granted(2, 1)),
        ];
        assert_eq!(check_mutual_exclusion(&log), Ok(()));
    }

    #[test]
    fn grant_to_second_session_while_held_is_a_double_grant() {
        let log = [
            at(1, granted(1, 1)),
            at(2, granted(1, 2)),
            at(3, released(1, 1)),
            at(5, granted(2, 1)),
        ];
        assert_eq!(
            check_mutual_exclusion(&log),
            Err(LogViolation::DoubleGrant {
                at: Duration::from_millis(5),
                database: "db".to_owned(),
                key: LockKey::Pair(1, 2),
                holder: 1,
                intruder: 2,
            })
        );
    }

    #[test]
    fn release_by_non_holder_is_a_bad_release() {
        let log = [at(1, granted(1, 1)), at(2, released(2, 0))];
        assert!(matches!(
            check_mutual_exclusion(&log),
            Err(LogViolation::BadRelease { pid: 2, .. })
        ));
    }

    #[test]
    fn crash_frees_everything() {
        let log = [
            at(1, granted(1, 1)),
            at(2, Event::ServerCrashed),
            at(3, granted(2, 1)),
        ];
        assert_eq!(check_mutual_exclusion(&log), Ok(()));
    }

    #[test]
    fn time_going_backwards_is_reported() {
        let log = [at(5, granted(1, 1)), at(4, released(1, 0))];
        assert_eq!(
            check_mutual_exclusion(&log),
            Err(LogViolation::TimeWentBackwards {
                index: 1,
                at: Duration::from_millis(4),
            })
        );
    }
}
