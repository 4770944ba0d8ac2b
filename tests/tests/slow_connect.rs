//! Connection setups slower than one check interval, against the real local PostgreSQL behind
//! the fault proxy. A standby's acquire is bounded by one interval, connection setup included;
//! the check that gives up on a setup no longer cancels it: the next check resumes it
//! (`PoolSessions`, benchmarks finding 2: a cold start of 100 electors at I = 50 ms).

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use plexsphere_leader::session::PoolSessions;
use plexsphere_leader::{Config, Elector, RunError};
use plexsphere_leader_tests::{FaultProxy, Mode, TestDb, pool_for};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Scheduling slack of a loaded test machine.
const MARGIN: Duration = Duration::from_millis(1_000);

/// How long a source that has never connected keeps a setup its check gave up on: twice the
/// longer of the check's wait and 1 s (`session::setup`).
const FIRST_BOUND: Duration = Duration::from_secs(2);

/// An elector on `sessions`, running.
fn spawn(
    sessions: &PoolSessions,
    interval: Duration,
) -> (Elector, CancellationToken, JoinHandle<Result<(), RunError>>) {
    let elector =
        Elector::new(Config::with_sessions(sessions.clone()).check_interval(interval)).unwrap();
    let shutdown = CancellationToken::new();
    let run = tokio::spawn({
        let (elector, shutdown) = (elector.clone(), shutdown.clone());
        async move { elector.run(shutdown).await }
    });
    (elector, shutdown, run)
}

/// How long until `elector` leads, if it does within `timeout`.
async fn leads_within(elector: &Elector, timeout: Duration) -> Option<Duration> {
    let started = Instant::now();
    let mut leadership = elector.subscribe();
    tokio::time::timeout(timeout, leadership.wait_for(|l| l.is_leader()))
        .await
        .ok()
        .map(|_| started.elapsed())
}

/// Every byte waits `DELAY` in the proxy, each way: a round trip takes 400 ms, two thirds of
/// the interval. A check's statement (one round trip) fits in an interval; a connection's setup
/// (the startup, then `ObservedConnect`'s `SELECT pg_backend_pid()`: two round trips) does not.
/// Before, each check cancelled the setup it had begun and the elector never led.
#[tokio::test]
async fn a_connection_slower_to_set_up_than_one_interval_is_resumed_and_leads() {
    const I: Duration = Duration::from_millis(600);
    const DELAY: Duration = Duration::from_millis(200);
    let db = TestDb::create("slow_connect_resumed").await.unwrap();
    let proxy = FaultProxy::in_front_of(&db.config()).await.unwrap();
    proxy.set_both(Mode::Delay(DELAY));
    let sessions = PoolSessions::new(pool_for(proxy.pg_config(&db.config()), 2).unwrap());
    let (elector, shutdown, run) = spawn(&sessions, I);

    // The first check gives up at I; the second resumes the setup, which ends at about
    // 4·DELAY, and its grant statement answers one round trip later.
    let took = leads_within(&elector, 10 * I).await;
    let took = took.expect("leads although every connection takes longer than I to set up");
    assert!(
        took <= 2 * I + MARGIN,
        "leads at the second check: took {took:?}"
    );
    let late = sessions.late_setups();
    assert!(late.finished >= 1, "the setup was finished late: {late:?}");
    assert_eq!(late.given_up, 0, "{late:?}");
    assert_eq!(
        proxy.accepted_count(),
        1,
        "one connection was set up, not one per check"
    );

    // Its checks fit in an interval: it keeps leading.
    tokio::time::sleep(3 * I).await;
    assert!(elector.is_leader(), "still leads");

    shutdown.cancel();
    run.await.unwrap().unwrap();
    drop(proxy);
    db.cleanup().await.unwrap();
}

/// A setup whose startup bytes were lost never ends: it is resumed only until its bound
/// (`FIRST_BOUND` after it began, for an elector that never connected), then given up, and
/// the next check begins a new one. This is the price of resuming: after a blackhole heals,
/// the first connection waits for the bound instead of the next check. (Once the source has
/// connected quickly, the bound is two intervals: the unit tests of `session::setup`.)
#[tokio::test]
async fn a_setup_that_hangs_is_given_up_at_its_bound_and_a_new_one_leads() {
    const I: Duration = Duration::from_millis(200);
    let db = TestDb::create("slow_connect_hangs").await.unwrap();
    let proxy = FaultProxy::in_front_of(&db.config()).await.unwrap();
    proxy.set_both(Mode::Blackhole);
    let sessions = PoolSessions::new(pool_for(proxy.pg_config(&db.config()), 2).unwrap());
    let started = Instant::now();
    let (elector, shutdown, run) = spawn(&sessions, I);

    tokio::time::sleep(3 * I / 2).await;
    proxy.set_both(Mode::Forward);
    let took = leads_within(&elector, FIRST_BOUND + 10 * I).await;
    took.expect("leads once the hung setup is given up");
    let took = started.elapsed();
    assert!(
        took >= FIRST_BOUND && took <= FIRST_BOUND + 2 * I + MARGIN,
        "leads after the first setup's bound: took {took:?}"
    );
    let late = sessions.late_setups();
    assert!(late.given_up >= 1, "the hung setup was given up: {late:?}");

    shutdown.cancel();
    run.await.unwrap().unwrap();
    drop(proxy);
    db.cleanup().await.unwrap();
}
