//! The elector behind PgBouncer in transaction mode (`pool_mode = transaction`), which the
//! reference says cannot carry a session lock. PgBouncer is installed from Debian's packages when
//! missing (`plexsphere_leader_tests::PgBouncer`).
//!
//! # FINDING: this test asserts the CURRENT, WRONG behaviour
//!
//! The requirement is that a replica never leads on a lock it does not hold. Behind a
//! transaction-mode pooler the elector does: its grant statement runs on whichever server
//! session PgBouncer picks, the lock stays on that server session when PgBouncer hands it to the
//! next client, and the leader's check, `SELECT 1`, is answered by any server session. This
//! test pins down exactly what happens today, so that the lock-verifying check of a later issue
//! turns it red; when that lands, invert the marked assertions (each replica must then demote
//! within 2·I, and no two may lead at once):
//!
//! 1. With one server session (`default_pool_size = 1`), a second replica's grant runs on the
//!    session that already holds the lock for the first; advisory locks are re-entrant per
//!    session, so it is granted: **two replicas lead at once, for as long as they run**, while
//!    `pg_locks` shows one granted row.
//! 2. After `pg_terminate_backend` of that server session the lock is gone from the server, but
//!    PgBouncer answers both leaders' `SELECT 1` on a fresh server session: **both keep leading
//!    while nobody holds the lock**.
//! 3. A replica connected directly then takes the free lock: **three replicas lead at once**.
//! 4. On a graceful stop, the unlock runs on a server session that holds nothing:
//!    `pg_advisory_unlock` answers `false`, logged at WARN (`leader: release background leader
//!    lock`).

mod fault_support;
mod support;

use std::time::Duration;

use fault_support::{Fleet, I, MARGIN, STARTUP, ready_at};
use plexsphere_leader_tests::replica_process::{REPLICA_APP_PREFIX, wait_clean};
use plexsphere_leader_tests::{LockObserver, PgBouncer, PoolMode, TestDb};
use tokio::time::Instant;

/// The first moment at or after `after` that lies midway in the longest quiet span between the
/// pings of replicas whose checks run on the grids `ready + k·I`: no ping is in flight then.
fn between_pings(readies: &[Instant], after: Instant) -> Instant {
    let t0 = *readies.iter().min().expect("replicas");
    let period = I.as_nanos();
    let phase = |t: Instant| t.saturating_duration_since(t0).as_nanos() % period;
    let mut phases: Vec<u128> = readies.iter().map(|r| phase(*r)).collect();
    phases.sort_unstable();
    let (mut start, mut width) = (0, 0);
    for (i, p) in phases.iter().enumerate() {
        let next = phases.get(i + 1).copied().unwrap_or(phases[0] + period);
        if next - p > width {
            (start, width) = (*p, next - p);
        }
    }
    let quiet = (start + width / 2) % period;
    let offset = (quiet + period - phase(after)) % period;
    after + Duration::from_nanos(u64::try_from(offset).expect("below one interval"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finding_behind_a_transaction_mode_pgbouncer_replicas_lead_without_holding_the_lock() {
    let db = TestDb::create("fault_pgbouncer_tx").await.unwrap();
    let bouncer = PgBouncer::start(&db.config(), PoolMode::Transaction, 1)
        .await
        .unwrap();
    let observer = LockObserver::start(&db.config()).await.unwrap();
    let pooled = bouncer.pg_config(&db.config());
    let mut fleet = Fleet::new();
    let a = fleet.spawn("a", &pooled, I).await;
    fleet.wait_lead(a, STARTUP).await;
    let server_session = observer
        .wait_for_holder(MARGIN)
        .await
        .expect("the lock is on PgBouncer's server session");
    println!("lock held by server session {server_session:?}");

    // 1. FINDING (current behaviour): the second replica's grant is answered `true` on the same
    //    server session, and both lead.
    let b = fleet.spawn("b", &pooled, I).await;
    fleet.wait_lead(b, STARTUP).await;
    for _ in 0..10 {
        tokio::time::sleep(I / 2).await;
        assert_eq!(
            fleet.leaders(),
            vec![a, b],
            "FINDING: two replicas lead at once"
        );
        let holder = observer.current().expect("one granted row");
        assert_eq!(
            holder.pid, server_session.pid,
            "one server session holds it"
        );
    }
    assert_eq!(
        observer.max_granted(),
        1,
        "the server granted the lock to one session only"
    );

    // 2. FINDING (current behaviour): the lock is gone from the server; both keep leading.
    let quiet = between_pings(
        &[ready_at(fleet.get(a)), ready_at(fleet.get(b))],
        Instant::now(),
    );
    tokio::time::sleep_until(quiet).await;
    assert!(db.terminate(server_session.pid).await.unwrap());
    assert!(observer.wait_for_no_holder(MARGIN).await);
    let terminated = Instant::now();
    tokio::time::sleep(2 * I + I / 2).await;
    for _ in 0..10 {
        tokio::time::sleep(I / 2).await;
        assert!(
            observer.current().is_none(),
            "nobody holds the lock on the server"
        );
        assert_eq!(
            fleet.leaders(),
            vec![a, b],
            "FINDING: both lead on a lock nobody holds (a correct elector demotes within 2·I)"
        );
    }
    assert_eq!(fleet.get(a).terms().len(), 1, "never demoted");
    assert_eq!(fleet.get(b).terms().len(), 1, "never demoted");
    println!(
        "{:?} after the lock's server session was terminated, both still lead",
        terminated.elapsed()
    );

    // 3. FINDING (current behaviour): a directly connected replica takes the free lock; three
    //    replicas lead at once.
    let c = fleet.spawn("c", &db.config(), I).await;
    fleet.wait_lead(c, STARTUP).await;
    let holder = observer.wait_for_holder(MARGIN).await.expect("c holds");
    assert_eq!(
        holder.application_name.as_deref(),
        Some(format!("{REPLICA_APP_PREFIX}c").as_str())
    );
    tokio::time::sleep(2 * I).await;
    assert_eq!(
        fleet.leaders(),
        vec![a, b, c],
        "FINDING: three leaders at once"
    );

    // 4. The unlock of a stopping pooled replica runs on a session that holds nothing.
    fleet.stop_all().await;
    for pooled_replica in [a, b] {
        let warned = fleet
            .get(pooled_replica)
            .logs("WARN", "leader: release background leader lock");
        assert_eq!(warned.len(), 1, "the unlock answered false: {warned:?}");
        println!("{}", warned[0].str("message").unwrap_or_default());
    }
    // PgBouncer keeps its server sessions (named after the last client) until it stops.
    drop(bouncer);
    if let Err(left) = wait_clean(db.admin(), REPLICA_APP_PREFIX, Duration::from_secs(10)).await {
        panic!("left on the server: {left}");
    }
    db.cleanup().await.unwrap();
}
