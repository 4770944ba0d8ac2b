//! [`PgBouncer`]: a throwaway PgBouncer in front of a PostgreSQL server, to show what the elector
//! does behind a transaction-mode pooler and behind a session-mode one with and without a reset
//! query.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};
use tokio::sync::Mutex;
use tokio::time::Instant;
use tokio_postgres::Config;
use tokio_postgres::config::Host;

use crate::{HarnessError, connect, retarget};

/// Where Debian's package installs the binary.
const DEBIAN_BINARY: &str = "/usr/sbin/pgbouncer";
/// How long PgBouncer may take to accept a connection after it was started.
const READY_TIMEOUT: Duration = Duration::from_secs(15);
/// One installation at a time within a process.
static INSTALL: Mutex<()> = Mutex::const_new(());

/// PgBouncer's `pool_mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolMode {
    /// A server session per client connection, for the connection's whole life; when the
    /// client disconnects, `server_reset_query = DISCARD ALL` (written out, also PgBouncer's
    /// default) resets the server session before the next client gets it, which releases its
    /// session advisory locks.
    Session,
    /// A server session per transaction: after each transaction the server session may serve
    /// another client. A session advisory lock stays on the server session, not on the client.
    Transaction,
    /// Session mode with an empty `server_reset_query`: a server session goes from a client that
    /// disconnected to the next one as it was, session advisory locks and settings included
    /// (the default reset, `DISCARD ALL`, would release them).
    SessionWithoutReset,
}

impl PoolMode {
    fn setting(self) -> &'static str {
        match self {
            Self::Session | Self::SessionWithoutReset => "session",
            Self::Transaction => "transaction",
        }
    }
}

/// A PgBouncer process listening on `127.0.0.1:<free port>`, forwarding every database name to
/// the same database of one upstream server, with `auth_type = trust`, `pool_mode` and
/// `default_pool_size` as asked. Its files live in `$TMPDIR/plx-pgbouncer-<pid>-<port>`.
/// Dropping it kills the process and removes the directory.
///
/// When the binary is missing it is installed from Debian's packages (`apt-get update`, then
/// `apt-get install -y pgbouncer`; the test setup runs as root). Running as root, PgBouncer runs
/// as the `postgres` OS user (it refuses to run as root).
#[derive(Debug)]
pub struct PgBouncer {
    dir: PathBuf,
    port: u16,
    child: Child,
}

impl PgBouncer {
    /// Starts PgBouncer in front of the first TCP host and port of `upstream` and waits until it
    /// accepts a connection to `upstream`'s database.
    pub async fn start(
        upstream: &Config,
        mode: PoolMode,
        pool_size: u32,
    ) -> Result<Self, HarnessError> {
        Self::start_with(upstream, mode, pool_size, &[]).await
    }

    /// [`Self::start`] with more `[pgbouncer]` settings, written as `name = value` lines after
    /// the others (a later line wins), e.g. `[("server_login_retry", "1")]`.
    pub async fn start_with(
        upstream: &Config,
        mode: PoolMode,
        pool_size: u32,
        settings: &[(&str, &str)],
    ) -> Result<Self, HarnessError> {
        let binary = ensure_installed().await?;
        let (host, port) = tcp_host(upstream)?;
        let listen = free_port()?;
        let dir =
            std::env::temp_dir().join(format!("plx-pgbouncer-{}-{listen}", std::process::id()));
        let run_as = run_as()?;
        let pool = PoolSettings {
            mode,
            size: pool_size,
            extra: settings,
        };
        write_files(&dir, &host, port, listen, &pool, upstream, run_as)?;
        let mut command = Command::new(binary);
        command
            .arg(dir.join("pgbouncer.ini"))
            .current_dir(&dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        if let Some((uid, gid)) = run_as {
            command.uid(uid).gid(gid);
        }
        let child = command
            .spawn()
            .map_err(|e| HarnessError::io("spawn pgbouncer", e))?;
        let bouncer = Self {
            dir,
            port: listen,
            child,
        };
        bouncer.wait_ready(upstream).await?;
        Ok(bouncer)
    }

    /// The port PgBouncer listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `base` (user, database, application name, …) pointed at PgBouncer.
    pub fn pg_config(&self, base: &Config) -> Config {
        retarget(base, "127.0.0.1", self.port)
    }

    /// PgBouncer's log, for a failing test to print.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("pgbouncer.log")).unwrap_or_default()
    }

    async fn wait_ready(&self, upstream: &Config) -> Result<(), HarnessError> {
        let mut config = self.pg_config(upstream);
        config
            .application_name("plx-harness-pgbouncer-probe")
            .connect_timeout(Duration::from_secs(2));
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            match connect(&config).await {
                Ok(client) => {
                    client.simple_query("SELECT 1").await?;
                    return Ok(());
                }
                Err(e) if Instant::now() >= deadline => {
                    tracing::warn!(log = %self.log(), "pgbouncer did not come up");
                    return Err(e);
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        if let Err(e) = self.child.start_kill() {
            tracing::debug!(error = %e, "kill pgbouncer");
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The PgBouncer binary, installed from Debian's packages when missing.
pub(crate) async fn ensure_installed() -> Result<PathBuf, HarnessError> {
    let _once = INSTALL.lock().await;
    if let Some(binary) = find_binary() {
        return Ok(binary);
    }
    tracing::info!("pgbouncer is missing: installing it from Debian's packages");
    run("apt-get", &["update", "-qq"]).await?;
    run(
        "apt-get",
        &[
            "install",
            "-y",
            "-qq",
            "--no-install-recommends",
            "pgbouncer",
        ],
    )
    .await?;
    find_binary().ok_or_else(|| HarnessError::Invalid {
        what: "pgbouncer",
        detail: "apt-get installed the package but no pgbouncer binary was found".into(),
    })
}

fn find_binary() -> Option<PathBuf> {
    if Path::new(DEBIAN_BINARY).exists() {
        return Some(PathBuf::from(DEBIAN_BINARY));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("pgbouncer"))
        .find(|candidate| candidate.exists())
}

async fn run(program: &str, args: &[&str]) -> Result<(), HarnessError> {
    let output = Command::new(program)
        .args(args)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(|e| HarnessError::io(format!("run {program}"), e))?;
    if output.status.success() {
        return Ok(());
    }
    let text = String::from_utf8_lossy(&output.stderr);
    let tail: String = text
        .chars()
        .rev()
        .take(2000)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    Err(HarnessError::Command {
        program: format!("{program} {}", args.join(" ")),
        status: output.status,
        stderr: tail,
    })
}

/// The pool's settings of one PgBouncer: its mode, its size, and any further `[pgbouncer]`
/// settings.
struct PoolSettings<'a> {
    mode: PoolMode,
    size: u32,
    extra: &'a [(&'a str, &'a str)],
}

fn write_files(
    dir: &Path,
    host: &str,
    port: u16,
    listen: u16,
    pool: &PoolSettings<'_>,
    upstream: &Config,
    owner: Option<(u32, u32)>,
) -> Result<(), HarnessError> {
    let (mode, pool_size) = (pool.mode, pool.size);
    let user = upstream.get_user().unwrap_or("postgres");
    let ctx = |what: &str| format!("{what} {}", dir.display());
    if dir.exists() {
        std::fs::remove_dir_all(dir).map_err(|e| HarnessError::io(ctx("remove stale"), e))?;
    }
    std::fs::create_dir_all(dir).map_err(|e| HarnessError::io(ctx("create"), e))?;
    let ini = format!(
        "[databases]\n\
         * = host={host} port={port}\n\
         [pgbouncer]\n\
         listen_addr = 127.0.0.1\n\
         listen_port = {listen}\n\
         unix_socket_dir =\n\
         auth_type = trust\n\
         auth_file = {dir}/userlist.txt\n\
         pool_mode = {mode}\n\
         {reset}\
         default_pool_size = {pool_size}\n\
         min_pool_size = 0\n\
         reserve_pool_size = 0\n\
         max_client_conn = 200\n\
         ignore_startup_parameters = extra_float_digits,options\n\
         logfile = {dir}/pgbouncer.log\n\
         log_connections = 1\n\
         log_disconnections = 1\n\
         {extra}",
        dir = dir.display(),
        extra = pool
            .extra
            .iter()
            .map(|(name, value)| format!("{name} = {value}\n"))
            .collect::<String>(),
        mode = mode.setting(),
        reset = match mode {
            PoolMode::Session => "server_reset_query = DISCARD ALL\n",
            PoolMode::SessionWithoutReset => "server_reset_query =\n",
            PoolMode::Transaction => "",
        },
    );
    let files = [
        ("pgbouncer.ini", ini),
        ("userlist.txt", format!("\"{user}\" \"\"\n")),
        ("pgbouncer.log", String::new()),
    ];
    for (name, content) in files {
        let path = dir.join(name);
        std::fs::write(&path, content).map_err(|e| HarnessError::io(ctx("write"), e))?;
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::chown(&path, Some(uid), Some(gid))
                .map_err(|e| HarnessError::io(ctx("chown"), e))?;
        }
    }
    if let Some((uid, gid)) = owner {
        std::os::unix::fs::chown(dir, Some(uid), Some(gid))
            .map_err(|e| HarnessError::io(ctx("chown"), e))?;
    }
    Ok(())
}

/// `(uid, gid)` of the `postgres` OS user when we run as root (PgBouncer refuses root).
fn run_as() -> Result<Option<(u32, u32)>, HarnessError> {
    let me = std::fs::metadata("/proc/self")
        .map_err(|e| HarnessError::io("read the current uid from /proc/self", e))?;
    if me.uid() != 0 {
        return Ok(None);
    }
    crate::cluster::postgres_user().map(Some)
}

fn tcp_host(config: &Config) -> Result<(String, u16), HarnessError> {
    let host = config
        .get_hosts()
        .iter()
        .find_map(|h| match h {
            Host::Tcp(name) => Some(name.clone()),
            Host::Unix(_) => None,
        })
        .ok_or_else(|| HarnessError::Invalid {
            what: "pgbouncer upstream",
            detail: "the config has no TCP host".to_owned(),
        })?;
    Ok((host, config.get_ports().first().copied().unwrap_or(5432)))
}

fn free_port() -> Result<u16, HarnessError> {
    let listener = std::net::TcpListener::bind(("127.0.0.1", 0))
        .map_err(|e| HarnessError::io("bind to find a free port", e))?;
    Ok(listener
        .local_addr()
        .map_err(|e| HarnessError::io("free port address", e))?
        .port())
}
