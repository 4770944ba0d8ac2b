//! One simulated run: the fault phase, the liveness phase and the final graceful stop, then
//! the checks; and the determinism check that runs a seed twice.

use std::time::Duration;

use plexsphere_leader::AcquireMode;
use plexsphere_leader_pgsim::{Event, LockId, LockKey, LockMode, LogEntry};

use crate::capture::Capture;
use crate::checker::{self, Evidence, Measurements, Property, ServerEvidence, Violation, secs};
use crate::nemesis::{Nemesis, RunKind};
use crate::params::Params;
use crate::record::{FenceOutcome, FencedWrite};
use crate::sabotage::Sabotage;
use crate::sharding::Sharding;
use crate::world::{SERVERS, World};

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
/// to [`FaultKind`](crate::FaultKind) meets every mode and fencing setting within a cycle.
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
}

impl RunOptions {
    /// Within this many consecutive seeds every (kind, acquire mode, fencing) cell runs once:
    /// 4·[`RunKind::COUNT`] (see [What a seed runs](RunOptions#what-a-seed-runs)).
    pub const CYCLE: u64 = VARIANTS * RunKind::COUNT as u64;

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
        if self.mode != Self::mode_for_seed(self.seed) {
            command.push_str(&format!(" --mode {}", mode_name(self.mode)));
        }
        if self.fencing != Self::fencing_for_seed(self.seed) {
            let on = if self.fencing { "on" } else { "off" };
            command.push_str(&format!(" --fencing {on}"));
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
        let mode = mode_name(self.mode);
        if self.fencing {
            format!("{}, {mode}, fencing", self.kind)
        } else {
            format!("{}, {mode}", self.kind)
        }
    }
}

/// The second half of the member lock `(class, -1)` of a shard space.
const MEMBER: i32 = plexsphere_leader::shard_sql::MEMBER_OBJ_ID;

/// How many (acquire mode, fencing) variants a kind runs in.
const VARIANTS: u64 = 4;

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

/// What a run produced.
#[derive(Debug, Clone)]
pub struct RunOutcome {
    /// The options it ran with.
    pub options: RunOptions,
    /// The largest values it measured.
    pub measurements: Measurements,
    /// Every property it broke, in time order (empty for a clean run).
    pub violations: Vec<Violation>,
    /// The readable trace: faults, incarnations, terms, the adapter's log events and the
    /// servers' ground truth, in simulated time.
    pub trace: Vec<String>,
}

impl RunOutcome {
    /// The report of a failed run: the seed, its violations and the replay command.
    pub fn failure_report(&self) -> String {
        let mut out = format!(
            "seed {} ({}): {} violation(s)\n",
            self.options.seed,
            self.options.describe(),
            self.violations.len()
        );
        for violation in &self.violations {
            out.push_str(&format!("  - {violation}\n"));
        }
        out.push_str(&format!("  replay: {}\n", self.options.replay_command()));
        out
    }
}

/// Runs `options` twice and compares the traces: a difference is a
/// [`Property::Determinism`] violation of the first run.
pub fn run(options: &RunOptions) -> RunOutcome {
    let mut first = run_once(options);
    let second = run_once(options);
    if first.trace != second.trace {
        let index = first
            .trace
            .iter()
            .zip(&second.trace)
            .position(|(a, b)| a != b)
            .unwrap_or(first.trace.len().min(second.trace.len()));
        let line = |trace: &[String]| trace.get(index).cloned().unwrap_or_else(|| "<end>".into());
        first.violations.push(Violation {
            at: Duration::ZERO,
            property: Property::Determinism,
            detail: format!(
                "the second run differs at trace line {index}: {:?} vs {:?}",
                line(&first.trace),
                line(&second.trace)
            ),
        });
    }
    first
}

/// Runs `options` once.
pub fn run_once(options: &RunOptions) -> RunOutcome {
    tracing::subscriber::with_default(Capture, || simulate(options))
}

fn simulate(options: &RunOptions) -> RunOutcome {
    let params = options.params;
    let mut world = World::new(options);
    let sharded = options.sharding.is_some();
    let mut nemesis = Nemesis::new(options.seed, options.kind, params.interval, sharded);
    let _completed = phases(&mut world, &mut nemesis, settle_bound(options));
    world.history.end = world.now();
    let work = world.recorder.borrow().work.clone();
    let fenced = world.recorder.borrow().fenced.clone();
    let shard_work = world.recorder.borrow().shard_work.clone();
    let servers = world
        .servers
        .iter()
        .map(|handle| ServerEvidence {
            log: handle.log(),
            queries: handle.queries(),
            sessions: handle.sessions(),
            locks: handle.locks(),
        })
        .collect::<Vec<_>>();
    let space = options
        .sharding
        .map(|sharding| (sharding, Sharding::class(options.seed)));
    let trace = trace(&world, &servers, &fenced, space.map(|(_, class)| class));
    let evidence = Evidence {
        params,
        replicas: options.replicas,
        fencing: options.fencing,
        history: &world.history,
        work: &work,
        fenced: &fenced,
        shard_work: &shard_work,
        servers,
    };
    let (measurements, violations) = match space {
        Some((sharding, class)) => checker::shards::check(&evidence, sharding, class),
        None => checker::check(&evidence),
    };
    RunOutcome {
        options: *options,
        measurements,
        violations,
        trace,
    }
}

/// How long after every fault healed and every replica is up the run must have settled: a
/// single leader ([`Params::liveness_bound`]), or a balanced shard space
/// ([`Params::balance_bound`]).
pub(crate) fn settle_bound(options: &RunOptions) -> Duration {
    let params = options.params;
    match options.sharding {
        Some(sharding) => {
            params.balance_bound(sharding.shards, options.replicas, sharding.moves(params))
        }
        None => params.liveness_bound(),
    }
}

/// Runs the three phases, the liveness phase lasting until `settle` plus four intervals after
/// every replica is up; `Err` when a host failed and the run was cut short.
fn phases(world: &mut World<'_>, nemesis: &mut Nemesis, settle: Duration) -> Result<(), ()> {
    let params = world.params;
    while world.now() < params.fault_phase {
        world.step()?;
        nemesis.tick(world);
    }
    let faults_stopped = world.now();
    world.history.faults_stopped = Some(faults_stopped);
    world
        .history
        .note(faults_stopped, "nemesis", "faults stop: liveness phase");
    loop {
        if world.history.all_up.is_none() && nemesis.heal_all(world) {
            let now = world.now();
            world.history.all_up = Some(now);
            world
                .history
                .note(now, "nemesis", "every fault healed, every replica up");
        }
        let until = world.history.all_up.map(|up| {
            (faults_stopped + params.liveness_phase).max(up + settle + 4 * params.interval)
        });
        if until.is_some_and(|until| world.now() >= until) {
            break;
        }
        if world.now() > faults_stopped + params.liveness_phase + params.stop_budget {
            let now = world.now();
            let what = "the faults could not be healed (a stopped replica never finished)";
            world.history.errors.push((now, what.to_owned()));
            break;
        }
        world.step()?;
    }
    stop_all(world)
}

/// Stops every replica gracefully and waits until their software finished and the servers
/// saw their sockets close.
fn stop_all(world: &mut World<'_>) -> Result<(), ()> {
    let params = world.params;
    let asked = world.now();
    world.history.stop_all = Some(asked);
    world.history.locks_at_stop = world.servers.iter().map(|s| s.locks()).collect();
    world
        .history
        .note(asked, "harness", "every replica is asked to stop");
    for r in 0..world.replicas.len() {
        world.stop(r);
    }
    let all_stopped = |world: &World<'_>| (0..world.replicas.len()).all(|r| world.has_finished(r));
    while !all_stopped(world) && world.now() < asked + params.stop_budget {
        world.step()?;
    }
    world.history.unstopped = (0..world.replicas.len())
        .filter(|&r| !world.has_finished(r))
        .collect();
    let drained = world.now() + 2 * params.round_trip() + 10 * params.tick;
    while world.now() < drained {
        world.step()?;
    }
    Ok(())
}

/// The readable trace: the harness's notes, the fenced writes as the service saw them (at
/// their end) and the servers' logs, merged in time order; in a sharded run (`class`) the
/// locks of the space are named (`shard 3`, `member lock`).
fn trace(
    world: &World<'_>,
    servers: &[ServerEvidence],
    fenced: &[FencedWrite],
    class: Option<i32>,
) -> Vec<String> {
    let mut lines: Vec<(Duration, usize, String, String)> = world
        .history
        .trace
        .iter()
        .enumerate()
        .map(|(order, (at, who, what))| (*at, order, who.clone(), what.clone()))
        .collect();
    let base = lines.len();
    for (order, write) in fenced.iter().enumerate() {
        let who = crate::replica::application_name(write.replica, write.incarnation);
        let at = write.ended.unwrap_or(world.history.end);
        lines.push((at, base + order, who, describe_fenced(write)));
    }
    let base = lines.len();
    for (index, server) in servers.iter().enumerate() {
        for (order, entry) in server.log.iter().enumerate() {
            lines.push((
                entry.at,
                base + index * 1_000_000 + order,
                SERVERS[index].to_owned(),
                describe(entry, class),
            ));
        }
    }
    lines.sort_by_key(|(at, order, _, _)| (*at, *order));
    lines
        .into_iter()
        .map(|(at, _, who, what)| format!("{:>9}  {who:<7} {what}", secs(at)))
        .collect()
}

fn describe_fenced(write: &FencedWrite) -> String {
    let epoch = write
        .epoch
        .map_or_else(|| "no epoch".to_owned(), |e| format!("epoch {e}"));
    let checked = write.checked.map_or_else(
        || "no check".to_owned(),
        |at| format!("checked {}", secs(at)),
    );
    let outcome = match &write.outcome {
        FenceOutcome::Unfinished => "unfinished".to_owned(),
        FenceOutcome::Accepted => "accepted, committed".to_owned(),
        FenceOutcome::Stale { current } => format!("stale (current {current}), rolled back"),
        FenceOutcome::Failed(why) => format!("failed: {why}"),
    };
    format!(
        "fenced write ({epoch}, begun {}, {checked}): {outcome}",
        secs(write.started)
    )
}

/// The name of `lock` in a trace: in a sharded run of `class`, `shard <s>` or `member lock`;
/// otherwise `lock` (the election's only lock).
fn lock_name(lock: &LockId, class: Option<i32>) -> String {
    match (lock.key, class) {
        (LockKey::Pair(held, MEMBER), Some(class)) if held == class => "member lock".to_owned(),
        (LockKey::Pair(held, shard), Some(class)) if held == class => format!("shard {shard}"),
        (key, Some(_)) => format!("lock {key:?}"),
        (_, None) => "lock".to_owned(),
    }
}

fn describe(entry: &LogEntry, class: Option<i32>) -> String {
    match &entry.event {
        Event::ServerStarted => "server started".to_owned(),
        Event::ServerCrashed => "server crashed".to_owned(),
        Event::SessionStarted {
            pid,
            application_name,
            ..
        } => format!("session {pid} opened by {application_name}"),
        Event::SessionEnded { pid, reason, .. } => format!("session {pid} ended: {reason:?}"),
        Event::LockGranted {
            pid,
            count,
            lock,
            mode,
        } => {
            let shared = if *mode == LockMode::Shared {
                " (shared)"
            } else {
                ""
            };
            format!(
                "{}{shared} granted to {pid} (count {count})",
                lock_name(lock, class)
            )
        }
        Event::GrantedAtLockTimeout { pid, .. } => {
            format!("wait of {pid} fails with 55P03 at its lock_timeout, though granted the lock")
        }
        Event::LockReleased {
            pid,
            remaining,
            reason,
            lock,
            ..
        } => format!(
            "{} released by {pid} (count {remaining} left): {reason:?}",
            lock_name(lock, class)
        ),
        Event::EpochAdvanced {
            pid, epoch, waited, ..
        } if waited.is_zero() => format!("epoch advanced to {epoch} by {pid}"),
        Event::EpochAdvanced {
            pid, epoch, waited, ..
        } => format!(
            "epoch advanced to {epoch} by {pid} (waited {} for fenced transactions)",
            checker::ms(*waited)
        ),
        Event::FenceChecked { pid, epoch, .. } => {
            format!("fence checked by {pid}: epoch {epoch} (row share-locked)")
        }
        Event::FencedCommit {
            pid,
            epoch,
            current,
            ..
        } => format!(
            "fenced transaction of {pid} (epoch {epoch}) committed; current epoch {}",
            current.map_or_else(|| "none".to_owned(), |c| c.to_string())
        ),
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
        assert_eq!(mode_from_name("nope"), None);
    }
}
