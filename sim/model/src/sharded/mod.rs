//! The sharded model: three replicas running the real [`ShardedElection`] over a space of
//! [`SHARDS`] shards (fencing on), one member session each, over every interleaving of their
//! environment.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;

use plexsphere_leader_core::shards::{ShardAction, ShardEvent, ShardOptions, ShardedElection};
use plexsphere_leader_core::{CheckInterval, IDLE_SESSION_TIMEOUT_INTERVALS};
use stateright::{Model, Path, Property};

use crate::check::Checked;
use crate::clock::{Micros, us};
use crate::flight::Stage;
use crate::sabotage::Sabotage;
use crate::server::Sess;
use crate::single::INTERVAL;
use crate::step::Step;
use crate::trace::{Input, Line, Recorder};

mod canon;
pub mod props;
pub mod state;
mod world;

use self::state::{Cause, Replica, Server, State};
use self::world::World;

/// The shards of the model's space.
pub const SHARDS: u32 = 4;

/// The sharded model.
#[derive(Debug, Clone)]
pub struct ShardedModel {
    /// The elections' options.
    pub options: ShardOptions,
    /// How many shards.
    pub shards: u32,
    /// How many replicas.
    pub replicas: usize,
    /// How many faults (and operator actions) one path may inject.
    pub faults: u8,
    /// Whether states are reduced to a representative of the replicas' permutations.
    pub symmetry: bool,
    /// A planted bug ([`Sabotage::StaleSurvey`]), or none.
    pub sabotage: Sabotage,
    /// States whose properties were checked.
    pub explored: Arc<AtomicUsize>,
}

impl Default for ShardedModel {
    fn default() -> Self {
        Self::new()
    }
}

impl ShardedModel {
    /// The model as CI checks it: [`SHARDS`] shards, fencing on, three replicas.
    pub fn new() -> Self {
        let interval = CheckInterval::new(INTERVAL)
            .unwrap_or_else(|_| unreachable!("one second is a valid check interval"));
        let options = ShardOptions::new(interval, SHARDS)
            .unwrap_or_else(|_| unreachable!("four shards are a valid space"))
            .fencing(true);
        Self {
            options,
            shards: SHARDS,
            replicas: 3,
            faults: 1,
            symmetry: true,
            sabotage: Sabotage::None,
            explored: Arc::default(),
        }
    }

    /// The same model with `sabotage` planted.
    #[must_use]
    pub fn with_sabotage(mut self, sabotage: Sabotage) -> Self {
        self.sabotage = sabotage;
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
        trace: Option<&mut Recorder<ShardEvent<Cause>>>,
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

    fn initial(&self, trace: Option<&mut Recorder<ShardEvent<Cause>>>) -> State {
        let replicas = (0..self.replicas)
            .map(|r| Replica {
                name: u8::try_from(r).unwrap_or(u8::MAX),
                machine: ShardedElection::new(self.options),
                local: 0,
                paused: false,
                partitioned: false,
                run: 0,
                session: None,
                epochs: BTreeMap::new(),
                stale: BTreeMap::new(),
            })
            .collect();
        let mut state = State {
            now: 0,
            replicas,
            server: Server {
                holders: vec![None; self.shards as usize],
                epochs: vec![0; self.shards as usize],
                ..Server::default()
            },
            flights: Vec::new(),
            faults_left: self.faults,
            quiet_since: 0,
            seen: 0,
            broken: None,
            max_epochs: vec![0; self.shards as usize],
            given_up: BTreeMap::new(),
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

    fn steps(&self, s: &State, steps: &mut Vec<Step>) {
        if s.broken.is_some() || !props::safe(self, s) {
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
            if owner.partitioned {
                steps.push(Step::Lose(i));
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
            if replica.session.is_some() {
                steps.push(Step::Terminate(index));
            }
            if !replica.partitioned {
                steps.push(Step::Partition(index));
            }
            if replica.machine.is_running() {
                steps.push(Step::Pause(index));
                steps.push(Step::Stop(index));
                if !replica.machine.owned().is_empty() {
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
            Step::Lose(i) => {
                if usize::from(i) < self.s.flights.len() {
                    self.s.flights.remove(usize::from(i));
                }
            }
            Step::Crash { replica, fin } => self.crash(usize::from(replica), fin),
            Step::Terminate(r) => {
                let r = usize::from(r);
                if let Some(sess) = self.s.replicas[r].lock_sess(r) {
                    self.end_session(sess, true);
                }
            }
            Step::Pause(r) => self.s.replicas[usize::from(r)].paused = true,
            Step::Resume(r) => {
                self.s.replicas[usize::from(r)].paused = false;
                self.feed(usize::from(r), Input::Timeout);
            }
            Step::Partition(r) => self.s.replicas[usize::from(r)].partitioned = true,
            Step::Heal(r) => self.s.replicas[usize::from(r)].partitioned = false,
            Step::Stop(r) => self.feed(usize::from(r), Input::Event(ShardEvent::Cancelled)),
            Step::Resign(r) => {
                let hold_off = self.model.options.interval().default_hold_off();
                self.feed(
                    usize::from(r),
                    Input::Event(ShardEvent::Resign { hold_off }),
                );
            }
            Step::Eligible(r, eligible) => {
                let event = ShardEvent::SetEligible { eligible };
                self.feed(usize::from(r), Input::Event(event));
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

    fn costs(&self, step: Step) -> bool {
        match step {
            Step::Advance => awaited(self.s),
            Step::Deliver(_) | Step::Resume(_) | Step::Heal(_) | Step::Eligible(_, true) => false,
            Step::Lose(i) => self
                .s
                .flights
                .get(usize::from(i))
                .is_some_and(|f| !self.s.replicas[usize::from(f.owner.replica)].partitioned),
            _ => true,
        }
    }

    fn deliver(&mut self, i: usize, answer: bool) {
        if i >= self.s.flights.len() {
            return;
        }
        let flight = self.s.flights.remove(i);
        let event = match flight.stage {
            Stage::Sent(action) => {
                let survey = matches!(action, ShardAction::Survey { .. });
                let answer = self.execute(flight.owner, &action);
                if survey {
                    self.stale_survey(flight.owner, answer)
                } else {
                    answer
                }
            }
            Stage::Replied(event) => Some(event),
        };
        let Some(event) = event else { return };
        if !self.is_current(flight.owner) {
            return;
        }
        let stale = self.model.sabotage == Sabotage::StaleSurvey;
        if stale && matches!(event, ShardEvent::SessionEnded { .. }) {
            // The sabotaged driver does not watch its session.
            return;
        }
        if answer {
            self.feed(usize::from(flight.owner.replica), Input::Event(event));
        } else {
            self.reply(flight.owner, event);
        }
    }

    /// A sabotaged driver answers a failed survey with the session's last good one.
    fn stale_survey(
        &self,
        owner: Sess,
        answer: Option<ShardEvent<Cause>>,
    ) -> Option<ShardEvent<Cause>> {
        let failed = matches!(answer, Some(ShardEvent::StatementFailed { .. }));
        let last = self
            .s
            .replicas
            .get(usize::from(owner.replica))
            .and_then(|r| r.machine.last_survey().cloned());
        match (self.model.sabotage, failed, last) {
            (Sabotage::StaleSurvey, true, Some(survey)) => Some(ShardEvent::Surveyed {
                conn: owner.conn,
                survey,
            }),
            _ => answer,
        }
    }

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
                    format!(" r{}.{}: {what}", name(f.owner.replica), f.owner.run)
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

impl Model for ShardedModel {
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
        props::properties()
    }
}

impl Checked for ShardedModel {
    fn explored(&self) -> &Arc<AtomicUsize> {
        &self.explored
    }

    fn explain(&self, path: &Path<State, Step>) -> Vec<String> {
        let mut recorder = Recorder::default();
        let _initial = self.initial(Some(&mut recorder));
        let mut last = None;
        for (state, step) in path.clone().into_vec() {
            match step {
                Some(step) => {
                    let _next = self.apply(&state, step, Some(&mut recorder));
                }
                None => last = Some(state),
            }
        }
        let mut lines: Vec<String> = recorder.lines().iter().map(ToString::to_string).collect();
        if let Some(state) = last {
            let owners: Vec<String> = state
                .replicas
                .iter()
                .map(|r| format!("r{}.{} owns {:?}", r.name, r.run, r.owned()))
                .collect();
            lines.push(format!(
                "end (server {}): {}; broken {:?}",
                crate::trace::ms(state.now),
                owners.join(", "),
                state.broken
            ));
        }
        lines
    }
}
