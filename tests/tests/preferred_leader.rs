//! Issue 41: a rolling deploy moves leadership once, to the newest version. A replica ranked
//! by its release number (`Config::version`) publishes its candidacy; the leader yields
//! (`TermEndCause::Yielded`) to a better-ranked candidate once it has been live for the window
//! W (two intervals) and the leader has led as long, and worse standbys defer to it, so the
//! grant goes straight to the newest replica. Both mechanisms (the advisory lock queued, the
//! lease), both backends (deadpool, sqlx), each on a database of its own.
//!
//! Bound: the new replica leads within W + the stop grace (zero here) + two intervals (its
//! first survey, and a check's round) + `MARGIN` (2 s) of its start; the two never lead at once
//! (sampled every 5 ms); leadership never goes back to the old version, nor to a third, older
//! replica started after (watched for 4 W).
#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use plexsphere_leader::config::AcquireMode;
use plexsphere_leader::{Config, TermEndCause};
use plexsphere_leader_tests::{Backend, TestDb};
use support::{I, MARGIN, Replica, STARTUP, wait_for};
use tokio::time::Instant;

/// The default window: two intervals.
const W: Duration = Duration::from_millis(2 * I.as_millis() as u64);

fn ranked(version: &'static str, lease: bool) -> impl FnOnce(Config) -> Config {
    move |config| {
        let config = config
            .version(version)
            .identity(format!("svc@{version}"))
            .stop_grace(Duration::ZERO);
        if lease {
            config.lease(Duration::ZERO)
        } else {
            config.acquire_mode(AcquireMode::Queue)
        }
    }
}

async fn a_newer_replica_takes_over_once(name: &str, backend: Backend, lease: bool) {
    let db = TestDb::create(name).await.unwrap();
    if lease {
        let client = db.pool(1).unwrap().get().await.unwrap();
        plexsphere_leader::lease::setup(&client).await.unwrap();
    }
    let pool = |size| backend.pool(&db.config(), size).unwrap();
    let old = Replica::spawn_with(pool(3), I, ranked("1.4.2", lease));
    wait_for(STARTUP, || old.elector.is_leader())
        .await
        .expect("the old version leads first");
    let started = Instant::now();
    let new = Replica::spawn_with(pool(3), I, ranked("1.10.0", lease));
    let bound = W + 2 * I + MARGIN;
    let mut both = false;
    let took = wait_for(bound, || {
        both |= old.elector.is_leader() && new.elector.is_leader();
        new.elector.is_leader()
    })
    .await
    .unwrap_or_else(|| panic!("{name}: the newer replica leads within {bound:?}"));
    println!(
        "{name}: the newer replica led {took:?} after its start ({:?} after)",
        started.elapsed()
    );
    assert!(!both, "{name}: the two never lead at once");
    assert!(!old.elector.is_leader(), "{name}: the old one gave way");
    // The old leader's term ended as yielded.
    let ended = old
        .elector
        .subscribe()
        .borrow()
        .last_end()
        .map(|end| end.cause);
    assert_eq!(ended, Some(TermEndCause::Yielded), "{name}");
    // An older replica started afterwards never leads, and leadership stays put.
    let older = Replica::spawn_with(pool(3), I, ranked("1.4.0", lease));
    let watched = wait_for(4 * W, || {
        !new.elector.is_leader() || older.elector.is_leader()
    })
    .await;
    assert_eq!(watched, None, "{name}: the newest keeps leading");
    assert!(!old.elector.is_leader());
    for replica in [older, old, new] {
        replica.stop().await.unwrap();
    }
    db.cleanup().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_deadpool_a_newer_replica_takes_over_once() {
    a_newer_replica_takes_over_once("preferred_advisory_deadpool", Backend::Deadpool, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_sqlx_a_newer_replica_takes_over_once() {
    a_newer_replica_takes_over_once("preferred_advisory_sqlx", Backend::Sqlx, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_deadpool_a_newer_replica_takes_over_once() {
    a_newer_replica_takes_over_once("preferred_lease_deadpool", Backend::Deadpool, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_sqlx_a_newer_replica_takes_over_once() {
    a_newer_replica_takes_over_once("preferred_lease_sqlx", Backend::Sqlx, true).await;
}

#[test]
fn a_version_that_is_no_release_number_is_refused_before_any_run() {
    let mut config = deadpool_postgres::Config::new();
    config.dbname = Some("never_reached".into());
    let pool = config.create_pool(None, tokio_postgres::NoTls).unwrap();
    let error = plexsphere_leader::Elector::new(Config::new(pool).version("1.x")).unwrap_err();
    assert!(
        error.to_string().contains("not a release number"),
        "{error}"
    );
}
