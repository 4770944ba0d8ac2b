//! `plexsphere-leader-sim`: runs seeds of the deterministic simulation and prints, per fault
//! kind, the runs, the largest measurements against their bounds and the violations, ending
//! with `seeds: N, violations: V`. Exits non-zero on any violation.
//!
//! ```text
//! plexsphere-leader-sim --seeds N [--seed S] [--replicas K] [--jobs J] [--fencing on|off]
//!     [--sabotage NAME]
//! ```
//!
//! `--seed S` starts at seed S (default 0); given without `--seeds` it runs that one seed and
//! prints its trace. `--jobs J` runs seeds on J threads. `--fencing` forces fencing on or off
//! for every seed (by default seeds with `(seed / 2) % 2 == 1` fence). `--sabotage` switches
//! on a deliberately broken behaviour (never-ping, return-granted-to-pool,
//! skip-idle-session-timeout, keep-term-on-failed-ping of the driver; fence-without-row-lock
//! of the simulated server), to see the checker fail.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::Instant;

use plexsphere_leader_sim::{Params, Report, RunKind, RunOptions, RunOutcome, Sabotage, run};

struct Args {
    first: u64,
    seeds: u64,
    replicas: usize,
    jobs: usize,
    /// `--fencing`: fencing forced on or off; `None` follows the seed.
    fencing: Option<bool>,
    sabotage: Option<Sabotage>,
    trace: bool,
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        first: 0,
        seeds: 1,
        replicas: 3,
        jobs: 1,
        fencing: None,
        sabotage: None,
        trace: false,
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
            "--sabotage" => {
                let name = value()?;
                let sabotage = Sabotage::from_name(&name);
                args.sabotage = Some(sabotage.ok_or_else(|| format!("unknown sabotage {name}"))?);
            }
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    args.first = seed.unwrap_or(0);
    args.seeds = seeds.unwrap_or(1);
    args.trace = seed.is_some() && seeds.is_none();
    if args.replicas == 0 || args.jobs == 0 {
        return Err("--replicas and --jobs must be at least 1".into());
    }
    Ok(args)
}

fn number(text: &str) -> Result<u64, String> {
    text.parse().map_err(|_| format!("not a number: {text}"))
}

fn options(args: &Args, seed: u64) -> RunOptions {
    RunOptions {
        replicas: args.replicas,
        fencing: args.fencing.unwrap_or(RunOptions::fencing_for_seed(seed)),
        sabotage: args.sabotage,
        ..RunOptions::new(seed)
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
                "{error}\nusage: plexsphere-leader-sim --seeds N [--seed S] [--replicas K] [--jobs J] [--fencing on|off] [--sabotage NAME]"
            );
            return ExitCode::from(2);
        }
    };
    let started = Instant::now();
    let mut report = Report::new(Params::default());
    let next = AtomicU64::new(args.first);
    let end = args.first + args.seeds;
    let (send, receive) = mpsc::channel();
    std::thread::scope(|scope| {
        for _ in 0..args.jobs {
            let (send, next, args) = (send.clone(), &next, &args);
            scope.spawn(move || {
                loop {
                    let seed = next.fetch_add(1, Ordering::Relaxed);
                    if seed >= end || send.send((seed, run_seed(args, seed))).is_err() {
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
                    report.add_panic(RunKind::for_seed(seed));
                }
            }
        }
    });
    println!("wall time: {:.1} s", started.elapsed().as_secs_f64());
    println!("{report}");
    if report.violations() == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
