//! The state of the sharded model: three real sharded elections over K shards and their
//! environment.

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};

use plexsphere_leader_core::ConnId;
use plexsphere_leader_core::shards::{ShardAction, ShardEvent, ShardedElection};

use crate::clock::Micros;
use crate::flight::Flight;
use crate::server::Sess;

/// The driver's error type the model feeds the core.
pub type Cause = &'static str;

/// An operation of a sharded election in flight.
pub type ShardFlight = Flight<ShardAction<Cause>, ShardEvent<Cause>>;

/// One replica: its real sharded election and what its driver knows.
#[derive(Debug, Clone)]
pub struct Replica {
    /// A name that follows the replica through the symmetry reduction (traces only).
    pub name: u8,
    /// The core machine.
    pub machine: ShardedElection<Cause>,
    /// Its clock.
    pub local: Micros,
    /// Paused: it takes no input.
    pub paused: bool,
    /// Cut off from the server.
    pub partitioned: bool,
    /// Its process incarnation.
    pub run: u32,
    /// Its lock session.
    pub session: Option<ConnId>,
    /// The epoch of each shard term it has open.
    pub epochs: BTreeMap<u32, u64>,
    /// How long, unpaused, each owned shard has been believed without its lock.
    pub stale: BTreeMap<u32, Micros>,
}

impl Replica {
    /// The session `conn` of its current run.
    pub fn sess(&self, index: usize, conn: ConnId) -> Sess {
        Sess {
            replica: u8::try_from(index).unwrap_or(u8::MAX),
            run: self.run,
            conn,
        }
    }

    /// Its lock session, as the server knows it.
    pub fn lock_sess(&self, index: usize) -> Option<Sess> {
        self.session.map(|conn| self.sess(index, conn))
    }

    /// The shards whose terms are open.
    pub fn owned(&self) -> Vec<u32> {
        self.machine
            .owned()
            .into_iter()
            .map(|(shard, _)| shard.get())
            .collect()
    }

    #[allow(clippy::type_complexity)] // reason: a tuple of borrowed fields, used only here
    fn key(
        &self,
    ) -> (
        &ShardedElection<Cause>,
        Micros,
        bool,
        bool,
        u32,
        Option<ConnId>,
        &BTreeMap<u32, u64>,
        &BTreeMap<u32, Micros>,
    ) {
        (
            &self.machine,
            self.local,
            self.paused,
            self.partitioned,
            self.run,
            self.session,
            &self.epochs,
            &self.stale,
        )
    }
}

impl PartialEq for Replica {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}

impl Eq for Replica {}

impl Hash for Replica {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.key().hash(state);
    }
}

/// One open server session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Session {
    /// Whose.
    pub owner: Sess,
    /// Its backend's pid.
    pub pid: i32,
    /// Whether registration set `idle_session_timeout`.
    pub idle_limit: bool,
    /// When it last ran a statement.
    pub last_active: Micros,
    /// Whether it holds the member lock.
    pub member: bool,
}

/// The server of the shard space.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Server {
    /// Backends started so far.
    pub backends: i32,
    /// Open sessions, ordered by owner.
    pub sessions: Vec<Session>,
    /// Each shard's holder.
    pub holders: Vec<Option<Sess>>,
    /// Each shard's fencing epoch (durable: the fence commits synchronously).
    pub epochs: Vec<u64>,
}

impl Server {
    /// The session of `sess`, if open.
    pub fn session(&self, sess: Sess) -> Option<&Session> {
        self.sessions.iter().find(|s| s.owner == sess)
    }
}

/// A property broken inside a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Broken {
    /// A shard's epoch was handed out twice.
    EpochNotIncreasing,
    /// A fenced write with a shard's stale epoch was accepted.
    StaleWriteAccepted,
    /// A shard was unlocked while its owner's term was open.
    ReleasedWhileOwned,
}

/// "Sometimes" discoveries, as bits.
pub mod seen {
    /// A shard term began.
    pub const ELECTED: u8 = 1;
    /// A shard handed over began a term on another replica.
    pub const HANDOVER: u8 = 2;
    /// A shard began a term on another replica after a resign.
    pub const RESIGN_HANDOVER: u8 = 4;
    /// Every shard was owned at once.
    pub const ALL_OWNED: u8 = 8;
}

/// The model's state.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State {
    /// The server's clock.
    pub now: Micros,
    /// The replicas.
    pub replicas: Vec<Replica>,
    /// The server.
    pub server: Server,
    /// Operations in flight, ordered by owner.
    pub flights: Vec<ShardFlight>,
    /// Faults the path may still inject.
    pub faults_left: u8,
    /// When the last fault happened.
    pub quiet_since: Micros,
    /// Discoveries ([`seen`]).
    pub seen: u8,
    /// A property broken inside a step.
    pub broken: Option<Broken>,
    /// Per shard, the highest epoch a term began with.
    pub max_epochs: Vec<u64>,
    /// Shards whose term ended by a handover or a resign, with the replica that gave them up
    /// and whether it resigned.
    pub given_up: BTreeMap<u32, (u8, bool)>,
}
