//! The state of the single-lock models (advisory lock, lease): three real elections and their
//! environment.

use std::hash::{Hash, Hasher};

use plexsphere_leader_core::{Action, ConnId, Election, Event};

use crate::clock::{Micros, Ppm};
use crate::flight::Flight;
use crate::server::{Server, Sess};

/// The driver's error type the model feeds the core.
pub type Cause = &'static str;

/// An operation of a single-lock election in flight.
pub type SingleFlight = Flight<Action<Cause>, Event<Cause>>;

/// One replica: its real election and what its driver knows.
#[derive(Debug, Clone)]
pub struct Replica {
    /// A name that follows the replica through the symmetry reduction's reorderings (for traces
    /// only: not part of the state's identity).
    pub name: u8,
    /// The core machine.
    pub machine: Election<Cause>,
    /// Its clock.
    pub local: Micros,
    /// Its clock's rate.
    pub rate: Ppm,
    /// Paused: it takes no input.
    pub paused: bool,
    /// Cut off from the server: what it sends is lost, and nothing reaches it.
    pub partitioned: bool,
    /// Its process incarnation: a crash starts the next.
    pub run: u32,
    /// The hijacked lock session.
    pub lock_conn: Option<ConnId>,
    /// The open term's epoch.
    pub epoch: Option<u64>,
    /// The lock session the server took the lock from (the session ended under it).
    pub lost: Option<ConnId>,
    /// How long, unpaused, it has led on a lost lock.
    pub stale: Micros,
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

    /// The identity fields (all but the name).
    #[allow(clippy::type_complexity)] // reason: a tuple of borrowed fields, used only here
    fn key(
        &self,
    ) -> (
        &Election<Cause>,
        Micros,
        Ppm,
        bool,
        bool,
        u32,
        Option<ConnId>,
        Option<u64>,
        Option<ConnId>,
        Micros,
    ) {
        (
            &self.machine,
            self.local,
            self.rate,
            self.paused,
            self.partitioned,
            self.run,
            self.lock_conn,
            self.epoch,
            self.lost,
            self.stale,
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

/// A property broken inside a step (seen as it happens, not in the state after it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Broken {
    /// The server handed out an epoch not above every epoch it handed out before.
    EpochNotIncreasing,
    /// A fenced write with an epoch older than the newest grant was accepted.
    StaleWriteAccepted,
    /// The lock or lease was released while its holder still led.
    ReleasedWhileLeading,
}

/// "Sometimes" discoveries, as bits.
pub mod seen {
    /// A term began.
    pub const ELECTED: u8 = 1;
    /// A term began on a lock granted from the queue on its release.
    pub const QUEUED_HANDOVER: u8 = 2;
    /// A term began on a lease claimed after another holder's expired.
    pub const EXPIRY_TAKEOVER: u8 = 4;
    /// A term began on another replica after a resign.
    pub const RESIGN_HANDOVER: u8 = 8;
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
    pub flights: Vec<SingleFlight>,
    /// Faults the path may still inject.
    pub faults_left: u8,
    /// When the last fault or operator action happened.
    pub quiet_since: Micros,
    /// "Sometimes" discoveries on the path ([`seen`]).
    pub seen: u8,
    /// A property broken inside a step.
    pub broken: Option<Broken>,
    /// The highest epoch a term began with.
    pub max_epoch: u64,
    /// The highest epoch the server ever handed out (a rollback does not lower it).
    pub granted: u64,
    /// The replica whose term last ended by a resign, until another begins a term.
    pub resigned: Option<u8>,
}
