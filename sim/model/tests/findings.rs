//! What the model finds outside the documented bounds: pinned, so that a change that widens or
//! closes them shows up here.

use std::time::Duration;

use plexsphere_leader_model::check::{self, Settings};
use plexsphere_leader_model::engine::{ElectionModel, PauseClock};
use plexsphere_leader_model::single::Mechanism;

/// A lease leader whose clock stops while it is paused (a suspended host: Linux's
/// `CLOCK_MONOTONIC`, which `std::time::Instant` reads, does not count a suspension) resumes
/// trusting a lease the server has let expire: the lease's bound assumes a clock *rate* within
/// a tenth of the server's, and a stopped clock is outside it. A process merely stopped
/// (SIGSTOP, a GC pause) keeps its clock running and is covered by the CI check.
#[test]
fn a_lease_leader_whose_clock_stops_while_paused_outlives_its_row() {
    let mut model = ElectionModel::single(Mechanism::Lease);
    model.pause_clock = PauseClock::Stops;
    let settings = Settings {
        threads: 1,
        timeout: Duration::from_secs(120),
        first_failure: true,
        ..Settings::new(12)
    };
    let outcome = check::run("lease-clock-stops", model, settings);
    let property = "a lease believer trusts inside the row's expiry";
    let lines = outcome.counterexample(property);
    assert!(lines.is_some(), "found {:?}", outcome.figures.violated);
    for line in lines.unwrap_or_default() {
        println!("{line}");
    }
}

/// Closed: a lease member's renewal whose answer came after the renewal's deadline was taken
/// for the next renewal's answer (both named the member's one `ConnId`), so the member trusted
/// its shards 0.9·TTL from the newer renewal's sending, past the expiry the old renewal set
/// (the shortest path: two replicas, two faults, 16 steps; found by this model). Since, an
/// unanswered lease statement moves the member's statements to a new id, and the old answer is
/// stale. The same size of model now keeps the trust property everywhere.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "exhaustive to depth 18 (27 s in release): .ci/test runs it with --release"
)]
fn a_late_renewal_answer_is_stale_and_the_member_trusts_inside_its_row() {
    let model = ElectionModel::sharded_lease()
        .with_replicas(2)
        .with_faults(2);
    let settings = Settings {
        threads: 2,
        timeout: Duration::from_secs(300),
        ..Settings::new(18)
    };
    let outcome = check::run("sharded-lease-late-renewal", model, settings);
    let property = plexsphere_leader_model::sharded::props::TRUST;
    assert!(
        outcome.counterexample(property).is_none(),
        "violated: {:?}",
        outcome.figures.violated
    );
    assert!(outcome.figures.violated.is_empty(), "{:?}", outcome.figures);
    assert!(!outcome.figures.timed_out, "{:?}", outcome.figures);
}
