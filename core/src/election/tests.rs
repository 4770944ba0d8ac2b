//! One test per behaviour of the spec's Run, Demotion, Panic and Cancel paragraphs, each asserting
//! the exact list of actions an input queues.
#![allow(clippy::unwrap_used)] // reason: tests fail loudly on the unexpected

use std::time::{Duration, Instant};

use super::*;
use crate::action::{Level, LossReason};
use crate::options::OnOverdue;
use crate::verify::LockCheck;

const I: Duration = Duration::from_secs(5);
const C1: ConnId = ConnId::new(1);
const C2: ConnId = ConnId::new(2);
const T1: TermId = TermId::new(1);
const T2: TermId = TermId::new(2);
/// The backend the fixtures' grants name.
const PID: i32 = 4242;

type A = Action<&'static str>;
type E = Event<&'static str>;

struct Fixture {
    election: Election<&'static str>,
    t0: Instant,
}

fn spec_options() -> Options {
    // The spec's stop: unlock at once after the term ended.
    Options::new(CheckInterval::new(I).unwrap())
        .stop_grace(Duration::ZERO)
        .unwrap()
}

impl Fixture {
    fn new() -> Self {
        Self::with(spec_options())
    }

    fn with(options: Options) -> Self {
        Self {
            election: Election::with_options(options),
            t0: Instant::now(),
        }
    }

    /// Started at t0; the first check's AcquireConnection drained.
    fn started() -> Self {
        Self::started_with(spec_options())
    }

    fn started_with(options: Options) -> Self {
        let mut f = Self::with(options);
        f.election.start(f.t0).unwrap();
        assert_eq!(f.drain(), vec![A::AcquireConnection { conn: C1 }]);
        f
    }

    /// Leading with term 1 on conn 1 since t0 + 10 ms; actions drained.
    fn leader() -> Self {
        Self::leader_with(spec_options())
    }

    fn leader_with(options: Options) -> Self {
        let mut f = Self::started_with(options);
        f.event(10, E::ConnectionAcquired { conn: C1 });
        f.event(
            10,
            E::LockGranted {
                conn: C1,
                backend_pid: PID,
            },
        );
        f.drain();
        assert!(f.election.is_leader());
        f
    }

    fn at(&self, ms: u64) -> Instant {
        self.t0 + Duration::from_millis(ms)
    }

    fn event(&mut self, ms: u64, event: E) -> Handled {
        self.election.handle_event(self.at(ms), event)
    }

    fn timeout(&mut self, ms: u64) {
        self.election.handle_timeout(self.at(ms));
    }

    fn drain(&mut self) -> Vec<A> {
        std::iter::from_fn(|| self.election.poll_action()).collect()
    }
}

fn log(kind: LogKind, term: Option<TermId>, cause: Option<Cause<&'static str>>) -> A {
    A::Log(LogRecord { kind, term, cause })
}

const IMS: u64 = 5_000;

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
    assert_eq!(f.event(2, E::Cancelled), Handled::Applied);
    assert_eq!(f.drain(), vec![A::Finish]);
    assert!(!f.election.is_running());
    assert_eq!(f.election.poll_timeout(), None);
}

#[test]
fn cancelling_a_standby_mid_check_closes_the_connection_of_unknown_state() {
    let mut f = Fixture::started();
    f.event(1, E::ConnectionAcquired { conn: C1 });
    f.drain();
    f.event(2, E::Cancelled);
    assert_eq!(f.drain(), vec![A::CloseConnection { conn: C1 }, A::Finish]);
}

#[test]
fn cancelling_the_leader_ends_the_term_before_unlocking_under_two_seconds() {
    let mut f = Fixture::leader();
    f.event(100, E::Cancelled);
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
    f.event(100, E::Cancelled);
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
    f.event(100, E::Cancelled);
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
    f.event(100, E::Cancelled);
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
    f.event(100, E::Cancelled);
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
    f.event(IMS + 1, E::Cancelled);
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
    f.event(100, E::Cancelled);
    f.drain();
    assert_eq!(
        f.event(101, E::Cancelled),
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
    f.event(IMS + 1, E::Panicked);
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
    f.event(2, E::Panicked);
    assert_eq!(f.drain(), vec![A::CloseConnection { conn: C1 }, A::Finish]);
}

#[test]
fn a_panic_while_releasing_closes_at_once_and_warns() {
    let mut f = Fixture::leader();
    f.event(100, E::Cancelled);
    f.drain();
    f.event(101, E::Panicked);
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
    f.event(100, E::Dropped);
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
    f.event(100, E::Panicked);
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
        f.event(1, E::Cancelled),
        Handled::Ignored(Ignored::NotRunning)
    );
    assert_eq!(
        f.event(1, E::Panicked),
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

// ---- small contracts ----

#[test]
fn getters_and_texts_say_what_they_stand_for() {
    let f = Fixture::new();
    let other = CheckInterval::new(Duration::from_millis(200)).unwrap();
    assert_eq!(Election::<&str>::new(other).interval(), other);
    assert_eq!(
        AlreadyRunning.to_string(),
        "the election is already running"
    );
    assert_eq!(
        TermEndCause::Lost(LossReason::CheckTimedOut).to_string(),
        "leadership lost: the check did not answer in time"
    );
    assert_eq!(TermEndCause::Stopped.to_string(), "election stopped");
    assert_eq!(ConnId::new(7).to_string(), "conn#7");
    assert_eq!((ConnId::new(7).get(), TermId::new(9).get()), (7, 9));
    assert_eq!(TermId::new(7).to_string(), "7");
    assert!(format!("{:?}", f.election).contains("Idle"));
}

#[test]
fn actions_and_events_name_their_connection() {
    let with_conn: Vec<A> = vec![
        A::AcquireConnection { conn: C2 },
        A::TryLock { conn: C2 },
        A::ReturnToPool { conn: C2 },
        A::Hijack {
            conn: C2,
            backend_pid: PID,
        },
        A::Ping {
            conn: C2,
            backend_pid: PID,
        },
        A::Unlock { conn: C2 },
        A::CloseConnection { conn: C2 },
    ];
    assert!(with_conn.iter().all(|a| a.conn() == Some(C2)));
    let without: Vec<A> = vec![
        A::BeginTerm {
            term: T1,
            epoch: None,
        },
        A::EndTerm {
            term: T1,
            cause: TermEndCause::Stopped,
        },
        log(LogKind::LockReleased, None, None),
        A::Finish,
    ];
    assert!(without.iter().all(|a| a.conn().is_none()));
    let events: Vec<E> = vec![
        E::ConnectionAcquired { conn: C2 },
        E::AcquireFailed {
            conn: C2,
            cause: "x",
        },
        E::LockGranted {
            conn: C2,
            backend_pid: PID,
        },
        E::LockRefused { conn: C2 },
        E::LockQueryFailed {
            conn: C2,
            cause: "x",
        },
        E::PingAnswered {
            conn: C2,
            found: LockCheck::holding(PID),
        },
        E::PingFailed {
            conn: C2,
            cause: "x",
        },
        E::UnlockDone {
            conn: C2,
            released: true,
        },
        E::UnlockFailed {
            conn: C2,
            cause: "x",
        },
    ];
    assert!(events.iter().all(|e| e.conn() == Some(C2)));
    assert!(
        [E::Cancelled, E::Panicked, E::Dropped]
            .iter()
            .all(|e| e.conn().is_none())
    );
}

#[test]
fn causes_render_for_the_log() {
    let timed_out: Cause<&str> = Cause::TimedOut(Duration::from_millis(200));
    assert_eq!(timed_out.to_string(), "no answer within 200ms");
    assert!(
        Cause::<&str>::LockNotHeld
            .to_string()
            .contains("did not hold the lock")
    );
    let record = LogRecord {
        kind: LogKind::LockReleased,
        term: Some(T1),
        cause: None::<Cause<&str>>,
    };
    assert_eq!(
        record.to_string(),
        "leader: released background leader lock"
    );
    assert_eq!(record.level(), Level::Info);
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
    f.event(100, E::Cancelled);
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

// ---- beyond the spec: the ordered graceful stop ----

fn graceful(grace_ms: u64) -> Options {
    Options::new(CheckInterval::new(I).unwrap())
        .stop_grace(Duration::from_millis(grace_ms))
        .unwrap()
}

#[test]
fn a_graceful_stop_ends_the_term_then_awaits_the_work_before_unlocking() {
    let mut f = Fixture::leader_with(graceful(3_000));
    f.event(100, E::Cancelled);
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
        f.event(101, E::Cancelled),
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
    f.event(100, E::Cancelled);
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
    f.event(100, E::Cancelled);
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
    g.event(100, E::Cancelled);
    g.drain();
    g.event(200, E::Panicked);
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
    f.event(100, E::Cancelled);
    f.drain();
    f.timeout(IMS);
    assert_eq!(f.drain(), vec![]);
    assert_eq!(f.election.phase(), Phase::Draining);
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
    f.event(3, E::Cancelled);
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

// ---- resign and eligibility ----

const HOLD: Duration = Duration::from_secs(12);

#[test]
fn a_resign_ends_the_term_as_resigned_releases_and_waits_out_the_hold_off_as_a_standby() {
    let mut f = Fixture::leader();
    assert_eq!(f.event(100, E::Resign { hold_off: HOLD }), Handled::Applied);
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
    f.event(100, E::Resign { hold_off: HOLD });
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
    f.event(100, E::Resign { hold_off: HOLD });
    f.drain();
    assert_eq!(f.event(110, E::Cancelled), Handled::Applied);
    assert_eq!(f.drain(), vec![]);
    assert_eq!(
        f.event(111, E::Cancelled),
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
fn a_second_resign_while_releasing_is_ignored() {
    let mut f = Fixture::leader();
    f.event(100, E::Resign { hold_off: HOLD });
    f.drain();
    assert_eq!(
        f.event(101, E::Resign { hold_off: HOLD }),
        Handled::Ignored(Ignored::AlreadyStopping)
    );
    assert_eq!(f.drain(), vec![]);
}

#[test]
fn a_failed_release_after_a_resign_warns_closes_and_stays_standby() {
    let mut f = Fixture::leader();
    f.event(100, E::Resign { hold_off: HOLD });
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
    f.event(100, E::Resign { hold_off: HOLD });
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
    assert_eq!(f.event(4, E::Resign { hold_off: HOLD }), Handled::Applied);
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
    assert_eq!(f.event(6, E::Resign { hold_off: HOLD }), Handled::Applied);
    assert_eq!(f.drain(), vec![]);
    assert_eq!(f.election.poll_timeout(), Some(f.at(6) + HOLD));
}

#[test]
fn a_hold_off_longer_than_the_maximum_is_shortened_to_it() {
    let mut f = Fixture::leader();
    f.event(
        100,
        E::Resign {
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
        f.event(6_000, E::SetEligible { eligible: true }),
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
        f.event(100, E::SetEligible { eligible: false }),
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
    f.event(3 * IMS + 1, E::SetEligible { eligible: true });
    f.timeout(4 * IMS);
    assert_eq!(f.drain(), vec![A::AcquireConnection { conn: C2 }]);
}

#[test]
fn eligibility_is_kept_while_not_running_and_a_repeated_setting_is_ignored() {
    let mut f = Fixture::new();
    assert_eq!(
        f.event(0, E::SetEligible { eligible: false }),
        Handled::Applied
    );
    assert!(!f.election.is_eligible());
    assert_eq!(
        f.event(1, E::SetEligible { eligible: false }),
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
        f.event(0, E::Resign { hold_off: HOLD }),
        Handled::Ignored(Ignored::NotRunning)
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
        assert_eq!(
            f.drain(),
            vec![
                A::EndTerm {
                    term: T1,
                    cause: TermEndCause::Lost(reason)
                },
                A::CloseConnection { conn: C1 },
                log(
                    LogKind::LeadershipLost,
                    Some(T1),
                    Some(Cause::LockNotVerified(finding))
                ),
            ],
            "{found:?}"
        );
        assert!(!f.election.is_leader());
    }
}

#[test]
fn every_term_end_cause_has_its_own_label() {
    let labels: std::collections::BTreeSet<&str> = TermEndCause::ALL
        .iter()
        .map(|cause| cause.label())
        .collect();
    assert_eq!(labels.len(), TermEndCause::ALL.len());
    assert!(TermEndCause::ALL.iter().filter(|c| c.is_loss()).count() == 9);
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
            | LossReason::Dropped,
        )
        | TermEndCause::Stopped
        | TermEndCause::Resigned => true,
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
    ]
    .map(TermEndCause::Lost)
    .into_iter()
    .chain([
        TermEndCause::Stopped,
        TermEndCause::Resigned,
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
    f.event(IMS + 8, E::Cancelled);
    assert_eq!(f.election.last_verified(), None);
}

#[test]
fn a_leader_is_stuck_only_strictly_past_two_intervals_since_its_last_verification() {
    let f = Fixture::leader();
    assert_eq!(f.election.stuck(f.at(10 + 2 * IMS)), Ok(()));
    let stuck = f.election.stuck(f.at(10 + 2 * IMS + 1)).unwrap_err();
    assert_eq!(stuck.bound, 2 * I);
    assert_eq!(stuck.since_last_check, 2 * I + Duration::from_millis(1));
    // A standby or an idle election is never stuck, however late.
    let standby = Fixture::started();
    assert_eq!(standby.election.stuck(standby.at(100 * IMS)), Ok(()));
    assert_eq!(Fixture::new().election.stuck(Instant::now()), Ok(()));
}

// ---- hold-offs and eligibility (mutation survivors) ----

#[test]
fn a_hold_off_longer_than_seven_days_is_shortened_to_seven_days() {
    assert_eq!(MAX_HOLD_OFF, Duration::from_secs(604_800));
    let mut f = Fixture::started();
    let month = Duration::from_secs(30 * 24 * 60 * 60);
    f.event(1, E::Resign { hold_off: month });
    assert_eq!(
        f.election.held_off_until(f.at(1)),
        Some(f.at(1) + Duration::from_secs(604_800))
    );
}

#[test]
fn eligibility_reads_back_as_set() {
    let mut f = Fixture::new();
    assert!(f.election.is_eligible(), "eligible by default");
    f.event(0, E::SetEligible { eligible: false });
    assert!(!f.election.is_eligible());
    f.event(0, E::SetEligible { eligible: true });
    assert!(f.election.is_eligible());
}

#[test]
fn a_check_handled_late_after_a_hold_off_still_begins() {
    let mut f = Fixture::started();
    f.event(1, E::Resign { hold_off: 3 * I });
    f.drain();
    // The first check after the hold-off falls due at its end; the driver gets to it late.
    assert_eq!(f.election.poll_timeout(), Some(f.at(1 + 3 * IMS)));
    f.timeout(1 + 3 * IMS + 500);
    assert_eq!(f.drain(), vec![A::AcquireConnection { conn: C2 }]);
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
    f.event(100, E::Cancelled);
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
    f.event(100, E::Cancelled);
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
