//! The elector behind PgBouncer in transaction mode (`pool_mode = transaction`), which cannot
//! carry a session lock. PgBouncer is installed from Debian's packages when missing
//! (`plexsphere_leader_tests::PgBouncer`).
//!
//! Before the lock-verifying check, replicas behind such a pooler led without holding the lock
//! (the grant re-entered on a shared server session, and `SELECT 1` was answered by any server
//! session: two, then three leaders at once). Now the grant statement refuses a session that
//! already holds the lock, marking it `shared`, and the leader's check verifies its backend, its
//! `pg_locks` row and that mark: no replica leads through the pooler, and each says why. The
//! lock stays on PgBouncer's server session until that session goes idle for the
//! `idle_session_timeout` the first grant set on it.

mod fault_support;
mod support;

use std::time::Duration;

use fault_support::{Fleet, I, MARGIN, STARTUP};
use plexsphere_leader_tests::replica_process::{REPLICA_APP_PREFIX, wait_clean};
use plexsphere_leader_tests::{LockObserver, PgBouncer, PoolMode, TestDb};
use tokio::time::Instant;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_transaction_mode_pgbouncer_no_replica_leads_and_each_says_why() {
    let db = TestDb::create("fault_pgbouncer_tx").await.unwrap();
    let bouncer = PgBouncer::start(&db.config(), PoolMode::Transaction, 1)
        .await
        .unwrap();
    let observer = LockObserver::start(&db.config()).await.unwrap();
    let pooled = bouncer.pg_config(&db.config());
    let mut fleet = Fleet::new();
    // Alone behind the pooler, with one server session, `a` cannot tell it from a direct
    // connection: it takes the lock on PgBouncer's server session.
    let a = fleet.spawn("a", &pooled, I).await;
    fleet.wait_lead(a, STARTUP).await;
    let server_session = observer
        .wait_for_holder(MARGIN)
        .await
        .expect("the lock is on PgBouncer's server session");

    // `b`'s grant runs on the same server session: refused as shared, and `a`'s next check sees
    // the mark and demotes.
    let b = fleet.spawn("b", &pooled, I).await;
    let started = Instant::now();
    let (demoted, _) = fleet.wait_follow_since(a, started, 2 * I + MARGIN).await;
    println!("a demoted {:?} after b started", demoted - started);
    for _ in 0..10 {
        tokio::time::sleep(I / 2).await;
        assert!(
            fleet.leaders().is_empty(),
            "nobody leads through the pooler"
        );
    }
    for replica in [a, b] {
        let refused = fleet
            .get(replica)
            .logs("WARN", "leader: acquire lock connection");
        assert!(
            refused.iter().any(|line| line
                .str("message")
                .unwrap_or_default()
                .contains("PgBouncer in transaction mode")),
            "replica {replica} says why it does not lead: {refused:?}"
        );
    }
    let lost = fleet
        .get(a)
        .logs("WARN", "leader: lost background leader lock");
    assert!(
        lost.iter()
            .any(|line| line.str("message").unwrap_or_default().contains("shared")),
        "{lost:?}"
    );
    assert_eq!(
        observer.current().map(|holder| holder.pid),
        Some(server_session.pid),
        "the lock stays on the pooler's server session"
    );

    // Once the pooled replicas stop, the server session goes idle and its idle_session_timeout
    // ends it: a replica connected directly then leads.
    fleet.stop_all().await;
    let mut direct = Fleet::new();
    let c = direct.spawn("c", &db.config(), I).await;
    direct.wait_lead(c, 4 * I + I + MARGIN + STARTUP).await;
    assert_eq!(
        observer.max_granted(),
        1,
        "one session held the lock at a time"
    );
    direct.stop_all().await;
    drop(bouncer);
    if let Err(left) = wait_clean(db.admin(), REPLICA_APP_PREFIX, Duration::from_secs(10)).await {
        panic!("left on the server: {left}");
    }
    db.cleanup().await.unwrap();
}
