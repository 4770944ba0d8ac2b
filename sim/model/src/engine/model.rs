//! The model of one mode: its size, its sabotage, its clocks; the stateright [`Model`] and the
//! report of its paths.

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use plexsphere_leader_core::IDLE_SESSION_TIMEOUT_INTERVALS;
use stateright::{Model, Path, Property};

use super::state::{Name, Replica, State};
use super::world::World;
use super::{Mode, canon, props, steps};
use crate::clock::{EXACT, Micros, Ppm, Rate, us};
use crate::sabotage::Sabotage;
use crate::server::Server;
use crate::step::Step;
use crate::trace::{Input, Recorder, ms};

/// The check interval of the models: one second (the unlock budget is then two intervals).
pub const INTERVAL: Duration = Duration::from_secs(1);

/// What a paused replica's clock does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PauseClock {
    /// It runs on (a stopped process, a long GC pause, a starved CPU): the driver fires what
    /// fell due as the replica resumes.
    Runs,
    /// It stops (a suspended host, whose `CLOCK_MONOTONIC` does not count the suspension).
    Stops,
}

/// A model of mode `M`: three replicas running its real machine over every interleaving of
/// their environment.
#[derive(Debug, Clone)]
pub struct ElectionModel<M> {
    /// The mode and its machine's options.
    pub mode: M,
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

impl<M: Mode> ElectionModel<M> {
    /// Three replicas of `mode` with clocks at `rates`, `faults` faults per path.
    pub fn new(mode: M, faults: u8, rates: Vec<Ppm>, pause_clock: PauseClock) -> Self {
        Self {
            mode,
            replicas: 3,
            faults,
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
        us(self.mode.interval().get())
    }

    /// The server's `idle_session_timeout`.
    pub fn idle_timeout(&self) -> Micros {
        self.interval() * u64::from(IDLE_SESSION_TIMEOUT_INTERVALS)
    }

    /// Applies `step` to a copy of `state`, recording the inputs into `trace` when given.
    pub fn apply(
        &self,
        state: &State<M>,
        step: Step,
        trace: Option<&mut Recorder<M::Event>>,
    ) -> State<M> {
        let mut next = state.clone();
        World::new(self, &mut next, trace).step(step);
        next
    }

    /// Replays `path`, recording every step and every input each core machine received: the
    /// inputs of one replica's run ([`Recorder::inputs_of`]) replay on a fresh machine with
    /// [`replay`](crate::trace::replay).
    pub fn record(&self, path: &Path<State<M>, Step>) -> Recorder<M::Event> {
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
    fn initial(&self, trace: Option<&mut Recorder<M::Event>>) -> State<M> {
        let replicas = (0..self.replicas)
            .map(|r| Replica {
                name: Name(u8::try_from(r).unwrap_or(u8::MAX)),
                machine: self.mode.machine(r),
                local: 0,
                rate: M::Rate::held(
                    self.rates
                        .get(r)
                        .or(self.rates.last())
                        .copied()
                        .unwrap_or(EXACT),
                ),
                paused: false,
                partitioned: false,
                run: 0,
                lock_conn: None,
                terms: M::Terms::default(),
            })
            .collect();
        let mut state = State {
            now: 0,
            replicas,
            server: Server::new(self.mode.locks()),
            flights: Vec::new(),
            faults_left: self.faults,
            quiet_since: 0,
            seen: 0,
            broken: None,
            history: self.mode.history(),
        };
        let mut world = World::new(self, &mut state, trace);
        for r in 0..self.replicas {
            world.feed(r, Input::Start);
        }
        state
    }

    /// `state`, or its representative under the symmetry reduction.
    fn reduced(&self, state: State<M>) -> State<M> {
        if self.symmetry {
            canon::representative(&state)
        } else {
            state
        }
    }
}

impl<M: Mode> Model for ElectionModel<M> {
    type State = State<M>;
    type Action = Step;

    fn init_states(&self) -> Vec<State<M>> {
        vec![self.reduced(self.initial(None))]
    }

    fn actions(&self, state: &State<M>, actions: &mut Vec<Step>) {
        steps::allowed(self, state, actions);
    }

    fn next_state(&self, state: &State<M>, step: Step) -> Option<State<M>> {
        Some(self.reduced(self.apply(state, step, None)))
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut properties = props::common();
        properties.extend(M::properties(self));
        properties
    }
}

impl<M: Mode> ElectionModel<M> {
    /// The lines of `path` replayed with every input given to a core machine, and its last
    /// state in one line.
    pub fn explain(&self, path: &Path<State<M>, Step>) -> Vec<String> {
        let recorder = self.record(path);
        let state = path.last_state();
        let mut lines: Vec<String> = recorder.lines().iter().map(ToString::to_string).collect();
        lines.push(format!(
            "end (server {}): {}; broken {:?}",
            ms(state.now),
            M::summary(state),
            state.broken
        ));
        lines
    }
}
