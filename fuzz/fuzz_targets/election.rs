//! Replays an arbitrary sequence of (delay, input) through one election and checks every step
//! with the core's invariant checker. Inputs include stale and mismatched completions, repeated
//! starts, cancels, resigns, eligibility changes, panics and drops, at any time.
#![no_main]

use std::time::{Duration, Instant};

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use plexsphere_leader_core::proof::{ExclusionTest, PoolProof, SecondSession};
use plexsphere_leader_core::invariants::{Checker, Input};
use plexsphere_leader_core::{
    AcquireMode, CheckInterval, ConnId, Control, Election, Event, Lease, LockCheck,
    MIN_CHECK_INTERVAL, OnOverdue, Options, TermId,
};

#[derive(Debug, Arbitrary)]
struct Step {
    /// Milliseconds that pass before the input.
    delay_ms: u16,
    input: FuzzInput,
}

#[derive(Debug, Arbitrary)]
enum FuzzInput {
    Start,
    Acquired(Which),
    AcquireFailed(Which),
    /// The exclusion proof answered with the backends of its two sessions (small, so they
    /// collide often; no second: it timed out) and its lock test (the backend and grant of
    /// each session's try).
    PoolProbed(Which, u8, Option<u8>, Option<(u8, bool, u8, bool)>),
    /// A grant to backend `pid` (small, so the checks' backends collide with it often).
    Granted(Which, u8),
    Refused(Which),
    WaitTimedOut(Which),
    /// The grant found the session already holding the lock, checked that many seconds ago.
    HeldBySession(Which, Option<u8>),
    ReleasedIfHeld(Which, bool),
    TryFailed(Which),
    /// The grant statement answered without trying the lock (recovery, read-only).
    NotTried(Which),
    /// A check answer that proves the lock of the newest grant.
    PingOk(Which),
    /// Any check answer: the backend that answered and the three verdict flags.
    PingAnswered(Which, u8, bool, bool, bool),
    PingFailed(Which),
    Unlocked(Which, bool),
    UnlockFailed(Which),
    EpochAdvanced(Which, u8),
    EpochFailed(Which),
    SessionEnded(Which),
    WorkDrained(u8),
    Cancelled,
    Resign(u16),
    SetEligible(bool),
    Panicked,
    Dropped,
    /// Lease mechanism: a claim answered with this epoch.
    LeaseClaimed(Which, u8),
    LeaseRenewed(Which),
    LeaseLost(Which),
}

/// Which connection a completion names: the newest asked for, an older one, or any number.
#[derive(Debug, Arbitrary)]
enum Which {
    Newest,
    Older(u8),
    Number(u8),
}

/// The election's options beyond the interval.
#[derive(Debug, Arbitrary)]
struct FuzzOptions {
    queue: bool,
    fencing: bool,
    grace_ms: u16,
    ineligible: bool,
    /// A work deadline in milliseconds, and whether it aborts.
    work_deadline: Option<(u16, bool)>,
    /// The lease mechanism, with a TTL of this many intervals beyond the shortest (two).
    lease: Option<u8>,
    /// Prove the pool before the run's first grant (`Options::prove_pool`).
    prove_pool: bool,
}

fuzz_target!(|input: (u16, FuzzOptions, Vec<Step>)| {
    let (interval_ms, fuzz_options, steps) = input;
    let interval = Duration::from_millis(u64::from(interval_ms)).max(MIN_CHECK_INTERVAL);
    let Ok(interval) = CheckInterval::new(interval) else {
        return;
    };
    let mode = if fuzz_options.queue {
        AcquireMode::Queue
    } else {
        AcquireMode::Poll
    };
    let Ok(mut options) = Options::new(interval)
        .acquire(mode)
        .fencing(fuzz_options.fencing)
        .eligible(!fuzz_options.ineligible)
        .prove_pool(fuzz_options.prove_pool)
        .stop_grace(Duration::from_millis(u64::from(fuzz_options.grace_ms)))
    else {
        return;
    };
    if let Some((ms, abort)) = fuzz_options.work_deadline {
        let on_overdue = if abort {
            OnOverdue::Abort
        } else {
            OnOverdue::Report
        };
        options = options.work_deadline(Duration::from_millis(u64::from(ms)), on_overdue);
    }
    let mut checker = if fuzz_options.ineligible {
        Checker::new().starting_ineligible()
    } else {
        Checker::new()
    };
    if let Some(extra) = fuzz_options.lease {
        let ttl = interval.get() * (2 + u32::from(extra % 8));
        let Ok(lease) = Lease::new(interval, ttl) else {
            return;
        };
        options = options.lease(lease);
        checker = checker.for_lease(lease);
    }
    let mut election = Election::<u8>::with_options(options);
    let mut now = Instant::now();
    let mut newest = 0u64;
    // The backend of the newest grant, which a proving check answer names.
    let mut granted_pid = 0i32;
    for step in steps {
        now += Duration::from_millis(u64::from(step.delay_ms));
        if election.poll_timeout().is_some_and(|at| at <= now) {
            election.handle_timeout(now);
            let actions = drain(&mut election, &mut newest);
            let timeout = election.poll_timeout();
            checker
                .check(now, Input::<'_, Event<u8>>::Timeout, &actions, timeout)
                .unwrap_or_else(|v| panic!("{v}"));
        }
        let conn = |which: &Which| match which {
            Which::Newest => ConnId::new(newest),
            Which::Older(back) => ConnId::new(newest.saturating_sub(u64::from(*back) + 1)),
            Which::Number(n) => ConnId::new(u64::from(*n)),
        };
        let event = match &step.input {
            FuzzInput::Start => {
                let accepted = election.start(now).is_ok();
                let actions = drain(&mut election, &mut newest);
                let timeout = election.poll_timeout();
                let start: Input<'_, Event<u8>> = Input::Start { accepted };
                checker
                    .check(now, start, &actions, timeout)
                    .unwrap_or_else(|v| panic!("{v}"));
                continue;
            }
            FuzzInput::Acquired(w) => Event::ConnectionAcquired { conn: conn(w) },
            FuzzInput::PoolProbed(w, first, second, test) => Event::PoolProbed {
                conn: conn(w),
                proof: PoolProof {
                    first: i32::from(*first),
                    second: second.map_or(SecondSession::TimedOut, |second| {
                        SecondSession::Answered(i32::from(second))
                    }),
                    exclusion: test.map(|(first_backend, first_granted, second_backend, second_granted)| {
                        ExclusionTest {
                            first_backend: i32::from(first_backend),
                            first_granted,
                            second_backend: i32::from(second_backend),
                            second_granted,
                        }
                    }),
                },
            },
            FuzzInput::AcquireFailed(w) => Event::AcquireFailed {
                conn: conn(w),
                cause: 1,
            },
            FuzzInput::Granted(w, pid) => {
                granted_pid = i32::from(*pid % 4);
                Event::LockGranted {
                    conn: conn(w),
                    backend_pid: granted_pid,
                }
            }
            FuzzInput::PingOk(w) => Event::PingAnswered {
                conn: conn(w),
                found: LockCheck::holding(granted_pid),
            },
            FuzzInput::Refused(w) => Event::LockRefused { conn: conn(w) },
            FuzzInput::WaitTimedOut(w) => Event::LockWaitTimedOut { conn: conn(w) },
            FuzzInput::HeldBySession(w, age) => Event::LockHeldBySession {
                conn: conn(w),
                checked_secs_ago: age.map(u64::from),
            },
            FuzzInput::ReleasedIfHeld(w, released) => Event::ReleasedIfHeld {
                conn: conn(w),
                released: *released,
            },
            FuzzInput::TryFailed(w) => Event::LockQueryFailed {
                conn: conn(w),
                cause: 2,
            },
            FuzzInput::NotTried(w) => Event::LockNotTried {
                conn: conn(w),
                cause: 4,
            },
            FuzzInput::PingAnswered(w, pid, in_recovery, holds_lock, marked_by_grant) => {
                Event::PingAnswered {
                    conn: conn(w),
                    found: LockCheck {
                        backend_pid: i32::from(*pid % 4),
                        in_recovery: *in_recovery,
                        holds_lock: *holds_lock,
                        marked_by_grant: *marked_by_grant,
                    },
                }
            }
            FuzzInput::PingFailed(w) => Event::PingFailed {
                conn: conn(w),
                cause: 3,
            },
            FuzzInput::Unlocked(w, released) => Event::UnlockDone {
                conn: conn(w),
                released: *released,
            },
            FuzzInput::UnlockFailed(w) => Event::UnlockFailed {
                conn: conn(w),
                cause: 4,
            },
            FuzzInput::EpochAdvanced(w, epoch) => Event::EpochAdvanced {
                conn: conn(w),
                epoch: u64::from(*epoch),
            },
            FuzzInput::EpochFailed(w) => Event::EpochFailed {
                conn: conn(w),
                cause: 5,
            },
            FuzzInput::SessionEnded(w) => Event::SessionEnded {
                conn: conn(w),
                cause: 6,
            },
            FuzzInput::WorkDrained(term) => Event::WorkDrained {
                term: TermId::new(u64::from(*term)),
            },
            FuzzInput::Cancelled => Control::Cancelled.into(),
            FuzzInput::Resign(ms) => Control::Resign {
                hold_off: Duration::from_millis(u64::from(*ms)),
            }
            .into(),
            FuzzInput::SetEligible(eligible) => Control::SetEligible {
                eligible: *eligible,
            }
            .into(),
            FuzzInput::Panicked => Control::Panicked.into(),
            FuzzInput::Dropped => Control::Dropped.into(),
            FuzzInput::LeaseClaimed(w, epoch) => Event::LeaseClaimed {
                conn: conn(w),
                epoch: u64::from(*epoch),
            },
            FuzzInput::LeaseRenewed(w) => Event::LeaseRenewed { conn: conn(w) },
            FuzzInput::LeaseLost(w) => Event::LeaseLost { conn: conn(w) },
        };
        let handled = election.handle_event(now, event.clone());
        let actions = drain(&mut election, &mut newest);
        let timeout = election.poll_timeout();
        checker
            .check(
                now,
                Input::Event {
                    event: &event,
                    handled,
                },
                &actions,
                timeout,
            )
            .unwrap_or_else(|v| panic!("{v}"));
    }
});

fn drain(election: &mut Election<u8>, newest: &mut u64) -> Vec<plexsphere_leader_core::Action<u8>> {
    let actions: Vec<_> = std::iter::from_fn(|| election.poll_action()).collect();
    for action in &actions {
        if let plexsphere_leader_core::Action::AcquireConnection { conn }
        | plexsphere_leader_core::Action::ProbePool { conn, .. } = action
        {
            *newest = conn.get();
        }
    }
    actions
}
