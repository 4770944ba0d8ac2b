//! The real adapter under the simulation: seeds run clean and deterministically, and a failure
//! report names the seed and the command that replays it. The CI-sized run (500 seeds) is the
//! release binary, see .ci/test; these debug-build tests keep to a few seeds.
#![allow(missing_docs)] // test functions

use plexsphere_leader::config::AcquireMode;
use plexsphere_leader_sim::{
    FaultKind, Params, RunKind, RunOptions, RunOutcome, Sabotage, ShardSabotage, Sharding, Space,
    run, run_number,
};

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
    let options = RunOptions::new(130_001);
    assert_eq!(options.kind, RunKind::Mixed);
    assert_eq!(options.mode, AcquireMode::Queue);
    assert_clean(&options);
}

/// Operators resign leaders (with hold-offs) and make replicas ineligible: each handover is
/// prompt, and no replica takes the lock while it is held out.
#[test]
fn a_resign_seed_runs_clean() {
    let options = RunOptions::new(120_000);
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
    let options = RunOptions::new(100_002);
    assert_eq!(options.kind, RunKind::Only(FaultKind::Failover));
    assert!(options.fencing);
    assert_clean(&options);
}

/// Silent deaths leave orphaned lock sessions that only idle_session_timeout ends.
#[test]
fn a_silent_death_seed_with_two_replicas_runs_clean() {
    let options = RunOptions {
        replicas: 2,
        ..RunOptions::new(40_000)
    };
    assert_eq!(options.kind, RunKind::Only(FaultKind::SilentDeath));
    assert_clean(&options);
}

/// Terminations with fencing on and the queued acquire mode: the lock passes at once, while
/// the old leader's fenced transaction may still hold the fence row.
#[test]
fn a_terminate_seed_with_fencing_runs_clean_and_every_term_has_its_epoch() {
    let options = RunOptions::new(70_003);
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
        ..RunOptions::new(40_000)
    };
    assert_eq!(
        forced.replay_command(),
        "cargo run --release -p plexsphere-leader-sim -- --seed 40000 --fencing on --sabotage fence-without-row-lock"
    );
    let fencing: Vec<u64> = Space::Advisory
        .seeds(RunOptions::CYCLE)
        .filter(|&seed| RunOptions::fencing_for_seed(seed))
        .map(run_number)
        .collect();
    assert_eq!(fencing, [[2; 14], [3; 14]].concat());
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
    for seed in Space::Advisory.seeds(RunOptions::CYCLE * 2) {
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

/// A sharded seed runs clean and identically twice: every replica runs the real
/// `ShardedElector`, and each shard is held to the single election's bounds.
fn assert_sharded_clean(seed: u64, kind: FaultKind, shards: u32) -> RunOutcome {
    assert_clean_in(Space::Sharded, seed, kind, shards)
}

/// As [`assert_sharded_clean`], for a seed of the sharded space `space` (advisory locks, or
/// leases).
fn assert_clean_in(space: Space, seed: u64, kind: FaultKind, shards: u32) -> RunOutcome {
    let options = RunOptions::in_space(space, seed);
    assert_eq!(options.kind, RunKind::Only(kind), "seed {seed}");
    assert_eq!(
        options.sharding.map(|s| s.shards),
        Some(shards),
        "seed {seed}"
    );
    let outcome = run(&options);
    assert!(
        outcome.violations.is_empty(),
        "{}",
        outcome.failure_report()
    );
    let shards = outcome.measurements.shards;
    assert!(
        outcome.measurements.terms > 0,
        "no shard term in seed {seed}"
    );
    assert!(outcome.measurements.faults > 0, "no fault in seed {seed}");
    assert!(shards.balance.is_some(), "never balanced in seed {seed}");
    outcome
}

/// Silent deaths leave ghost members whose shards only idle_session_timeout frees (after
/// 4·I idle); the others take them within one interval after.
#[test]
fn a_sharded_silent_death_seed_runs_clean() {
    let outcome = assert_sharded_clean(40_000, FaultKind::SilentDeath, 8);
    let idle = outcome.measurements.orphan_idle.unwrap_or_default();
    let interval = Params::default().interval;
    assert!(idle >= 4 * interval - interval / 10, "{idle:?}");
}

/// Failovers with a silent old primary: every replica notices the loss of its shards within
/// 2·I and the space starts cold on the new primary.
#[test]
fn a_sharded_failover_seed_runs_clean() {
    let outcome = assert_sharded_clean(100_000, FaultKind::Failover, 8);
    assert!(outcome.measurements.cases.detections > 0);
}

/// Fewer shards than replicas: one replica owns none, terminations hand shards on at once.
#[test]
fn a_sharded_terminate_seed_with_two_shards_runs_clean() {
    assert_sharded_clean(70_001, FaultKind::Terminate, 2);
}

/// Graceful stops hand every shard over after its work: the stopped terms' work ends before
/// the unlock-all, and rebalancing handovers before their unlock.
#[test]
fn a_sharded_graceful_stop_seed_with_twelve_shards_runs_clean() {
    let outcome = assert_sharded_clean(60_002, FaultKind::GracefulStop, 12);
    let shards = outcome.measurements.shards;
    assert!(shards.stops > 0 && shards.handovers > 0, "{shards:?}");
    assert!(
        outcome
            .trace
            .iter()
            .any(|line| line.contains("ends: handed over")),
        "a shard was handed over"
    );
}

/// An operator resigns sharded replicas (every shard, with a hold-off) and makes them
/// ineligible: no shard term begins while a replica is held out, every resigned shard's work
/// ends before its unlock, and the others re-own the shards.
#[test]
fn a_sharded_resign_seed_runs_clean() {
    let outcome = assert_sharded_clean(120_000, FaultKind::Resign, 8);
    assert!(
        outcome
            .trace
            .iter()
            .any(|line| line.contains("ends: resigned")),
        "a shard term ended by a resign"
    );
}

/// The replay command of a sharded run names the mode and what the seed does not choose.
#[test]
fn a_sharded_failure_report_names_the_seed_and_the_replay_command() {
    let options = RunOptions::sharded(60_059);
    assert_eq!(
        options.replay_command(),
        "cargo run --release -p plexsphere-leader-sim -- --sharded --seed 60059"
    );
    let forced = RunOptions {
        replicas: 4,
        sharding: Some(Sharding { shards: 5 }),
        sabotage: Some(Sabotage::Shard(ShardSabotage::WorkOutlivesTerm)),
        ..RunOptions::sharded(70_000)
    };
    assert_eq!(
        forced.replay_command(),
        "cargo run --release -p plexsphere-leader-sim -- --sharded --seed 70000 --replicas 4 --shards 5 --sabotage shard-work-outlives-term"
    );
    assert_eq!(forced.describe(), "terminate, 5 shards, 4 replicas");
}

/// Finding (core, open): a graceful stop requested while a survey is in flight abandons the
/// stop. `ShardedElection::cancelled` moves every owned shard out of `owned` (into the stop's
/// awaited terms) while their locks are still held, so the survey answered during the drain
/// contradicts what the core believes; the core loses the session (`CloseSession`, `Finish`)
/// without awaiting the stopped terms' work and without `pg_advisory_unlock_all`. The socket's
/// close frees the locks while that work still runs: in seed 773 (at commit 11dd228) r0.2 is
/// asked to stop at 0.584 s, its session closes at 0.585 s, r1.2 takes r0.2's six shards at
/// 0.592 s, and its terms of shards 3, 8 and 9 overlap r0.2's stopped terms' work by up to
/// 12 ms. Ignored until the core is fixed (`sim/tests/core_findings.rs` has it on the pure
/// core); `cargo test -p plexsphere-leader-sim --test simulation -- --ignored` then runs it
/// clean.
#[test]
#[ignore = "core finding 1: a stop during a survey closes the session with the stopped terms' work running (docs/simulation.md)"]
fn a_stop_during_a_survey_waits_for_the_stopped_terms_work() {
    assert_sharded_clean(60_059, FaultKind::GracefulStop, 12);
}

/// Lease runs of the kinds that wedge no pooled connection (held links, crashes, silent deaths,
/// a graceful stop, terminations, server crashes, failovers, resigns), polling, with and
/// without fenced writes: clean and identical twice. No term outlives its lease and no two
/// overlap (the lease's bounds are zero); every term has the claim's epoch, rising.
#[test]
fn lease_seeds_of_the_kinds_that_lose_no_segment_run_clean() {
    for seed in [
        20_000, 30_000, 40_000, 60_000, 80_000, 100_000, 120_000, 70_001, 100_001,
    ] {
        let options = RunOptions::lease(seed);
        assert!(
            !matches!(
                options.kind,
                RunKind::Mixed | RunKind::Only(FaultKind::Partition | FaultKind::PartitionOneWay)
            ),
            "seed {seed}"
        );
        let outcome = assert_clean(&options);
        assert!(outcome.measurements.fence.epochs > 0, "seed {seed}");
    }
}

/// A finding of the simulation in the adapter's lease path, fixed: a claim or renewal that did
/// not answer within its deadline gave its pooled connection back to the pool with the statement
/// still in flight. A connection whose segment a partition dropped was wedged for good, the pool
/// handed it out again at every check, and after the faults healed no leader appeared (lease
/// seed 0: steady-state, "no leader 652ms after the faults stopped"). The adapter now closes a
/// lease statement's connection unless the statement answered (`connection/lease.rs`).
#[test]
fn a_partition_lease_seed_runs_clean() {
    let options = RunOptions::lease(0);
    assert_eq!(options.kind, RunKind::Only(FaultKind::Partition));
    assert_clean(&options);
}

/// A lease shard space under partitions: the members' statements fail or go unanswered, the
/// shards stay trusted until the last renewal's trust runs out, and no term outlives its
/// member's lease on the server (bounds zero). A finding of these runs in the core, fixed: a
/// failed release (a handover's, after a partition began) was issued again at once, so the
/// driver asked an unreachable server in a loop without pause, about 16,000 connection
/// attempts in 100 ms, until turmoil ran out of ports (`Host 'r1' ports exhausted`, in this
/// seed before the fix); the release now waits for the next check.
#[test]
fn a_partition_seed_of_a_lease_shard_space_runs_clean() {
    let outcome = assert_clean_in(Space::ShardedLease, 4, FaultKind::Partition, 2);
    assert!(
        outcome.measurements.fence.epochs > 0,
        "every take brings its epochs"
    );
}

/// Crashes (a member's row outlives its host until its lease expires, then a take reaps it),
/// failovers (the rows follow the primary to its synchronous standby) and resigns (a leave,
/// and a replica that joins again as another member, its old row a ghost until it expires) of
/// a lease shard space run clean.
#[test]
fn lease_shard_space_seeds_of_crashes_failovers_and_resigns_run_clean() {
    assert_clean_in(Space::ShardedLease, 30_000, FaultKind::Crash, 8);
    assert_clean_in(Space::ShardedLease, 100_002, FaultKind::Failover, 12);
    assert_clean_in(Space::ShardedLease, 120_024, FaultKind::Resign, 8);
}

/// A lease shard space's member paused past its trust stops believing: what `ownership()`
/// answers, sampled on its host, drops every shard when the trust of its last renewal runs
/// out, though the published ownership still shows them until its driver runs (the adapter's
/// fix of this finding: before it, every pause seed broke detection and overlap, seed 140000
/// with a shard term 172 ms past its member's lease).
#[test]
fn a_pause_seed_of_a_lease_shard_space_runs_clean() {
    assert_clean_in(Space::ShardedPause, 140_000, FaultKind::Pause, 8);
}

/// A rolling deploy of ranked replicas, of either mechanism, runs clean and identically twice:
/// every replica is upgraded, and the leadership moves once by a yield (the rollout kind
/// alone, no other fault).
#[test]
fn a_rollout_seed_runs_clean_and_moves_leadership_once_on_both_mechanisms() {
    for space in [Space::Rollout, Space::RolloutLease] {
        let options = RunOptions::in_space(space, RunKind::Only(FaultKind::Rollout).seed(0));
        assert_eq!(options.space(), space);
        let outcome = assert_clean(&options);
        let upgrades = outcome
            .trace
            .iter()
            .filter(|line| line.contains("rollout: upgrades to"))
            .count();
        assert_eq!(upgrades, options.replicas, "{space:?}");
        let yields = outcome
            .trace
            .iter()
            .filter(|line| line.contains("ends: yielded to a better candidate"))
            .count();
        assert!(yields <= 1, "{space:?}: {yields} yields");
    }
}
