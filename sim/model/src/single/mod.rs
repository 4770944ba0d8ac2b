//! The single-lock models: three replicas running the real [`Election`], with the advisory lock
//! (queued acquire, fencing) or with the lease, over every interleaving of their environment.

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use plexsphere_leader_core::{
    AcquireMode, CheckInterval, Election, Event, IDLE_SESSION_TIMEOUT_INTERVALS, Lease, Options,
};
use stateright::{Model, Path, Property};

use crate::clock::{EXACT, Micros, Ppm, us};
use crate::flight::Stage;
use crate::sabotage::Sabotage;
use crate::server::Server;
pub use crate::step::Step;
use crate::trace::{Input, Line, Recorder};

mod canon;
mod execute;
mod explain;
mod faults;
pub mod props;
pub mod state;
mod world;

use self::state::{Cause, Replica, State};
use self::world::World;

/// The check interval of the models: one second (the unlock budget is then two intervals).
pub const INTERVAL: Duration = Duration::from_secs(1);

/// Which mechanism the elections use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mechanism {
    /// The session advisory lock, standbys queued on it, fencing on.
    Advisory,
    /// The lease row.
    Lease,
}

/// What a paused replica's clock does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PauseClock {
    /// It runs on (a stopped process, a long GC pause, a starved CPU): the driver fires what
    /// fell due as the replica resumes.
    Runs,
    /// It stops (a suspended host, whose `CLOCK_MONOTONIC` does not count the suspension).
    Stops,
}

/// A single-lock model.
#[derive(Debug, Clone)]
pub struct SingleModel {
    /// The mechanism.
    pub mechanism: Mechanism,
    /// The elections' options.
    pub options: Options,
    /// How many replicas.
    pub replicas: usize,
    /// How many faults (and operator actions) one path may inject.
    pub faults: u8,
    /// A planted bug, or none.
    pub sabotage: Sabotage,
    /// What a paused replica's clock does.
    pub pause_clock: PauseClock,
    /// Whether states are reduced to a representative of the replicas' permutations.
    pub symmetry: bool,
    /// The clock rates of the replicas, in order (the last repeats).
    pub rates: Vec<Ppm>,
    /// States whose properties were checked (shared by the model's clones).
    pub explored: Arc<AtomicUsize>,
}

impl SingleModel {
    /// The model of `mechanism` as CI checks it.
    pub fn new(mechanism: Mechanism) -> Self {
        let interval = CheckInterval::new(INTERVAL)
            .unwrap_or_else(|_| unreachable!("one second is a valid check interval"));
        let (options, rates, pause_clock) = match mechanism {
            Mechanism::Advisory => (
                Options::new(interval)
                    .acquire(AcquireMode::Queue)
                    .fencing(true),
                vec![EXACT],
                PauseClock::Stops,
            ),
            Mechanism::Lease => (
                Options::new(interval).lease(Lease::default_for(interval)),
                // Within the lease's margin of a tenth: half of it slow, half of it fast.
                vec![950_000, 1_050_000, EXACT],
                PauseClock::Runs,
            ),
        };
        Self {
            mechanism,
            options,
            replicas: 3,
            faults: 2,
            sabotage: Sabotage::None,
            pause_clock,
            symmetry: true,
            rates,
            explored: Arc::default(),
        }
    }

    /// The same model with `sabotage` planted.
    #[must_use]
    pub fn with_sabotage(mut self, sabotage: Sabotage) -> Self {
        self.sabotage = sabotage;
        self
    }

    /// The same model with standbys asking for the lock by `mode` (advisory lock only; the
    /// CI model queues).
    #[must_use]
    pub fn with_acquire(mut self, mode: AcquireMode) -> Self {
        self.options = self.options.acquire(mode);
        self
    }

    /// The same model with `replicas` replicas.
    #[must_use]
    pub fn with_replicas(mut self, replicas: usize) -> Self {
        self.replicas = replicas;
        self
    }

    /// The same model with `faults` faults per path.
    #[must_use]
    pub fn with_faults(mut self, faults: u8) -> Self {
        self.faults = faults;
        self
    }

    /// The check interval, in microseconds.
    pub fn interval(&self) -> Micros {
        us(self.options.interval().get())
    }

    /// The server's `idle_session_timeout`.
    pub fn idle_timeout(&self) -> Micros {
        self.interval() * u64::from(IDLE_SESSION_TIMEOUT_INTERVALS)
    }

    /// Applies `step` to a copy of `state`, recording the inputs into `trace` when given.
    pub fn apply(
        &self,
        state: &State,
        step: Step,
        trace: Option<&mut Recorder<Event<Cause>>>,
    ) -> State {
        let mut next = state.clone();
        let mut world = World {
            model: self,
            s: &mut next,
            trace,
        };
        world.step(step);
        next
    }

    /// Replays `path`, recording every step and every input each core machine received: the
    /// inputs of one replica's run ([`Recorder::inputs_of`]) replay on a fresh [`Election`]
    /// with [`replay`](crate::trace::replay).
    pub fn record(&self, path: &Path<State, Step>) -> Recorder<Event<Cause>> {
        let mut recorder = Recorder::default();
        let _initial = self.initial(Some(&mut recorder));
        for (state, step) in path.clone().into_vec() {
            if let Some(step) = step {
                let _next = self.apply(&state, step, Some(&mut recorder));
            }
        }
        recorder
    }

    /// The initial state: every replica started at the server's instant zero.
    fn initial(&self, trace: Option<&mut Recorder<Event<Cause>>>) -> State {
        let replicas = (0..self.replicas)
            .map(|r| Replica {
                name: u8::try_from(r).unwrap_or(u8::MAX),
                machine: Election::with_options(self.options),
                local: 0,
                rate: self
                    .rates
                    .get(r)
                    .or(self.rates.last())
                    .copied()
                    .unwrap_or(EXACT),
                paused: false,
                partitioned: false,
                run: 0,
                lock_conn: None,
                epoch: None,
                lost: None,
                stale: 0,
            })
            .collect();
        let mut state = State {
            now: 0,
            replicas,
            server: Server::default(),
            flights: Vec::new(),
            faults_left: self.faults,
            quiet_since: 0,
            seen: 0,
            broken: None,
            max_epoch: 0,
            granted: 0,
            resigned: None,
        };
        let mut world = World {
            model: self,
            s: &mut state,
            trace,
        };
        for r in 0..self.replicas {
            world.feed(r, Input::Start);
        }
        state
    }

    /// The steps `state` allows, in a fixed order.
    fn steps(&self, s: &State, steps: &mut Vec<Step>) {
        if s.broken.is_some() || !props::safe(self, s) {
            // A violation: nothing after it matters.
            return;
        }
        let faulty = s.faults_left > 0;
        let live = awaited(s);
        if world::next_instant(self, s).is_some() && (!live || faulty) {
            steps.push(Step::Advance);
        }
        for (i, flight) in s.flights.iter().enumerate() {
            let Ok(i) = u8::try_from(i) else { break };
            let owner = &s.replicas[usize::from(flight.owner.replica)];
            let sent = matches!(flight.stage, Stage::Sent(_));
            if flight.abandoned {
                // A request given up: it never arrives, or (a fault) arrives late.
                steps.push(Step::Lose(i));
                if faulty && sent {
                    steps.push(Step::Deliver(i));
                }
                continue;
            }
            if owner.partitioned {
                // Nothing reaches it: its answers are lost; a request sent before the cut may
                // still arrive (late).
                steps.push(Step::Lose(i));
                if faulty && sent {
                    steps.push(Step::Delay(i));
                }
                continue;
            }
            if !owner.paused {
                steps.push(Step::Deliver(i));
            }
            if faulty {
                if sent {
                    steps.push(Step::Delay(i));
                }
                steps.push(Step::Lose(i));
            }
        }
        for (r, replica) in s.replicas.iter().enumerate() {
            let Ok(index) = u8::try_from(r) else { break };
            if replica.paused {
                steps.push(Step::Resume(index));
                continue;
            }
            let running = replica.machine.is_running();
            if replica.partitioned {
                steps.push(Step::Heal(index));
            }
            if !replica.machine.is_eligible() {
                steps.push(Step::Eligible(index, true));
            }
            if !faulty {
                continue;
            }
            steps.push(Step::Crash {
                replica: index,
                fin: true,
            });
            steps.push(Step::Crash {
                replica: index,
                fin: false,
            });
            if faults::terminable(s, r).is_some() {
                steps.push(Step::Terminate(index));
            }
            if !replica.partitioned {
                steps.push(Step::Partition(index));
            }
            if running {
                steps.push(Step::Pause(index));
                steps.push(Step::Stop(index));
                if replica.machine.is_leader() {
                    steps.push(Step::Resign(index));
                }
                if replica.machine.is_eligible() {
                    steps.push(Step::Eligible(index, false));
                }
            }
        }
        if faulty {
            steps.push(Step::Restart);
            steps.push(Step::Failover);
        }
    }
}

impl World<'_> {
    /// Applies one step of the checker.
    fn step(&mut self, step: Step) {
        let described = self.trace.is_some().then(|| self.describe(step));
        if let Some(trace) = self.trace.as_deref_mut() {
            let index = trace
                .lines()
                .iter()
                .filter(|line| matches!(line, Line::Step { .. }))
                .count()
                + 1;
            trace.push(Line::Step {
                index,
                server: self.s.now,
                step: described.unwrap_or_default(),
            });
        }
        let costs = self.costs(step);
        if costs {
            self.s.faults_left = self.s.faults_left.saturating_sub(1);
        }
        match step {
            Step::Advance => {
                if let Some(to) = self.next_instant() {
                    self.advance(to);
                }
            }
            Step::Deliver(i) => self.deliver(usize::from(i), true),
            Step::Delay(i) => self.deliver(usize::from(i), false),
            Step::Lose(i) => self.lose(usize::from(i)),
            Step::Crash { replica, fin } => self.crash(usize::from(replica), fin),
            Step::Terminate(r) => self.terminate(usize::from(r)),
            Step::Pause(r) => self.s.replicas[usize::from(r)].paused = true,
            Step::Resume(r) => self.resume(usize::from(r)),
            Step::Partition(r) => self.s.replicas[usize::from(r)].partitioned = true,
            Step::Heal(r) => self.s.replicas[usize::from(r)].partitioned = false,
            Step::Stop(r) => self.control(usize::from(r), Event::Cancelled),
            Step::Resign(r) => {
                let hold_off = self.model.options.interval().default_hold_off();
                self.control(usize::from(r), Event::Resign { hold_off });
            }
            Step::Eligible(r, eligible) => {
                self.control(usize::from(r), Event::SetEligible { eligible });
            }
            Step::Restart => self.restart(true),
            Step::Failover => self.restart(false),
        }
        if costs
            || matches!(
                step,
                Step::Resume(_) | Step::Heal(_) | Step::Eligible(_, true)
            )
        {
            self.s.quiet_since = self.s.now;
        }
    }

    /// Whether `step` spends one of the path's faults.
    fn costs(&self, step: Step) -> bool {
        match step {
            Step::Advance => awaited(self.s),
            Step::Deliver(i) => self
                .s
                .flights
                .get(usize::from(i))
                .is_some_and(|f| f.abandoned),
            Step::Resume(_) | Step::Heal(_) | Step::Eligible(_, true) => false,
            Step::Lose(i) => self.s.flights.get(usize::from(i)).is_some_and(|f| {
                let partitioned = self.s.replicas[usize::from(f.owner.replica)].partitioned;
                !f.abandoned && !partitioned
            }),
            _ => true,
        }
    }

    /// The flight at `i` reaches the server (if it had not) and, when `answer`, its answer is
    /// delivered; otherwise the answer stays on the way.
    fn deliver(&mut self, i: usize, answer: bool) {
        if i >= self.s.flights.len() {
            return;
        }
        let flight = self.s.flights.remove(i);
        let event = match flight.stage {
            Stage::Sent(action) => self.execute(flight.owner, &action),
            Stage::Replied(event) => Some(event),
        };
        let Some(event) = event else { return };
        if flight.abandoned || !self.is_current(flight.owner) {
            return;
        }
        if answer {
            self.feed(usize::from(flight.owner.replica), Input::Event(event));
        } else {
            self.reply(flight.owner, event);
        }
    }

    /// The flight at `i`, or its answer, is lost. (A sabotaged driver reports a lost renewal
    /// as renewed.)
    fn lose(&mut self, i: usize) {
        if i >= self.s.flights.len() {
            return;
        }
        let flight = self.s.flights.remove(i);
        let renewal = matches!(
            flight.stage,
            Stage::Sent(plexsphere_leader_core::Action::RenewLease { .. })
                | Stage::Replied(Event::LeaseLost { .. } | Event::PingFailed { .. })
        );
        if self.model.sabotage == Sabotage::RenewIgnoresTerm
            && renewal
            && !flight.abandoned
            && self.is_current(flight.owner)
        {
            let conn = flight.owner.conn;
            self.feed(
                usize::from(flight.owner.replica),
                Input::Event(Event::LeaseRenewed { conn }),
            );
        }
    }

    /// `step` as a trace shows it: with the names of the replicas and the operation concerned.
    fn describe(&self, step: Step) -> String {
        let name = |r: u8| {
            self.s
                .replicas
                .get(usize::from(r))
                .map_or(u8::MAX, |replica| replica.name)
        };
        let flight = |i: u8| {
            self.s
                .flights
                .get(usize::from(i))
                .map_or_else(String::new, |f| {
                    let what = match &f.stage {
                        Stage::Sent(action) => format!("{action:?}"),
                        Stage::Replied(event) => format!("answer {event:?}"),
                    };
                    let given_up = if f.abandoned { " (given up)" } else { "" };
                    format!(
                        " r{}.{}: {what}{given_up}",
                        name(f.owner.replica),
                        f.owner.run
                    )
                })
        };
        step.describe(name, flight)
    }
}

/// Whether an answer is awaited that time passing would make late (a fault): an operation
/// in flight that was not given up, of a replica neither paused nor cut off (for those, the
/// pause or the partition is the fault).
fn awaited(s: &State) -> bool {
    s.flights.iter().any(|f| {
        let owner = &s.replicas[usize::from(f.owner.replica)];
        !f.abandoned && !owner.paused && !owner.partitioned
    })
}

impl Model for SingleModel {
    type State = State;
    type Action = Step;

    fn init_states(&self) -> Vec<State> {
        let state = self.initial(None);
        vec![if self.symmetry {
            canon::representative(&state)
        } else {
            state
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Step>) {
        self.steps(state, actions);
    }

    fn next_state(&self, state: &State, step: Step) -> Option<State> {
        let next = self.apply(state, step, None);
        Some(if self.symmetry {
            canon::representative(&next)
        } else {
            next
        })
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let queued = self.options.acquire_mode() == AcquireMode::Queue;
        props::properties(self.mechanism, queued)
    }
}
