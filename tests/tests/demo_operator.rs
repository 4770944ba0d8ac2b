//! What the demo shows its operator (issue 16 §4): its routes while the database does not
//! answer, the `--acquire` and `--fencing` flags with the start hint, and a stop whose unlock
//! got no answer printed as such rather than as a release.
//!
//! One replica at a 200 ms interval on its own database (or a closed port). Bounds are
//! `MARGIN` (3 s) plus what the scenario needs; the demo is built first by `demo_binary`.
#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a failed unwrap is a failed test"
)]

mod loops_support;

use std::time::Duration;

use loops_support::{DEMO_BOOT as BOOT, Demo, MARGIN, eventually, get};
use plexsphere_leader_tests::replica_process::dsn;
use plexsphere_leader_tests::{FaultProxy, Mode, TestDb};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_the_database_does_not_answer_the_demo_serves_its_probes_and_status() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed_port = closed.local_addr().unwrap().port();
    drop(closed);
    let demo = Demo::start(
        &format!("host=127.0.0.1 port={closed_port} user=postgres dbname=postgres"),
        &[],
        &[],
    )
    .await;

    let (code, body) = demo.get("/livez").await;
    assert_eq!(code, 200, "{body}");
    let (code, body) = demo.get("/readyz").await;
    assert_eq!(code, 503, "not ready before its boot passes ran: {body}");
    let (code, body) = demo.get("/status").await;
    assert_eq!(code, 200, "{body}");
    let status: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(status["is_leader"], false, "{status}");
    assert_eq!(status["leader"], serde_json::Value::Null, "{status}");
    assert_eq!(status["ready"], false, "{status}");

    let lines = demo.stop(MARGIN + Duration::from_secs(10)).await;
    assert!(
        !lines.iter().any(|line| line.contains("event=acquired")),
        "{lines:?}"
    );
    assert!(
        lines
            .last()
            .is_some_and(|line| line.ends_with("event=stopped")),
        "{lines:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_queues_and_fences_when_asked_and_says_what_to_try() {
    let db = TestDb::create("demo_queue_fencing").await.unwrap();
    let demo = Demo::start(
        &dsn(&db.config()),
        &["--acquire", "queue", "--fencing"],
        &[],
    )
    .await;

    let start = demo.line(BOOT, "event=start").await;
    assert!(start.contains(" acquire=queue fencing=true "), "{start}");
    let hint = demo.line(BOOT, "event=hint").await;
    assert!(
        hint.contains("kill -9") && hint.contains("/status"),
        "{hint}"
    );
    demo.line(BOOT, "event=acquired term=1").await;
    let status = eventually(BOOT, "the leader's epoch in /status", || async {
        let (code, body) = get(demo.addr, "/status").await.ok()?;
        let status: serde_json::Value = serde_json::from_str(&body).ok()?;
        (code == 200 && status["epoch"].is_u64()).then_some(status)
    })
    .await;
    assert_eq!(status["is_leader"], true, "{status}");
    let fenced: i64 = db
        .admin()
        .query_one(
            "SELECT epoch FROM plexsphere_leader_fence WHERE classid = 1886156915 AND objid = 1",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(status["epoch"], fenced, "the epoch is the fence table's");

    let lines = demo.stop(MARGIN + Duration::from_secs(10)).await;
    assert!(
        lines.iter().any(|line| line
            .ends_with(r#"event=released term=1 cause="election stopped: lock released""#)),
        "{lines:?}"
    );
    assert!(db.lock_holders().await.unwrap().is_empty());
    db.cleanup().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_whose_unlock_gets_no_answer_is_printed_as_such_not_as_a_release() {
    let db = TestDb::create("demo_unanswered_unlock").await.unwrap();
    let proxy = FaultProxy::in_front_of(&db.config()).await.unwrap();
    let demo = Demo::start(&dsn(&proxy.pg_config(&db.config())), &[], &[]).await;
    demo.line(BOOT, "event=acquired term=1").await;

    proxy.set_both(Mode::Blackhole);
    // The replica's stop waits at most its shutdown bound (8 s with these settings); the demo
    // then exits.
    let lines = demo.stop(MARGIN + Duration::from_secs(12)).await;
    let failed = lines
        .iter()
        .find(|line| line.contains("event=release-failed term=1"))
        .unwrap_or_else(|| panic!("a release-failed line in {lines:?}"));
    assert!(failed.contains("outcome=unanswered"), "{failed}");
    assert!(failed.contains("no answer within 2s"), "{failed}");
    assert!(
        !lines.iter().any(|line| line.contains("event=released")),
        "{lines:?}"
    );
    drop(proxy);
    db.cleanup().await.unwrap();
}
