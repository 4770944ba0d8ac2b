//! The lease mechanism: claim, renewal, trust window, release, each asserting the exact actions.

use super::*;
use crate::lease::Lease;

const TTL_MS: u32 = 3 * IMS as u32;
/// The trust window of the default lease: nine tenths of three intervals.
const TRUST_MS: u64 = 13_500;

fn lease_options() -> Options {
    let options = spec_options();
    options.lease(Lease::default_for(options.interval()))
}

/// Started at t0; the first claim drained.
fn claiming() -> Fixture {
    let mut f = Fixture::with(lease_options());
    f.election.start(f.t0).unwrap();
    assert_eq!(
        f.drain(),
        vec![A::ClaimLease {
            conn: C1,
            ttl_ms: TTL_MS
        }]
    );
    f
}

/// Leading with term 1 of epoch 7 since the claim answered at 10 ms.
fn lease_leader() -> Fixture {
    let mut f = claiming();
    f.event(10, E::LeaseClaimed { conn: C1, epoch: 7 });
    assert_eq!(
        f.drain(),
        vec![
            A::BeginTerm {
                term: T1,
                epoch: Some(7)
            },
            log(LogKind::LeadershipAcquired, Some(T1), None),
        ]
    );
    f
}

#[test]
fn a_standby_claims_the_lease_without_a_connection_of_its_own() {
    let f = claiming();
    assert_eq!(f.election.phase(), Phase::TryingLock);
    assert_eq!(f.election.poll_timeout(), Some(f.at(IMS)));
}

#[test]
fn a_refused_claim_waits_for_the_next_check_with_nothing_to_give_back() {
    let mut f = claiming();
    assert_eq!(f.event(3, E::LockRefused { conn: C1 }), Handled::Applied);
    assert_eq!(f.drain(), vec![]);
    assert_eq!(f.election.poll_timeout(), Some(f.at(IMS)));
    f.timeout(IMS);
    assert_eq!(
        f.drain(),
        vec![A::ClaimLease {
            conn: C2,
            ttl_ms: TTL_MS
        }]
    );
}

#[test]
fn a_claimed_lease_begins_a_term_with_its_epoch_trusted_from_the_claims_send() {
    let f = lease_leader();
    assert!(f.election.is_leader());
    assert_eq!(f.election.timeout_reason(), Some(Timer::NextCheck));
    assert_eq!(f.election.poll_timeout(), Some(f.at(IMS)));
    // Trusted from the claim's send (at start, 0 ms), not from its answer.
    assert_eq!(f.election.trust_deadline(), Some(f.at(TRUST_MS)));
}

#[test]
fn the_leaders_check_renews_and_a_renewal_extends_the_trust_from_its_send() {
    let mut f = lease_leader();
    f.timeout(IMS);
    assert_eq!(
        f.drain(),
        vec![A::RenewLease {
            conn: C2,
            epoch: 7,
            ttl_ms: TTL_MS
        }]
    );
    assert_eq!(f.election.phase(), Phase::Pinging);
    assert_eq!(
        f.event(IMS + 40, E::LeaseRenewed { conn: C2 }),
        Handled::Applied
    );
    assert_eq!(f.drain(), vec![]);
    assert_eq!(f.election.last_verified(), Some(f.at(IMS + 40)));
    assert_eq!(f.election.trust_deadline(), Some(f.at(IMS + TRUST_MS)));
    // Two renewals fail in a row: the term goes on until the trust of the last success (sent
    // at one interval) ends, 13.5 s after it.
    for (at, conn) in [(2 * IMS, ConnId::new(3)), (3 * IMS, ConnId::new(4))] {
        f.timeout(at);
        f.drain();
        f.event(
            at + 1,
            E::PingFailed {
                conn,
                cause: "boom",
            },
        );
        assert_eq!(
            f.drain(),
            vec![log(
                LogKind::LeaseRenewalFailed,
                Some(T1),
                Some(Cause::Error("boom"))
            )]
        );
        assert!(f.election.is_leader());
    }
    assert_eq!(f.election.timeout_reason(), Some(Timer::LeaseExpiry));
    assert_eq!(f.election.poll_timeout(), Some(f.at(IMS + TRUST_MS)));
}

#[test]
fn an_unanswered_renewal_is_given_up_and_the_term_goes_on() {
    let mut f = lease_leader();
    f.timeout(IMS);
    f.drain();
    f.timeout(2 * IMS);
    assert_eq!(
        f.drain(),
        vec![
            A::ReturnToPool { conn: C2 },
            log(
                LogKind::LeaseRenewalFailed,
                Some(T1),
                Some(Cause::TimedOut(I))
            ),
            A::RenewLease {
                conn: ConnId::new(3),
                epoch: 7,
                ttl_ms: TTL_MS
            },
        ]
    );
    assert!(f.election.is_leader());
    assert_eq!(
        f.event(2 * IMS + 1, E::LeaseRenewed { conn: C2 }),
        Handled::Ignored(Ignored::StaleConnection)
    );
}

#[test]
fn the_term_ends_when_the_trust_ends_even_with_a_renewal_in_flight() {
    let mut f = lease_leader();
    // The claim was sent at 0: its trust ends at 13.5 s. The renewals never answer in time.
    for at in [IMS, 2 * IMS] {
        f.timeout(at);
        f.drain();
    }
    f.timeout(TRUST_MS - 1);
    assert!(f.election.is_leader());
    f.timeout(TRUST_MS);
    assert_eq!(
        f.drain(),
        vec![
            A::EndTerm {
                term: T1,
                cause: TermEndCause::Lost(LossReason::LeaseExpired)
            },
            A::ReturnToPool {
                conn: ConnId::new(3)
            },
            log(
                LogKind::LeadershipLost,
                Some(T1),
                Some(Cause::LeaseNotRenewed {
                    trusted_for: Duration::from_millis(TRUST_MS)
                })
            ),
        ]
    );
    assert!(!f.election.is_leader());
}

#[test]
fn a_renewal_that_finds_the_row_taken_loses_the_term() {
    let mut f = lease_leader();
    f.timeout(IMS);
    f.drain();
    f.event(IMS + 3, E::LeaseLost { conn: C2 });
    assert_eq!(
        f.drain(),
        vec![
            A::EndTerm {
                term: T1,
                cause: TermEndCause::Lost(LossReason::LeaseTaken)
            },
            log(LogKind::LeadershipLost, Some(T1), Some(Cause::LeaseTaken)),
        ]
    );
    assert_eq!(f.election.poll_timeout(), Some(f.at(2 * IMS)));
}

#[test]
fn a_claim_whose_epoch_did_not_advance_begins_no_term() {
    let mut f = lease_leader();
    f.timeout(IMS);
    f.drain();
    f.event(IMS + 3, E::LeaseLost { conn: C2 });
    f.drain();
    f.timeout(2 * IMS);
    f.drain();
    f.event(
        2 * IMS + 3,
        E::LeaseClaimed {
            conn: ConnId::new(3),
            epoch: 7,
        },
    );
    assert_eq!(
        f.drain(),
        vec![log(
            LogKind::FencingFailed,
            None,
            Some(Cause::EpochDidNotAdvance { epoch: 7, last: 7 })
        )]
    );
    assert!(!f.election.is_leader());
}

#[test]
fn an_unanswered_claim_holds_the_standby_off_until_its_lease_would_have_expired() {
    let mut f = claiming();
    f.timeout(IMS);
    assert_eq!(
        f.drain(),
        vec![
            A::ReturnToPool { conn: C1 },
            log(LogKind::AcquireFailed, None, Some(Cause::TimedOut(I))),
        ]
    );
    // Sent at 0: the lease it may have taken lasts 15 s; one interval more for another's check.
    assert_eq!(f.election.held_off_until(f.at(IMS)), Some(f.at(4 * IMS)));
    assert_eq!(f.election.poll_timeout(), Some(f.at(4 * IMS)));
    // A failed claim (an error, so rolled back) holds nothing off.
    let mut f = claiming();
    f.event(
        2,
        E::LockQueryFailed {
            conn: C1,
            cause: "boom",
        },
    );
    assert_eq!(
        f.drain(),
        vec![log(
            LogKind::AcquireFailed,
            None,
            Some(Cause::Error("boom"))
        )]
    );
    assert_eq!(f.election.held_off_until(f.at(2)), None);
}

#[test]
fn a_stop_ends_the_term_then_releases_the_lease_by_its_epoch() {
    let mut f = lease_leader();
    f.event(20, Control::Cancelled);
    assert_eq!(
        f.drain(),
        vec![
            A::EndTerm {
                term: T1,
                cause: TermEndCause::Stopped
            },
            A::ReleaseLease { conn: C2, epoch: 7 },
        ]
    );
    assert_eq!(f.election.timeout_reason(), Some(Timer::UnlockDeadline));
    f.event(
        30,
        E::UnlockDone {
            conn: C2,
            released: true,
        },
    );
    assert_eq!(
        f.drain(),
        vec![log(LogKind::LockReleased, Some(T1), None), A::Finish]
    );
}

#[test]
fn a_release_that_finds_the_row_taken_or_does_not_answer_is_reported() {
    let mut f = lease_leader();
    f.event(20, Control::Cancelled);
    f.drain();
    f.event(
        30,
        E::UnlockDone {
            conn: C2,
            released: false,
        },
    );
    assert_eq!(
        f.drain(),
        vec![
            log(LogKind::ReleaseFailed, Some(T1), Some(Cause::LeaseNotHeld)),
            A::Finish
        ]
    );
    let mut f = lease_leader();
    f.event(20, Control::Cancelled);
    f.drain();
    f.timeout(20 + UNLOCK_BUDGET.as_millis() as u64);
    assert_eq!(
        f.drain(),
        vec![
            A::ReturnToPool { conn: C2 },
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
fn a_stop_during_a_renewal_gives_the_renewal_up_first() {
    let mut f = lease_leader();
    f.timeout(IMS);
    f.drain();
    f.event(IMS + 1, Control::Cancelled);
    assert_eq!(
        f.drain(),
        vec![
            A::ReturnToPool { conn: C2 },
            A::EndTerm {
                term: T1,
                cause: TermEndCause::Stopped
            },
            A::ReleaseLease {
                conn: ConnId::new(3),
                epoch: 7
            },
        ]
    );
}

#[test]
fn a_panic_ends_the_term_as_lost_and_leaves_the_lease_to_expire() {
    let mut f = lease_leader();
    f.timeout(IMS);
    f.drain();
    f.event(IMS + 1, Control::Panicked);
    assert_eq!(
        f.drain(),
        vec![
            A::EndTerm {
                term: T1,
                cause: TermEndCause::Lost(LossReason::Panicked)
            },
            A::ReturnToPool { conn: C2 },
            log(LogKind::AbandonedAfterPanic, Some(T1), None),
            A::Finish
        ]
    );
}

#[test]
fn advisory_answers_are_not_taken_by_a_lease_and_lease_answers_not_by_a_lock() {
    let mut f = claiming();
    let granted = E::LockGranted {
        conn: C1,
        backend_pid: PID,
    };
    assert_eq!(f.event(1, granted), Handled::Ignored(Ignored::Unexpected));
    let mut f = Fixture::started();
    assert_eq!(
        f.event(1, E::LeaseClaimed { conn: C1, epoch: 1 }),
        Handled::Ignored(Ignored::Unexpected)
    );
    let mut f = lease_leader();
    assert_eq!(
        f.event(
            1,
            E::SessionEnded {
                conn: C1,
                cause: "gone"
            }
        ),
        Handled::Ignored(Ignored::StaleConnection)
    );
}
