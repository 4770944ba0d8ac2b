//! End to end: the demo with three replica processes and a 200 ms check interval on its own
//! database; SIGKILL of the leader's process; another replica leads within about one interval.
//!
//! The bound asserted is `I + MARGIN` (200 ms + 3 s): on one host SIGKILL closes the socket, the
//! server ends the session at once, and a standby takes the free lock at its next check (≤ I);
//! the margin covers a loaded 2-core machine and the output pipe. The test builds the demo
//! example first (a no-op when it is fresh) with the same target directory and profile as
//! itself.
#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a failed unwrap is a failed test"
)]

mod loops_support;

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use loops_support::{I, MARGIN, demo_binary, eventually, free_ports, get, lock_holders, post};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use plexsphere_leader_tests::TestDb;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;
use tokio::time::Instant;

/// How long three replica processes may take to boot and elect a leader.
const BOOT: Duration = Duration::from_secs(30);

/// A key=value DSN of the test database.
fn dsn_of(db: &TestDb) -> String {
    let config = db.config();
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
        Some(tokio_postgres::config::Host::Unix(path)) => path.display().to_string(),
        None => "127.0.0.1".into(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let mut dsn = format!("host={host} port={port} dbname={}", db.name());
    if let Some(user) = config.get_user() {
        dsn.push_str(&format!(" user={user}"));
    }
    if let Some(password) = config.get_password() {
        dsn.push_str(&format!(" password={}", String::from_utf8_lossy(password)));
    }
    dsn
}

/// `(replica, pid, term)` of every `event=acquired` line so far.
fn acquisitions(lines: &Mutex<Vec<String>>) -> Vec<(u16, u32)> {
    lines
        .lock()
        .unwrap()
        .iter()
        .filter(|line| line.contains("event=acquired"))
        .map(|line| (field(line, "replica"), field(line, "pid")))
        .collect()
}

fn field<T: std::str::FromStr>(line: &str, key: &str) -> T {
    line.split_whitespace()
        .find_map(|word| word.strip_prefix(&format!("{key}=")))
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("{key}= in {line:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_leaders_process_hands_leadership_to_another_replica_within_about_one_interval()
{
    let binary = demo_binary().await;
    let db = TestDb::create("demo_failover").await.unwrap();
    let port = free_ports(3);
    let mut demo = Command::new(binary)
        .args([
            "--replicas",
            "3",
            "--check-interval",
            "200ms",
            "--http-port",
        ])
        .arg(port.to_string())
        .arg("--dsn")
        .arg(dsn_of(&db))
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let lines = Arc::new(Mutex::new(Vec::new()));
    let stdout = demo.stdout.take().unwrap();
    tokio::spawn({
        let lines = Arc::clone(&lines);
        async move {
            let mut reader = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                println!("{line}");
                lines.lock().unwrap().push(line);
            }
        }
    });

    let (leader, leader_pid) = eventually(BOOT, "a replica leads", || async {
        acquisitions(&lines).first().copied()
    })
    .await;
    let leader_addr = std::net::SocketAddr::from(([127, 0, 0, 1], port + leader));
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
    let standby_addr = std::net::SocketAddr::from(([127, 0, 0, 1], port + (leader + 1) % 3));
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
    let (successor, _) = eventually(I + MARGIN, "another replica leads", || async {
        acquisitions(&lines)
            .into_iter()
            .find(|(replica, _)| *replica != leader)
    })
    .await;
    let handover = killed_at.elapsed();
    println!("handover after SIGKILL: {handover:?}");
    assert!(handover <= I + MARGIN, "{handover:?}");
    let successor_addr = std::net::SocketAddr::from(([127, 0, 0, 1], port + successor));
    let (_, body) = get(successor_addr, "/status").await.unwrap();
    assert!(body.contains("\"is_leader\":true"), "{body}");
    eventually(MARGIN, "the demo reports the killed replica", || async {
        let lines = lines.lock().unwrap();
        lines
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
    let (last, _) = eventually(I + I + MARGIN, "the remaining replica leads", || async {
        acquisitions(&lines)
            .into_iter()
            .find(|(replica, _)| *replica != leader && *replica != successor)
    })
    .await;
    assert!(
        lines.lock().unwrap().iter().any(|l| {
            l.contains(&format!("replica={successor} pid=")) && l.contains("event=resigned")
        }),
        "the successor reports its resignation"
    );

    // A clean stop: every replica releases the lock and the demo exits 0.
    kill(
        Pid::from_raw(i32::try_from(demo.id().unwrap()).unwrap()),
        Signal::SIGTERM,
    )
    .unwrap();
    let exit = tokio::time::timeout(Duration::from_secs(20), demo.wait())
        .await
        .expect("the demo exits after SIGTERM")
        .unwrap();
    assert!(exit.success(), "{exit}");
    eventually(MARGIN, "the demo's last line", || async {
        let lines = lines.lock().unwrap();
        lines
            .last()
            .is_some_and(|l| l.ends_with("event=stopped"))
            .then_some(())
    })
    .await;
    let released = format!("replica={last} pid=");
    assert!(
        lines
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.contains(&released) && l.contains("event=released")),
        "the last leader released the lock"
    );
    assert!(lock_holders(&db).await.is_empty());
    db.cleanup().await.unwrap();
}
