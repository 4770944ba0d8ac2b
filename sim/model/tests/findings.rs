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

/// A lease member's renewal whose answer comes after the renewal's deadline is taken for the
/// next renewal's answer: the deadline passes (with the next check: a new renewal is sent), then
/// the old answer is fed, and the core takes it for the new renewal's (both name the member's one
/// `ConnId`): it trusts its shards 0.9·TTL from the new renewal's sending, past the expiry the
/// old renewal set. The shortest path (two replicas, two faults, 16 steps): cut off just after
/// sending a renewal, the renewal lands late, the deadline sends a new one (lost), the heal lets
/// the old answer in. The adapter's driver feeds such an answer whenever it arrived by the time
/// the driver wakes for the deadline (`Driver::complete` fires the due timers, then feeds the
/// completion), as when a process paused with its renewal in flight resumes (three replicas,
/// 19 steps at `--faults 2`).
#[test]
fn a_late_renewal_answer_taken_for_the_next_outlives_the_member_row() {
    let model = ElectionModel::sharded_lease()
        .with_replicas(2)
        .with_faults(2);
    let settings = Settings {
        threads: 1,
        timeout: Duration::from_secs(300),
        first_failure: true,
        ..Settings::new(20)
    };
    let outcome = check::run("sharded-lease-late-renewal", model, settings);
    let property = plexsphere_leader_model::sharded::props::TRUST;
    let lines = outcome.counterexample(property);
    assert!(lines.is_some(), "found {:?}", outcome.figures.violated);
    for line in lines.unwrap_or_default() {
        println!("{line}");
    }
}
