//! The lease rules of the checker: a correct lease trace passes, and each rule broken on
//! purpose is reported.

use super::*;
use crate::interval::CheckInterval;

const C3: ConnId = ConnId::new(3);
const EPOCH: u64 = 3;
/// The lease of the traces: TTL 300 ms at I = 100 ms, trusted for 270 ms after a send.
const TTL_MS: u32 = 300;
const TRUST_MS: u64 = 270;

fn lease() -> Lease {
    let interval = CheckInterval::new(Duration::from_millis(100)).unwrap();
    Lease::new(interval, Duration::from_millis(TTL_MS.into())).unwrap()
}

fn claim(conn: ConnId) -> A {
    A::ClaimLease {
        conn,
        ttl_ms: TTL_MS,
    }
}

fn renew(conn: ConnId, epoch: u64) -> A {
    A::RenewLease {
        conn,
        epoch,
        ttl_ms: TTL_MS,
    }
}

fn began() -> [A; 1] {
    [A::BeginTerm {
        term: T1,
        epoch: Some(EPOCH),
    }]
}

impl Trace {
    /// A lease election's trace: started (claim 1 sent at 0), claimed at 5 with epoch 3.
    fn leasing() -> Self {
        let mut trace = Self {
            checker: Checker::new().for_lease(lease()),
            t0: Instant::now(),
        };
        trace.start(&[claim(C1)]).unwrap();
        let claimed = E::LeaseClaimed {
            conn: C1,
            epoch: EPOCH,
        };
        trace.event(5, claimed, &began()).unwrap();
        assert!(trace.checker.term_open());
        trace
    }

    /// `input` at `ms`, the actions it queued and the next deadline `next_ms`.
    fn step(
        &mut self,
        ms: u64,
        input: Input<'_, E>,
        actions: &[A],
        next_ms: u64,
    ) -> Result<(), Violation> {
        let (now, next) = (self.at(ms), Some(self.at(next_ms)));
        self.checker.check(now, input, actions, next)
    }
}

fn applied(event: &E) -> Input<'_, E> {
    Input::Event {
        event,
        handled: Handled::Applied,
    }
}

#[test]
fn a_lease_trace_of_claim_renewal_and_release_passes() {
    let mut trace = Trace::leasing();
    trace.timeout(100, &[renew(C2, EPOCH)]).unwrap();
    trace.event(110, E::LeaseRenewed { conn: C2 }, &[]).unwrap();
    // Renewed from its send at 100: trusted until 370.
    trace
        .step(200, Input::Timeout, &[renew(C3, EPOCH)], 370)
        .unwrap();
    let stop = [
        A::ReturnToPool { conn: C3 },
        A::EndTerm {
            term: T1,
            cause: TermEndCause::Stopped,
        },
        A::ReleaseLease {
            conn: ConnId::new(4),
            epoch: EPOCH,
        },
    ];
    trace.event(210, Control::Cancelled, &stop).unwrap();
    let released = E::UnlockDone {
        conn: ConnId::new(4),
        released: true,
    };
    let done = [
        A::Log(LogRecord {
            kind: LogKind::LockReleased,
            term: Some(T1),
            cause: None,
        }),
        A::Finish,
    ];
    trace
        .checker
        .check(trace.at(220), applied(&released), &done, None)
        .unwrap();
}

#[test]
fn a_term_past_its_lease_s_trust_is_reported() {
    let mut trace = Trace::leasing();
    violation(
        trace.step(10, Input::Timeout, &[], TRUST_MS + 1),
        "has no deadline by the end of its lease's trust",
    );
    let mut trace = Trace::leasing();
    violation(
        trace.step(TRUST_MS, Input::Timeout, &[], TRUST_MS),
        "still open at a timeout past its lease's trust",
    );
    // A renewal that failed extends nothing.
    let mut trace = Trace::leasing();
    trace.timeout(100, &[renew(C2, EPOCH)]).unwrap();
    let failed = E::PingFailed { conn: C2, cause: 1 };
    violation(
        trace.step(110, applied(&failed), &[], TRUST_MS + 10),
        "has no deadline",
    );
}

#[test]
fn a_claim_with_a_term_open_or_while_ineligible_is_reported() {
    let mut trace = Trace::leasing();
    violation(
        trace.timeout(100, &[claim(C2)]),
        "claims the lease while term",
    );
    let mut trace = Trace {
        checker: Checker::new().for_lease(lease()).starting_ineligible(),
        t0: Instant::now(),
    };
    violation(trace.start(&[claim(C1)]), "while the replica is ineligible");
}

#[test]
fn a_renewal_not_on_a_deadline_or_of_another_epoch_is_reported() {
    let mut trace = Trace::leasing();
    violation(
        trace.event(6, Control::Cancelled, &[renew(C2, EPOCH)]),
        "RenewLease of epoch 3 in answer to Cancelled",
    );
    let mut trace = Trace::leasing();
    violation(
        trace.timeout(100, &[renew(C2, EPOCH + 1)]),
        "RenewLease of epoch 4",
    );
}

#[test]
fn a_release_without_a_stopped_term_of_its_epoch_on_a_stop_input_is_reported() {
    let release = |epoch| A::ReleaseLease { conn: C2, epoch };
    // The term is still open.
    let mut trace = Trace::leasing();
    violation(
        trace.timeout(100, &[release(EPOCH)]),
        "ReleaseLease of epoch 3",
    );
    // The term was lost, not stopped.
    let mut trace = Trace::leasing();
    let lost = [
        A::EndTerm {
            term: T1,
            cause: TermEndCause::Lost(LossReason::LeaseExpired),
        },
        release(EPOCH),
    ];
    violation(trace.timeout(100, &lost), "ReleaseLease of epoch 3");
    // Stopped, but another epoch.
    let mut trace = Trace::leasing();
    let stopped = A::EndTerm {
        term: T1,
        cause: TermEndCause::Stopped,
    };
    violation(
        trace.event(
            6,
            Control::Cancelled,
            &[stopped.clone(), release(EPOCH + 1)],
        ),
        "ReleaseLease of epoch 4",
    );
    // Stopped, then released in answer to an input that is no stop.
    let mut trace = Trace::leasing();
    trace.event(6, Control::Cancelled, &[stopped]).unwrap();
    violation(
        trace.event(7, E::LeaseRenewed { conn: C1 }, &[release(EPOCH)]),
        "ReleaseLease of epoch 3 in answer to LeaseRenewed",
    );
}

#[test]
fn a_statement_given_up_outside_a_deadline_or_a_control_input_is_reported() {
    let mut trace = Trace::leasing();
    trace.timeout(100, &[renew(C2, EPOCH)]).unwrap();
    violation(
        trace.event(
            101,
            E::WorkDrained { term: T1 },
            &[A::ReturnToPool { conn: C2 }],
        ),
        "ReturnToPool on conn#2",
    );
    // On a deadline or a stop it is the way to give a statement up.
    let mut trace = Trace::leasing();
    trace.timeout(100, &[renew(C2, EPOCH)]).unwrap();
    trace
        .step(
            200,
            Input::Timeout,
            &[A::ReturnToPool { conn: C2 }],
            TRUST_MS,
        )
        .unwrap();
}

#[test]
fn a_lease_term_begun_other_than_by_its_claim_is_reported() {
    let mut trace = Trace {
        checker: Checker::new().for_lease(lease()),
        t0: Instant::now(),
    };
    trace.start(&[claim(C1)]).unwrap();
    violation(
        trace.event(
            5,
            E::LeaseClaimed {
                conn: C1,
                epoch: EPOCH,
            },
            &[A::BeginTerm {
                term: T1,
                epoch: Some(EPOCH + 1),
            }],
        ),
        "not the claimed 3",
    );
    let mut trace = Trace {
        checker: Checker::new().for_lease(lease()),
        t0: Instant::now(),
    };
    trace.start(&[claim(C1)]).unwrap();
    violation(
        trace.timeout(100, &began()),
        "a lease term began in answer to a timeout",
    );
}
