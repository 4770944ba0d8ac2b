//! The fitness rules of the checker (`Options::probe_fitness`): a correct probing trace passes,
//! and each rule broken on purpose is reported.

use super::*;
use crate::interval::CheckInterval;

/// Started, conn 1 acquired and its probe sent.
fn probing() -> Trace {
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
}

/// `probing`, refused: the connection went back, and the next check's connection came.
fn unfit() -> Trace {
    let mut trace = probing();
    trace
        .event(
            2,
            E::Unfit { conn: C1, cause: 7 },
            &[A::ReturnToPool { conn: C1 }],
        )
        .unwrap();
    trace
        .timeout(100, &[A::AcquireConnection { conn: C2 }])
        .unwrap();
    trace
}

#[test]
fn an_attempt_follows_only_a_probe_that_passed_once_one_was_refused() {
    // Passed: the attempt on the probed connection is right.
    let mut trace = probing();
    trace
        .event(2, E::Fit { conn: C1 }, &[A::TryLock { conn: C1 }])
        .unwrap();
    // Refused, then an attempt without a probe that passed.
    let mut trace = unfit();
    violation(
        trace.event(
            101,
            E::ConnectionAcquired { conn: C2 },
            &[A::TryLock { conn: C2 }],
        ),
        "TryLock on conn#2 while the replica is unfit",
    );
    // Refused, probed again, passed: the attempt is right.
    let mut trace = unfit();
    trace
        .event(
            101,
            E::ConnectionAcquired { conn: C2 },
            &[A::ProbeFitness { conn: C2 }],
        )
        .unwrap();
    trace
        .event(102, E::Fit { conn: C2 }, &[A::TryLock { conn: C2 }])
        .unwrap();
}

#[test]
fn a_leaders_probe_follows_only_a_check_that_proved_the_lock() {
    let mut trace = Trace::leading();
    violation(
        trace.timeout(100, &[A::ProbeFitness { conn: C1 }]),
        "ProbeFitness on conn#1 (Hijacked) in answer to a timeout",
    );
    let mut trace = Trace::leading();
    let proved = E::PingAnswered {
        conn: C1,
        found: LockCheck::holding(PID),
    };
    trace
        .event(101, proved, &[A::ProbeFitness { conn: C1 }])
        .unwrap();
}

#[test]
fn a_term_ends_unfit_only_on_a_refused_probe() {
    let unfit_end = [A::EndTerm {
        term: T1,
        cause: TermEndCause::Unfit,
    }];
    let mut trace = Trace::leading();
    violation(trace.timeout(100, &unfit_end), "EndTerm");
    let mut trace = Trace::leading();
    trace
        .event(101, E::Unfit { conn: C1, cause: 7 }, &unfit_end)
        .unwrap();
}

fn lease() -> Lease {
    let interval = CheckInterval::new(Duration::from_millis(100)).unwrap();
    Lease::new(interval, Duration::from_millis(300)).unwrap()
}

#[test]
fn a_lease_probe_is_asked_for_like_a_claim_or_after_a_renewal_and_no_claim_while_unfit() {
    let mut trace = Trace {
        checker: Checker::new().for_lease(lease()),
        t0: Instant::now(),
    };
    trace.start(&[A::ProbeFitness { conn: C1 }]).unwrap();
    trace
        .event(1, E::Unfit { conn: C1, cause: 7 }, &[])
        .unwrap();
    violation(
        trace.timeout(
            100,
            &[A::ClaimLease {
                conn: C2,
                ttl_ms: 300,
            }],
        ),
        "claims the lease while the replica is unfit",
    );
    // Leading: a probe only in answer to a renewal.
    let mut trace = Trace {
        checker: Checker::new().for_lease(lease()),
        t0: Instant::now(),
    };
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
        trace.event(6, Control::Cancelled, &[A::ProbeFitness { conn: C2 }]),
        "probes the fitness of term",
    );
}
