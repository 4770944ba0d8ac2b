//! What the demo wires, pinned against the spec's tables ("Which loops run on the leader",
//! "Readiness"), read from the running demo: `/status` lists the supervisor's workers and the
//! readiness probes, `/readyz` quotes each probe's loop, `/metrics` counts the ticks of exactly
//! the ticked loops. The expected lists are spelled out here, not taken from the demo.
//!
//! Also the two rules of the spec's loop table the demo's passes implement: `rate-budget-sweep`
//! reclaims the token buckets idle for longer than an hour, and `sse-nonce-sweep` deletes the
//! nonces last seen before `now − PLEXSPHERE_SSE_NONCE_TTL` and ticks once per that TTL. The
//! pass code is the demo's own (`adapters/service/examples/demo/passes.rs`, included by path).
//!
//! One replica at a 200 ms interval; bounds are `BOOT` (30 s) for the demo to build, boot and
//! lead, `MARGIN` (3 s) plus what the scenario needs for the rest.
#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a failed unwrap is a failed test"
)]

mod loops_support;

#[allow(
    dead_code,
    unreachable_pub,
    reason = "the demo's module; this test uses a part of it"
)]
#[path = "../../adapters/service/examples/demo/passes.rs"]
mod passes;

use std::collections::BTreeMap;
use std::time::Duration;

use loops_support::{DEMO_BOOT as BOOT, Demo, MARGIN, eventually, get};
use plexsphere_leader_tests::TestDb;
use plexsphere_leader_tests::replica_process::dsn;
use tokio_postgres::Client;

/// Every worker of a replica with a database, in registration order: the election, the spec's
/// fifteen leader-ticked loops in its table's order, its two while-leader loops, then the
/// every-replica workers (three consume loops under suffixed names).
const WORKERS: [&str; 25] = [
    "background-leader",
    "invitations-expire",
    "approvals-expire",
    "actions-timeout",
    "access-session-sweep",
    "auth-state-sweep",
    "rate-budget-sweep",
    "sse-nonce-sweep",
    "credentials-sweeper",
    "cloud-credentials-sweeper",
    "management-fleet-reconcile",
    "provisioning-broker-reconcile",
    "artifacts-refresh",
    "blueprint-catalogs-tracking",
    "peers-endpoint-sweeper",
    "reachability-evaluator",
    "audit-archiver",
    "authz-outbox-consumer",
    "capacity-collector",
    "observability-routing-consume/alerts",
    "observability-routing-consume/logs",
    "observability-routing-consume/traces",
    "sse-relay",
    "sse-signing-key-rotation-watcher",
    "peers-relay-assigner",
];

/// The spec's fifteen leader-ticked loops.
const TICKED: [&str; 15] = [
    "invitations-expire",
    "approvals-expire",
    "actions-timeout",
    "access-session-sweep",
    "auth-state-sweep",
    "rate-budget-sweep",
    "sse-nonce-sweep",
    "credentials-sweeper",
    "cloud-credentials-sweeper",
    "management-fleet-reconcile",
    "provisioning-broker-reconcile",
    "artifacts-refresh",
    "blueprint-catalogs-tracking",
    "peers-endpoint-sweeper",
    "reachability-evaluator",
];

/// The spec's seven readiness probes, each with the loop whose ticks it reports, in the order
/// the demo registers them (its loop table's order); the supervisor's `workers` probe comes
/// first.
const PROBES: [(&str, &str); 7] = [
    ("invitations-expire", "invitations-expire"),
    ("approvals-expire", "approvals-expire"),
    ("actions-timeout", "actions-timeout"),
    ("access-session-sweeper", "access-session-sweep"),
    ("management-fleet-reconcile", "management-fleet-reconcile"),
    (
        "provisioning-broker-reconcile",
        "provisioning-broker-reconcile",
    ),
    ("artifacts-refresh", "artifacts-refresh"),
];

/// The eight ticked loops without a probe.
const UNPROBED: [&str; 8] = [
    "auth-state-sweep",
    "rate-budget-sweep",
    "sse-nonce-sweep",
    "credentials-sweeper",
    "cloud-credentials-sweeper",
    "blueprint-catalogs-tracking",
    "peers-endpoint-sweeper",
    "reachability-evaluator",
];

/// `["workers", <the seven probes>]`: every `/readyz` probe of a replica with a database.
fn probes() -> Vec<&'static str> {
    std::iter::once("workers")
        .chain(PROBES.iter().map(|(probe, _)| *probe))
        .collect()
}

/// `/status` of `demo` as JSON.
async fn status(demo: &Demo) -> serde_json::Value {
    let (code, body) = demo.get("/status").await;
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// Starts the demo on `dsn` with `$PLEXSPHERE_SSE_NONCE_TTL` set to `nonce_ttl` (unset with
/// `None`).
async fn start(dsn: &str, nonce_ttl: Option<&str>) -> Demo {
    Demo::start(dsn, &[], &[("PLEXSPHERE_SSE_NONCE_TTL", nonce_ttl)]).await
}

/// The strings of the JSON array `value`.
fn strings(value: &serde_json::Value) -> Vec<&str> {
    value
        .as_array()
        .unwrap_or_else(|| panic!("an array: {value}"))
        .iter()
        .map(|name| name.as_str().unwrap())
        .collect()
}

/// The ticks counted per loop in a `/metrics` body, summed over the outcomes.
fn ticks(metrics: &str) -> BTreeMap<String, u64> {
    ticks_of(metrics, None)
}

/// The ticks counted per loop in a `/metrics` body with `outcome` (every outcome: `None`).
fn ticks_of(metrics: &str, outcome: Option<&str>) -> BTreeMap<String, u64> {
    let mut ticks = BTreeMap::new();
    let series = metrics
        .lines()
        .filter_map(|line| line.strip_prefix("plexsphere_background_loop_ticks_total{"));
    for line in series {
        let (labels, value) = line.split_once("} ").unwrap();
        if outcome.is_some_and(|outcome| !labels.contains(&format!("outcome=\"{outcome}\""))) {
            continue;
        }
        let name = labels
            .split(',')
            .find_map(|label| label.strip_prefix("loop=\""))
            .and_then(|name| name.strip_suffix('"'))
            .unwrap_or_else(|| panic!("a loop label in {line}"));
        *ticks.entry(name.to_owned()).or_default() += value.trim().parse::<u64>().unwrap();
    }
    ticks
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_wires_the_specs_workers_probes_and_ticked_loops_exactly() {
    let db = TestDb::create("demo_wiring").await.unwrap();
    let demo = start(&dsn(&db.config()), Some("2s")).await;
    demo.line(BOOT, "event=acquired term=1").await;

    let status = status(&demo).await;
    assert_eq!(strings(&status["workers"]), WORKERS, "{status}");
    assert_eq!(strings(&status["probes"]), probes(), "{status}");
    assert_eq!(
        status["sse_nonce_ttl_ms"], 2000,
        "the variable overrides the TTL"
    );

    let (code, body) = eventually(BOOT, "/readyz ready", || async {
        let (code, body) = get(demo.addr, "/readyz").await.ok()?;
        (code == 200).then_some((code, body))
    })
    .await;
    let mut expected: Vec<String> = probes()
        .into_iter()
        .map(|probe| format!("[+]{probe} ok"))
        .collect();
    expected.push("readyz check passed".into());
    assert_eq!(
        (code, body.lines().collect::<Vec<_>>()),
        (200, expected.iter().map(String::as_str).collect())
    );

    // Exactly the fifteen ticked loops tick (the while-leader and every-replica workers do
    // not), and `sse-nonce-sweep` ticks once per TTL (2 s), not once per interval (200 ms).
    let counted = eventually(BOOT, "every ticked loop ticking", || async {
        let (_, body) = get(demo.addr, "/metrics").await.ok()?;
        let counted = ticks(&body);
        (counted.len() == TICKED.len() && counted["invitations-expire"] >= 25).then_some(counted)
    })
    .await;
    let mut ticked = TICKED.to_vec();
    ticked.sort_unstable();
    assert_eq!(
        counted.keys().map(String::as_str).collect::<Vec<_>>(),
        ticked
    );
    let (nonce, interval) = (counted["sse-nonce-sweep"], counted["invitations-expire"]);
    assert!(
        (1..=interval / 2).contains(&nonce),
        "sse-nonce-sweep ticked {nonce} times while invitations-expire ticked {interval}: {counted:?}"
    );

    // The every-replica traffic the two sweeps clean up: this replica's rate-budget bucket
    // (named after its application_name) and the nonces of the events it relayed.
    let client = db.connect("check").await.unwrap();
    let row = client
        .query_one(
            "SELECT (SELECT array_agg(bucket) FROM plexsphere_demo.rate_budgets), \
                    (SELECT count(*) FROM plexsphere_demo.sse_nonces)",
            &[],
        )
        .await
        .unwrap();
    let buckets: Vec<String> = row.get(0);
    let nonces: i64 = row.get(1);
    assert_eq!(buckets, [status["application_name"].as_str().unwrap()]);
    assert!(nonces > 0, "the relay records a nonce per relayed event");
    drop(client);

    demo.stop(MARGIN + Duration::from_secs(10)).await;
    db.cleanup().await.unwrap();
}

/// The spec's two while-leader loops.
const WHILE_LEADER: [&str; 2] = ["audit-archiver", "authz-outbox-consumer"];

/// The spec's every-replica loops (the consume loops under their suffixed names).
const EVERY_REPLICA: [&str; 7] = [
    "capacity-collector",
    "observability-routing-consume/alerts",
    "observability-routing-consume/logs",
    "observability-routing-consume/traces",
    "sse-relay",
    "sse-signing-key-rotation-watcher",
    "peers-relay-assigner",
];

/// Issue 36: where each loop runs is pinned against the spec's three tables, from what each
/// replica's supervisor reports (`/status`'s `placement`, the launcher that wired it), and by
/// what a standby does: its ticked loops only ever tick `standby`, while its every-replica
/// relay spends from its own rate budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_loop_runs_where_the_spec_places_it_and_a_standby_runs_only_the_every_replica_ones() {
    let db = TestDb::create("demo_placement").await.unwrap();
    // A nonce TTL of 1 s, so that `sse-nonce-sweep` ticks a few times too.
    let demo = Demo::start_replicas(
        &dsn(&db.config()),
        2,
        "200ms",
        &[],
        &[("PLEXSPHERE_SSE_NONCE_TTL", Some("1s"))],
    )
    .await;
    let leader: u16 =
        loops_support::field(&demo.line(BOOT, "event=acquired term=1").await, "replica");
    let standby = 1 - leader;
    let mut expected: BTreeMap<&str, &str> = BTreeMap::new();
    expected.insert("background-leader", "worker");
    for name in TICKED {
        expected.insert(name, "leader-ticked");
    }
    for name in WHILE_LEADER {
        expected.insert(name, "while-leader");
    }
    for name in EVERY_REPLICA {
        expected.insert(name, "every-replica");
    }
    let mut applications = Vec::new();
    for replica in [leader, standby] {
        let (code, body) = get(demo.replica_addr(replica), "/status").await.unwrap();
        assert_eq!(code, 200, "{body}");
        let status: serde_json::Value = serde_json::from_str(&body).unwrap();
        let placed: BTreeMap<&str, &str> = status["placement"]
            .as_object()
            .unwrap_or_else(|| panic!("a placement object: {status}"))
            .iter()
            .map(|(name, placement)| (name.as_str(), placement.as_str().unwrap()))
            .collect();
        assert_eq!(placed, expected, "replica {replica}");
        applications.push(status["application_name"].as_str().unwrap().to_owned());
    }

    // The standby's ticked loops tick, and every tick is a standby's; the leader's pass.
    let outcomes = |metrics: &str, outcome: &str| ticks_of(metrics, Some(outcome));
    let standby_ticks = eventually(BOOT, "every ticked loop ticking on the standby", || async {
        let (_, body) = get(demo.replica_addr(standby), "/metrics").await.ok()?;
        let counted = outcomes(&body, "standby");
        (TICKED
            .iter()
            .all(|name| counted.get(*name).is_some_and(|n| *n >= 2)))
        .then_some(body)
    })
    .await;
    assert_eq!(
        outcomes(&standby_ticks, "passed"),
        BTreeMap::new(),
        "a standby runs no ticked pass"
    );
    let (_, leader_metrics) = get(demo.replica_addr(leader), "/metrics").await.unwrap();
    let passed = outcomes(&leader_metrics, "passed");
    for name in ["invitations-expire", "reachability-evaluator"] {
        assert!(
            passed.get(name).is_some_and(|n| *n > 0),
            "the leader passes {name}: {passed:?}"
        );
    }

    // Both replicas' every-replica relay spends from its own bucket.
    let client = db.connect("check").await.unwrap();
    let buckets = eventually(BOOT, "both replicas' rate-budget buckets", || async {
        let row = client
            .query_one(
                "SELECT coalesce(array_agg(bucket ORDER BY bucket), '{}') FROM plexsphere_demo.rate_budgets",
                &[],
            )
            .await
            .ok()?;
        let buckets: Vec<String> = row.get(0);
        (buckets.len() == 2).then_some(buckets)
    })
    .await;
    applications.sort();
    assert_eq!(buckets, applications);
    drop(client);

    demo.stop(MARGIN + Duration::from_secs(10)).await;
    db.cleanup().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_probe_quotes_its_own_loop_and_eight_ticked_loops_have_none() {
    // A closed port: the replica wires its loops and serves, but its boot passes never run, so
    // every loop probe fails with a text that names its loop.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed_port = closed.local_addr().unwrap().port();
    drop(closed);
    let demo = start(
        &format!("host=127.0.0.1 port={closed_port} user=postgres dbname=postgres"),
        None,
    )
    .await;

    let status = status(&demo).await;
    assert_eq!(strings(&status["workers"]), WORKERS, "{status}");
    assert_eq!(strings(&status["probes"]), probes(), "{status}");
    assert_eq!(
        status["sse_nonce_ttl_ms"], 300_000,
        "the TTL defaults to 5 minutes"
    );

    let (code, body) = demo.get("/readyz").await;
    let mut expected = vec!["[+]workers ok".to_owned()];
    expected.extend(PROBES.iter().map(|(probe, name)| {
        format!("[-]{probe} failed: plexsphere: background loop \"{name}\": boot pass not run yet")
    }));
    expected.push("readyz check failed".into());
    assert_eq!(
        (code, body.lines().collect::<Vec<_>>()),
        (503, expected.iter().map(String::as_str).collect())
    );
    for name in UNPROBED {
        assert!(TICKED.contains(&name), "{name} is a ticked loop");
        assert!(
            !body.contains(&format!("\"{name}\"")) && !body.contains(&format!("]{name} ")),
            "{name} has no probe: {body}"
        );
    }
    let mut every: Vec<&str> = UNPROBED
        .iter()
        .copied()
        .chain(PROBES.iter().map(|(_, name)| *name))
        .collect();
    every.sort_unstable();
    let mut ticked = TICKED.to_vec();
    ticked.sort_unstable();
    assert_eq!(every, ticked, "the probed and the unprobed are the fifteen");

    demo.stop(MARGIN + Duration::from_secs(10)).await;
}

/// A fresh database with the demo's schema.
async fn schema(db: &TestDb) -> Client {
    let mut client = db.connect("setup").await.unwrap();
    passes::create_schema(&mut client).await.unwrap();
    client
}

/// The names in `column` of `table`, sorted.
async fn names(client: &Client, column: &str, table: &str) -> Vec<String> {
    client
        .query(
            &format!("SELECT {column} FROM plexsphere_demo.{table} ORDER BY 1"),
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_budget_sweep_reclaims_the_buckets_idle_for_longer_than_an_hour() {
    let db = TestDb::create("demo_rate_budgets").await.unwrap();
    let client = schema(&db).await;
    assert_eq!(passes::RATE_BUDGET_IDLE, Duration::from_secs(3600));
    client
        .batch_execute(
            "INSERT INTO plexsphere_demo.rate_budgets (bucket, last_used) VALUES \
               ('idle-61m', now() - interval '61 minutes'), \
               ('idle-59m', now() - interval '59 minutes'), \
               ('spent-again', now() - interval '2 hours')",
        )
        .await
        .unwrap();
    passes::spend_rate_budget(&client, "spent-again")
        .await
        .unwrap();
    passes::spend_rate_budget(&client, "fresh").await.unwrap();

    // Another loop's pass leaves the buckets alone.
    passes::ticked_pass(
        &client,
        "invitations-expire",
        "test",
        Duration::from_secs(1),
    )
    .await
    .unwrap();
    assert_eq!(names(&client, "bucket", "rate_budgets").await.len(), 4);

    passes::ticked_pass(&client, "rate-budget-sweep", "test", Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(
        names(&client, "bucket", "rate_budgets").await,
        ["fresh", "idle-59m", "spent-again"]
    );
    db.cleanup().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_nonce_sweep_deletes_the_nonces_last_seen_before_now_minus_the_ttl() {
    let db = TestDb::create("demo_sse_nonces").await.unwrap();
    let mut client = schema(&db).await;
    let ttl = Duration::from_secs(300);
    client
        .batch_execute(
            "INSERT INTO plexsphere_demo.sse_nonces (nonce, last_seen) VALUES \
               ('seen-301s-ago', now() - interval '301 seconds'), \
               ('seen-299s-ago', now() - interval '299 seconds')",
        )
        .await
        .unwrap();
    assert!(passes::relay(&mut client).await.unwrap());
    assert_eq!(names(&client, "nonce", "sse_nonces").await.len(), 3);

    // Another loop's pass leaves the nonces alone.
    passes::ticked_pass(&client, "auth-state-sweep", "test", ttl)
        .await
        .unwrap();
    assert_eq!(names(&client, "nonce", "sse_nonces").await.len(), 3);

    // The pass's period is the TTL, and the TTL is its freshness window.
    passes::ticked_pass(&client, "sse-nonce-sweep", "test", ttl)
        .await
        .unwrap();
    let left = names(&client, "nonce", "sse_nonces").await;
    assert_eq!(left.len(), 2, "{left:?}");
    assert!(left.contains(&"seen-299s-ago".to_owned()), "{left:?}");
    assert!(!left.contains(&"seen-301s-ago".to_owned()), "{left:?}");
    db.cleanup().await.unwrap();
}
