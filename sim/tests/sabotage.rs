//! The checker must be able to fail: with each deliberately broken behaviour of the replica's
//! software (its lock sessions wrapped, or its operator) switched on, one at a time, the
//! simulation reports the violation that behaviour causes within one cycle of seeds through
//! every (fault kind, acquire mode, fencing) cell; and with the simulated server's fence row
//! left unlocked, the fence-holds property fails. The sharded sabotages (a shard's work that
//! does not hold its term, a survey answered from the last good rows) are caught within one
//! cycle of sharded seeds. A lease leader that answers its own failed renewals trusts its
//! lease past its window, and is caught within one cycle of lease seeds; so is a lease leader
//! whose clock runs slower than the lease's margin. An unfit replica whose refused fitness
//! probe is answered as a pass takes leadership, and is caught within one cycle of fitness
//! seeds of either mechanism. A harness that reads a paused leader's belief from its
//! published leadership (what `is_leader()` answered before it compared the trust deadline
//! with the clock) sees that leader outlive its lease, within one cycle of pause seeds. A lease
//! shard space's member that answers its failed renewals, and servers whose take owns live
//! members' shards, reaps nobody or advances no fence row, are caught within one cycle of
//! sharded lease seeds. In a rolling deploy of ranked replicas, a leader whose survey of the
//! candidates is answered with no row never yields (caught as `preference`), and a standby
//! whose survey is answered so never defers, so leadership moves twice for one rank change
//! (caught as `one-move`), within one cycle of rollout seeds of either mechanism.
#![allow(missing_docs)] // test functions

use plexsphere_leader::config::AcquireMode;
use plexsphere_leader_sim::{
    DriverSabotage, Property, RunOptions, Sabotage, ShardSabotage, Sharding, Space, Violation,
    run_once,
};

/// One cycle through every cell: the fourteen run kinds (thirteen fault kinds and the mixed
/// one), each polling and queued, with fencing off and on.
const SEEDS: u64 = RunOptions::CYCLE;

/// The first violation of `property` with `sabotage` on among the cycle's seeds that `runs`
/// accepts, and its seed.
fn first_catch(
    sabotage: Sabotage,
    property: Property,
    cycles: u64,
    runs: impl Fn(&RunOptions) -> bool,
) -> Option<(u64, Violation)> {
    assert_eq!(4 * Space::Advisory.kinds().len() as u64, SEEDS);
    let seeds = Space::Advisory
        .seeds(cycles * SEEDS)
        .filter(|&seed| runs(&RunOptions::new(seed)));
    seeds.into_iter().find_map(|seed| {
        let options = RunOptions {
            sabotage: Some(sabotage),
            ..RunOptions::new(seed)
        };
        let outcome = run_once(&options);
        outcome
            .violations
            .into_iter()
            .find(|violation| violation.property == property)
            .map(|violation| (seed, violation))
    })
}

fn assert_caught(sabotage: Sabotage, property: Property) {
    assert_caught_among(sabotage, property, 1, |_| true);
}

/// As [`assert_caught`], over `cycles` cycles, trying only the seeds `runs` accepts (those
/// that can show the sabotage at all).
fn assert_caught_among(
    sabotage: Sabotage,
    property: Property,
    cycles: u64,
    runs: impl Fn(&RunOptions) -> bool,
) {
    match first_catch(sabotage, property, cycles, runs) {
        Some((seed, violation)) => {
            println!("{sabotage} caught at seed {seed}: {violation}");
        }
        None => panic!("{sabotage}: no {property} violation within {cycles} cycles of seeds"),
    }
}

/// A leader whose check is answered without a query keeps leading after its session is gone.
#[test]
fn never_ping_is_caught_as_a_late_detection() {
    assert_caught(
        Sabotage::Driver(DriverSabotage::NeverPing),
        Property::Detection,
    );
}

/// A lock left on a pooled connection is not what the leader checks: when that session dies
/// the check runs on a fresh connection and succeeds.
#[test]
fn return_granted_to_pool_is_caught_as_a_late_detection() {
    assert_caught(
        Sabotage::Driver(DriverSabotage::ReturnGrantedToPool),
        Property::Detection,
    );
}

/// Without `idle_session_timeout` an orphaned lock session outlives 4·I.
#[test]
fn skip_idle_session_timeout_is_caught_by_the_orphan_bound() {
    assert_caught(
        Sabotage::Driver(DriverSabotage::SkipIdleSessionTimeout),
        Property::OrphanBound,
    );
}

/// A resigner that takes the lock straight back breaks the operator's hold-off.
#[test]
fn resign_without_hold_off_is_caught_by_the_operator_controls() {
    assert_caught(
        Sabotage::Driver(DriverSabotage::ResignWithoutHoldOff),
        Property::OperatorControls,
    );
}

/// A leader that ignores failed checks keeps leading after its session is gone.
#[test]
fn keep_term_on_failed_ping_is_caught_as_a_late_detection() {
    assert_caught(
        Sabotage::Driver(DriverSabotage::KeepTermOnFailedPing),
        Property::Detection,
    );
}

/// A queued wait's 55P03 taken for a plain refusal returns a lock granted in the instant the
/// wait timed out (the grant-at-timeout race) to the pool on its session: the session's next
/// statement (the replica's next check) finds the lock still held. Only queued seeds wait,
/// and the race is rare (31 in the 500 seeds of CI): two cycles.
#[test]
fn lock_timeout_as_refusal_is_caught_as_a_stranded_lock() {
    assert_caught_among(
        Sabotage::Driver(DriverSabotage::LockTimeoutAsRefusal),
        Property::StrandedLock,
        2,
        |options| options.mode == AcquireMode::Queue,
    );
}

/// Without the row lock an old leader's fenced transaction can commit after a new leader
/// advanced the epoch. Only fencing seeds fence.
#[test]
fn fence_without_row_lock_is_caught_as_a_broken_fence() {
    assert_caught_among(
        Sabotage::FenceWithoutRowLock,
        Property::FenceHolds,
        1,
        |options| options.fencing,
    );
}

/// A lease renewal that fails or does not answer, reported as renewed, keeps the leader's trust
/// after the server let the lease expire: the term outlives its lease (the lease's detection
/// bound is zero) and overlaps the next claimer's (so is the lease's overlap bound).
#[test]
fn keep_lease_on_failed_renewal_is_caught_as_a_term_outliving_its_lease_and_an_overlap() {
    let sabotage = Sabotage::Driver(DriverSabotage::KeepLeaseOnFailedRenewal);
    let caught: Vec<(u64, Violation)> = Space::Lease
        .seeds(RunOptions::LEASE_CYCLE)
        .find_map(|seed| {
            let options = RunOptions {
                sabotage: Some(sabotage),
                ..RunOptions::lease(seed)
            };
            let violations = run_once(&options).violations;
            let first = |property| violations.iter().find(|v| v.property == property).cloned();
            match (first(Property::Detection), first(Property::Overlap)) {
                (Some(detection), Some(overlap)) => Some(vec![(seed, detection), (seed, overlap)]),
                _ => None,
            }
        })
        .unwrap_or_default();
    assert_eq!(
        caught.len(),
        2,
        "{sabotage}: no detection and overlap within one lease cycle"
    );
    for (seed, violation) in caught {
        println!("{sabotage} caught at lease seed {seed}: {violation}");
    }
}

/// Every replica's clock 15 % slow, outside the lease's 10 % margin: a cut-off leader trusts its
/// lease about 1.06·TTL after sending its last renewal, past the server's expiry, and its term
/// outlives its lease (a detection violation) within one cycle of lease seeds. Within the
/// margin (every lease run gives its replicas clocks ±5 % off) no seed shows one.
#[test]
fn a_clock_slower_than_the_margin_is_caught_as_a_term_outliving_its_lease() {
    let sabotage = Sabotage::Driver(DriverSabotage::SlowClock);
    let caught = Space::Lease
        .seeds(RunOptions::LEASE_CYCLE)
        .find_map(|seed| {
            let options = RunOptions {
                sabotage: Some(sabotage),
                ..RunOptions::lease(seed)
            };
            run_once(&options)
                .violations
                .into_iter()
                .find(|v| v.property == Property::Detection && v.detail.contains("after its lease"))
                .map(|violation| (seed, violation))
        });
    match caught {
        Some((seed, violation)) => println!("{sabotage} caught at lease seed {seed}: {violation}"),
        None => panic!("{sabotage}: no detection violation within one lease cycle"),
    }
}

/// The first violation of `property` whose detail contains `marks` with the sharded sabotage
/// `sabotage` on, among one cycle of the sharded seeds of `space` (every kind with every shard
/// count: advisory locks, or leases), and its seed.
fn first_sharded_catch(
    space: Space,
    sabotage: ShardSabotage,
    property: Property,
    marks: &str,
) -> Option<(u64, Violation)> {
    space.seeds(space.cycle()).find_map(|seed| {
        let options = RunOptions {
            sabotage: Some(Sabotage::Shard(sabotage)),
            ..RunOptions::in_space(space, seed)
        };
        run_once(&options)
            .violations
            .into_iter()
            .find(|v| v.property == property && v.detail.contains(marks))
            .map(|violation| (seed, violation))
    })
}

fn assert_sharded_caught(sabotage: ShardSabotage, property: Property, marks: &str) {
    assert_caught_in(Space::Sharded, sabotage, property, marks);
}

/// As [`assert_sharded_caught`], among the seeds of `space`.
fn assert_caught_in(space: Space, sabotage: ShardSabotage, property: Property, marks: &str) {
    let name = Sabotage::Shard(sabotage);
    assert!(space.cycle() <= Sharding::CYCLE);
    match first_sharded_catch(space, sabotage, property, marks) {
        Some((seed, violation)) => println!("{name} caught at {space:?} seed {seed}: {violation}"),
        None => panic!(
            "{name}: no {property} violation ({marks}) within {} {space:?} seeds",
            space.cycle()
        ),
    }
}

/// Shard work that does not hold its term lets a handover unlock the shard while the old
/// owner's work still runs: the zero overlap of a graceful handover breaks. (A handover, not
/// a stop: the core's own finding, a stop during a survey, shows as a stopped term.)
#[test]
fn shard_work_outliving_its_term_is_caught_as_a_graceful_overlap() {
    assert_sharded_caught(
        ShardSabotage::WorkOutlivesTerm,
        Property::GracefulOverlap,
        "(handed over)",
    );
}

/// A replica that answers a failed survey with its last good rows keeps its shards after the
/// server ended its session.
#[test]
fn keep_shards_on_failed_survey_is_caught_as_a_late_detection() {
    assert_sharded_caught(
        ShardSabotage::KeepShardsOnFailedSurvey,
        Property::Detection,
        "still owned the shard",
    );
}

/// A lease member that answers a failed renewal with its last good one trusts its shards past
/// the window of its last real renewal: its shard terms outlive its lease on the server.
#[test]
fn keep_shards_on_failed_renewal_is_caught_as_a_term_outliving_its_lease() {
    assert_caught_in(
        Space::ShardedLease,
        ShardSabotage::KeepShardsOnFailedSurvey,
        Property::Detection,
        "after its lease",
    );
}

/// A take that owns a live member's shard gives the shard two owners: the servers' log shows
/// it (mutual exclusion of the rows).
#[test]
fn a_take_of_live_members_shards_is_caught_as_a_broken_mutual_exclusion() {
    assert_caught_in(
        Space::ShardedLease,
        ShardSabotage::TakeLiveShards,
        Property::MutualExclusion,
        "while member",
    );
}

/// A take that reaps nobody never frees an expired member's shards: they are not re-owned
/// within the bound.
#[test]
fn a_take_without_its_reap_is_caught_as_shards_never_re_owned() {
    assert_caught_in(
        Space::ShardedLease,
        ShardSabotage::TakeWithoutReap,
        Property::Liveness,
        "stayed free",
    );
}

/// A take that does not advance the fence rows gives a new owner its predecessor's epoch: a
/// stale epoch's write would pass the fence.
#[test]
fn a_take_without_its_fence_advance_is_caught_as_epochs_not_rising() {
    assert_caught_in(
        Space::ShardedLease,
        ShardSabotage::TakeWithoutFence,
        Property::EpochsRise,
        "advanced none",
    );
}

/// A sharded replica asked to resign that rejoins at once (its hold-off dropped) takes shards
/// during the hold-off the operator asked for: the operator controls of sharded runs.
#[test]
fn resign_without_hold_off_is_caught_in_sharded_runs() {
    let sabotage = Sabotage::Driver(DriverSabotage::ResignWithoutHoldOff);
    let caught = Space::Sharded.seeds(Sharding::CYCLE).find_map(|seed| {
        let options = RunOptions {
            sabotage: Some(sabotage),
            ..RunOptions::sharded(seed)
        };
        run_once(&options)
            .violations
            .into_iter()
            .find(|v| v.property == Property::OperatorControls)
            .map(|v| (seed, v))
    });
    match caught {
        Some((seed, violation)) => {
            println!("{sabotage} caught at sharded seed {seed}: {violation}")
        }
        None => panic!("{sabotage}: no operator-controls violation within a sharded cycle"),
    }
}

/// The server refuses the unfit replica's fitness probe; answered as a pass, the replica that
/// cannot do the work leads. Caught on both mechanisms.
#[test]
fn ignore_unfit_is_caught_by_the_fitness_property_on_both_mechanisms() {
    let sabotage = Sabotage::Driver(DriverSabotage::IgnoreUnfit);
    for lease in [false, true] {
        let space = if lease { Space::Lease } else { Space::Advisory };
        let cycle = space.cycle();
        let caught = space.seeds(cycle).find_map(|seed| {
            let seeded = if lease {
                RunOptions::lease(seed)
            } else {
                RunOptions::new(seed)
            };
            let options = RunOptions {
                sabotage: Some(sabotage),
                unfit: true,
                ..seeded
            };
            run_once(&options)
                .violations
                .into_iter()
                .find(|v| v.property == Property::Fitness)
                .map(|v| (seed, v))
        });
        match caught {
            Some((seed, violation)) => {
                println!("{sabotage} (lease {lease}) caught at seed {seed}: {violation}")
            }
            None => panic!("{sabotage} (lease {lease}): no fitness violation within {cycle} seeds"),
        }
    }
}

/// Rollout runs: the leader that never sees a better candidate never yields, and the standby
/// that never sees one never defers; caught on both mechanisms within a cycle.
#[test]
fn never_yield_and_never_defer_are_caught_by_the_preference_checks_on_both_mechanisms() {
    let cases = [
        (DriverSabotage::NeverYield, Property::Preference),
        (DriverSabotage::NeverDefer, Property::OneMove),
    ];
    for (driver, property) in cases {
        let sabotage = Sabotage::Driver(driver);
        for space in [Space::Rollout, Space::RolloutLease] {
            let cycle = space.cycle();
            let caught = space.seeds(cycle).find_map(|seed| {
                let options = RunOptions {
                    sabotage: Some(sabotage),
                    ..RunOptions::in_space(space, seed)
                };
                run_once(&options)
                    .violations
                    .into_iter()
                    .find(|v| v.property == property)
                    .map(|v| (seed, v))
            });
            match caught {
                Some((seed, violation)) => {
                    println!("{sabotage} ({space:?}) caught at seed {seed}: {violation}")
                }
                None => {
                    panic!("{sabotage} ({space:?}): no {property} violation within {cycle} seeds")
                }
            }
        }
    }
}

/// Pause runs: a belief read from the published leadership (as `is_leader()` answered before
/// the trust deadline was compared at the call) outlives the lease of a leader paused past
/// its trust: a term past its lease's end on the server, and an overlap. The same of a lease
/// shard space's member (as `ownership()` and `is_owner()` answered before they looked at the
/// trust deadline), within a cycle of its pause seeds.
#[test]
fn published_belief_is_caught_as_a_term_outliving_its_lease_in_a_pause() {
    let sabotage = Sabotage::Driver(DriverSabotage::PublishedBelief);
    for (space, seeds) in [
        (Space::Pause, RunOptions::LEASE_CYCLE),
        (Space::ShardedPause, Space::ShardedPause.cycle()),
    ] {
        let caught = space.seeds(seeds).find_map(|seed| {
            let options = RunOptions {
                sabotage: Some(sabotage),
                ..RunOptions::in_space(space, seed)
            };
            run_once(&options)
                .violations
                .into_iter()
                .find(|v| v.property == Property::Detection)
                .map(|v| (seed, v))
        });
        match caught {
            Some((seed, violation)) => {
                println!("{sabotage} caught at {space:?} seed {seed}: {violation}")
            }
            None => panic!("{sabotage}: no detection violation within a cycle of {space:?} seeds"),
        }
    }
}
