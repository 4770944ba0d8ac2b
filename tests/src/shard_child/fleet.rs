//! The harness side of sharded replica processes: [`ShardLauncher`] starts them,
//! [`ShardProcess`] keeps what each printed on the harness's clock, and the pure functions
//! below replay the merged `begin` / `end` records into who owned which shard when
//! ([`shard_events`], [`owned_at`]), whether the space was balanced ([`balanced`],
//! [`settled_at`]) and whether two replicas ever believed they owned one shard
//! ([`max_shard_overlap`]). The `/proc` readers measure a throwaway cluster's CPU time and its
//! backends' memory.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use plexsphere_leader::shard_sql::{self, OwnerRow};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_postgres::{Client, SimpleQueryMessage};

use super::ShardChildArgs;
use crate::clock::to_instant;
use crate::timeline::{self, Event};
use crate::{Cluster, HarnessError, Record};

/// The record of a shard term's start.
pub const BEGIN: &str = "begin";
/// The record of a shard term's end.
pub const END: &str = "end";
/// How long a replica may take to print `ready`: a process of 128 single electors connects
/// 128 pools first, on a loaded machine alongside seven others.
const START_TIMEOUT: Duration = Duration::from_secs(180);
/// How long a replica may take to exit once signalled.
const EXIT_TIMEOUT: Duration = Duration::from_secs(10);

/// How to start sharded replica processes: the program, and the arguments before the
/// replica's own (`bench shard-replica …`).
#[derive(Debug, Clone)]
pub struct ShardLauncher {
    program: PathBuf,
    prefix: Vec<String>,
}

impl ShardLauncher {
    /// Runs `program prefix… <replica arguments>`.
    pub fn with_prefix(program: impl AsRef<Path>, prefix: &[&str]) -> Self {
        Self {
            program: program.as_ref().to_owned(),
            prefix: prefix.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    /// Starts a replica and waits until it printed `ready`.
    pub async fn spawn(&self, args: ShardChildArgs) -> Result<ShardProcess, HarnessError> {
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
            what: "shard replica process",
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
        let reader = tokio::spawn(read_records(stdout, shared.clone()));
        let process = ShardProcess {
            name: args.name.clone(),
            args,
            stdin: child.stdin.take(),
            child,
            pid,
            shared,
            reader,
            exited: false,
            started,
        };
        process
            .wait_for(START_TIMEOUT, |r| r.event == "ready")
            .await
            .ok_or_else(|| HarnessError::Timeout {
                what: format!("shard replica {} to start", process.name),
                after: START_TIMEOUT,
            })?;
        Ok(process)
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

/// A sharded replica (or a process of single electors) running in a child process. Dropping
/// it kills the process (`SIGKILL`).
#[derive(Debug)]
pub struct ShardProcess {
    name: String,
    args: ShardChildArgs,
    child: Child,
    stdin: Option<ChildStdin>,
    pid: u32,
    shared: Shared,
    reader: JoinHandle<()>,
    exited: bool,
    started: Instant,
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

impl ShardProcess {
    /// The replica's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The arguments it runs with.
    pub fn args(&self) -> &ShardChildArgs {
        &self.args
    }

    /// The OS pid.
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
        let records = self.shared.lock();
        records
            .iter()
            .filter(|r| r.event == event)
            .cloned()
            .collect()
    }

    /// The shards this replica believes it owns now, by the `begin` / `end` it printed.
    pub fn owned(&self) -> BTreeSet<u32> {
        let records = self.shared.lock();
        let mut owned = BTreeSet::new();
        for r in records.iter() {
            let Some(shard) = shard_of(r) else { continue };
            match r.event.as_str() {
                BEGIN => {
                    owned.insert(shard);
                }
                END => {
                    owned.remove(&shard);
                }
                _ => {}
            }
        }
        owned
    }

    /// The member id (lock session's backend pid) it printed last; `None` while it is none.
    pub fn member(&self) -> Option<i32> {
        let records = self.shared.lock();
        records
            .iter()
            .rev()
            .find(|r| r.event == "member")
            .and_then(|r| r.fields.get("member")?.as_i64())
            .and_then(|m| i32::try_from(m).ok())
    }

    /// The `log` records at `level`.
    pub fn logs(&self, level: &str) -> Vec<Record> {
        let records = self.shared.lock();
        records
            .iter()
            .filter(|r| r.event == "log" && r.str("level") == Some(level))
            .cloned()
            .collect()
    }

    /// Waits up to `timeout` for a record matching `pred` (one already printed counts).
    pub async fn wait_for(
        &self,
        timeout: Duration,
        pred: impl Fn(&Record) -> bool,
    ) -> Option<Record> {
        let deadline = Instant::now() + timeout;
        let mut changed = self.shared.changed.subscribe();
        loop {
            changed.borrow_and_update();
            let found = self.shared.lock().iter().find(|r| pred(r)).cloned();
            if found.is_some() {
                return found;
            }
            match tokio::time::timeout_at(deadline, changed.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return self.shared.lock().iter().find(|r| pred(r)).cloned(),
                Err(_) => return None,
            }
        }
    }

    /// Sends one command line (`stop`, `cpu`).
    pub async fn command(&mut self, line: &str) -> Result<(), HarnessError> {
        let stdin = self.stdin.as_mut().ok_or_else(|| HarnessError::Invalid {
            what: "shard replica stdin",
            detail: "closed".into(),
        })?;
        let context = || format!("write to shard replica {}", self.name);
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
    pub async fn cpu(&mut self) -> Result<CpuSample, HarnessError> {
        let asked = Instant::now();
        self.command("cpu").await?;
        let record = self
            .wait_for(EXIT_TIMEOUT, |r| r.event == "cpu" && r.at >= asked)
            .await
            .ok_or_else(|| HarnessError::Timeout {
                what: format!("shard replica {} to report its CPU time", self.name),
                after: EXIT_TIMEOUT,
            })?;
        Ok(CpuSample {
            cpu: Duration::from_nanos(record.u64("cpu_ns").unwrap_or(0)),
            rss_kb: record.u64("rss_kb").unwrap_or(0),
            hwm_kb: record.u64("hwm_kb").unwrap_or(0),
        })
    }

    /// Sends `signal` to the process.
    pub fn signal(&self, signal: Signal) -> Result<(), HarnessError> {
        let pid = i32::try_from(self.pid).map_err(|_| HarnessError::Invalid {
            what: "pid",
            detail: self.pid.to_string(),
        })?;
        kill(Pid::from_raw(pid), signal).map_err(|e| {
            HarnessError::io(
                format!("{signal} to shard replica {}", self.name),
                std::io::Error::from(e),
            )
        })
    }

    /// Graceful stop: `SIGTERM`, then waits for the `exit` record and the exit. Returns the
    /// error `run` reported, if any. Its records stay readable.
    pub async fn stop(&mut self) -> Result<Option<String>, HarnessError> {
        if !self.exited {
            self.signal(Signal::SIGTERM)?;
            self.wait_exit().await?;
        }
        let exit = self.events("exit");
        let exit = exit.last().ok_or_else(|| HarnessError::Invalid {
            what: "shard replica exit",
            detail: format!("{} exited without an exit record", self.name),
        })?;
        Ok(exit.str("run").map(str::to_owned))
    }

    /// `SIGKILL`, then waits for the process to be gone. A dead process owns nothing: an `end`
    /// (cause `Killed`) of every shard it owned is recorded at the instant of the signal.
    /// Returns that instant.
    pub async fn kill(&mut self) -> Result<Instant, HarnessError> {
        let at = Instant::now();
        self.signal(Signal::SIGKILL)?;
        self.wait_exit().await?;
        let owned = self.owned();
        let mut records = self.shared.lock();
        for shard in owned {
            records.push(Record {
                at,
                replica: self.name.clone(),
                event: END.into(),
                fields: serde_json::json!({ "shard": shard, "cause": "Killed" }),
            });
        }
        drop(records);
        self.shared.changed.send_modify(|n| *n += 1);
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
                    what: format!("shard replica {} to exit", self.name),
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

fn shard_of(record: &Record) -> Option<u32> {
    record
        .fields
        .get("shard")?
        .as_u64()
        .and_then(|s| u32::try_from(s).ok())
}

async fn read_records(stdout: ChildStdout, shared: Shared) {
    let mut lines = BufReader::new(stdout).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let Some(record) = parse(&line) else {
            tracing::warn!(%line, "unparsable shard replica output");
            continue;
        };
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

// ---------------------------------------------------------------------------------------------
// Ownership over time: pure functions of the merged records

/// A shard term that began or ended on one replica.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardEvent {
    /// When, on the harness's clock.
    pub at: Instant,
    /// The replica.
    pub replica: String,
    /// The shard.
    pub shard: u32,
    /// `true` for a begin, `false` for an end.
    pub began: bool,
}

/// Every `begin` and `end` of `processes`, ordered by time (a replica's own order kept for
/// equal stamps).
pub fn shard_events(processes: &[&ShardProcess]) -> Vec<ShardEvent> {
    let mut events: Vec<ShardEvent> = processes
        .iter()
        .flat_map(|p| p.records())
        .filter_map(|r| {
            let began = match r.event.as_str() {
                BEGIN => true,
                END => false,
                _ => return None,
            };
            Some(ShardEvent {
                at: r.at,
                shard: shard_of(&r)?,
                replica: r.replica,
                began,
            })
        })
        .collect();
    events.sort_by_key(|e| e.at);
    events
}

/// Who believed they owned which shards after every event stamped at or before `at`.
pub fn owned_at(events: &[ShardEvent], at: Instant) -> BTreeMap<String, BTreeSet<u32>> {
    let mut owned: BTreeMap<String, BTreeSet<u32>> = BTreeMap::new();
    for e in events.iter().take_while(|e| e.at <= at) {
        apply(&mut owned, e);
    }
    owned
}

fn apply(owned: &mut BTreeMap<String, BTreeSet<u32>>, e: &ShardEvent) {
    let shards = owned.entry(e.replica.clone()).or_default();
    if e.began {
        shards.insert(e.shard);
    } else {
        shards.remove(&e.shard);
    }
}

/// Whether `owned` is a balanced ownership of `k` shards by the `live` replicas: every shard
/// owned by exactly one of them, nobody else owning any, and each owning `⌊k/R⌋` or `⌈k/R⌉`.
pub fn balanced(owned: &BTreeMap<String, BTreeSet<u32>>, live: &[String], k: u32) -> bool {
    if live.is_empty() {
        return false;
    }
    let r = live.len();
    let (lo, hi) = (k as usize / r, (k as usize).div_ceil(r));
    let count = |name: &String| owned.get(name).map_or(0, BTreeSet::len);
    if !live.iter().all(|name| (lo..=hi).contains(&count(name))) {
        return false;
    }
    if owned
        .iter()
        .any(|(name, shards)| !shards.is_empty() && !live.contains(name))
    {
        return false;
    }
    let total: usize = live.iter().map(count).sum();
    let distinct: BTreeSet<u32> = live
        .iter()
        .filter_map(|name| owned.get(name))
        .flatten()
        .copied()
        .collect();
    total == k as usize && distinct.len() == total && distinct.iter().all(|s| *s < k)
}

/// When the ownership became balanced ([`balanced`]) for the last time in `[from, until]`, if
/// it is balanced at `until`: from then on it stayed balanced. `from` itself when it was
/// balanced throughout.
pub fn settled_at(
    events: &[ShardEvent],
    live: &[String],
    k: u32,
    from: Instant,
    until: Instant,
) -> Option<Instant> {
    balance_changes(events, live, k, from, until)
        .last()
        .and_then(|&(at, is_balanced)| is_balanced.then_some(at))
}

/// When the ownership was first balanced in `[from, until]`.
pub fn first_balanced_at(
    events: &[ShardEvent],
    live: &[String],
    k: u32,
    from: Instant,
    until: Instant,
) -> Option<Instant> {
    balance_changes(events, live, k, from, until)
        .into_iter()
        .find(|(_, is_balanced)| *is_balanced)
        .map(|(at, _)| at)
}

/// The instants in `[from, until]` at which [`balanced`] changed, with its new value; the
/// first entry is its value at `from`.
fn balance_changes(
    events: &[ShardEvent],
    live: &[String],
    k: u32,
    from: Instant,
    until: Instant,
) -> Vec<(Instant, bool)> {
    let mut owned = BTreeMap::new();
    let mut rest = events.iter().peekable();
    while let Some(e) = rest.next_if(|e| e.at <= from) {
        apply(&mut owned, e);
    }
    let mut changes = vec![(from, balanced(&owned, live, k))];
    while let Some(e) = rest.next_if(|e| e.at <= until) {
        apply(&mut owned, e);
        // Evaluate once every event of this instant is applied.
        if rest.peek().is_some_and(|next| next.at == e.at) {
            continue;
        }
        let now = balanced(&owned, live, k);
        if changes.last().is_some_and(|(_, was)| *was != now) {
            changes.push((e.at, now));
        }
    }
    changes
}

/// How many shard terms began in `(from, to]`: the shards that got an owner, counted once per
/// move (a shard moved twice counts twice).
pub fn begins_between(events: &[ShardEvent], from: Instant, to: Instant) -> usize {
    events
        .iter()
        .filter(|e| e.began && e.at > from && e.at <= to)
        .count()
}

/// How many shards have a different owner at `after` than at `before` (a shard owned by nobody
/// at one of them counts when it is owned at the other).
pub fn owners_changed(events: &[ShardEvent], before: Instant, after: Instant) -> usize {
    let owner_map = |at| -> BTreeMap<u32, String> {
        owned_at(events, at)
            .into_iter()
            .flat_map(|(name, shards)| shards.into_iter().map(move |s| (s, name.clone())))
            .collect()
    };
    let (a, b) = (owner_map(before), owner_map(after));
    let shards: BTreeSet<u32> = a.keys().chain(b.keys()).copied().collect();
    shards.iter().filter(|s| a.get(s) != b.get(s)).count()
}

/// The longest span in which two replicas believed they owned the same shard, and that shard;
/// terms still open end at `until`. `None` when no shard ever had two believed owners.
pub fn max_shard_overlap(events: &[ShardEvent], until: Instant) -> Option<(Duration, u32)> {
    let mut by_shard: BTreeMap<u32, Vec<Event>> = BTreeMap::new();
    for e in events {
        by_shard.entry(e.shard).or_default().push(Event {
            at: e.at,
            replica: e.replica.clone(),
            event: if e.began { BEGIN } else { END }.to_owned(),
        });
    }
    by_shard
        .into_iter()
        .filter_map(|(shard, events)| {
            let intervals = timeline::intervals_from_events(&events, BEGIN, END, until);
            let spans = timeline::overlaps(&intervals);
            spans
                .iter()
                .map(timeline::Span::duration)
                .max()
                .map(|d| (d, shard))
        })
        .max()
}

// ---------------------------------------------------------------------------------------------
// The server's view

/// Who holds which lock of the space `class` of `count` shards, from `pg_locks`
/// ([`shard_sql::owners`]).
pub async fn owners(client: &Client, class: i32, count: u32) -> Result<Vec<OwnerRow>, String> {
    let messages = client
        .simple_query(&shard_sql::owners(class, count))
        .await
        .map_err(|e| e.to_string())?;
    let rows: Vec<plexsphere_leader::session::Row> = messages
        .iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(row) => Some(
                (0..row.len())
                    .map(|i| row.get(i).map(str::to_owned))
                    .collect(),
            ),
            _ => None,
        })
        .collect();
    shard_sql::parse_owners(&rows).map_err(|e| e.to_string())
}

/// CPU time so far of the cluster's postmaster and all its children, live
/// (`/proc/<pid>/schedstat`) and exited (the postmaster's `cutime + cstime`).
pub fn cluster_cpu(cluster: &Cluster) -> Duration {
    let Some(postmaster) = postmaster_pid(cluster) else {
        return Duration::ZERO;
    };
    let mut total = cpu_of(postmaster) + reaped_children(postmaster);
    for pid in children_of(postmaster) {
        total += cpu_of(pid);
    }
    total
}

/// The pid of the cluster's postmaster, from `postmaster.pid`.
pub fn postmaster_pid(cluster: &Cluster) -> Option<u32> {
    let pidfile = cluster.dir().join("data").join("postmaster.pid");
    std::fs::read_to_string(pidfile)
        .ok()
        .and_then(|s| s.lines().next().and_then(|l| l.trim().parse::<u32>().ok()))
}

/// The live children of `parent` (from `/proc/*/stat`).
pub fn children_of(parent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| parent_of(*pid) == Some(parent))
        .collect()
}

/// The anonymous memory of `pids` (`Pss_Anon` of `/proc/<pid>/smaps_rollup`: each page
/// divided among the processes mapping it), summed, in kB: a backend's own memory (its caches
/// and work memory), without the shared buffers and lock table every backend maps.
pub fn anonymous_kb(pids: &[u32]) -> u64 {
    pids.iter()
        .map(|pid| {
            let rollup =
                std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
            rollup
                .lines()
                .find_map(|l| l.strip_prefix("Pss_Anon:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
                .unwrap_or(0)
        })
        .sum()
}

fn cpu_of(pid: u32) -> Duration {
    std::fs::read_to_string(format!("/proc/{pid}/schedstat"))
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|n| n.parse().ok()))
        .map_or(Duration::ZERO, Duration::from_nanos)
}

fn reaped_children(pid: u32) -> Duration {
    let fields = || -> Option<u64> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let rest: Vec<&str> = stat[stat.rfind(')')? + 1..].split_whitespace().collect();
        // After the command: state is field 3, cutime field 16, cstime field 17.
        Some(rest.get(13)?.parse::<u64>().ok()? + rest.get(14)?.parse::<u64>().ok()?)
    };
    // In USER_HZ = 100 ticks per second on Linux.
    fields().map_or(Duration::ZERO, |ticks| Duration::from_millis(ticks * 10))
}

fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command may contain spaces and parentheses: the fields resume after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: &[&str]) -> Vec<String> {
        n.iter().map(|s| (*s).to_owned()).collect()
    }

    fn event(t0: Instant, ms: u64, replica: &str, shard: u32, began: bool) -> ShardEvent {
        ShardEvent {
            at: t0 + Duration::from_millis(ms),
            replica: replica.into(),
            shard,
            began,
        }
    }

    #[test]
    fn balance_needs_every_shard_once_and_shares_within_one() {
        let live = names(&["a", "b"]);
        let mut owned: BTreeMap<String, BTreeSet<u32>> = BTreeMap::new();
        owned.insert("a".into(), [0, 1].into());
        owned.insert("b".into(), [2].into());
        assert!(balanced(&owned, &live, 3));
        // A shard owned twice.
        owned.insert("b".into(), [1, 2].into());
        assert!(!balanced(&owned, &live, 3));
        // 3 and 1 of 4: not within one.
        owned.insert("a".into(), [0, 1, 3].into());
        owned.insert("b".into(), [2].into());
        assert!(!balanced(&owned, &live, 4));
        // A replica outside the live set still owning a shard.
        owned.insert("a".into(), [0, 1].into());
        owned.insert("b".into(), [2, 3].into());
        owned.insert("gone".into(), [3].into());
        assert!(!balanced(&owned, &live, 4));
        owned.insert("gone".into(), BTreeSet::new());
        assert!(balanced(&owned, &live, 4));
    }

    #[test]
    fn settled_is_the_last_time_the_space_became_balanced() {
        let t0 = Instant::now();
        let live = names(&["a", "b"]);
        let events = vec![
            event(t0, 0, "a", 0, true),
            event(t0, 0, "a", 1, true),
            event(t0, 10, "b", 2, true),
            event(t0, 10, "b", 3, true),  // balanced at 10
            event(t0, 20, "b", 3, false), // not at 20
            event(t0, 30, "b", 3, true),  // again at 30
        ];
        let until = t0 + Duration::from_millis(100);
        assert_eq!(
            first_balanced_at(&events, &live, 4, t0, until),
            Some(t0 + Duration::from_millis(10))
        );
        assert_eq!(
            settled_at(&events, &live, 4, t0, until),
            Some(t0 + Duration::from_millis(30))
        );
        assert_eq!(
            settled_at(&events, &live, 4, t0, t0 + Duration::from_millis(25)),
            None
        );
        // The begins at t0 itself are not after it.
        assert_eq!(begins_between(&events, t0, until), 3);
        assert_eq!(owners_changed(&events, t0, until), 2);
    }

    #[test]
    fn an_overlap_is_two_replicas_believing_they_own_one_shard() {
        let t0 = Instant::now();
        let until = t0 + Duration::from_millis(100);
        let handover = vec![
            event(t0, 0, "a", 5, true),
            event(t0, 40, "a", 5, false),
            event(t0, 40, "b", 5, true),
        ];
        assert_eq!(max_shard_overlap(&handover, until), None);
        let overlap = vec![
            event(t0, 0, "a", 5, true),
            event(t0, 30, "b", 5, true),
            event(t0, 45, "a", 5, false),
        ];
        assert_eq!(
            max_shard_overlap(&overlap, until),
            Some((Duration::from_millis(15), 5))
        );
    }
}
