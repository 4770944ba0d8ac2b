//! Wiring with and without an Elector, gates, the while-leader runner across terms, the restart
//! budget seen through `/readyz`, and `/livez` and `/metrics`, against the local PostgreSQL.
#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a failed unwrap is a failed test"
)]

mod loops_support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use loops_support::{I, MARGIN, eventually, get, lock_holders, serve};
use plexsphere_leader::{Config, Elector};
use plexsphere_leader_service::loops::{BoxError, ELECTION_WORKER, Wired, pass_fn};
use plexsphere_leader_service::{
    Background, Gate, LeaderTicker, Readiness, RestartPolicy, WhileLeader, wire_background,
};
use plexsphere_leader_tests::TestDb;
use prometheus::Registry;
use tokio_util::sync::CancellationToken;

#[tokio::test]
async fn a_boot_without_a_database_builds_no_elector_and_wires_no_loop() {
    let readiness = Readiness::new();
    let mut background = Background::new(&readiness).unwrap();
    let wired = wire_background(None, &mut background, |_elector, _background| {
        panic!("the loops are never wired without an Elector")
    })
    .unwrap();
    assert_eq!(wired, Wired::Nothing);
    assert!(background.worker_names().is_empty());
    assert_eq!(background.boot_passes(), 0);

    let stop = CancellationToken::new();
    let addr = serve(
        plexsphere_leader_service::http::router(
            readiness,
            plexsphere_leader_service::Liveness::new(),
            Registry::new(),
        ),
        stop.clone(),
    )
    .await;
    assert!(background.boot(&stop).await.passes.is_empty());
    let running = background.start(&stop);
    assert!(running.states().is_empty());
    let (code, body) = get(addr, "/readyz").await.unwrap();
    assert_eq!(
        (code, body.as_str()),
        (200, "[+]workers ok\nreadyz check passed\n")
    );
    assert_eq!(
        get(addr, "/livez").await.unwrap(),
        (200, "livez check passed\n".to_owned())
    );
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_boot_with_an_elector_runs_the_election_as_the_background_leader_worker() {
    let db = TestDb::create("loops_wiring_elector").await.unwrap();
    let registry = Registry::new();
    let elector = Elector::new(
        Config::new(db.pool(4).unwrap())
            .check_interval(I)
            .registry(&registry),
    )
    .unwrap();
    let readiness = Readiness::new();
    let mut background = Background::new(&readiness).unwrap();
    let ticks = Arc::new(AtomicU32::new(0));
    let wired = wire_background(
        Some(elector.clone()),
        &mut background,
        |elector, background| {
            let ticks = Arc::clone(&ticks);
            background.ticker(LeaderTicker::new(
                "rate-budget-sweep",
                elector.clone(),
                I,
                pass_fn(move |_term| {
                    ticks.fetch_add(1, Ordering::SeqCst);
                    async { Ok::<(), BoxError>(()) }
                }),
            ))
        },
    )
    .unwrap();
    assert_eq!(
        wired,
        Wired::Loops(vec![
            ELECTION_WORKER.to_owned(),
            "rate-budget-sweep".to_owned()
        ])
    );

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
    eventually(I + MARGIN, "the supervised election leads", || async {
        elector.is_leader().then_some(())
    })
    .await;
    eventually(I * 2 + MARGIN, "the ticker ticks on the leader", || async {
        (ticks.load(Ordering::SeqCst) >= 2).then_some(())
    })
    .await;
    let (code, metrics) = get(addr, "/metrics").await.unwrap();
    assert_eq!(code, 200);
    assert!(
        metrics.contains("plexsphere_background_leader 1"),
        "{metrics}"
    );

    stop.cancel();
    assert!(
        running
            .shutdown(Duration::from_secs(5))
            .await
            .aborted
            .is_empty()
    );
    assert!(!elector.is_leader());
    assert!(
        lock_holders(&db).await.is_empty(),
        "the shutdown released the lock"
    );
    db.cleanup().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gate_with_the_electors_predicate_allows_only_on_the_leader_and_one_without_stays_open() {
    let db = TestDb::create("loops_wiring_gate").await.unwrap();
    let elector = Elector::new(Config::new(db.pool(2).unwrap()).check_interval(I)).unwrap();
    let gated = Gate::leader(&elector);
    let open = Gate::for_elector(None);
    assert!(gated.has_predicate() && !open.has_predicate());
    assert!(!gated.allows(), "not leading yet");
    assert!(open.allows());

    let stop = CancellationToken::new();
    let run = tokio::spawn({
        let (elector, stop) = (elector.clone(), stop.clone());
        async move { elector.run(stop).await }
    });
    eventually(I + MARGIN, "the gate opens on the leader", || async {
        gated.allows().then_some(())
    })
    .await;
    assert!(Gate::for_elector(Some(&elector)).allows());
    stop.cancel();
    run.await.unwrap().unwrap();
    assert!(
        !gated.allows(),
        "closed again once the replica stopped leading"
    );
    assert!(open.allows());
    db.cleanup().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_while_leader_runner_stops_the_loop_on_a_lost_term_and_starts_it_in_the_next() {
    let db = TestDb::create("loops_wiring_while_leader").await.unwrap();
    let elector = Elector::new(Config::new(db.pool(3).unwrap()).check_interval(I)).unwrap();
    let events = Arc::new(Mutex::new(Vec::<String>::new()));
    let runner = WhileLeader::new(
        "audit-archiver",
        elector.clone(),
        pass_fn({
            let events = Arc::clone(&events);
            move |term: CancellationToken| {
                let events = Arc::clone(&events);
                async move {
                    events.lock().unwrap().push("start".into());
                    term.cancelled().await;
                    events.lock().unwrap().push("stop".into());
                    Ok::<(), BoxError>(())
                }
            }
        }),
    );
    let stop = CancellationToken::new();
    let election = tokio::spawn({
        let (elector, stop) = (elector.clone(), stop.clone());
        async move { elector.run(stop).await }
    });
    let runner = tokio::spawn(runner.run(stop.clone()));
    let count = |what: &'static str| {
        let events = Arc::clone(&events);
        move || {
            let n = events.lock().unwrap().iter().filter(|e| *e == what).count();
            async move { Some(n) }
        }
    };
    eventually(I + MARGIN, "the loop starts in the first term", || async {
        (count("start")().await == Some(1)).then_some(())
    })
    .await;
    let first = elector.leadership().term().unwrap().id;

    let holder = lock_holders(&db).await;
    assert!(db.terminate(holder[0]).await.unwrap());
    eventually(
        I * 3 + MARGIN,
        "the loop stops and starts again in the next term",
        || async {
            let log = events.lock().unwrap().clone();
            (log == ["start", "stop", "start"]).then_some(())
        },
    )
    .await;
    assert!(elector.leadership().term().unwrap().id > first);

    stop.cancel();
    runner.await.unwrap().unwrap();
    election.await.unwrap().unwrap();
    assert_eq!(*events.lock().unwrap(), ["start", "stop", "start", "stop"]);
    db.cleanup().await.unwrap();
}

#[tokio::test]
async fn a_worker_that_exhausts_its_restart_budget_fails_the_workers_probe_on_readyz() {
    let readiness = Readiness::new();
    let policy = RestartPolicy {
        max_restarts: 3,
        initial_backoff: Duration::from_millis(10),
        ..RestartPolicy::default()
    };
    let mut background = Background::with_policy(&readiness, policy).unwrap();
    let runs = Arc::new(AtomicU32::new(0));
    background
        .worker("capacity-collector", {
            let runs = Arc::clone(&runs);
            move |_token| {
                runs.fetch_add(1, Ordering::SeqCst);
                async { Err::<(), BoxError>("sampler: connection refused".into()) }
            }
        })
        .unwrap();
    background
        .worker("sse-relay", |token: CancellationToken| async move {
            token.cancelled().await;
            Ok::<(), BoxError>(())
        })
        .unwrap();
    let stop = CancellationToken::new();
    let addr = serve(
        plexsphere_leader_service::http::router(
            readiness,
            plexsphere_leader_service::Liveness::new(),
            Registry::new(),
        ),
        stop.clone(),
    )
    .await;
    let running = background.start(&stop);
    let body = eventually(
        MARGIN,
        "/readyz 503 naming the exhausted worker",
        || async {
            let (code, body) = get(addr, "/readyz").await.unwrap();
            (code == 503).then_some(body)
        },
    )
    .await;
    assert_eq!(
        body,
        "[-]workers failed: background workers stopped after exhausting their restart budget: capacity-collector\n\
         readyz check failed\n"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 4, "one run and three restarts");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        runs.load(Ordering::SeqCst),
        4,
        "an exhausted worker stays stopped"
    );
    assert!(
        running
            .shutdown(Duration::from_secs(2))
            .await
            .aborted
            .is_empty()
    );
    stop.cancel();
}

/// Issue 16 §3. With the defaults (I = 5 s, stop grace one interval, 2 s unlock budget) a
/// leader whose work ignores cancellation takes over 5 s to stop gracefully; the fixed 5 s
/// shutdown bound aborted the election worker inside its grace, before the unlock, and left the
/// lock to `idle_session_timeout` (20 s). `shutdown_bound(&elector)` covers the stop budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_supervisors_bound_for_an_elector_lets_a_slow_draining_leader_unlock() {
    let db = TestDb::create("loops_wiring_shutdown_bound").await.unwrap();
    let elector = Elector::new(Config::new(db.pool(3).unwrap())).unwrap();
    let bound = plexsphere_leader_service::shutdown_bound(&elector);
    assert_eq!(elector.stop_budget(), Duration::from_secs(7));
    assert_eq!(bound, Duration::from_secs(8));
    assert!(bound > plexsphere_leader_service::DEFAULT_SHUTDOWN_BOUND);

    let readiness = Readiness::new();
    let mut background = Background::new(&readiness).unwrap();
    wire_background(Some(elector.clone()), &mut background, |_elector, _bg| {
        Ok(())
    })
    .unwrap();
    let stop = CancellationToken::new();
    background.boot(&stop).await;
    let running = background.start(&stop);
    eventually(Duration::from_secs(15), "the replica leads", || async {
        elector.is_leader().then_some(())
    })
    .await;
    // Leader work that holds its term and ignores the term's end for longer than the grace.
    let term = elector.term(&CancellationToken::new()).unwrap();
    let stubborn = tokio::spawn(async move {
        let _held = term;
        tokio::time::sleep(Duration::from_secs(30)).await;
    });

    let stopping = tokio::time::Instant::now();
    let report = running.shutdown(bound).await;
    let took = stopping.elapsed();
    println!(
        "graceful stop through the supervisor: {took:?}, aborted {:?}",
        report.aborted
    );
    assert!(
        !report.aborted.iter().any(|name| name == ELECTION_WORKER),
        "the election worker finished its stop: {report:?}"
    );
    assert!(report.aborted.is_empty(), "{report:?}");
    assert!(
        lock_holders(&db).await.is_empty(),
        "the lock was released by the unlock, not left to the idle timeout"
    );
    assert!(
        took >= Duration::from_secs(5),
        "the stop grace was waited out: {took:?}"
    );
    stubborn.abort();
    db.cleanup().await.unwrap();
}
