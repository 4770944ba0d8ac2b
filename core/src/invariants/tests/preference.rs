//! The preference rules of the checker (`Options::preference`): a survey only where an attempt
//! or a leader's proof allows one, the attempt after a survey, and `Yielded` only in answer
//! to a survey.

use super::*;
use crate::interval::CheckInterval;
use crate::rank::{Candidate, FloorStep, Rank, Version};

fn mine() -> Option<Candidate> {
    Some(Candidate {
        rank: Rank::of_version(Version::new(1, 0, 0)),
        live_for: Duration::ZERO,
    })
}

fn survey(conn: ConnId, publish: Option<Candidate>) -> A {
    A::SurveyCandidates {
        conn,
        publish,
        floor: FloorStep::Off,
    }
}

fn surveyed(conn: ConnId) -> E {
    E::CandidatesSurveyed {
        conn,
        candidates: vec![],
        floor: None,
    }
}

#[test]
fn a_standby_surveys_on_its_new_connection_then_attempts_or_gives_it_back() {
    let mut trace = Trace::new();
    trace.start(&[A::AcquireConnection { conn: C1 }]).unwrap();
    trace
        .event(1, E::ConnectionAcquired { conn: C1 }, &[survey(C1, mine())])
        .unwrap();
    trace
        .event(2, surveyed(C1), &[A::TryLock { conn: C1 }])
        .unwrap();
    // Deferring: the connection goes back in answer to the survey.
    let mut trace = Trace::new();
    trace.start(&[A::AcquireConnection { conn: C1 }]).unwrap();
    trace
        .event(1, E::ConnectionAcquired { conn: C1 }, &[survey(C1, mine())])
        .unwrap();
    trace
        .event(2, surveyed(C1), &[A::ReturnToPool { conn: C1 }])
        .unwrap();
    // A standby's survey that publishes nothing is no standby's.
    let mut trace = Trace::new();
    trace.start(&[A::AcquireConnection { conn: C1 }]).unwrap();
    violation(
        trace.event(1, E::ConnectionAcquired { conn: C1 }, &[survey(C1, None)]),
        "SurveyCandidates on conn#1 (Acquiring)",
    );
}

#[test]
fn a_leaders_survey_follows_only_a_check_that_proved_the_lock_and_yields_only_after_it() {
    let mut trace = Trace::leading();
    violation(
        trace.timeout(100, &[survey(C1, None)]),
        "SurveyCandidates on conn#1 (Hijacked) in answer to a timeout",
    );
    let mut trace = Trace::leading();
    let proved = E::PingAnswered {
        conn: C1,
        found: LockCheck::holding(PID),
    };
    trace.event(101, proved, &[survey(C1, None)]).unwrap();
    let yielded = [A::EndTerm {
        term: T1,
        cause: TermEndCause::Yielded,
    }];
    trace.event(102, surveyed(C1), &yielded).unwrap();
    let mut trace = Trace::leading();
    violation(trace.timeout(100, &yielded), "EndTerm");
}

fn lease() -> Lease {
    let interval = CheckInterval::new(Duration::from_millis(100)).unwrap();
    Lease::new(interval, Duration::from_millis(300)).unwrap()
}

#[test]
fn a_lease_survey_is_asked_for_like_a_claim_or_after_a_renewal() {
    let leasing = || Trace {
        checker: Checker::new().for_lease(lease()),
        t0: Instant::now(),
    };
    let mut trace = leasing();
    trace.start(&[survey(C1, mine())]).unwrap();
    // Leading: a survey only in answer to a renewal (or a probe that passed).
    let mut trace = leasing();
    trace
        .start(&[A::ClaimLease {
            conn: C1,
            ttl_ms: 300,
        }])
        .unwrap();
    let began = [A::BeginTerm {
        term: T1,
        epoch: Some(3),
    }];
    trace
        .event(5, E::LeaseClaimed { conn: C1, epoch: 3 }, &began)
        .unwrap();
    violation(
        trace.event(6, Control::Cancelled, &[survey(C2, None)]),
        "surveys the candidates",
    );
    let mut trace = leasing();
    trace
        .start(&[A::ClaimLease {
            conn: C1,
            ttl_ms: 300,
        }])
        .unwrap();
    trace
        .event(5, E::LeaseClaimed { conn: C1, epoch: 3 }, &began)
        .unwrap();
    trace
        .timeout(
            100,
            &[A::RenewLease {
                conn: C2,
                epoch: 3,
                ttl_ms: 300,
            }],
        )
        .unwrap();
    trace
        .event(
            101,
            E::LeaseRenewed { conn: C2 },
            &[survey(ConnId::new(3), None)],
        )
        .unwrap();
    // A leader's survey publishes nothing; a standby's, made while a term is open, is wrong.
    let mut trace = leasing();
    trace
        .start(&[A::ClaimLease {
            conn: C1,
            ttl_ms: 300,
        }])
        .unwrap();
    trace
        .event(5, E::LeaseClaimed { conn: C1, epoch: 3 }, &began)
        .unwrap();
    violation(
        trace.timeout(100, &[survey(C2, mine())]),
        "surveys the candidates",
    );
}

#[test]
fn a_standbys_survey_on_a_borrowed_connection_follows_only_a_probe_that_passed() {
    let mut trace = Trace::new();
    trace.start(&[A::AcquireConnection { conn: C1 }]).unwrap();
    trace
        .event(
            1,
            E::ConnectionAcquired { conn: C1 },
            &[A::ProbeFitness { conn: C1 }],
        )
        .unwrap();
    trace
        .event(2, E::Fit { conn: C1 }, &[survey(C1, mine())])
        .unwrap();
    // After a queued wait's release, not after a probe: no survey on that connection.
    let mut trace = Trace::new();
    trace.start(&[A::AcquireConnection { conn: C1 }]).unwrap();
    trace
        .event(
            1,
            E::ConnectionAcquired { conn: C1 },
            &[A::WaitForLock {
                conn: C1,
                lock_timeout_ms: 100,
            }],
        )
        .unwrap();
    trace
        .event(
            50,
            E::LockWaitTimedOut { conn: C1 },
            &[A::ReleaseIfHeld { conn: C1 }],
        )
        .unwrap();
    violation(
        trace.event(
            51,
            E::ReleasedIfHeld {
                conn: C1,
                released: false,
            },
            &[survey(C1, mine())],
        ),
        "SurveyCandidates on conn#1 (Borrowed)",
    );
}
