//! Property tests of sharded leadership: replicas join, crash, stop, lose their sessions and
//! their replies under random latencies; the world checks ownership at every step, and once the
//! faults stop, every case must balance within a bounded number of intervals with no lock
//! stranded.
//!
//! `PROPTEST_CASES` sets the number of cases (default 128); `SHARD_TRACE=1` prints every action
//! of the world with its virtual time.

mod shards_world;

use std::time::Duration;

use plexsphere_leader_core::{Control, OnOverdue};
use proptest::prelude::*;
use shards_world::{I, World};

const REPLICAS: usize = 4;

#[derive(Debug, Clone)]
enum Op {
    Advance(u16),
    Start(usize),
    Stop(usize),
    Crash(usize),
    Terminate(usize),
    LoseNextReply(usize),
    Latency(usize, u16),
}

fn op() -> impl Strategy<Value = Op> {
    let r = 0..REPLICAS;
    prop_oneof![
        8 => (1u16..300).prop_map(Op::Advance),
        3 => r.clone().prop_map(Op::Start),
        1 => r.clone().prop_map(Op::Stop),
        1 => r.clone().prop_map(Op::Crash),
        1 => r.clone().prop_map(Op::Terminate),
        1 => r.clone().prop_map(Op::LoseNextReply),
        1 => (r, 0u16..40).prop_map(|(r, ms)| Op::Latency(r, ms)),
    ]
}

/// Intervals a case may take to balance after its faults stop: a rebalance delay, the moves
/// (a quarter of the space per interval at most, so four rounds), each round's survey, drain
/// (up to 150 ms here) and take, and the idle timeout (four intervals) of a session whose close
/// never reached the server.
const SETTLE_INTERVALS: u32 = 24;

fn run_case(shards: u32, silent_closes: bool, fencing: bool, ops: &[Op]) {
    // Every ended term gets a work deadline: reported once each, never for an open term.
    let on_overdue = if silent_closes {
        OnOverdue::Abort
    } else {
        OnOverdue::Report
    };
    let mut world = World::new(REPLICAS, shards, |o| {
        o.fencing(fencing)
            .work_deadline(Duration::from_millis(150), on_overdue)
    });
    world.silent_closes = silent_closes;
    world.max_latency = Duration::from_millis(40);
    for op in ops {
        match *op {
            Op::Advance(ms) => world.advance(Duration::from_millis(ms.into())),
            Op::Start(r) => world.start(r),
            Op::Stop(r) => world.feed(r, Control::Cancelled),
            Op::Crash(r) => world.crash(r),
            Op::Terminate(r) => world.terminate(r),
            Op::LoseNextReply(r) => world.replicas[r].lose_next = true,
            Op::Latency(r, ms) => world.replicas[r].latency = Duration::from_millis(ms.into()),
        }
    }
    // The faults stop: every replica runs, no reply is lost.
    for r in 0..REPLICAS {
        world.replicas[r].lose_next = false;
        world.start(r);
    }
    // A statement whose reply was lost just before still times out, one interval later: the
    // faults have stopped once that has happened.
    world.advance(2 * I);
    let mut waited = 0;
    // Every replica runs, so the space has settled once each is a member (a replica that lost
    // its session as the faults stopped is out until it joins again).
    while !(world.settled() && world.stranded().is_empty() && world.loads().len() == REPLICAS) {
        assert!(
            waited < SETTLE_INTERVALS,
            "not settled {SETTLE_INTERVALS} intervals after the faults stopped: loads {:?}, \
             stranded {:?}",
            world.loads(),
            world.stranded()
        );
        world.advance(I);
        waited += 1;
        // A replica whose stop was still under way when the faults stopped runs again.
        for r in 0..REPLICAS {
            world.start(r);
        }
    }
    // Settled (every member at its cap) stays settled: nothing moves in a stable membership.
    let moves = world.moves;
    world.advance(5 * I);
    assert!(world.settled(), "balance did not hold: {:?}", world.loads());
    assert_eq!(
        world.moves, moves,
        "shards moved in a stable, settled membership"
    );
    // A graceful stop of everyone releases everything.
    for r in 0..REPLICAS {
        world.feed(r, Control::Cancelled);
    }
    world.advance(4 * I);
    assert!(world.replicas.iter().all(|r| r.election.is_none()));
    assert!(world.server.shards.iter().all(Option::is_none));
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(128)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn faults_never_give_a_shard_two_owners_and_the_space_rebalances(
        shards in 1u32..40,
                silent_closes in any::<bool>(),
        fencing in any::<bool>(),
        ops in prop::collection::vec(op(), 1..80),
    ) {
        run_case(shards, silent_closes, fencing, &ops);
    }
}

#[test]
fn a_cold_start_of_four_splits_the_space_without_moving_a_shard() {
    let mut world = World::new(4, 64, |o| o);
    for r in 0..4 {
        world.start(r);
        world.advance(Duration::from_millis(10));
    }
    world.advance(3 * I);
    assert!(world.balanced(), "{:?}", world.loads());
    assert_eq!(world.moves, 0);
}

#[test]
fn a_join_moves_about_the_joiners_share_and_a_crash_only_the_crashed_shards() {
    let k = 1024;
    let mut world = World::new(9, k, |o| o);
    for r in 0..8 {
        world.start(r);
    }
    world.advance(4 * I);
    assert!(world.balanced(), "{:?}", world.loads());
    let before = world.moves;
    world.start(8);
    let mut intervals = 0;
    while !world.balanced() {
        world.advance(I);
        intervals += 1;
        assert!(intervals <= 6, "join: {:?}", world.loads());
    }
    let joined = world.moves - before;
    assert!(
        joined <= u64::from(k) / 9 * 3 / 2,
        "a join moved {joined} shards"
    );
    let before = world.moves;
    world.crash(3);
    let mut intervals = 0;
    while !world.balanced() {
        world.advance(I);
        intervals += 1;
        assert!(intervals <= 6, "crash: {:?}", world.loads());
    }
    let crashed = world.moves - before;
    assert!(
        crashed <= u64::from(k) / 8 * 3 / 2,
        "a crash moved {crashed} shards"
    );
}
