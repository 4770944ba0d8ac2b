//! Each planted bug is found by the model, with a counterexample of at most 12 steps: the
//! properties can fail.

use std::time::Duration;

use plexsphere_leader_model::check::{self, Outcome, Settings};
use plexsphere_leader_model::engine::{ElectionModel, Mode};
use plexsphere_leader_model::sabotage::Sabotage;
use plexsphere_leader_model::sharded::props::TRUST as SHARD_TRUST;
use plexsphere_leader_model::single::{Mechanism, Single};

/// The longest counterexample a planted bug may take.
const MAX_STEPS: usize = 12;

const TRUST: &str = "a lease believer trusts inside the row's expiry";
const OVERLAP: &str = "no overlap beyond the bound";

/// Checks `model` with `sabotage` planted, breadth-first on one thread until the first
/// counterexample (so the shortest), to `MAX_STEPS`; it must break one of `properties`.
fn found(model: ElectionModel<Single>, sabotage: Sabotage, properties: &[&str]) -> Outcome {
    found_within(model, sabotage, properties, MAX_STEPS)
}

/// As [`found`], within `max_steps`.
fn found_within<M: Mode>(
    model: ElectionModel<M>,
    sabotage: Sabotage,
    properties: &[&str],
    max_steps: usize,
) -> Outcome {
    let model = model.with_sabotage(sabotage);
    let settings = Settings {
        threads: 1,
        timeout: Duration::from_secs(120),
        first_failure: true,
        ..Settings::new(max_steps)
    };
    let outcome = check::run("sabotaged", model, settings);
    let broken = properties.iter().find(|p| {
        outcome
            .counterexample_steps(p)
            .is_some_and(|steps| steps <= max_steps)
    });
    let Some(property) = broken else {
        panic!(
            "{sabotage:?}: no counterexample of {properties:?} within {max_steps} steps; found {:?}",
            outcome.figures.violated
        );
    };
    println!("{sabotage:?} breaks {property:?}:");
    for line in outcome.counterexample(property).unwrap_or_default() {
        println!("{line}");
    }
    outcome
}

/// The lease model as CI checks it.
fn lease() -> ElectionModel<Single> {
    ElectionModel::single(Mechanism::Lease)
}

#[test]
fn a_standby_that_skips_the_queue_overlaps_the_leader() {
    let model = ElectionModel::single(Mechanism::Advisory);
    found(model, Sabotage::SkipQueue, &["no overlap beyond the bound"]);
}

#[test]
fn an_unbounded_trust_window_outlives_the_row() {
    found(lease(), Sabotage::UnboundedTrust, &[TRUST, OVERLAP]);
}

#[test]
fn a_renewal_that_does_not_check_the_term_keeps_a_deposed_leader() {
    found(lease(), Sabotage::RenewIgnoresTerm, &[TRUST, OVERLAP]);
}

#[test]
fn a_renewal_that_takes_the_lease_back_overlaps_its_new_holder() {
    let model = ElectionModel::single(Mechanism::Lease);
    found(model, Sabotage::RenewTakesBack, &[TRUST, OVERLAP]);
}

#[test]
fn a_lease_write_that_is_not_durable_hands_out_an_epoch_twice() {
    let model = ElectionModel::single(Mechanism::Lease);
    found(
        model,
        Sabotage::NonDurableLeaseWrite,
        &["epochs strictly increase per grant", TRUST, OVERLAP],
    );
}

/// Not one of the five: a liveness bug, whose counterexample needs the orphan bound's six
/// intervals of time to pass, so more than 12 steps.
#[test]
fn a_grant_without_idle_session_timeout_leaves_nobody_leading() {
    let model = ElectionModel::single(Mechanism::Advisory).with_faults(1);
    found_within(
        model,
        Sabotage::SkipIdleSessionTimeout,
        &["a leader within the bound after faults stop"],
        60,
    );
}

/// A worse-ranked standby that never defers queues ahead of the new version and wins the old
/// leader's yield: the ranked model's own property fails (without faults; the rollout takes
/// more than 12 steps, about 30).
#[test]
fn a_standby_that_never_defers_takes_the_yield_meant_for_the_better_candidate() {
    let model = ElectionModel::ranked(Mechanism::Advisory).with_faults(0);
    let property = "a yield goes to a better-ranked replica";
    found_within(model, Sabotage::NeverDefer, &[property], 48);
}

/// The sharded model can fail too: a replica whose session was terminated keeps its shards on
/// stale surveys while the others take them. Two replicas, so that the sharded space (whose
/// rounds take more steps) fits a short check in a debug build.
#[test]
fn a_stale_survey_keeps_shards_its_session_lost() {
    let model = ElectionModel::sharded()
        .with_replicas(2)
        .with_sabotage(Sabotage::StaleSurvey);
    let settings = Settings {
        threads: 1,
        timeout: Duration::from_secs(300),
        first_failure: true,
        ..Settings::new(40)
    };
    let outcome = check::run("sharded-sabotaged", model, settings);
    let property = "no shard overlap beyond the bound";
    let steps = outcome.counterexample_steps(property);
    assert!(steps.is_some(), "found {:?}", outcome.figures.violated);
    println!("StaleSurvey breaks {property:?} in {steps:?} steps:");
    for line in outcome.counterexample(property).unwrap_or_default() {
        println!("{line}");
    }
}

/// The sharded lease model's overlap property.
const SHARD_OVERLAP: &str = "no shard overlap beyond the bound";

/// The sharded lease model with two replicas (its rounds take more steps than the single
/// models', and a debug build checks it).
fn sharded_lease() -> ElectionModel<plexsphere_leader_model::sharded::Sharded> {
    ElectionModel::sharded_lease().with_replicas(2)
}

/// A take that owns live members' shards gives a shard two owners.
#[test]
fn a_take_that_ignores_live_members_gives_a_shard_two_owners() {
    let sabotage = Sabotage::TakeIgnoresLiveMembers;
    found_within(sharded_lease(), sabotage, &[SHARD_OVERLAP, SHARD_TRUST], 30);
}

/// A member whose trust deadline never fires owns its shards past its row's expiry.
#[test]
fn an_unbounded_trust_outlives_the_member_row() {
    let sabotage = Sabotage::UnboundedTrust;
    found_within(sharded_lease(), sabotage, &[SHARD_TRUST, SHARD_OVERLAP], 40);
}

/// A restart that loses an answered take leaves its owner without its row.
#[test]
fn a_shard_lease_write_that_is_not_durable_loses_an_owner_row() {
    let sabotage = Sabotage::NonDurableLeaseWrite;
    let properties = [
        "epochs strictly increase per grant",
        SHARD_TRUST,
        SHARD_OVERLAP,
    ];
    found_within(sharded_lease(), sabotage, &properties, 30);
}
