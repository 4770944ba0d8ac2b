//! End to end: the demo's `--rollout` (issue 41). Three ranked replica processes of version
//! 1.0.0 at a 200 ms interval; the demo restarts them one at a time with version 1.1.0 and
//! prints each leadership move. Leadership ends on the new version, having moved to it exactly
//! once and never back; then the demo keeps running until stopped.
//!
//! Only the outcome is asserted, within generous bounds (the whole rollout: the boot, three
//! graceful stops and four settling spans of four intervals each, on a loaded 2-core machine).
#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a failed unwrap is a failed test"
)]

mod loops_support;

use std::time::Duration;

use loops_support::{DEMO_BOOT, Demo};
use plexsphere_leader_tests::TestDb;
use plexsphere_leader_tests::replica_process::dsn;

/// The rollout after the boot: three stops (each bounded by the demo at 10 s) and settling.
const ROLLOUT: Duration = Duration::from_secs(90);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_moves_leadership_once_to_the_new_version() {
    let db = TestDb::create("demo_rollout").await.unwrap();
    let demo = Demo::start_replicas(&dsn(&db.config()), 3, "200ms", &["--rollout"], &[]).await;

    let done = demo.line(DEMO_BOOT + ROLLOUT, "event=rollout-done").await;
    println!("{done}");
    let lines = demo.lines();
    let moves: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("event=leadership-moved"))
        .collect();
    let to_new = moves
        .iter()
        .filter(|l| l.contains("@1.0.0 to=") && l.contains("version=1.1.0"))
        .count();
    let back = moves
        .iter()
        .filter(|l| l.contains("@1.1.0 to=") && l.contains("version=1.0.0"))
        .count();
    assert_eq!(to_new, 1, "exactly one move to the new version: {moves:#?}");
    assert_eq!(back, 0, "never back to the old version: {moves:#?}");
    assert!(done.contains("to_new=1 back_to_old=0"), "{done}");
    assert!(
        done.ends_with("version=1.1.0"),
        "the new version leads: {done}"
    );
    // Every replica was restarted with the new version.
    let restarted = lines
        .iter()
        .filter(|l| l.contains("event=started") && l.contains("version=1.1.0"))
        .count();
    assert_eq!(restarted, 3, "{lines:#?}");

    // It keeps running: the leader of the new version still leads a while later.
    let acquired_new = || {
        demo.lines()
            .iter()
            .filter(|l| l.contains("event=acquired") && l.contains("version=1.1.0"))
            .count()
    };
    let before = acquired_new();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(acquired_new(), before, "no further move after the rollout");
    // The three old replicas exited (stopped by the rollout), no new one.
    let exits = demo
        .lines()
        .iter()
        .filter(|l| l.contains("event=exited"))
        .count();
    assert_eq!(exits, 3, "{:#?}", demo.lines());

    let lines = demo.stop(Duration::from_secs(30)).await;
    assert!(
        lines.last().is_some_and(|l| l.ends_with("event=stopped")),
        "the demo's last line: {:?}",
        lines.last()
    );
    db.cleanup().await.unwrap();
}
