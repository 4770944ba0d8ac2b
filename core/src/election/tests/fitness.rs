//! The fitness probe (`Options::probe_fitness`): before each attempt and after each check that
//! proved the hold, each asserting the exact actions.

use super::*;
use crate::lease::Lease;

fn probing() -> Options {
    spec_options().probe_fitness(true)
}

/// A standby whose first check's connection came: its probe is in flight on it.
fn probing_standby() -> Fixture {
    let mut f = Fixture::started_with(probing());
    f.event(3, E::ConnectionAcquired { conn: C1 });
    assert_eq!(f.drain(), vec![A::ProbeFitness { conn: C1 }]);
    assert_eq!(f.election.timeout_reason(), Some(Timer::ProbeDeadline));
    assert_eq!(f.election.phase(), Phase::Acquiring);
    f
}

#[test]
fn a_standby_that_probes_tries_the_lock_only_on_the_connection_the_probe_passed_on() {
    let mut f = probing_standby();
    assert_eq!(f.event(4, E::Fit { conn: C1 }), Handled::Applied);
    assert_eq!(f.drain(), vec![A::TryLock { conn: C1 }]);
    assert!(!f.election.is_unfit());
}

#[test]
fn a_refused_probe_makes_no_attempt_until_a_probe_passes_and_says_so_once_each_way() {
    let mut f = probing_standby();
    f.event(
        4,
        E::Unfit {
            conn: C1,
            cause: "permission denied",
        },
    );
    assert_eq!(
        f.drain(),
        vec![
            A::ReturnToPool { conn: C1 },
            log(
                LogKind::Unfit,
                None,
                Some(Cause::Error("permission denied"))
            ),
        ]
    );
    assert!(f.election.is_unfit());
    assert!(!f.election.is_leader());
    // The next check probes again before anything else; still refused, still no attempt.
    f.timeout(IMS);
    assert_eq!(f.drain(), vec![A::AcquireConnection { conn: C2 }]);
    f.event(IMS + 1, E::ConnectionAcquired { conn: C2 });
    assert_eq!(f.drain(), vec![A::ProbeFitness { conn: C2 }]);
    f.event(IMS + 2, E::Fit { conn: C2 });
    assert_eq!(
        f.drain(),
        vec![log(LogKind::FitAgain, None, None), A::TryLock { conn: C2 }]
    );
    assert!(!f.election.is_unfit());
    assert_eq!(LogKind::FitAgain.level(), Level::Info);
}

#[test]
fn a_probe_that_fails_or_does_not_answer_ends_the_standbys_check_and_closes_its_connection() {
    let mut f = probing_standby();
    f.event(
        4,
        E::ProbeFailed {
            conn: C1,
            cause: "connection reset",
        },
    );
    assert_eq!(
        f.drain(),
        vec![
            A::CloseConnection { conn: C1 },
            log(
                LogKind::ProbeFailed,
                None,
                Some(Cause::Error("connection reset"))
            ),
        ]
    );
    assert!(!f.election.is_unfit(), "a failure says nothing of fitness");
    let mut f = probing_standby();
    f.timeout(3 + IMS);
    assert_eq!(
        f.drain(),
        vec![
            A::CloseConnection { conn: C1 },
            log(LogKind::ProbeFailed, None, Some(Cause::TimedOut(I))),
            A::AcquireConnection { conn: C2 },
        ]
    );
}

/// Leading on C1 after a probe that passed; the first check's ping answered at one interval.
fn probed_leader() -> Fixture {
    let mut f = probing_standby();
    f.event(4, E::Fit { conn: C1 });
    f.event(
        5,
        E::LockGranted {
            conn: C1,
            backend_pid: PID,
        },
    );
    f.drain();
    assert!(f.election.is_leader());
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
        E::PingAnswered {
            conn: C1,
            found: LockCheck::holding(PID),
        },
    );
    assert_eq!(f.drain(), vec![A::ProbeFitness { conn: C1 }]);
    assert_eq!(f.election.timeout_reason(), Some(Timer::ProbeDeadline));
    assert_eq!(
        f.election.poll_timeout(),
        Some(f.at(2 * IMS)),
        "the check's deadline"
    );
    f
}

#[test]
fn the_leader_probes_on_its_lock_session_after_each_check_that_proved_the_lock() {
    let mut f = probed_leader();
    f.event(IMS + 2, E::Fit { conn: C1 });
    assert_eq!(f.drain(), vec![]);
    assert_eq!(f.election.timeout_reason(), Some(Timer::NextCheck));
    assert!(f.election.is_leader());
}

#[test]
fn a_leader_whose_probe_is_refused_gives_its_term_up_and_stays_a_standby() {
    let mut f = probed_leader();
    f.event(
        IMS + 2,
        E::Unfit {
            conn: C1,
            cause: "permission denied",
        },
    );
    assert_eq!(
        f.drain(),
        vec![
            log(
                LogKind::Unfit,
                Some(T1),
                Some(Cause::Error("permission denied"))
            ),
            A::EndTerm {
                term: T1,
                cause: TermEndCause::Unfit
            },
            A::Unlock { conn: C1 },
        ]
    );
    assert!(!f.election.is_leader());
    assert!(f.election.is_unfit());
    f.event(
        IMS + 3,
        E::UnlockDone {
            conn: C1,
            released: true,
        },
    );
    f.drain();
    // A standby again, which probes before it tries.
    f.timeout(2 * IMS);
    assert_eq!(f.drain(), vec![A::AcquireConnection { conn: C2 }]);
    assert_eq!(TermEndCause::Unfit.label(), "unfit");
}

#[test]
fn an_advisory_leaders_probe_that_fails_or_does_not_answer_fails_its_check() {
    let mut f = probed_leader();
    f.event(
        IMS + 2,
        E::ProbeFailed {
            conn: C1,
            cause: "connection reset",
        },
    );
    let actions = f.drain();
    assert!(actions.contains(&A::EndTerm {
        term: T1,
        cause: TermEndCause::Lost(LossReason::CheckFailed)
    }));
    let mut f = probed_leader();
    f.timeout(2 * IMS);
    assert!(f.drain().contains(&A::EndTerm {
        term: T1,
        cause: TermEndCause::Lost(LossReason::CheckTimedOut)
    }));
}

fn lease_probing() -> Options {
    let options = probing();
    options.lease(Lease::default_for(options.interval()))
}

#[test]
fn a_lease_standby_probes_as_an_operation_of_its_own_then_claims() {
    let mut f = Fixture::with(lease_probing());
    f.election.start(f.t0).unwrap();
    assert_eq!(f.drain(), vec![A::ProbeFitness { conn: C1 }]);
    f.event(2, E::Fit { conn: C1 });
    assert!(matches!(f.drain().as_slice(), [A::ClaimLease { conn, .. }] if *conn == C2));
    // Refused: no claim, nothing to give back.
    let mut f = Fixture::with(lease_probing());
    f.election.start(f.t0).unwrap();
    f.drain();
    f.event(
        2,
        E::Unfit {
            conn: C1,
            cause: "permission denied",
        },
    );
    assert_eq!(
        f.drain(),
        vec![log(
            LogKind::Unfit,
            None,
            Some(Cause::Error("permission denied"))
        )]
    );
}

#[test]
fn a_lease_leaders_probe_that_fails_keeps_the_term_while_the_lease_is_trusted() {
    let mut f = Fixture::with(lease_probing());
    f.election.start(f.t0).unwrap();
    f.drain();
    f.event(1, E::Fit { conn: C1 });
    f.drain();
    f.event(2, E::LeaseClaimed { conn: C2, epoch: 3 });
    f.drain();
    f.timeout(IMS);
    assert!(
        matches!(f.drain().as_slice(), [A::RenewLease { conn, .. }] if *conn == ConnId::new(3))
    );
    f.event(
        IMS + 1,
        E::LeaseRenewed {
            conn: ConnId::new(3),
        },
    );
    let probe = ConnId::new(4);
    assert_eq!(f.drain(), vec![A::ProbeFitness { conn: probe }]);
    f.event(
        IMS + 2,
        E::ProbeFailed {
            conn: probe,
            cause: "pool timed out",
        },
    );
    assert_eq!(
        f.drain(),
        vec![log(
            LogKind::ProbeFailed,
            Some(T1),
            Some(Cause::Error("pool timed out"))
        )]
    );
    assert!(f.election.is_leader());
    // Unanswered within the check: given up, and the term still goes on.
    f.timeout(2 * IMS);
    f.drain();
    f.event(
        2 * IMS + 1,
        E::LeaseRenewed {
            conn: ConnId::new(5),
        },
    );
    assert_eq!(
        f.drain(),
        vec![A::ProbeFitness {
            conn: ConnId::new(6)
        }]
    );
    f.timeout(3 * IMS);
    let actions = f.drain();
    assert_eq!(
        actions[0],
        A::ReturnToPool {
            conn: ConnId::new(6)
        }
    );
    assert!(f.election.is_leader());
}
