//! Issue 49 §7: a database outage stops no loop for good. Before, a leader's while-leader loop
//! failed on every connection attempt while its term stayed trusted, and each failure spent the
//! supervisor's restart budget (5 restarts in 60 s, backoffs 0.1–1.6 s: gone after 3.1 s); the
//! worker then stayed stopped until the process restarted and `/readyz` failed for good.
//!
//! One replica on a throwaway cluster (`Cluster`), at I = 1 s, runs a ticked loop with a probe
//! (`sweep`), a while-leader loop that queries every I/4 (`archiver`) and an every-replica loop
//! (`relay`), each through a pool of the cluster. The server is stopped (`pg_ctl stop -m
//! fast`: sessions end with 57P01, then connections are refused) for 8 s and started again.
//!
//! - Lease: TTL 15 s, the default TTL at the default I = 5 s, so the leader trusts its term
//!   through the whole outage (13.5 s) as it did in the issue; the archiver fails on every
//!   restart for 8 s. Without the fix it exhausted its budget 3.1 s into the outage.
//! - Advisory lock: the lock session ends with the server; the term ends and a new one begins
//!   after the return.
//!
//! Bound: every loop runs again, and `/readyz` answers 200, within 2·I of the server's return
//! (`start_again` returned: the server accepts connections) plus `MARGIN` (3 s,
//! `loops_support::MARGIN`: a loaded 2-core machine, reconnecting pools). No worker ends
//! exhausted or given up.
#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a failed unwrap is a failed test"
)]

mod loops_support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use loops_support::{MARGIN, eventually, get, serve};
use plexsphere_leader::{Config, Elector};
use plexsphere_leader_service::loops::{BoxError, PassFn, pass_fn};
use plexsphere_leader_service::{
    Background, EveryReplica, LeaderTicker, Readiness, WhileLeader, WorkerState, wire_background,
};
use plexsphere_leader_tests::{Cluster, StopMode, pool_for};
use prometheus::Registry;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The check interval and tick period.
const I: Duration = Duration::from_secs(1);

/// How long the server stays stopped.
const OUTAGE: Duration = Duration::from_secs(8);

/// The lease's TTL: the default TTL at the default interval (3 × 5 s), trusted for 13.5 s.
const LEASE_TTL: Duration = Duration::from_secs(15);

/// How long the replica may take to lead and run every loop once at start.
const STARTUP: Duration = Duration::from_secs(20);

/// When each loop last did its work, by loop name.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<BTreeMap<&'static str, Instant>>>);

impl Seen {
    fn mark(&self, name: &'static str) {
        self.0.lock().unwrap().insert(name, Instant::now());
    }

    /// Whether every loop of `names` did its work after `since`.
    fn all_after(&self, names: &[&'static str], since: Instant) -> bool {
        let seen = self.0.lock().unwrap();
        names
            .iter()
            .all(|name| seen.get(name).is_some_and(|at| *at > since))
    }

    fn after(&self, name: &'static str, since: Instant) -> Option<Duration> {
        let seen = self.0.lock().unwrap();
        seen.get(name)
            .and_then(|at| at.checked_duration_since(since))
    }
}

const LOOPS: [&str; 3] = ["sweep", "archiver", "relay"];

/// A pass that runs `SELECT 1` on a pooled connection and marks `name` as seen.
fn query_pass(pool: &deadpool_postgres::Pool, seen: &Seen, name: &'static str) -> PassFn {
    let (pool, seen) = (pool.clone(), seen.clone());
    pass_fn(move |_token| {
        let (pool, seen) = (pool.clone(), seen.clone());
        async move {
            let client = pool.get().await?;
            client.simple_query("SELECT 1").await?;
            seen.mark(name);
            Ok::<(), BoxError>(())
        }
    })
}

/// A self-paced loop: a query every I/4 until its term ends; its first failed query is its
/// error.
fn archiver(pool: &deadpool_postgres::Pool, seen: &Seen, starts: &Arc<Mutex<u32>>) -> PassFn {
    let (pool, seen, starts) = (pool.clone(), seen.clone(), Arc::clone(starts));
    pass_fn(move |term: CancellationToken| {
        let (pool, seen) = (pool.clone(), seen.clone());
        *starts.lock().unwrap() += 1;
        async move {
            loop {
                let client = pool.get().await?;
                client.simple_query("SELECT 1").await?;
                seen.mark("archiver");
                tokio::select! {
                    () = term.cancelled() => return Ok::<(), BoxError>(()),
                    () = tokio::time::sleep(I / 4) => {}
                }
            }
        }
    })
}

async fn an_outage_stops_no_loop_for_good(lease: bool) {
    let mechanism = if lease { "lease" } else { "advisory" };
    let cluster = Cluster::start().await.expect("a throwaway cluster");
    let config = cluster.config("postgres");
    if lease {
        let admin = cluster.connect("postgres").await.unwrap();
        plexsphere_leader::lease::setup(&admin).await.unwrap();
    }
    let pool = pool_for(config, 8).unwrap();
    let registry = Registry::new();
    let mut elector_config = Config::new(pool.clone())
        .check_interval(I)
        .registry(&registry);
    if lease {
        elector_config = elector_config.lease(LEASE_TTL);
    }
    let elector = Elector::new(elector_config).unwrap();
    let (seen, starts) = (Seen::default(), Arc::new(Mutex::new(0_u32)));
    let readiness = Readiness::new();
    let mut background = Background::new(&readiness).unwrap();
    wire_background(Some(elector.clone()), &mut background, |elector, bg| {
        bg.ticker(
            LeaderTicker::new(
                "sweep",
                elector.clone(),
                I,
                query_pass(&pool, &seen, "sweep"),
            )
            .probe("sweeper"),
        )?;
        bg.while_leader(WhileLeader::new(
            "archiver",
            elector.clone(),
            archiver(&pool, &seen, &starts),
        ))?;
        bg.every_replica(EveryReplica::new(
            "relay",
            I,
            query_pass(&pool, &seen, "relay"),
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
    let began = Instant::now();
    eventually(STARTUP, "a leader running every loop, ready", || async {
        let ready = get(addr, "/readyz").await.unwrap().0 == 200;
        (elector.is_leader() && ready && seen.all_after(&LOOPS, began)).then_some(())
    })
    .await;
    let term = elector.leadership().term().expect("a term").id;

    cluster.stop(StopMode::Fast).await.expect("pg_ctl stop");
    let cut = Instant::now();
    tokio::time::sleep(OUTAGE).await;
    let down = seen.0.lock().unwrap().clone();
    cluster.start_again().await.expect("pg_ctl start");
    let back = Instant::now();
    let starts_in_outage = *starts.lock().unwrap();
    println!(
        "{mechanism}: server down {:?}; archiver started {starts_in_outage} times so far; \
         leading at the return: {}",
        back - cut,
        elector.is_leader()
    );
    for name in LOOPS {
        assert!(
            down.get(name).is_none_or(|at| *at < cut),
            "{mechanism}: {name} did no work while the server was down"
        );
    }
    if lease {
        assert_eq!(
            elector.leadership().term().map(|t| t.id),
            Some(term),
            "{mechanism}: the lease term was trusted through the outage"
        );
        assert!(
            starts_in_outage > 6,
            "{mechanism}: the archiver failed more often than the budget's 5 restarts: \
             {starts_in_outage}"
        );
    }

    let bound = 2 * I + MARGIN;
    eventually(bound, "every loop working again", || async {
        seen.all_after(&LOOPS, back).then_some(())
    })
    .await;
    let (code, body) = eventually(bound, "/readyz 200", || async {
        let (code, body) = get(addr, "/readyz").await.unwrap();
        (code == 200).then_some((code, body))
    })
    .await;
    let ready = back.elapsed();
    let delays: Vec<String> = LOOPS
        .iter()
        .map(|name| format!("{name} {:?}", seen.after(name, back).unwrap()))
        .collect();
    println!(
        "{mechanism}: after the return: {}; /readyz {code} after {ready:?}",
        delays.join(", ")
    );
    assert!(ready <= bound, "{mechanism}: {ready:?}: {body}");
    for (name, state) in running.states() {
        assert!(
            !matches!(
                state,
                WorkerState::Exhausted { .. } | WorkerState::GaveUp { .. }
            ),
            "{mechanism}: {name} stopped for good: {state:?}"
        );
    }
    assert!(elector.is_leader(), "{mechanism}: the replica leads again");

    stop.cancel();
    let report = running
        .shutdown(plexsphere_leader_service::shutdown_bound(&elector))
        .await;
    assert!(report.aborted.is_empty(), "{mechanism}: {report:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_eight_second_outage_under_a_lease_leader_stops_no_loop_for_good() {
    an_outage_stops_no_loop_for_good(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_eight_second_outage_under_an_advisory_leader_stops_no_loop_for_good() {
    an_outage_stops_no_loop_for_good(false).await;
}
