//! Each planted bug is found by the model, with a counterexample of at most 12 steps: the
//! properties can fail.

use std::time::Duration;

use plexsphere_leader_model::check::{self, Outcome, Settings};
use plexsphere_leader_model::sabotage::Sabotage;
use plexsphere_leader_model::single::{Mechanism, SingleModel};

/// The longest counterexample a planted bug may take.
const MAX_STEPS: usize = 12;

const TRUST: &str = "a lease believer trusts inside the row's expiry";
const OVERLAP: &str = "no overlap beyond the bound";

/// Checks `model` with `sabotage` planted, breadth-first on one thread until the first
/// counterexample (so the shortest), to `MAX_STEPS`; it must break one of `properties`.
fn found(model: SingleModel, sabotage: Sabotage, properties: &[&str]) -> Outcome {
    let model = model.with_sabotage(sabotage);
    let settings = Settings {
        threads: 1,
        timeout: Duration::from_secs(120),
        first_failure: true,
        ..Settings::new(MAX_STEPS)
    };
    let outcome = check::run("sabotaged", model, settings);
    let broken = properties.iter().find(|p| {
        outcome
            .counterexample_steps(p)
            .is_some_and(|steps| steps <= MAX_STEPS)
    });
    let Some(property) = broken else {
        panic!(
            "{sabotage:?}: no counterexample of {properties:?} within {MAX_STEPS} steps; found {:?}",
            outcome.figures.violated
        );
    };
    println!("{sabotage:?} breaks {property:?}:");
    for line in outcome.counterexample(property).unwrap_or_default() {
        println!("{line}");
    }
    outcome
}

/// Two replicas: the smallest lease configuration, so that a lease's expiry (three intervals)
/// fits in the step bound.
fn lease_pair() -> SingleModel {
    SingleModel::new(Mechanism::Lease)
}

#[test]
fn a_standby_that_skips_the_queue_overlaps_the_leader() {
    let model = SingleModel::new(Mechanism::Advisory);
    found(model, Sabotage::SkipQueue, &["no overlap beyond the bound"]);
}

#[test]
fn an_unbounded_trust_window_outlives_the_row() {
    found(lease_pair(), Sabotage::UnboundedTrust, &[TRUST, OVERLAP]);
}

#[test]
fn a_renewal_that_does_not_check_the_term_keeps_a_deposed_leader() {
    found(lease_pair(), Sabotage::RenewIgnoresTerm, &[TRUST, OVERLAP]);
}

#[test]
fn a_renewal_that_takes_the_lease_back_overlaps_its_new_holder() {
    let model = SingleModel::new(Mechanism::Lease);
    found(model, Sabotage::RenewTakesBack, &[TRUST, OVERLAP]);
}

#[test]
fn a_lease_write_that_is_not_durable_hands_out_an_epoch_twice() {
    let model = SingleModel::new(Mechanism::Lease);
    found(
        model,
        Sabotage::NonDurableLeaseWrite,
        &["epochs strictly increase per grant", TRUST, OVERLAP],
    );
}
