//! [`Cluster`]: a throwaway PostgreSQL cluster for restart and failover tests.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use tokio::process::Command;
use tokio::time::Instant;
use tokio_postgres::{Client, Config};

use crate::{HarnessError, connect};

/// Directory name prefix of clusters under the temp dir: `plx-cluster-<pid>-<counter>`.
const CLUSTER_PREFIX: &str = "plx-cluster-";
/// Directory name prefix of a template being built: `plx-pgtemplate-build-<pid>-<counter>`.
const BUILD_PREFIX: &str = "plx-pgtemplate-build-";
/// Bump when the template's `initdb` arguments change.
const TEMPLATE_VERSION: &str = "v1";
/// How long `pg_ctl` may wait for a start, stop or promotion.
const PG_CTL_WAIT: &str = "60";
/// How long a started server may take to accept a connection after `pg_ctl` returned.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Attempts to start with a fresh free port (another process may take the port we picked).
const PORT_ATTEMPTS: usize = 3;
/// Makes directory names unique within one process.
static COUNTER: AtomicU32 = AtomicU32::new(0);

/// Settings appended to `postgresql.conf`: small and fast, durable enough for nothing.
/// The port and the socket directory are passed on the command line instead, so a standby
/// copied from a primary gets its own.
const SETTINGS: &str = "
# plexsphere-leader-tests
listen_addresses = '127.0.0.1'
shared_buffers = 16MB
max_connections = 60
fsync = off
synchronous_commit = off
full_page_writes = off
autovacuum = off
wal_level = replica
max_wal_senders = 4
max_replication_slots = 4
hot_standby = on
wal_receiver_status_interval = 1s
logging_collector = off
log_min_messages = warning
";

/// How `pg_ctl stop` ends a cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopMode {
    /// `-m fast`: sessions are terminated and their clients get an error, then a clean
    /// shutdown checkpoint.
    Fast,
    /// `-m immediate`: every server process is killed at once, no checkpoint (a crash); the
    /// next start runs crash recovery.
    Immediate,
}

impl StopMode {
    fn arg(self) -> &'static str {
        match self {
            Self::Fast => "fast",
            Self::Immediate => "immediate",
        }
    }
}

/// The PostgreSQL binaries, and the OS user to run them as when we are root.
#[derive(Debug, Clone)]
struct Tools {
    bindir: PathBuf,
    /// `(uid, gid)` of the `postgres` OS user when running as root, `None` otherwise.
    run_as: Option<(u32, u32)>,
}

/// A throwaway PostgreSQL cluster in `$TMPDIR/plx-cluster-<pid>-<n>`, owned by the `postgres`
/// OS user, listening on `127.0.0.1:<free port>` with its Unix socket in its own directory,
/// trust authentication (also for replication), `fsync=off` and 16 MB of shared buffers.
///
/// The data directory is copied (`cp -a`) from a template made once per machine by `initdb`
/// (`$TMPDIR/plx-pgtemplate<bindir>-v1`). Measured on the 2-core dev machine (PostgreSQL 15,
/// debug build): [`Cluster::start`] ~0.45 s with the template (the first one on a machine adds
/// ~1.5 s of `initdb`); [`Cluster::start_standby_of`] ~0.45 s (`pg_basebackup` + start);
/// [`Cluster::promote`] ~0.1 s; `restart(Fast)` ~0.23 s; `stop(Immediate)` ~0.1 s; start after
/// an immediate stop (crash recovery) ~0.13 s.
///
/// The binaries come from `$PLEXSPHERE_PG_BINDIR` or `pg_config --bindir`. When the test runs
/// as root, every server program runs as the `postgres` OS user. Dropping the cluster stops it
/// (`-m immediate`) and removes its directory; clusters left behind by killed test processes
/// are stopped and removed by the next [`Cluster::start`].
#[derive(Debug)]
pub struct Cluster {
    dir: PathBuf,
    data: PathBuf,
    port: u16,
    tools: Tools,
    running: AtomicBool,
}

impl Cluster {
    /// Creates and starts a new primary. Returns once it accepts connections.
    pub async fn start() -> Result<Self, HarnessError> {
        let tools = Tools::discover().await?;
        sweep_leaked(&tools).await;
        let template = template(&tools).await?;
        let mut cluster = Self::empty(tools)?;
        let copy = cluster
            .tools
            .plain("cp")
            .arg("-a")
            .arg(template.join("data"))
            .arg(&cluster.data)
            .output();
        check("cp -a <template> <data>", copy.await)?;
        append_settings(&cluster.data)?;
        cluster.launch().await?;
        Ok(cluster)
    }

    /// Creates a streaming standby of `primary` with `pg_basebackup -R` and starts it. Returns
    /// once it accepts (read-only) connections.
    pub async fn start_standby_of(primary: &Cluster) -> Result<Self, HarnessError> {
        Self::start_standby_streaming_from(primary, primary.port).await
    }

    /// [`Self::start_standby_of`], but the standby streams `primary`'s WAL from
    /// `127.0.0.1:stream_port` (its `primary_conninfo`), e.g. a [`FaultProxy`](crate::FaultProxy) in
    /// front of the primary: blackholing it holds the stream back, so that the standby lags
    /// (the base backup itself comes straight from the primary).
    pub async fn start_standby_streaming_from(
        primary: &Cluster,
        stream_port: u16,
    ) -> Result<Self, HarnessError> {
        let mut standby = Self::empty(primary.tools.clone())?;
        let port = primary.port.to_string();
        let backup = standby
            .tools
            .pg("pg_basebackup")
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                port.as_str(),
                "-U",
                "postgres",
                "-D",
            ])
            .arg(&standby.data)
            .args(["-R", "-X", "stream", "-c", "fast", "--no-sync"])
            .current_dir(&standby.dir)
            .output();
        check("pg_basebackup", backup.await)?;
        if stream_port != primary.port {
            // After the line `-R` wrote: the later setting wins.
            let auto = standby.data.join("postgresql.auto.conf");
            let line =
                format!("primary_conninfo = 'host=127.0.0.1 port={stream_port} user=postgres'\n");
            let mut file = std::fs::OpenOptions::new()
                .append(true)
                .open(&auto)
                .map_err(|e| HarnessError::io(format!("open {}", auto.display()), e))?;
            std::io::Write::write_all(&mut file, line.as_bytes())
                .map_err(|e| HarnessError::io(format!("append to {}", auto.display()), e))?;
        }
        standby.launch().await?;
        Ok(standby)
    }

    /// The TCP port the cluster listens on (unchanged by restarts).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The cluster's directory (data directory, socket and log inside).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The server log, for a failing test to print.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("log")).unwrap_or_default()
    }

    /// Whether the cluster was last started and not stopped.
    pub fn is_running(&self) -> bool {
        self.running.load(Ordering::SeqCst)
    }

    /// A config for database `db` as user `postgres` over TCP, with a 5 s connect timeout.
    pub fn config(&self, db: &str) -> Config {
        let mut c = Config::new();
        c.host("127.0.0.1")
            .port(self.port)
            .user("postgres")
            .dbname(db)
            .connect_timeout(Duration::from_secs(5));
        c
    }

    /// Connects to database `db` (see [`Self::config`]).
    pub async fn connect(&self, db: &str) -> Result<Client, HarnessError> {
        connect(&self.config(db)).await
    }

    /// Stops the server (`pg_ctl stop -m <mode>`) and waits until it has exited.
    pub async fn stop(&self, mode: StopMode) -> Result<(), HarnessError> {
        let stop = self
            .tools
            .pg("pg_ctl")
            .arg("-D")
            .arg(&self.data)
            .args(["-m", mode.arg(), "-w", "-t", PG_CTL_WAIT, "stop"])
            .current_dir(&self.dir)
            .output();
        check("pg_ctl stop", stop.await)?;
        self.running.store(false, Ordering::SeqCst);
        Ok(())
    }

    /// Starts a stopped server again on the same port. Returns once it accepts connections.
    pub async fn start_again(&self) -> Result<(), HarnessError> {
        self.pg_ctl_start().await?;
        self.wait_ready().await
    }

    /// [`Self::stop`] then [`Self::start_again`]. Every session ends; session locks with them.
    pub async fn restart(&self, mode: StopMode) -> Result<(), HarnessError> {
        self.stop(mode).await?;
        self.start_again().await
    }

    /// Promotes a standby to a primary (`pg_ctl promote -w`) and waits until it accepts writes.
    pub async fn promote(&self) -> Result<(), HarnessError> {
        let promote = self
            .tools
            .pg("pg_ctl")
            .arg("-D")
            .arg(&self.data)
            .args(["-w", "-t", PG_CTL_WAIT, "promote"])
            .current_dir(&self.dir)
            .output();
        check("pg_ctl promote", promote.await)?;
        let deadline = Instant::now() + READY_TIMEOUT;
        while self.is_in_recovery().await? {
            if Instant::now() >= deadline {
                return Err(HarnessError::Timeout {
                    what: "the promoted standby to leave recovery".to_owned(),
                    after: READY_TIMEOUT,
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }

    /// `SELECT pg_is_in_recovery()`: `true` on a standby.
    pub async fn is_in_recovery(&self) -> Result<bool, HarnessError> {
        let client = self.connect("postgres").await?;
        Ok(client
            .query_one("SELECT pg_is_in_recovery()", &[])
            .await?
            .try_get(0)?)
    }

    /// A stopped cluster with a fresh, empty directory owned by the server's OS user.
    fn empty(tools: Tools) -> Result<Self, HarnessError> {
        let dir = unique_dir(CLUSTER_PREFIX);
        create_owned_dir(&dir, tools.run_as)?;
        Ok(Self {
            data: dir.join("data"),
            dir,
            port: 0,
            tools,
            running: AtomicBool::new(false),
        })
    }

    /// First start: picks a free port, retrying with another one if the start fails.
    async fn launch(&mut self) -> Result<(), HarnessError> {
        let mut attempt = 1;
        loop {
            self.port = free_port()?;
            match self.pg_ctl_start().await {
                Ok(()) => break,
                Err(e) if attempt < PORT_ATTEMPTS => {
                    tracing::debug!(error = %e, port = self.port, "cluster start, retrying");
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
        self.wait_ready().await
    }

    async fn pg_ctl_start(&self) -> Result<(), HarnessError> {
        let options = format!("-p {} -k '{}'", self.port, self.dir.display());
        let start = self
            .tools
            .pg("pg_ctl")
            .arg("-D")
            .arg(&self.data)
            .arg("-l")
            .arg(self.dir.join("log"))
            .args(["-o", options.as_str(), "-w", "-t", PG_CTL_WAIT, "start"])
            .current_dir(&self.dir)
            .output();
        // The postmaster may be up even when pg_ctl reports a failure: let Drop stop it.
        self.running.store(true, Ordering::SeqCst);
        check("pg_ctl start", start.await).map_err(|e| match e {
            HarnessError::Command {
                program,
                status,
                stderr,
            } => HarnessError::Command {
                program,
                status,
                stderr: format!("{stderr}\n--- server log ---\n{}", tail(&self.log(), 2000)),
            },
            other => other,
        })?;
        Ok(())
    }

    async fn wait_ready(&self) -> Result<(), HarnessError> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            match self.connect("postgres").await {
                Ok(_) => return Ok(()),
                Err(e) if Instant::now() >= deadline => return Err(e),
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.running.load(Ordering::SeqCst) {
            stop_blocking(&self.tools, &self.data);
        }
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            tracing::warn!(dir = %self.dir.display(), error = %e, "remove cluster directory");
        }
    }
}

impl Tools {
    async fn discover() -> Result<Self, HarnessError> {
        let bindir = match std::env::var_os("PLEXSPHERE_PG_BINDIR") {
            Some(dir) if !dir.is_empty() => PathBuf::from(dir),
            _ => {
                let out = check(
                    "pg_config --bindir",
                    Command::new("pg_config").arg("--bindir").output().await,
                )?;
                PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
            }
        };
        let me = std::fs::metadata("/proc/self")
            .map_err(|e| HarnessError::io("read the current uid from /proc/self", e))?;
        let run_as = if me.uid() == 0 {
            Some(postgres_user()?)
        } else {
            None
        };
        Ok(Self { bindir, run_as })
    }

    /// A PostgreSQL program from the bindir, run as the server's OS user.
    fn pg(&self, program: &str) -> Command {
        let mut cmd = self.plain(self.bindir.join(program));
        if let Some((uid, gid)) = self.run_as {
            cmd.uid(uid).gid(gid);
        }
        for var in [
            "PGDATA",
            "PGHOST",
            "PGPORT",
            "PGUSER",
            "PGDATABASE",
            "PGOPTIONS",
        ] {
            cmd.env_remove(var);
        }
        cmd
    }

    /// A program run as ourselves, with stdin closed and output captured.
    fn plain(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new(program);
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd
    }
}

/// `(uid, gid)` of the `postgres` OS user, from `/etc/passwd`.
pub(crate) fn postgres_user() -> Result<(u32, u32), HarnessError> {
    let passwd = std::fs::read_to_string("/etc/passwd")
        .map_err(|e| HarnessError::io("read /etc/passwd", e))?;
    passwd
        .lines()
        .map(|line| line.split(':').collect::<Vec<_>>())
        .find(|fields| fields.first() == Some(&"postgres"))
        .and_then(|fields| Some((fields.get(2)?.parse().ok()?, fields.get(3)?.parse().ok()?)))
        .ok_or_else(|| HarnessError::Invalid {
            what: "OS user",
            detail: "running as root but /etc/passwd has no usable `postgres` user".to_owned(),
        })
}

/// The template data directory made by `initdb`, built once per machine and bindir.
async fn template(tools: &Tools) -> Result<PathBuf, HarnessError> {
    let key: String = tools
        .bindir
        .to_string_lossy()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    let dir = std::env::temp_dir().join(format!("plx-pgtemplate{key}-{TEMPLATE_VERSION}"));
    if dir.join("data").join("PG_VERSION").exists() {
        return Ok(dir);
    }
    let build = unique_dir(BUILD_PREFIX);
    create_owned_dir(&build, tools.run_as)?;
    let initdb = tools
        .pg("initdb")
        .arg("-D")
        .arg(build.join("data"))
        .args([
            "-U",
            "postgres",
            "--auth=trust",
            "--no-sync",
            "--no-instructions",
        ])
        .args(["-E", "UTF8", "--no-locale"])
        .current_dir(&build)
        .output();
    let built = check("initdb", initdb.await);
    // Renaming onto an existing template fails: another process built it first. Either way
    // the template is there now.
    let renamed = built.is_ok() && std::fs::rename(&build, &dir).is_ok();
    if !renamed {
        let _ = std::fs::remove_dir_all(&build);
    }
    built?;
    Ok(dir)
}

fn append_settings(data: &Path) -> Result<(), HarnessError> {
    use std::io::Write;
    let path = data.join("postgresql.conf");
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .map_err(|e| HarnessError::io(format!("open {}", path.display()), e))?;
    file.write_all(SETTINGS.as_bytes())
        .map_err(|e| HarnessError::io(format!("append to {}", path.display()), e))
}

fn unique_dir(prefix: &str) -> PathBuf {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    std::env::temp_dir().join(format!("{prefix}{}-{n}", std::process::id()))
}

fn create_owned_dir(dir: &Path, owner: Option<(u32, u32)>) -> Result<(), HarnessError> {
    let ctx = |what: &str| format!("{what} {}", dir.display());
    if dir.exists() {
        // Left by a dead process that had our pid.
        std::fs::remove_dir_all(dir).map_err(|e| HarnessError::io(ctx("remove stale"), e))?;
    }
    std::fs::create_dir(dir).map_err(|e| HarnessError::io(ctx("create"), e))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .map_err(|e| HarnessError::io(ctx("chmod"), e))?;
    if let Some((uid, gid)) = owner {
        std::os::unix::fs::chown(dir, Some(uid), Some(gid))
            .map_err(|e| HarnessError::io(ctx("chown"), e))?;
    }
    Ok(())
}

fn free_port() -> Result<u16, HarnessError> {
    let listener = std::net::TcpListener::bind(("127.0.0.1", 0))
        .map_err(|e| HarnessError::io("bind to find a free port", e))?;
    let port = listener
        .local_addr()
        .map_err(|e| HarnessError::io("free port address", e))?
        .port();
    Ok(port)
}

/// Turns a finished command into its output, or a [`HarnessError::Command`] when it failed.
fn check(program: &str, output: std::io::Result<Output>) -> Result<Output, HarnessError> {
    let output = output.map_err(|e| HarnessError::io(format!("run {program}"), e))?;
    if output.status.success() {
        return Ok(output);
    }
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stderr),
        String::from_utf8_lossy(&output.stdout)
    );
    Err(HarnessError::Command {
        program: program.to_owned(),
        status: output.status,
        stderr: tail(&text, 2000).to_owned(),
    })
}

/// The last `max` bytes of `text` (cut at a character boundary).
fn tail(text: &str, max: usize) -> &str {
    let mut start = text.len().saturating_sub(max);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}

/// `pg_ctl stop -m immediate`, blocking: for `Drop` and for sweeping.
fn stop_blocking(tools: &Tools, data: &Path) {
    use std::os::unix::process::CommandExt;
    let mut cmd = std::process::Command::new(tools.bindir.join("pg_ctl"));
    cmd.arg("-D")
        .arg(data)
        .args(["-m", "immediate", "-w", "-t", PG_CTL_WAIT, "stop"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if let Some(parent) = data.parent() {
        cmd.current_dir(parent);
    }
    if let Some((uid, gid)) = tools.run_as {
        cmd.uid(uid).gid(gid);
    }
    if let Err(e) = cmd.status() {
        tracing::warn!(data = %data.display(), error = %e, "pg_ctl stop -m immediate");
    }
}

/// Stops and removes clusters and template builds whose creating process is gone.
async fn sweep_leaked(tools: &Tools) {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = name
            .strip_prefix(CLUSTER_PREFIX)
            .or_else(|| name.strip_prefix(BUILD_PREFIX))
        else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if Path::new("/proc").join(pid.to_string()).exists() {
            continue;
        }
        let dir = entry.path();
        let data = dir.join("data");
        if data.join("postmaster.pid").exists() {
            let tools = tools.clone();
            let stopped = tokio::task::spawn_blocking(move || stop_blocking(&tools, &data));
            let _ = stopped.await;
        }
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => tracing::info!(dir = %dir.display(), "removed a leaked test cluster"),
            Err(e) => tracing::debug!(dir = %dir.display(), error = %e, "remove leaked cluster"),
        }
    }
}
