//! The demo's last database fallback: with no `--dsn`, no `PLEXSPHERE_DSN` and no server on the
//! local address, it starts a throwaway cluster from the PostgreSQL binaries in a temporary
//! directory, elects a leader on it, and removes the directory on exit (`--duration`).
//!
//! The local address is pointed at a closed port with the demo's testing aid
//! `PLEXSPHERE_DEMO_LOCAL_DSN`, so the machine's own server stays untouched.
#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a failed unwrap is a failed test"
)]

mod loops_support;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use loops_support::{demo_binary, free_ports};
use tokio::process::Command;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_any_dsn_or_local_server_the_demo_runs_on_a_throwaway_cluster_and_removes_it() {
    let binary = demo_binary().await;
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed_port = closed.local_addr().unwrap().port();
    drop(closed);
    let port = free_ports(1);
    let output = Command::new(binary)
        .args([
            "--replicas",
            "1",
            "--check-interval",
            "200ms",
            "--duration",
            "3s",
            "--http-port",
        ])
        .arg(port.to_string())
        .env_remove("PLEXSPHERE_DSN")
        .env(
            "PLEXSPHERE_DEMO_LOCAL_DSN",
            format!("host=127.0.0.1 port={closed_port} user=postgres dbname=postgres"),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(120), output)
        .await
        .expect("the demo exits after --duration")
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    println!("{stdout}\n{stderr}");
    assert!(output.status.success(), "{}", output.status);
    let start = stdout.lines().next().unwrap_or_default();
    let dir = start
        .split("throwaway cluster in ")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .map(PathBuf::from)
        .unwrap_or_else(|| panic!("a throwaway cluster in {start:?}"));
    assert!(stdout.contains("replica=0 pid="), "{stdout}");
    assert!(stdout.contains("event=acquired term=1"), "{stdout}");
    assert!(stdout.contains("event=released term=1"), "{stdout}");
    assert!(stdout.trim_end().ends_with("event=stopped"), "{stdout}");
    assert!(!dir.exists(), "{} removed on exit", dir.display());
}

/// Issue 16 §4: the demo's start-up warning names the server's own error (a missing role, a
/// wrong password), not just the driver's `db error`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_that_refuses_the_demo_is_named_with_its_cause() {
    let binary = demo_binary().await;
    let port = free_ports(1);
    let base = plexsphere_leader_tests::base_config().unwrap();
    let server_port = base.get_ports().first().copied().unwrap_or(5432);
    let output = Command::new(binary)
        .args([
            "--replicas",
            "1",
            "--check-interval",
            "200ms",
            "--duration",
            "2s",
            "--http-port",
        ])
        .arg(port.to_string())
        .arg("--dsn")
        .arg(format!(
            "host=127.0.0.1 port={server_port} user=plx_no_such_role dbname=postgres"
        ))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(120), output)
        .await
        .expect("the demo exits after --duration")
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    let warning = stderr
        .lines()
        .find(|line| line.contains("create the demo schema; retrying"))
        .unwrap_or_else(|| panic!("a start-up warning in:\n{stderr}"));
    assert!(
        warning.contains(r#"role "plx_no_such_role" does not exist"#),
        "the server's own error is named: {warning}"
    );
}
