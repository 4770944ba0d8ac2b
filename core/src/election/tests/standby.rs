//! The standby's check and the grant: exact actions per input.

use super::*;
use crate::proof::{PoolProof, SecondSession, Unproven};

// ---- start ----

#[test]
fn start_checks_at_once_by_asking_for_a_connection() {
    let mut f = Fixture::new();
    assert_eq!(f.election.start(f.t0), Ok(()));
    assert_eq!(f.drain(), vec![A::AcquireConnection { conn: C1 }]);
    assert_eq!(f.election.phase(), Phase::Acquiring);
    assert_eq!(f.election.poll_timeout(), Some(f.at(IMS)));
    assert_eq!(f.election.timeout_reason(), Some(Timer::AcquireDeadline));
}

#[test]
fn a_second_start_while_running_is_refused_and_changes_nothing() {
    let mut f = Fixture::started();
    assert_eq!(f.election.start(f.at(1)), Err(AlreadyRunning));
    assert_eq!(f.drain(), vec![]);
    assert_eq!(f.election.phase(), Phase::Acquiring);
}

// ---- standby check ----

#[test]
fn an_acquired_connection_tries_the_lock() {
    let mut f = Fixture::started();
    assert_eq!(
        f.event(3, E::ConnectionAcquired { conn: C1 }),
        Handled::Applied
    );
    assert_eq!(f.drain(), vec![A::TryLock { conn: C1 }]);
    assert_eq!(f.election.timeout_reason(), Some(Timer::TryLockDeadline));
    assert_eq!(f.election.poll_timeout(), Some(f.at(3 + IMS)));
}

#[test]
fn a_refused_lock_returns_the_connection_unchanged_and_waits_for_the_next_check() {
    let mut f = Fixture::started();
    f.event(3, E::ConnectionAcquired { conn: C1 });
    f.drain();
    f.event(4, E::LockRefused { conn: C1 });
    assert_eq!(f.drain(), vec![A::ReturnToPool { conn: C1 }]);
    assert!(!f.election.is_leader());
    assert_eq!(f.election.timeout_reason(), Some(Timer::NextCheck));
    assert_eq!(f.election.poll_timeout(), Some(f.at(IMS)));
}

#[test]
fn a_granted_lock_hijacks_the_connection_begins_a_term_and_logs() {
    let mut f = Fixture::started();
    f.event(3, E::ConnectionAcquired { conn: C1 });
    f.drain();
    f.event(
        4,
        E::LockGranted {
            conn: C1,
            backend_pid: PID,
        },
    );
    assert_eq!(
        f.drain(),
        vec![
            A::Hijack {
                conn: C1,
                backend_pid: PID
            },
            A::BeginTerm {
                term: T1,
                epoch: None
            },
            log(LogKind::LeadershipAcquired, Some(T1), None),
        ]
    );
    assert!(f.election.is_leader());
    assert_eq!(f.election.term(), Some(T1));
    assert_eq!(f.election.poll_timeout(), Some(f.at(IMS)));
}

#[test]
fn a_failed_acquire_warns_with_the_spec_text_and_stays_standby() {
    let mut f = Fixture::started();
    f.event(
        3,
        E::AcquireFailed {
            conn: C1,
            cause: "connection refused",
        },
    );
    let actions = f.drain();
    let record = log(
        LogKind::AcquireFailed,
        None,
        Some(Cause::Error("connection refused")),
    );
    assert_eq!(actions, vec![record.clone()]);
    let A::Log(record) = record else {
        unreachable!()
    };
    assert_eq!(record.level(), Level::Warn);
    assert_eq!(
        record.to_string(),
        "leader: acquire lock connection: connection refused"
    );
    assert_eq!(f.election.phase(), Phase::StandbyWaiting);
    assert_eq!(f.election.poll_timeout(), Some(f.at(IMS)));
}

#[test]
fn an_acquire_without_answer_within_one_interval_is_abandoned_and_warned() {
    let mut f = Fixture::started();
    f.timeout(IMS - 1);
    assert_eq!(f.drain(), vec![]);
    f.timeout(IMS);
    assert_eq!(
        f.drain(),
        vec![
            // Nothing ran on it: whatever the acquire produces goes back to the pool.
            A::ReturnToPool { conn: C1 },
            log(LogKind::AcquireFailed, None, Some(Cause::TimedOut(I))),
            // The next check falls due on the same instant, so it begins at once.
            A::AcquireConnection { conn: C2 },
        ]
    );
    assert_eq!(
        f.event(IMS + 1, E::ConnectionAcquired { conn: C1 }),
        Handled::Ignored(Ignored::StaleConnection)
    );
}

#[test]
fn a_failed_grant_statement_discards_the_connection_instead_of_returning_it() {
    let mut f = Fixture::started();
    f.event(3, E::ConnectionAcquired { conn: C1 });
    f.drain();
    f.event(
        4,
        E::LockQueryFailed {
            conn: C1,
            cause: "broken pipe",
        },
    );
    assert_eq!(
        f.drain(),
        vec![
            A::CloseConnection { conn: C1 },
            log(
                LogKind::AcquireFailed,
                None,
                Some(Cause::Error("broken pipe"))
            ),
        ]
    );
    assert!(!f.election.is_leader());
}

#[test]
fn a_grant_statement_that_did_not_try_the_lock_returns_the_connection_to_the_pool() {
    // A read-only session, or a server in recovery: the statement answered and holds nothing.
    let mut f = Fixture::started();
    f.event(3, E::ConnectionAcquired { conn: C1 });
    f.drain();
    f.event(
        4,
        E::LockNotTried {
            conn: C1,
            cause: "read-only session",
        },
    );
    assert_eq!(
        f.drain(),
        vec![
            A::ReturnToPool { conn: C1 },
            log(
                LogKind::AcquireFailed,
                None,
                Some(Cause::Error("read-only session"))
            ),
        ]
    );
    assert_eq!(f.election.phase(), Phase::StandbyWaiting);
    assert!(!f.election.is_leader());
}

#[test]
fn an_unanswered_grant_statement_is_discarded_after_one_interval() {
    let mut f = Fixture::started();
    f.event(3, E::ConnectionAcquired { conn: C1 });
    f.drain();
    f.timeout(3 + IMS - 1);
    assert_eq!(f.drain(), vec![]);
    f.timeout(3 + IMS);
    assert_eq!(
        f.drain(),
        vec![
            A::CloseConnection { conn: C1 },
            log(LogKind::AcquireFailed, None, Some(Cause::TimedOut(I))),
            // The check overran its next grid time (t0 + I): that check runs at once.
            A::AcquireConnection { conn: C2 },
        ]
    );
    assert_eq!(
        f.event(
            3 + IMS,
            E::LockGranted {
                conn: C1,
                backend_pid: PID
            }
        ),
        Handled::Ignored(Ignored::StaleConnection)
    );
    assert!(!f.election.is_leader());
    // ... and the one after it is back on the grid.
    f.event(3 + IMS + 1, E::ConnectionAcquired { conn: C2 });
    f.event(3 + IMS + 2, E::LockRefused { conn: C2 });
    f.drain();
    assert_eq!(f.election.poll_timeout(), Some(f.at(2 * IMS)));
}

#[test]
fn timed_out_checks_repeat_every_interval_not_every_other() {
    // Each check starts a little after its grid time (a late wake-up) and never gets an answer:
    // its timeout ends just after the next grid time, which is then due at once.
    let mut f = Fixture::started();
    let mut warnings = Vec::new();
    for k in 1..=4u64 {
        f.timeout(k * IMS + 10 * k);
        warnings.extend(
            f.drain()
                .into_iter()
                .filter(|a| matches!(a, A::Log(_)))
                .map(|_| k),
        );
    }
    assert_eq!(
        warnings,
        vec![1, 2, 3, 4],
        "one timed-out check per interval"
    );
}

#[test]
fn a_refused_standby_checks_again_on_a_fixed_cadence() {
    let mut f = Fixture::started();
    for k in 1..=3u64 {
        let conn = ConnId::new(k);
        f.event((k - 1) * IMS + 7, E::ConnectionAcquired { conn });
        f.event((k - 1) * IMS + 9, E::LockRefused { conn });
        f.drain();
        f.timeout(k * IMS);
        assert_eq!(
            f.drain(),
            vec![A::AcquireConnection {
                conn: ConnId::new(k + 1)
            }]
        );
    }
}

#[test]
fn missed_checks_are_skipped_after_a_pause_without_a_burst() {
    let mut f = Fixture::started();
    f.event(1, E::ConnectionAcquired { conn: C1 });
    f.event(2, E::LockRefused { conn: C1 });
    f.drain();
    let late = 7 * IMS + 2_500;
    f.timeout(late);
    assert_eq!(f.drain(), vec![A::AcquireConnection { conn: C2 }]);
    f.event(late + 1, E::ConnectionAcquired { conn: C2 });
    f.event(late + 2, E::LockRefused { conn: C2 });
    f.drain();
    assert_eq!(f.election.poll_timeout(), Some(f.at(8 * IMS)));
}

// ---- beyond the spec: queued acquire ----

#[test]
fn a_queued_standby_waits_for_the_lock_under_a_lock_timeout_of_one_interval() {
    let options = spec_options().acquire(AcquireMode::Queue);
    let mut f = Fixture::started_with(options);
    f.event(1, E::ConnectionAcquired { conn: C1 });
    assert_eq!(
        f.drain(),
        vec![A::WaitForLock {
            conn: C1,
            lock_timeout_ms: 5_000
        }]
    );
    // The client gives the server's lock_timeout one more interval to answer.
    assert_eq!(f.election.poll_timeout(), Some(f.at(1 + 2 * IMS)));
    // The server's lock_timeout ended the wait: the session may hold the lock anyway, so it is
    // released if held on the same session before the connection goes back.
    f.event(IMS + 2, E::LockWaitTimedOut { conn: C1 });
    assert_eq!(f.drain(), vec![A::ReleaseIfHeld { conn: C1 }]);
    assert_eq!(f.election.phase(), Phase::TryingLock);
    assert_eq!(f.election.poll_timeout(), Some(f.at(1 + 2 * IMS)));
    f.event(
        IMS + 3,
        E::ReleasedIfHeld {
            conn: C1,
            released: false,
        },
    );
    assert_eq!(f.drain(), vec![A::ReturnToPool { conn: C1 }]);
    // The next check is already due, so it queues again.
    assert_eq!(f.election.poll_timeout(), Some(f.at(IMS + 3)));
    f.timeout(IMS + 3);
    assert_eq!(f.drain(), vec![A::AcquireConnection { conn: C2 }]);
}

/// Fixture: a queued standby whose wait on conn 1 the server's lock_timeout just ended.
fn queued_wait_timed_out() -> Fixture {
    let mut f = Fixture::started_with(spec_options().acquire(AcquireMode::Queue));
    f.event(1, E::ConnectionAcquired { conn: C1 });
    f.event(IMS + 1, E::LockWaitTimedOut { conn: C1 });
    assert_eq!(f.drain()[1..], [A::ReleaseIfHeld { conn: C1 }]);
    f
}

#[test]
fn a_lock_granted_as_its_wait_timed_out_is_released_with_a_note_then_returned() {
    let mut f = queued_wait_timed_out();
    f.event(
        IMS + 2,
        E::ReleasedIfHeld {
            conn: C1,
            released: true,
        },
    );
    assert_eq!(
        f.drain(),
        vec![
            log(LogKind::GrantReleasedAfterWaitTimeout, None, None),
            A::ReturnToPool { conn: C1 },
        ]
    );
    assert!(!f.election.is_leader());
    assert_eq!(LogKind::GrantReleasedAfterWaitTimeout.level(), Level::Info);
}

#[test]
fn a_failed_release_after_a_timed_out_wait_closes_the_connection_of_unknown_state() {
    let mut f = queued_wait_timed_out();
    f.event(
        IMS + 2,
        E::LockQueryFailed {
            conn: C1,
            cause: "connection reset",
        },
    );
    assert_eq!(
        f.drain(),
        vec![
            A::CloseConnection { conn: C1 },
            log(
                LogKind::AcquireFailed,
                None,
                Some(Cause::Error("connection reset"))
            ),
        ]
    );
}

#[test]
fn a_release_after_a_timed_out_wait_that_never_answers_closes_at_the_grant_budget() {
    let mut f = queued_wait_timed_out();
    f.timeout(1 + 2 * IMS - 1);
    assert_eq!(f.drain(), vec![]);
    f.timeout(1 + 2 * IMS);
    let actions = f.drain();
    assert_eq!(actions[0], A::CloseConnection { conn: C1 });
    assert!(matches!(
        &actions[1],
        A::Log(LogRecord {
            kind: LogKind::AcquireFailed,
            cause: Some(Cause::TimedOut(_)),
            ..
        })
    ));
}

#[test]
fn only_a_queued_wait_answers_with_a_timeout_and_only_the_release_with_its_result() {
    // The release's answer is not an answer to the grant statement.
    let mut f = Fixture::started();
    f.event(1, E::ConnectionAcquired { conn: C1 });
    f.drain();
    assert_eq!(
        f.event(
            2,
            E::ReleasedIfHeld {
                conn: C1,
                released: true
            }
        ),
        Handled::Ignored(Ignored::Unexpected)
    );
    // While the release runs, a late grant answer is not taken.
    let mut f = queued_wait_timed_out();
    assert_eq!(
        f.event(
            IMS + 2,
            E::LockGranted {
                conn: C1,
                backend_pid: PID
            }
        ),
        Handled::Ignored(Ignored::Unexpected)
    );
    assert_eq!(f.drain(), vec![]);
}

#[test]
fn a_queued_grant_that_never_answers_is_abandoned_after_its_budget() {
    let options = spec_options().acquire(AcquireMode::Queue);
    let mut f = Fixture::started_with(options);
    f.event(1, E::ConnectionAcquired { conn: C1 });
    f.drain();
    f.timeout(1 + 2 * IMS);
    assert_eq!(
        f.drain(),
        vec![
            A::CloseConnection { conn: C1 },
            log(LogKind::AcquireFailed, None, Some(Cause::TimedOut(2 * I))),
            A::AcquireConnection { conn: C2 }
        ]
    );
}

// ---- beyond the spec: fencing ----

fn fencing() -> Options {
    spec_options().fencing(true)
}

fn granted_fencing() -> Fixture {
    let mut f = Fixture::started_with(fencing());
    f.event(1, E::ConnectionAcquired { conn: C1 });
    f.drain();
    f.event(
        2,
        E::LockGranted {
            conn: C1,
            backend_pid: PID,
        },
    );
    assert_eq!(
        f.drain(),
        vec![
            A::Hijack {
                conn: C1,
                backend_pid: PID
            },
            A::AdvanceEpoch {
                conn: C1,
                lock_timeout_ms: 2_500
            }
        ]
    );
    assert_eq!(f.election.phase(), Phase::Fencing);
    assert!(!f.election.is_leader());
    f
}

#[test]
fn with_fencing_the_trust_counts_from_the_epoch_advance_sent_on_the_lock_session() {
    // The advance, sent at 2 ms on the lock session, answers at 900 ms: the session went idle
    // no earlier than its send, so the trust counts from there, not from the answer.
    let mut f = granted_fencing();
    f.event(900, E::EpochAdvanced { conn: C1, epoch: 7 });
    assert!(f.election.is_leader());
    assert_eq!(
        f.election.trust_deadline(),
        Some(f.at(2) + 4 * I - 4 * I / 10)
    );
}

#[test]
fn with_fencing_the_term_begins_with_the_epoch_the_database_returned() {
    let mut f = granted_fencing();
    assert_eq!(f.election.poll_timeout(), Some(f.at(2 + IMS)));
    f.event(3, E::EpochAdvanced { conn: C1, epoch: 7 });
    assert_eq!(
        f.drain(),
        vec![
            A::BeginTerm {
                term: T1,
                epoch: Some(7)
            },
            log(LogKind::LeadershipAcquired, Some(T1), None)
        ]
    );
    assert!(f.election.is_leader());
}

#[test]
fn an_epoch_that_does_not_advance_refuses_the_term_and_closes_the_lock_session() {
    let mut f = granted_fencing();
    f.event(3, E::EpochAdvanced { conn: C1, epoch: 7 });
    f.drain();
    f.event(
        4,
        E::SessionEnded {
            conn: C1,
            cause: "terminated",
        },
    );
    f.drain();
    // After a session end the next check is a whole interval later (the grid time 2·I).
    f.timeout(2 * IMS);
    assert_eq!(f.drain(), vec![A::AcquireConnection { conn: C2 }]);
    f.event(2 * IMS + 1, E::ConnectionAcquired { conn: C2 });
    f.event(
        2 * IMS + 2,
        E::LockGranted {
            conn: C2,
            backend_pid: PID,
        },
    );
    f.drain();
    f.event(2 * IMS + 3, E::EpochAdvanced { conn: C2, epoch: 7 });
    assert_eq!(
        f.drain(),
        vec![
            A::CloseConnection { conn: C2 },
            log(
                LogKind::FencingFailed,
                None,
                Some(Cause::EpochDidNotAdvance { epoch: 7, last: 7 })
            ),
        ]
    );
    assert!(!f.election.is_leader());
    assert_eq!(f.election.phase(), Phase::StandbyWaiting);
}

#[test]
fn a_failed_or_unanswered_epoch_closes_the_lock_session_and_stays_standby() {
    let mut f = granted_fencing();
    f.event(
        3,
        E::EpochFailed {
            conn: C1,
            cause: "relation does not exist",
        },
    );
    assert_eq!(
        f.drain(),
        vec![
            A::CloseConnection { conn: C1 },
            log(
                LogKind::FencingFailed,
                None,
                Some(Cause::Error("relation does not exist"))
            ),
        ]
    );
    let mut g = granted_fencing();
    g.timeout(2 + IMS);
    assert_eq!(
        g.drain(),
        vec![
            A::CloseConnection { conn: C1 },
            log(LogKind::FencingFailed, None, Some(Cause::TimedOut(I))),
            // The check that fell due meanwhile starts at once.
            A::AcquireConnection { conn: C2 },
        ]
    );
}

#[test]
fn cancelling_or_losing_the_session_while_fencing_closes_it() {
    let mut f = granted_fencing();
    f.event(3, Control::Cancelled);
    assert_eq!(f.drain(), vec![A::CloseConnection { conn: C1 }, A::Finish]);
    let mut g = granted_fencing();
    g.event(
        3,
        E::SessionEnded {
            conn: C1,
            cause: "reset",
        },
    );
    assert_eq!(
        g.drain(),
        vec![
            A::CloseConnection { conn: C1 },
            log(LogKind::FencingFailed, None, Some(Cause::Error("reset"))),
        ]
    );
}

// ---- beyond the spec: a lock found on the standby's own pooled session ----

/// Fixture: a polling standby whose grant statement on conn 1 just found the session holding
/// the lock, checked by a leader `checked_secs_ago` seconds ago.
fn found_held(checked_secs_ago: Option<u64>) -> Fixture {
    let mut f = Fixture::started();
    f.event(1, E::ConnectionAcquired { conn: C1 });
    assert_eq!(f.drain(), vec![A::TryLock { conn: C1 }]);
    f.event(
        2,
        E::LockHeldBySession {
            conn: C1,
            checked_secs_ago,
        },
    );
    f
}

#[test]
fn a_lock_a_live_leader_checks_on_the_same_session_fails_the_check_naming_transaction_mode() {
    // I = 5 s: the idle timeout is 20 s, so a check 21 s ago is still a live leader's.
    let stranded_after = CheckInterval::new(Duration::from_millis(IMS))
        .unwrap()
        .stranded_after_secs();
    assert_eq!(stranded_after, 21);
    let mut f = found_held(Some(stranded_after));
    let cause = Cause::SessionShared {
        checked_secs_ago: stranded_after,
    };
    assert!(cause.to_string().contains("transaction mode"));
    assert_eq!(
        f.drain(),
        vec![
            A::CloseConnection { conn: C1 },
            log(LogKind::AcquireFailed, None, Some(cause)),
        ]
    );
    assert!(!f.election.is_leader());
    assert_eq!(f.election.timeout_reason(), Some(Timer::NextCheck));
}

#[test]
fn a_stranded_lock_is_released_on_the_same_session_with_a_warning_and_the_check_goes_on() {
    for checked_secs_ago in [None, Some(22)] {
        let mut f = found_held(checked_secs_ago);
        assert_eq!(f.drain(), vec![A::ReleaseIfHeld { conn: C1 }]);
        assert_eq!(f.election.phase(), Phase::TryingLock);
        f.event(
            3,
            E::ReleasedIfHeld {
                conn: C1,
                released: true,
            },
        );
        assert_eq!(
            f.drain(),
            vec![
                log(LogKind::StrandedLockReleased, None, None),
                A::TryLock { conn: C1 },
            ],
            "{checked_secs_ago:?}"
        );
        assert_eq!(LogKind::StrandedLockReleased.level(), Level::Warn);
        assert!(
            LogKind::StrandedLockReleased
                .message()
                .contains("without a reset query")
        );
        // The check goes on to its grant on the same session.
        f.event(
            4,
            E::LockGranted {
                conn: C1,
                backend_pid: PID,
            },
        );
        assert!(f.election.is_leader());
    }
}

#[test]
fn a_lock_still_held_after_its_stranded_release_closes_the_connection_once_per_check() {
    let mut f = found_held(None);
    f.drain();
    f.event(
        3,
        E::ReleasedIfHeld {
            conn: C1,
            released: true,
        },
    );
    f.drain();
    f.event(
        4,
        E::LockHeldBySession {
            conn: C1,
            checked_secs_ago: None,
        },
    );
    assert_eq!(
        f.drain(),
        vec![
            A::CloseConnection { conn: C1 },
            log(LogKind::AcquireFailed, None, Some(Cause::StrandedLockKept)),
        ]
    );
    assert_eq!(f.election.timeout_reason(), Some(Timer::NextCheck));
}

#[test]
fn a_queued_standby_goes_on_queueing_after_a_stranded_release() {
    let mut f = Fixture::started_with(spec_options().acquire(AcquireMode::Queue));
    f.event(1, E::ConnectionAcquired { conn: C1 });
    f.drain();
    f.event(
        2,
        E::LockHeldBySession {
            conn: C1,
            checked_secs_ago: None,
        },
    );
    assert_eq!(f.drain(), vec![A::ReleaseIfHeld { conn: C1 }]);
    f.event(
        3,
        E::ReleasedIfHeld {
            conn: C1,
            released: true,
        },
    );
    assert_eq!(
        f.drain()[1..],
        [A::WaitForLock {
            conn: C1,
            lock_timeout_ms: 5_000
        }]
    );
    // A wait that then times out is the ordinary refusal.
    f.event(IMS + 3, E::LockWaitTimedOut { conn: C1 });
    assert_eq!(f.drain(), vec![A::ReleaseIfHeld { conn: C1 }]);
    f.event(
        IMS + 4,
        E::ReleasedIfHeld {
            conn: C1,
            released: false,
        },
    );
    assert_eq!(f.drain(), vec![A::ReturnToPool { conn: C1 }]);
}

// ---- the pool proof (Options::prove_pool) ----

fn proving() -> Fixture {
    let mut f = Fixture::with(spec_options().prove_pool(true));
    f.election.start(f.t0).unwrap();
    assert_eq!(
        f.drain(),
        vec![A::ProbePool {
            conn: C1,
            second_within: I / 2
        }]
    );
    assert_eq!(f.election.timeout_reason(), Some(Timer::AcquireDeadline));
    f
}

#[test]
fn a_run_that_proves_its_pool_asks_two_held_connections_for_their_backends_first() {
    let mut f = proving();
    // Two backends: the pool's sessions are this client's own; the check goes on at once.
    f.event(
        3,
        E::PoolProbed {
            conn: C1,
            proof: PoolProof::excluding(10, 11),
        },
    );
    assert_eq!(f.drain(), vec![A::AcquireConnection { conn: C2 }]);
    assert_eq!(f.election.phase(), Phase::Acquiring);
    f.event(4, E::ConnectionAcquired { conn: C2 });
    assert_eq!(f.drain(), vec![A::TryLock { conn: C2 }]);
    f.event(
        5,
        E::LockGranted {
            conn: C2,
            backend_pid: PID,
        },
    );
    assert!(f.election.is_leader());
    assert_eq!(
        f.election.trust_deadline(),
        Some(f.at(4) + 4 * I - 4 * I / 10),
        "the grant's send plus its session's idle_session_timeout, less a tenth"
    );
    f.drain();
    // Once per run: the next checks do not prove it again.
    f.event(6, Control::Resign { hold_off: I });
    f.drain();
    f.event(
        7,
        E::UnlockDone {
            conn: C2,
            released: true,
        },
    );
    f.drain();
    f.timeout(2 * IMS + 10);
    assert_eq!(
        f.drain(),
        vec![A::AcquireConnection {
            conn: ConnId::new(3)
        }]
    );
}

#[test]
fn a_pool_whose_two_held_connections_share_a_backend_fails_the_run_before_any_term() {
    let mut f = proving();
    f.event(
        3,
        E::PoolProbed {
            conn: C1,
            proof: PoolProof {
                first: 77,
                second: SecondSession::Answered(77),
                exclusion: None,
            },
        },
    );
    let finding = crate::LockFinding::PoolSharesBackend { backend_pid: 77 };
    assert_eq!(
        f.drain(),
        vec![
            log(
                LogKind::PoolMultiplexes,
                None,
                Some(Cause::LockNotVerified(finding))
            ),
            A::Fail(finding),
            A::Finish,
        ]
    );
    assert!(!f.election.is_running());
    assert!(!f.election.is_leader());
    assert!(finding.proves_multiplexing());
    assert_eq!(LogKind::PoolMultiplexes.level(), Level::Error);
    assert!(LogKind::PoolMultiplexes.message().contains("Config::lease"));
}

#[test]
fn a_pool_proof_that_fails_is_tried_again_and_one_unanswered_in_its_interval_proves_nothing() {
    let mut f = proving();
    f.event(
        3,
        E::AcquireFailed {
            conn: C1,
            cause: "refused",
        },
    );
    assert_eq!(
        f.drain(),
        vec![log(
            LogKind::AcquireFailed,
            None,
            Some(Cause::Error("refused"))
        )]
    );
    f.timeout(IMS);
    assert_eq!(
        f.drain(),
        vec![A::ProbePool {
            conn: C2,
            second_within: I / 2
        }]
    );
    // A stop while proving closes what the operation holds, and any setup it left.
    let mut stopped = proving();
    stopped.event(1, Control::Cancelled);
    assert_eq!(
        stopped.drain(),
        vec![A::CloseConnection { conn: C1 }, A::Finish]
    );
    // No answer within the interval (a link slower than a setup and a statement): given up,
    // and it proves nothing: the next check proves again, and tries no lock.
    f.timeout(2 * IMS);
    assert_eq!(
        f.drain(),
        vec![
            A::ReturnToPool { conn: C2 },
            log(LogKind::AcquireFailed, None, Some(Cause::TimedOut(I))),
            A::ProbePool {
                conn: ConnId::new(3),
                second_within: I / 2
            },
        ]
    );
}

#[test]
fn a_lock_granted_to_two_sessions_at_once_fails_the_run_before_any_term() {
    let mut f = proving();
    let mut proof = PoolProof::excluding(10, 11);
    if let Some(test) = proof.exclusion.as_mut() {
        test.second_granted = true;
    }
    f.event(3, E::PoolProbed { conn: C1, proof });
    let finding = crate::LockFinding::LockNotExclusive {
        first: 10,
        second: 11,
    };
    assert_eq!(
        f.drain(),
        vec![
            log(
                LogKind::LockNotExclusive,
                None,
                Some(Cause::LockNotVerified(finding))
            ),
            A::Fail(finding),
            A::Finish,
        ]
    );
    assert!(!f.election.is_running());
    assert!(!finding.proves_multiplexing());
    assert_eq!(LogKind::LockNotExclusive.level(), Level::Error);
    assert!(
        LogKind::LockNotExclusive
            .message()
            .contains("Config::lease")
    );
}

#[test]
fn an_inconclusive_proof_is_never_a_pass_and_the_next_check_proves_again() {
    for (second, why) in [
        (SecondSession::TimedOut, Unproven::NoSecondSession),
        (
            SecondSession::Failed("too many connections for role"),
            Unproven::SecondFailed("too many connections for role"),
        ),
    ] {
        let mut f = proving();
        let proof = PoolProof {
            first: 10,
            second,
            exclusion: None,
        };
        f.event(3, E::PoolProbed { conn: C1, proof });
        assert_eq!(
            f.drain(),
            vec![log(
                LogKind::ProofInconclusive,
                None,
                Some(Cause::Unproven(why))
            )]
        );
        assert_eq!(f.election.phase(), Phase::StandbyWaiting);
        f.timeout(IMS);
        assert_eq!(
            f.drain(),
            vec![A::ProbePool {
                conn: C2,
                second_within: I / 2
            }]
        );
    }
    // The proof's key held by another session: nothing proven either.
    let mut f = proving();
    let mut proof = PoolProof::excluding(10, 11);
    if let Some(test) = proof.exclusion.as_mut() {
        test.first_granted = false;
    }
    f.event(3, E::PoolProbed { conn: C1, proof });
    assert_eq!(
        f.drain(),
        vec![log(
            LogKind::ProofInconclusive,
            None,
            Some(Cause::Unproven(Unproven::KeyTaken))
        )]
    );
    assert_eq!(LogKind::ProofInconclusive.level(), Level::Warn);
}

#[test]
fn a_lost_term_is_proven_again_before_the_next_attempt() {
    let mut f = proving();
    f.event(
        3,
        E::PoolProbed {
            conn: C1,
            proof: PoolProof::excluding(10, 11),
        },
    );
    f.event(4, E::ConnectionAcquired { conn: C2 });
    f.event(
        5,
        E::LockGranted {
            conn: C2,
            backend_pid: PID,
        },
    );
    assert!(f.election.is_leader());
    f.drain();
    // The session ends (a failover, say): the next session may be another server's.
    f.event(
        6,
        E::SessionEnded {
            conn: C2,
            cause: "terminated",
        },
    );
    assert!(!f.election.is_leader());
    f.drain();
    f.timeout(2 * IMS);
    assert!(
        matches!(f.drain().as_slice(), [A::ProbePool { .. }]),
        "the next attempt proves the new session's server first"
    );
}

#[test]
fn a_lease_election_never_proves_its_pool() {
    let lease = crate::Lease::new(CheckInterval::new(I).unwrap(), 3 * I).unwrap();
    let mut f = Fixture::with(spec_options().lease(lease).prove_pool(true));
    f.election.start(f.t0).unwrap();
    assert!(matches!(f.drain().as_slice(), [A::ClaimLease { .. }]));
}
