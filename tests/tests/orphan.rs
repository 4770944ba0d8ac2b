//! The bound on an orphaned lock session: `idle_session_timeout` = 4 × CheckInterval is set on
//! the lock session, and a leader cut off without a FIN or RST loses the lock on the server
//! within four intervals of its last query, while it demotes itself within two.

// The scenarios run on both backends are plain functions called by the generated tests, so
// clippy's allowance for `unwrap` in tests does not see them.
#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use plexsphere_leader_tests::{Backend, FaultProxy, LockObserver, Mode, TestDb};
use support::{I, MARGIN, Replica, STARTUP, lock_holders, wait_for};
use tokio::time::Instant;

on_both_backends!(
    #[tokio::test]
    the_grant_sets_idle_session_timeout_to_four_intervals_on_the_lock_session
);
async fn the_grant_sets_idle_session_timeout_to_four_intervals_on_the_lock_session(
    backend: Backend,
) {
    // A long interval leaves the grant statement in pg_stat_activity until the first ping.
    let interval = Duration::from_secs(2);
    let db = TestDb::create(&format!("idle_timeout_set_{backend}"))
        .await
        .unwrap();
    let replica = Replica::spawn(db.backend_pool(backend, "lock", 2).unwrap(), interval);
    wait_for(STARTUP, || replica.elector.is_leader())
        .await
        .expect("leads");
    let pid = lock_holders(&db).await[0];
    let query: String = db
        .admin()
        .query_one("SELECT query FROM pg_stat_activity WHERE pid = $1", &[&pid])
        .await
        .unwrap()
        .get(0);
    assert!(
        query.contains("set_config('idle_session_timeout', '8000', false)"),
        "the lock session's last statement: {query}"
    );
    replica.stop().await.unwrap();
    db.cleanup().await.unwrap();
}

on_both_backends!(
    #[tokio::test]
    a_leader_cut_off_without_fin_loses_the_lock_within_four_intervals_and_demotes_within_two
);
async fn a_leader_cut_off_without_fin_loses_the_lock_within_four_intervals_and_demotes_within_two(
    backend: Backend,
) {
    let db = TestDb::create(&format!("orphan_bound_{backend}"))
        .await
        .unwrap();
    let proxy = FaultProxy::in_front_of(&db.config()).await.unwrap();
    let cut_off = Replica::spawn(
        backend
            .pool(&proxy.pg_config(&db.config_with_app_name("cut-off")), 2)
            .unwrap(),
        I,
    );
    wait_for(STARTUP, || cut_off.elector.is_leader())
        .await
        .expect("leads through the proxy");
    let standby = Replica::spawn_as(db.pool_with_app_name("standby", 2).unwrap(), I, "standby");
    let observer = LockObserver::start(&db.config()).await.unwrap();
    let orphan = observer
        .wait_for_holder(MARGIN)
        .await
        .expect("the lock is held");
    // Let a ping through, so the server saw a query just before the cut.
    tokio::time::sleep(I + I / 2).await;

    proxy.set_both(Mode::Blackhole);
    let cut = Instant::now();

    let demoted = wait_for(2 * I + MARGIN, || !cut_off.elector.is_leader())
        .await
        .expect("the leader demotes when its check goes unanswered");
    assert!(demoted <= 2 * I + MARGIN, "demoted after {demoted:?}");

    let new_holder = observer
        .wait_for_new_holder(orphan.pid, 5 * I + MARGIN)
        .await
        .expect("the server ends the orphaned session and a standby takes the lock");
    let freed_after = cut.elapsed();
    assert!(
        freed_after <= 4 * I + I + MARGIN,
        "lock freed and retaken after {freed_after:?}"
    );
    assert!(standby.elector.is_leader());
    assert_eq!(new_holder.application_name.as_deref(), Some("standby"));
    assert_eq!(observer.max_granted(), 1, "never two granted rows");
    // Without the idle timeout the session would live until TCP gives up (hours).
    assert!(
        freed_after >= 2 * I,
        "not freed before the idle timeout could fire: {freed_after:?}"
    );

    cut_off.stop().await.unwrap();
    standby.stop().await.unwrap();
    drop(proxy);
    db.cleanup().await.unwrap();
}

on_both_backends!(
    #[tokio::test]
    a_graceful_stop_while_the_lock_session_is_blackholed_ends_in_budget_and_says_unanswered
);
/// A graceful stop whose unlock never gets an answer (the lock session blackholed: no FIN, no
/// RST) ends the run within the stop budget (grace, then the 2-second unlock), publishes the
/// release as unanswered rather than released, and the server frees the orphan by the
/// `idle_session_timeout` the grant set (4·I), after which the standby leads.
async fn a_graceful_stop_while_the_lock_session_is_blackholed_ends_in_budget_and_says_unanswered(
    backend: Backend,
) {
    let db = TestDb::create(&format!("orphan_blackholed_stop_{backend}"))
        .await
        .unwrap();
    let proxy = FaultProxy::in_front_of(&db.config()).await.unwrap();
    let leader = Replica::spawn(
        backend
            .pool(&proxy.pg_config(&db.config_with_app_name("blackholed")), 2)
            .unwrap(),
        I,
    );
    wait_for(STARTUP, || leader.elector.is_leader())
        .await
        .expect("leads through the proxy");
    let standby = Replica::spawn_as(db.pool_with_app_name("standby", 2).unwrap(), I, "standby");
    let observer = LockObserver::start(&db.config()).await.unwrap();
    let orphan = observer
        .wait_for_holder(MARGIN)
        .await
        .expect("the lock is held");
    let elector = leader.elector.clone();
    let budget = elector.stop_budget();

    proxy.set_both(Mode::Blackhole);
    let cut = Instant::now();
    let stop = tokio::spawn(async move {
        leader.stop().await.expect("the run ends");
        cut.elapsed()
    });
    // The server frees the orphan by the idle timeout while the unlock still waits.
    let new_holder = observer
        .wait_for_new_holder(orphan.pid, 4 * I + I + MARGIN)
        .await
        .expect("the server ends the orphaned session and the standby takes the lock");
    let freed_after = cut.elapsed();
    let stopped_after = stop.await.unwrap();
    assert!(
        stopped_after <= budget + MARGIN,
        "the run ended {stopped_after:?} after the stop, budget {budget:?}"
    );
    let leadership = elector.leadership();
    let end = leadership.last_end().expect("the term ended");
    assert_eq!(end.cause, plexsphere_leader::TermEndCause::Stopped);
    let release = leadership.last_release().expect("the release is published");
    assert_eq!(release.term, end.id);
    assert_eq!(
        release.outcome,
        plexsphere_leader::leadership::ReleaseOutcome::Unanswered(
            plexsphere_leader::config::UNLOCK_BUDGET
        ),
        "the unlock got no answer: {}",
        release.outcome
    );
    assert!(!release.outcome.is_confirmed());

    assert_eq!(new_holder.application_name.as_deref(), Some("standby"));
    assert!(
        freed_after <= 4 * I + I + MARGIN,
        "freed and retaken after {freed_after:?}"
    );
    assert!(standby.elector.is_leader());
    assert_eq!(observer.max_granted(), 1, "never two granted rows");
    println!(
        "blackholed stop: run ended after {stopped_after:?} (budget {budget:?}); lock freed and \
         retaken after {freed_after:?} (idle timeout {:?})",
        4 * I
    );

    standby.stop().await.unwrap();
    drop(proxy);
    db.cleanup().await.unwrap();
}
