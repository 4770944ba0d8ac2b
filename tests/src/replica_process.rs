//! The harness side of replica child processes ([`crate::replica_child`]): [`Launcher`] starts
//! them, [`ReplicaProcess`] keeps what each printed as [`Record`]s on the harness's clock,
//! sends it commands and signals, stops or kills it. Two thin layers read the records:
//!
//! - the election's ([`LEAD`], [`FOLLOW`], [`leaders`], [`wait_sole_leader`], [`wait_clean`],
//!   …): a process's `lead` and `follow` may also go to a [`Timeline`] merged with the other
//!   replicas' ([`Launcher::spawn_with_timeline`]);
//! - the sharded space's ([`shards`]): who owned which shard when, balance, overlaps, and the
//!   server's view.
//!
//! Every record carries the child's `CLOCK_MONOTONIC` stamp, converted with
//! [`crate::clock::to_instant`], so the records of all replicas, the [`crate::LockObserver`]
//! and the test itself share one clock.

mod election;
pub mod shards;

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
use tokio_postgres::config::{Config, Host};

pub use self::election::{
    FOLLOW, LEAD, REPLICA_APP_PREFIX, leaders, lock_holders, session_names, wait_clean,
    wait_sole_leader,
};
use crate::clock::to_instant;
use crate::replica_child::ChildArgs;
use crate::{HarnessError, Timeline};

/// How long an election's replica may take to print `ready`.
const START_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a sharded replica may take to print `ready`: a process of 128 single electors
/// connects 128 pools first, on a loaded machine alongside seven others.
const SPACE_START_TIMEOUT: Duration = Duration::from_secs(180);
/// How long a replica may take to exit once signalled, or to answer `cpu`.
const EXIT_TIMEOUT: Duration = Duration::from_secs(10);

/// One line a replica printed.
#[derive(Debug, Clone)]
pub struct Record {
    /// When it happened, on the harness's clock.
    pub at: Instant,
    /// The replica's name.
    pub replica: String,
    /// What happened (`ready`, `lead`, `follow`, `begin`, `end`, `log`, `exit`, …).
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

    /// Whether this is a `log` record at `level` whose message starts with `message` (`""`:
    /// any message).
    pub fn is_log(&self, level: &str, message: &str) -> bool {
        self.event == "log"
            && self.str("level") == Some(level)
            && self.str("message").is_some_and(|m| m.starts_with(message))
    }
}

/// What a replica reported when its `run` returned (the `exit` record).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExitReport {
    /// `run`'s error (the sharded modes: every run's, joined), if it returned one.
    pub run_error: Option<String>,
    /// The pool after `run` returned; `None` from the sharded modes, which do not report it.
    pub pool: Option<PoolReport>,
}

/// The state of the election's pool once `run` returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolReport {
    /// The pool's connections (idle and in use).
    pub size: u64,
    /// Idle connections.
    pub available: u64,
    /// Callers waiting for a connection.
    pub waiting: u64,
    /// Whether the pool then handed out a connection that answered `SELECT 1`.
    pub ok: bool,
    /// Why it did not.
    pub error: Option<String>,
}

impl ExitReport {
    /// No pool lost a connection: `run` ended well, every connection the pool counts is back
    /// in it, nobody waits, and it still serves one.
    pub fn pool_intact(&self) -> bool {
        self.run_error.is_none()
            && self
                .pool
                .as_ref()
                .is_some_and(|p| p.ok && p.waiting == 0 && p.available == p.size)
    }

    fn from_record(record: &Record) -> Self {
        let pool = record.u64("pool_size").map(|size| PoolReport {
            size,
            available: record.u64("pool_available").unwrap_or(0),
            waiting: record.u64("pool_waiting").unwrap_or(0),
            ok: record.bool("pool_ok").unwrap_or(false),
            error: record.str("pool_error").map(str::to_owned),
        });
        Self {
            run_error: record.str("run").map(str::to_owned),
            pool,
        }
    }
}

/// What a `cpu` command answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuSample {
    /// The process's CPU time so far, every thread.
    pub cpu: Duration,
    /// Its resident set, kB.
    pub rss_kb: u64,
    /// Its peak resident set, kB.
    pub hwm_kb: u64,
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

    fn push(&self, record: Record) {
        self.lock().push(record);
        self.changed.send_modify(|n| *n += 1);
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
        Self::with_prefix(program, &[])
    }

    /// Runs `program prefix… <replica arguments>` (the benchmark runs itself as `bench replica`).
    pub fn with_prefix(program: impl AsRef<Path>, prefix: &[&str]) -> Self {
        Self {
            program: program.as_ref().to_owned(),
            prefix: prefix.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    /// Starts a replica and waits until it printed `ready` (up to 10 s for the election, 180 s
    /// for the sharded modes).
    ///
    /// # Errors
    /// The process could not start, or printed no `ready` in time.
    pub async fn spawn(&self, args: ChildArgs) -> Result<ReplicaProcess, HarnessError> {
        self.start(args, None).await
    }

    /// [`Self::spawn`], and the replica's `lead` and `follow` (and its [`ReplicaProcess::kill`]'s
    /// `follow`) also go to `timeline` under its name.
    ///
    /// # Errors
    /// As [`Self::spawn`].
    pub async fn spawn_with_timeline(
        &self,
        args: ChildArgs,
        timeline: &Timeline,
    ) -> Result<ReplicaProcess, HarnessError> {
        self.start(args, Some(timeline.clone())).await
    }

    async fn start(
        &self,
        args: ChildArgs,
        timeline: Option<Timeline>,
    ) -> Result<ReplicaProcess, HarnessError> {
        let started = Instant::now();
        let mut child = Command::new(&self.program)
            .args(&self.prefix)
            .args(args.to_args())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| HarnessError::io(format!("spawn {}", self.program.display()), e))?;
        let invalid = |detail: &str| HarnessError::Invalid {
            what: "replica process",
            detail: detail.into(),
        };
        let pid = child.id().ok_or_else(|| invalid("exited at once"))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| invalid("no stdout pipe"))?;
        let shared = Shared {
            records: Arc::default(),
            changed: watch::Sender::new(0),
        };
        let reader = tokio::spawn(read_records(stdout, shared.clone(), timeline.clone()));
        let timeout = match args.shards {
            None => START_TIMEOUT,
            Some(_) => SPACE_START_TIMEOUT,
        };
        let replica = ReplicaProcess {
            name: args.name.clone(),
            args,
            stdin: child.stdin.take(),
            child,
            pid,
            shared,
            reader,
            timeline,
            exited: false,
            started,
        };
        replica
            .wait_for(timeout, |r| r.event == "ready")
            .await
            .ok_or_else(|| HarnessError::Timeout {
                what: format!("replica {} to start", replica.name),
                after: timeout,
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
    timeline: Option<Timeline>,
    exited: bool,
    started: Instant,
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

    /// When the harness started the process.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// Whether the process has exited (stopped or killed).
    pub fn exited(&self) -> bool {
        self.exited
    }

    /// Every record so far, in the order printed.
    pub fn records(&self) -> Vec<Record> {
        self.shared.lock().clone()
    }

    /// The records of one event kind.
    pub fn events(&self, event: &str) -> Vec<Record> {
        self.filtered(|r| r.event == event)
    }

    /// The `log` records at `level` whose message starts with `message` (`""`: every one).
    pub fn logs(&self, level: &str, message: &str) -> Vec<Record> {
        self.filtered(|r| r.is_log(level, message))
    }

    fn filtered(&self, pred: impl Fn(&Record) -> bool) -> Vec<Record> {
        let records = self.shared.lock();
        records.iter().filter(|r| pred(r)).cloned().collect()
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
        let find = || {
            self.shared
                .lock()
                .iter()
                .find(|r| after.is_none_or(|after| r.at >= after) && pred(r))
                .cloned()
        };
        loop {
            changed.borrow_and_update();
            let found = find();
            if found.is_some() {
                return found;
            }
            match tokio::time::timeout_at(deadline, changed.changed()).await {
                Ok(Ok(())) => {}
                // The reader ended (the process exited): one last look.
                Ok(Err(_)) => return find(),
                Err(_) => return None,
            }
        }
    }

    /// Sends one command line (`stop`, `cpu`; `hog N`, `unhog`, `work MS` to the election;
    /// `go` to singles).
    ///
    /// # Errors
    /// Its stdin is closed or the write failed.
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

    /// Asks for the process's CPU time and memory (`cpu`) and waits for the answer.
    ///
    /// # Errors
    /// The command could not be sent, or no answer came within 10 s.
    pub async fn cpu(&mut self) -> Result<CpuSample, HarnessError> {
        let asked = Instant::now();
        self.command("cpu").await?;
        let record = self
            .wait_for_since(asked, EXIT_TIMEOUT, |r| r.event == "cpu")
            .await
            .ok_or_else(|| HarnessError::Timeout {
                what: format!("replica {} to report its CPU time", self.name),
                after: EXIT_TIMEOUT,
            })?;
        Ok(CpuSample {
            cpu: Duration::from_nanos(record.u64("cpu_ns").unwrap_or(0)),
            rss_kb: record.u64("rss_kb").unwrap_or(0),
            hwm_kb: record.u64("hwm_kb").unwrap_or(0),
        })
    }

    /// Sends `signal` to the process (`SIGSTOP`, `SIGCONT`, …).
    ///
    /// # Errors
    /// The signal could not be sent (the process is gone).
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
    ///
    /// # Errors
    /// The signal failed, the process did not exit within 10 s, or it printed no `exit`.
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

    /// `SIGKILL`, then waits for the process to be gone. A dead process leads and owns
    /// nothing: when it led, a `follow` with cause `Killed` is recorded at the instant of the
    /// signal (in its records and its timeline), and an `end` (cause `Killed`) of every shard
    /// it owned. Its records stay readable. Returns that instant.
    ///
    /// # Errors
    /// The signal failed or the process did not exit within 10 s.
    pub async fn kill(&mut self) -> Result<Instant, HarnessError> {
        let at = Instant::now();
        self.signal(Signal::SIGKILL)?;
        self.wait_exit().await?;
        let killed: Vec<Record> = self
            .killed_follow(at)
            .into_iter()
            .chain(self.killed_ends(at))
            .collect();
        for record in killed {
            accept(&self.shared, self.timeline.as_ref(), record);
        }
        Ok(at)
    }

    async fn wait_exit(&mut self) -> Result<(), HarnessError> {
        if self.exited {
            return Ok(());
        }
        match tokio::time::timeout(EXIT_TIMEOUT, self.child.wait()).await {
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

async fn read_records(stdout: ChildStdout, shared: Shared, timeline: Option<Timeline>) {
    let mut lines = BufReader::new(stdout).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let Some(record) = parse(&line) else {
            tracing::warn!(%line, "unparsable replica output");
            continue;
        };
        accept(&shared, timeline.as_ref(), record);
    }
}

/// Keeps `record`; a `lead` or `follow` also goes to `timeline`.
fn accept(shared: &Shared, timeline: Option<&Timeline>, record: Record) {
    if let Some(timeline) = timeline {
        election::to_timeline(timeline, &record);
    }
    shared.push(record);
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

    #[test]
    fn an_exit_record_reports_the_pool_only_when_it_has_one() {
        let record = |line: &str| parse(line).expect("a record");
        let election = record(
            r#"{"t":1,"replica":"r","event":"exit","run":null,"pool_size":2,
                "pool_available":2,"pool_waiting":0,"pool_ok":true,"pool_error":null}"#,
        );
        assert!(ExitReport::from_record(&election).pool_intact());
        let sharded = record(r#"{"t":1,"replica":"r","event":"exit","run":"cut off"}"#);
        let report = ExitReport::from_record(&sharded);
        assert_eq!(report.run_error.as_deref(), Some("cut off"));
        assert_eq!(report.pool, None);
        assert!(!report.pool_intact());
    }
}
