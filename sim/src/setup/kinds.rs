//! The fault kinds the nemesis injects, the run kinds that choose among them, and the seed
//! spaces that say which run a seed is.
//!
//! A seed names its run kind: seed = code · [`SEED_STRIDE`] + n, with the kind's code from
//! [`RunKind::ALL`], the one list of kinds, and n its run number ([`run_number`]), which picks
//! the variant. A space ([`Space`]) runs the kinds that apply to it, round-robin
//! ([`Space::seed_at`]), so any [`Space::cycle`] consecutive seeds fill every cell once.

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
    /// intervals, or makes it ineligible for a while (in a sharded run: every shard it owns).
    Resign,
    /// A replica's process is paused (SIGSTOP, a frozen VM, a stalled runtime) for one to nine
    /// intervals while the servers' clock runs on, then resumed: the pause runs only
    /// ([`Space::Pause`], lease seeds under `--pause`).
    Pause,
    /// A rolling deploy: the replicas run ranked
    /// ([`Config::version`](plexsphere_leader::Config::version)) with an old version and are
    /// restarted one by one (a graceful stop, a start) with a newer one: the rollout runs only
    /// ([`Space::Rollout`], [`Space::RolloutLease`], `--rollout`).
    Rollout,
}

impl FaultKind {
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
            Self::Rollout => "rollout",
        }
    }
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

/// Seeds of one kind are `code · SEED_STRIDE + n`, n below the stride: ten thousand runs per
/// kind and space (140,000 advisory seeds), five digits to read.
pub const SEED_STRIDE: u64 = 10_000;

/// The run number n of `seed` (`seed = code · SEED_STRIDE + n`): the variant digit and the
/// position among its kind's seeds.
pub const fn run_number(seed: u64) -> u64 {
    seed % SEED_STRIDE
}

impl RunKind {
    /// Every run kind, once, in report order, each with its code beside it: the leading
    /// digits of its seeds (`code · SEED_STRIDE + n`), fixed for good and never reused. A new
    /// kind is added here with a new code and says where it [applies](Self::applies_to).
    pub const ALL: [(Self, u64); 16] = [
        (Self::Only(FaultKind::Partition), 0),
        (Self::Only(FaultKind::PartitionOneWay), 1),
        (Self::Only(FaultKind::Hold), 2),
        (Self::Only(FaultKind::Crash), 3),
        (Self::Only(FaultKind::SilentDeath), 4),
        (Self::Only(FaultKind::Restart), 5),
        (Self::Only(FaultKind::GracefulStop), 6),
        (Self::Only(FaultKind::Terminate), 7),
        (Self::Only(FaultKind::ServerCrash), 8),
        (Self::Only(FaultKind::ServerRestart), 9),
        (Self::Only(FaultKind::Failover), 10),
        (Self::Only(FaultKind::Latency), 11),
        (Self::Only(FaultKind::Resign), 12),
        (Self::Only(FaultKind::Pause), 14),
        (Self::Only(FaultKind::Rollout), 15),
        (Self::Mixed, 13),
    ];

    /// The kind's code (see [`RunKind::ALL`]).
    pub fn code(self) -> u64 {
        Self::ALL
            .iter()
            .find(|(kind, _)| *kind == self)
            .map_or(u64::MAX, |(_, code)| *code)
    }

    /// Whether seeds of `space` run this kind: the pause only in pause runs (of the single
    /// lease, or of a lease shard space), which run nothing else; the rollout only in rollout
    /// runs, which run it alone or mixed with the other faults of their mechanism (the
    /// rollout goes on while a mixed run's nemesis draws from [`Space::faults`]); every
    /// other kind in every other space.
    pub const fn applies_to(self, space: Space) -> bool {
        let pause = matches!(space, Space::Pause | Space::ShardedPause);
        let rollout = matches!(space, Space::Rollout | Space::RolloutLease);
        match self {
            Self::Only(FaultKind::Pause) => pause,
            Self::Only(FaultKind::Rollout) => rollout,
            Self::Mixed => !pause,
            Self::Only(_) => !pause && !rollout,
        }
    }

    /// The kind seed `seed` names (by its code, `seed / SEED_STRIDE`); `None` for a code no
    /// kind has.
    pub fn of_seed(seed: u64) -> Option<Self> {
        let code = seed / SEED_STRIDE;
        Self::ALL
            .iter()
            .find(|(_, c)| *c == code)
            .map(|(kind, _)| *kind)
    }

    /// The seed of this kind with run number `run` (below [`SEED_STRIDE`]).
    pub fn seed(self, run: u64) -> u64 {
        self.code() * SEED_STRIDE + run
    }

    /// The name in reports.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Only(kind) => kind.name(),
            Self::Mixed => "mixed",
        }
    }
}

/// A seed space (`--sharded`, `--mechanism lease`, `--pause`, and `--sharded --mechanism
/// lease` with or without `--pause`): its kinds and variants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Space {
    /// The advisory lock: variants poll, queue, poll with fencing, queue with fencing.
    Advisory,
    /// The lease: variants plain work, fenced writes.
    Lease,
    /// Lease runs whose nemesis pauses a replica's process: the same two variants.
    Pause,
    /// Sharded leadership: variants 8, 2 and 12 shards.
    Sharded,
    /// Sharded leadership over leases (`ShardConfig::lease`): the sharded variants.
    ShardedLease,
    /// Lease shard spaces whose nemesis pauses a replica's process: the same variants.
    ShardedPause,
    /// Rolling deploys of ranked replicas over the advisory lock (`--rollout`): the advisory
    /// variants.
    Rollout,
    /// Rolling deploys of ranked replicas over the lease (`--rollout --mechanism lease`): the
    /// lease variants.
    RolloutLease,
}

impl Space {
    /// The kinds its seeds run, in report order.
    pub fn kinds(self) -> Vec<RunKind> {
        let kinds = RunKind::ALL.iter().map(|(kind, _)| *kind);
        kinds.filter(|kind| kind.applies_to(self)).collect()
    }

    /// The fault kinds a mixed run of the space draws from: every single kind of it; in a
    /// rollout space, those of its mechanism's space (the rollout itself always runs).
    pub fn faults(self) -> Vec<FaultKind> {
        match self {
            Self::Rollout => return Self::Advisory.faults(),
            Self::RolloutLease => return Self::Lease.faults(),
            _ => {}
        }
        self.kinds()
            .into_iter()
            .filter_map(|kind| match kind {
                RunKind::Only(fault) => Some(fault),
                RunKind::Mixed => None,
            })
            .collect()
    }

    /// How many kinds its seeds run.
    pub const fn kind_count(self) -> u64 {
        let mut count = 0;
        let mut index = 0;
        while index < RunKind::ALL.len() {
            if RunKind::ALL[index].0.applies_to(self) {
                count += 1;
            }
            index += 1;
        }
        count
    }

    /// How many variants a run number picks from (`n % variants`).
    pub const fn variants(self) -> u64 {
        match self {
            Self::Advisory | Self::Rollout => 4,
            Self::Lease | Self::Pause | Self::RolloutLease => 2,
            Self::Sharded | Self::ShardedLease | Self::ShardedPause => 3,
        }
    }

    /// Within this many consecutive seeds of the space ([`Space::seed_at`]) every (kind,
    /// variant) cell runs once.
    pub const fn cycle(self) -> u64 {
        self.kind_count() * self.variants()
    }

    /// How many seeds the space has: [`SEED_STRIDE`] run numbers of each kind.
    pub const fn seed_count(self) -> u64 {
        self.kind_count() * SEED_STRIDE
    }

    /// The seed at `position` of the space's order: round-robin over its kinds, run number by
    /// run number (position p is kind p mod k, run p / k). `position` must be below
    /// [`Space::seed_count`].
    pub fn seed_at(self, position: u64) -> u64 {
        let kinds = self.kinds();
        let count = kinds.len() as u64;
        let kind = kinds[usize::try_from(position % count).unwrap_or(0)];
        kind.seed(position / count)
    }

    /// Where seed `seed` stands in the space's order; `None` when its kind is not of the space.
    pub fn position(self, seed: u64) -> Option<u64> {
        let kind = RunKind::of_seed(seed)?;
        let index = self.kinds().iter().position(|k| *k == kind)?;
        Some(run_number(seed) * self.kind_count() + index as u64)
    }

    /// The first `count` seeds of the space, in order.
    pub fn seeds(self, count: u64) -> impl Iterator<Item = u64> {
        (0..count).map(move |position| self.seed_at(position))
    }
}

impl fmt::Display for RunKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn every_kind_has_a_code_of_its_own_and_a_seed_names_its_kind() {
        let codes: BTreeSet<u64> = RunKind::ALL.iter().map(|(kind, _)| kind.code()).collect();
        assert_eq!(codes.len(), RunKind::ALL.len());
        for (kind, _) in RunKind::ALL {
            for run in [0, 1, 17, SEED_STRIDE - 1] {
                assert_eq!(RunKind::of_seed(kind.seed(run)), Some(kind));
                assert_eq!(run_number(kind.seed(run)), run);
            }
        }
        assert_eq!(RunKind::of_seed(99 * SEED_STRIDE), None);
    }

    /// The codes the docs' seeds rest on; changing one changes what a cited seed runs.
    #[test]
    fn the_codes_stay_what_they_are() {
        let names: Vec<(u64, &str)> = RunKind::ALL
            .iter()
            .map(|(kind, code)| (*code, kind.name()))
            .collect();
        assert_eq!(
            names,
            [
                (0, "partition"),
                (1, "partition-oneway"),
                (2, "hold"),
                (3, "crash"),
                (4, "silent-death"),
                (5, "restart"),
                (6, "graceful-stop"),
                (7, "terminate"),
                (8, "server-crash"),
                (9, "server-restart"),
                (10, "failover"),
                (11, "latency"),
                (12, "resign"),
                (14, "pause"),
                (15, "rollout"),
                (13, "mixed"),
            ]
        );
    }

    #[test]
    fn a_space_goes_round_robin_over_its_kinds_and_finds_each_seed_again() {
        let spaces = [
            Space::Advisory,
            Space::Lease,
            Space::Pause,
            Space::Sharded,
            Space::ShardedLease,
            Space::ShardedPause,
            Space::Rollout,
            Space::RolloutLease,
        ];
        for space in spaces {
            let kinds = space.kinds();
            assert_eq!(kinds.len() as u64, space.kind_count());
            for position in (0..3 * space.cycle()).chain([space.seed_count() - 1]) {
                let seed = space.seed_at(position);
                assert_eq!(space.position(seed), Some(position), "{space:?} {seed}");
                assert!(RunKind::of_seed(seed).is_some_and(|k| k.applies_to(space)));
            }
            let cycle: BTreeSet<(u64, u64)> = space
                .seeds(space.cycle())
                .map(|seed| (seed / SEED_STRIDE, run_number(seed) % space.variants()))
                .collect();
            assert_eq!(cycle.len() as u64, space.cycle(), "{space:?}");
        }
        assert_eq!(Space::Pause.kinds(), [RunKind::Only(FaultKind::Pause)]);
        assert_eq!(
            Space::Sharded.position(RunKind::Only(FaultKind::Pause).seed(0)),
            None
        );
        assert!(!Space::Advisory.faults().contains(&FaultKind::Pause));
        assert_eq!(Space::ShardedLease.kinds(), Space::Sharded.kinds());
        assert_eq!(
            Space::ShardedPause.kinds(),
            [RunKind::Only(FaultKind::Pause)]
        );
        assert_eq!(Space::ShardedPause.cycle(), 3);
        let rollout = [RunKind::Only(FaultKind::Rollout), RunKind::Mixed];
        assert_eq!(Space::Rollout.kinds(), rollout);
        assert_eq!(Space::RolloutLease.kinds(), rollout);
        assert_eq!(Space::Rollout.faults(), Space::Advisory.faults());
        assert!(!Space::Advisory.faults().contains(&FaultKind::Rollout));
    }
}
