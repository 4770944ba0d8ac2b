//! One model engine for every mode: the replicas, their drivers, the server's sessions, the
//! wire, the faults, time, the symmetry reduction and the properties' scaffolding, written once
//! and generic over a [`Mode`]: what really differs between the single and the sharded
//! election (the machine, what its driver performs, the server's lock table, the bounds).
//!
//! - [`model`]: the model, its size and the stateright [`Model`](stateright::Model).
//! - [`state`]: the state the checker explores.
//! - [`steps`]: the steps a state allows.
//! - [`world`]: a step applied: the driver feeding the machine, the wire, the sessions.
//! - [`time`]: time passing, and the next instant anything is due.
//! - [`faults`]: crashes, terminations, restarts, pauses.
//! - [`canon`]: the symmetry reduction.
//! - [`props`]: the properties every mode has.

use std::fmt::Debug;
use std::hash::Hash;

use plexsphere_leader_core::{CheckInterval, Machine};
use stateright::Property;

use crate::clock::{Micros, Rate};
use crate::flight::Flight;
use crate::sabotage::Sabotage;
use crate::server::{Locks, Sess};

pub mod canon;
pub mod due;
pub mod faults;
pub mod model;
pub mod props;
pub mod state;
pub mod steps;
pub mod time;
pub mod world;

pub use self::canon::Renamed;
pub use self::model::{ElectionModel, INTERVAL, PauseClock};
pub use self::state::{Broken, Cause, Name, Replica, State, seen};
pub use self::world::World;

/// A mode's parts: its machine, what its driver knows, the server's lock table, its history.
pub trait Parts: Copy + Debug + Eq + Hash + Send + Sync + Sized + 'static {
    /// The machine's inputs.
    type Event: Clone + Debug + Eq + Hash + Send + Sync;
    /// The machine's outputs.
    type Action: Clone + Debug + Eq + Hash + Send + Sync;
    /// The core machine each replica runs.
    type Machine: Machine<Event = Self::Event, Action = Self::Action, Error = Cause>
        + Clone
        + Debug
        + Eq
        + Hash
        + Send
        + Sync;
    /// The replicas' clock rates: drifting, or keeping the server's time.
    type Rate: Rate;
    /// What a replica's driver knows of its open terms.
    type Terms: Clone + Debug + Default + Eq + Hash + Send + Sync;
    /// The server's lock table.
    type Locks: Locks;
    /// What the mode's properties remember along a path.
    type History: Renamed + Clone + Debug + Eq + Hash + Send + Sync;

    /// Whether a request given up (by a crash) or cut off (by a partition) may still reach the
    /// server late.
    fn stragglers(&self) -> bool;

    /// A fresh machine for replica `replica` of the initial state, as its process starts it
    /// (a ranked model's replicas differ in their rank).
    fn machine(&self, replica: usize) -> Self::Machine;
    /// The fresh machine a crashed replica's process restarts with: `old`'s options.
    fn restarted(&self, old: &Self::Machine) -> Self::Machine;
    /// The check interval.
    fn interval(&self) -> CheckInterval;
    /// The server's lock table at the start.
    fn locks(&self) -> Self::Locks;
    /// The history at the start.
    fn history(&self) -> Self::History;

    /// Whether `machine` may lead (or own shards).
    fn is_eligible(machine: &Self::Machine) -> bool;
    /// Whether `machine` leads (or owns a shard): a resign then has something to give up.
    fn leads(machine: &Self::Machine) -> bool;
    /// The session of replica `r` a `pg_terminate_backend` ends, if any.
    fn terminable(s: &State<Self>, r: usize) -> Option<Sess>;
    /// The last state of a trace in one line.
    fn summary(s: &State<Self>) -> String;
}

/// What a mode's driver does with the machine's actions, and how the server answers them.
pub trait Driver: Parts {
    /// Performs one action of replica `r`; returns the answer given at once, if any.
    fn perform(world: &mut World<'_, Self>, r: usize, action: Self::Action) -> Option<Self::Event>;
    /// The server runs `action` of `owner` now; `None` when it answers later.
    fn execute(
        world: &mut World<'_, Self>,
        owner: Sess,
        action: &Self::Action,
    ) -> Option<Self::Event>;
    /// The server ended `sess`: its locks go (with `notify` its client hears of a failed wait).
    fn release(world: &mut World<'_, Self>, sess: Sess, notify: bool);
    /// The lock table's own deadlines due now.
    fn lock_timeouts(_world: &mut World<'_, Self>) {}
    /// Replica `replica` crashed: what the history forgets of it.
    fn crashed(_s: &mut State<Self>, _replica: u8) {}

    /// Whether a sabotaged driver never fires `machine`'s next deadline.
    fn skips_deadline(_sabotage: Sabotage, _machine: &Self::Machine) -> bool {
        false
    }
    /// Whether a sabotaged driver does not pass `event` on.
    fn ignores(_sabotage: Sabotage, _event: &Self::Event) -> bool {
        false
    }
    /// The operation `flight` was lost (a sabotaged driver may answer it anyway).
    fn lost(_world: &mut World<'_, Self>, _flight: &Flight<Self::Action, Self::Event>) {}
}

/// The bounds a mode's beliefs are held to, and its properties.
pub trait Bounds: Driver {
    /// The name of the overlap property, the first one (it counts the states checked).
    const OVERLAP: &'static str;
    /// The name of the bounded liveness property.
    const RECOVERY: &'static str;
    /// How long after the last fault the mode must have recovered, in check intervals.
    const RECOVERY_INTERVALS: u64;

    /// Time passed by `delta`: how long each belief without its lock has lasted grows.
    fn age(model: &ElectionModel<Self>, s: &mut State<Self>, delta: Micros);
    /// Whether a running owner's fenced write with a stale epoch goes through now.
    fn stale_write_accepted(model: &ElectionModel<Self>, s: &State<Self>) -> bool;
    /// The next instant a bound would be passed, so that a belief outliving its bound is seen
    /// in a state even when the owner's own deadline falls later.
    fn bound_instant(model: &ElectionModel<Self>, s: &State<Self>) -> Option<Micros>;
    /// Whether no two owners overlap beyond the mode's bound.
    fn overlap_within_bound(model: &ElectionModel<Self>, s: &State<Self>) -> bool;
    /// Whether every "always" property of the mode's own holds (the overlap and more).
    fn within_bounds(model: &ElectionModel<Self>, s: &State<Self>) -> bool {
        Self::overlap_within_bound(model, s)
    }
    /// Whether the mode has recovered: a leader, every shard owned.
    fn recovered(model: &ElectionModel<Self>, s: &State<Self>) -> bool;
    /// The properties of the mode's own, after the common ones.
    fn properties(model: &ElectionModel<Self>) -> Vec<Property<ElectionModel<Self>>>;
}

/// An election mode: its [`Parts`], its [`Driver`] and its [`Bounds`], all the engine needs.
pub trait Mode: Bounds {}

impl<M: Bounds> Mode for M {}
