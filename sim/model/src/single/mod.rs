//! The single-lock mode: three replicas running the real [`Election`], with the advisory lock
//! (queued acquire, fencing) or with the lease.
//!
//! - [`locks`]: the server's lock table, fence and lease row.
//! - [`perform`]: the driver performing the election's actions.
//! - [`execute`]: the server running the statements.
//! - [`bounds`]: how long a belief has lasted, and the instants its bounds pass.
//! - [`props`]: the mode's own properties.

use std::hash::{DefaultHasher, Hash};

use plexsphere_leader_core::rank::{Rank, Version};
use plexsphere_leader_core::{
    AcquireMode, Action, CheckInterval, ConnId, Election, Event, Lease, Options,
};

use crate::clock::{EXACT, Micros, Ppm};
use crate::engine::{Cause, ElectionModel, INTERVAL, Parts, PauseClock, Renamed, State};
use crate::server::Sess;

pub mod execute;
pub mod locks;
pub mod perform;
pub mod props;

/// Which mechanism the elections use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mechanism {
    /// The session advisory lock, standbys queued on it, fencing on.
    Advisory,
    /// The lease row.
    Lease,
}

/// The single-lock mode: its mechanism and the elections' options.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Single {
    /// The mechanism.
    pub mechanism: Mechanism,
    /// The elections' options (without a rank: [`Single::ranked`] gives each replica its own).
    pub options: Options,
    /// Whether the replicas are ranked ([`Options::preference`]): replica 0 runs the new
    /// version [`NEW`] and starts ineligible (its pod not yet ready: the operator's free switch
    /// brings it in at any instant, and a restart takes it out again), the others run the old
    /// [`OLD`], as in the middle of a rolling deploy.
    pub ranked: bool,
}

/// The old version of a ranked model.
pub const OLD: Rank = Rank::of_version(Version::new(1, 0, 0));

/// The new version of a ranked model: replica 0's.
pub const NEW: Rank = Rank::of_version(Version::new(2, 0, 0));

impl Single {
    /// The options replica `replica` of the initial state runs with.
    pub fn options_of(&self, replica: usize) -> Options {
        match (self.ranked, replica) {
            (false, _) => self.options,
            (true, 0) => self.options.preference(NEW).eligible(false),
            (true, _) => self.options.preference(OLD),
        }
    }
}

/// What a replica's driver knows of its term.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Terms {
    /// The open term's epoch.
    pub epoch: Option<u64>,
    /// The lock session the server took the lock from (the session ended under it).
    pub lost: Option<ConnId>,
    /// How long, unpaused, it has led on a lost lock.
    pub stale: Micros,
}

/// What the single-lock properties remember along a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct History {
    /// The highest epoch a term began with.
    pub max_epoch: u64,
    /// The highest epoch the server ever handed out (a rollback does not lower it).
    pub granted: u64,
    /// The replica whose term last ended by a resign, until another begins a term.
    pub resigned: Option<u8>,
    /// The last yield, until another replica begins a term.
    pub yielded: Option<Yield>,
}

/// A ranked leader's yield, as the properties remember it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Yield {
    /// The replica that yielded.
    pub by: u8,
    /// The path's faults left then: a fault since spends one.
    pub faults_left: u8,
    /// Whether the faults had settled then: none in progress (no replica paused or cut off),
    /// none ended within the defer limit and an interval before.
    pub quiet: bool,
}

impl Renamed for History {
    fn fingerprint(&self, mine: &dyn Fn(u8) -> bool, hasher: &mut DefaultHasher) {
        self.resigned.is_some_and(mine).hash(hasher);
        self.yielded
            .filter(|y| mine(y.by))
            .map(|y| (y.faults_left, y.quiet))
            .hash(hasher);
    }

    fn rename(&mut self, rename: &dyn Fn(u8) -> u8) {
        self.resigned = self.resigned.map(rename);
        self.yielded = self.yielded.map(|y| Yield {
            by: rename(y.by),
            ..y
        });
    }
}

impl ElectionModel<Single> {
    /// The model of `mechanism` as CI checks it.
    pub fn single(mechanism: Mechanism) -> Self {
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
        let mode = Single {
            mechanism,
            options,
            ranked: false,
        };
        Self::new(mode, 2, rates, pause_clock)
    }

    /// The ranked model of `mechanism`, a rolling deploy half done: replica 0 runs the new
    /// version and comes up (becomes eligible) at an instant of the checker's choice, the two
    /// others run the old one (the default window of two intervals, no floor). The old
    /// replicas defer to the new one while it is a live candidate, and an old leader yields to
    /// it once it has been live for the window.
    pub fn ranked(mechanism: Mechanism) -> Self {
        let mut model = Self::single(mechanism);
        model.mode.ranked = true;
        model
    }

    /// The same model with standbys asking for the lock by `mode` (advisory lock only; the
    /// CI model queues).
    #[must_use]
    pub fn with_acquire(mut self, mode: AcquireMode) -> Self {
        self.mode.options = self.mode.options.acquire(mode);
        self
    }
}

impl Parts for Single {
    type Event = Event<Cause>;
    type Action = Action<Cause>;
    type Machine = Election<Cause>;
    type Rate = Ppm;
    type Terms = Terms;
    type Locks = locks::LockTable;
    type History = History;

    fn stragglers(&self) -> bool {
        true
    }

    fn machine(&self, replica: usize) -> Election<Cause> {
        Election::with_options(self.options_of(replica))
    }

    /// The same options: a restarted replica keeps its rank.
    fn restarted(&self, old: &Election<Cause>) -> Election<Cause> {
        Election::with_options(old.options())
    }

    fn interval(&self) -> CheckInterval {
        self.options.interval()
    }

    fn locks(&self) -> locks::LockTable {
        locks::LockTable::default()
    }

    fn history(&self) -> History {
        History::default()
    }

    fn is_eligible(machine: &Election<Cause>) -> bool {
        machine.is_eligible()
    }

    fn leads(machine: &Election<Cause>) -> bool {
        machine.is_leader()
    }

    /// Its lock session, else its newest.
    fn terminable(s: &State<Self>, r: usize) -> Option<Sess> {
        let replica = &s.replicas[r];
        let index = u8::try_from(r).ok()?;
        let mine = |sess: &Sess| sess.replica == index && sess.run == replica.run;
        replica
            .lock_sess(r)
            .filter(|sess| s.server.is_open(*sess))
            .or_else(|| s.server.sessions.iter().rev().map(|x| x.owner).find(mine))
    }

    fn summary(s: &State<Self>) -> String {
        props::summary(s)
    }
}
