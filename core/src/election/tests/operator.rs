//! Resign, hold-offs and eligibility: exact actions per input.

use super::*;

// ---- resign and eligibility ----

const HOLD: Duration = Duration::from_secs(12);

#[test]
fn a_resign_ends_the_term_as_resigned_releases_and_waits_out_the_hold_off_as_a_standby() {
    let mut f = Fixture::leader();
    assert_eq!(
        f.event(100, Control::Resign { hold_off: HOLD }),
        Handled::Applied
    );
    assert_eq!(
        f.drain(),
        vec![
            A::EndTerm {
                term: T1,
                cause: TermEndCause::Resigned
            },
            log(LogKind::Resigned, Some(T1), None),
            A::Unlock { conn: C1 },
        ]
    );
    assert!(!f.election.is_leader());
    f.event(
        120,
        E::UnlockDone {
            conn: C1,
            released: true,
        },
    );
    assert_eq!(
        f.drain(),
        vec![
            A::CloseConnection { conn: C1 },
            log(LogKind::ResignReleased, Some(T1), None),
        ]
    );
    assert!(f.election.is_running());
    assert_eq!(f.election.phase(), Phase::StandbyWaiting);
    assert_eq!(f.election.poll_timeout(), Some(f.at(100) + HOLD));
    assert_eq!(f.election.held_off_until(f.at(120)), Some(f.at(100) + HOLD));
    f.timeout(100 + 12_000);
    assert_eq!(f.drain(), vec![A::AcquireConnection { conn: C2 }]);
    assert_eq!(f.election.held_off_until(f.at(100 + 12_000)), None);
}

#[test]
fn a_resign_gives_the_work_its_stop_grace_before_unlocking() {
    let mut f = Fixture::leader_with(options_with_grace());
    f.event(100, Control::Resign { hold_off: HOLD });
    assert_eq!(
        f.drain(),
        vec![
            A::EndTerm {
                term: T1,
                cause: TermEndCause::Resigned
            },
            log(LogKind::Resigned, Some(T1), None),
            A::AwaitWork { term: T1 },
        ]
    );
    assert_eq!(f.election.phase(), Phase::Draining);
    f.event(150, E::WorkDrained { term: T1 });
    assert_eq!(f.drain(), vec![A::Unlock { conn: C1 }]);
}

fn options_with_grace() -> Options {
    Options::new(CheckInterval::new(I).unwrap())
}

#[test]
fn a_stop_during_a_resign_finishes_the_run_after_the_release() {
    let mut f = Fixture::leader_with(options_with_grace());
    f.event(100, Control::Resign { hold_off: HOLD });
    f.drain();
    assert_eq!(f.event(110, Control::Cancelled), Handled::Applied);
    assert_eq!(f.drain(), vec![]);
    assert_eq!(
        f.event(111, Control::Cancelled),
        Handled::Ignored(Ignored::AlreadyStopping)
    );
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
    assert!(!f.election.is_running());
}

#[test]
fn a_second_resign_while_releasing_extends_the_hold_off_after_the_release() {
    let mut f = Fixture::leader();
    f.event(100, Control::Resign { hold_off: HOLD });
    f.drain();
    let longer = HOLD * 2;
    assert_eq!(
        f.event(101, Control::Resign { hold_off: longer }),
        Handled::Applied
    );
    assert_eq!(f.drain(), vec![], "the release in progress goes on");
    assert_eq!(f.election.phase(), Phase::Releasing);
    f.event(
        120,
        E::UnlockDone {
            conn: C1,
            released: true,
        },
    );
    f.drain();
    assert_eq!(f.election.phase(), Phase::StandbyWaiting);
    assert_eq!(f.election.poll_timeout(), Some(f.at(101) + longer));
}

#[test]
fn a_second_shorter_resign_while_releasing_keeps_the_first_hold_off() {
    let mut f = Fixture::leader();
    f.event(100, Control::Resign { hold_off: HOLD });
    f.drain();
    f.event(101, Control::Resign { hold_off: I });
    f.event(
        120,
        E::UnlockDone {
            conn: C1,
            released: true,
        },
    );
    f.drain();
    assert_eq!(f.election.poll_timeout(), Some(f.at(100) + HOLD));
}

#[test]
fn a_resign_during_a_stops_release_is_ignored() {
    let mut f = Fixture::leader();
    f.event(100, Control::Cancelled);
    f.drain();
    assert_eq!(
        f.event(101, Control::Resign { hold_off: HOLD }),
        Handled::Ignored(Ignored::AlreadyStopping)
    );
    assert_eq!(f.drain(), vec![]);
}

#[test]
fn a_failed_release_after_a_resign_warns_closes_and_stays_standby() {
    let mut f = Fixture::leader();
    f.event(100, Control::Resign { hold_off: HOLD });
    f.drain();
    f.event(
        110,
        E::UnlockFailed {
            conn: C1,
            cause: "reset",
        },
    );
    assert_eq!(
        f.drain(),
        vec![
            A::CloseConnection { conn: C1 },
            log(
                LogKind::ReleaseFailed,
                Some(T1),
                Some(Cause::Error("reset"))
            ),
        ]
    );
    assert!(f.election.is_running());
    assert_eq!(f.election.phase(), Phase::StandbyWaiting);
}

#[test]
fn a_session_that_ends_during_a_resign_leaves_a_standby_not_a_finished_run() {
    let mut f = Fixture::leader_with(options_with_grace());
    f.event(100, Control::Resign { hold_off: HOLD });
    f.drain();
    f.event(
        110,
        E::SessionEnded {
            conn: C1,
            cause: "terminated",
        },
    );
    assert_eq!(
        f.drain(),
        vec![
            A::CloseConnection { conn: C1 },
            log(
                LogKind::SessionEndedWhileStopping,
                Some(T1),
                Some(Cause::Error("terminated"))
            ),
        ]
    );
    assert!(f.election.is_running());
    assert_eq!(f.election.poll_timeout(), Some(f.at(100) + HOLD));
}

#[test]
fn a_resign_on_a_standby_mid_check_closes_its_connection_and_holds_off() {
    let mut f = Fixture::started();
    f.event(3, E::ConnectionAcquired { conn: C1 });
    f.drain();
    assert_eq!(
        f.event(4, Control::Resign { hold_off: HOLD }),
        Handled::Applied
    );
    assert_eq!(f.drain(), vec![A::CloseConnection { conn: C1 }]);
    // A grant that answers the abandoned statement is stale.
    assert_eq!(
        f.event(
            5,
            E::LockGranted {
                conn: C1,
                backend_pid: PID
            }
        ),
        Handled::Ignored(Ignored::StaleConnection)
    );
    assert_eq!(f.election.poll_timeout(), Some(f.at(4) + HOLD));
    f.timeout(4 + 12_000);
    assert_eq!(f.drain(), vec![A::AcquireConnection { conn: C2 }]);
}

#[test]
fn a_waiting_standby_that_resigns_skips_its_checks_until_the_hold_off_ends() {
    let mut f = Fixture::started();
    f.event(3, E::ConnectionAcquired { conn: C1 });
    f.event(4, E::LockRefused { conn: C1 });
    f.drain();
    assert_eq!(
        f.event(6, Control::Resign { hold_off: HOLD }),
        Handled::Applied
    );
    assert_eq!(f.drain(), vec![]);
    assert_eq!(f.election.poll_timeout(), Some(f.at(6) + HOLD));
}

#[test]
fn a_hold_off_longer_than_the_maximum_is_shortened_to_it() {
    let mut f = Fixture::leader();
    f.event(
        100,
        Control::Resign {
            hold_off: Duration::MAX,
        },
    );
    assert_eq!(
        f.election.held_off_until(f.at(100)),
        Some(f.at(100) + MAX_HOLD_OFF)
    );
}

#[test]
fn an_ineligible_replica_never_asks_for_a_connection_until_made_eligible() {
    let mut f = Fixture::with(spec_options().eligible(false));
    f.election.start(f.t0).unwrap();
    assert_eq!(f.drain(), vec![]);
    assert_eq!(f.election.poll_timeout(), Some(f.at(IMS)));
    f.timeout(IMS);
    assert_eq!(f.drain(), vec![]);
    assert_eq!(f.election.poll_timeout(), Some(f.at(2 * IMS)));
    assert_eq!(
        f.event(6_000, Control::SetEligible { eligible: true }),
        Handled::Applied
    );
    assert_eq!(f.drain(), vec![]);
    f.timeout(2 * IMS);
    assert_eq!(f.drain(), vec![A::AcquireConnection { conn: C1 }]);
}

#[test]
fn making_the_leader_ineligible_resigns_and_keeps_it_out_until_eligible_again() {
    let mut f = Fixture::leader();
    assert_eq!(
        f.event(100, Control::SetEligible { eligible: false }),
        Handled::Applied
    );
    assert_eq!(
        f.drain(),
        vec![
            A::EndTerm {
                term: T1,
                cause: TermEndCause::Resigned
            },
            log(LogKind::Resigned, Some(T1), None),
            A::Unlock { conn: C1 },
        ]
    );
    f.event(
        110,
        E::UnlockDone {
            conn: C1,
            released: true,
        },
    );
    f.drain();
    for k in 1..=3 {
        f.timeout(k * IMS);
        assert_eq!(f.drain(), vec![], "check {k}");
    }
    f.event(3 * IMS + 1, Control::SetEligible { eligible: true });
    f.timeout(4 * IMS);
    assert_eq!(f.drain(), vec![A::AcquireConnection { conn: C2 }]);
}

#[test]
fn eligibility_is_kept_while_not_running_and_a_repeated_setting_is_ignored() {
    let mut f = Fixture::new();
    assert_eq!(
        f.event(0, Control::SetEligible { eligible: false }),
        Handled::Applied
    );
    assert!(!f.election.is_eligible());
    assert_eq!(
        f.event(1, Control::SetEligible { eligible: false }),
        Handled::Ignored(Ignored::Unchanged)
    );
    f.election.start(f.at(2)).unwrap();
    assert_eq!(f.drain(), vec![]);
    assert!(f.election.is_running());
}

#[test]
fn a_resign_while_not_running_is_ignored() {
    let mut f = Fixture::new();
    assert_eq!(
        f.event(0, Control::Resign { hold_off: HOLD }),
        Handled::Ignored(Ignored::NotRunning)
    );
}

// ---- hold-offs and eligibility (mutation survivors) ----

#[test]
fn a_hold_off_longer_than_seven_days_is_shortened_to_seven_days() {
    assert_eq!(MAX_HOLD_OFF, Duration::from_secs(604_800));
    let mut f = Fixture::started();
    let month = Duration::from_secs(30 * 24 * 60 * 60);
    f.event(1, Control::Resign { hold_off: month });
    assert_eq!(
        f.election.held_off_until(f.at(1)),
        Some(f.at(1) + Duration::from_secs(604_800))
    );
}

#[test]
fn eligibility_reads_back_as_set() {
    let mut f = Fixture::new();
    assert!(f.election.is_eligible(), "eligible by default");
    f.event(0, Control::SetEligible { eligible: false });
    assert!(!f.election.is_eligible());
    f.event(0, Control::SetEligible { eligible: true });
    assert!(f.election.is_eligible());
}

#[test]
fn a_check_handled_late_after_a_hold_off_still_begins() {
    let mut f = Fixture::started();
    f.event(1, Control::Resign { hold_off: 3 * I });
    f.drain();
    // The first check after the hold-off falls due at its end; the driver gets to it late.
    assert_eq!(f.election.poll_timeout(), Some(f.at(1 + 3 * IMS)));
    f.timeout(1 + 3 * IMS + 500);
    assert_eq!(f.drain(), vec![A::AcquireConnection { conn: C2 }]);
}
