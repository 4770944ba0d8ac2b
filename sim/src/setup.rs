//! The bottom of the harness: what a run is set up with, and nothing that runs it. The run
//! options and what a seed chooses ([`RunOptions`]), the timing and its bounds ([`Params`]),
//! the fault and run kinds ([`FaultKind`], [`RunKind`]), the shard space ([`Sharding`]), the
//! sabotages a run may switch on ([`Sabotage`]), the server hosts ([`SERVERS`]) and the
//! application names that tie server sessions to replica incarnations. It imports nothing
//! else of the harness, so every other module (the checkers above all, which are pure
//! functions of the recorded evidence) may import it without a cycle.

mod kinds;
mod params;
mod sabotage;
mod sharding;

pub use kinds::{FaultKind, RunKind};
pub use params::Params;
pub use sabotage::{DriverSabotage, Sabotage, ShardSabotage};
pub use sharding::Sharding;

use std::fmt;

use crate::clock::ClockRate;
use plexsphere_leader::config::AcquireMode;

/// How the replicas of a single election hold leadership (`--mechanism`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Mechanism {
    /// The session advisory lock (the spec's): a lock session per leader.
    #[default]
    Advisory,
    /// The lease row of `Config::lease(Duration::ZERO)` (TTL three intervals), one autocommit
    /// statement per check on any pooled connection; always polls.
    Lease,
}

impl Mechanism {
    /// The CLI name (`--mechanism advisory|lease`).
    pub const fn name(self) -> &'static str {
        match self {
            Self::Advisory => "advisory",
            Self::Lease => "lease",
        }
    }

    /// The mechanism the CLI names `name`.
    pub fn from_name(name: &str) -> Option<Self> {
        [Self::Advisory, Self::Lease]
            .into_iter()
            .find(|mechanism| mechanism.name() == name)
    }
}

impl fmt::Display for Mechanism {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The server host names; index 0 is the first primary.
pub(crate) const SERVERS: [&str; 2] = ["pg1", "pg2"];

/// The application name of an incarnation: `r<index>.<incarnation>`. The server logs it with
/// every session, which ties server-side sessions to replica incarnations.
pub(crate) fn application_name(index: usize, incarnation: u32) -> String {
    format!("r{index}.{incarnation}")
}

/// The (replica, incarnation) an application name of [`application_name`] stands for.
pub(crate) fn parse_application_name(name: &str) -> Option<(usize, u32)> {
    let (replica, incarnation) = name.strip_prefix('r')?.split_once('.')?;
    Some((replica.parse().ok()?, incarnation.parse().ok()?))
}

/// What to run.
///
/// # What a seed runs
///
/// Every run's configuration derives from its seed, here and nowhere else: its fault kind
/// ([`RunKind::for_seed`]) is `seed % K`, with K = [`RunKind::COUNT`] (14: thirteen fault kinds
/// and the mixed one), and its variant `(seed / K) % 4` chooses the acquire mode and fencing
/// ([`RunOptions::mode_for_seed`], [`RunOptions::fencing_for_seed`]):
///
/// | variant | seeds (K = 14) | acquire mode | fencing |
/// |---|---|---|---|
/// | 0 | 0–13, 56–69, … | poll (the spec's) | off |
/// | 1 | 14–27, 70–83, … | queue | off |
/// | 2 | 28–41, 84–97, … | poll | on |
/// | 3 | 42–55, 98–111, … | queue | on |
///
/// So any K consecutive seeds run every kind, and any [`RunOptions::CYCLE`] = 4·K consecutive
/// seeds (56) run every (kind, mode, fencing) cell exactly once, whatever K is: a kind added
/// to [`FaultKind`] meets every mode and fencing setting within a cycle.
/// (Before, the mode was `seed % 2` and the kind `seed % 14`: with an even number of kinds
/// each kind only ever met one mode.) The summary's cell table shows the coverage of every
/// run of many seeds. `--mode` and `--fencing` override the seed's choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunOptions {
    /// The seed: turmoil's network, the nemesis and the simulated work all derive from it.
    pub seed: u64,
    /// How many replicas run an elector.
    pub replicas: usize,
    /// The timing.
    pub params: Params,
    /// Whether the electors fence their terms and the service's work is fenced writes
    /// ([`RunOptions::fencing_for_seed`] by default).
    pub fencing: bool,
    /// How the electors' standbys ask for the lock ([`RunOptions::mode_for_seed`] by
    /// default).
    pub mode: AcquireMode,
    /// A deliberately broken behaviour, for the checker-must-fail test; `None` checks the
    /// real adapter.
    pub sabotage: Option<Sabotage>,
    /// Which faults the nemesis injects.
    pub kind: RunKind,
    /// A sharded run: the replicas run a [`ShardedElector`](plexsphere_leader::sharded) over
    /// this space instead of the single election (mode and fencing then do not apply); see
    /// [`RunOptions::sharded`].
    pub sharding: Option<Sharding>,
    /// How the single election's replicas hold leadership; lease runs
    /// ([`RunOptions::lease`]) always poll.
    pub mechanism: Mechanism,
    /// A fitness run (`--unfit`, single election): every replica probes its fitness
    /// ([`Config::fitness_probe`](plexsphere_leader::Config::fitness_probe)), and the server
    /// refuses the probe of one of them ([`RunOptions::unfit_replica`]), which must never
    /// lead. Off by default, so that every seed runs what it ran before.
    pub unfit: bool,
}

/// The fitness probe of a fit replica in a fitness run.
pub(crate) const FIT_PROBE: &str = "SELECT 1";

/// The fitness probe of the unfit replica: a setting no session has, which the server refuses
/// with 42704 (`unrecognized configuration parameter`), as PostgreSQL does.
pub(crate) const UNFIT_PROBE: &str = "SELECT current_setting('plexsphere.unfit')";

impl RunOptions {
    /// Within this many consecutive seeds every (kind, acquire mode, fencing) cell runs once:
    /// 4·[`RunKind::COUNT`] (see [What a seed runs](RunOptions#what-a-seed-runs)).
    pub const CYCLE: u64 = VARIANTS * RunKind::COUNT as u64;

    /// Within this many consecutive lease seeds every (kind, fencing) cell runs once:
    /// 2·[`RunKind::COUNT`] (see [`RunOptions::lease`]).
    pub const LEASE_CYCLE: u64 = LEASE_VARIANTS * RunKind::COUNT as u64;

    /// Seed `seed` with three replicas, the default timing, no sabotage, and the seed's kind
    /// of faults, acquire mode and fencing (see [What a seed runs](RunOptions#what-a-seed-runs)).
    pub fn new(seed: u64) -> Self {
        Self {
            seed,
            replicas: 3,
            params: Params::default(),
            fencing: Self::fencing_for_seed(seed),
            mode: Self::mode_for_seed(seed),
            sabotage: None,
            kind: RunKind::for_seed(seed),
            sharding: None,
            mechanism: Mechanism::Advisory,
            unfit: false,
        }
    }

    /// In a fitness run ([`RunOptions::unfit`]), the replica whose probe the server refuses:
    /// the seed's `seed % replicas`; `None` otherwise.
    pub fn unfit_replica(&self) -> Option<usize> {
        let replicas = self.replicas.max(1) as u64;
        self.unfit
            .then(|| usize::try_from(self.seed % replicas).unwrap_or(0))
    }

    /// Replica `replica`'s fitness probe: none outside a fitness run.
    pub fn fitness_probe(&self, replica: usize) -> Option<&'static str> {
        match self.unfit_replica() {
            Some(unfit) if unfit == replica => Some(UNFIT_PROBE),
            Some(_) => Some(FIT_PROBE),
            None => None,
        }
    }

    /// Lease seed `seed` (a seed space of its own) with three replicas, the default timing, no
    /// sabotage, polling (a lease has no server-side queue), the seed's kind of faults
    /// ([`RunKind::for_seed`], `seed % K`) and whether the service's work is fenced writes: in
    /// variant 1, `(seed / K) % 2 == 1` ([`RunOptions::lease_fencing_for_seed`]). Every term has
    /// the lease's epoch either way. Any [`RunOptions::LEASE_CYCLE`] consecutive seeds run
    /// every (kind, fencing) cell once.
    pub fn lease(seed: u64) -> Self {
        Self {
            fencing: Self::lease_fencing_for_seed(seed),
            mode: AcquireMode::Poll,
            mechanism: Mechanism::Lease,
            ..Self::new(seed)
        }
    }

    /// Whether lease seed `seed`'s service does fenced writes: `(seed / K) % 2 == 1`.
    pub const fn lease_fencing_for_seed(seed: u64) -> bool {
        (seed / RunKind::COUNT as u64) % LEASE_VARIANTS == 1
    }

    /// The rate of replica `replica`'s clock: the simulation's own in advisory and sharded
    /// runs; in lease runs one replica 5 % slow, one 5 % fast and any other between
    /// ([`ClockRate::of_lease_replica`]), within the lease's 10 % margin; every replica 15 %
    /// slow with the sabotage [`DriverSabotage::SlowClock`].
    pub fn clock_rate(&self, replica: usize) -> ClockRate {
        match (self.mechanism, self.sabotage) {
            (_, Some(Sabotage::Driver(DriverSabotage::SlowClock))) => ClockRate::OUTSIDE_MARGIN,
            (Mechanism::Lease, _) if self.sharding.is_none() => {
                ClockRate::of_lease_replica(self.seed, replica, self.replicas)
            }
            _ => ClockRate::EXACT,
        }
    }

    /// The options seed `seed` runs with by default under `mechanism`.
    pub fn for_mechanism(seed: u64, mechanism: Mechanism) -> Self {
        match mechanism {
            Mechanism::Advisory => Self::new(seed),
            Mechanism::Lease => Self::lease(seed),
        }
    }

    /// Sharded seed `seed` (a seed space of its own) with three replicas, the default timing,
    /// no sabotage, and the seed's kind of faults and number of shards (see
    /// [What a sharded seed runs](Sharding#what-a-sharded-seed-runs)).
    pub fn sharded(seed: u64) -> Self {
        Self {
            seed,
            replicas: 3,
            params: Params::default(),
            fencing: false,
            mode: AcquireMode::Poll,
            sabotage: None,
            kind: RunKind::for_sharded_seed(seed),
            sharding: Some(Sharding::for_seed(seed)),
            mechanism: Mechanism::Advisory,
            unfit: false,
        }
    }

    /// Whether seed `seed` fences by default: in variants 2 and 3, `(seed / K) % 4 >= 2`
    /// (seeds 28–55 of every 56; see [What a seed runs](RunOptions#what-a-seed-runs)). Half
    /// the seeds, as many of them polling as queued, and every kind meets each of the four
    /// (mode, fencing) combinations once in any [`RunOptions::CYCLE`] consecutive seeds.
    pub const fn fencing_for_seed(seed: u64) -> bool {
        variant(seed, RunKind::COUNT as u64) >= 2
    }

    /// The acquire mode of seed `seed`: [`AcquireMode::Queue`] in variants 1 and 3,
    /// `(seed / K) % 2 == 1` (seeds 14–27 and 42–55 of every 56), else the spec's
    /// [`AcquireMode::Poll`] (see [What a seed runs](RunOptions#what-a-seed-runs)).
    pub const fn mode_for_seed(seed: u64) -> AcquireMode {
        if variant(seed, RunKind::COUNT as u64) % 2 == 1 {
            AcquireMode::Queue
        } else {
            AcquireMode::Poll
        }
    }

    /// The command that replays this run with a readable trace.
    pub fn replay_command(&self) -> String {
        let sharded = if self.sharding.is_some() {
            " --sharded"
        } else {
            ""
        };
        let mut command = format!(
            "cargo run --release -p plexsphere-leader-sim --{sharded} --seed {}",
            self.seed
        );
        if self.replicas != 3 {
            command.push_str(&format!(" --replicas {}", self.replicas));
        }
        if let Some(sharding) = self.sharding {
            if sharding != Sharding::for_seed(self.seed) {
                command.push_str(&format!(" --shards {}", sharding.shards));
            }
            if let Some(sabotage) = self.sabotage {
                command.push_str(&format!(" --sabotage {sabotage}"));
            }
            return command;
        }
        let seeded = Self::for_mechanism(self.seed, self.mechanism);
        if self.mechanism != Mechanism::Advisory {
            command.push_str(&format!(" --mechanism {}", self.mechanism));
        }
        if self.mode != seeded.mode {
            command.push_str(&format!(" --mode {}", mode_name(self.mode)));
        }
        if self.fencing != seeded.fencing {
            let on = if self.fencing { "on" } else { "off" };
            command.push_str(&format!(" --fencing {on}"));
        }
        if self.unfit {
            command.push_str(" --unfit");
        }
        if self.kind == RunKind::Only(FaultKind::Pause) {
            command.push_str(" --pause");
        }
        if let Some(sabotage) = self.sabotage {
            command.push_str(&format!(" --sabotage {sabotage}"));
        }
        command
    }

    /// The run's name in reports: its fault kind, its acquire mode, and whether it fences
    /// (`terminate, queue, fencing`).
    pub fn describe(&self) -> String {
        if let Some(sharding) = self.sharding {
            return format!(
                "{}, {} shards, {} replicas",
                self.kind, sharding.shards, self.replicas
            );
        }
        let mode = match self.mechanism {
            Mechanism::Advisory => mode_name(self.mode),
            Mechanism::Lease => "lease",
        };
        let unfit = match self.unfit_replica() {
            Some(r) => format!(", r{r} unfit"),
            None => String::new(),
        };
        if self.fencing {
            format!("{}, {mode}, fencing{unfit}", self.kind)
        } else {
            format!("{}, {mode}{unfit}", self.kind)
        }
    }
}

/// How many (acquire mode, fencing) variants a kind runs in.
const VARIANTS: u64 = 4;

/// How many fencing variants a kind runs in on lease runs.
const LEASE_VARIANTS: u64 = 2;

/// The (mode, fencing) variant of seed `seed` with `kinds` run kinds: the kind is
/// `seed % kinds`, the variant the next digit, `(seed / kinds) % 4`.
const fn variant(seed: u64, kinds: u64) -> u64 {
    (seed / kinds) % VARIANTS
}

/// The CLI's name of an acquire mode (`--mode poll|queue`).
pub fn mode_name(mode: AcquireMode) -> &'static str {
    match mode {
        AcquireMode::Queue => "queue",
        _ => "poll",
    }
}

/// The acquire mode the CLI names `name`.
pub fn mode_from_name(name: &str) -> Option<AcquireMode> {
    match name {
        "poll" => Some(AcquireMode::Poll),
        "queue" => Some(AcquireMode::Queue),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    /// Every (kind, variant) pair of `kinds` kinds in the window of `CYCLE` seeds from `start`.
    fn cells(start: u64, kinds: u64) -> BTreeSet<(u64, u64)> {
        (start..start + VARIANTS * kinds)
            .map(|seed| (seed % kinds, variant(seed, kinds)))
            .collect()
    }

    #[test]
    fn any_window_of_four_k_seeds_runs_every_kind_in_every_variant_whatever_k() {
        for kinds in 1..=20 {
            for start in (0..3 * VARIANTS * kinds).chain([u64::MAX / 2, 1_000_003]) {
                assert_eq!(
                    cells(start, kinds).len() as u64,
                    VARIANTS * kinds,
                    "K = {kinds}, seeds from {start}"
                );
            }
        }
    }

    #[test]
    fn any_cycle_of_seeds_runs_every_kind_mode_and_fencing_cell_once() {
        let every: BTreeSet<(RunKind, bool, bool)> = RunKind::all()
            .into_iter()
            .flat_map(|kind| {
                [(false, false), (true, false), (false, true), (true, true)]
                    .map(|(queue, fencing)| (kind, queue, fencing))
            })
            .collect();
        assert_eq!(every.len() as u64, RunOptions::CYCLE);
        for start in (0..2 * RunOptions::CYCLE).chain([20_000, 99_999]) {
            let seen: BTreeSet<(RunKind, bool, bool)> = (start..start + RunOptions::CYCLE)
                .map(RunOptions::new)
                .map(|o| (o.kind, o.mode == AcquireMode::Queue, o.fencing))
                .collect();
            assert_eq!(seen, every, "seeds from {start}");
        }
    }

    #[test]
    fn the_first_cycle_polls_then_queues_then_fences_both_ways() {
        let variants: Vec<(&str, bool)> = [0, 13, 14, 27, 28, 41, 42, 55, 56]
            .map(|seed| {
                let o = RunOptions::new(seed);
                (mode_name(o.mode), o.fencing)
            })
            .to_vec();
        assert_eq!(
            variants,
            [
                ("poll", false),
                ("poll", false),
                ("queue", false),
                ("queue", false),
                ("poll", true),
                ("poll", true),
                ("queue", true),
                ("queue", true),
                ("poll", false),
            ]
        );
    }

    #[test]
    fn only_lease_runs_drift_and_the_slow_clock_sabotage_leaves_the_margin() {
        let rates = |options: RunOptions| (0..3).map(|r| options.clock_rate(r)).collect::<Vec<_>>();
        assert_eq!(rates(RunOptions::new(4)), vec![ClockRate::EXACT; 3]);
        assert_eq!(rates(RunOptions::sharded(4)), vec![ClockRate::EXACT; 3]);
        let lease = RunOptions::lease(4);
        assert!(rates(lease).contains(&ClockRate::SLOWEST_WITHIN_MARGIN));
        assert!(rates(lease).contains(&ClockRate::FASTEST_WITHIN_MARGIN));
        let sabotaged = RunOptions {
            sabotage: Some(Sabotage::Driver(DriverSabotage::SlowClock)),
            ..lease
        };
        assert_eq!(rates(sabotaged), vec![ClockRate::OUTSIDE_MARGIN; 3]);
    }

    #[test]
    fn any_lease_cycle_runs_every_kind_with_and_without_fenced_writes_polling() {
        for start in (0..2 * RunOptions::LEASE_CYCLE).chain([20_000, 99_999]) {
            let seen: BTreeSet<(RunKind, bool)> = (start..start + RunOptions::LEASE_CYCLE)
                .map(RunOptions::lease)
                .inspect(|o| assert_eq!(o.mode, AcquireMode::Poll))
                .map(|o| (o.kind, o.fencing))
                .collect();
            assert_eq!(
                seen.len() as u64,
                RunOptions::LEASE_CYCLE,
                "seeds from {start}"
            );
        }
    }

    #[test]
    fn a_forced_mode_or_fencing_is_in_the_replay_command() {
        let options = RunOptions {
            mode: AcquireMode::Queue,
            fencing: true,
            ..RunOptions::new(3)
        };
        assert_eq!(options.describe(), "crash, queue, fencing");
        assert_eq!(
            options.replay_command(),
            "cargo run --release -p plexsphere-leader-sim -- --seed 3 --mode queue --fencing on"
        );
        assert_eq!(
            RunOptions::new(45).replay_command(),
            "cargo run --release -p plexsphere-leader-sim -- --seed 45"
        );
        assert_eq!(mode_from_name("queue"), Some(AcquireMode::Queue));
        let lease = RunOptions::lease(17);
        assert_eq!(
            (lease.describe(), lease.replay_command()),
            (
                "crash, lease, fencing".to_owned(),
                "cargo run --release -p plexsphere-leader-sim -- --seed 17 --mechanism lease"
                    .to_owned()
            )
        );
        assert_eq!(
            RunOptions {
                fencing: false,
                ..lease
            }
            .replay_command(),
            "cargo run --release -p plexsphere-leader-sim -- --seed 17 --mechanism lease --fencing off"
        );
        assert_eq!(Mechanism::from_name("lease"), Some(Mechanism::Lease));
        assert_eq!(Mechanism::from_name("nope"), None);
        assert_eq!(mode_from_name("nope"), None);
    }
}
