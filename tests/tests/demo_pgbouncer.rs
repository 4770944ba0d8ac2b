//! End to end: the demo with the lease mechanism (`--mechanism lease`), three replica
//! processes at I = 200 ms, connected through a real PgBouncer in `pool_mode = transaction`
//! (which cannot carry a session advisory lock). One replica leads, with no transition, for
//! `STEADY` (60 s); `/status` says who holds the lease and until when; SIGKILL of the leader's
//! process: another replica leads within the crash bound, TTL + I (0.8 s), plus `MARGIN`.
//!
//! `cargo test -p plexsphere-leader-tests --test demo_pgbouncer -- --nocapture` prints the demo's
//! lines and the figures; this is the documented way to watch the demo behind PgBouncer (the
//! test installs PgBouncer from Debian's packages when it is missing).
#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a failed unwrap is a failed test"
)]

mod loops_support;

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use loops_support::{I, MARGIN, demo_binary, eventually, free_ports, get};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use plexsphere_leader_tests::{PgBouncer, PoolMode, TestDb};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;
use tokio::time::Instant;

/// How long three replica processes may take to boot and elect a leader.
const BOOT: Duration = Duration::from_secs(30);

/// How long leadership must hold still.
const STEADY: Duration = Duration::from_secs(60);

/// The lease's TTL: the default, three intervals.
const TTL: Duration = Duration::from_millis(600);

/// `(replica, pid)` of every `event=acquired` line so far.
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
async fn behind_a_transaction_mode_pgbouncer_the_lease_demo_keeps_one_leader_and_fails_over() {
    let binary = demo_binary().await;
    let db = TestDb::create("demo_pgbouncer").await.unwrap();
    let bouncer = PgBouncer::start(&db.config(), PoolMode::Transaction, 4)
        .await
        .expect("PgBouncer");
    let dsn = format!(
        "host=127.0.0.1 port={} dbname={} user=postgres",
        bouncer.port(),
        db.name()
    );
    let port = free_ports(3);
    let mut demo = Command::new(binary)
        .args([
            "--replicas",
            "3",
            "--check-interval",
            "200ms",
            "--mechanism",
            "lease",
            "--http-port",
        ])
        .arg(port.to_string())
        .arg("--dsn")
        .arg(&dsn)
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
    let steady_from = Instant::now();
    let leader_addr = std::net::SocketAddr::from(([127, 0, 0, 1], port + leader));
    while steady_from.elapsed() < STEADY {
        assert_eq!(
            acquisitions(&lines),
            vec![(leader, leader_pid)],
            "one leader, no transition"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    println!(
        "one leader and no transition for {:?}",
        steady_from.elapsed()
    );
    let status = eventually(BOOT, "the leader's /status", || async {
        let (code, body) = get(leader_addr, "/status").await.ok()?;
        let status: serde_json::Value = serde_json::from_str(&body).ok()?;
        (code == 200 && status["lease"]["held"] == true).then_some(status)
    })
    .await;
    assert_eq!(status["is_leader"], true);
    assert_eq!(status["term"], 1);
    assert_eq!(
        status["lease"]["identity"], status["application_name"],
        "{status}"
    );
    assert!(status["lease"]["expires_at"].is_string(), "{status}");
    assert!(
        status["epoch"].is_u64(),
        "every lease term has an epoch: {status}"
    );

    let killed_at = Instant::now();
    kill(
        Pid::from_raw(i32::try_from(leader_pid).unwrap()),
        Signal::SIGKILL,
    )
    .unwrap();
    let bound = TTL + I + MARGIN;
    let (successor, _) = eventually(bound, "another replica leads", || async {
        acquisitions(&lines)
            .into_iter()
            .find(|(replica, _)| *replica != leader)
    })
    .await;
    let handover = killed_at.elapsed();
    println!("handover after SIGKILL: {handover:?} (bound {bound:?})");
    assert!(handover <= bound, "{handover:?}");
    let successor_addr = std::net::SocketAddr::from(([127, 0, 0, 1], port + successor));
    let (_, body) = get(successor_addr, "/status").await.unwrap();
    assert!(body.contains("\"is_leader\":true"), "{body}");

    kill(
        Pid::from_raw(i32::try_from(demo.id().unwrap()).unwrap()),
        Signal::SIGTERM,
    )
    .unwrap();
    let exit = tokio::time::timeout(Duration::from_secs(20), demo.wait())
        .await
        .expect("the demo exits")
        .unwrap();
    assert!(exit.success(), "{exit:?}");
    drop(bouncer);
    db.cleanup().await.unwrap();
}
