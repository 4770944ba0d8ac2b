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

/// Runs the demo with one replica at a 200 ms interval for `duration` on a free HTTP port, with
/// whatever `configure` adds (a DSN, environment); waits at most 2 minutes for it to exit.
async fn run_demo(duration: &str, configure: impl FnOnce(&mut Command)) -> std::process::Output {
    let binary = demo_binary().await;
    let port = free_ports(1);
    let mut command = Command::new(binary);
    command
        .args([
            "--replicas",
            "1",
            "--check-interval",
            "200ms",
            "--duration",
            duration,
        ])
        .arg("--http-port")
        .arg(port.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    configure(&mut command);
    tokio::time::timeout(Duration::from_secs(120), command.output())
        .await
        .expect("the demo exits after --duration")
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_any_dsn_or_local_server_the_demo_runs_on_a_throwaway_cluster_and_removes_it() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed_port = closed.local_addr().unwrap().port();
    drop(closed);
    let output = run_demo("3s", |demo| {
        demo.env_remove("PLEXSPHERE_DSN").env(
            "PLEXSPHERE_DEMO_LOCAL_DSN",
            format!("host=127.0.0.1 port={closed_port} user=postgres dbname=postgres"),
        );
    })
    .await;
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
    // The test server, as a role that does not exist.
    let mut refused = plexsphere_leader_tests::base_config().unwrap();
    refused.user("plx_no_such_role");
    let dsn = plexsphere_leader_tests::replica_process::dsn(&refused);
    let output = run_demo("2s", |demo| {
        demo.arg("--dsn").arg(dsn);
    })
    .await;
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

/// Issue 36: a command line the election refuses is refused before any replica starts, in the
/// flags' own words, and the demo exits non-zero.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_command_line_stops_the_demo_before_any_replica_starts() {
    let binary = demo_binary().await;
    for (flags, said) in [
        (&["--check-interval", "10ms"][..], "--check-interval 10ms: "),
        (
            &["--mechanism", "lease", "--acquire", "queue"][..],
            "use --acquire poll",
        ),
    ] {
        let output = tokio::time::timeout(
            Duration::from_secs(30),
            Command::new(&binary)
                .args(flags)
                .stdin(Stdio::null())
                .kill_on_drop(true)
                .output(),
        )
        .await
        .expect("a refusal is at once")
        .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{flags:?}: {stdout}{stderr}");
        assert!(stderr.contains(said), "{flags:?}: {stderr}");
        assert!(!stdout.contains("event=start"), "{flags:?}: {stdout}");
    }
}

/// Issue 36: when every replica fails (here none can serve its HTTP port), the demo exits
/// non-zero instead of reporting a clean stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_exits_non_zero_when_every_replica_failed() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let binary = demo_binary().await;
    let output = tokio::time::timeout(
        Duration::from_secs(120),
        Command::new(binary)
            .args([
                "--replicas",
                "1",
                "--check-interval",
                "200ms",
                "--duration",
                "30s",
            ])
            .arg("--http-port")
            .arg(port.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the demo exits once its replica failed")
    .unwrap();
    drop(taken);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stdout}{stderr}");
    assert!(stderr.contains("cannot serve HTTP"), "{stderr}");
    assert!(
        stderr.contains("every replica exited with an error"),
        "{stderr}"
    );
}

/// Issue 37: while the election has not started (the demo's schema fails to be made), `/status`
/// says what the replica waits for, with the server's own error, instead of
/// `check_failure: null`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_says_what_a_replica_waits_for_before_its_election_starts() {
    let mut refused = plexsphere_leader_tests::base_config().unwrap();
    refused.user("plx_no_such_role");
    let dsn = plexsphere_leader_tests::replica_process::dsn(&refused);
    let demo = loops_support::Demo::start(&dsn, &[], &[]).await;
    let waiting = loops_support::eventually(Duration::from_secs(60), "waiting_for", || async {
        let (code, body) = loops_support::get(demo.addr, "/status").await.ok()?;
        let status: serde_json::Value = serde_json::from_str(&body).ok()?;
        let waiting = status["waiting_for"].as_str()?.to_owned();
        (code == 200 && waiting.contains("does not exist")).then_some(waiting)
    })
    .await;
    assert!(waiting.starts_with("the demo schema"), "{waiting}");
    assert!(
        waiting.contains(r#"role "plx_no_such_role" does not exist"#),
        "{waiting}"
    );
    demo.stop(Duration::from_secs(15)).await;
}
