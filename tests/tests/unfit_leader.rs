//! Issue 37, hole 2: a replica that cannot do the leader's work does not keep leadership. A role
//! without the privilege the work needs (`CREATE ROLE … LOGIN` with `CONNECT` only) wins the
//! election at once (advisory locks need no privilege; the lease needs only its tables), and
//! before, it kept leading while every leader-gated write failed with 42501. Now a leader-ticked
//! pass that fails with an SQLSTATE that says this replica cannot do the work (42501, 25006:
//! `plexsphere_leader_service::UNFIT_SQLSTATES`) makes the leader resign, and a fit replica
//! takes over. Both mechanisms, each on a database and a role of its own.
//!
//! Bound: the unfit replica leads at most one tick period (I) plus its stop grace (I) plus
//! `MARGIN` (2 s, `support::MARGIN`) once it began its term.
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
        let mut config = Config::new(pool.clone())
            .check_interval(I)
            .identity(identity);
        if lease {
            config = config.lease(Duration::ZERO);
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
    let db = TestDb::create(&format!("unfit_{mechanism}")).await.unwrap();
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
        // The unfit role may take part in the election: it may write the lease's rows.
        admin
            .batch_execute(&format!(
                "GRANT SELECT, INSERT, UPDATE ON plexsphere_leader_lease, \
                 plexsphere_leader_fence TO {role}"
            ))
            .await
            .unwrap();
    }
    let mut unfit_config = db.config();
    unfit_config.user(&role);
    let unfit_pool = plexsphere_leader_tests::pool_for(unfit_config, 4).unwrap();
    // The unfit replica starts first and leads.
    let unfit = Replica::start(unfit_pool, lease, "unfit@test");
    wait_for(STARTUP, || unfit.elector.is_leader())
        .await
        .expect("the unfit replica leads first");
    let began = Instant::now();
    let fit = Replica::start(db.pool(4).unwrap(), lease, "fit@test");
    let bound = I + I + MARGIN;
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
