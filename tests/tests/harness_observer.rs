//! `LockObserver` against the real local server: it sees the leader lock taken with the
//! spec's key and its release, ignores other keys, and measures leaderless gaps.
#![allow(clippy::unwrap_used)] // Tests: a failed unwrap is a failed test.

use std::time::Duration;

use plexsphere_leader_tests::{LockObserver, TestDb};
use tokio::time::Instant;
use tokio_postgres::Client;

const WAIT: Duration = Duration::from_secs(5);

async fn pid(client: &Client) -> i32 {
    client
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0)
}

async fn one_bool(client: &Client, sql: &str) -> bool {
    client.query_one(sql, &[]).await.unwrap().get(0)
}

#[tokio::test]
async fn sees_the_leader_lock_taken_and_released() {
    let db = TestDb::create("observer_lock").await.unwrap();
    let observer = LockObserver::start(&db.config()).await.unwrap();
    assert_eq!(observer.current(), None);
    assert!(observer.polls() >= 1, "the first poll answered in start");

    let a = db.connect("replica-a").await.unwrap();
    assert!(one_bool(&a, "SELECT pg_try_advisory_lock(1886156915, 1)").await);
    let holder = observer.wait_for_holder(WAIT).await.expect("a holder");
    assert_eq!(holder.pid, pid(&a).await);
    assert_eq!(holder.application_name.as_deref(), Some("replica-a"));
    assert!(holder.client_addr.is_some() && holder.client_port.is_some());
    assert_eq!(observer.current(), Some(holder.clone()));

    assert!(one_bool(&a, "SELECT pg_advisory_unlock(1886156915, 1)").await);
    assert!(observer.wait_for_no_holder(WAIT).await);
    let timeline = observer.timeline();
    let holders: Vec<Option<i32>> = timeline
        .iter()
        .map(|c| c.holder.as_ref().map(|h| h.pid))
        .collect();
    assert_eq!(holders, [None, Some(holder.pid), None]);
    assert!(timeline.windows(2).all(|w| w[0].at <= w[1].at));
    assert_eq!(observer.max_granted(), 1);
    assert_eq!(observer.errors(), 0);
    db.cleanup().await.unwrap();
}

#[tokio::test]
async fn other_advisory_keys_are_not_the_leader_lock() {
    let db = TestDb::create("observer_other_keys").await.unwrap();
    let observer = LockObserver::start_with_interval(&db.config(), Duration::from_millis(20))
        .await
        .unwrap();
    let a = db.connect("other").await.unwrap();
    assert!(one_bool(&a, "SELECT pg_try_advisory_lock(1886156915, 2)").await);
    assert!(
        one_bool(
            &a,
            "SELECT pg_try_advisory_lock((1886156915::bigint << 32) | 1)"
        )
        .await
    );
    assert!(one_bool(&a, "SELECT pg_try_advisory_lock(1, 1886156915)").await);
    let polls = observer.polls();
    assert!(
        observer
            .wait_for_holder(Duration::from_millis(300))
            .await
            .is_none()
    );
    assert!(observer.polls() > polls, "it kept polling");
    assert_eq!(observer.timeline().len(), 1);
    db.cleanup().await.unwrap();
}

#[tokio::test]
async fn a_lock_in_another_database_is_not_seen() {
    let watched = TestDb::create("observer_watched").await.unwrap();
    let other = TestDb::create("observer_other_db").await.unwrap();
    let observer = LockObserver::start(&watched.config()).await.unwrap();
    let a = other.connect("elsewhere").await.unwrap();
    assert!(one_bool(&a, "SELECT pg_try_advisory_lock(1886156915, 1)").await);
    assert!(
        observer
            .wait_for_holder(Duration::from_millis(300))
            .await
            .is_none()
    );
    watched.cleanup().await.unwrap();
    other.cleanup().await.unwrap();
}

#[tokio::test]
async fn measures_the_leaderless_gap_of_a_handover() {
    let db = TestDb::create("observer_gap").await.unwrap();
    let observer = LockObserver::start_with_interval(&db.config(), Duration::from_millis(20))
        .await
        .unwrap();
    let a = db.connect("replica-a").await.unwrap();
    let b = db.connect("replica-b").await.unwrap();
    let pid_a = pid(&a).await;

    assert!(one_bool(&a, "SELECT pg_try_advisory_lock(1886156915, 1)").await);
    observer.wait_for_holder(WAIT).await.expect("a leads");
    drop(a); // the session ends, the server releases the lock
    assert!(observer.wait_for_no_holder(WAIT).await);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(one_bool(&b, "SELECT pg_try_advisory_lock(1886156915, 1)").await);
    let next = observer
        .wait_for_new_holder(pid_a, WAIT)
        .await
        .expect("b leads");
    assert_eq!(next.application_name.as_deref(), Some("replica-b"));

    let gaps = observer.leaderless_gaps(Instant::now());
    assert_eq!(gaps.len(), 1, "{gaps:?}");
    let gap = gaps[0].duration();
    assert!(
        gap >= Duration::from_millis(250) && gap < Duration::from_secs(3),
        "gap {gap:?}"
    );
    let intervals = observer.holder_intervals(Instant::now());
    let labels: Vec<&str> = intervals.iter().map(|i| i.replica.as_str()).collect();
    assert_eq!(labels.len(), 2);
    assert!(labels[0].starts_with("replica-a#") && labels[1].starts_with("replica-b#"));
    db.cleanup().await.unwrap();
}
