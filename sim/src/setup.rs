//! The bottom of the harness: what a run is set up with, and nothing that runs it. The run
//! options and what a seed chooses ([`RunOptions`]), the timing and its bounds ([`Params`]),
//! the fault and run kinds ([`FaultKind`], [`RunKind`]), the shard space ([`Sharding`]), the
//! sabotages a run may switch on ([`Sabotage`]), the server hosts ([`SERVERS`]) and the
//! application names that tie server sessions to replica incarnations. It imports nothing
//! else of the harness, so every other module (the checkers above all, which are pure
//! functions of the recorded evidence) may import it without a cycle.

mod kinds;
mod mechanism;
mod params;
mod sabotage;
mod sharding;

pub use kinds::{FaultKind, RunKind, SEED_STRIDE, Space, run_number};
pub use mechanism::Mechanism;
pub use params::Params;
pub use sabotage::{DriverSabotage, Sabotage, ShardSabotage};
pub use sharding::Sharding;

use crate::clock::ClockRate;
use plexsphere_leader::config::AcquireMode;

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
/// Every run's configuration derives from its seed, here and nowhere else. A seed names its
/// run kind by the kind's fixed code, `seed = code · SEED_STRIDE + n` ([`RunKind::of_seed`],
/// [`SEED_STRIDE`] = 10,000; the codes are written beside the kinds, [`RunKind::code`]), and
/// its run number n ([`run_number`]) chooses the variant, `n % 4`, the acquire mode and
/// fencing ([`RunOptions::mode_for_seed`], [`RunOptions::fencing_for_seed`]):
///
/// | n % 4 | acquire mode | fencing |
/// |---|---|---|
/// | 0 | poll (the spec's) | off |
/// | 1 | queue | off |
/// | 2 | poll | on |
/// | 3 | queue | on |
///
/// A seed's meaning never changes when kinds are added (a new kind gets a new code). The
/// CLI's `--seeds N` runs the space's seeds in order ([`Space::seed_at`]): round-robin over
/// the kinds that apply ([`RunKind::applies_to`]), run number by run number, so any
/// [`RunOptions::CYCLE`] = 4·K consecutive ones (56 for K = 14 kinds) run every (kind, mode,
/// fencing) cell exactly once. The summary's cell table shows the coverage of every run of
/// many seeds. `--mode` and `--fencing` override the seed's choice.
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
    /// A rollout run (`--rollout`, [`Space::Rollout`] or [`Space::RolloutLease`]): every
    /// replica is ranked ([`Config::version`](plexsphere_leader::Config::version)), starting
    /// at [`OLD_VERSION`]; the nemesis restarts them one by one at [`NEW_VERSION`].
    pub rollout: bool,
}

/// The version a rollout run's replicas start with.
pub(crate) const OLD_VERSION: &str = "1.4.2";

/// The version a rollout restarts each replica with.
pub(crate) const NEW_VERSION: &str = "1.5.0";

/// The fitness probe of a fit replica in a fitness run.
pub(crate) const FIT_PROBE: &str = "SELECT 1";

/// The fitness probe of the unfit replica: a setting no session has, which the server refuses
/// with 42704 (`unrecognized configuration parameter`), as PostgreSQL does.
pub(crate) const UNFIT_PROBE: &str = "SELECT current_setting('plexsphere.unfit')";

impl RunOptions {
    /// Within this many consecutive seeds of [`Space::Advisory`] every (kind, acquire mode,
    /// fencing) cell runs once (see [What a seed runs](RunOptions#what-a-seed-runs)).
    pub const CYCLE: u64 = Space::Advisory.cycle();

    /// Within this many consecutive lease seeds every (kind, fencing) cell runs once (see
    /// [`RunOptions::lease`]).
    pub const LEASE_CYCLE: u64 = Space::Lease.cycle();

    /// Seed `seed` with three replicas, the default timing, no sabotage, and the seed's kind
    /// of faults, acquire mode and fencing (see [What a seed runs](RunOptions#what-a-seed-runs)).
    ///
    /// # Panics
    /// When no kind has the seed's code ([`RunKind::of_seed`]); the CLI refuses such a seed
    /// first ([`Space::position`]).
    pub fn new(seed: u64) -> Self {
        Self {
            seed,
            replicas: 3,
            params: Params::default(),
            fencing: Self::fencing_for_seed(seed),
            mode: Self::mode_for_seed(seed),
            sabotage: None,
            kind: kind_of(seed),
            sharding: None,
            mechanism: Mechanism::default(),
            unfit: false,
            rollout: false,
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

    /// Lease seed `seed` (of [`Space::Lease`] or [`Space::Pause`]) as [`RunOptions::new`], but
    /// polling (a lease has no queue) and with fenced writes for odd run numbers
    /// ([`RunOptions::lease_fencing_for_seed`]); every term has the lease's epoch either way.
    ///
    /// # Panics
    /// As [`RunOptions::new`].
    pub fn lease(seed: u64) -> Self {
        Self {
            fencing: Self::lease_fencing_for_seed(seed),
            mode: AcquireMode::Poll,
            mechanism: Mechanism::Lease,
            ..Self::new(seed)
        }
    }

    /// Whether lease seed `seed`'s service does fenced writes: an odd run number.
    pub const fn lease_fencing_for_seed(seed: u64) -> bool {
        run_number(seed) % Space::Lease.variants() == 1
    }

    /// The rate of replica `replica`'s clock: the simulation's own in advisory and sharded
    /// runs; in lease runs one replica 5 % slow, one 5 % fast and any other between
    /// ([`ClockRate::of_lease_replica`]), within the lease's 10 % margin; every replica 15 %
    /// slow with the sabotage [`DriverSabotage::SlowClock`].
    pub fn clock_rate(&self, replica: usize) -> ClockRate {
        match self.sabotage {
            Some(Sabotage::Driver(DriverSabotage::SlowClock)) => ClockRate::OUTSIDE_MARGIN,
            // `ShardConfig` has no clock seam: a sharded member runs on the simulation's.
            _ if !self.space().mechanism().holds_session() && self.sharding.is_none() => {
                ClockRate::of_lease_replica(self.seed, replica, self.replicas)
            }
            _ => ClockRate::EXACT,
        }
    }

    /// The options seed `seed` of `space` runs with by default.
    ///
    /// # Panics
    /// As [`RunOptions::new`].
    pub fn in_space(space: Space, seed: u64) -> Self {
        match space {
            Space::Advisory => Self::new(seed),
            Space::Lease | Space::Pause => Self::lease(seed),
            Space::Sharded => Self::sharded(seed),
            Space::ShardedLease | Space::ShardedPause => Self {
                mechanism: Mechanism::Lease,
                ..Self::sharded(seed)
            },
            Space::Rollout => Self {
                rollout: true,
                ..Self::new(seed)
            },
            Space::RolloutLease => Self {
                rollout: true,
                ..Self::lease(seed)
            },
        }
    }

    /// The seed space this run is of.
    pub fn space(&self) -> Space {
        match (self.sharding, self.kind) {
            (Some(_), RunKind::Only(FaultKind::Pause)) => Space::ShardedPause,
            (Some(_), _) => Space::sharded(self.mechanism),
            (None, RunKind::Only(FaultKind::Pause)) => Space::Pause,
            (None, _) if self.rollout => Space::rollout(self.mechanism),
            (None, _) => self.mechanism.space(),
        }
    }

    /// Sharded seed `seed` (a seed space of its own) with three replicas, the default timing,
    /// no sabotage, and the seed's kind of faults and number of shards (see
    /// [What a sharded seed runs](Sharding#what-a-sharded-seed-runs)).
    ///
    /// # Panics
    /// As [`RunOptions::new`].
    pub fn sharded(seed: u64) -> Self {
        Self {
            fencing: false,
            mode: AcquireMode::Poll,
            sharding: Some(Sharding::for_seed(seed)),
            ..Self::new(seed)
        }
    }

    /// Whether seed `seed` fences by default: in variants 2 and 3 (`n % 4 >= 2` of its run
    /// number n; see [What a seed runs](RunOptions#what-a-seed-runs)). Half the seeds, as many
    /// of them polling as queued, and every kind meets each of the four (mode, fencing)
    /// combinations once in any [`RunOptions::CYCLE`] consecutive seeds.
    pub const fn fencing_for_seed(seed: u64) -> bool {
        variant(seed) >= 2
    }

    /// The acquire mode of seed `seed`: [`AcquireMode::Queue`] in variants 1 and 3 (an odd
    /// run number), else the spec's [`AcquireMode::Poll`] (see
    /// [What a seed runs](RunOptions#what-a-seed-runs)).
    pub const fn mode_for_seed(seed: u64) -> AcquireMode {
        if variant(seed) % 2 == 1 {
            AcquireMode::Queue
        } else {
            AcquireMode::Poll
        }
    }

    /// The command that replays this run with a readable trace.
    pub fn replay_command(&self) -> String {
        let sharded = match self.sharding {
            None => String::new(),
            Some(_) => format!(" --sharded{}", self.mechanism.sharded_flag()),
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
            if self.space() == Space::ShardedPause {
                command.push_str(" --pause");
            }
            if let Some(sabotage) = self.sabotage {
                command.push_str(&format!(" --sabotage {sabotage}"));
            }
            return command;
        }
        let seeded = Self::in_space(self.space(), self.seed);
        if self.mechanism != Mechanism::default() {
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
        if self.space() == Space::Pause {
            command.push_str(" --pause");
        }
        if self.rollout {
            command.push_str(" --rollout");
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
            let lease = if self.mechanism.holds_session() {
                ""
            } else {
                ", lease"
            };
            return format!(
                "{}, {} shards, {} replicas{lease}",
                self.kind, sharding.shards, self.replicas
            );
        }
        let mode = if self.mechanism.holds_session() {
            mode_name(self.mode)
        } else {
            self.mechanism.name()
        };
        let unfit = match self.unfit_replica() {
            Some(r) => format!(", r{r} unfit"),
            None if self.rollout && self.kind == RunKind::Mixed => ", rollout".to_owned(),
            None => String::new(),
        };
        if self.fencing {
            format!("{}, {mode}, fencing{unfit}", self.kind)
        } else {
            format!("{}, {mode}{unfit}", self.kind)
        }
    }
}

/// The (mode, fencing) variant of advisory seed `seed`: its run number's `n % 4`.
const fn variant(seed: u64) -> u64 {
    run_number(seed) % Space::Advisory.variants()
}

/// The kind seed `seed` names.
///
/// # Panics
/// When no kind has the seed's code.
fn kind_of(seed: u64) -> RunKind {
    match RunKind::of_seed(seed) {
        Some(kind) => kind,
        None => panic!(
            "seed {seed} names no run kind (code {})",
            seed / SEED_STRIDE
        ),
    }
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

    #[test]
    fn any_cycle_of_seeds_runs_every_kind_mode_and_fencing_cell_once() {
        let every: BTreeSet<(RunKind, bool, bool)> = Space::Advisory
            .kinds()
            .into_iter()
            .flat_map(|kind| {
                [(false, false), (true, false), (false, true), (true, true)]
                    .map(|(queue, fencing)| (kind, queue, fencing))
            })
            .collect();
        assert_eq!(every.len() as u64, RunOptions::CYCLE);
        for start in (0..2 * RunOptions::CYCLE).chain([20_000, 99_999]) {
            let seen: BTreeSet<(RunKind, bool, bool)> = (start..start + RunOptions::CYCLE)
                .map(|position| RunOptions::new(Space::Advisory.seed_at(position)))
                .map(|o| (o.kind, o.mode == AcquireMode::Queue, o.fencing))
                .collect();
            assert_eq!(seen, every, "seeds from {start}");
        }
    }

    #[test]
    fn the_first_cycle_polls_then_queues_then_fences_both_ways() {
        let variants: Vec<(&str, bool)> = [0, 130_000, 1, 130_001, 2, 130_002, 3, 130_003, 4]
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
                .map(|position| RunOptions::lease(Space::Lease.seed_at(position)))
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
            ..RunOptions::new(30_000)
        };
        assert_eq!(options.describe(), "crash, queue, fencing");
        assert_eq!(
            options.replay_command(),
            "cargo run --release -p plexsphere-leader-sim -- --seed 30000 --mode queue --fencing on"
        );
        assert_eq!(
            RunOptions::new(70_003).replay_command(),
            "cargo run --release -p plexsphere-leader-sim -- --seed 70003"
        );
        assert_eq!(mode_from_name("queue"), Some(AcquireMode::Queue));
        let lease = RunOptions::lease(30_001);
        assert_eq!(
            (lease.describe(), lease.replay_command()),
            (
                "crash, lease, fencing".to_owned(),
                "cargo run --release -p plexsphere-leader-sim -- --seed 30001 --mechanism lease"
                    .to_owned()
            )
        );
        assert_eq!(
            RunOptions {
                fencing: false,
                ..lease
            }
            .replay_command(),
            "cargo run --release -p plexsphere-leader-sim -- --seed 30001 --mechanism lease --fencing off"
        );
        let sharded_lease = RunOptions::in_space(Space::ShardedLease, 30_000);
        assert_eq!(sharded_lease.space(), Space::ShardedLease);
        assert_eq!(
            (sharded_lease.describe(), sharded_lease.replay_command()),
            (
                "crash, 8 shards, 3 replicas, lease".to_owned(),
                "cargo run --release -p plexsphere-leader-sim -- --sharded --mechanism lease --seed 30000"
                    .to_owned()
            )
        );
        let paused = RunOptions::in_space(Space::ShardedPause, 140_001);
        assert_eq!(paused.space(), Space::ShardedPause);
        assert_eq!(
            paused.replay_command(),
            "cargo run --release -p plexsphere-leader-sim -- --sharded --mechanism lease --seed 140001 --pause"
        );
        assert_eq!(paused.clock_rate(0), ClockRate::EXACT, "no clock seam");
        assert_eq!(Mechanism::from_name("lease"), Some(Mechanism::Lease));
        assert_eq!(Mechanism::from_name("nope"), None);
        assert_eq!(mode_from_name("nope"), None);
    }
}
