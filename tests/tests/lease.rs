//! The lease mechanism (`Config::lease`) against the real server, directly and through a real
//! PgBouncer in `pool_mode = transaction` with one server connection for three replicas:
//! one steady leader (one term, no transition), a graceful stop handed over at a standby's next
//! check, a dropped (crashed) leader's lease taken within its TTL plus one interval, and a
//! deposed leader's epoch refused by the fenced-write check. Each runs on both backends
//! (`<test>::deadpool`, `<test>::sqlx`) and on a database of its own.
//!
//! Bounds use the margins of `support` (I = 200 ms, MARGIN = 5 s); the lease's TTL is the
//! default, three intervals.
#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use plexsphere_leader::fencing::{self, FenceError};
use plexsphere_leader::{LockKey, TermEndCause};
use plexsphere_leader_tests::{Backend, TestDb};
use support::{I, MARGIN, Replica, STARTUP, lease_target, wait_for};
use tokio_util::sync::CancellationToken;

/// The default TTL: three intervals.
const TTL: Duration = Duration::from_millis(3 * 200);

/// How long leadership must hold still to count as steady.
const STEADY: Duration = Duration::from_secs(6);

/// Three lease replicas on pools of `backend` to `target` (the server, or PgBouncer).
fn fleet(_db: &TestDb, backend: Backend, target: &tokio_postgres::Config) -> Vec<Replica> {
    (0..3)
        .map(|r| {
            let name = format!("lease-{r}");
            let config = target.clone().application_name(&name).to_owned();
            let pool = backend.pool(&config, 2).expect("pool");
            Replica::spawn_with(pool, I, |config| {
                config.lease(Duration::ZERO).identity(&name)
            })
        })
        .collect()
}

fn leaders(fleet: &[Replica]) -> Vec<usize> {
    (0..fleet.len())
        .filter(|&r| fleet[r].elector.is_leader())
        .collect()
}

/// Waits for exactly one leader, then watches for `STEADY`: the same replica leads in the same
/// term throughout, and nobody else does. Returns the leader.
async fn steady_leader(fleet: &[Replica]) -> usize {
    wait_for(STARTUP, || leaders(fleet).len() == 1)
        .await
        .expect("one replica leads");
    let leader = leaders(fleet)[0];
    let term = fleet[leader].elector.leadership().term().unwrap();
    let started = tokio::time::Instant::now();
    while started.elapsed() < STEADY {
        assert_eq!(leaders(fleet), vec![leader], "one steady leader");
        assert_eq!(
            fleet[leader].elector.leadership().term(),
            Some(term),
            "one term"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    leader
}

async fn steady_then_graceful_handover(backend: Backend, pooled: bool) {
    let name = format!(
        "lease_graceful_{}_{backend}",
        if pooled { "pooled" } else { "direct" }
    );
    let (db, target, _bouncer) = lease_target(&name, pooled, backend).await;
    let mut fleet = fleet(&db, backend, &target);
    let leader = steady_leader(&fleet).await;
    // The CLI says who holds the lease (exit 0 while held), through the same endpoint.
    let (code, text) = lease_cli(&target).await;
    assert_eq!(code, plexsphere_leader_cli::EXIT_LEADER, "{text}");
    let identity = fleet[leader].elector.identity().to_owned();
    assert!(text.contains(&format!("held by {identity:?}")), "{text}");
    let token = CancellationToken::new();
    let epoch = fleet[leader].elector.term(&token).unwrap().epoch().unwrap();
    let stopped = tokio::time::Instant::now();
    fleet.remove(leader).stop().await.unwrap();
    let took = wait_for(I + MARGIN, || leaders(&fleet).len() == 1)
        .await
        .expect("a standby takes the released lease");
    println!("{name}: handover {:?} after the stop", stopped.elapsed());
    assert!(took <= I + MARGIN);
    // The deposed leader's epoch no longer passes the fenced-write check.
    let mut client = db.connect("fenced").await.unwrap();
    let transaction = client.transaction().await.unwrap();
    let stale = fencing::check(&transaction, LockKey::DEFAULT, epoch).await;
    assert!(matches!(stale, Err(FenceError::Stale { .. })), "{stale:?}");
    drop(transaction);
    for replica in fleet {
        replica.stop().await.unwrap();
    }
    let (code, text) = lease_cli(&target).await;
    assert!(text.contains("released or expired"), "{text}");
    assert_eq!(code, plexsphere_leader_cli::EXIT_NO_LEADER, "{text}");
    db.cleanup().await.unwrap();
}

/// `plexsphere-leader lease --dsn <target>`: its exit code and output.
async fn lease_cli(target: &tokio_postgres::Config) -> (u8, String) {
    let dsn = plexsphere_leader_tests::replica_process::dsn(target);
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let args = ["plexsphere-leader", "lease", "--dsn", dsn.as_str()];
    let code = plexsphere_leader_cli::run(args, &mut out, &mut err).await;
    let text = String::from_utf8_lossy(&out).into_owned() + &String::from_utf8_lossy(&err);
    (code, text)
}

async fn crashed_leader_hands_over_within_ttl_plus_an_interval(backend: Backend, pooled: bool) {
    let name = format!(
        "lease_crash_{}_{backend}",
        if pooled { "pooled" } else { "direct" }
    );
    let (db, target, _bouncer) = lease_target(&name, pooled, backend).await;
    let mut fleet = fleet(&db, backend, &target);
    let leader = steady_leader(&fleet).await;
    // Aborting the run drops it: the term ends as lost and the lease is left to expire.
    let crashed = fleet.remove(leader);
    let dropped = tokio::time::Instant::now();
    crashed.task.abort();
    let took = wait_for(TTL + I + MARGIN, || leaders(&fleet).len() == 1)
        .await
        .expect("a standby takes the expired lease");
    println!("{name}: takeover {:?} after the crash", dropped.elapsed());
    assert!(took <= TTL + I + MARGIN);
    assert!(matches!(
        crashed.elector.leadership().last_end().map(|end| end.cause),
        Some(TermEndCause::Lost(_))
    ));
    for replica in fleet {
        replica.stop().await.unwrap();
    }
    db.cleanup().await.unwrap();
}

async fn direct_steady_then_graceful(backend: Backend) {
    steady_then_graceful_handover(backend, false).await;
}

async fn direct_crash(backend: Backend) {
    crashed_leader_hands_over_within_ttl_plus_an_interval(backend, false).await;
}

async fn pooled_steady_then_graceful(backend: Backend) {
    steady_then_graceful_handover(backend, true).await;
}

async fn pooled_crash(backend: Backend) {
    crashed_leader_hands_over_within_ttl_plus_an_interval(backend, true).await;
}

on_both_backends!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    direct_steady_then_graceful
);
on_both_backends!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    direct_crash
);
on_both_backends!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    pooled_steady_then_graceful
);
on_both_backends!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    pooled_crash
);

/// Replicas that start together each run the setup: it serializes itself, so none fails (two
/// concurrent `CREATE TABLE IF NOT EXISTS` of one table fail one with a unique violation).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_setups_all_succeed() {
    let db = TestDb::create("lease_concurrent_setup").await.unwrap();
    let mut setups = tokio::task::JoinSet::new();
    for r in 0..8 {
        let client = db.connect(&format!("setup-{r}")).await.unwrap();
        setups.spawn(async move { plexsphere_leader::lease::setup(&client).await });
    }
    while let Some(result) = setups.join_next().await {
        result.unwrap().expect("every setup succeeds");
    }
    db.cleanup().await.unwrap();
}

/// The lease's tables live in the schema the election names (`Config::lease_schema`,
/// `lease::setup_in`), whatever a connection's `search_path` says: every statement names its
/// tables with the schema.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tables_live_in_the_schema_the_election_names() {
    let db = TestDb::create("lease_schema").await.unwrap();
    db.admin()
        .batch_execute("CREATE SCHEMA leader")
        .await
        .unwrap();
    let client = db.connect("setup").await.unwrap();
    plexsphere_leader::lease::setup_in(&client, "leader")
        .await
        .unwrap();
    let placed = "SELECT to_regclass('leader.plexsphere_leader_lease') IS NOT NULL, \
                  to_regclass('leader.plexsphere_leader_fence') IS NOT NULL, \
                  to_regclass('public.plexsphere_leader_lease') IS NULL";
    let row = db.admin().query_one(placed, &[]).await.unwrap();
    assert!(
        row.get::<_, bool>(0) && row.get::<_, bool>(1) && row.get::<_, bool>(2),
        "both tables in schema leader, none in public"
    );
    let fleet: Vec<Replica> = (0..3)
        .map(|r| {
            let name = format!("lease-{r}");
            let config = db.config().application_name(&name).to_owned();
            let pool = Backend::Deadpool.pool(&config, 2).expect("pool");
            Replica::spawn_with(pool, I, |config| {
                config
                    .lease(Duration::ZERO)
                    .lease_schema("leader")
                    .identity(&name)
            })
        })
        .collect();
    wait_for(STARTUP, || leaders(&fleet).len() == 1)
        .await
        .expect("one replica leads");
    let leader = leaders(&fleet)[0];
    let holder: String = db
        .admin()
        .query_one("SELECT holder FROM leader.plexsphere_leader_lease", &[])
        .await
        .unwrap()
        .get(0);
    let identity = fleet[leader].elector.identity().to_owned();
    assert!(holder.starts_with(&format!("{identity} ")), "{holder}");
    let status = fleet[leader].elector.lease_holder().await.unwrap().unwrap();
    assert_eq!(status.identity, identity);
    // A fenced write checks the lease's own fence, whatever the writer's search_path: the
    // epoch is current in `leader`, and a writer without `leader` on its path that checked the
    // unqualified name would find no fence table at all.
    let epoch = fleet[leader]
        .elector
        .leadership()
        .term()
        .unwrap()
        .epoch
        .unwrap();
    let schema = fleet[leader].elector.lease_schema().to_owned();
    assert_eq!(schema, "leader");
    let mut writer = db.connect("writer").await.unwrap();
    let transaction = writer.transaction().await.unwrap();
    plexsphere_leader::fencing::check_in(&transaction, &schema, fleet[leader].elector.key(), epoch)
        .await
        .expect("the current epoch, in the lease's schema");
    let unqualified =
        plexsphere_leader::fencing::check(&transaction, fleet[leader].elector.key(), epoch).await;
    assert!(
        matches!(
            unqualified,
            Err(plexsphere_leader::fencing::FenceError::MissingTable)
        ),
        "{unqualified:?}"
    );
    drop(transaction);
    for replica in fleet {
        replica.stop().await.unwrap();
    }
    db.cleanup().await.unwrap();
}

/// Issue 37, hole 1: a replica whose connections resolve unqualified names in another schema
/// (`options='-c search_path=other,public'`, as an `ALTER ROLE … SET search_path` or a
/// pooler's per-user setting would) used to create tables of its own there and lead a second
/// election under the same key (two leaders for a whole 14 s run). Every statement now names
/// the election's schema: its setup makes no table in `other`, and the three replicas run one
/// election, with one leader throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_whose_search_paths_differ_still_run_one_election() {
    let db = TestDb::create("lease_search_path").await.unwrap();
    db.admin()
        .batch_execute("CREATE SCHEMA other")
        .await
        .unwrap();
    let mut odd = db.config();
    odd.options("-c search_path=other,public");
    let configs = [db.config(), db.config(), odd];
    for config in &configs {
        // Each replica's own setup, as the demo and a service at start-up run it.
        let pool = Backend::Deadpool.pool(config, 1).expect("pool");
        pool.lease_setup().await.expect("setup");
    }
    let other = "SELECT to_regclass('other.plexsphere_leader_lease') IS NULL";
    assert!(
        db.admin()
            .query_one(other, &[])
            .await
            .unwrap()
            .get::<_, bool>(0),
        "no table in the odd replica's first schema"
    );
    let fleet: Vec<Replica> = configs
        .iter()
        .enumerate()
        .map(|(r, config)| {
            let name = format!("lease-{r}");
            let config = config.clone().application_name(&name).to_owned();
            let pool = Backend::Deadpool.pool(&config, 2).expect("pool");
            Replica::spawn_with(pool, I, |config| {
                config.lease(Duration::ZERO).identity(&name)
            })
        })
        .collect();
    let leader = steady_leader(&fleet).await;
    println!("one leader ({leader}) of one election for {STEADY:?}");
    for replica in fleet {
        replica.stop().await.unwrap();
    }
    db.cleanup().await.unwrap();
}

/// Issue 37, hole 1, the rest of it: replicas configured with different lease schemas
/// (`Config::lease_schema`), each with its tables set up, used to run two elections under one
/// key. Now the first schema to hold the key keeps it: a replica of another schema never
/// claims, and says why (a permanent `ElectionElsewhere` naming both schemas, with advice),
/// whether it starts after the leader or at the same instant (the claims of one key serialize
/// on a transaction lock, whatever their schema), and after the leader stops it still does
/// not claim (the key's row stays in the first schema).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_whose_lease_schemas_differ_run_one_election_and_the_odd_one_says_why() {
    for together in [false, true] {
        let db = TestDb::create(&format!("lease_two_schemas_{together}"))
            .await
            .unwrap();
        db.admin()
            .batch_execute("CREATE SCHEMA other")
            .await
            .unwrap();
        plexsphere_leader::lease::setup(db.admin()).await.unwrap();
        plexsphere_leader::lease::setup_in(db.admin(), "other")
            .await
            .unwrap();
        let spawn = |name: &str, schema: &'static str| {
            let pool = Backend::Deadpool.pool(&db.config(), 2).expect("pool");
            let name = name.to_owned();
            Replica::spawn_with(pool, I, move |config| {
                config
                    .lease(Duration::ZERO)
                    .lease_schema(schema)
                    .identity(&name)
            })
        };
        let first = spawn("lease-public", "public");
        if !together {
            wait_for(STARTUP, || first.elector.is_leader())
                .await
                .expect("the first replica leads");
        }
        let odd = spawn("lease-other", "other");
        let fleet = [first, odd];
        let leader = steady_leader(&fleet).await;
        let odd = 1 - leader;
        let failure = fleet[odd]
            .elector
            .check_failure()
            .expect("the odd replica says why it does not claim");
        println!("together={together}: leader {leader}; {failure:?}");
        assert_eq!(
            failure.class,
            plexsphere_leader_core::failures::FailureClass::Permanent
        );
        assert!(
            failure.error.contains("already runs in schema"),
            "{}",
            failure.error
        );
        assert!(
            failure
                .advice
                .as_deref()
                .is_some_and(|a| a.contains("lease_schema"))
        );
        let [first, second] = fleet;
        let (leading, standing) = if leader == 0 {
            (first, second)
        } else {
            (second, first)
        };
        leading.stop().await.unwrap();
        tokio::time::sleep(4 * I).await;
        assert!(
            !standing.elector.is_leader(),
            "the key's row stays in the first schema: the odd replica never claims"
        );
        standing.stop().await.unwrap();
        db.cleanup().await.unwrap();
    }
}

/// A lease elector's run of failed checks ends with the first check that works, as an advisory
/// one's does: here its claims fail (the lease table does not exist yet: `undefined_table`)
/// until the operator runs the setup, then the claim that leads clears
/// [`Elector::check_failure`](plexsphere_leader::Elector::check_failure) and the published
/// [`check_failing`](plexsphere_leader::Leadership::check_failing), and so do the leader's
/// renewals after one of theirs failed (the lease table renamed away under it, then back while
/// its lease is still trusted).
async fn the_failure_run_ends_with_a_claim_and_with_a_renewal(backend: Backend) {
    let db = TestDb::create(&format!("lease_failure_cleared_{}", backend.name()))
        .await
        .unwrap();
    let pool = backend.pool(&db.config(), 2).expect("pool");
    // A long TTL, so that the leader still trusts its lease while its renewals fail.
    let replica = Replica::spawn_with(pool, I, |config| {
        config
            .lease(Duration::from_secs(30))
            .identity("lease-failing")
    });
    wait_for(STARTUP, || replica.elector.check_failure().is_some())
        .await
        .expect("the claims fail while the table is missing");
    let mut leadership = replica.elector.subscribe();
    assert!(leadership.borrow_and_update().check_failing().is_some());
    plexsphere_leader::lease::setup(db.admin()).await.unwrap();
    wait_for(STARTUP, || replica.elector.is_leader())
        .await
        .expect("leads once the tables exist");
    assert_eq!(
        replica.elector.check_failure(),
        None,
        "the claim cleared it"
    );
    assert!(leadership.borrow_and_update().check_failing().is_none());

    let term = replica.elector.leadership().term();
    db.admin()
        .batch_execute("ALTER TABLE plexsphere_leader_lease RENAME TO plexsphere_leader_lease_away")
        .await
        .unwrap();
    wait_for(STARTUP, || replica.elector.check_failure().is_some())
        .await
        .expect("a failed renewal is a failed check");
    assert!(replica.elector.is_leader(), "the lease is still trusted");
    db.admin()
        .batch_execute("ALTER TABLE plexsphere_leader_lease_away RENAME TO plexsphere_leader_lease")
        .await
        .unwrap();
    wait_for(STARTUP, || replica.elector.check_failure().is_none())
        .await
        .expect("a renewal that works clears it");
    assert_eq!(replica.elector.leadership().term(), term, "the same term");
    replica.stop().await.unwrap();
    db.cleanup().await.unwrap();
}

on_both_backends!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    the_failure_run_ends_with_a_claim_and_with_a_renewal
);
