//! The leader's check, its verdict and the demotions: exact actions per input.

use super::*;

// ---- leader check ----

#[test]
fn the_leader_pings_its_connection_every_interval() {
    let mut f = Fixture::leader();
    for k in 1..=3u64 {
        f.timeout(k * IMS);
        assert_eq!(
            f.drain(),
            vec![A::Ping {
                conn: C1,
                backend_pid: PID
            }]
        );
        assert_eq!(f.election.timeout_reason(), Some(Timer::PingDeadline));
        assert_eq!(
            f.event(
                k * IMS + 2,
                E::PingAnswered {
                    conn: C1,
                    found: LockCheck::holding(PID)
                }
            ),
            Handled::Applied
        );
        assert_eq!(f.drain(), vec![]);
        assert_eq!(f.election.term(), Some(T1));
        assert_eq!(f.election.poll_timeout(), Some(f.at((k + 1) * IMS)));
    }
}

#[test]
fn an_advisory_leader_trusts_its_lock_until_the_server_may_have_ended_its_session() {
    // The grant, sent at 10 ms (answered at once), bounds the idle session at four intervals.
    let mut f = Fixture::leader();
    assert_eq!(
        f.election.trust_deadline(),
        Some(f.at(10) + 4 * I - 4 * I / 10)
    );
    // A check sent at I and answered 2 ms later moves it to its own send plus the timeout.
    f.timeout(IMS);
    f.drain();
    assert_eq!(
        f.election.trust_deadline(),
        Some(f.at(10) + 4 * I - 4 * I / 10),
        "not before the check answered"
    );
    f.event(
        IMS + 2,
        E::PingAnswered {
            conn: C1,
            found: LockCheck::holding(PID),
        },
    );
    assert_eq!(
        f.election.trust_deadline(),
        Some(f.at(IMS) + 4 * I - 4 * I / 10)
    );
    // A standby trusts nothing.
    assert_eq!(Fixture::started().election.trust_deadline(), None);
}

#[test]
fn a_failed_ping_ends_the_term_as_lost_then_closes_then_warns() {
    let mut f = Fixture::leader();
    f.timeout(IMS);
    f.drain();
    f.event(
        IMS + 2,
        E::PingFailed {
            conn: C1,
            cause: "terminating connection",
        },
    );
    assert_eq!(
        f.drain(),
        vec![
            A::EndTerm {
                term: T1,
                cause: TermEndCause::Lost(LossReason::CheckFailed)
            },
            A::CloseConnection { conn: C1 },
            log(
                LogKind::LeadershipLost,
                Some(T1),
                Some(Cause::Error("terminating connection"))
            ),
        ]
    );
    assert!(!f.election.is_leader());
    assert_eq!(f.election.phase(), Phase::StandbyWaiting);
    assert_eq!(f.election.poll_timeout(), Some(f.at(2 * IMS)));
}

#[test]
fn an_unanswered_ping_demotes_after_one_interval_and_the_standby_checks_at_its_next_tick() {
    let mut f = Fixture::leader();
    f.timeout(IMS);
    f.drain();
    f.timeout(2 * IMS - 1);
    assert_eq!(f.drain(), vec![]);
    assert!(f.election.is_leader());
    f.timeout(2 * IMS);
    assert_eq!(
        f.drain(),
        vec![
            A::EndTerm {
                term: T1,
                cause: TermEndCause::Lost(LossReason::CheckTimedOut)
            },
            A::CloseConnection { conn: C1 },
            log(LogKind::LeadershipLost, Some(T1), Some(Cause::TimedOut(I))),
            A::AcquireConnection { conn: C2 },
        ]
    );
}

#[test]
fn a_demoted_replica_can_lead_again_in_a_newer_term() {
    let mut f = Fixture::leader();
    f.timeout(IMS);
    f.event(
        IMS + 1,
        E::PingFailed {
            conn: C1,
            cause: "reset",
        },
    );
    f.timeout(2 * IMS);
    f.event(2 * IMS + 1, E::ConnectionAcquired { conn: C2 });
    f.drain();
    f.event(
        2 * IMS + 2,
        E::LockGranted {
            conn: C2,
            backend_pid: PID,
        },
    );
    assert_eq!(
        f.drain(),
        vec![
            A::Hijack {
                conn: C2,
                backend_pid: PID
            },
            A::BeginTerm {
                term: T2,
                epoch: None
            },
            log(LogKind::LeadershipAcquired, Some(T2), None),
        ]
    );
}

#[test]
fn a_late_ping_answer_from_a_closed_connection_cannot_extend_a_newer_term() {
    let mut f = Fixture::leader();
    f.timeout(IMS);
    f.timeout(2 * IMS); // ping on C1 timed out; C2 asked for
    f.event(2 * IMS + 1, E::ConnectionAcquired { conn: C2 });
    f.event(
        2 * IMS + 2,
        E::LockGranted {
            conn: C2,
            backend_pid: PID,
        },
    );
    f.timeout(3 * IMS);
    f.drain();
    assert_eq!(
        f.event(
            3 * IMS + 1,
            E::PingAnswered {
                conn: C1,
                found: LockCheck::holding(PID)
            }
        ),
        Handled::Ignored(Ignored::StaleConnection)
    );
    assert_eq!(
        f.event(
            3 * IMS + 1,
            E::PingFailed {
                conn: C1,
                cause: "late"
            }
        ),
        Handled::Ignored(Ignored::StaleConnection)
    );
    assert_eq!(f.drain(), vec![]);
    assert_eq!(f.election.term(), Some(T2));
    assert_eq!(f.election.timeout_reason(), Some(Timer::PingDeadline));
}

#[test]
fn a_completion_that_answers_another_operation_is_ignored() {
    let mut f = Fixture::started();
    f.event(1, E::ConnectionAcquired { conn: C1 });
    f.drain();
    assert_eq!(
        f.event(
            2,
            E::PingAnswered {
                conn: C1,
                found: LockCheck::holding(PID)
            }
        ),
        Handled::Ignored(Ignored::Unexpected)
    );
    assert_eq!(
        f.event(2, E::ConnectionAcquired { conn: C1 }),
        Handled::Ignored(Ignored::Unexpected)
    );
    assert_eq!(
        f.event(
            2,
            E::UnlockDone {
                conn: C1,
                released: true
            }
        ),
        Handled::Ignored(Ignored::Unexpected)
    );
    assert_eq!(f.drain(), vec![]);
    assert_eq!(f.election.phase(), Phase::TryingLock);
}

#[test]
fn a_completion_while_no_operation_is_in_flight_is_ignored() {
    let mut f = Fixture::leader();
    assert_eq!(
        f.event(
            20,
            E::PingAnswered {
                conn: C1,
                found: LockCheck::holding(PID)
            }
        ),
        Handled::Ignored(Ignored::StaleConnection)
    );
    assert_eq!(
        f.event(
            20,
            E::LockGranted {
                conn: C1,
                backend_pid: PID
            }
        ),
        Handled::Ignored(Ignored::StaleConnection)
    );
    assert_eq!(f.drain(), vec![]);
}

#[test]
fn handle_timeout_early_or_twice_does_nothing() {
    let mut f = Fixture::leader();
    f.timeout(1);
    f.timeout(IMS - 1);
    assert_eq!(f.drain(), vec![]);
    f.timeout(IMS);
    f.timeout(IMS);
    assert_eq!(
        f.drain(),
        vec![A::Ping {
            conn: C1,
            backend_pid: PID
        }]
    );
}

// ---- beyond the spec: the session watch ----

#[test]
fn a_lock_session_that_ends_demotes_the_leader_at_once() {
    let mut f = Fixture::leader();
    let cause = "db error: FATAL: terminating connection due to administrator command";
    f.event(20, E::SessionEnded { conn: C1, cause });
    assert_eq!(
        f.drain(),
        vec![
            A::EndTerm {
                term: T1,
                cause: TermEndCause::Lost(LossReason::SessionEnded)
            },
            A::CloseConnection { conn: C1 },
            log(LogKind::LeadershipLost, Some(T1), Some(Cause::Error(cause))),
        ]
    );
    assert_eq!(f.election.phase(), Phase::StandbyWaiting);
    // It lets the standbys try first: its next check is the first one a whole interval later.
    assert_eq!(f.election.poll_timeout(), Some(f.at(2 * IMS)));
}

#[test]
fn a_session_end_during_the_check_demotes_and_the_late_ping_answer_is_ignored() {
    let mut f = Fixture::leader();
    f.timeout(IMS);
    assert_eq!(
        f.drain(),
        vec![A::Ping {
            conn: C1,
            backend_pid: PID
        }]
    );
    f.event(
        IMS + 1,
        E::SessionEnded {
            conn: C1,
            cause: "reset",
        },
    );
    assert!(!f.election.is_leader());
    f.drain();
    assert_eq!(
        f.event(
            IMS + 2,
            E::PingFailed {
                conn: C1,
                cause: "closed"
            }
        ),
        Handled::Ignored(Ignored::StaleConnection)
    );
}

#[test]
fn a_session_end_of_another_connection_or_on_a_standby_is_ignored() {
    let mut f = Fixture::leader();
    assert_eq!(
        f.event(
            20,
            E::SessionEnded {
                conn: C2,
                cause: "x"
            }
        ),
        Handled::Ignored(Ignored::StaleConnection)
    );
    let mut standby = Fixture::started();
    standby.event(1, E::ConnectionAcquired { conn: C1 });
    standby.drain();
    assert_eq!(
        standby.event(
            2,
            E::SessionEnded {
                conn: C1,
                cause: "x"
            }
        ),
        Handled::Ignored(Ignored::StaleConnection)
    );
}

#[test]
fn a_session_end_while_releasing_finishes_without_waiting_for_the_unlock() {
    let mut f = Fixture::leader();
    f.event(100, Control::Cancelled);
    f.drain();
    f.event(
        101,
        E::SessionEnded {
            conn: C1,
            cause: "reset",
        },
    );
    assert_eq!(
        f.drain(),
        vec![
            A::CloseConnection { conn: C1 },
            log(
                LogKind::SessionEndedWhileStopping,
                Some(T1),
                Some(Cause::Error("reset"))
            ),
            A::Finish
        ]
    );
}

// ---- lock verification ----

#[test]
fn the_leaders_check_carries_the_backend_granted_the_lock() {
    let mut f = Fixture::leader();
    f.timeout(IMS);
    assert_eq!(
        f.drain(),
        vec![A::Ping {
            conn: C1,
            backend_pid: PID
        }]
    );
}

#[test]
fn a_fencing_leader_checks_the_backend_granted_before_its_epoch_advanced() {
    let mut f = Fixture::started_with(spec_options().fencing(true));
    f.event(1, E::ConnectionAcquired { conn: C1 });
    f.event(
        2,
        E::LockGranted {
            conn: C1,
            backend_pid: 77,
        },
    );
    f.event(3, E::EpochAdvanced { conn: C1, epoch: 5 });
    f.drain();
    f.timeout(IMS);
    assert_eq!(
        f.drain(),
        vec![A::Ping {
            conn: C1,
            backend_pid: 77
        }]
    );
}

#[test]
fn a_check_that_proves_the_lock_keeps_the_term() {
    let mut f = Fixture::leader();
    f.timeout(IMS);
    f.drain();
    let found = LockCheck::holding(PID);
    assert_eq!(
        f.event(IMS + 2, E::PingAnswered { conn: C1, found }),
        Handled::Applied
    );
    assert_eq!(f.drain(), vec![]);
    assert!(f.election.is_leader());
    assert_eq!(f.election.poll_timeout(), Some(f.at(2 * IMS)));
}

#[test]
fn a_check_that_disproves_the_lock_ends_the_term_with_the_findings_reason() {
    let cases = [
        (
            LockCheck {
                backend_pid: PID + 1,
                ..LockCheck::holding(PID)
            },
            LossReason::BackendChanged,
        ),
        (
            LockCheck {
                in_recovery: true,
                ..LockCheck::holding(PID)
            },
            LossReason::ServerInRecovery,
        ),
        (
            LockCheck {
                holds_lock: false,
                ..LockCheck::holding(PID)
            },
            LossReason::LockNotHeld,
        ),
        (
            LockCheck {
                marked_by_grant: false,
                ..LockCheck::holding(PID)
            },
            LossReason::SessionShared,
        ),
    ];
    for (found, reason) in cases {
        let mut f = Fixture::leader();
        f.timeout(IMS);
        f.drain();
        f.event(IMS + 2, E::PingAnswered { conn: C1, found });
        let finding = found.verdict(PID).unwrap_err();
        let mut expected = vec![
            A::EndTerm {
                term: T1,
                cause: TermEndCause::Lost(reason),
            },
            A::CloseConnection { conn: C1 },
            log(
                LogKind::LeadershipLost,
                Some(T1),
                Some(Cause::LockNotVerified(finding)),
            ),
        ];
        // A finding that proves a multiplexing pooler fails the run: no check can succeed.
        let multiplexed = matches!(
            reason,
            LossReason::BackendChanged | LossReason::SessionShared
        );
        assert_eq!(finding.proves_multiplexing(), multiplexed);
        if multiplexed {
            expected.extend([A::Fail(finding), A::Finish]);
        }
        assert_eq!(f.drain(), expected, "{found:?}");
        assert!(!f.election.is_leader());
        assert_eq!(f.election.is_running(), !multiplexed, "{found:?}");
    }
}

#[test]
fn every_term_end_cause_has_its_own_label() {
    let labels: std::collections::BTreeSet<&str> = TermEndCause::ALL
        .iter()
        .map(|cause| cause.label())
        .collect();
    assert_eq!(labels.len(), TermEndCause::ALL.len());
    assert!(TermEndCause::ALL.iter().filter(|c| c.is_loss()).count() == 11);
    assert_eq!(
        TermEndCause::Lost(LossReason::SessionEnded).label(),
        "session_ended"
    );
    assert_eq!(TermEndCause::Resigned.label(), "resigned");
}

#[test]
fn term_end_cause_all_is_every_variant_but_handed_over() {
    // Exhaustive on purpose: a new cause or loss reason does not compile here until it is put in
    // `ALL`, or left out with its reason, as `HandedOver` is (it ends only shard terms).
    let in_all = |cause: TermEndCause| match cause {
        TermEndCause::Lost(
            LossReason::CheckFailed
            | LossReason::CheckTimedOut
            | LossReason::SessionEnded
            | LossReason::LockNotHeld
            | LossReason::ServerInRecovery
            | LossReason::BackendChanged
            | LossReason::SessionShared
            | LossReason::Panicked
            | LossReason::Dropped
            | LossReason::LeaseTaken
            | LossReason::LeaseExpired,
        )
        | TermEndCause::Stopped
        | TermEndCause::Resigned
        | TermEndCause::Unfit
        | TermEndCause::Yielded => true,
        TermEndCause::HandedOver => false,
    };
    let every = [
        LossReason::CheckFailed,
        LossReason::CheckTimedOut,
        LossReason::SessionEnded,
        LossReason::LockNotHeld,
        LossReason::ServerInRecovery,
        LossReason::BackendChanged,
        LossReason::SessionShared,
        LossReason::Panicked,
        LossReason::Dropped,
        LossReason::LeaseTaken,
        LossReason::LeaseExpired,
    ]
    .map(TermEndCause::Lost)
    .into_iter()
    .chain([
        TermEndCause::Stopped,
        TermEndCause::Resigned,
        TermEndCause::Unfit,
        TermEndCause::Yielded,
        TermEndCause::HandedOver,
    ]);
    for cause in every {
        assert_eq!(
            TermEndCause::ALL.contains(&cause),
            in_all(cause),
            "{cause:?}"
        );
    }
    assert!(TermEndCause::ALL.iter().all(|&cause| in_all(cause)));
}

// ---- stuck leader ----

#[test]
fn the_grant_and_each_proving_check_are_the_leaders_last_verification() {
    let mut f = Fixture::leader();
    assert_eq!(f.election.last_verified(), Some(f.at(10)));
    f.timeout(IMS);
    f.drain();
    // A check in flight proves nothing yet.
    assert_eq!(f.election.last_verified(), Some(f.at(10)));
    f.event(
        IMS + 7,
        E::PingAnswered {
            conn: C1,
            found: LockCheck::holding(PID),
        },
    );
    assert_eq!(f.election.last_verified(), Some(f.at(IMS + 7)));
    // A standby has none.
    f.event(IMS + 8, Control::Cancelled);
    assert_eq!(f.election.last_verified(), None);
}

#[test]
fn a_leader_is_stuck_only_strictly_past_two_intervals_since_its_last_verification() {
    let f = Fixture::leader();
    assert_eq!(f.election.stuck(f.at(10 + 2 * IMS)), Ok(()));
    let stuck = f.election.stuck(f.at(10 + 2 * IMS + 1)).unwrap_err();
    assert_eq!(stuck.bound, 2 * I);
    assert_eq!(stuck.since_last_check, 2 * I + Duration::from_millis(1));
    // The driver's trait gives the same verdict.
    let through_trait = crate::Machine::stuck(&f.election, f.at(10 + 2 * IMS + 1));
    assert_eq!(through_trait, Err(stuck));
    // A standby or an idle election is never stuck, however late.
    let standby = Fixture::started();
    assert_eq!(standby.election.stuck(standby.at(100 * IMS)), Ok(()));
    assert_eq!(Fixture::new().election.stuck(Instant::now()), Ok(()));
}
