//! Where the demo's database comes from: `--dsn`, else `$PLEXSPHERE_DSN`, else the local server
//! on 127.0.0.1:5432, else a throwaway cluster started from the PostgreSQL binaries on the
//! machine, in a temporary directory removed on exit.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::str::FromStr;
use std::time::Duration;

use tokio::process::{Child, Command};

use crate::cli::DSN_ENV;

/// The local server tried when no DSN is given.
pub(crate) const LOCAL_DSN: &str = "host=127.0.0.1 port=5432 user=postgres dbname=postgres";

/// Overrides [`LOCAL_DSN`] (a testing aid: a closed port forces the throwaway cluster).
pub(crate) const LOCAL_DSN_ENV: &str = "PLEXSPHERE_DEMO_LOCAL_DSN";

/// A resolved database: its DSN, where it came from, and the throwaway cluster to stop, if any.
pub(crate) struct Database {
    pub(crate) dsn: String,
    pub(crate) source: String,
    pub(crate) cluster: Option<Throwaway>,
}

type Error = Box<dyn std::error::Error + Send + Sync>;

/// Resolves the database along the documented chain.
pub(crate) async fn resolve(flag: Option<String>) -> Result<Database, Error> {
    if let Some(dsn) = flag.filter(|dsn| !dsn.trim().is_empty()) {
        let source = format!("--dsn: {}", check_syntax(&dsn)?);
        return Ok(Database {
            dsn,
            source,
            cluster: None,
        });
    }
    if let Some(dsn) = std::env::var(DSN_ENV)
        .ok()
        .filter(|dsn| !dsn.trim().is_empty())
    {
        let source = format!("${DSN_ENV}: {}", check_syntax(&dsn)?);
        return Ok(Database {
            dsn,
            source,
            cluster: None,
        });
    }
    // Tests point this at a closed port to reach the throwaway-cluster fallback.
    let local = std::env::var(LOCAL_DSN_ENV).unwrap_or_else(|_| LOCAL_DSN.to_owned());
    if answers(&local).await {
        return Ok(Database {
            dsn: local,
            source: "local server 127.0.0.1:5432".into(),
            cluster: None,
        });
    }
    let cluster = Throwaway::start().await?;
    Ok(Database {
        dsn: cluster.dsn(),
        source: format!("throwaway cluster in {}", cluster.dir.display()),
        cluster: Some(cluster),
    })
}

/// Parses `dsn` and describes where it points, without its password: `host=… port=…
/// dbname=… user=…` (the parts it names).
fn check_syntax(dsn: &str) -> Result<String, Error> {
    let config = tokio_postgres::Config::from_str(dsn).map_err(|e| format!("invalid DSN: {e}"))?;
    Ok(describe(&config))
}

fn describe(config: &tokio_postgres::Config) -> String {
    use tokio_postgres::config::Host;
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .map(|host| match host {
            Host::Tcp(name) => name.clone(),
            Host::Unix(path) => path.display().to_string(),
        })
        .collect();
    let ports: Vec<String> = config.get_ports().iter().map(u16::to_string).collect();
    let mut parts = Vec::new();
    for (name, value) in [
        ("host", hosts.join(",")),
        ("port", ports.join(",")),
        ("dbname", config.get_dbname().unwrap_or_default().to_owned()),
        ("user", config.get_user().unwrap_or_default().to_owned()),
    ] {
        if !value.is_empty() {
            parts.push(format!("{name}={value}"));
        }
    }
    parts.join(" ")
}

/// Whether a server answers at `dsn` within 3 s.
async fn answers(dsn: &str) -> bool {
    let Ok(mut config) = tokio_postgres::Config::from_str(dsn) else {
        return false;
    };
    config.connect_timeout(Duration::from_secs(3));
    let attempt = tokio::time::timeout(
        Duration::from_secs(4),
        config.connect(tokio_postgres::NoTls),
    );
    match attempt.await {
        Ok(Ok((client, connection))) => {
            drop(client);
            let _ = connection.await;
            true
        }
        _ => false,
    }
}

/// A PostgreSQL cluster the demo started itself.
pub(crate) struct Throwaway {
    dir: PathBuf,
    port: u16,
    server: Child,
}

impl Throwaway {
    /// `initdb` into a fresh temporary directory, then `postgres` on a free port of 127.0.0.1
    /// (as the `postgres` OS user when running as root).
    async fn start() -> Result<Self, Error> {
        let bindir = bindir().await?;
        let run_as = run_as()?;
        let dir = std::env::temp_dir().join(format!("plexsphere-demo-{}", std::process::id()));
        if dir.exists() {
            std::fs::remove_dir_all(&dir)?;
        }
        std::fs::create_dir_all(dir.join("socket"))?;
        if let Some((uid, gid)) = run_as {
            for path in [dir.as_path(), &dir.join("socket")] {
                std::os::unix::fs::chown(path, Some(uid), Some(gid))?;
            }
        }
        eprintln!(
            "[demo] no server answers on 127.0.0.1:5432: starting a throwaway cluster in {}",
            dir.display()
        );
        let data = dir.join("data");
        let mut initdb = command(&bindir.join("initdb"), run_as);
        initdb
            .arg("-D")
            .arg(&data)
            .args([
                "-U",
                "postgres",
                "--auth=trust",
                "--no-sync",
                "--no-instructions",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let output = initdb
            .output()
            .await
            .map_err(|e| format!("run initdb: {e}"))?;
        if !output.status.success() {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(format!(
                "initdb failed ({}): {}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            )
            .into());
        }
        let port = free_port()?;
        let mut postgres = command(&bindir.join("postgres"), run_as);
        postgres
            .arg("-D")
            .arg(&data)
            .args(["-p", &port.to_string(), "-c", "listen_addresses=127.0.0.1"])
            .arg("-k")
            .arg(dir.join("socket"))
            .args(["-c", "fsync=off", "-c", "max_connections=200"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .stdin(Stdio::null())
            // Its own process group: a Ctrl-C in the terminal must not stop the server before
            // the replicas have released the lock.
            .process_group(0)
            .kill_on_drop(true);
        let server = postgres
            .spawn()
            .map_err(|e| format!("start postgres: {e}"))?;
        let cluster = Self { dir, port, server };
        for _ in 0..150 {
            if answers(&cluster.dsn()).await {
                return Ok(cluster);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        cluster.stop().await;
        Err("the throwaway cluster did not accept connections within 30 s".into())
    }

    /// The DSN of the cluster's `postgres` database.
    pub(crate) fn dsn(&self) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres",
            self.port
        )
    }

    /// Stops the server (fast shutdown, SIGINT) and removes the directory.
    pub(crate) async fn stop(mut self) {
        if let Some(pid) = self.server.id() {
            let pid = nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap_or(i32::MAX));
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT);
        }
        if tokio::time::timeout(Duration::from_secs(20), self.server.wait())
            .await
            .is_err()
        {
            let _ = self.server.kill().await;
        }
        if let Err(error) = std::fs::remove_dir_all(&self.dir) {
            eprintln!("[demo] could not remove {}: {error}", self.dir.display());
        } else {
            eprintln!(
                "[demo] throwaway cluster stopped and {} removed",
                self.dir.display()
            );
        }
    }
}

fn command(program: &Path, run_as: Option<(u32, u32)>) -> Command {
    let mut command = Command::new(program);
    if let Some((uid, gid)) = run_as {
        command.uid(uid).gid(gid);
    }
    command
}

/// `$PLEXSPHERE_PG_BINDIR`, else `pg_config --bindir`, else the newest `/usr/lib/postgresql/*/bin`.
async fn bindir() -> Result<PathBuf, Error> {
    if let Some(dir) = std::env::var_os("PLEXSPHERE_PG_BINDIR") {
        return Ok(dir.into());
    }
    if let Ok(output) = Command::new("pg_config").arg("--bindir").output().await
        && output.status.success()
    {
        let dir = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
        if dir.join("initdb").exists() {
            return Ok(dir);
        }
    }
    let mut candidates: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path().join("bin"))
        .filter(|bin| bin.join("initdb").exists())
        .collect();
    candidates.sort_by_key(|bin| {
        bin.parent()
            .and_then(|v| v.file_name())
            .and_then(|v| v.to_str())
            .and_then(|v| v.parse::<u32>().ok())
            .unwrap_or(0)
    });
    candidates.pop().ok_or_else(|| {
        "no database: give --dsn or PLEXSPHERE_DSN, start PostgreSQL on 127.0.0.1:5432, \
         or install the PostgreSQL server binaries (initdb, postgres) for a throwaway cluster"
            .into()
    })
}

/// The `postgres` OS user's `(uid, gid)` when running as root (initdb refuses root).
fn run_as() -> Result<Option<(u32, u32)>, Error> {
    if !nix::unistd::Uid::effective().is_root() {
        return Ok(None);
    }
    let user = nix::unistd::User::from_name("postgres")?.ok_or(
        "running as root, but there is no `postgres` OS user to run the throwaway cluster as",
    )?;
    Ok(Some((user.uid.as_raw(), user.gid.as_raw())))
}

fn free_port() -> Result<u16, Error> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_dsn_is_described_by_where_it_points_without_its_password() {
        let described = super::check_syntax(
            "postgres://app:secret@db.internal:6543/billing?application_name=x",
        )
        .unwrap();
        assert_eq!(
            described,
            "host=db.internal port=6543 dbname=billing user=app"
        );
        let described = super::check_syntax("host=127.0.0.1 user=postgres").unwrap();
        assert_eq!(described, "host=127.0.0.1 user=postgres");
        assert!(super::check_syntax("host='unterminated").is_err());
    }
}
