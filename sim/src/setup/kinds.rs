//! The fault kinds the nemesis injects, and the run kinds that choose among them.

use std::fmt;

/// One kind of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FaultKind {
    /// A replica and the primary drop every message between them, both ways, for a while.
    Partition,
    /// One direction between a replica and the primary drops its messages for a while.
    PartitionOneWay,
    /// A replica's link to the primary holds its messages (delayed, nothing dropped, no RST)
    /// and delivers them on release.
    Hold,
    /// A replica's host crashes (turmoil sends FIN for its sockets) and restarts later.
    Crash,
    /// A replica dies silently: it is partitioned from every server, then crashes, so its
    /// FINs are lost; it restarts later.
    SilentDeath,
    /// A replica's host restarts at once (turmoil `bounce`).
    Restart,
    /// A replica is stopped gracefully (its `run` is cancelled) and started again later.
    GracefulStop,
    /// The primary terminates a backend (`pg_terminate_backend`), usually the lock holder's.
    Terminate,
    /// The primary crashes, losing every session and lock, and restarts later, empty.
    ServerCrash,
    /// The primary crashes and restarts at once, empty.
    ServerRestart,
    /// Clients are routed to the other server, which never saw the lock; the old primary is
    /// crashed, or partitioned from every replica (and later crashed), then restarts empty.
    Failover,
    /// The primary delays every query by 0.5 to 1.5 check intervals for a while.
    Latency,
    /// An operator asks a replica (usually the leader) to resign for a hold-off of up to three
    /// intervals, or makes it ineligible for a while.
    Resign,
    /// A replica's process is paused (SIGSTOP, a frozen VM, a stalled runtime) for one to nine
    /// intervals while the servers' clock runs on, then resumed: lease runs only (`--pause`),
    /// and in none of the lists a seed draws from ([`FaultKind::ALL`]), so that every seed
    /// runs what it ran before.
    Pause,
}

impl FaultKind {
    /// Every kind, in report order.
    pub const ALL: [Self; 13] = [
        Self::Partition,
        Self::PartitionOneWay,
        Self::Hold,
        Self::Crash,
        Self::SilentDeath,
        Self::Restart,
        Self::GracefulStop,
        Self::Terminate,
        Self::ServerCrash,
        Self::ServerRestart,
        Self::Failover,
        Self::Latency,
        Self::Resign,
    ];

    /// The kind's name in reports.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Partition => "partition",
            Self::PartitionOneWay => "partition-oneway",
            Self::Hold => "hold",
            Self::Crash => "crash",
            Self::SilentDeath => "silent-death",
            Self::Restart => "restart",
            Self::GracefulStop => "graceful-stop",
            Self::Terminate => "terminate",
            Self::ServerCrash => "server-crash",
            Self::ServerRestart => "server-restart",
            Self::Failover => "failover",
            Self::Latency => "latency",
            Self::Resign => "resign",
            Self::Pause => "pause",
        }
    }
}

impl FaultKind {
    /// Every kind a sharded elector meets, in report order: all but [`FaultKind::Resign`].
    /// A sharded elector has the operator controls (`resign`, `set_eligible`, tested on the
    /// real server in `tests/tests/sharded.rs`), but the sharded nemesis does not exercise
    /// them yet: adding a kind here would change what every cited sharded seed runs.
    pub const SHARDED: [Self; 12] = [
        Self::Partition,
        Self::PartitionOneWay,
        Self::Hold,
        Self::Crash,
        Self::SilentDeath,
        Self::Restart,
        Self::GracefulStop,
        Self::Terminate,
        Self::ServerCrash,
        Self::ServerRestart,
        Self::Failover,
        Self::Latency,
    ];
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a run's nemesis injects: one kind of fault, over and over, or all kinds mixed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RunKind {
    /// Only this kind.
    Only(FaultKind),
    /// Every kind, drawn at random each time, up to two at once.
    Mixed,
}

impl RunKind {
    /// How many run kinds there are: every fault kind alone, and the mixed one.
    pub const COUNT: usize = FaultKind::ALL.len() + 1;

    /// Every run kind, in report order.
    pub fn all() -> Vec<Self> {
        FaultKind::ALL
            .iter()
            .map(|&kind| Self::Only(kind))
            .chain([Self::Mixed])
            .collect()
    }

    /// The kind of seed `seed`, `seed % COUNT`: the seeds cycle through the kinds (the acquire
    /// mode and fencing of a seed take the next digit; see
    /// [`RunOptions`](super::RunOptions#what-a-seed-runs)).
    pub fn for_seed(seed: u64) -> Self {
        let all = Self::all();
        all[usize::try_from(seed % Self::COUNT as u64).unwrap_or(0)]
    }

    /// The name in reports.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Only(kind) => kind.name(),
            Self::Mixed => "mixed",
        }
    }

    /// How many run kinds a sharded run has: every fault kind a sharded elector meets
    /// ([`FaultKind::SHARDED`]) alone, and the mixed one.
    pub const SHARDED_COUNT: usize = FaultKind::SHARDED.len() + 1;

    /// Every run kind of a sharded run, in report order.
    pub fn sharded_all() -> Vec<Self> {
        FaultKind::SHARDED
            .iter()
            .map(|&kind| Self::Only(kind))
            .chain([Self::Mixed])
            .collect()
    }

    /// The kind of sharded seed `seed`, `seed % SHARDED_COUNT` (see
    /// [`Sharding`](super::Sharding#what-a-sharded-seed-runs)).
    pub fn for_sharded_seed(seed: u64) -> Self {
        let all = Self::sharded_all();
        all[usize::try_from(seed % Self::SHARDED_COUNT as u64).unwrap_or(0)]
    }
}

impl fmt::Display for RunKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
