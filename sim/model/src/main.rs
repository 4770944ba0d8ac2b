//! `cargo run --release -p plexsphere-leader-model`: the CI-size check of the six models, one
//! summary line per model last, exiting non-zero on a violation or an undiscovered "sometimes".

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use plexsphere_leader_core::AcquireMode;
use plexsphere_leader_model::check::{self, Outcome, Settings};
use plexsphere_leader_model::engine::{ElectionModel, Mode};
use plexsphere_leader_model::sabotage::Sabotage;
use plexsphere_leader_model::single::Mechanism;

/// Exhaustive, bounded model check of the core's election machines.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Steps from the initial state to check completely (breadth-first).
    #[arg(long)]
    depth: Option<usize>,
    /// Faults (and operator actions) one path may inject.
    #[arg(long)]
    faults: Option<u8>,
    /// Checker threads.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Give up a model after this many seconds.
    #[arg(long, default_value_t = 600)]
    timeout: u64,
    /// Only these models (advisory, lease, advisory-ranked, lease-ranked, sharded,
    /// sharded-lease); all by default.
    #[arg(long, value_delimiter = ',')]
    models: Vec<String>,
    /// Print the example path of each "sometimes" property too.
    #[arg(long)]
    examples: bool,
    /// How the advisory model's standbys ask for the lock: `queue` (CI) or `poll` (the
    /// spec's `pg_try_advisory_lock` every interval).
    #[arg(long, value_enum, default_value_t = Acquire::Queue)]
    acquire: Acquire,
    /// Plant a bug, to see a counterexample (exits non-zero): `stale-survey` in the sharded
    /// model, `take-ignores-live-members` (and `unbounded-trust`, `non-durable-lease-write`)
    /// in the sharded lease model, the others in the advisory and lease models.
    #[arg(long, value_enum)]
    sabotage: Option<Sabotage>,
}

/// The advisory model's acquire mode on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Acquire {
    /// Wait in the lock's queue.
    Queue,
    /// Try the lock every interval.
    Poll,
}

/// The CI size of each model: (depth, faults).
const ADVISORY: (usize, u8) = (20, 2);
const LEASE: (usize, u8) = (24, 2);
const ADVISORY_RANKED: (usize, u8) = (42, 1);
const LEASE_RANKED: (usize, u8) = (48, 1);
const SHARDED: (usize, u8) = (50, 1);
const SHARDED_LEASE: (usize, u8) = (80, 1);

fn main() -> ExitCode {
    let args = Args::parse();
    let wanted = |name: &str| args.models.is_empty() || args.models.iter().any(|m| m == name);
    let mut outcomes = Vec::new();
    for (name, mechanism, ranked, size) in [
        ("advisory", Mechanism::Advisory, false, ADVISORY),
        ("lease", Mechanism::Lease, false, LEASE),
        (
            "advisory-ranked",
            Mechanism::Advisory,
            true,
            ADVISORY_RANKED,
        ),
        ("lease-ranked", Mechanism::Lease, true, LEASE_RANKED),
    ] {
        let mut model = if ranked {
            ElectionModel::ranked(mechanism)
        } else {
            ElectionModel::single(mechanism)
        };
        if mechanism == Mechanism::Advisory && args.acquire == Acquire::Poll {
            model = model.with_acquire(AcquireMode::Poll);
        }
        if wanted(name) {
            outcomes.push(check(name, model, size, &args));
        }
    }
    if wanted("sharded") {
        outcomes.push(check("sharded", ElectionModel::sharded(), SHARDED, &args));
    }
    if wanted("sharded-lease") {
        let model = ElectionModel::sharded_lease();
        outcomes.push(check("sharded-lease", model, SHARDED_LEASE, &args));
    }
    for outcome in &outcomes {
        println!("{}", outcome.figures.line());
    }
    if outcomes.iter().all(|o| o.figures.passed()) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Checks `model` at its CI `size` (or the command line's), and reports the details.
fn check<M: Mode>(
    name: &'static str,
    model: ElectionModel<M>,
    size: (usize, u8),
    args: &Args,
) -> Outcome {
    let model = model
        .with_faults(args.faults.unwrap_or(size.1))
        .with_sabotage(args.sabotage.unwrap_or_default());
    let settings = Settings {
        threads: args.threads,
        timeout: Duration::from_secs(args.timeout),
        examples: args.examples,
        ..Settings::new(args.depth.unwrap_or(size.0))
    };
    let outcome = check::run(name, model, settings);
    report(&outcome);
    outcome
}

/// The details of one check, before the summary lines.
fn report(outcome: &Outcome) {
    let f = &outcome.figures;
    println!(
        "{}: {} states checked, {} generated, {} transitions ({:.0} per second), depth {}{}",
        f.name,
        f.states,
        f.generated,
        f.transitions,
        f.rate(),
        f.depth,
        if f.timed_out { ", timed out" } else { "" }
    );
    for (property, counter, lines) in &outcome.discoveries {
        let kind = if *counter {
            "COUNTEREXAMPLE"
        } else {
            "example"
        };
        println!("{}: {kind} of \"{property}\":", f.name);
        for line in lines {
            println!("  {line}");
        }
    }
    for property in &f.undiscovered {
        println!(
            "{}: \"sometimes\" property never discovered: {property}",
            f.name
        );
    }
}
