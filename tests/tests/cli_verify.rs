//! `plexsphere-leader verify` (issue 49) against real endpoints, run in-process
//! (`plexsphere_leader_cli::run`): a direct server, the vacuous-lock emulation, PgBouncer in
//! transaction and in session mode, a read-only role and a role without the lease's
//! privileges, and a streaming hot standby. Each test has its own database (the standby its
//! own throwaway cluster) and checks the exit code (0 the configured mechanism can run, 1 it
//! cannot, 2 error), the verdict of each mechanism in the JSON answer, and the headline of the
//! text one.
//!
//! Bounds: every verification must finish within `VERIFY_BOUND` (20 s), a generous bound for a
//! loaded 2-core machine; locally one takes 10–35 ms direct and through PgBouncer (5 s when the
//! proof's second connection never comes: `verify::SECOND_WITHIN`), and the command's own
//! `--timeout` is 30 s.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use plexsphere_leader_cli as cli;
use plexsphere_leader_tests::replica_process::dsn;
use plexsphere_leader_tests::{Cluster, PgBouncer, PoolMode, TestDb, base_config, connect};
use serde_json::Value;
use tokio::time::Instant;

/// How long one verification may take here.
const VERIFY_BOUND: Duration = Duration::from_secs(20);

/// One run of `plexsphere-leader verify --dsn <dsn> <args>`: the exit code, stdout and stderr.
async fn verify(target: &tokio_postgres::Config, args: &[&str]) -> (u8, String, String) {
    let dsn = dsn(target);
    let mut argv = vec!["plexsphere-leader", "verify", "--dsn", dsn.as_str()];
    argv.extend_from_slice(args);
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let started = Instant::now();
    let code = cli::run(argv, &mut out, &mut err).await;
    let took = started.elapsed();
    let (out, err) = (
        String::from_utf8_lossy(&out).into_owned(),
        String::from_utf8_lossy(&err).into_owned(),
    );
    println!("verify {args:?}: exit {code} in {took:?}\n{out}{err}");
    assert!(took < VERIFY_BOUND, "verify took {took:?}");
    assert!(
        !out.contains(&dsn) && !err.contains(&dsn),
        "the DSN is never printed"
    );
    (code, out, err)
}

/// The JSON answer of `verify --json <args>`, with its exit code.
async fn verify_json(target: &tokio_postgres::Config, args: &[&str]) -> (u8, Value) {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let (code, out, err) = verify(target, &all).await;
    let value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}{err}"));
    (code, value)
}

async fn setup_lease(db: &TestDb) {
    plexsphere_leader::lease::setup(db.admin()).await.unwrap();
}

#[tokio::test]
async fn a_direct_server_is_go_for_the_advisory_lock_and_for_a_set_up_lease() {
    let db = TestDb::create("verify_direct").await.unwrap();
    let (code, out, _) = verify(&db.config(), &[]).await;
    assert_eq!(code, cli::EXIT_LEADER, "{out}");
    assert!(
        out.starts_with(&format!(
            "verify database {:?} for the advisory mechanism: GO",
            db.name()
        )),
        "{out}"
    );
    assert!(out.contains("exclusion proof:      proven"), "{out}");
    // No lease tables yet: the lease is no-go, with the setup as its fix.
    let (code, json) = verify_json(&db.config(), &["--mechanism", "lease"]).await;
    assert_eq!(code, cli::EXIT_NO_LEADER);
    assert_eq!(json["go"], false);
    assert_eq!(json["advisory"]["go"], true);
    assert!(
        json["lease"]["fix"]
            .as_str()
            .unwrap()
            .contains("lease::setup_in"),
        "{json}"
    );
    setup_lease(&db).await;
    let (code, json) = verify_json(&db.config(), &["--mechanism", "lease"]).await;
    assert_eq!(code, cli::EXIT_LEADER, "{json}");
    assert_eq!(json["lease"]["go"], true);
    assert_eq!(json["endpoint"]["multiplexed"], false);
    assert_eq!(json["endpoint"]["in_recovery"], false);
    assert_eq!(json["endpoint"]["idle_session_timeout"], true);
    assert!(json["endpoint"]["forwarded"].is_null(), "{json}");
    assert!(json["advisory"]["round_trip_ms"].as_f64().unwrap() > 0.0);
    assert!(json["lease"]["round_trip_ms"].as_f64().unwrap() > 0.0);
    // Both clocks are this machine's.
    assert!(
        json["endpoint"]["clock_offset_ms"].as_f64().unwrap().abs() < 1000.0,
        "{json}"
    );
    // Nothing is left behind: no advisory lock (the proof's key included).
    let locks: i64 = db
        .admin()
        .query_one(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' \
             AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(locks, 0);
    db.cleanup().await.unwrap();
}

#[tokio::test]
async fn a_lock_that_grants_everyone_is_no_go_for_the_advisory_lock_and_names_the_lease() {
    let db = TestDb::create("verify_vacuous").await.unwrap();
    db.make_advisory_locks_vacuous().await.unwrap();
    setup_lease(&db).await;
    let (code, json) = verify_json(&db.config(), &[]).await;
    assert_eq!(code, cli::EXIT_NO_LEADER, "{json}");
    assert_eq!(json["exclusion_proof"]["verdict"], "refuted");
    assert_eq!(json["advisory"]["go"], false);
    let reason = json["advisory"]["reason"].as_str().unwrap();
    assert!(reason.contains("does not exclude"), "{reason}");
    let fix = json["advisory"]["fix"].as_str().unwrap();
    assert!(fix.contains("Config::lease"), "{fix}");
    // Not a pooler: two sessions of their own.
    assert_eq!(json["endpoint"]["multiplexed"], false);
    let (code, _) = verify_json(&db.config(), &["--mechanism", "lease"]).await;
    assert_eq!(code, cli::EXIT_LEADER);
    db.cleanup().await.unwrap();
}

#[tokio::test]
async fn behind_pgbouncer_in_transaction_mode_the_lock_is_no_go_and_the_lease_go() {
    let db = TestDb::create("verify_pgb_tx").await.unwrap();
    setup_lease(&db).await;
    let bouncer = PgBouncer::start(&db.config(), PoolMode::Transaction, 1)
        .await
        .unwrap();
    let target = bouncer.pg_config(&db.config());
    let (code, json) = verify_json(&target, &[]).await;
    assert_eq!(code, cli::EXIT_NO_LEADER, "{json}");
    assert_eq!(json["endpoint"]["multiplexed"], true);
    let reason = json["advisory"]["reason"].as_str().unwrap();
    assert!(reason.contains("multiplexes sessions"), "{reason}");
    assert!(
        json["advisory"]["fix"]
            .as_str()
            .unwrap()
            .contains("Config::lease")
    );
    assert_eq!(json["lease"]["go"], true);
    assert_eq!(
        json["endpoint"]["forwarded"]["client_port"],
        u64::from(bouncer.port())
    );
    let notes = json["lease"]["notes"].to_string();
    assert!(notes.contains("server_login_retry"), "{notes}");
    let (code, out, _) = verify(&target, &["--mechanism", "lease"]).await;
    assert_eq!(code, cli::EXIT_LEADER, "{out}");
    assert!(out.contains("for the lease mechanism: GO"), "{out}");
    drop(bouncer);
    db.cleanup().await.unwrap();
}

#[tokio::test]
async fn behind_pgbouncer_in_session_mode_the_lock_is_go() {
    let db = TestDb::create("verify_pgb_session").await.unwrap();
    // Two server sessions: the proof holds two at once (the command's own is closed first).
    let bouncer = PgBouncer::start(&db.config(), PoolMode::Session, 2)
        .await
        .unwrap();
    let target = bouncer.pg_config(&db.config());
    let (code, json) = verify_json(&target, &[]).await;
    assert_eq!(code, cli::EXIT_LEADER, "{json}");
    assert_eq!(json["exclusion_proof"]["verdict"], "proven");
    assert_eq!(json["endpoint"]["multiplexed"], false);
    // The pooler shows as a forwarded port, and the advice on its reset query comes with it.
    let notes = json["advisory"]["notes"].to_string();
    assert!(notes.contains("DISCARD ALL"), "{notes}");
    drop(bouncer);
    db.cleanup().await.unwrap();
}

#[tokio::test]
async fn behind_a_session_mode_pool_of_one_server_session_the_first_owns_its_session() {
    let db = TestDb::create("verify_pgb_session_one").await.unwrap();
    // One server session: the proof's second connection waits in PgBouncer's queue while the
    // first, asked again, answers from its own session: a session-mode pooler, which carries
    // the advisory lock (an elector leads here; the lock's exclusion cannot be tested with one
    // server session, which the detail says).
    let bouncer = PgBouncer::start(&db.config(), PoolMode::Session, 1)
        .await
        .unwrap();
    let target = bouncer.pg_config(&db.config());
    let started = Instant::now();
    let (code, json) = verify_json(&target, &[]).await;
    let took = started.elapsed();
    assert_eq!(code, cli::EXIT_LEADER, "{json}");
    assert_eq!(json["exclusion_proof"]["verdict"], "proven");
    let detail = json["exclusion_proof"]["detail"].as_str().unwrap();
    assert!(detail.contains("one server session"), "{detail}");
    assert_eq!(json["endpoint"]["multiplexed"], false, "{json}");
    assert!(took >= cli::verify::SECOND_WITHIN, "{took:?}");
    drop(bouncer);
    db.cleanup().await.unwrap();
}

#[tokio::test]
async fn a_read_only_role_is_no_go_for_both_and_a_role_without_grants_for_the_lease() {
    let db = TestDb::create("verify_read_only").await.unwrap();
    setup_lease(&db).await;
    let role = format!("plx_verify_ro_{}", std::process::id());
    let maintenance = connect(&base_config().unwrap()).await.unwrap();
    maintenance
        .batch_execute(&format!(
            "DROP ROLE IF EXISTS {role}; CREATE ROLE {role} LOGIN; \
             ALTER ROLE {role} SET default_transaction_read_only = on"
        ))
        .await
        .unwrap();
    db.admin()
        .batch_execute(&format!(
            "GRANT SELECT, INSERT, UPDATE ON plexsphere_leader_lease, plexsphere_leader_fence \
             TO {role}"
        ))
        .await
        .unwrap();
    let mut target = db.config();
    target.user(&role);
    for mechanism in ["advisory", "lease"] {
        let (code, json) = verify_json(&target, &["--mechanism", mechanism]).await;
        assert_eq!(code, cli::EXIT_NO_LEADER, "{json}");
        assert_eq!(json["endpoint"]["read_only"], true);
        for verdict in ["advisory", "lease"] {
            assert_eq!(json[verdict]["go"], false, "{json}");
            let reason = json[verdict]["reason"].as_str().unwrap();
            assert!(reason.contains("read-only"), "{reason}");
            let fix = json[verdict]["fix"].as_str().unwrap();
            assert!(fix.contains("default_transaction_read_only = off"), "{fix}");
        }
    }
    // Read-write, but without INSERT on the fence table: the lease alone is no-go.
    maintenance
        .batch_execute(&format!(
            "ALTER ROLE {role} RESET default_transaction_read_only"
        ))
        .await
        .unwrap();
    db.admin()
        .batch_execute(&format!(
            "REVOKE INSERT ON plexsphere_leader_fence FROM {role}"
        ))
        .await
        .unwrap();
    let (code, json) = verify_json(&target, &["--mechanism", "lease"]).await;
    assert_eq!(code, cli::EXIT_NO_LEADER, "{json}");
    assert_eq!(json["advisory"]["go"], true, "{json}");
    let reason = json["lease"]["reason"].as_str().unwrap();
    assert!(
        reason.contains("lacks INSERT on public.plexsphere_leader_fence"),
        "{reason}"
    );
    assert!(json["lease"]["fix"].as_str().unwrap().starts_with("GRANT"));
    db.cleanup().await.unwrap();
    maintenance
        .batch_execute(&format!("DROP ROLE {role}"))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_standby_is_no_go_for_both_and_names_the_primary() {
    let primary = Cluster::start().await.unwrap();
    let standby = Cluster::start_standby_of(&primary).await.unwrap();
    let (code, json) = verify_json(&standby.config("postgres"), &[]).await;
    assert_eq!(code, cli::EXIT_NO_LEADER, "{json}");
    assert_eq!(json["endpoint"]["in_recovery"], true);
    for verdict in ["advisory", "lease"] {
        assert_eq!(json[verdict]["go"], false, "{json}");
        let reason = json[verdict]["reason"].as_str().unwrap();
        assert!(reason.contains("in recovery"), "{reason}");
        let fix = json[verdict]["fix"].as_str().unwrap();
        assert!(fix.contains("target_session_attrs=read-write"), "{fix}");
    }
    let (code, _) = verify_json(&primary.config("postgres"), &[]).await;
    assert_eq!(code, cli::EXIT_LEADER);
}

#[tokio::test]
async fn an_endpoint_that_cannot_be_reached_exits_2_without_printing_the_dsn() {
    // A port nothing listens on.
    let mut target = tokio_postgres::Config::new();
    target
        .host("127.0.0.1")
        .user("postgres")
        .port(1)
        .password("s3cret")
        .connect_timeout(Duration::from_secs(2));
    let (code, out, err) = verify(&target, &["--timeout", "5s"]).await;
    assert_eq!(code, cli::EXIT_ERROR, "{out}{err}");
    assert!(out.is_empty());
    assert!(err.starts_with("plexsphere-leader verify: "), "{err}");
    assert!(!err.contains("s3cret"), "{err}");
}

#[tokio::test]
async fn a_server_that_never_answers_exits_2_after_the_timeout_naming_what_it_waited_for() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let held = tokio::spawn(async move {
        let mut accepted = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            accepted.push(socket);
        }
    });
    let mut target = tokio_postgres::Config::new();
    target.host("127.0.0.1").port(port).user("postgres");
    let started = Instant::now();
    let (code, out, err) = verify(&target, &["--timeout", "1s"]).await;
    assert_eq!(code, cli::EXIT_ERROR, "{out}{err}");
    assert!(started.elapsed() >= Duration::from_secs(1));
    assert!(
        err.contains("no answer to the connection's startup"),
        "{err}"
    );
    held.abort();
}
