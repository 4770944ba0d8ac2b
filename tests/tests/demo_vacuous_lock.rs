//! Issue 49, item 1, as an operator meets it: the demo's three advisory replicas on a server
//! whose advisory lock grants every session (PostgreSQL with one throwaway database's
//! two-`int4` lock functions replaced by SQL functions that answer `true`). No replica ever
//! says it acquired the lock, each replica's run fails with the exclusion proof's error, and
//! the demo exits non-zero with one line that names the lease mechanism.

#![allow(clippy::unwrap_used)]

mod loops_support;

use loops_support::{DEMO_BOOT as BOOT, Demo, MARGIN};
use plexsphere_leader_tests::TestDb;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_lock_that_grants_everyone_the_demo_never_leads_and_exits_non_zero() {
    let db = TestDb::create("demo_vacuous_lock").await.unwrap();
    db.make_advisory_locks_vacuous().await.unwrap();
    let dsn = format!(
        "host=127.0.0.1 port={} dbname={} user=postgres",
        port(&db),
        db.name()
    );
    let mut demo = Demo::start_replicas(&dsn, 3, "200ms", &[], &[]).await;
    let status = demo.wait_exit(BOOT + MARGIN).await;
    assert!(!status.success(), "{status}");
    assert_eq!(demo.acquisitions(), vec![], "no replica ever led");
    let logs = demo.logs();
    let why: Vec<&String> = logs
        .iter()
        .filter(|line| {
            line.contains("advisory locks do not exclude")
                && line.contains("this endpoint needs --mechanism lease")
        })
        .collect();
    assert!(!why.is_empty(), "{logs:#?}");
    assert!(
        logs.iter()
            .any(|line| line.contains("every replica exited with an error")),
        "{logs:#?}"
    );
    db.cleanup().await.unwrap();
}

/// The test server's port, as the harness connects to it.
fn port(db: &TestDb) -> u16 {
    db.config().get_ports().first().copied().unwrap_or(5432)
}
