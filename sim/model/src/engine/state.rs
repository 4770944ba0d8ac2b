//! A model's state: the real core machines of the replicas, what their drivers know, the
//! server, the operations in flight, and what the properties remember along the path.

use std::fmt;
use std::hash::{Hash, Hasher};

use plexsphere_leader_core::ConnId;

use super::Parts;
use crate::clock::Micros;
use crate::flight::Flight;
use crate::server::{Server, Sess};

/// The driver's error type the model feeds the core.
pub type Cause = &'static str;

/// A replica's name: it follows the replica through the symmetry reduction's reorderings, for
/// the traces only. It is no part of the state's identity: every name equals every other, and
/// hashes to nothing.
#[derive(Debug, Clone, Copy)]
pub struct Name(pub u8);

impl PartialEq for Name {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for Name {}

impl Hash for Name {
    fn hash<H: Hasher>(&self, _: &mut H) {}
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// One replica: its real machine and what its driver knows.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Replica<M: Parts> {
    /// Its name in the traces.
    pub name: Name,
    /// The core machine.
    pub machine: M::Machine,
    /// Its clock.
    pub local: Micros,
    /// Its clock's rate.
    pub rate: M::Rate,
    /// Paused: it takes no input.
    pub paused: bool,
    /// Cut off from the server: what it sends is lost, and nothing reaches it.
    pub partitioned: bool,
    /// Its process incarnation: a crash starts the next.
    pub run: u32,
    /// The session its locks are taken on.
    pub lock_conn: Option<ConnId>,
    /// What the driver knows of its open terms.
    pub terms: M::Terms,
}

impl<M: Parts> Replica<M> {
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
        self.lock_conn.map(|conn| self.sess(index, conn))
    }
}

/// A property broken inside a step (seen as it happens, not in the state after it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Broken {
    /// The server handed out an epoch not above every epoch it handed out before.
    EpochNotIncreasing,
    /// A fenced write with an epoch older than the newest grant was accepted.
    StaleWriteAccepted,
    /// A lock, a lease or a shard was released while its holder's term was open.
    ReleasedWhileLeading,
    /// A ranked leader yielded with no better-ranked replica, or (no fault since) its yield
    /// let a replica not better-ranked than it begin the next term.
    YieldMisdirected,
}

/// "Sometimes" discoveries, as bits.
pub mod seen {
    /// A term began.
    pub const ELECTED: u8 = 1;
    /// A term began on another replica after a resign.
    pub const RESIGN_HANDOVER: u8 = 2;
    /// A term began on a lock granted from the queue on its release.
    pub const QUEUED_HANDOVER: u8 = 4;
    /// A term began on a lease claimed after another holder's expired.
    pub const EXPIRY_TAKEOVER: u8 = 8;
    /// A shard handed over began a term on another replica.
    pub const HANDOVER: u8 = 16;
    /// Every shard was owned at once.
    pub const ALL_OWNED: u8 = 32;
    /// A term began on another replica after a ranked leader yielded to it.
    pub const PREEMPTED: u8 = 64;
}

/// The model's state.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State<M: Parts> {
    /// The server's clock.
    pub now: Micros,
    /// The replicas.
    pub replicas: Vec<Replica<M>>,
    /// The server.
    pub server: Server<M::Locks>,
    /// Operations in flight, ordered by owner.
    pub flights: Vec<Flight<M::Action, M::Event>>,
    /// Faults the path may still inject.
    pub faults_left: u8,
    /// When the last fault or operator action happened.
    pub quiet_since: Micros,
    /// "Sometimes" discoveries on the path ([`seen`]).
    pub seen: u8,
    /// A property broken inside a step.
    pub broken: Option<Broken>,
    /// What the mode's properties remember along the path.
    pub history: M::History,
}
