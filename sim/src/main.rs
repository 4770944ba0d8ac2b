//! `plexsphere-leader-sim`: runs seeds of the deterministic simulation and prints, per fault
//! kind, the runs, the largest measurements against their bounds and the violations; then the
//! runs and violations per (kind, acquire mode, fencing) cell, an empty one reading `EMPTY`;
//! ending with `seeds: N, violations: V`. Exits non-zero on any violation, and when a run of
//! at least one cycle of seeds (`RunOptions::CYCLE`, 56) with neither `--mode` nor
//! `--fencing` left a cell empty.
//!
//! ```text
//! plexsphere-leader-sim --seeds N [--seed S] [--replicas K] [--jobs J] [--mode poll|queue]
//!     [--fencing on|off] [--sabotage NAME] [--mechanism advisory|lease] [--unfit] [--pause]
//!     [--rollout]
//! plexsphere-leader-sim --sharded --seeds N [--seed S] [--replicas R] [--shards K] [--jobs J]
//!     [--sabotage NAME] [--mechanism advisory|lease] [--pause]
//! ```
//!
//! `--sharded` runs the sharded seeds instead (a seed space of their own, see `Sharding`):
//! every replica runs a `ShardedElector`, `--shards K` forces the number of shards (by
//! default each seed's: 8, 2 or 12) and `--replicas R` the number of replicas (3); the summary
//! is the sharded one (per kind and shard count). With `--mechanism lease` the space is held
//! by leases (`ShardConfig::lease`, TTL three intervals; a seed space of its own), and with
//! `--pause` as well its seeds are the pause kind's.
//!
//! `--mechanism lease` runs the lease seeds instead (a seed space of their own, see
//! `RunOptions::lease`): every replica holds a lease row (`Config::lease`, TTL three intervals)
//! and polls; the seed picks the fault kind and whether the service's work is fenced writes;
//! the summary is the lease one (its bounds, its cell table of `lease` and `lease+fencing`).
//!
//! `--unfit` runs fitness seeds: every replica probes its fitness (`Config::fitness_probe`),
//! the server refuses the probe of one (the seed's `seed % replicas`), which must never lead
//! (the `fitness` property); the seeds run what they run without it otherwise, with either
//! mechanism.
//!
//! `--pause` (with `--mechanism lease`) runs pause seeds (the kind `pause`, code 14, of no other
//! space): the nemesis pauses a replica's process (its software stops, its links hold) for one
//! to nine intervals; the checks hold the lease's bounds on what `is_leader()` answers.
//!
//! `--rollout` runs rollout seeds (the kind `rollout`, code 15, and `mixed` with the rollout
//! going on; seed spaces of their own, for either mechanism): every replica is ranked
//! (`Config::version`) at an old version and the nemesis restarts them one by one (a graceful
//! stop, a start) at a newer one; the checks add `preference` and `one-move`.
//!
//! A seed names its run kind: seed = code · 10,000 + n, with the kind's fixed code
//! (`RunKind::ALL`) and its run number n, which picks the variant.
//! `--seeds N` runs the first N seeds of the selected space, round-robin over its kinds
//! (`Space::seed_at`): `--seeds 56` runs each of the 14 advisory kinds in its four variants.
//! `--seed S` starts there (default: the space's first seed); alone it runs seed S and prints
//! its trace. `--jobs J` runs seeds on J threads. `--mode` and `--fencing` force the acquire
//! mode and fencing for every seed (by default each seed's, see `RunOptions`).
//! `--sabotage` switches on a deliberately broken behaviour (`Sabotage::ALL`: of the replica's
//! software, or fence-without-row-lock of the simulated server), to see the checker fail.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::Instant;

use plexsphere_leader::config::AcquireMode;
use plexsphere_leader_sim::{
    DriverSabotage, Mechanism, Params, Report, RunOptions, RunOutcome, SEED_STRIDE, Sabotage,
    Sharding, Space, mode_from_name, run,
};

struct Args {
    first: u64,
    seeds: u64,
    replicas: usize,
    jobs: usize,
    /// `--fencing`: fencing forced on or off; `None` follows the seed.
    fencing: Option<bool>,
    /// `--mode`: the acquire mode forced; `None` follows the seed.
    mode: Option<AcquireMode>,
    sabotage: Option<Sabotage>,
    trace: bool,
    /// `--sharded`: the seeds of the sharded runs.
    sharded: bool,
    /// `--shards`: the number of shards forced; `None` follows the seed.
    shards: Option<u32>,
    /// `--mechanism`: the advisory lock (default) or the lease.
    mechanism: Mechanism,
    /// `--unfit`: fitness runs.
    unfit: bool,
    /// `--pause`: pause runs.
    pause: bool,
    /// `--rollout`: rollout runs.
    rollout: bool,
}

impl Args {
    /// The seed space the flags select.
    fn space(&self) -> Space {
        match (self.sharded, self.pause) {
            (true, true) => Space::ShardedPause,
            (true, false) => Space::sharded(self.mechanism),
            (false, true) => Space::Pause,
            (false, false) if self.rollout => Space::rollout(self.mechanism),
            (false, false) => self.mechanism.space(),
        }
    }
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        first: 0,
        seeds: 1,
        replicas: 3,
        jobs: 1,
        fencing: None,
        mode: None,
        sabotage: None,
        trace: false,
        sharded: false,
        shards: None,
        mechanism: Mechanism::default(),
        unfit: false,
        pause: false,
        rollout: false,
    };
    let (mut seeds, mut seed) = (None, None);
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--seeds" => seeds = Some(number(&value()?)?),
            "--seed" => seed = Some(number(&value()?)?),
            "--replicas" => {
                args.replicas = usize::try_from(number(&value()?)?).map_err(|e| e.to_string())?
            }
            "--sharded" => args.sharded = true,
            "--unfit" => args.unfit = true,
            "--pause" => args.pause = true,
            "--rollout" => args.rollout = true,
            "--shards" => {
                args.shards = Some(u32::try_from(number(&value()?)?).map_err(|e| e.to_string())?)
            }
            "--jobs" => {
                args.jobs = usize::try_from(number(&value()?)?).map_err(|e| e.to_string())?
            }
            "--fencing" => {
                args.fencing = match value()?.as_str() {
                    "on" => Some(true),
                    "off" => Some(false),
                    other => return Err(format!("--fencing takes on or off, not {other}")),
                }
            }
            "--mode" => {
                let name = value()?;
                let mode = mode_from_name(&name);
                args.mode =
                    Some(mode.ok_or_else(|| format!("--mode takes poll or queue, not {name}"))?);
            }
            "--mechanism" => {
                let name = value()?;
                let mechanism = Mechanism::from_name(&name);
                args.mechanism = mechanism
                    .ok_or_else(|| format!("--mechanism takes advisory or lease, not {name}"))?;
            }
            "--sabotage" => {
                let name = value()?;
                let sabotage = Sabotage::from_name(&name);
                args.sabotage = Some(sabotage.ok_or_else(|| format!("unknown sabotage {name}"))?);
            }
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    args.seeds = seeds.unwrap_or(1);
    args.trace = seed.is_some() && seeds.is_none();
    if args.replicas == 0 || args.jobs == 0 {
        return Err("--replicas and --jobs must be at least 1".into());
    }
    let name = args.sabotage.map(|s| s.to_string()).unwrap_or_default();
    let sabotage = |test: fn(Sabotage) -> bool| args.sabotage.is_some_and(test);
    let (lease, mechanism) = (!args.mechanism.holds_session(), args.mechanism);
    let single = |flag: &str| format!("{flag}: for the single election, not --sharded");
    // The operator's sabotage applies to sharded runs too, and the pause runs' to sharded pause
    // runs.
    const OPERATOR: Sabotage = Sabotage::Driver(DriverSabotage::ResignWithoutHoldOff);
    let refusals = [
        (args.mode.is_some() || args.fencing.is_some()) && args.sharded,
        lease && args.mode == Some(AcquireMode::Queue),
        !lease && sabotage(Sabotage::is_lease_only),
        lease && sabotage(Sabotage::is_advisory_only),
        args.pause && !lease,
        !args.pause && sabotage(|s| Sabotage::PAUSE.contains(&s)),
        args.unfit && args.sharded,
        !args.unfit && sabotage(Sabotage::is_fitness_only),
        !args.sharded && args.shards.is_some(),
        args.shards == Some(0),
        !args.sharded && sabotage(Sabotage::is_sharded),
        args.rollout && (args.sharded || args.pause || args.unfit),
        !args.rollout && sabotage(Sabotage::is_rollout_only),
        args.sharded
            && sabotage(|s| !s.is_sharded() && s != OPERATOR && !Sabotage::PAUSE.contains(&s)),
    ];
    let texts = [
        single("--mode and --fencing"),
        format!("--mechanism {mechanism} always polls: it has no queue"),
        format!("--sabotage {name} is a sabotage of lease runs: add --mechanism lease"),
        format!("--sabotage {name} breaks the advisory lock's sessions: drop --mechanism lease"),
        "--pause runs lease seeds: add --mechanism lease (an advisory leader has no trust \
         window to end its belief in a pause)"
            .to_owned(),
        format!("--sabotage {name} is a sabotage of pause runs: add --pause"),
        single("--unfit"),
        format!("--sabotage {name} is a sabotage of fitness runs: add --unfit"),
        "--shards needs --sharded".to_owned(),
        "--shards must be at least 1".to_owned(),
        format!("--sabotage {name} is a sabotage of sharded runs: add --sharded"),
        "--rollout runs the single election's rollout seeds: drop --sharded, --pause and --unfit"
            .to_owned(),
        format!("--sabotage {name} is a sabotage of rollout runs: add --rollout"),
        format!("--sabotage {name} is a sabotage of the single election: drop --sharded"),
    ];
    if let Some((_, text)) = refusals
        .into_iter()
        .zip(texts)
        .find(|(refused, _)| *refused)
    {
        return Err(text);
    }
    let space = args.space();
    args.first = seed.unwrap_or_else(|| space.seed_at(0));
    let first = space.position(args.first).unwrap_or(u64::MAX);
    if first.saturating_add(args.seeds) > space.seed_count() {
        return Err(format!(
            "no {} seeds of {space:?} from seed {}: a seed is code · {SEED_STRIDE} + n, \
             the code a kind of {space:?} (RunKind::code), n below {SEED_STRIDE}",
            args.seeds, args.first
        ));
    }
    Ok(args)
}

fn number(text: &str) -> Result<u64, String> {
    text.parse().map_err(|_| format!("not a number: {text}"))
}

fn options(args: &Args, seed: u64) -> RunOptions {
    let seeded = RunOptions::in_space(args.space(), seed);
    if args.sharded {
        let sharding = seeded.sharding.map(|sharding| Sharding {
            shards: args.shards.unwrap_or(sharding.shards),
        });
        return RunOptions {
            replicas: args.replicas,
            sabotage: args.sabotage,
            sharding,
            ..seeded
        };
    }
    RunOptions {
        replicas: args.replicas,
        fencing: args.fencing.unwrap_or(seeded.fencing),
        mode: args.mode.unwrap_or(seeded.mode),
        sabotage: args.sabotage,
        unfit: args.unfit,
        ..seeded
    }
}

/// Runs one seed (twice, for determinism), turning a panic into a report.
fn run_seed(args: &Args, seed: u64) -> Result<RunOutcome, String> {
    let options = options(args, seed);
    catch_unwind(AssertUnwindSafe(|| run(&options))).map_err(|panic| {
        let what = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_default();
        format!(
            "seed {seed} ({}): the simulation panicked: {what}\n  replay: {}\n",
            options.describe(),
            options.replay_command()
        )
    })
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(args) => args,
        Err(error) => {
            eprintln!(
                "{error}\nusage: plexsphere-leader-sim --seeds N [--seed S] [--replicas K] [--jobs J] [--mode poll|queue] [--fencing on|off] [--sabotage NAME] [--mechanism advisory|lease] [--unfit] [--pause] [--rollout]\n       plexsphere-leader-sim --sharded --seeds N [--seed S] [--replicas R] [--shards K] [--jobs J] [--sabotage NAME] [--mechanism advisory|lease] [--pause]"
            );
            return ExitCode::from(2);
        }
    };
    let started = Instant::now();
    let space = args.space();
    let report = Report::new(space, Params::default(), args.replicas);
    // A fitness run's standbys probe before they try, a rollout run's survey.
    let report = if args.unfit || args.rollout {
        report.probing()
    } else {
        report
    };
    let mut report = report;
    // Positions in the space's order of seeds (`Space::seed_at`); `parse` checked both ends.
    let first = space.position(args.first).unwrap_or(0);
    let next = AtomicU64::new(first);
    let end = first + args.seeds;
    let (send, receive) = mpsc::channel();
    std::thread::scope(|scope| {
        for _ in 0..args.jobs {
            let (send, next, args) = (send.clone(), &next, &args);
            scope.spawn(move || {
                loop {
                    let position = next.fetch_add(1, Ordering::Relaxed);
                    if position >= end {
                        return;
                    }
                    let seed = space.seed_at(position);
                    if send.send((seed, run_seed(args, seed))).is_err() {
                        return;
                    }
                }
            });
        }
        drop(send);
        for (seed, result) in receive {
            match result {
                Ok(outcome) => {
                    if args.trace {
                        for line in &outcome.trace {
                            println!("{line}");
                        }
                        println!();
                    }
                    if !outcome.violations.is_empty() {
                        print!("{}", outcome.failure_report());
                    }
                    report.add(&outcome);
                }
                Err(panic) => {
                    print!("{panic}");
                    report.add_panic(&options(&args, seed));
                }
            }
        }
    });
    println!("wall time: {:.1} s", started.elapsed().as_secs_f64());
    let empty = report.empty_cells();
    // A whole cycle of seeds following the seeds' own modes and fencing (or shard counts) runs
    // every cell: an empty one means the derivation in RunOptions lost a combination.
    let cycle = space.cycle();
    let uncovered = args.seeds >= cycle
        && args.mode.is_none()
        && args.fencing.is_none()
        && args.shards.is_none()
        && !empty.is_empty();
    if uncovered {
        println!(
            "coverage: {} consecutive seeds left {} cell(s) empty, which a cycle of {cycle} fills",
            args.seeds,
            empty.len(),
        );
    }
    println!("{report}");
    if report.violations() == 0 && !uncovered {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
