//! Issue 37, hole 2: a replica that cannot do the leader's work does not keep leadership. A role
//! without the privilege the work needs (`CREATE ROLE … LOGIN` with `CONNECT` only) wins the
//! election at once (advisory locks need no privilege; the lease needs only its tables), and
//! before, it kept leading while every leader-gated write failed with 42501. Now a leader-ticked
//! pass that fails with an SQLSTATE that says this replica cannot do the work (42501, 25006:
//! `plexsphere_leader_service::UNFIT_SQLSTATES`) makes the leader resign, and a fit replica
//! takes over. Both mechanisms, each on a database and a role of its own.
//!
//! Bound: the unfit replica leads at most its patience (`UNFIT_PATIENCE_PERIODS`, 10 tick
//! periods of failures: issue 49 §2), one more tick period (I) and its stop grace (I) plus
//! `MARGIN` (2 s, `support::MARGIN`) once it began its term.
//!
//! Before any work fails, the election itself refuses an unfit replica: a read-only session
//! (`default_transaction_read_only` for its role) never takes the advisory lock (the grant
//! statement checks `transaction_read_only`) nor the lease (its claim is a write: 25006), and a
//! replica whose fitness probe (`Config::fitness_probe`) the server refuses makes no attempt
//! until the probe passes; a leader whose probe is refused gives its term up (`Unfit`) at its
//! next check.
#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use plexsphere_leader::{Config, Elector};
use plexsphere_leader_service::{LeaderTicker, loops::pass_fn};
use plexsphere_leader_tests::TestDb;
use support::{I, MARGIN, STARTUP, wait_for};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// One replica: an elector on `pool` and a leader-ticked pass that writes a row, every I.
struct Replica {
    elector: Elector,
    shutdown: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Replica {
    fn start(pool: deadpool_postgres::Pool, lease: bool, identity: &str) -> Self {
        Self::probing(pool, lease, identity, None)
    }

    /// As [`start`](Self::start), with a fitness probe.
    fn probing(
        pool: deadpool_postgres::Pool,
        lease: bool,
        identity: &str,
        probe: Option<&str>,
    ) -> Self {
        let mut config = Config::new(pool.clone())
            .check_interval(I)
            .identity(identity);
        if lease {
            config = config.lease(Duration::ZERO);
        }
        if let Some(probe) = probe {
            config = config.fitness_probe(probe);
        }
        let elector = Elector::new(config).unwrap();
        let shutdown = CancellationToken::new();
        let run = tokio::spawn({
            let (elector, shutdown) = (elector.clone(), shutdown.clone());
            async move {
                elector.run(shutdown).await.unwrap();
            }
        });
        let pass = pass_fn(move |_term| {
            let pool = pool.clone();
            async move {
                let client = pool.get().await?;
                client
                    .simple_query("UPDATE plx_work SET touched = touched + 1")
                    .await?;
                Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
            }
        });
        let ticker = LeaderTicker::new("work", elector.clone(), I, pass);
        let tick = tokio::spawn({
            let shutdown = shutdown.clone();
            async move {
                let _ = ticker.run(shutdown).await;
            }
        });
        Self {
            elector,
            shutdown,
            tasks: vec![run, tick],
        }
    }

    async fn stop(self) {
        self.shutdown.cancel();
        for task in self.tasks {
            task.await.unwrap();
        }
    }
}

async fn an_unfit_leader_gives_way(lease: bool) {
    let mechanism = if lease { "lease" } else { "advisory" };
    // The unfit role may take part in the election (with a lease: write the lease's rows).
    let (db, role) = db_with_role(&format!("unfit_{mechanism}"), lease, "").await;
    let admin = db.admin();
    let unfit_pool = role_pool(&db, &role);
    // The unfit replica starts first and leads.
    let unfit = Replica::start(unfit_pool, lease, "unfit@test");
    wait_for(STARTUP, || unfit.elector.is_leader())
        .await
        .expect("the unfit replica leads first");
    let began = Instant::now();
    let fit = Replica::start(db.pool(4).unwrap(), lease, "fit@test");
    let bound = (plexsphere_leader_service::loops::UNFIT_PATIENCE_PERIODS + 2) * I + MARGIN;
    wait_for(bound, || !unfit.elector.is_leader())
        .await
        .unwrap_or_else(|| panic!("{mechanism}: the unfit leader gives way within {bound:?}"));
    let tenure = began.elapsed();
    println!("{mechanism}: the unfit replica led {tenure:?}");
    wait_for(STARTUP, || fit.elector.is_leader())
        .await
        .expect("the fit replica takes over");
    // It stays with the fit replica: the unfit one does not take it back.
    tokio::time::sleep(10 * I).await;
    assert!(fit.elector.is_leader(), "{mechanism}");
    assert!(!unfit.elector.is_leader(), "{mechanism}");
    let touched: i32 = admin
        .query_one("SELECT touched FROM plx_work", &[])
        .await
        .unwrap()
        .get(0);
    assert!(
        touched >= 5,
        "{mechanism}: the fit leader does the work: {touched}"
    );
    fit.stop().await;
    unfit.stop().await;
    db.cleanup().await.unwrap();
    let _ = db_drop_role(&role).await;
}

/// A database with the work table and a role that may connect, use `public` and (with a lease)
/// write the lease's rows, but not touch the work table; `extra` runs after, as the admin.
async fn db_with_role(name: &str, lease: bool, extra: &str) -> (TestDb, String) {
    let db = TestDb::create(name).await.unwrap();
    let role = format!("plx_ro_{}", db.name());
    let admin = db.admin();
    admin
        .batch_execute(&format!(
            "CREATE TABLE plx_work (touched int NOT NULL); INSERT INTO plx_work VALUES (0); \
             DROP ROLE IF EXISTS {role}; CREATE ROLE {role} LOGIN; \
             GRANT CONNECT ON DATABASE \"{db}\" TO {role}; GRANT USAGE ON SCHEMA public TO {role}",
            db = db.name()
        ))
        .await
        .unwrap();
    if lease {
        plexsphere_leader::lease::setup(admin).await.unwrap();
        admin
            .batch_execute(&format!(
                "GRANT SELECT, INSERT, UPDATE ON plexsphere_leader_lease, \
                 plexsphere_leader_fence TO {role}"
            ))
            .await
            .unwrap();
    }
    if !extra.is_empty() {
        admin
            .batch_execute(&extra.replace("{role}", &role))
            .await
            .unwrap();
    }
    (db, role)
}

/// A pool of `role` on `db`.
fn role_pool(db: &TestDb, role: &str) -> deadpool_postgres::Pool {
    let mut config = db.config();
    config.user(role);
    plexsphere_leader_tests::pool_for(config, 4).unwrap()
}

/// Whether `elector` leads at any moment within `window`, sampled every 5 ms.
async fn leads_within(elector: &Elector, window: Duration) -> bool {
    wait_for(window, || elector.is_leader()).await.is_some()
}

async fn a_read_only_replica_never_leads(lease: bool) {
    let mechanism = if lease { "lease" } else { "advisory" };
    let (db, role) = db_with_role(
        &format!("readonly_{mechanism}"),
        lease,
        "ALTER ROLE {role} SET default_transaction_read_only = on",
    )
    .await;
    let read_only = Replica::start(role_pool(&db, &role), lease, "readonly@test");
    // Alone, it never leads; it says why, as a permanent failure with advice.
    assert!(
        !leads_within(&read_only.elector, 4 * I).await,
        "{mechanism}: a read-only replica led"
    );
    let failure = read_only
        .elector
        .check_failure()
        .expect("a failed check says why");
    println!("{mechanism}: {failure:?}");
    assert_eq!(
        failure.class,
        plexsphere_leader_core::failures::FailureClass::Permanent
    );
    assert!(
        failure.error.contains("read-only"),
        "{mechanism}: {}",
        failure.error
    );
    assert!(failure.advice.is_some());
    // Each refusal gives its pooled connection back (the statement answered and took
    // nothing): the read-only replica keeps its sessions instead of opening one per check
    // (issue 49, item 4: it closed the connection at every check). Ten more checks open at
    // most one session (a proof's, whose count may land late: statistics flush within 1 s).
    let sessions = || async {
        let row = db
            .admin()
            .query_one(
                "SELECT sessions FROM pg_stat_database WHERE datname = current_database()",
                &[],
            )
            .await
            .unwrap();
        row.get::<_, i64>(0)
    };
    let pids = || async {
        let rows = db
            .admin()
            .query(
                "SELECT pid FROM pg_stat_activity WHERE usename = $1 ORDER BY pid",
                &[&role],
            )
            .await
            .unwrap();
        rows.iter()
            .map(|row| row.get::<_, i32>(0))
            .collect::<Vec<_>>()
    };
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let (before, pids_before) = (sessions().await, pids().await);
    tokio::time::sleep(10 * I + Duration::from_millis(1_500)).await;
    let (after, pids_after) = (sessions().await, pids().await);
    assert!(
        after - before <= 1,
        "{mechanism}: {} sessions opened in ten checks",
        after - before
    );
    if !lease {
        assert_eq!(pids_before, pids_after, "the same pooled sessions");
    }
    // A fit replica leads at once, and the read-only one never does.
    let fit = Replica::start(db.pool(4).unwrap(), lease, "fit@test");
    wait_for(STARTUP, || fit.elector.is_leader())
        .await
        .expect("the fit replica leads");
    assert!(
        !leads_within(&read_only.elector, 5 * I).await,
        "{mechanism}"
    );
    fit.stop().await;
    assert!(
        !leads_within(&read_only.elector, 4 * I).await,
        "{mechanism}"
    );
    read_only.stop().await;
    db.cleanup().await.unwrap();
    let _ = db_drop_role(&role).await;
}

async fn a_refused_probe_keeps_a_replica_from_leading_until_it_passes(lease: bool) {
    let mechanism = if lease { "lease" } else { "advisory" };
    // The work may run; only the probe's own table is withheld, then granted and revoked.
    let (db, role) = db_with_role(
        &format!("probe_{mechanism}"),
        lease,
        "GRANT SELECT, UPDATE ON plx_work TO {role}; CREATE TABLE plx_guard (ok int)",
    )
    .await;
    let probe = "SELECT ok FROM plx_guard LIMIT 0";
    let replica = Replica::probing(role_pool(&db, &role), lease, "probed@test", Some(probe));
    // Refused (no SELECT on plx_work): unfit, no attempt, and it says why once.
    assert!(
        !leads_within(&replica.elector, 4 * I).await,
        "{mechanism}: an unfit replica led"
    );
    assert!(!replica.elector.is_fit());
    let failure = replica.elector.check_failure().expect("unfit says why");
    println!("{mechanism}: {failure:?}");
    assert!(failure.error.contains("fitness probe"), "{}", failure.error);
    assert!(
        failure.error.contains("permission denied"),
        "{}",
        failure.error
    );
    assert_eq!(
        failure.class,
        plexsphere_leader_core::failures::FailureClass::Permanent
    );
    assert!(
        failure
            .advice
            .as_deref()
            .is_some_and(|a| a.contains("GRANT"))
    );
    // Granted: the next check's probe passes and the replica leads.
    let admin = db.admin();
    admin
        .batch_execute(&format!("GRANT SELECT ON plx_guard TO {role}"))
        .await
        .unwrap();
    wait_for(2 * I + MARGIN, || replica.elector.is_leader())
        .await
        .unwrap_or_else(|| panic!("{mechanism}: fit again, it leads"));
    assert!(replica.elector.is_fit());
    // Revoked while it leads: its next check's probe is refused and it gives its term up.
    let revoked = Instant::now();
    admin
        .batch_execute(&format!("REVOKE SELECT ON plx_guard FROM {role}"))
        .await
        .unwrap();
    let bound = I + I + MARGIN;
    wait_for(bound, || !replica.elector.is_leader())
        .await
        .unwrap_or_else(|| panic!("{mechanism}: an unfit leader gives way within {bound:?}"));
    println!(
        "{mechanism}: gave its term up {:?} after the revoke",
        revoked.elapsed()
    );
    let end = replica
        .elector
        .leadership()
        .last_end()
        .expect("a term ended");
    assert_eq!(end.cause, plexsphere_leader::TermEndCause::Unfit);
    assert!(!replica.elector.is_fit());
    assert!(!leads_within(&replica.elector, 4 * I).await, "{mechanism}");
    replica.stop().await;
    db.cleanup().await.unwrap();
    let _ = db_drop_role(&role).await;
}

/// Drops `role` on the maintenance database (roles are cluster-wide).
async fn db_drop_role(role: &str) -> Result<(), Box<dyn std::error::Error>> {
    let client = plexsphere_leader_tests::connect(&plexsphere_leader_tests::base_config()?).await?;
    client
        .batch_execute(&format!("DROP ROLE IF EXISTS {role}"))
        .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unfit_advisory_leader_gives_way_to_a_fit_replica() {
    an_unfit_leader_gives_way(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unfit_lease_leader_gives_way_to_a_fit_replica() {
    an_unfit_leader_gives_way(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_replica_never_takes_the_advisory_lock() {
    a_read_only_replica_never_leads(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_replica_never_takes_the_lease() {
    a_read_only_replica_never_leads(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_advisory_probe_keeps_the_replica_out_until_it_passes() {
    a_refused_probe_keeps_a_replica_from_leading_until_it_passes(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_lease_probe_keeps_the_replica_out_until_it_passes() {
    a_refused_probe_keeps_a_replica_from_leading_until_it_passes(true).await;
}
