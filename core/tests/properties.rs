//! Property tests: random faults, latencies and control inputs against the invariant checker
//! and the cross-replica bounds; a liveness phase ends every case (with ranks in half the
//! cases: then the leader ends up of the best rank, and stays).
//!
//! `PROPTEST_CASES` sets the number of cases (default 256).

mod common;

use std::time::Duration;

use common::{I, World};
use plexsphere_leader_core::rank::{Rank, Version};
use plexsphere_leader_core::{AcquireMode, Control, Lease, OnOverdue, Options, UNLOCK_BUDGET};
use proptest::prelude::*;

const REPLICAS: usize = 3;

/// The longest resign hold-off a case asks for: three intervals.
const MAX_HOLD_OFF_MS: u16 = 3 * I.as_millis() as u16;

#[derive(Debug, Clone)]
enum Op {
    Advance(u16),
    Start(usize),
    Cancel(usize),
    Panic(usize),
    Drop(usize),
    Terminate(usize),
    TerminateSilently(usize),
    Latency(usize, u16),
    LoseNextReply(usize),
    FailNext(usize),
    Resign(usize, u16),
    SetEligible(usize, bool),
    SetFit(usize, bool),
}

fn op() -> impl Strategy<Value = Op> {
    let r = 0..REPLICAS;
    prop_oneof![
        6 => (1u16..250).prop_map(Op::Advance),
        2 => r.clone().prop_map(Op::Start),
        1 => r.clone().prop_map(Op::Cancel),
        1 => r.clone().prop_map(Op::Panic),
        1 => r.clone().prop_map(Op::Drop),
        2 => r.clone().prop_map(Op::Terminate),
        1 => r.clone().prop_map(Op::TerminateSilently),
        2 => (r.clone(), 0u16..300).prop_map(|(r, ms)| Op::Latency(r, ms)),
        1 => r.clone().prop_map(Op::LoseNextReply),
        1 => r.clone().prop_map(Op::FailNext),
        1 => (r.clone(), 0..=MAX_HOLD_OFF_MS).prop_map(|(r, ms)| Op::Resign(r, ms)),
        1 => (r.clone(), any::<bool>()).prop_map(|(r, eligible)| Op::SetEligible(r, eligible)),
        1 => (r, any::<bool>()).prop_map(|(r, fit)| Op::SetFit(r, fit)),
    ]
}

/// The options of a case: either acquire mode, fencing on or off, any stop grace, and a work
/// deadline of up to three intervals (reporting or aborting) or none, the pool proof when
/// fencing is off, the fitness probe in half the cases; in a third of the cases
/// the lease mechanism, with a TTL of two to six intervals.
fn options() -> impl Strategy<Value = Options> {
    let deadline = prop::option::of((0..=3 * I.as_millis() as u64, any::<bool>()));
    let lease = prop_oneof![2 => Just(None), 1 => (2u32..=6).prop_map(Some)];
    (
        any::<bool>(),
        any::<bool>(),
        0..=2 * I.as_millis() as u64,
        deadline,
        lease,
        any::<bool>(),
    )
        .prop_map(|(queue, fencing, grace_ms, deadline, lease, probe)| {
            let mode = if queue {
                AcquireMode::Queue
            } else {
                AcquireMode::Poll
            };
            let mut options = common::options();
            if let Some(intervals) = lease {
                let interval = options.interval();
                let lease = Lease::new(interval, interval.get() * intervals).expect("a valid TTL");
                options = options.lease(lease);
            }
            // The pool proof on in every case whose fencing is off: it adds its step before
            // the first grant, whose bounds the world checks.
            let options = options
                .acquire(mode)
                .prove_pool(!fencing)
                .probe_fitness(probe)
                .fencing(fencing)
                .stop_grace(Duration::from_millis(grace_ms))
                .expect("a grace within two intervals");
            match deadline {
                Some((ms, abort)) => options.work_deadline(
                    Duration::from_millis(ms),
                    if abort {
                        OnOverdue::Abort
                    } else {
                        OnOverdue::Report
                    },
                ),
                None => options,
            }
        })
}

/// The ranks of a case's replicas, by index into [`VERSIONS`], and whether the version floor
/// is on; `None`: unranked.
fn ranks() -> impl Strategy<Value = Option<([usize; REPLICAS], bool)>> {
    prop_oneof![
        1 => Just(None),
        1 => (prop::array::uniform3(0..VERSIONS.len()), any::<bool>()).prop_map(Some),
    ]
}

/// The versions a ranked case's replicas run (equal ranks are allowed).
const VERSIONS: [&str; 3] = ["1.0.0", "1.1.0-rc.1", "1.1.0"];

fn rank(index: usize) -> Rank {
    Rank::of_version(Version::parse(VERSIONS[index]).expect("a valid version"))
}

fn run(
    options: Options,
    ranked: Option<([usize; REPLICAS], bool)>,
    ops: &[Op],
) -> Result<(), String> {
    let each = (0..REPLICAS)
        .map(|r| match ranked {
            Some((ranks, floor)) => options.preference(rank(ranks[r])).version_floor(floor),
            None => options,
        })
        .collect();
    let ranks = ranked.map(|(ranks, _)| ranks);
    let mut world = World::with_each(Duration::from_millis(1), each);
    for r in 0..REPLICAS {
        world.start(r)?;
    }
    for op in ops {
        match *op {
            Op::Advance(ms) => world.advance(Duration::from_millis(ms.into()))?,
            Op::Start(r) => world.start(r)?,
            Op::Cancel(r) => world.event(r, Control::Cancelled)?,
            Op::Panic(r) => world.event(r, Control::Panicked)?,
            Op::Drop(r) => world.event(r, Control::Dropped)?,
            Op::Terminate(r) => world.terminate(r),
            Op::TerminateSilently(r) => {
                world.terminate_silently(r);
            }
            Op::Latency(r, ms) => world.replicas[r].latency = Duration::from_millis(ms.into()),
            Op::LoseNextReply(r) => world.replicas[r].lose_next_reply = true,
            Op::FailNext(r) => world.replicas[r].fail_next = true,
            Op::Resign(r, ms) => world.event(
                r,
                Control::Resign {
                    hold_off: Duration::from_millis(ms.into()),
                },
            )?,
            Op::SetEligible(r, eligible) => world.event(r, Control::SetEligible { eligible })?,
            Op::SetFit(r, fit) => world.replicas[r].unfit = !fit,
        }
    }
    liveness(&mut world, ranks)?;
    if world.terms_below_floor > 0 {
        return Err(format!(
            "{} terms began below the version floor",
            world.terms_below_floor
        ));
    }
    Ok(())
}

/// Faults stop, every replica runs with a short latency: within a few intervals exactly one
/// replica leads, on the session that holds the lock, and every other replica stays standby.
/// With ranks, within two windows and the defer limit more the leader is one of the best rank,
/// and stays so.
fn liveness(world: &mut World, ranks: Option<[usize; REPLICAS]>) -> Result<(), String> {
    for replica in &mut world.replicas {
        replica.latency = Duration::from_millis(1);
        replica.lose_next_reply = false;
        replica.fail_next = false;
        replica.unfit = false;
    }
    // Every replica may lead again; a resign's hold-off ends within three intervals.
    for r in 0..REPLICAS {
        world.event(r, Control::SetEligible { eligible: true })?;
    }
    // A stop in progress ends within its grace (two intervals at most) and the unlock budget.
    world.advance(2 * I + UNLOCK_BUDGET)?;
    world.advance(Duration::from_millis(MAX_HOLD_OFF_MS.into()))?;
    for r in 0..REPLICAS {
        if !world.replicas[r].election.is_running() {
            world.start(r)?;
        }
    }
    // Old answers drain within the longest latency (300 ms); an orphan grant closes within its
    // budget (two intervals when queued); a stop's grace is at most two intervals.
    world.advance(Duration::from_millis(300) + 5 * I)?;
    let leaders = world.leaders();
    if leaders.len() != 1 {
        return Err(format!(
            "liveness: leaders {leaders:?} at {:?}",
            world.elapsed()
        ));
    }
    if let Some(ranks) = ranks {
        // A worse leader yields once the best has been a candidate for a window and it has
        // led one; a deferral to a vanished candidate ends within the defer limit.
        let options = world.replicas[0].election.options();
        world.advance(2 * options.preempt_window_of() + options.defer_limit() + 2 * I)?;
        let best = ranks.iter().max().copied();
        let leaders = world.leaders();
        if leaders.len() != 1 || Some(ranks[leaders[0]]) != best {
            return Err(format!(
                "preference: leaders {leaders:?} with ranks {ranks:?} at {:?}",
                world.elapsed()
            ));
        }
        let moves = world.replicas.iter().map(|r| r.terms).sum::<u64>();
        world.advance(10 * I)?;
        let after = world.replicas.iter().map(|r| r.terms).sum::<u64>();
        if after != moves || world.leaders() != leaders {
            return Err(format!(
                "preference: leadership moved again among {ranks:?}"
            ));
        }
    }
    // Then a graceful stop of everyone leaves no lock and no open term.
    for r in 0..REPLICAS {
        world.event(r, Control::Cancelled)?;
    }
    // The work answers at once (or never, after a FailNext: the grace bounds it).
    world.advance(2 * I + Duration::from_millis(10))?;
    if world.server.holder.is_some() || world.lease_held() || !world.leaders().is_empty() {
        return Err("after stopping every replica a lock or a term remains".into());
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn invariants_and_bounds_hold_under_random_faults(
        options in options(),
        ranks in ranks(),
        ops in prop::collection::vec(op(), 0..120),
    ) {
        if let Err(violation) = run(options, ranks, &ops) {
            prop_assert!(false, "{violation}");
        }
    }
}

/// `PROPTEST_CASES`, or 256.
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}
