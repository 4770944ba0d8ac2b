//! The real adapter under the simulation: seeds run clean and deterministically, and a failure
//! report names the seed and the command that replays it. The CI-sized run (500 seeds) is the
//! release binary, see .ci/test; these debug-build tests keep to a few seeds.
#![allow(missing_docs)] // test functions

use plexsphere_leader::AcquireMode;
use plexsphere_leader_sim::{FaultKind, Params, RunKind, RunOptions, RunOutcome, Sabotage, run};

fn assert_clean(options: &RunOptions) -> RunOutcome {
    let outcome = run(options);
    assert!(
        outcome.violations.is_empty(),
        "{}",
        outcome.failure_report()
    );
    assert!(
        outcome.measurements.terms > 0,
        "no leader in seed {}",
        options.seed
    );
    assert!(
        outcome.measurements.faults > 0,
        "no fault in seed {}",
        options.seed
    );
    outcome
}

/// Every fault kind at once, queued, run twice with identical traces.
#[test]
fn a_mixed_seed_runs_clean_and_identically_twice() {
    let options = RunOptions::new(27);
    assert_eq!(options.kind, RunKind::Mixed);
    assert_eq!(options.mode, AcquireMode::Queue);
    assert_clean(&options);
}

/// Operators resign leaders (with hold-offs) and make replicas ineligible: each handover is
/// prompt, and no replica takes the lock while it is held out.
#[test]
fn a_resign_seed_runs_clean() {
    let options = RunOptions::new(12);
    assert_eq!(options.kind, RunKind::Only(FaultKind::Resign));
    let outcome = assert_clean(&options);
    assert!(
        outcome
            .trace
            .iter()
            .any(|line| line.contains("term") && line.contains("ends: resigned")),
        "a leader resigned"
    );
}

/// Failovers with a silent old primary push the detection delay to its bound; with fencing,
/// the new primary's epochs go on from the old one's.
#[test]
fn a_failover_seed_with_fencing_runs_clean() {
    let options = RunOptions::new(38);
    assert_eq!(options.kind, RunKind::Only(FaultKind::Failover));
    assert!(options.fencing);
    assert_clean(&options);
}

/// Silent deaths leave orphaned lock sessions that only idle_session_timeout ends.
#[test]
fn a_silent_death_seed_with_two_replicas_runs_clean() {
    let options = RunOptions {
        replicas: 2,
        ..RunOptions::new(4)
    };
    assert_eq!(options.kind, RunKind::Only(FaultKind::SilentDeath));
    assert_clean(&options);
}

/// Terminations with fencing on and the queued acquire mode: the lock passes at once, while
/// the old leader's fenced transaction may still hold the fence row.
#[test]
fn a_terminate_seed_with_fencing_runs_clean_and_every_term_has_its_epoch() {
    let options = RunOptions::new(49);
    assert_eq!(options.kind, RunKind::Only(FaultKind::Terminate));
    assert_eq!(options.mode, AcquireMode::Queue);
    assert!(options.fencing);
    let outcome = assert_clean(&options);
    let fence = outcome.measurements.fence;
    assert_eq!(fence.epochs, outcome.measurements.terms);
    assert!(
        fence.accepted > 0 && fence.commits >= fence.accepted,
        "{fence:?}"
    );
    assert!(outcome.measurements.advance_wait.is_some());
}

#[test]
fn a_failure_report_names_the_seed_and_the_replay_command() {
    let options = RunOptions {
        replicas: 5,
        params: Params::default(),
        ..RunOptions::new(4242)
    };
    assert_eq!(
        options.replay_command(),
        "cargo run --release -p plexsphere-leader-sim -- --seed 4242 --replicas 5"
    );
    let forced = RunOptions {
        fencing: true,
        sabotage: Some(Sabotage::FenceWithoutRowLock),
        ..RunOptions::new(4)
    };
    assert_eq!(
        forced.replay_command(),
        "cargo run --release -p plexsphere-leader-sim -- --seed 4 --fencing on --sabotage fence-without-row-lock"
    );
    let fencing: Vec<u64> = (0..RunOptions::CYCLE)
        .filter(|&seed| RunOptions::fencing_for_seed(seed))
        .collect();
    assert_eq!(fencing, (28..56).collect::<Vec<_>>());
}

/// Without the fenced transaction's idle bound (`Params::fenced_idle_timeout` zero), a leader
/// cut off inside a fenced transaction holds the fence row until its session ends, which in the
/// model is never. The next leader's epoch advance then waits for the row; it runs under a
/// `lock_timeout` of half an interval (`sql::advance_epoch_within`), so the server ends the wait
/// and the backend lets go of the advisory lock: the orphan bound holds, while no replica can
/// lead until the row is free (the steady state breaks, which the idle bound prevents).
/// Before the advance was bounded, its backend held the advisory lock for the rest of the run.
#[test]
fn a_held_fence_row_never_makes_a_waiting_advance_an_orphaned_lock() {
    let mut orphaned = Vec::new();
    let mut runs = 0;
    for seed in 0..RunOptions::CYCLE * 2 {
        let mut options = RunOptions::new(seed);
        let cut_off = matches!(
            options.kind,
            RunKind::Only(
                FaultKind::Partition | FaultKind::PartitionOneWay | FaultKind::SilentDeath
            )
        );
        if !(options.fencing && cut_off) {
            continue;
        }
        runs += 1;
        options.params.fenced_idle_timeout = std::time::Duration::ZERO;
        let outcome = run(&options);
        orphaned.extend(
            outcome
                .violations
                .iter()
                .filter(|v| v.property == plexsphere_leader_sim::Property::OrphanBound)
                .map(|v| format!("seed {seed}: {v}")),
        );
    }
    assert!(runs >= 6, "{runs} fencing runs of the cut-off kinds");
    assert!(orphaned.is_empty(), "{orphaned:#?}");
}
