//! `TestDb`: isolation of advisory locks between test databases, cleanup, pools and the
//! session helpers, against the real local server.
#![allow(clippy::unwrap_used)] // Tests: a failed unwrap is a failed test.

use std::time::Duration;

use plexsphere_leader_tests::{TestDb, base_config, connect};
use tokio_postgres::Client;

async fn try_lock(client: &Client) -> bool {
    client
        .query_one("SELECT pg_try_advisory_lock(1886156915, 1)", &[])
        .await
        .unwrap()
        .get(0)
}

async fn database_exists(name: &str) -> bool {
    let maint = connect(&base_config().unwrap()).await.unwrap();
    let row = maint
        .query_one(
            "SELECT count(*) FROM pg_database WHERE datname = $1",
            &[&name],
        )
        .await
        .unwrap();
    row.get::<_, i64>(0) == 1
}

#[tokio::test]
async fn advisory_locks_in_one_test_database_do_not_block_another() {
    let one = TestDb::create("isolation_one").await.unwrap();
    let two = TestDb::create("isolation_two").await.unwrap();
    assert_ne!(one.name(), two.name());

    let a = one.connect("replica-a").await.unwrap();
    let b = one.connect("replica-b").await.unwrap();
    let c = two.connect("replica-c").await.unwrap();
    assert!(try_lock(&a).await, "the lock is free in a fresh database");
    assert!(
        !try_lock(&b).await,
        "a second session of the same database is refused"
    );
    assert!(try_lock(&c).await, "another database has its own lock");

    let db: String = c
        .query_one("SELECT current_database()", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(db, two.name());
    one.cleanup().await.unwrap();
    two.cleanup().await.unwrap();
}

#[tokio::test]
async fn cleanup_drops_the_database_even_with_open_sessions() {
    let db = TestDb::create("cleanup").await.unwrap();
    let name = db.name().to_owned();
    assert!(name.starts_with("plx_cleanup_"), "{name}");
    assert!(
        name.contains(&format!("_{}_", std::process::id())),
        "{name}"
    );
    let open = db.connect("lingering").await.unwrap();
    assert!(database_exists(&name).await);

    db.cleanup().await.unwrap();
    assert!(!database_exists(&name).await);
    assert!(
        open.simple_query("SELECT 1").await.is_err(),
        "FORCE ended it"
    );
}

#[tokio::test]
async fn dropping_without_cleanup_still_drops_the_database() {
    let db = TestDb::create("drop_fallback").await.unwrap();
    let pool = db.pool(2).unwrap();
    let conn = pool.get().await.unwrap();
    conn.simple_query("SELECT 1").await.unwrap();
    let name = db.name().to_owned();
    drop(db); // while `conn` still holds a session on the database
    assert!(
        conn.simple_query("SELECT 1").await.is_err(),
        "FORCE ended it"
    );
    assert!(!database_exists(&name).await);
}

#[tokio::test]
async fn pools_connect_to_the_test_database_with_their_application_name() {
    let db = TestDb::create("pool").await.unwrap();
    let pool = db.pool_with_app_name("replica-pool", 3).unwrap();
    assert_eq!(pool.status().max_size, 3);
    let conn = pool.get().await.unwrap();
    let row = conn
        .query_one(
            "SELECT current_database(), current_setting('application_name')",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), db.name());
    assert_eq!(row.get::<_, String>(1), "replica-pool");
    assert_eq!(db.session_count("replica-pool").await.unwrap(), 1);
    drop(conn);
    drop(pool);
    db.cleanup().await.unwrap();
}

#[tokio::test]
async fn sessions_backend_count_and_terminate() {
    let db = TestDb::create("sessions").await.unwrap();
    assert_eq!(
        db.backend_count().await.unwrap(),
        0,
        "harness sessions are not counted"
    );

    let a = db.connect("replica-a").await.unwrap();
    let _b = db.connect("replica-b").await.unwrap();
    let _other = db.connect("other").await.unwrap();
    assert_eq!(db.backend_count().await.unwrap(), 3);
    let replicas = db.sessions_of("replica-").await.unwrap();
    let names: Vec<&str> = replicas
        .iter()
        .map(|s| s.application_name.as_str())
        .collect();
    assert_eq!(names, ["replica-a", "replica-b"]);
    assert!(
        replicas[0].client_addr.is_some(),
        "TCP clients have an address"
    );

    let pid: i32 = a
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(replicas[0].pid, pid);
    assert!(db.terminate(pid).await.unwrap());
    let err = a.simple_query("SELECT 1").await.unwrap_err();
    assert!(
        err.is_closed() || err.code().is_some(),
        "the terminated client errors: {err}"
    );
    assert_eq!(db.session_count("replica-").await.unwrap(), 1);
    assert_eq!(db.backend_count().await.unwrap(), 2);
    assert!(!db.terminate(pid).await.unwrap(), "already gone");
    db.cleanup().await.unwrap();
}

#[tokio::test]
async fn a_bad_dsn_is_a_typed_error() {
    let mut config = base_config().unwrap();
    config.port(1).connect_timeout(Duration::from_secs(2));
    let err = TestDb::create_on(config, "bad").await.unwrap_err();
    assert!(
        matches!(err, plexsphere_leader_tests::HarnessError::Postgres(_)),
        "{err:?}"
    );
}
