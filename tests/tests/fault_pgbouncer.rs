//! The elector behind PgBouncer in transaction mode (`pool_mode = transaction`), which cannot
//! carry a session lock. PgBouncer is installed from Debian's packages when missing
//! (`plexsphere_leader_tests::PgBouncer`).
//!
//! Before the lock-verifying check, replicas behind such a pooler led without holding the lock
//! (the grant re-entered on a shared server session, and `SELECT 1` was answered by any server
//! session: two, then three leaders at once). Now the grant statement refuses a session that
//! already carries a grant's mark, marking it `shared`, and the leader's check verifies its
//! backend, its hold of the lock (a re-entrant try) and that mark. Before its first grant each
//! run also proves its pool (two held connections must be answered by two server backends), so
//! behind such a pooler no replica leads, alone or not: its run fails at once with
//! `RunError::SessionsMultiplexed` (which names the lease mechanism). Leadership is never
//! shared. Behind a session-mode PgBouncer without a reset query, a vanished leader's lock
//! is handed to the next client with its server session; the standby releases it there and
//! leads when that client is an elector, and when it is an ordinary client the lock lives in
//! that client's session until `idle_session_timeout` after its last query. With
//! `server_reset_query = DISCARD ALL` the pooler releases it before the next client gets the
//! session.

mod fault_support;
mod support;

use std::time::Duration;

use fault_support::{Fleet, I, MARGIN, STARTUP};
use nix::sys::signal::Signal;
use plexsphere_leader_tests::replica_process::{REPLICA_APP_PREFIX, wait_clean};
use plexsphere_leader_tests::{LockObserver, PgBouncer, PoolMode, TestDb, connect};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_postgres::Config;

/// A replica name's application_name.
fn app(name: &str) -> String {
    format!("{REPLICA_APP_PREFIX}{name}")
}

/// A leader `a` (interval `leader_interval`) alone behind a PgBouncer in `mode` with one server
/// session, on its own database: the opening of every test here.
struct LeaderBehindPooler {
    db: TestDb,
    bouncer: PgBouncer,
    observer: LockObserver,
    /// The DSN through PgBouncer.
    pooled: Config,
    fleet: Fleet,
    a: usize,
    /// The PgBouncer server session that carries `a`'s lock.
    server_session: i32,
}

impl LeaderBehindPooler {
    async fn start(name: &str, mode: PoolMode, leader_interval: Duration) -> Self {
        let db = TestDb::create(name).await.expect("database");
        let bouncer = PgBouncer::start(&db.config(), mode, 1)
            .await
            .expect("PgBouncer");
        let observer = LockObserver::start(&db.config()).await.expect("observer");
        let pooled = bouncer.pg_config(&db.config());
        let mut fleet = Fleet::new();
        // A pool of one connection: its pool proof cannot hold two connections at once, so it
        // proves nothing and `a` leads even behind a transaction-mode pooler, on the lock of
        // its one server session (what these tests need to watch the leader's own check).
        let a = fleet
            .spawn_dsn(
                "a",
                plexsphere_leader_tests::replica_process::dsn(&pooled),
                leader_interval,
                1,
            )
            .await;
        fleet.wait_lead(a, STARTUP).await;
        let server_session = observer
            .wait_for_holder(MARGIN)
            .await
            .expect("the lock is on PgBouncer's server session")
            .pid;
        Self {
            db,
            bouncer,
            observer,
            pooled,
            fleet,
            a,
            server_session,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_transaction_mode_pgbouncer_no_replica_leads_alone_or_not_and_each_run_fails_once()
{
    // Issue 37, hole 3: alone behind the pooler, with one server session, `a` used to take the
    // lock on PgBouncer's server session and lead until another replica's grant shared it (4
    // terms of 1-2 s in 25 s under the demo's supervisor). Now each run proves its pool before
    // its first grant: two held connections answered by one server backend fail the run at
    // once, with the typed error that names the lease, and the lock is never tried.
    let db = TestDb::create("fault_pgbouncer_tx")
        .await
        .expect("database");
    let bouncer = PgBouncer::start(&db.config(), PoolMode::Transaction, 1)
        .await
        .expect("PgBouncer");
    let observer = LockObserver::start(&db.config()).await.expect("observer");
    let pooled = bouncer.pg_config(&db.config());
    let mut fleet = Fleet::new();
    for name in ["a", "b"] {
        let replica = fleet.spawn(name, &pooled, I).await;
        let exit = fleet
            .get(replica)
            .wait_for(STARTUP, |r| r.event == "exit")
            .await
            .expect("the run returned");
        let error = exit.str("run").unwrap_or_default().to_owned();
        assert!(
            error.contains("multiplexes server sessions") && error.contains("Config::lease"),
            "{name}'s run fails naming the lease mechanism: {error:?}"
        );
        let said = fleet
            .get(replica)
            .logs("ERROR", "leader: the pool multiplexes server sessions");
        assert_eq!(said.len(), 1, "{name} says it once at ERROR: {said:?}");
        assert!(
            fleet.leaders().is_empty(),
            "nobody leads through the pooler"
        );
    }
    assert_eq!(observer.max_granted(), 0, "the lock was never taken");
    assert_eq!(observer.current(), None);

    // Pools of one connection are proven too (issue 49, item 8; before, they proved nothing
    // and `p` led on the pooler's one server session until `q`'s grant ran there): the
    // proof's second session is one of its own, outside the pool, which the pooler runs on the
    // same server session. Neither leads, alone or not; each run fails at once, saying why.
    let one = |name: &'static str| {
        let dsn = plexsphere_leader_tests::replica_process::dsn(&pooled);
        (name, dsn)
    };
    let mut ones = Vec::new();
    for name in ["p", "q"] {
        let (name, dsn) = one(name);
        let replica = fleet.spawn_dsn(name, dsn, I, 1).await;
        let exit = fleet
            .get(replica)
            .wait_for(STARTUP, |r| r.event == "exit")
            .await
            .expect("the run returned");
        let error = exit.str("run").unwrap_or_default().to_owned();
        assert!(
            error.contains("multiplexes server sessions") && error.contains("Config::lease"),
            "{name}'s run fails naming the lease mechanism: {error:?}"
        );
        assert!(
            fleet
                .get(replica)
                .logs("INFO", "leader: acquired background leader lock")
                .is_empty(),
            "{name} never led"
        );
        ones.push(replica);
    }
    assert!(
        fleet.leaders().is_empty(),
        "nobody leads through the pooler"
    );
    assert_eq!(observer.max_granted(), 0, "the lock was never taken");
    let q = ones[1];
    let report = fleet.get_mut(q).stop().await.unwrap();
    // Its run failed by design; its pool is whole: nothing was left borrowed or waiting.
    let pool = report.pool.as_ref().expect("q's pool report");
    assert!(
        pool.ok && pool.waiting == 0 && pool.available == pool.size,
        "q's pool: {report:?}"
    );

    // A replica connected directly leads as usual.
    let mut direct = Fleet::new();
    let c = direct.spawn("c", &db.config(), I).await;
    direct.wait_lead(c, STARTUP).await;
    observer
        .wait_for_holder(MARGIN)
        .await
        .expect("c holds the lock");
    assert_eq!(observer.max_granted(), 1);
    direct.stop_all().await;
    drop(bouncer);
    if let Err(left) = wait_clean(db.admin(), REPLICA_APP_PREFIX, Duration::from_secs(10)).await {
        panic!("left on the server: {left}");
    }
    db.cleanup().await.unwrap();
}

/// PgBouncer in session mode with an empty `server_reset_query`: the leader's SIGKILL leaves
/// its lock on the pooler's server session, which the pooler hands to the standby as it was.
/// Before, the standby refused at every check ("PgBouncer in transaction mode", wrongly) and,
/// since its own checks kept the session from idling out, nobody led again (72 s by hand,
/// until PgBouncer was stopped). The grant now tells a stranded lock from a shared one by the
/// leader's check stamp on the session: unchecked for four intervals (rounded up to whole
/// seconds, plus one), it is released on that same session with a WARN naming the pooler's
/// missing reset query, and the standby leads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_session_mode_pgbouncer_without_reset_a_stranded_lock_is_released_and_retaken() {
    // The leader checks every second: its grant bounds its session's idle time at 4 s, so the
    // standby started after its SIGKILL has time to be handed that session as it was.
    let leader_interval = Duration::from_secs(1);
    let LeaderBehindPooler {
        db,
        bouncer,
        observer,
        pooled,
        mut fleet,
        a,
        server_session,
    } = LeaderBehindPooler::start(
        "fault_pgbouncer_stranded",
        PoolMode::SessionWithoutReset,
        leader_interval,
    )
    .await;
    // Each of a's checks leaves one more hold of the lock (a re-entrant try): after three, the
    // release on the handed-over session must end them all at once.
    tokio::time::sleep(3 * leader_interval).await;

    fleet.get(a).signal(Signal::SIGKILL).unwrap();
    let killed = Instant::now();
    // The standby connects through the pooler once a's session is free (one server session):
    // it is handed that session, lock and all. (Started before, its exclusion proof's clients
    // would wait in PgBouncer for the session and meet the handover mid-proof.)
    let b = fleet.spawn("b", &pooled, I).await;
    // b's four intervals (800 ms) rounded up to 1 s, plus 1 s, then b's next check.
    let stranded_after = Duration::from_secs(2);
    let led = fleet
        .wait_lead_since(b, killed, stranded_after + 2 * I + MARGIN)
        .await;
    println!(
        "stranded lock released and retaken {:?} after the leader's SIGKILL",
        led - killed
    );
    let holder = observer
        .wait_for_holder_named(&app("b"), MARGIN)
        .await
        .expect("b holds the lock");
    assert_eq!(
        holder.pid, server_session,
        "the same server session, handed from a to b"
    );
    let released = fleet.get(b).logs(
        "WARN",
        "leader: released a lock stranded on a pooled session",
    );
    assert!(!released.is_empty(), "b says what it released and why");
    assert!(
        released.iter().any(|line| line
            .str("message")
            .unwrap_or_default()
            .contains("without a reset query")),
        "{released:?}"
    );
    assert_eq!(
        observer.max_granted(),
        1,
        "one session held the lock at a time"
    );

    fleet.stop_all().await;
    drop(bouncer);
    db.cleanup().await.unwrap();
}

/// PgBouncer in session mode with an empty `server_reset_query`, one server session: the leader's
/// graceful stop clears its session's mark with its unlock, so the pooler hands the standby a
/// server session that the grant (which tells a shared or handed-over session by that mark, not
/// by reading `pg_locks`) takes the lock on at once: a plain graceful handover, neither a shared
/// session nor a stranded lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_session_mode_pgbouncer_without_reset_a_graceful_stop_hands_over_on_the_same_session()
 {
    let LeaderBehindPooler {
        db,
        bouncer,
        observer,
        pooled,
        mut fleet,
        a,
        server_session,
    } = LeaderBehindPooler::start("fault_pgbouncer_graceful", PoolMode::SessionWithoutReset, I)
        .await;
    // One server session: b's connection waits in PgBouncer until a's is free.
    let b = fleet.spawn("b", &pooled, I).await;

    let stopping = Instant::now();
    let report = fleet.get_mut(a).stop().await.expect("a stops");
    assert_eq!(report.run_error, None, "a's run ended without error");
    let led = fleet.wait_lead_since(b, stopping, 2 * I + MARGIN).await;
    println!("b led {:?} after a's graceful stop began", led - stopping);
    let holder = observer
        .wait_for_holder_named(&app("b"), MARGIN)
        .await
        .expect("b holds the lock");
    assert_eq!(
        holder.pid, server_session,
        "the same server session, handed from a to b"
    );
    let stranded = fleet.get(b).logs(
        "WARN",
        "leader: released a lock stranded on a pooled session",
    );
    assert!(stranded.is_empty(), "no stranded lock: {stranded:?}");
    // (b's connection setups may time out while PgBouncer queues it: those lines say so.)
    let shared: Vec<_> = fleet
        .get(b)
        .logs("WARN", "leader: acquire lock connection")
        .into_iter()
        .filter(|line| {
            line.str("message")
                .unwrap_or_default()
                .contains("already held the lock")
        })
        .collect();
    assert!(shared.is_empty(), "no shared session: {shared:?}");
    assert_eq!(
        observer.max_granted(),
        1,
        "one session held the lock at a time"
    );

    // a's exit report cannot show an intact pool: its last pool check waited for the pooler's one
    // server session, which b holds. b's can.
    let report = fleet.get_mut(b).stop().await.expect("b stops");
    fault_support::assert_pool_intact("b", &report);
    drop(bouncer);
    db.cleanup().await.unwrap();
}

/// An ordinary client (not an elector) of `config` that keeps using its session: one query every
/// 100 ms until `stop` turns true, publishing its backend pid once its first query answered.
/// Connecting waits in PgBouncer while the pool has no free server session.
fn ordinary_client(config: &Config, stop: watch::Receiver<bool>) -> watch::Receiver<Option<i32>> {
    let (pid_tx, pid_rx) = watch::channel(None);
    let mut config = config.clone();
    config.application_name("plx-ordinary-client");
    tokio::spawn(async move {
        let client = connect(&config).await.expect("connect through PgBouncer");
        let mut stop = stop;
        while !*stop.borrow_and_update() {
            // An error ends it: the session ended (the server's idle_session_timeout, or the
            // test tearing PgBouncer down); the tests assert on the pids it saw, not on this.
            let Ok(row) = client.query_one("SELECT pg_backend_pid()", &[]).await else {
                return None;
            };
            let _ = pid_tx.send(Some(row.get::<_, i32>(0)));
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(100)) => {}
                _ = stop.changed() => {}
            }
        }
        // Stays connected and idle until the test ends (or the server ends the session).
        Some(client)
    });
    pid_rx
}

/// Waits until the ordinary client's first query answered; its backend pid.
async fn first_pid(pid: &mut watch::Receiver<Option<i32>>, timeout: Duration) -> i32 {
    let seen = tokio::time::timeout(timeout, pid.wait_for(Option::is_some))
        .await
        .expect("the ordinary client got a server session in time")
        .expect("the client task is alive");
    seen.expect("some")
}

/// The stage of the two SIGKILL tests below: leader `a` (interval `leader_interval`) on one
/// PgBouncer server session in `mode`, standby `b` connected directly, and an ordinary client
/// waiting in PgBouncer for that server session; then `a` is SIGKILLed and the ordinary client
/// gets the leader's server session.
struct KilledBehindPooler {
    db: TestDb,
    bouncer: PgBouncer,
    observer: LockObserver,
    fleet: Fleet,
    b: usize,
    /// The PgBouncer server session that carried `a`'s lock.
    server_session: i32,
    /// When `a` was killed.
    killed: Instant,
    /// Stops the ordinary client.
    stop_client: watch::Sender<bool>,
    /// The backend pid the ordinary client's last query ran on.
    client_pid: watch::Receiver<Option<i32>>,
}

impl KilledBehindPooler {
    async fn stage(name: &str, mode: PoolMode, leader_interval: Duration) -> Self {
        let LeaderBehindPooler {
            db,
            bouncer,
            observer,
            pooled,
            mut fleet,
            a,
            server_session,
        } = LeaderBehindPooler::start(name, mode, leader_interval).await;
        // The standby connects directly; the ordinary client waits in PgBouncer for a's session.
        let b = fleet.spawn("b", &db.config(), I).await;
        let (stop_client, stop_rx) = watch::channel(false);
        let mut client_pid = ordinary_client(&pooled, stop_rx);
        fleet.get(a).signal(Signal::SIGKILL).expect("SIGKILL");
        let killed = Instant::now();
        let pid = first_pid(&mut client_pid, STARTUP).await;
        assert_eq!(
            pid, server_session,
            "the ordinary client got the leader's server session"
        );
        Self {
            db,
            bouncer,
            observer,
            fleet,
            b,
            server_session,
            killed,
            stop_client,
            client_pid,
        }
    }

    async fn finish(mut self) {
        let _ = self.stop_client.send(true);
        self.fleet.stop_all().await;
        drop(self.bouncer);
        self.db.cleanup().await.expect("cleanup");
    }
}

/// Session mode with `server_reset_query = DISCARD ALL`: the SIGKILLed leader's server session
/// goes to an ordinary client that keeps using it, and the lock does not go with it: PgBouncer's
/// reset released it (`DISCARD ALL` includes `pg_advisory_unlock_all()`), so a standby leads
/// at its next check. The control below is the same without the reset query.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_session_mode_pgbouncer_with_discard_all_the_next_client_gets_no_lock() {
    let stage = KilledBehindPooler::stage("fault_pgbouncer_reset", PoolMode::Session, I).await;
    let led = stage
        .fleet
        .wait_lead_since(stage.b, stage.killed, 2 * I + MARGIN)
        .await;
    println!(
        "the standby led {:?} after the leader's SIGKILL, its server session in use",
        led - stage.killed
    );
    let holder = stage
        .observer
        .wait_for_new_holder(stage.server_session, MARGIN)
        .await
        .expect("b holds the lock, not the reset session");
    assert_eq!(holder.application_name.as_deref(), Some(&*app("b")));
    assert_eq!(
        *stage.client_pid.borrow(),
        Some(stage.server_session),
        "the ordinary client still uses that session"
    );
    assert_eq!(
        stage.observer.max_granted(),
        1,
        "one session held the lock at a time"
    );
    stage.finish().await;
}

/// The control: without a reset query the SIGKILLed leader's lock goes with its server session
/// to the ordinary client and lives there while that client keeps querying (no elector can
/// release a lock on a session it does not hold), then ends `idle_session_timeout` (four of the
/// leader's intervals, set on the session by its grant) after the client's last query.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_session_mode_pgbouncer_without_reset_an_ordinary_client_keeps_the_lock() {
    // The leader's interval: its grant sets idle_session_timeout to four of them (4 s), far
    // above the client's 100 ms between queries, so a slow machine does not end it early.
    let leader_interval = Duration::from_secs(1);
    let stage = KilledBehindPooler::stage(
        "fault_pgbouncer_no_reset_client",
        PoolMode::SessionWithoutReset,
        leader_interval,
    )
    .await;
    // Well past the four intervals after which an elector on that session would release it.
    tokio::time::sleep(3 * leader_interval).await;
    assert_eq!(
        stage.observer.current().map(|holder| holder.pid),
        Some(stage.server_session),
        "the lock lives on in the ordinary client's session"
    );
    assert!(
        !stage.fleet.leaders().contains(&stage.b),
        "the standby does not lead meanwhile"
    );

    let _ = stage.stop_client.send(true);
    let quiet = Instant::now();
    let led = stage
        .fleet
        .wait_lead_since(stage.b, quiet, 4 * leader_interval + 2 * I + MARGIN)
        .await;
    println!(
        "the standby led {:?} after the ordinary client's last query",
        led - quiet
    );
    assert_eq!(
        stage.observer.max_granted(),
        1,
        "one session held the lock at a time"
    );
    stage.finish().await;
}
