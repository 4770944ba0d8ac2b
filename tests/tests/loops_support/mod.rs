//! Helpers of the loops and demo tests: a replica with its background plane and HTTP routes,
//! HTTP GET over a plain socket, and polling.
#![allow(dead_code, reason = "each test binary uses a different subset")]
#![allow(unreachable_pub, reason = "a module of test binaries, not a library")]
#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a failed unwrap is a failed test"
)]

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use plexsphere_leader_tests::TestDb;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

/// The check interval and tick period of these tests.
pub const I: Duration = Duration::from_millis(200);

/// Slack added to every time bound: scheduling on a loaded 2-core machine, connection setup,
/// round trips. Bounds are asserted as `bound + MARGIN`.
pub const MARGIN: Duration = Duration::from_millis(3_000);

/// Serves `router` on an ephemeral port of 127.0.0.1 until `stop` is cancelled.
pub async fn serve(router: axum::Router, stop: CancellationToken) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, router)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await
            .unwrap();
    });
    addr
}

/// `GET path` over HTTP/1.0: the status code and the body.
pub async fn get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    request(addr, "GET", path).await
}

/// `POST path` with an empty body on `addr`: the status code and the body.
#[allow(dead_code)] // reason: not every test binary posts
pub async fn post(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    request(addr, "POST", path).await
}

async fn request(addr: SocketAddr, method: &str, path: &str) -> std::io::Result<(u16, String)> {
    let mut stream = TcpStream::connect(addr).await?;
    let request = format!(
        "{method} {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}

/// Polls `check` every 20 ms until it returns `Some`, at most `within`.
pub async fn eventually<T, F, Fut>(within: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {within:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The backend pids holding the leader lock in `db`.
pub async fn lock_holders(db: &TestDb) -> Vec<i32> {
    db.lock_holders().await.unwrap()
}

/// The demo example's binary, built if needed.
pub async fn demo_binary() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .unwrap()
        .to_path_buf();
    let target_dir = profile_dir.parent().unwrap();
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut build = tokio::process::Command::new(cargo);
    build
        .current_dir(&workspace)
        .args([
            "build",
            "--quiet",
            "-p",
            "plexsphere-leader-service",
            "--example",
            "demo",
            "--target-dir",
        ])
        .arg(target_dir);
    if profile_dir
        .file_name()
        .is_some_and(|name| name == "release")
    {
        build.arg("--release");
    }
    let status = tokio::time::timeout(Duration::from_secs(600), build.status())
        .await
        .expect("building the demo finishes")
        .expect("cargo runs");
    assert!(status.success(), "cargo build --example demo failed");
    let binary = profile_dir.join("examples").join("demo");
    assert!(binary.exists(), "{} exists", binary.display());
    binary
}

/// A base port with `n` free consecutive ports on 127.0.0.1, never one handed out before in this
/// process: tests of one binary run at once, and a port checked free is only bound later (by
/// the demo), so two calls must not start from the same place.
pub fn free_ports(n: u16) -> u16 {
    static HANDED_OUT: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(0);
    let seed = u16::try_from(std::process::id() % 20_000).unwrap();
    loop {
        let offset = HANDED_OUT.fetch_add(n + 1, std::sync::atomic::Ordering::Relaxed);
        assert!(offset < 20_000, "free ports");
        let base = 30_000 + (seed + offset) % 30_000;
        if base + n <= 60_000
            && (0..n).all(|i| std::net::TcpListener::bind(("127.0.0.1", base + i)).is_ok())
        {
            return base;
        }
    }
}

/// Reads `stream` line by line into `into` until it ends, passing each line to `echo` first.
fn collect_lines(
    stream: impl tokio::io::AsyncRead + Unpin + Send + 'static,
    into: &std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    echo: fn(&str),
) {
    use tokio::io::AsyncBufReadExt;
    let into = std::sync::Arc::clone(into);
    tokio::spawn(async move {
        let mut reader = tokio::io::BufReader::new(stream).lines();
        while let Ok(Some(line)) = reader.next_line().await {
            echo(&line);
            into.lock().unwrap().push(line);
        }
    });
}

/// A running demo of one replica at a 200 ms interval: its standard output and its log lines
/// (standard error), line by line, and its HTTP address.
pub struct Demo {
    child: tokio::process::Child,
    lines: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    logs: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    /// Where the replica serves its routes.
    pub addr: SocketAddr,
}

/// How long one replica may take to build, boot and lead.
pub const DEMO_BOOT: Duration = Duration::from_secs(30);

impl Demo {
    /// Starts the demo with one replica at 200 ms on `dsn`, with `extra` arguments and the
    /// environment changes `env` (`None` removes the variable). `RUST_LOG` is `warn`.
    pub async fn start(dsn: &str, extra: &[&str], env: &[(&str, Option<&str>)]) -> Self {
        Self::start_replicas(dsn, 1, "200ms", extra, env).await
    }

    /// [`start`](Self::start) with `replicas` replicas at `interval`; replica `i` serves on
    /// [`addr`](Self::addr)'s port plus `i`.
    pub async fn start_replicas(
        dsn: &str,
        replicas: u16,
        interval: &str,
        extra: &[&str],
        env: &[(&str, Option<&str>)],
    ) -> Self {
        let binary = demo_binary().await;
        let port = free_ports(replicas);
        let mut command = tokio::process::Command::new(binary);
        command
            .args([
                "--replicas",
                &replicas.to_string(),
                "--check-interval",
                interval,
            ])
            .arg("--http-port")
            .arg(port.to_string())
            .arg("--dsn")
            .arg(dsn)
            .args(extra)
            .env("RUST_LOG", "warn")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        for (name, value) in env {
            match value {
                Some(value) => command.env(name, value),
                None => command.env_remove(name),
            };
        }
        let mut child = command.spawn().unwrap();
        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let logs = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        collect_lines(child.stdout.take().unwrap(), &lines, |line| {
            println!("{line}")
        });
        collect_lines(child.stderr.take().unwrap(), &logs, |line| {
            eprintln!("{line}")
        });
        Self {
            child,
            lines,
            logs,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
        }
    }

    /// Where replica `replica` serves its routes.
    pub fn replica_addr(&self, replica: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.addr.port() + replica))
    }

    /// Every line printed so far.
    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }

    /// Every log line so far (the replicas' `tracing` output on standard error, each line
    /// prefixed `replica <i> | `), also passed on to this test's standard error.
    pub fn logs(&self) -> Vec<String> {
        self.logs.lock().unwrap().clone()
    }

    /// `(replica, pid)` of every `event=acquired` line so far, in order.
    pub fn acquisitions(&self) -> Vec<(u16, u32)> {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .filter(|line| line.contains("event=acquired"))
            .map(|line| (field(line, "replica"), field(line, "pid")))
            .collect()
    }

    /// The first line that contains `text`, waiting at most `within`.
    pub async fn line(&self, within: Duration, text: &str) -> String {
        eventually(within, text, || async {
            self.lines
                .lock()
                .unwrap()
                .iter()
                .find(|line| line.contains(text))
                .cloned()
        })
        .await
    }

    /// `GET path`: the status code and the body, once the replica answers at all.
    pub async fn get(&self, path: &str) -> (u16, String) {
        eventually(DEMO_BOOT, path, || async {
            get(self.addr, path).await.ok()
        })
        .await
    }

    /// Waits at most `within` for the demo to exit on its own (every replica failed, say), and
    /// for its last lines.
    #[allow(
        dead_code,
        reason = "used by some of the test binaries that include this module"
    )]
    pub async fn wait_exit(&mut self, within: Duration) -> std::process::ExitStatus {
        let exit = tokio::time::timeout(within, self.child.wait())
            .await
            .expect("the demo exits on its own")
            .unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        exit
    }

    /// SIGTERM, then the demo's clean exit within `within`; returns every line it printed.
    pub async fn stop(mut self, within: Duration) -> Vec<String> {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id().unwrap()).unwrap());
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        let exit = tokio::time::timeout(within, self.child.wait())
            .await
            .expect("the demo exits after SIGTERM")
            .unwrap();
        assert!(exit.success(), "{exit}");
        // The reader task prints what is left of the pipe.
        tokio::time::sleep(Duration::from_millis(200)).await;
        self.lines.lock().unwrap().clone()
    }
}

/// The value of `key=` in a demo event line; panics when it is missing or does not parse.
pub fn field<T: std::str::FromStr>(line: &str, key: &str) -> T {
    line.split_whitespace()
        .find_map(|word| word.strip_prefix(&format!("{key}=")))
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("{key}= in {line:?}"))
}
