//! `Cluster`: a throwaway server that starts, stops, restarts (ending session locks) and fails
//! over to a promoted standby. Each step prints how long it took (`--nocapture` shows it).
#![allow(clippy::unwrap_used)] // Tests: a failed unwrap is a failed test.

use std::time::Duration;

use plexsphere_leader_tests::{Cluster, LockObserver, StopMode, TestDb};
use tokio::time::Instant;
use tokio_postgres::Client;

async fn try_lock(client: &Client) -> bool {
    client
        .query_one("SELECT pg_try_advisory_lock(1886156915, 1)", &[])
        .await
        .unwrap()
        .get(0)
}

#[tokio::test]
async fn start_stop_restart_and_a_session_lock_dies_with_a_restart() {
    let t = Instant::now();
    let cluster = Cluster::start().await.unwrap();
    eprintln!("cluster start: {:?}", t.elapsed());
    assert!(cluster.is_running());
    assert!(cluster.dir().join("data").join("PG_VERSION").exists());
    assert!(!cluster.is_in_recovery().await.unwrap());

    // A TestDb on the cluster, and a lock held by a session of it.
    let db = TestDb::create_on(cluster.config("postgres"), "cluster")
        .await
        .unwrap();
    let observer = LockObserver::start(&db.config()).await.unwrap();
    let leader = db.connect("replica-a").await.unwrap();
    assert!(try_lock(&leader).await);
    let first = observer
        .wait_for_holder(Duration::from_secs(5))
        .await
        .unwrap();

    let t = Instant::now();
    cluster.restart(StopMode::Fast).await.unwrap();
    eprintln!("cluster restart (fast): {:?}", t.elapsed());
    assert!(
        leader.simple_query("SELECT 1").await.is_err(),
        "the session died"
    );
    let next = db.connect("replica-b").await.unwrap();
    assert!(try_lock(&next).await, "the lock died with the session");
    let holder = observer
        .wait_for_new_holder(first.pid, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(holder.application_name.as_deref(), Some("replica-b"));
    assert!(
        observer.reconnects() >= 1,
        "the observer's session died too"
    );

    let t = Instant::now();
    cluster.stop(StopMode::Immediate).await.unwrap();
    eprintln!("cluster stop (immediate): {:?}", t.elapsed());
    assert!(!cluster.is_running());
    assert!(db.connect("replica-c").await.is_err(), "nothing listens");

    let t = Instant::now();
    cluster.start_again().await.unwrap();
    eprintln!("cluster start again (crash recovery): {:?}", t.elapsed());
    let c = db.connect("replica-c").await.unwrap();
    assert!(try_lock(&c).await);
    drop(observer);
    db.cleanup().await.unwrap();

    let dir = cluster.dir().to_owned();
    drop(cluster);
    assert!(!dir.exists(), "Drop removes the directory");
}

#[tokio::test]
async fn a_standby_is_promoted_after_the_primary_stops() {
    let primary = Cluster::start().await.unwrap();
    let p = primary.connect("postgres").await.unwrap();
    p.batch_execute("CREATE TABLE marker (v int); INSERT INTO marker VALUES (7)")
        .await
        .unwrap();

    let t = Instant::now();
    let standby = Cluster::start_standby_of(&primary).await.unwrap();
    eprintln!("standby creation (basebackup + start): {:?}", t.elapsed());
    assert_ne!(standby.port(), primary.port());
    assert!(standby.is_in_recovery().await.unwrap());
    let s = standby.connect("postgres").await.unwrap();
    let v: i32 = s
        .query_one("SELECT v FROM marker", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(v, 7);
    assert!(
        s.batch_execute("INSERT INTO marker VALUES (8)")
            .await
            .is_err(),
        "read-only"
    );

    primary.stop(StopMode::Immediate).await.unwrap();
    let t = Instant::now();
    standby.promote().await.unwrap();
    eprintln!("promotion: {:?}", t.elapsed());
    assert!(!standby.is_in_recovery().await.unwrap());
    let s = standby.connect("postgres").await.unwrap();
    s.batch_execute("INSERT INTO marker VALUES (8)")
        .await
        .unwrap();
    assert!(try_lock(&s).await, "the promoted server grants the lock");
}
