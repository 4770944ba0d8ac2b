//! Issue 49 §2: a loop that no replica can run does not rotate leadership. Before, a
//! leader-ticked pass failing with 42501 made the leader resign at once; when every replica
//! lacked the privilege (one shared role, a `GRANT` missing after a migration) leadership moved
//! about once per tick period, and every move interrupted every other loop and restarted the
//! while-leader loops. Now a leader steps down only after the loop failed so on every tick of
//! its term for 10 tick periods (`UNFIT_PATIENCE_PERIODS`), doubling per step-down of that
//! replica (`plexsphere_leader_service::loops`, module `unfit`).
//!
//! Each replica runs three loops through its own pool: `broken` (ticked, probe
//! `broken-sweeper`) updates a table its role may not touch, `healthy` (ticked, probe
//! `healthy-sweeper`) one it may, and `follower` runs while it leads. Both mechanisms, each on a
//! database and a role of its own.
//!
//! - All unfit (two replicas of the unfit role), watched for 20 tick periods: every two term
//!   beginnings (`TermInfo::since`, the driver's own clock) lie at least 10 periods apart, so at
//!   most one move in any 10 periods, and the first comes no earlier than 10 periods into the
//!   first term; the leader's `/readyz` is 503 for `broken-sweeper` alone while `healthy` keeps
//!   passing. Before, the leader moved every two periods or so.
//! - One fit (the unfit replica leads first, then a fit one starts): leadership ends on the fit
//!   replica within 14 periods + `MARGIN` (3 s, `loops_support::MARGIN`) and stays there for
//!   20 more periods; its `/readyz` is 200.
#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a failed unwrap is a failed test"
)]

mod loops_support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use loops_support::{I, MARGIN, eventually, get, serve};
use plexsphere_leader::{Config, Elector};
use plexsphere_leader_service::loops::{BoxError, PassFn, UNFIT_PATIENCE_PERIODS, pass_fn};
use plexsphere_leader_service::{
    Background, LeaderTicker, Readiness, RunningWorkers, WhileLeader, wire_background,
};
use plexsphere_leader_tests::TestDb;
use prometheus::Registry;
use tokio_util::sync::CancellationToken;

/// How long a replica may take to lead at start.
const STARTUP: Duration = Duration::from_secs(15);

/// How long each scenario watches after it set up: 20 tick periods.
const WATCH: u32 = 20;

/// A term's beginning: when (the driver's clock) and on which replica.
type Begun = (std::time::Instant, &'static str);

/// One replica: an elector, the three loops under a supervisor, `/readyz`, and a record of the
/// terms it began.
struct Replica {
    name: &'static str,
    elector: Elector,
    addr: SocketAddr,
    running: RunningWorkers,
    stop: CancellationToken,
    healthy: Arc<AtomicU32>,
    begun: Arc<Mutex<Vec<Begun>>>,
}

impl Replica {
    async fn start(name: &'static str, pool: deadpool_postgres::Pool, lease: bool) -> Self {
        let registry = Registry::new();
        let mut config = Config::new(pool.clone())
            .check_interval(I)
            .identity(format!("{name}@test"))
            .registry(&registry);
        if lease {
            config = config.lease(Duration::ZERO);
        }
        let elector = Elector::new(config).unwrap();
        let healthy = Arc::new(AtomicU32::new(0));
        let readiness = Readiness::new();
        let mut background = Background::new(&readiness).unwrap();
        wire_background(Some(elector.clone()), &mut background, |elector, bg| {
            let broken = update(&pool, "plx_secret", None);
            bg.ticker(
                LeaderTicker::new("broken", elector.clone(), I, broken).probe("broken-sweeper"),
            )?;
            let work = update(&pool, "plx_work", Some(Arc::clone(&healthy)));
            bg.ticker(
                LeaderTicker::new("healthy", elector.clone(), I, work).probe("healthy-sweeper"),
            )?;
            bg.while_leader(WhileLeader::new(
                "follower",
                elector.clone(),
                pass_fn(|term: CancellationToken| async move {
                    term.cancelled().await;
                    Ok::<(), BoxError>(())
                }),
            ))
        })
        .unwrap();
        let stop = CancellationToken::new();
        let addr = serve(
            plexsphere_leader_service::http::router(
                readiness,
                plexsphere_leader_service::Liveness::new(),
                registry,
            ),
            stop.clone(),
        )
        .await;
        background.boot(&stop).await;
        let running = background.start(&stop);
        let begun = Arc::new(Mutex::new(Vec::new()));
        tokio::spawn(record_terms(
            name,
            elector.clone(),
            Arc::clone(&begun),
            stop.clone(),
        ));
        Self {
            name,
            elector,
            addr,
            running,
            stop,
            healthy,
            begun,
        }
    }

    async fn readyz(&self) -> (u16, String) {
        get(self.addr, "/readyz").await.unwrap()
    }

    fn terms(&self) -> usize {
        self.begun.lock().unwrap().len()
    }

    async fn stop(self) {
        self.stop.cancel();
        let bound = plexsphere_leader_service::shutdown_bound(&self.elector);
        let report = self.running.shutdown(bound).await;
        assert!(report.aborted.is_empty(), "{}: {report:?}", self.name);
    }
}

/// A pass that adds one to the row of `table`, and counts its successes in `passes`.
fn update(pool: &deadpool_postgres::Pool, table: &str, passes: Option<Arc<AtomicU32>>) -> PassFn {
    let (pool, statement) = (pool.clone(), format!("UPDATE {table} SET n = n + 1"));
    pass_fn(move |_term| {
        let (pool, statement, passes) = (pool.clone(), statement.clone(), passes.clone());
        async move {
            let client = pool.get().await?;
            client.simple_query(&statement).await?;
            if let Some(passes) = passes {
                passes.fetch_add(1, Ordering::SeqCst);
            }
            Ok::<(), BoxError>(())
        }
    })
}

/// Records every term `elector` begins, read from its published leadership (no polling).
async fn record_terms(
    name: &'static str,
    elector: Elector,
    begun: Arc<Mutex<Vec<Begun>>>,
    stop: CancellationToken,
) {
    let mut published = elector.subscribe();
    let mut last = None;
    loop {
        let term = published.borrow_and_update().term();
        if let Some(term) = term.filter(|t| Some(t.id) != last) {
            last = Some(term.id);
            begun.lock().unwrap().push((term.since, name));
        }
        tokio::select! {
            () = stop.cancelled() => return,
            changed = published.changed() => if changed.is_err() { return },
        }
    }
}

/// A database with `plx_work` and `plx_secret`, and a role that may update the first only
/// (and, with a lease, write the lease's rows).
async fn db_with_role(name: &str, lease: bool) -> (TestDb, String) {
    let db = TestDb::create(name).await.unwrap();
    let role = format!("plx_unfit_{}", db.name());
    db.admin()
        .batch_execute(&format!(
            "CREATE TABLE plx_work (n int NOT NULL); INSERT INTO plx_work VALUES (0); \
             CREATE TABLE plx_secret (n int NOT NULL); INSERT INTO plx_secret VALUES (0); \
             DROP ROLE IF EXISTS {role}; CREATE ROLE {role} LOGIN; \
             GRANT CONNECT ON DATABASE \"{db}\" TO {role}; GRANT USAGE ON SCHEMA public TO {role}; \
             GRANT SELECT, UPDATE ON plx_work TO {role}",
            db = db.name()
        ))
        .await
        .unwrap();
    if lease {
        plexsphere_leader::lease::setup(db.admin()).await.unwrap();
        db.admin()
            .batch_execute(&format!(
                "GRANT SELECT, INSERT, UPDATE ON plexsphere_leader_lease, \
                 plexsphere_leader_fence TO {role}"
            ))
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

/// Drops `role` on the maintenance database (roles are cluster-wide).
async fn drop_role(role: &str) {
    let config = plexsphere_leader_tests::base_config().unwrap();
    let client = plexsphere_leader_tests::connect(&config).await.unwrap();
    let _ = client
        .batch_execute(&format!("DROP ROLE IF EXISTS {role}"))
        .await;
}

/// The leader among `replicas`, if one leads.
fn leader<'a>(replicas: &'a [&'a Replica]) -> Option<&'a Replica> {
    replicas.iter().copied().find(|r| r.elector.is_leader())
}

async fn no_replica_can_run_the_loop(lease: bool) {
    let mechanism = if lease { "lease" } else { "advisory" };
    let (db, role) = db_with_role(&format!("loops_unfit_all_{mechanism}"), lease).await;
    let a = Replica::start("a", role_pool(&db, &role), lease).await;
    eventually(STARTUP, "a leads", || async {
        a.elector.is_leader().then_some(())
    })
    .await;
    let b = Replica::start("b", role_pool(&db, &role), lease).await;
    let watched = tokio::time::Instant::now();
    // The leader reports the broken loop, and only it, while the healthy one passes.
    let replicas = [&a, &b];
    let body = eventually(
        4 * I + MARGIN,
        "the leader's /readyz 503 for broken",
        || async {
            let leader = leader(&replicas)?;
            let (code, body) = leader.readyz().await;
            let failed =
                body.contains("\"broken\": tick failed:") && body.contains("permission denied");
            (code == 503 && failed).then_some(body)
        },
    )
    .await;
    assert!(
        body.contains(
            "[-]broken-sweeper failed: plexsphere: background loop \"broken\": tick failed:"
        ),
        "{mechanism}: {body}"
    );
    assert!(
        body.contains("[+]healthy-sweeper ok"),
        "{mechanism}: {body}"
    );
    assert!(body.contains("[+]workers ok"), "{mechanism}: {body}");
    tokio::time::sleep_until(watched + WATCH * I).await;
    let mut begun: Vec<Begun> = [&a, &b]
        .iter()
        .flat_map(|r| r.begun.lock().unwrap().clone())
        .collect();
    begun.sort();
    let first = begun.first().expect("a term").0;
    let timeline: Vec<String> = begun
        .iter()
        .map(|(at, name)| format!("{name} at {:?}", at.duration_since(first)))
        .collect();
    let passes = a.healthy.load(Ordering::SeqCst) + b.healthy.load(Ordering::SeqCst);
    println!(
        "{mechanism}: terms begun: {}; healthy passes: {passes}",
        timeline.join(", ")
    );
    let patience = UNFIT_PATIENCE_PERIODS * I;
    for pair in begun.windows(2) {
        let gap = pair[1].0.duration_since(pair[0].0);
        assert!(
            gap >= patience,
            "{mechanism}: two terms {gap:?} apart, less than 10 periods: {timeline:?}"
        );
    }
    assert!(begun.len() <= 3, "{mechanism}: {timeline:?}");
    // The healthy loop ran on the leader all along: at least half of the watched periods.
    assert!(passes >= WATCH / 2, "{mechanism}: {passes} healthy passes");
    b.stop().await;
    a.stop().await;
    db.cleanup().await.unwrap();
    drop_role(&role).await;
}

async fn leadership_ends_on_the_replica_that_can(lease: bool) {
    let mechanism = if lease { "lease" } else { "advisory" };
    let (db, role) = db_with_role(&format!("loops_unfit_one_{mechanism}"), lease).await;
    let unfit = Replica::start("unfit", role_pool(&db, &role), lease).await;
    eventually(STARTUP, "the unfit replica leads", || async {
        unfit.elector.is_leader().then_some(())
    })
    .await;
    let fit = Replica::start("fit", db.pool(4).unwrap(), lease).await;
    let started = tokio::time::Instant::now();
    let bound = (UNFIT_PATIENCE_PERIODS + 4) * I + MARGIN;
    eventually(bound, "the fit replica leads", || async {
        fit.elector.is_leader().then_some(())
    })
    .await;
    println!(
        "{mechanism}: the fit replica leads {:?} after it started",
        started.elapsed()
    );
    tokio::time::sleep(WATCH * I).await;
    assert!(
        fit.elector.is_leader(),
        "{mechanism}: it stays with the fit replica"
    );
    assert_eq!(fit.terms(), 1, "{mechanism}: one term of the fit replica");
    assert_eq!(
        unfit.terms(),
        1,
        "{mechanism}: the unfit replica never led again"
    );
    let (code, body) = fit.readyz().await;
    assert_eq!(code, 200, "{mechanism}: {body}");
    assert!(
        fit.healthy.load(Ordering::SeqCst) >= WATCH / 2,
        "{mechanism}"
    );
    fit.stop().await;
    unfit.stop().await;
    db.cleanup().await.unwrap();
    drop_role(&role).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_advisory_replica_able_to_run_a_loop_leadership_stays_put() {
    no_replica_can_run_the_loop(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_lease_replica_able_to_run_a_loop_leadership_stays_put() {
    no_replica_can_run_the_loop(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_leadership_ends_on_the_one_replica_able_to_run_the_loop() {
    leadership_ends_on_the_replica_that_can(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_leadership_ends_on_the_one_replica_able_to_run_the_loop() {
    leadership_ends_on_the_replica_that_can(true).await;
}
