//! One test per behaviour of the spec's Run, Demotion, Panic and Cancel paragraphs, each asserting
//! the exact list of actions an input queues.
#![allow(clippy::unwrap_used)] // reason: tests fail loudly on the unexpected

use std::time::{Duration, Instant};

use super::*;
use crate::action::Level;
use crate::cause::LossReason;
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

    fn event(&mut self, ms: u64, event: impl Into<E>) -> Handled {
        self.election.handle_event(self.at(ms), event.into())
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

mod contracts;
mod fitness;
mod leader;
mod lease;
mod operator;
mod preference;
mod standby;
mod stop;
