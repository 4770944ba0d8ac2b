//! The stop protocol (cancel, graceful stop, panic, drop, reuse, work deadlines): exact actions
//! per input.

use super::*;

// ---- cancel ----

#[test]
fn cancelling_a_waiting_standby_finishes_at_once() {
    let mut f = Fixture::started();
    f.event(
        1,
        E::AcquireFailed {
            conn: C1,
            cause: "refused",
        },
    );
    f.drain();
    assert_eq!(f.event(2, Control::Cancelled), Handled::Applied);
    assert_eq!(f.drain(), vec![A::Finish]);
    assert!(!f.election.is_running());
    assert_eq!(f.election.poll_timeout(), None);
}

#[test]
fn cancelling_a_standby_mid_check_closes_the_connection_of_unknown_state() {
    let mut f = Fixture::started();
    f.event(1, E::ConnectionAcquired { conn: C1 });
    f.drain();
    f.event(2, Control::Cancelled);
    assert_eq!(f.drain(), vec![A::CloseConnection { conn: C1 }, A::Finish]);
}

#[test]
fn cancelling_the_leader_ends_the_term_before_unlocking_under_two_seconds() {
    let mut f = Fixture::leader();
    f.event(100, Control::Cancelled);
    assert_eq!(
        f.drain(),
        vec![
            A::EndTerm {
                term: T1,
                cause: TermEndCause::Stopped
            },
            A::Unlock { conn: C1 }
        ]
    );
    assert!(!f.election.is_leader());
    assert_eq!(f.election.phase(), Phase::Releasing);
    assert_eq!(f.election.timeout_reason(), Some(Timer::UnlockDeadline));
    assert_eq!(f.election.poll_timeout(), Some(f.at(2_100)));
}

#[test]
fn a_confirmed_unlock_closes_the_connection_logs_and_finishes() {
    let mut f = Fixture::leader();
    f.event(100, Control::Cancelled);
    f.drain();
    f.event(
        101,
        E::UnlockDone {
            conn: C1,
            released: true,
        },
    );
    assert_eq!(
        f.drain(),
        vec![
            A::CloseConnection { conn: C1 },
            log(LogKind::LockReleased, Some(T1), None),
            A::Finish
        ]
    );
    assert!(!f.election.is_running());
}

#[test]
fn an_unlock_that_returns_false_warns_and_still_closes() {
    let mut f = Fixture::leader();
    f.event(100, Control::Cancelled);
    f.drain();
    f.event(
        101,
        E::UnlockDone {
            conn: C1,
            released: false,
        },
    );
    assert_eq!(
        f.drain(),
        vec![
            A::CloseConnection { conn: C1 },
            log(LogKind::ReleaseFailed, Some(T1), Some(Cause::LockNotHeld)),
            A::Finish
        ]
    );
}

#[test]
fn an_unlock_error_warns_and_still_closes() {
    let mut f = Fixture::leader();
    f.event(100, Control::Cancelled);
    f.drain();
    f.event(
        101,
        E::UnlockFailed {
            conn: C1,
            cause: "connection closed",
        },
    );
    assert_eq!(
        f.drain(),
        vec![
            A::CloseConnection { conn: C1 },
            log(
                LogKind::ReleaseFailed,
                Some(T1),
                Some(Cause::Error("connection closed"))
            ),
            A::Finish
        ]
    );
}

#[test]
fn an_unlock_without_answer_within_two_seconds_closes_anyway() {
    let mut f = Fixture::leader();
    f.event(100, Control::Cancelled);
    f.drain();
    f.timeout(2_099);
    assert_eq!(f.drain(), vec![]);
    f.timeout(2_100);
    assert_eq!(
        f.drain(),
        vec![
            A::CloseConnection { conn: C1 },
            log(
                LogKind::ReleaseFailed,
                Some(T1),
                Some(Cause::TimedOut(UNLOCK_BUDGET))
            ),
            A::Finish
        ]
    );
}

#[test]
fn cancelling_during_a_ping_unlocks_in_its_place() {
    let mut f = Fixture::leader();
    f.timeout(IMS);
    f.drain();
    f.event(IMS + 1, Control::Cancelled);
    assert_eq!(
        f.drain(),
        vec![
            A::EndTerm {
                term: T1,
                cause: TermEndCause::Stopped
            },
            A::Unlock { conn: C1 }
        ]
    );
    assert_eq!(
        f.event(
            IMS + 2,
            E::PingAnswered {
                conn: C1,
                found: LockCheck::holding(PID)
            }
        ),
        Handled::Ignored(Ignored::Unexpected)
    );
}

#[test]
fn a_second_cancel_while_releasing_is_ignored() {
    let mut f = Fixture::leader();
    f.event(100, Control::Cancelled);
    f.drain();
    assert_eq!(
        f.event(101, Control::Cancelled),
        Handled::Ignored(Ignored::AlreadyStopping)
    );
    assert_eq!(f.drain(), vec![]);
}

// ---- panic and drop ----

#[test]
fn a_panic_while_leading_ends_the_term_as_lost_and_closes_without_unlocking() {
    let mut f = Fixture::leader();
    f.timeout(IMS);
    f.drain();
    f.event(IMS + 1, Control::Panicked);
    let actions = f.drain();
    assert_eq!(
        actions,
        vec![
            A::EndTerm {
                term: T1,
                cause: TermEndCause::Lost(LossReason::Panicked)
            },
            A::CloseConnection { conn: C1 },
            log(LogKind::AbandonedAfterPanic, Some(T1), None),
            A::Finish,
        ]
    );
    assert_eq!(
        LogKind::AbandonedAfterPanic.message(),
        "background leader lock abandoned after a panic"
    );
    assert_eq!(LogKind::AbandonedAfterPanic.level(), Level::Warn);
}

#[test]
fn a_panic_on_a_standby_closes_its_pending_connection_without_a_warning() {
    let mut f = Fixture::started();
    f.event(1, E::ConnectionAcquired { conn: C1 });
    f.drain();
    f.event(2, Control::Panicked);
    assert_eq!(f.drain(), vec![A::CloseConnection { conn: C1 }, A::Finish]);
}

#[test]
fn a_panic_while_releasing_closes_at_once_and_warns() {
    let mut f = Fixture::leader();
    f.event(100, Control::Cancelled);
    f.drain();
    f.event(101, Control::Panicked);
    assert_eq!(
        f.drain(),
        vec![
            A::CloseConnection { conn: C1 },
            log(LogKind::AbandonedAfterPanic, Some(T1), None),
            A::Finish
        ]
    );
}

#[test]
fn dropping_the_run_while_leading_behaves_like_a_panic_with_its_own_message() {
    let mut f = Fixture::leader();
    f.event(100, Control::Dropped);
    assert_eq!(
        f.drain(),
        vec![
            A::EndTerm {
                term: T1,
                cause: TermEndCause::Lost(LossReason::Dropped)
            },
            A::CloseConnection { conn: C1 },
            log(LogKind::AbandonedAfterDrop, Some(T1), None),
            A::Finish,
        ]
    );
}

// ---- reuse ----

#[test]
fn the_election_can_run_again_after_it_finished_with_fresh_ids() {
    let mut f = Fixture::leader();
    f.event(100, Control::Panicked);
    f.drain();
    assert_eq!(f.election.start(f.at(200)), Ok(()));
    assert_eq!(f.drain(), vec![A::AcquireConnection { conn: C2 }]);
    f.event(201, E::ConnectionAcquired { conn: C2 });
    f.event(
        202,
        E::LockGranted {
            conn: C2,
            backend_pid: PID,
        },
    );
    assert!(f.drain().contains(&A::BeginTerm {
        term: T2,
        epoch: None
    }));
    // The new run's schedule starts at its own start.
    assert_eq!(f.election.poll_timeout(), Some(f.at(200 + IMS)));
}

#[test]
fn inputs_while_not_running_are_ignored() {
    let mut f = Fixture::new();
    assert_eq!(
        f.event(1, Control::Cancelled),
        Handled::Ignored(Ignored::NotRunning)
    );
    assert_eq!(
        f.event(1, Control::Panicked),
        Handled::Ignored(Ignored::NotRunning)
    );
    assert_eq!(
        f.event(
            1,
            E::PingAnswered {
                conn: C1,
                found: LockCheck::holding(PID)
            }
        ),
        Handled::Ignored(Ignored::NotRunning)
    );
    f.timeout(10 * IMS);
    assert_eq!(f.drain(), vec![]);
    assert_eq!(f.election.poll_timeout(), None);
    assert_eq!(f.election.phase(), Phase::Idle);
}

// ---- beyond the spec: the ordered graceful stop ----

fn graceful(grace_ms: u64) -> Options {
    Options::new(CheckInterval::new(I).unwrap())
        .stop_grace(Duration::from_millis(grace_ms))
        .unwrap()
}

#[test]
fn a_graceful_stop_ends_the_term_then_awaits_the_work_before_unlocking() {
    let mut f = Fixture::leader_with(graceful(3_000));
    f.event(100, Control::Cancelled);
    assert_eq!(
        f.drain(),
        vec![
            A::EndTerm {
                term: T1,
                cause: TermEndCause::Stopped
            },
            A::AwaitWork { term: T1 }
        ]
    );
    assert_eq!(f.election.phase(), Phase::Draining);
    assert_eq!(f.election.timeout_reason(), Some(Timer::DrainDeadline));
    assert_eq!(f.election.poll_timeout(), Some(f.at(3_100)));
    assert_eq!(
        f.event(101, Control::Cancelled),
        Handled::Ignored(Ignored::AlreadyStopping)
    );
    assert_eq!(
        f.event(150, E::WorkDrained { term: T2 }),
        Handled::Ignored(Ignored::StaleConnection)
    );
    f.event(200, E::WorkDrained { term: T1 });
    assert_eq!(f.drain(), vec![A::Unlock { conn: C1 }]);
    assert_eq!(f.election.phase(), Phase::Releasing);
    assert_eq!(f.election.poll_timeout(), Some(f.at(2_200)));
}

#[test]
fn work_that_outlives_the_grace_is_reported_and_the_lock_released_anyway() {
    let mut f = Fixture::leader_with(graceful(3_000));
    f.event(100, Control::Cancelled);
    f.drain();
    f.timeout(3_099);
    assert_eq!(f.drain(), vec![]);
    f.timeout(3_100);
    assert_eq!(
        f.drain(),
        vec![
            log(LogKind::WorkOutlivedStop, Some(T1), None),
            A::Unlock { conn: C1 }
        ]
    );
    assert_eq!(
        f.event(3_101, E::WorkDrained { term: T1 }),
        Handled::Ignored(Ignored::Unexpected)
    );
}

#[test]
fn a_session_end_or_a_panic_while_draining_ends_the_run_without_unlocking() {
    let mut f = Fixture::leader_with(graceful(3_000));
    f.event(100, Control::Cancelled);
    f.drain();
    f.event(
        200,
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
    let mut g = Fixture::leader_with(graceful(3_000));
    g.event(100, Control::Cancelled);
    g.drain();
    g.event(200, Control::Panicked);
    assert_eq!(
        g.drain(),
        vec![
            A::CloseConnection { conn: C1 },
            log(LogKind::AbandonedAfterPanic, Some(T1), None),
            A::Finish
        ]
    );
}

#[test]
fn no_check_runs_while_draining() {
    let mut f = Fixture::leader_with(graceful(IMS * 2));
    f.event(100, Control::Cancelled);
    f.drain();
    f.timeout(IMS);
    assert_eq!(f.drain(), vec![]);
    assert_eq!(f.election.phase(), Phase::Draining);
}

// ---- work deadline ----

fn with_work_deadline(after: Duration, on_overdue: OnOverdue) -> Options {
    spec_options().work_deadline(after, on_overdue)
}

#[test]
fn a_lost_terms_work_deadline_asks_for_a_report_when_it_passes_and_not_before() {
    let mut f = Fixture::leader_with(with_work_deadline(I + I / 2, OnOverdue::Report));
    f.timeout(IMS);
    f.drain();
    f.event(
        IMS + 2,
        E::PingFailed {
            conn: C1,
            cause: "reset",
        },
    );
    f.drain();
    // The standby's next check comes first, then the work deadline, 1.5 intervals after the loss.
    f.timeout(2 * IMS);
    assert_eq!(f.drain(), vec![A::AcquireConnection { conn: C2 }]);
    let due = IMS + 2 + IMS + IMS / 2;
    assert_eq!(f.election.timeout_reason(), Some(Timer::WorkDeadline));
    assert_eq!(f.election.poll_timeout(), Some(f.at(due)));
    f.timeout(due - 1);
    assert_eq!(f.drain(), vec![]);
    f.timeout(due);
    assert_eq!(
        f.drain(),
        vec![A::ReportOverdueWork {
            term: T1,
            abort: false,
            run_finished: false,
        }]
    );
    // The standby's acquire goes on under its own deadline.
    assert_eq!(f.election.timeout_reason(), Some(Timer::AcquireDeadline));
    assert_eq!(f.election.poll_timeout(), Some(f.at(3 * IMS)));
}

#[test]
fn a_stopped_terms_work_that_returned_is_never_reported() {
    let options = with_work_deadline(2 * I, OnOverdue::Abort)
        .stop_grace(I)
        .unwrap();
    let mut f = Fixture::leader_with(options);
    f.event(100, Control::Cancelled);
    f.drain();
    f.event(150, E::WorkDrained { term: T1 });
    assert_eq!(f.drain(), vec![A::Unlock { conn: C1 }]);
    f.event(
        160,
        E::UnlockDone {
            conn: C1,
            released: true,
        },
    );
    assert_eq!(
        f.drain(),
        vec![
            A::CloseConnection { conn: C1 },
            log(LogKind::LockReleased, Some(T1), None),
            A::Finish,
        ]
    );
}

#[test]
fn work_still_pending_when_the_run_finishes_is_reported_and_aborted_as_it_finishes() {
    let mut f = Fixture::leader_with(with_work_deadline(2 * I, OnOverdue::Abort));
    f.event(100, Control::Cancelled);
    f.drain();
    f.event(
        101,
        E::UnlockDone {
            conn: C1,
            released: true,
        },
    );
    assert_eq!(
        f.drain(),
        vec![
            A::CloseConnection { conn: C1 },
            log(LogKind::LockReleased, Some(T1), None),
            A::ReportOverdueWork {
                term: T1,
                abort: true,
                run_finished: true,
            },
            A::Finish,
        ]
    );
    assert_eq!(f.election.poll_timeout(), None);
}

#[test]
fn a_work_deadline_is_at_most_seven_days() {
    let options = with_work_deadline(Duration::from_secs(u64::MAX / 2), OnOverdue::Report);
    assert_eq!(options.work_deadline_of().unwrap().after, MAX_HOLD_OFF);
}

#[test]
fn a_work_deadline_and_a_check_due_together_fire_check_first() {
    let mut f = Fixture::leader_with(with_work_deadline(I, OnOverdue::Report));
    f.timeout(IMS);
    f.drain();
    f.event(
        IMS,
        E::PingFailed {
            conn: C1,
            cause: "reset",
        },
    );
    f.drain();
    // The next check and the work deadline both fall due one interval after the loss.
    f.timeout(2 * IMS);
    assert_eq!(
        f.drain(),
        vec![
            A::AcquireConnection { conn: C2 },
            A::ReportOverdueWork {
                term: T1,
                abort: false,
                run_finished: false,
            },
        ]
    );
}

#[test]
fn every_work_deadline_that_passed_fires_in_one_late_timeout() {
    let mut f = Fixture::started_with(with_work_deadline(10 * I, OnOverdue::Report));
    let mut now = 0;
    // Three terms, each granted on its own connection and then lost with its session.
    for term in 1..=3 {
        let c = ConnId::new(term);
        f.event(now + 1, E::ConnectionAcquired { conn: c });
        f.event(
            now + 2,
            E::LockGranted {
                conn: c,
                backend_pid: PID,
            },
        );
        assert_eq!(f.election.term(), Some(TermId::new(term)));
        f.event(
            now + 3,
            E::SessionEnded {
                conn: c,
                cause: "x",
            },
        );
        f.drain();
        now = f
            .election
            .poll_timeout()
            .unwrap()
            .duration_since(f.t0)
            .as_millis() as u64;
        f.timeout(now);
        f.drain();
    }
    let late = f.at(100 * IMS);
    f.election.handle_timeout(late);
    let reports = f
        .drain()
        .into_iter()
        .filter(|action| matches!(action, A::ReportOverdueWork { .. }))
        .count();
    assert_eq!(reports, 3);
    assert!(
        f.election.poll_timeout().unwrap() > late,
        "nothing due is left"
    );
}
