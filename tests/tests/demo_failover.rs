//! End to end: the demo with three replica processes and a 200 ms check interval on its own
//! database; SIGKILL of the leader's process; another replica leads within about one interval.
//!
//! The bound is I: on one host SIGKILL closes the socket, the server ends the session at once, and
//! a standby takes the free lock at its next check (≤ I). It is asserted as [`loaded`]`(I)` =
//! 5 s, ten times the bound plus `MARGIN` (3 s), which covers a 2-core machine busy with other
//! work (issue 49, item 6: the same shape of wait timed out at 3.8 s in `demo_pgbouncer.rs`) and
//! the output pipe. The test builds the demo
//! example first (a no-op when it is fresh) with the same target directory and profile as
//! itself.
#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a failed unwrap is a failed test"
)]

mod loops_support;

use std::time::Duration;

use loops_support::{DEMO_BOOT as BOOT, Demo, I, MARGIN, eventually, get, lock_holders, post};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use plexsphere_leader_tests::TestDb;
use plexsphere_leader_tests::replica_process::dsn;
use tokio::time::Instant;

/// How many times its mechanism's bound a wait after a fault may take on a loaded 2-core
/// machine (issue 49, item 6); measured handovers are far below it (`println!` below).
const LOAD_FACTOR: u32 = 10;

/// `bound` widened for a loaded machine: `bound × LOAD_FACTOR + MARGIN`.
fn loaded(bound: Duration) -> Duration {
    bound * LOAD_FACTOR + MARGIN
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_leaders_process_hands_leadership_to_another_replica_within_about_one_interval()
{
    let db = TestDb::create("demo_failover").await.unwrap();
    let demo = Demo::start_replicas(&dsn(&db.config()), 3, "200ms", &[], &[]).await;

    let (leader, leader_pid) = eventually(BOOT, "a replica leads", || async {
        demo.acquisitions().first().copied()
    })
    .await;
    let leader_addr = demo.replica_addr(leader);
    let status = eventually(BOOT, "the leader's /status", || async {
        let (code, body) = get(leader_addr, "/status").await.ok()?;
        let status: serde_json::Value = serde_json::from_str(&body).ok()?;
        (code == 200 && status["lock_backend_pid"].is_i64()).then_some(status)
    })
    .await;
    assert_eq!(status["replica"], u64::from(leader));
    assert_eq!(status["pid"], u64::from(leader_pid));
    assert_eq!(status["is_leader"], true);
    assert_eq!(status["term"], 1);
    let holders = lock_holders(&db).await;
    assert_eq!(holders.len(), 1);
    assert_eq!(
        status["lock_backend_pid"],
        i64::from(holders[0]),
        "the lock session's backend"
    );
    // Who leads, as the server tells it: the same from the leader and from a standby.
    assert_eq!(status["leader"]["pid"], i64::from(holders[0]));
    assert_eq!(status["leader"]["identity"], status["application_name"]);
    assert!(status["leader"]["since"].is_string(), "{status}");
    assert_eq!(status["live"], true, "a leader whose checks pass is live");
    let standby_addr = demo.replica_addr((leader + 1) % 3);
    let from_standby = eventually(BOOT, "a standby's /status", || async {
        let (code, body) = get(standby_addr, "/status").await.ok()?;
        let status: serde_json::Value = serde_json::from_str(&body).ok()?;
        (code == 200).then_some(status)
    })
    .await;
    assert_eq!(from_standby["is_leader"], false);
    assert_eq!(
        from_standby["leader"]["pid"],
        i64::from(holders[0]),
        "{from_standby}"
    );
    assert_eq!(from_standby["lock_backend_pid"], serde_json::Value::Null);
    let (code, _) = get(standby_addr, "/livez").await.unwrap();
    assert_eq!(code, 200);

    let killed_at = Instant::now();
    kill(
        Pid::from_raw(i32::try_from(leader_pid).unwrap()),
        Signal::SIGKILL,
    )
    .unwrap();
    let (successor, _) = eventually(loaded(I), "another replica leads", || async {
        demo.acquisitions()
            .into_iter()
            .find(|(replica, _)| *replica != leader)
    })
    .await;
    let handover = killed_at.elapsed();
    println!("handover after SIGKILL: {handover:?}");
    assert!(handover <= loaded(I), "{handover:?}");
    let successor_addr = demo.replica_addr(successor);
    let (_, body) = get(successor_addr, "/status").await.unwrap();
    assert!(body.contains("\"is_leader\":true"), "{body}");
    eventually(loaded(I), "the demo reports the killed replica", || async {
        demo.lines()
            .iter()
            .any(|line| {
                line.contains(&format!("pid={leader_pid} event=exited")) && line.contains("SIGKILL")
            })
            .then_some(())
    })
    .await;

    // The operator resigns the successor: the last replica takes over.
    let (code, body) = post(successor_addr, "/resign").await.unwrap();
    assert_eq!((code, body.as_str()), (200, "resign requested\n"));
    let (last, _) = eventually(loaded(I + I), "the remaining replica leads", || async {
        demo.acquisitions()
            .into_iter()
            .find(|(replica, _)| *replica != leader && *replica != successor)
    })
    .await;
    assert!(
        demo.lines().iter().any(|l| {
            l.contains(&format!("replica={successor} pid=")) && l.contains("event=resigned")
        }),
        "the successor reports its resignation"
    );

    // A clean stop: every replica releases the lock and the demo exits 0.
    let lines = demo.stop(Duration::from_secs(20)).await;
    assert!(
        lines.last().is_some_and(|l| l.ends_with("event=stopped")),
        "the demo's last line: {:?}",
        lines.last()
    );
    let released = format!("replica={last} pid=");
    assert!(
        lines
            .iter()
            .any(|l| l.contains(&released) && l.contains("event=released")),
        "the last leader released the lock"
    );
    assert!(lock_holders(&db).await.is_empty());
    db.cleanup().await.unwrap();
}
