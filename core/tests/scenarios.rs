//! Scenario tests in the virtual-time world: each asserts a time bound and a typed outcome.

mod common;

use std::time::Duration;

use common::{I, World};
use plexsphere_leader_core::Control;

const RTT: Duration = Duration::from_millis(2);

#[test]
fn with_the_lock_free_a_standby_leads_within_one_interval() {
    let mut world = World::new(3, RTT / 2);
    for r in 0..3 {
        world.start(r).unwrap();
    }
    world.advance(2 * RTT).unwrap();
    assert_eq!(world.leaders().len(), 1);
    world.advance(10 * I).unwrap();
    assert_eq!(
        world.leaders().len(),
        1,
        "steady state keeps exactly one leader"
    );
}

#[test]
fn a_terminated_lock_session_hands_over_within_two_intervals_plus_one_check() {
    let mut world = World::new(2, RTT / 2);
    world.start(0).unwrap();
    world.advance(I / 2).unwrap();
    world.start(1).unwrap();
    world.advance(I).unwrap();
    assert_eq!(world.leaders(), vec![0]);
    world.terminate(0);
    let lost = world.now;
    let mut new_leader_at = None;
    while world.now - lost < 4 * I {
        world.advance(Duration::from_millis(1)).unwrap();
        if world.leaders() == vec![1] && new_leader_at.is_none() {
            new_leader_at = Some(world.now - lost);
        }
    }
    let handover = new_leader_at.expect("replica 1 leads");
    assert!(
        handover <= I + RTT,
        "standby took the freed lock after {handover:?}"
    );
    assert!(!world.replicas[0].election.is_leader());
}

#[test]
fn a_graceful_stop_hands_over_at_the_standbys_next_check_with_no_overlap() {
    let mut world = World::new(2, RTT / 2);
    world.start(0).unwrap();
    world.advance(RTT).unwrap();
    world.start(1).unwrap();
    world.advance(I).unwrap();
    world.event(0, Control::Cancelled).unwrap();
    // The term ended before the unlock was even sent.
    assert!(world.leaders().is_empty());
    world.advance(I + RTT).unwrap();
    assert_eq!(world.leaders(), vec![1]);
    assert!(!world.replicas[0].election.is_running());
}

#[test]
fn an_unanswered_ping_demotes_within_two_intervals() {
    let mut world = World::new(1, RTT / 2);
    world.start(0).unwrap();
    world.advance(I / 2).unwrap();
    assert_eq!(world.leaders(), vec![0]);
    world.replicas[0].latency = 10 * I; // the server stops answering
    world.terminate(0);
    let lost = world.now;
    while world.replicas[0].election.is_leader() {
        world.advance(Duration::from_millis(1)).unwrap();
    }
    assert!(world.now - lost <= 2 * I);
}

#[test]
fn a_lost_grant_reply_leaves_no_lock_behind_after_one_interval() {
    let mut world = World::new(2, RTT / 2);
    world.replicas[0].lose_next_reply = true; // the AcquireConnection answer is lost
    world.start(0).unwrap();
    world.advance(RTT).unwrap();
    assert!(world.server.holder.is_none());
    world.replicas[1].lose_next_reply = false;
    world.start(1).unwrap();
    world.advance(RTT).unwrap();
    assert_eq!(world.leaders(), vec![1]);
}

/// The lease mechanism with its default TTL of three intervals.
fn lease_options() -> plexsphere_leader_core::Options {
    let options = common::options();
    options.lease(plexsphere_leader_core::Lease::default_for(
        options.interval(),
    ))
}

#[test]
fn a_lease_keeps_one_steady_leader_and_one_term() {
    let mut world = World::with_options(3, RTT / 2, lease_options());
    for r in 0..3 {
        world.start(r).unwrap();
    }
    world.advance(100 * I).unwrap();
    assert_eq!(world.leaders().len(), 1);
    let terms: u64 = world.replicas.iter().map(|r| r.terms).sum();
    assert_eq!(terms, 1, "one term in 100 intervals");
}

#[test]
fn a_cut_off_lease_holder_demotes_before_its_lease_expires_and_hands_over_within_ttl_plus_one_interval()
 {
    let mut world = World::with_options(2, RTT / 2, lease_options());
    world.start(0).unwrap();
    world.advance(I / 2).unwrap();
    world.start(1).unwrap();
    world.advance(2 * I).unwrap();
    assert_eq!(world.leaders(), vec![0]);
    // Replica 0's statements no longer reach the server: a partition.
    world.replicas[0].partitioned = true;
    let cut = world.now;
    let (mut demoted, mut took_over) = (None, None);
    while world.now - cut < 8 * I {
        world.advance(Duration::from_millis(1)).unwrap();
        if demoted.is_none() && !world.replicas[0].election.is_leader() {
            demoted = Some(world.now - cut);
        }
        if took_over.is_none() && world.replicas[1].election.is_leader() {
            took_over = Some(world.now - cut);
        }
    }
    let (demoted, took_over) = (demoted.expect("demoted"), took_over.expect("took over"));
    // The last renewal reached the server at most one interval before the cut, so the lease
    // expires within the TTL of it; the world's bounds (checked at every step) prove there was
    // no instant with two leaders.
    assert!(demoted <= 3 * I, "demoted {demoted:?} after the cut");
    assert!(demoted < took_over, "{demoted:?} vs {took_over:?}");
    assert!(
        took_over <= 3 * I + I + RTT,
        "took over {took_over:?} after the cut"
    );
}

#[test]
fn a_lease_holder_whose_answers_are_lost_gives_way_to_a_standby() {
    let mut world = World::with_options(2, RTT / 2, lease_options());
    world.start(0).unwrap();
    world.advance(I / 2).unwrap();
    world.start(1).unwrap();
    world.advance(2 * I).unwrap();
    assert_eq!(world.leaders(), vec![0]);
    // Replica 0's statements still run on the server, but every answer comes too late.
    world.replicas[0].latency = 100 * I;
    let cut = world.now;
    while !world.replicas[1].election.is_leader() {
        world.advance(Duration::from_millis(1)).unwrap();
        assert!(world.now - cut < 12 * I, "replica 1 never led");
    }
    // Renewals and one claim kept the row for a while (the answers lost, not the statements);
    // then the unanswered claim's hold-off let replica 1 take it.
    world.advance(20 * I).unwrap();
    assert_eq!(world.leaders(), vec![1], "replica 1 keeps the lease");
}

#[test]
fn a_released_lease_hands_over_at_the_standbys_next_check() {
    let mut world = World::with_options(2, RTT / 2, lease_options());
    world.start(0).unwrap();
    world.advance(RTT).unwrap();
    world.start(1).unwrap();
    world.advance(I).unwrap();
    assert_eq!(world.leaders(), vec![0]);
    world.event(0, Control::Cancelled).unwrap();
    let stopped = world.now;
    while !world.replicas[1].election.is_leader() {
        world.advance(Duration::from_millis(1)).unwrap();
    }
    let handover = world.now - stopped;
    assert!(handover <= I + 2 * RTT, "handover after {handover:?}");
}
