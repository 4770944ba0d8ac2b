//! Helpers of the fault-injection suite (`fault_*.rs`): replica processes, the merged timeline,
//! and the checks every scenario ends with.
#![allow(dead_code)] // reason: each test binary uses a different subset
#![allow(unreachable_pub)] // reason: a module of test binaries, not a library

use std::time::Duration;

use plexsphere_leader_tests::replica_process::{
    FOLLOW, LEAD, REPLICA_APP_PREFIX, dsn, session_names, wait_clean,
};
use plexsphere_leader_tests::timeline::{self, Interval};
use plexsphere_leader_tests::{Backend, ChildArgs, ExitReport, Launcher, ReplicaProcess, Timeline};
use tokio::time::Instant;
use tokio_postgres::{Client, Config};

pub use crate::support::{I, MARGIN, STARTUP};

/// How long the end-of-scenario check waits for the replicas' sessions and the lock to go: a
/// session closed by its client ends within milliseconds; the slack is for a loaded machine.
pub const CLEAN_TIMEOUT: Duration = Duration::from_secs(10);

/// The replica binary of this package.
pub fn launcher() -> Launcher {
    Launcher::new(env!("CARGO_BIN_EXE_plx-replica"))
}

/// The replicas of one scenario and their merged timeline.
pub struct Fleet {
    pub timeline: Timeline,
    pub replicas: Vec<ReplicaProcess>,
    launcher: Launcher,
}

impl Fleet {
    pub fn new() -> Self {
        Self {
            timeline: Timeline::new(),
            replicas: Vec::new(),
            launcher: launcher(),
        }
    }

    /// Starts replica `plx-replica-<name>` on `config` (a deadpool pool of 2) and returns its
    /// index.
    pub async fn spawn(&mut self, name: &str, config: &Config, interval: Duration) -> usize {
        self.spawn_dsn(name, dsn(config), interval, 2).await
    }

    /// Starts replica `plx-replica-<name>` on `config` with a pool of 2 of `backend`.
    pub async fn spawn_on(
        &mut self,
        backend: Backend,
        name: &str,
        config: &Config,
        interval: Duration,
    ) -> usize {
        self.spawn_args(ChildArgs {
            backend,
            ..ChildArgs::new(format!("{REPLICA_APP_PREFIX}{name}"), dsn(config), interval)
        })
        .await
    }

    /// Starts replica `plx-replica-<name>` on a raw DSN with a pool of `pool_size`.
    pub async fn spawn_dsn(
        &mut self,
        name: &str,
        dsn: String,
        interval: Duration,
        pool_size: usize,
    ) -> usize {
        self.spawn_args(ChildArgs {
            pool_size,
            ..ChildArgs::new(format!("{REPLICA_APP_PREFIX}{name}"), dsn, interval)
        })
        .await
    }

    /// Starts a replica with `args` and returns its index.
    pub async fn spawn_args(&mut self, args: ChildArgs) -> usize {
        let replica = self
            .launcher
            .spawn_with_timeline(args, &self.timeline)
            .await
            .expect("replica process starts");
        self.replicas.push(replica);
        self.replicas.len() - 1
    }

    pub fn get(&self, index: usize) -> &ReplicaProcess {
        &self.replicas[index]
    }

    pub fn get_mut(&mut self, index: usize) -> &mut ReplicaProcess {
        &mut self.replicas[index]
    }

    /// Waits until replica `index` leads; returns its `lead` stamp.
    pub async fn wait_lead(&self, index: usize, timeout: Duration) -> Instant {
        self.replicas[index]
            .wait_for(timeout, |r| r.event == LEAD)
            .await
            .unwrap_or_else(|| panic!("{} leads within {timeout:?}", self.replicas[index].name()))
            .at
    }

    /// Waits for a `lead` of replica `index` stamped at or after `since`.
    pub async fn wait_lead_since(
        &self,
        index: usize,
        since: Instant,
        timeout: Duration,
    ) -> Instant {
        self.replicas[index]
            .wait_for_since(since, timeout, |r| r.event == LEAD)
            .await
            .unwrap_or_else(|| {
                panic!(
                    "{} leads within {timeout:?}: {:#?}",
                    self.replicas[index].name(),
                    self.replicas[index].records()
                )
            })
            .at
    }

    /// Waits for a `follow` of replica `index` stamped at or after `since`; returns its stamp
    /// and cause.
    pub async fn wait_follow_since(
        &self,
        index: usize,
        since: Instant,
        timeout: Duration,
    ) -> (Instant, String) {
        let record = self.replicas[index]
            .wait_for_since(since, timeout, |r| r.event == FOLLOW)
            .await
            .unwrap_or_else(|| {
                panic!(
                    "{} demotes within {timeout:?}: {:#?}",
                    self.replicas[index].name(),
                    self.replicas[index].records()
                )
            });
        (
            record.at,
            record.str("cause").unwrap_or_default().to_owned(),
        )
    }

    /// Waits (up to `STARTUP`: not a bound under test) until replica `index` has a session on
    /// the server of `client`, i.e. its first check has connected.
    pub async fn wait_checked(&self, client: &Client, index: usize) {
        let name = self.replicas[index].name().to_owned();
        let deadline = Instant::now() + STARTUP;
        loop {
            let sessions = session_names(client, &name)
                .await
                .expect("read pg_stat_activity");
            if !sessions.is_empty() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{name} connected within {STARTUP:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Indexes of the replicas that lead now.
    pub fn leaders(&self) -> Vec<usize> {
        plexsphere_leader_tests::replica_process::leaders(&self.replicas)
    }

    /// Waits until exactly one replica leads.
    pub async fn sole_leader(&self, timeout: Duration) -> usize {
        plexsphere_leader_tests::replica_process::wait_sole_leader(&self.replicas, timeout)
            .await
            .unwrap_or_else(|| {
                panic!(
                    "exactly one leader within {timeout:?}: {:?}",
                    self.leaders()
                )
            })
    }

    /// The spans each replica believed it led, open ones ending now.
    pub fn intervals(&self) -> Vec<Interval> {
        self.timeline.intervals(LEAD, FOLLOW, Instant::now())
    }

    /// The longest span two replicas believed they led at once.
    pub fn max_overlap(&self) -> Duration {
        timeline::max_overlap(&self.intervals())
    }

    /// Every `lead` of every replica.
    pub fn lead_count(&self) -> usize {
        self.replicas.iter().map(|r| r.terms().len()).sum()
    }

    /// Stops every replica still running (graceful), asserts that no pool lost a connection,
    /// then that no session of the replicas and no lock is left on the server of `client`.
    pub async fn finish(mut self, client: &Client) {
        self.stop_all().await;
        if let Err(left) = wait_clean(client, REPLICA_APP_PREFIX, CLEAN_TIMEOUT).await {
            panic!("left on the server: {left}");
        }
    }

    /// Stops every replica still running (graceful) and asserts that no pool lost a connection.
    pub async fn stop_all(&mut self) {
        for replica in &mut self.replicas {
            let report = replica.stop().await;
            let name = replica.name().to_owned();
            match report {
                Ok(report) => assert_pool_intact(&name, &report),
                // Killed earlier: its pool died with it; the server check still applies.
                Err(_) if replica_was_killed(replica) => {}
                Err(e) => {
                    let records = replica.records();
                    let tail = &records[records.len().saturating_sub(8)..];
                    panic!("stop {name}: {e}; last records: {tail:#?}")
                }
            }
        }
    }
}

fn replica_was_killed(replica: &ReplicaProcess) -> bool {
    replica.records().iter().all(|r| r.event != "exit")
}

pub fn assert_pool_intact(name: &str, report: &ExitReport) {
    assert!(
        report.pool_intact(),
        "{name}: the pool lost a connection or stopped serving: {report:?}"
    );
}

/// `pg_stat_database.sessions_fatal` of the current database: sessions ended by a FATAL error,
/// among them the idle-session timeout (`terminating connection due to idle-session timeout`).
/// Backends report at exit, so the count is current once the session is gone.
pub async fn sessions_fatal(client: &Client) -> i64 {
    client
        .batch_execute("SELECT pg_stat_clear_snapshot()")
        .await
        .expect("clear the statistics snapshot");
    client
        .query_one(
            "SELECT sessions_fatal FROM pg_stat_database WHERE datname = current_database()",
            &[],
        )
        .await
        .expect("pg_stat_database row")
        .get(0)
}

/// Waits until `sessions_fatal` reaches `at_least`; returns the value seen last.
pub async fn wait_sessions_fatal(client: &Client, at_least: i64, timeout: Duration) -> i64 {
    let deadline = Instant::now() + timeout;
    loop {
        let n = sessions_fatal(client).await;
        if n >= at_least || Instant::now() >= deadline {
            return n;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Sleeps until `at` (returns at once when it has passed).
pub async fn sleep_until(at: Instant) {
    tokio::time::sleep_until(at).await;
}

/// The first check of a replica runs when its `run` starts (its `ready` stamp) and the next ones
/// every `interval` after: the first check time after `after`.
pub fn next_check(ready: Instant, interval: Duration, after: Instant) -> Instant {
    let elapsed = after.saturating_duration_since(ready);
    let k = elapsed.as_nanos() / interval.as_nanos() + 1;
    ready + interval * u32::try_from(k).expect("few intervals")
}

/// The `ready` stamp of a replica.
pub fn ready_at(replica: &ReplicaProcess) -> Instant {
    replica
        .events("ready")
        .first()
        .expect("a started replica printed ready")
        .at
}

/// Asserts `value <= bound` with a message naming what was measured.
#[track_caller]
pub fn assert_within(what: &str, value: Duration, bound: Duration) {
    assert!(value <= bound, "{what}: {value:?} exceeds {bound:?}");
    println!("{what}: {value:?} (bound {bound:?})");
}
