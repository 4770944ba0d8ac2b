//! Faults on one session of an in-process replica (issue 16 §5), each test on its own database
//! of the shared local server, I = 200 ms, bounds asserted as `bound + MARGIN` (5 s):
//!
//! | scenario | expected outcome (bound) |
//! |----------|--------------------------|
//! | connection reset (RST) on the leader's lock session | the leader demotes with `SessionEnded` at once (≤ I); the server frees the lock with the session; the standby leads within 2·I |
//! | a standby's run cancelled while its grant's answer is outstanding | the run ends within one interval; the session the grant may have locked is closed, not pooled; the lock is free once the server sees the close |
//! | `pg_terminate_backend` of every session of the deployment, three times in a row | exactly one replica leads and holds the lock within 2·I of the last storm; never two granted rows |

// The scenarios run on both backends are plain functions called by the generated tests, so
// clippy's allowance for `unwrap` in tests does not see them.
#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use plexsphere_leader::{LossReason, TermEndCause};
use plexsphere_leader_tests::{Backend, Direction, FaultProxy, LockObserver, Mode, TestDb};
use support::{I, MARGIN, Replica, STARTUP, wait_for};
use tokio::time::Instant;

on_both_backends!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    a_reset_lock_session_demotes_at_once_and_the_standby_leads_within_two_intervals
);
async fn a_reset_lock_session_demotes_at_once_and_the_standby_leads_within_two_intervals(
    backend: Backend,
) {
    let db = TestDb::create(&format!("fault_rst_{backend}"))
        .await
        .unwrap();
    let proxy = FaultProxy::in_front_of(&db.config()).await.unwrap();
    let leader = Replica::spawn_as(
        backend
            .pool(&proxy.pg_config(&db.config_with_app_name("reset")), 2)
            .unwrap(),
        I,
        "reset",
    );
    wait_for(STARTUP, || leader.elector.is_leader())
        .await
        .expect("leads through the proxy");
    let standby = Replica::spawn_as(db.pool_with_app_name("standby", 2).unwrap(), I, "standby");
    let observer = LockObserver::start(&db.config()).await.unwrap();
    let first = observer.wait_for_holder(MARGIN).await.expect("held");

    let reset = Instant::now();
    assert!(proxy.reset_all().await >= 1, "the lock session was reset");
    let demoted = wait_for(I + MARGIN, || !leader.elector.is_leader())
        .await
        .expect("the leader demotes");
    let end = leader.elector.leadership().last_end().expect("term ended");
    assert_eq!(end.cause, TermEndCause::Lost(LossReason::SessionEnded));
    let successor = observer
        .wait_for_new_holder(first.pid, 2 * I + MARGIN)
        .await
        .expect("the standby takes the freed lock");
    let handover = reset.elapsed();
    assert_eq!(successor.application_name.as_deref(), Some("standby"));
    assert!(standby.elector.is_leader());
    assert!(
        handover <= 2 * I + MARGIN,
        "handover after the RST: {handover:?}"
    );
    assert_eq!(observer.max_granted(), 1, "never two granted rows");
    println!("RST: demoted after {demoted:?}, successor after {handover:?}");

    leader.stop().await.unwrap();
    standby.stop().await.unwrap();
    drop(proxy);
    db.cleanup().await.unwrap();
}

/// Deadpool only: sqlx's pool pings a pooled connection before it hands it out
/// (`test_before_acquire`, on by default), so with the answers held that ping never returns and
/// the grant is never sent: the scenario cannot arise on sqlx.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_cancelled_while_its_grant_is_unanswered_leaves_no_lock_in_the_pool() {
    let backend = Backend::Deadpool;
    let db = TestDb::create(&format!("fault_cancel_grant_{backend}"))
        .await
        .unwrap();
    let holder = Replica::spawn_as(db.pool_with_app_name("holder", 2).unwrap(), I, "holder");
    wait_for(STARTUP, || holder.elector.is_leader())
        .await
        .expect("the holder leads");
    let proxy = FaultProxy::in_front_of(&db.config()).await.unwrap();
    let pool = backend
        .pool(&proxy.pg_config(&db.config_with_app_name("cancelled")), 2)
        .unwrap();
    let standby = Replica::spawn_as(pool.clone(), I, "cancelled");
    let observer = LockObserver::start(&db.config()).await.unwrap();
    // The standby's sessions are open and refused at every check.
    wait_for(STARTUP, || proxy.accepted_count() >= 1)
        .await
        .expect("the standby connected");
    tokio::time::sleep(2 * I).await;

    // Answers to the standby stop arriving; the lock is freed, so its next grant is taken on
    // the server and its answer held in the proxy.
    proxy.set_mode(
        Direction::ServerToClient,
        Mode::Delay(Duration::from_secs(60)),
    );
    holder.stop().await.unwrap();
    let standby_backend = wait_for(2 * I + MARGIN, || {
        observer
            .current()
            .is_some_and(|h| h.application_name.as_deref() == Some("cancelled"))
    })
    .await
    .map(|_| observer.current().expect("held").pid)
    .expect("the standby's grant took the lock on the server");
    assert!(
        !standby.elector.is_leader(),
        "its answer is outstanding: not a leader yet"
    );

    let elector = standby.elector.clone();
    let cancelled = Instant::now();
    standby.stop().await.unwrap();
    let run_ended = cancelled.elapsed();
    assert!(run_ended <= I + MARGIN, "the run ended after {run_ended:?}");
    assert!(elector.leadership().last_end().is_none(), "it never led");
    // The client closed the session (its FIN goes through: only answers are held), so the
    // server ends the backend and frees the lock.
    assert!(
        observer.wait_for_no_holder(MARGIN).await,
        "the lock of backend {standby_backend} is freed, not kept in the pool"
    );
    assert_eq!(
        pool.size(),
        pool.idle(),
        "every session left in the pool is idle"
    );
    println!("cancel during the grant: run ended after {run_ended:?}; lock freed");

    drop(proxy);
    db.cleanup().await.unwrap();
}

on_both_backends!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    after_a_terminate_storm_on_every_session_exactly_one_replica_leads_within_two_intervals
);
async fn after_a_terminate_storm_on_every_session_exactly_one_replica_leads_within_two_intervals(
    backend: Backend,
) {
    const REPLICAS: usize = 4;
    let db = TestDb::create(&format!("fault_terminate_storm_{backend}"))
        .await
        .unwrap();
    let replicas: Vec<Replica> = (0..REPLICAS)
        .map(|i| {
            let name = format!("storm-{i}");
            Replica::spawn_as(db.backend_pool(backend, &name, 2).unwrap(), I, &name)
        })
        .collect();
    let observer = LockObserver::start(&db.config()).await.unwrap();
    observer.wait_for_holder(STARTUP).await.expect("one leads");

    let mut terminated = 0;
    for _ in 0..3 {
        for session in db.sessions_of("storm-").await.unwrap() {
            if db.terminate(session.pid).await.unwrap() {
                terminated += 1;
            }
        }
        tokio::time::sleep(I / 2).await;
    }
    let storm_over = Instant::now();
    assert!(terminated >= REPLICAS, "terminated {terminated} sessions");

    let settled = wait_for(2 * I + MARGIN, || {
        replicas.iter().filter(|r| r.elector.is_leader()).count() == 1
            && observer.current().is_some()
    })
    .await
    .expect("exactly one replica leads and holds the lock");
    let leader = replicas
        .iter()
        .find(|r| r.elector.is_leader())
        .expect("one leads");
    let holder = observer.current().expect("held");
    assert_eq!(
        holder.application_name.as_deref(),
        Some(leader.elector.identity()),
        "the leader is the lock's holder"
    );
    assert!(
        replicas.iter().any(|r| r
            .elector
            .leadership()
            .last_end()
            .is_some_and(|end| end.cause == TermEndCause::Lost(LossReason::SessionEnded))),
        "the storm ended a term"
    );
    // It stays so.
    tokio::time::sleep(3 * I).await;
    assert_eq!(replicas.iter().filter(|r| r.elector.is_leader()).count(), 1);
    assert_eq!(observer.max_granted(), 1, "never two granted rows");
    println!(
        "terminate storm: {terminated} sessions ended; one leader {settled:?} after the last \
         round ({:?} since)",
        storm_over.elapsed()
    );

    for replica in replicas {
        replica.stop().await.unwrap();
    }
    db.cleanup().await.unwrap();
}
