//! [`ReplicaProcess`]: one elector in a child OS process (see [`crate::replica_child`]), its
//! JSON-line output parsed into [`Record`]s on the harness's clock and merged into one
//! [`Timeline`] with the other replicas (`lead` / `follow` events).
//!
//! Every record carries the child's `CLOCK_MONOTONIC` stamp, converted with
//! [`crate::clock::to_instant`], so the timelines of all replicas, the [`crate::LockObserver`]
//! and the test itself share one clock.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_postgres::Client;
use tokio_postgres::config::{Config, Host};

use crate::clock::to_instant;
use crate::replica_child::ChildArgs;
use crate::{HarnessError, LOCK_CLASSID, LOCK_OBJID, Timeline};

/// `application_name` prefix of every replica process's sessions (distinct from the harness's
/// own [`crate::HARNESS_APP_PREFIX`]).
pub const REPLICA_APP_PREFIX: &str = "plx-replica-";

/// The [`Timeline`] event of a term's start.
pub const LEAD: &str = "lead";
/// The [`Timeline`] event of a term's end.
pub const FOLLOW: &str = "follow";

/// How long a replica may take to exit after `SIGTERM` or `SIGKILL`.
const EXIT_TIMEOUT: Duration = Duration::from_secs(10);

/// One line a replica printed.
#[derive(Debug, Clone)]
pub struct Record {
    /// When it happened, on the harness's clock.
    pub at: Instant,
    /// The replica's name.
    pub replica: String,
    /// What happened (`ready`, `lead`, `follow`, `log`, `exit`, …).
    pub event: String,
    /// The whole JSON object.
    pub fields: Value,
}

impl Record {
    /// A string field.
    pub fn str(&self, key: &str) -> Option<&str> {
        self.fields.get(key).and_then(Value::as_str)
    }

    /// A number field.
    pub fn u64(&self, key: &str) -> Option<u64> {
        self.fields.get(key).and_then(Value::as_u64)
    }

    /// A boolean field.
    pub fn bool(&self, key: &str) -> Option<bool> {
        self.fields.get(key).and_then(Value::as_bool)
    }

    /// Whether this is a `log` record at `level` whose message starts with `message`.
    pub fn is_log(&self, level: &str, message: &str) -> bool {
        self.event == "log"
            && self.str("level") == Some(level)
            && self.str("message").is_some_and(|m| m.starts_with(message))
    }
}

/// What a replica reported when its `run` returned (the `exit` record).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExitReport {
    /// `run`'s error, if it returned one.
    pub run_error: Option<String>,
    /// The pool's connections (idle and in use) after `run` returned.
    pub pool_size: u64,
    /// Idle connections in the pool then.
    pub pool_available: u64,
    /// Callers waiting for a connection then.
    pub pool_waiting: u64,
    /// Whether the pool then handed out a connection that answered `SELECT 1`.
    pub pool_ok: bool,
    /// Why it did not.
    pub pool_error: Option<String>,
}

impl ExitReport {
    /// No pool lost a connection: every connection the pool counts is back in it, nobody waits,
    /// and it still serves one.
    pub fn pool_intact(&self) -> bool {
        self.run_error.is_none()
            && self.pool_ok
            && self.pool_waiting == 0
            && self.pool_available == self.pool_size
    }

    fn from_record(record: &Record) -> Self {
        Self {
            run_error: record.str("run").map(str::to_owned),
            pool_size: record.u64("pool_size").unwrap_or(u64::MAX),
            pool_available: record.u64("pool_available").unwrap_or(0),
            pool_waiting: record.u64("pool_waiting").unwrap_or(0),
            pool_ok: record.bool("pool_ok").unwrap_or(false),
            pool_error: record.str("pool_error").map(str::to_owned),
        }
    }
}

/// The records of one replica and a counter that changes with each new one.
#[derive(Debug, Clone)]
struct Shared {
    records: Arc<Mutex<Vec<Record>>>,
    changed: watch::Sender<u64>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Vec<Record>> {
        // Pushing a record cannot leave the vector inconsistent: recover from a poisoned lock.
        self.records.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// How to start replica processes: the program, and the arguments before the replica's own.
#[derive(Debug, Clone)]
pub struct Launcher {
    program: PathBuf,
    prefix: Vec<String>,
}

impl Launcher {
    /// Runs `program` with the replica's arguments (the `plx-replica` binary:
    /// `env!("CARGO_BIN_EXE_plx-replica")` in an integration test).
    pub fn new(program: impl AsRef<Path>) -> Self {
        Self {
            program: program.as_ref().to_owned(),
            prefix: Vec::new(),
        }
    }

    /// Runs `program prefix… <replica arguments>` (the benchmark runs itself as `bench replica`).
    pub fn with_prefix(program: impl AsRef<Path>, prefix: &[&str]) -> Self {
        Self {
            program: program.as_ref().to_owned(),
            prefix: prefix.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    /// Starts a replica and waits until it printed `ready`. Its `lead` and `follow` events go to
    /// `timeline` under its name.
    pub async fn spawn(
        &self,
        args: ChildArgs,
        timeline: &Timeline,
    ) -> Result<ReplicaProcess, HarnessError> {
        let mut child = Command::new(&self.program)
            .args(&self.prefix)
            .args(args.to_args())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| HarnessError::io(format!("spawn {}", self.program.display()), e))?;
        let pid = child.id().ok_or_else(|| HarnessError::Invalid {
            what: "replica process",
            detail: "exited at once".into(),
        })?;
        let stdout = child.stdout.take().ok_or_else(|| HarnessError::Invalid {
            what: "replica process",
            detail: "no stdout pipe".into(),
        })?;
        let shared = Shared {
            records: Arc::default(),
            changed: watch::Sender::new(0),
        };
        let reader = tokio::spawn(read_records(stdout, shared.clone(), timeline.clone()));
        let replica = ReplicaProcess {
            name: args.name.clone(),
            args,
            stdin: child.stdin.take(),
            child,
            pid,
            shared,
            reader,
            timeline: timeline.clone(),
            exited: false,
        };
        replica
            .wait_for(EXIT_TIMEOUT, |r| r.event == "ready")
            .await
            .ok_or_else(|| HarnessError::Timeout {
                what: format!("replica {} to start", replica.name),
                after: EXIT_TIMEOUT,
            })?;
        Ok(replica)
    }
}

/// A replica running in a child process. Dropping it kills the process (`SIGKILL`).
#[derive(Debug)]
pub struct ReplicaProcess {
    name: String,
    args: ChildArgs,
    child: Child,
    stdin: Option<ChildStdin>,
    pid: u32,
    shared: Shared,
    reader: JoinHandle<()>,
    timeline: Timeline,
    exited: bool,
}

impl ReplicaProcess {
    /// The replica's name (its sessions' `application_name`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The arguments it runs with.
    pub fn args(&self) -> &ChildArgs {
        &self.args
    }

    /// The OS pid of the process.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Every record so far, in the order printed.
    pub fn records(&self) -> Vec<Record> {
        self.shared.lock().clone()
    }

    /// The records of one event kind.
    pub fn events(&self, event: &str) -> Vec<Record> {
        let records = self.shared.lock();
        records
            .iter()
            .filter(|r| r.event == event)
            .cloned()
            .collect()
    }

    /// The `log` records at `level` whose message starts with `message`.
    pub fn logs(&self, level: &str, message: &str) -> Vec<Record> {
        let records = self.shared.lock();
        records
            .iter()
            .filter(|r| r.is_log(level, message))
            .cloned()
            .collect()
    }

    /// Whether the replica's last `lead` / `follow` was a `lead`.
    pub fn is_leader(&self) -> bool {
        let records = self.shared.lock();
        records
            .iter()
            .rev()
            .find(|r| r.event == LEAD || r.event == FOLLOW)
            .is_some_and(|r| r.event == LEAD)
    }

    /// The `lead` records: one per term.
    pub fn terms(&self) -> Vec<Record> {
        self.events(LEAD)
    }

    /// Waits up to `timeout` for a record matching `pred` (one already printed counts) and
    /// returns the first one.
    pub async fn wait_for(
        &self,
        timeout: Duration,
        pred: impl Fn(&Record) -> bool,
    ) -> Option<Record> {
        self.wait_for_after(None, timeout, pred).await
    }

    /// Like [`Self::wait_for`], only records stamped at or after `after` count.
    pub async fn wait_for_since(
        &self,
        after: Instant,
        timeout: Duration,
        pred: impl Fn(&Record) -> bool,
    ) -> Option<Record> {
        self.wait_for_after(Some(after), timeout, pred).await
    }

    async fn wait_for_after(
        &self,
        after: Option<Instant>,
        timeout: Duration,
        pred: impl Fn(&Record) -> bool,
    ) -> Option<Record> {
        let deadline = Instant::now() + timeout;
        let mut changed = self.shared.changed.subscribe();
        loop {
            changed.borrow_and_update();
            let found = self
                .shared
                .lock()
                .iter()
                .find(|r| after.is_none_or(|after| r.at >= after) && pred(r))
                .cloned();
            if found.is_some() {
                return found;
            }
            match tokio::time::timeout_at(deadline, changed.changed()).await {
                Ok(Ok(())) => {}
                // The reader ended (the process exited): one last look.
                Ok(Err(_)) => {
                    let records = self.shared.lock();
                    return records
                        .iter()
                        .find(|r| after.is_none_or(|after| r.at >= after) && pred(r))
                        .cloned();
                }
                Err(_) => return None,
            }
        }
    }

    /// Sends one command line (`stop`, `hog N`, `unhog`, `work MS`).
    pub async fn command(&mut self, line: &str) -> Result<(), HarnessError> {
        let stdin = self.stdin.as_mut().ok_or_else(|| HarnessError::Invalid {
            what: "replica stdin",
            detail: "closed".into(),
        })?;
        let context = || format!("write to replica {}", self.name);
        stdin
            .write_all(format!("{line}\n").as_bytes())
            .await
            .map_err(|e| HarnessError::io(context(), e))?;
        stdin
            .flush()
            .await
            .map_err(|e| HarnessError::io(context(), e))
    }

    /// Sends `signal` to the process (`SIGSTOP`, `SIGCONT`, …).
    pub fn signal(&self, signal: Signal) -> Result<(), HarnessError> {
        let pid = i32::try_from(self.pid).map_err(|_| HarnessError::Invalid {
            what: "pid",
            detail: self.pid.to_string(),
        })?;
        kill(Pid::from_raw(pid), signal).map_err(|e| {
            HarnessError::io(
                format!("{signal} to replica {}", self.name),
                std::io::Error::from(e),
            )
        })
    }

    /// Graceful stop: `SIGTERM`, then waits for the process to print its `exit` record and
    /// exit. Its records stay readable.
    pub async fn stop(&mut self) -> Result<ExitReport, HarnessError> {
        if !self.exited {
            self.signal(Signal::SIGTERM)?;
            self.wait_exit().await?;
        }
        let exit = self.events("exit");
        exit.last()
            .map(ExitReport::from_record)
            .ok_or_else(|| HarnessError::Invalid {
                what: "replica exit",
                detail: format!("{} exited without an exit record", self.name),
            })
    }

    /// `SIGKILL`, then waits for the process to be gone. A dead process leads nothing: when it
    /// led, a `follow` with cause `Killed` is recorded at the moment of the signal (in its
    /// records and the timeline). Its records stay readable.
    pub async fn kill(&mut self) -> Result<(), HarnessError> {
        let at = Instant::now();
        self.signal(Signal::SIGKILL)?;
        self.wait_exit().await?;
        if self.is_leader() {
            let record = Record {
                at,
                replica: self.name.clone(),
                event: FOLLOW.into(),
                fields: serde_json::json!({ "cause": "Killed" }),
            };
            self.timeline
                .record_at(at, self.name.clone(), FOLLOW.to_owned());
            self.shared.lock().push(record);
        }
        Ok(())
    }

    async fn wait_exit(&mut self) -> Result<(), HarnessError> {
        if self.exited {
            return Ok(());
        }
        let waited = tokio::time::timeout(EXIT_TIMEOUT, self.child.wait()).await;
        match waited {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(HarnessError::io(format!("wait for {}", self.name), e)),
            Err(_) => {
                return Err(HarnessError::Timeout {
                    what: format!("replica {} to exit", self.name),
                    after: EXIT_TIMEOUT,
                });
            }
        }
        self.exited = true;
        // The reader drains what the process printed before it exited.
        let _ = tokio::time::timeout(EXIT_TIMEOUT, &mut self.reader).await;
        Ok(())
    }
}

async fn read_records(stdout: ChildStdout, shared: Shared, timeline: Timeline) {
    let mut lines = BufReader::new(stdout).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let Some(record) = parse(&line) else {
            tracing::warn!(%line, "unparsable replica output");
            continue;
        };
        if record.event == LEAD || record.event == FOLLOW {
            timeline.record_at(record.at, record.replica.clone(), record.event.clone());
        }
        shared.lock().push(record);
        shared.changed.send_modify(|n| *n += 1);
    }
}

fn parse(line: &str) -> Option<Record> {
    let fields: Value = serde_json::from_str(line).ok()?;
    Some(Record {
        at: to_instant(fields.get("t")?.as_u64()?),
        replica: fields.get("replica")?.as_str()?.to_owned(),
        event: fields.get("event")?.as_str()?.to_owned(),
        fields,
    })
}

/// Indexes of the replicas whose last event is `lead`.
pub fn leaders(replicas: &[ReplicaProcess]) -> Vec<usize> {
    (0..replicas.len())
        .filter(|&i| replicas[i].is_leader())
        .collect()
}

/// Waits until exactly one replica leads and returns its index.
pub async fn wait_sole_leader(replicas: &[ReplicaProcess], timeout: Duration) -> Option<usize> {
    let deadline = Instant::now() + timeout;
    loop {
        if let [one] = leaders(replicas)[..] {
            return Some(one);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A key/value DSN for `config`'s hosts, ports, user, password, database and connect timeout
/// (the replica sets its own `application_name`).
pub fn dsn(config: &Config) -> String {
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .map(|host| match host {
            Host::Tcp(name) => name.clone(),
            Host::Unix(path) => path.display().to_string(),
        })
        .collect();
    let ports: Vec<String> = config.get_ports().iter().map(u16::to_string).collect();
    let mut parts = vec![
        format!("host={}", quote(&hosts.join(","))),
        format!("port={}", quote(&ports.join(","))),
    ];
    if let Some(user) = config.get_user() {
        parts.push(format!("user={}", quote(user)));
    }
    if let Some(password) = config.get_password() {
        parts.push(format!(
            "password={}",
            quote(&String::from_utf8_lossy(password))
        ));
    }
    if let Some(db) = config.get_dbname() {
        parts.push(format!("dbname={}", quote(db)));
    }
    if let Some(timeout) = config.get_connect_timeout() {
        parts.push(format!("connect_timeout={}", timeout.as_secs().max(1)));
    }
    parts.join(" ")
}

/// A DSN value in single quotes, with `\` and `'` escaped.
fn quote(value: &str) -> String {
    format!("'{}'", value.replace('\\', "\\\\").replace('\'', "\\'"))
}

/// The sessions of the current database whose `application_name` starts with `prefix`.
pub async fn session_names(client: &Client, prefix: &str) -> Result<Vec<String>, HarnessError> {
    let rows = client
        .query(
            "SELECT application_name FROM pg_stat_activity \
             WHERE datname = current_database() AND starts_with(application_name, $1) \
               AND pid <> pg_backend_pid()",
            &[&prefix],
        )
        .await?;
    rows.iter()
        .map(|row| Ok(row.try_get(0)?))
        .collect::<Result<_, HarnessError>>()
}

/// The backends that hold the leader lock in the current database, with their
/// `application_name` (an elector's identity, without its ` since <grant time>`).
pub async fn lock_holders(client: &Client) -> Result<Vec<(i32, String)>, HarnessError> {
    let rows = client
        .query(
            "SELECT l.pid, coalesce(a.application_name, '') FROM pg_locks l \
             LEFT JOIN pg_stat_activity a USING (pid) \
             WHERE l.locktype = 'advisory' AND l.classid = $1::int4::oid \
               AND l.objid = $2::int4::oid AND l.objsubid = 2 AND l.granted \
               AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            &[&LOCK_CLASSID, &LOCK_OBJID],
        )
        .await?;
    rows.iter()
        .map(|row| {
            let name: String = row.try_get(1)?;
            Ok((row.try_get(0)?, crate::observer::leader_name(&name)))
        })
        .collect::<Result<_, HarnessError>>()
}

/// After a scenario: waits up to `timeout` until no session of the replicas (`prefix`) is left
/// and no backend holds the leader lock. Returns what was still there on timeout.
pub async fn wait_clean(client: &Client, prefix: &str, timeout: Duration) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    loop {
        let sessions = session_names(client, prefix).await;
        let holders = lock_holders(client).await;
        match (sessions, holders) {
            (Ok(s), Ok(h)) if s.is_empty() && h.is_empty() => return Ok(()),
            (s, h) if Instant::now() >= deadline => {
                return Err(format!(
                    "after {timeout:?}: replica sessions {s:?}, lock holders {h:?}"
                ));
            }
            _ => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::str::FromStr;

    #[test]
    fn dsn_round_trips_through_tokio_postgres() {
        let config = Config::from_str(
            "host=127.0.0.1,localhost port=5432,6543 user=postgres password='a b\\'c' dbname=x",
        )
        .unwrap();
        let again = Config::from_str(&dsn(&config)).unwrap();
        assert_eq!(again.get_hosts(), config.get_hosts());
        assert_eq!(again.get_ports(), config.get_ports());
        assert_eq!(again.get_user(), Some("postgres"));
        assert_eq!(again.get_password(), Some(&b"a b'c"[..]));
        assert_eq!(again.get_dbname(), Some("x"));
    }

    #[test]
    fn records_parse_with_their_stamp() {
        let t = crate::clock::monotonic_ns();
        let line = format!(r#"{{"t":{t},"replica":"r","pid":1,"event":"lead","term":3}}"#);
        let record = parse(&line).unwrap();
        assert_eq!(record.replica, "r");
        assert_eq!(record.event, "lead");
        assert_eq!(record.u64("term"), Some(3));
        assert!(parse("not json").is_none());
    }
}
