//! Each model, at a small depth, keeps every property: a quick guard for `cargo test` (the CI
//! size runs as `cargo run --release -p plexsphere-leader-model`).

use std::time::Duration;

use plexsphere_leader_core::AcquireMode;
use plexsphere_leader_model::check::{self, Outcome, Settings};
use plexsphere_leader_model::engine::{ElectionModel, Mode};
use plexsphere_leader_model::single::Mechanism;

const DEPTH: usize = 8;

fn check<M: Mode>(name: &'static str, model: ElectionModel<M>) -> Outcome {
    let settings = Settings {
        timeout: Duration::from_secs(300),
        ..Settings::new(DEPTH)
    };
    let outcome = check::run(name, model, settings);
    assert!(
        outcome.figures.violated.is_empty(),
        "{name}: {:?}\n{}",
        outcome.figures.violated,
        outcome
            .discoveries
            .iter()
            .flat_map(|(_, _, lines)| lines.iter().cloned())
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(
        outcome.figures.states > 1_000,
        "{name}: {:?}",
        outcome.figures
    );
    outcome
}

#[test]
fn the_advisory_model_keeps_its_properties() {
    let outcome = check("advisory", ElectionModel::single(Mechanism::Advisory));
    assert!(outcome.figures.undiscovered.iter().all(|p| *p != "elected"));
}

#[test]
fn the_advisory_model_in_poll_mode_keeps_its_properties() {
    let model = ElectionModel::single(Mechanism::Advisory).with_acquire(AcquireMode::Poll);
    check("advisory-poll", model);
}

#[test]
fn the_lease_model_keeps_its_properties() {
    check("lease", ElectionModel::single(Mechanism::Lease));
}

#[test]
fn the_sharded_model_keeps_its_properties() {
    check("sharded", ElectionModel::sharded());
}

#[test]
fn the_sharded_lease_model_keeps_its_properties() {
    check("sharded-lease", ElectionModel::sharded_lease());
}

/// The ranked models without faults, deep enough for the rollout's one move: the new version
/// comes up, the old leader yields to it after the window, and no other replica leads between.
#[test]
fn the_ranked_models_preempt_once_to_the_new_version() {
    for (name, mechanism) in [
        ("advisory-ranked", Mechanism::Advisory),
        ("lease-ranked", Mechanism::Lease),
    ] {
        let model = ElectionModel::ranked(mechanism).with_faults(0);
        let settings = Settings {
            timeout: Duration::from_secs(300),
            ..Settings::new(48)
        };
        let outcome = check::run(name, model, settings);
        assert!(
            outcome.figures.violated.is_empty(),
            "{name}: {:?}",
            outcome.figures.violated
        );
        let undiscovered = &outcome.figures.undiscovered;
        assert!(
            !undiscovered.contains(&"preempted by a better-ranked replica"),
            "{name}: {undiscovered:?}"
        );
    }
}
