//! The readiness table of the spec with real electors on the local PostgreSQL, seen through
//! `/readyz`: the boot pass before the first tick, the leader's passing and failing ticks, a
//! panicking pass, the standby, and a demoted leader's probe clearing on its first standby tick.
#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a failed unwrap is a failed test"
)]

mod loops_support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use loops_support::{I, MARGIN, eventually, get, lock_holders, serve};
use plexsphere_leader::{Config, Elector};
use plexsphere_leader_service::loops::{BoxError, pass_fn};
use plexsphere_leader_service::{
    Background, LeaderTicker, Readiness, RunningWorkers, wire_background,
};
use plexsphere_leader_tests::TestDb;
use prometheus::Registry;
use tokio_util::sync::CancellationToken;

#[derive(Clone, Copy, Debug)]
enum Mode {
    Ok,
    Fail,
    Panic,
}

/// A replica: an Elector under its supervisor, one probed ticked loop whose pass queries the
/// database and then does what `mode` says, and its `/readyz`.
struct Replica {
    elector: Elector,
    mode: Arc<Mutex<Mode>>,
    addr: std::net::SocketAddr,
    running: RunningWorkers,
    stop: CancellationToken,
}

impl Replica {
    async fn boot(db: &TestDb, name: &str, mode: Mode) -> Self {
        let pool = db.pool_with_app_name(name, 4).unwrap();
        let registry = Registry::new();
        let elector = Elector::new(
            Config::new(pool.clone())
                .check_interval(I)
                .registry(&registry),
        )
        .unwrap();
        let mode = Arc::new(Mutex::new(mode));
        let readiness = Readiness::new();
        let mut background = Background::new(&readiness).unwrap();
        let pass = {
            let mode = Arc::clone(&mode);
            pass_fn(move |_term| {
                let (pool, mode) = (pool.clone(), *mode.lock().unwrap());
                async move {
                    let client = pool.get().await?;
                    client.simple_query("SELECT 1").await?;
                    match mode {
                        Mode::Ok => Ok(()),
                        Mode::Fail => Err(BoxError::from("sessions table locked")),
                        Mode::Panic => panic!("attempt to divide by zero"),
                    }
                }
            })
        };
        wire_background(
            Some(elector.clone()),
            &mut background,
            |elector, background| {
                background.ticker(
                    LeaderTicker::new("access-session-sweep", elector.clone(), I, pass)
                        .probe("access-session-sweeper"),
                )
            },
        )
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
        Self {
            elector,
            mode,
            addr,
            running,
            stop,
        }
    }

    fn set(&self, mode: Mode) {
        *self.mode.lock().unwrap() = mode;
    }

    async fn readyz(&self) -> (u16, String) {
        get(self.addr, "/readyz").await.unwrap()
    }

    /// Waits until `/readyz` answers `status` with a body containing `text`.
    async fn wait_readyz(&self, status: u16, text: &str) -> String {
        eventually(
            I * 3 + MARGIN,
            &format!("/readyz {status} with {text:?}"),
            || async {
                let (code, body) = self.readyz().await;
                (code == status && body.contains(text)).then_some(body)
            },
        )
        .await
    }

    async fn stop(self) {
        self.stop.cancel();
        assert!(
            self.running
                .shutdown(Duration::from_secs(5))
                .await
                .aborted
                .is_empty()
        );
    }
}

const PROBE_PASSES: &str = "[+]access-session-sweeper ok";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_row_of_the_readiness_table_through_readyz() {
    let db = TestDb::create("loops_readiness_table").await.unwrap();

    // Booted, no tick yet: the boot pass's outcome. A failed boot pass does not stop serving.
    let a = Replica::boot(&db, "replica-a", Mode::Fail).await;
    let (code, body) = a.readyz().await;
    assert_eq!(code, 503, "{body}");
    assert!(
        body.contains("[-]access-session-sweeper failed: plexsphere: background loop \"access-session-sweep\": boot pass failed: sessions table locked"),
        "{body}"
    );

    // Leader, last tick failed: that tick's error, until a later tick succeeds.
    eventually(I + MARGIN, "replica a leads", || async {
        a.elector.is_leader().then_some(())
    })
    .await;
    let body = a
        .wait_readyz(
            503,
            "background loop \"access-session-sweep\": tick failed: sessions table locked",
        )
        .await;
    assert!(body.contains("[+]workers ok"), "{body}");

    // Leader, last tick succeeded: pass.
    a.set(Mode::Ok);
    a.wait_readyz(200, PROBE_PASSES).await;

    // A pass that panics is a failed tick with the spec's text, and the loop keeps ticking.
    a.set(Mode::Panic);
    a.wait_readyz(
        503,
        "plexsphere: background loop \"access-session-sweep\": tick panicked: attempt to divide by zero",
    )
    .await;
    a.set(Mode::Ok);
    a.wait_readyz(200, PROBE_PASSES).await;

    // Standby: pass, whatever its own pass would do (a standby runs no pass).
    let b = Replica::boot(&db, "replica-b", Mode::Ok).await;
    b.set(Mode::Fail);
    tokio::time::sleep(I * 3).await;
    assert!(!b.elector.is_leader());
    let (code, body) = b.readyz().await;
    assert_eq!(code, 200, "{body}");

    // A demoted leader's probe clears on its first standby tick. A session of the test queues
    // for the lock first, so that it, and neither replica, gets it when a's session ends.
    a.set(Mode::Fail);
    a.wait_readyz(503, "tick failed").await;
    let blocker = db.connect("blocker").await.unwrap();
    let queued = tokio::spawn(async move {
        blocker
            .simple_query("SELECT pg_advisory_lock(1886156915, 1)")
            .await
            .unwrap();
        blocker
    });
    eventually(MARGIN, "the blocker queues for the lock", || async {
        let row = db
            .admin()
            .query_one(
                "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity s USING (pid) \
                 WHERE l.locktype = 'advisory' AND NOT l.granted AND s.application_name = 'blocker'",
                &[],
            )
            .await
            .unwrap();
        (row.get::<_, i64>(0) == 1).then_some(())
    })
    .await;
    let holder = lock_holders(&db).await;
    assert_eq!(holder.len(), 1);
    assert!(db.terminate(holder[0]).await.unwrap());
    let blocker = queued.await.unwrap();
    a.wait_readyz(200, PROBE_PASSES).await;
    assert!(
        !a.elector.is_leader(),
        "a cleared as a standby, not by a later pass"
    );
    a.stop().await;

    // The lock is free again: replica b takes over; its pass fails, so it leaves its Service.
    drop(blocker);
    eventually(I * 2 + MARGIN, "replica b leads", || async {
        b.elector.is_leader().then_some(())
    })
    .await;
    b.wait_readyz(503, "tick failed: sessions table locked")
        .await;
    b.set(Mode::Ok);
    b.wait_readyz(200, PROBE_PASSES).await;

    b.stop().await;
    assert!(
        lock_holders(&db).await.is_empty(),
        "the supervisor's shutdown released the lock"
    );
    db.cleanup().await.unwrap();
}
