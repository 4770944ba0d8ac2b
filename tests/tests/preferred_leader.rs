//! Issue 41: a rolling deploy moves leadership once, to the newest version. A replica ranked
//! by its release number (`Config::version`) publishes its candidacy; the leader yields
//! (`TermEndCause::Yielded`) to a better-ranked candidate once it has been live for the window
//! W (two intervals) and the leader has led as long, and worse standbys defer to it, so the
//! grant goes straight to the newest replica. Both mechanisms (the advisory lock queued, the
//! lease, also behind PgBouncer in transaction mode with two server connections), both
//! backends (deadpool, sqlx), each on a database of its own; the version floor on a rollback
//! (with and without the override); the candidates the operator sees; the metrics.
//!
//! Bound: the new replica leads within W + the stop grace (zero here) + two intervals (its
//! first survey, and a check's round) + `MARGIN` (5 s) of its start; the two never lead at once
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

/// The Prometheus text of `registry`.
fn exposition(registry: &prometheus::Registry) -> String {
    let mut text = String::new();
    prometheus::TextEncoder::new()
        .encode_utf8(&registry.gather(), &mut text)
        .unwrap();
    text
}

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
    a_newer_replica_takes_over_once_via(name, backend, lease, false).await;
}

/// As [`a_newer_replica_takes_over_once`]; `bouncer`: through PgBouncer in transaction mode
/// with two server connections for the three replicas (the lease only).
async fn a_newer_replica_takes_over_once_via(
    name: &str,
    backend: Backend,
    lease: bool,
    bouncer: bool,
) {
    let db = TestDb::create(name).await.unwrap();
    if lease {
        let client = db.pool(1).unwrap().get().await.unwrap();
        plexsphere_leader::lease::setup(&client).await.unwrap();
    }
    let pooler = if bouncer {
        let mode = plexsphere_leader_tests::PoolMode::Transaction;
        Some(
            plexsphere_leader_tests::PgBouncer::start(&db.config(), mode, 2)
                .await
                .expect("PgBouncer"),
        )
    } else {
        None
    };
    let reached = match &pooler {
        Some(pooler) => pooler.pg_config(&db.config()),
        None => db.config(),
    };
    let pool = |size| backend.pool(&reached, size).unwrap();
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
    // The metrics say so: the yield counted by its cause, each replica's rank as a series.
    let text = exposition(&old.registry);
    assert!(
        text.lines().any(
            |line| line.starts_with("plexsphere_leader_transitions_total")
                && line.contains("cause=\"yielded\"")
                && line.ends_with(" 1")
        ),
        "{name}: {text}"
    );
    assert!(
        exposition(&new.registry).contains("version=\"1.10.0\""),
        "{name}: the rank series"
    );
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
    drop(pooler);
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_deadpool_behind_a_transaction_mode_pgbouncer_a_newer_replica_takes_over_once() {
    a_newer_replica_takes_over_once_via(
        "preferred_lease_bouncer_deadpool",
        Backend::Deadpool,
        true,
        true,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_sqlx_behind_a_transaction_mode_pgbouncer_a_newer_replica_takes_over_once() {
    a_newer_replica_takes_over_once_via("preferred_lease_bouncer_sqlx", Backend::Sqlx, true, true)
        .await;
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

/// The version floor on a rollback: once 2.0.0 led, a 1.9.0 replica never leads (and says it
/// is below the floor) even with no other replica left; allowed below the floor (a deliberate
/// rollback), a 1.9.0 replica leads and lowers the floor, after which plain 1.9.0 replicas may
/// lead again.
async fn the_floor_keeps_a_rollback_off_unless_allowed(name: &str, lease: bool) {
    let db = TestDb::create(name).await.unwrap();
    let client = db.pool(1).unwrap().get().await.unwrap();
    if lease {
        plexsphere_leader::lease::setup(&client).await.unwrap();
    } else {
        plexsphere_leader::floor::setup(&**client).await.unwrap();
    }
    let pool = |size| Backend::Deadpool.pool(&db.config(), size).unwrap();
    let floored = |version: &'static str, allowed: bool| {
        move |config: Config| {
            ranked(version, lease)(config.version_floor(true).below_version_floor(allowed))
        }
    };
    let new = Replica::spawn_with(pool(3), I, floored("2.0.0", false));
    wait_for(STARTUP, || new.elector.is_leader())
        .await
        .expect("2.0.0 leads");
    // Its surveys after its checks raised the floor.
    tokio::time::sleep(2 * I).await;
    new.stop().await.unwrap();
    let old = Replica::spawn_with(pool(3), I, floored("1.9.0", false));
    wait_for(STARTUP, || old.elector.is_below_version_floor())
        .await
        .expect("1.9.0 finds itself below the floor");
    let led = wait_for(4 * W, || old.elector.is_leader()).await;
    assert_eq!(led, None, "{name}: 1.9.0 never leads below the floor");
    let floor: String = client
        .query_one(
            &format!(
                "SELECT version FROM {}plexsphere_leader_floor",
                if lease { "public." } else { "" }
            ),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(floor, "2.0.0");
    // A deliberate rollback: allowed below the floor, it leads and lowers it.
    let rollback = Replica::spawn_with(pool(3), I, floored("1.9.0", true));
    wait_for(STARTUP, || rollback.elector.is_leader())
        .await
        .unwrap_or_else(|| panic!("{name}: the allowed rollback leads"));
    wait_for(STARTUP, || !old.elector.is_below_version_floor())
        .await
        .unwrap_or_else(|| panic!("{name}: the floor came down to 1.9.0"));
    rollback.stop().await.unwrap();
    wait_for(STARTUP, || old.elector.is_leader())
        .await
        .unwrap_or_else(|| panic!("{name}: a plain 1.9.0 leads once the floor is lowered"));
    old.stop().await.unwrap();
    db.cleanup().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_the_floor_keeps_a_rollback_off_unless_allowed() {
    the_floor_keeps_a_rollback_off_unless_allowed("preferred_floor_advisory", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_the_floor_keeps_a_rollback_off_unless_allowed() {
    the_floor_keeps_a_rollback_off_unless_allowed("preferred_floor_lease", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_candidates_show_each_standbys_rank_and_identity() {
    let db = TestDb::create("preferred_candidates").await.unwrap();
    let pool = |size| Backend::Deadpool.pool(&db.config(), size).unwrap();
    let old = Replica::spawn_with(pool(3), I, ranked("1.4.2", false));
    wait_for(STARTUP, || old.elector.is_leader())
        .await
        .expect("leads");
    let standby = Replica::spawn_with(pool(3), I, |config| {
        ranked("1.4.2", false)(config.priority(0)).identity("svc@standby")
    });
    tokio::time::sleep(3 * I).await;
    let candidates = old.elector.candidates().await.unwrap();
    let standby_rank = standby.elector.rank().unwrap();
    assert!(
        candidates
            .iter()
            .any(|c| c.identity == "svc@standby" && c.rank == standby_rank),
        "{candidates:?}"
    );
    assert_eq!(
        standby.elector.deferring_to(),
        None,
        "equal ranks never defer"
    );
    for replica in [standby, old] {
        replica.stop().await.unwrap();
    }
    db.cleanup().await.unwrap();
}
