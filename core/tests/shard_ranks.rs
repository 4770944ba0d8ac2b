//! Ranked shard spaces in the world of sharded elections: a rolling deploy (each replica
//! stopped and started again with a newer version, one at a time) with and without the version
//! floor, and a rollback below the floor, refused and then allowed. The world checks at every
//! step that no shard has two owners beyond the detection bound and that every term ends once.

mod shards_world;

use std::time::Duration;

use plexsphere_leader_core::Control;
use plexsphere_leader_core::rank::{Rank, Version};
use plexsphere_leader_core::shards::ShardOptions;
use shards_world::{I, World};

const OLD: Version = Version::new(1, 9, 0);
const NEW: Version = Version::new(1, 10, 0);

fn ranked(options: ShardOptions, version: Version, floor: bool) -> ShardOptions {
    options
        .preference(Rank::of_version(version))
        .version_floor(floor)
}

/// Advances until `done` holds, at most `intervals` check intervals; panics with the loads
/// otherwise.
fn until(world: &mut World, intervals: u32, what: &str, done: impl Fn(&World) -> bool) {
    for _ in 0..intervals * 10 {
        if done(world) {
            return;
        }
        world.advance(I / 10);
    }
    assert!(
        done(world),
        "{what} within {intervals} intervals: {:?}",
        world.loads()
    );
}

/// Stops replica `r`, waits for its run to finish, and starts it again with `options`.
fn redeploy(world: &mut World, r: usize, options: ShardOptions) {
    world.feed(r, Control::Cancelled);
    until(world, 5, "the stop", |w| w.replicas[r].election.is_none());
    world.own_options.insert(r, options);
    world.start(r);
}

/// The shards owned by the replicas running `version`.
fn owned_by(world: &World, version: Version) -> usize {
    world
        .loads()
        .iter()
        .filter(|(r, _)| world.options_of(*r).rank_of().map(|rank| rank.version) == Some(version))
        .map(|(_, n)| n)
        .sum()
}

/// Three replicas of `OLD`, settled over `k` shards.
fn settled_fleet(k: u32, floor: bool) -> World {
    let mut world = World::new(3, k, |o| ranked(o, OLD, floor));
    for r in 0..3 {
        world.start(r);
        world.advance(Duration::from_millis(10));
    }
    until(&mut world, 10, "the first balance", World::settled);
    world
}

#[test]
fn with_the_floor_a_rolling_deploy_moves_every_shard_to_the_new_version_and_none_back() {
    let k = 12;
    let mut world = settled_fleet(k, true);
    let new = ranked(world.options, NEW, true);
    redeploy(&mut world, 0, new);
    // The new replica's join raised the floor: the old ones give everything up to it.
    until(&mut world, 12, "the move to the new version", |w| {
        w.settled() && owned_by(w, NEW) == k as usize
    });
    assert_eq!(world.server.floor, Some(NEW));
    assert!(world.is_below_floor(1) && world.is_below_floor(2));
    for r in 1..3 {
        redeploy(&mut world, r, new);
        until(
            &mut world,
            12,
            "the balance over the new versions",
            World::settled,
        );
        assert_eq!(
            owned_by(&world, NEW),
            k as usize,
            "no shard back to the old version"
        );
    }
    let loads = world.loads();
    assert!(loads.iter().all(|(_, n)| *n == 4), "{loads:?}");
    assert!(world.stranded().is_empty());
}

#[test]
fn without_the_floor_a_rolling_deploy_stays_balanced_and_the_new_versions_carry_the_remainder() {
    // 10 shards over 3 replicas: one member owns 4, and from the first new one on it is new.
    let k = 10;
    let mut world = settled_fleet(k, false);
    let new = ranked(world.options, NEW, false);
    for r in 0..3 {
        redeploy(&mut world, r, new);
        until(
            &mut world,
            12,
            "the balance after a redeploy",
            World::settled,
        );
        let loads = world.loads();
        let fullest = loads.iter().max_by_key(|(_, n)| *n).map(|(r, _)| *r);
        let version = fullest.and_then(|r| world.options_of(r).rank_of());
        assert_eq!(version.map(|rank| rank.version), Some(NEW), "{loads:?}");
    }
    assert_eq!(
        world.server.floor, None,
        "no floor is written when it is off"
    );
}

#[test]
fn a_rollback_below_the_floor_owns_nothing_unless_allowed_and_then_lowers_the_floor() {
    let k = 12;
    let mut world = settled_fleet(k, true);
    let new = ranked(world.options, NEW, true);
    for r in 0..3 {
        redeploy(&mut world, r, new);
        until(&mut world, 12, "the rollout", World::settled);
    }
    // An accidental rollback of one replica: it joins, owns nothing, and the floor stays.
    let old = ranked(world.options, OLD, true);
    redeploy(&mut world, 0, old);
    until(
        &mut world,
        12,
        "the balance over the new versions",
        World::settled,
    );
    assert!(world.is_below_floor(0));
    assert_eq!(owned_by(&world, OLD), 0);
    assert_eq!(world.server.floor, Some(NEW));
    // A deliberate one: allowed below the floor, it sets the floor to its version as it joins,
    // and every old replica owns shards again.
    redeploy(&mut world, 1, old.below_floor(true));
    until(
        &mut world,
        12,
        "the balance after the deliberate rollback",
        |w| w.settled() && w.loads().iter().all(|(_, n)| *n == 4),
    );
    assert_eq!(world.server.floor, Some(OLD));
    assert!(!world.is_below_floor(0));
}
