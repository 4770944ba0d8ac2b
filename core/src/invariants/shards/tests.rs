//! Each property of the sharded checker, kept by a plain trace and broken on purpose by a
//! crafted one.

use std::time::{Duration, Instant};

use super::*;
use crate::control::Control;
use crate::handled::{Handled, Ignored};
use crate::ids::ConnId;

type A = ShardAction<u8>;
type E = ShardEvent<u8>;

const C1: ConnId = ConnId::new(1);
const S0: Shard = Shard::new(0);
const S1: Shard = Shard::new(1);
const T1: TermId = TermId::new(1);
const T2: TermId = TermId::new(2);

struct Trace {
    checker: ShardChecker,
    t0: Instant,
}

impl Trace {
    fn started() -> Self {
        let mut trace = Self {
            checker: ShardChecker::default(),
            t0: Instant::now(),
        };
        let start = [A::AcquireSession { conn: C1 }];
        let (now, next) = (trace.at(0), Some(trace.at(100)));
        trace
            .checker
            .check(now, Input::Start { accepted: true }, &start, next)
            .unwrap();
        trace
    }

    /// Started, owning shard 0 in term 1.
    fn owning() -> Self {
        let mut trace = Self::started();
        let begin = [A::BeginTerm {
            shard: S0,
            term: T1,
            epoch: None,
        }];
        trace
            .event(
                1,
                E::Took {
                    conn: C1,
                    granted: vec![S0],
                },
                &begin,
            )
            .unwrap();
        trace
    }

    fn at(&self, ms: u64) -> Instant {
        self.t0 + Duration::from_millis(ms)
    }

    fn event(&mut self, ms: u64, event: impl Into<E>, actions: &[A]) -> Result<(), Violation> {
        let input = Input::Event {
            event: &event.into(),
            handled: Handled::Applied,
        };
        let (now, next) = (self.at(ms), Some(self.at(ms + 100)));
        self.checker.check(now, input, actions, next)
    }

    fn timeout(&mut self, ms: u64, actions: &[A]) -> Result<(), Violation> {
        let (now, next) = (self.at(ms), Some(self.at(ms + 100)));
        self.checker.check(now, Input::Timeout, actions, next)
    }
}

fn end(shard: Shard, term: TermId, cause: TermEndCause) -> A {
    A::EndTerm { shard, term, cause }
}

fn broken(result: Result<(), Violation>, what: &str) {
    let violation = result.expect_err("a violation");
    assert!(violation.what.contains(what), "{violation}");
}

#[test]
fn a_stop_that_ends_awaits_reports_and_finishes_keeps_every_property() {
    let mut trace = Trace::owning();
    assert_eq!(trace.checker.open_terms(), vec![(S0, T1)]);
    let stop = [
        end(S0, T1, TermEndCause::Stopped),
        A::AwaitWork { term: T1 },
    ];
    trace.event(2, Control::Cancelled, &stop).unwrap();
    let finish = [
        A::ReportOverdueWork {
            term: T1,
            abort: false,
            run_finished: true,
        },
        A::Finish,
    ];
    let input = Input::Event {
        event: &E::UnlockedAll { conn: C1 },
        handled: Handled::Applied,
    };
    trace
        .checker
        .check(trace.at(3), input, &finish, None)
        .unwrap();
    assert!(trace.checker.open_terms().is_empty());
}

#[test]
fn two_terms_of_one_shard_or_a_term_id_reused_are_reported() {
    let mut trace = Trace::owning();
    let again = [A::BeginTerm {
        shard: S0,
        term: T2,
        epoch: None,
    }];
    broken(
        trace.event(
            2,
            E::Took {
                conn: C1,
                granted: vec![S0],
            },
            &again,
        ),
        "began while",
    );
    let mut trace = Trace::owning();
    let reused = [A::BeginTerm {
        shard: S1,
        term: T1,
        epoch: None,
    }];
    broken(
        trace.event(
            2,
            E::Took {
                conn: C1,
                granted: vec![S1],
            },
            &reused,
        ),
        "does not increase",
    );
}

#[test]
fn an_end_of_a_term_not_open_is_reported() {
    let mut trace = Trace::owning();
    let lost = TermEndCause::Lost(LossReason::CheckTimedOut);
    broken(
        trace.timeout(100, &[end(S1, T1, lost)]),
        "its open term is None",
    );
}

#[test]
fn an_end_with_a_cause_its_input_does_not_imply_is_reported() {
    let cases: [(E, TermEndCause, &str); 5] = [
        (
            E::Control(Control::Dropped),
            TermEndCause::Stopped,
            "Stopped in answer to Dropped",
        ),
        (
            E::Control(Control::Cancelled),
            TermEndCause::Resigned,
            "Resigned in answer to Cancelled",
        ),
        (
            E::Control(Control::Cancelled),
            TermEndCause::HandedOver,
            "HandedOver in answer to Cancelled",
        ),
        (
            E::Control(Control::Panicked),
            TermEndCause::Lost(LossReason::Dropped),
            "in answer to Panicked",
        ),
        (
            E::SessionEnded { conn: C1 },
            TermEndCause::Lost(LossReason::Panicked),
            "in answer to a completion",
        ),
    ];
    for (event, cause, what) in cases {
        let mut trace = Trace::owning();
        broken(trace.event(2, event, &[end(S0, T1, cause)]), what);
    }
    let kept: [(E, LossReason); 3] = [
        (E::SessionEnded { conn: C1 }, LossReason::SessionEnded),
        (E::Control(Control::Panicked), LossReason::Panicked),
        (E::Control(Control::Dropped), LossReason::Dropped),
    ];
    for (event, reason) in kept {
        let mut trace = Trace::owning();
        let lost = end(S0, T1, TermEndCause::Lost(reason));
        trace.event(2, event, &[lost]).unwrap();
    }
}

#[test]
fn a_take_or_an_unlock_of_a_shard_with_an_open_term_is_reported() {
    let mut trace = Trace::owning();
    let take = [A::Take {
        conn: C1,
        shards: vec![S1, S0],
    }];
    broken(trace.timeout(100, &take), "take of shard 0");
    let mut trace = Trace::owning();
    let unlock = [A::Unlock {
        conn: C1,
        shards: vec![S0],
    }];
    broken(trace.timeout(100, &unlock), "unlock of shard 0");
}

#[test]
fn work_of_a_term_not_ended_or_reported_twice_is_reported() {
    let mut trace = Trace::owning();
    broken(
        trace.timeout(100, &[A::AwaitWork { term: T1 }]),
        "AwaitWork 1",
    );
    let report = A::ReportOverdueWork {
        term: T1,
        abort: true,
        run_finished: false,
    };
    let mut trace = Trace::owning();
    broken(
        trace.timeout(100, std::slice::from_ref(&report)),
        "has not ended",
    );
    let mut trace = Trace::owning();
    let lost = end(S0, T1, TermEndCause::Lost(LossReason::CheckTimedOut));
    trace.timeout(100, &[lost, report.clone()]).unwrap();
    broken(trace.timeout(200, &[report]), "twice");
}

#[test]
fn a_finish_with_a_term_open_and_an_action_after_it_are_reported() {
    let mut trace = Trace::owning();
    broken(trace.timeout(100, &[A::Finish]), "finished with term 1");
    let mut trace = Trace::started();
    let input = Input::Event {
        event: &E::Control(Control::Cancelled),
        handled: Handled::Applied,
    };
    let (now, late) = (trace.at(1), [A::Finish, A::AcquireSession { conn: C1 }]);
    let result = trace.checker.check(now, input, &late, None);
    broken(result, "after Finish");
}

#[test]
fn the_shared_rules_hold_for_shards_too() {
    let mut trace = Trace::started();
    let ignored = Input::Event {
        event: &E::Control(Control::Cancelled),
        handled: Handled::Ignored(Ignored::Unexpected),
    };
    let queued = [A::AcquireSession { conn: C1 }];
    broken(
        trace
            .checker
            .check(trace.at(1), ignored, &queued, Some(trace.at(100))),
        "an ignored input queued 1 actions",
    );
    let mut trace = Trace::started();
    // A shard space may wait without a deadline (unlike the election, which always has one).
    let unarmed = trace
        .checker
        .check(trace.at(1), Input::Timeout, &[] as &[A], None);
    assert_eq!(unarmed, Ok(()));
    let past = trace
        .checker
        .check(trace.at(5), Input::Timeout, &[] as &[A], Some(trace.at(4)));
    broken(past, "in the past");
    let mut trace = Trace::started();
    let (now, earlier) = (trace.at(5), trace.at(1));
    trace
        .checker
        .check(now, Input::Timeout, &[] as &[A], Some(trace.at(6)))
        .unwrap();
    broken(
        trace
            .checker
            .check(earlier, Input::Timeout, &[] as &[A], Some(trace.at(6))),
        "time went backwards",
    );
}
