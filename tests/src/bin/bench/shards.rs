//! `bench shards`: the sharded-leadership benchmark; prints tables, asserts nothing.
//!
//! ```text
//! cargo run --release -p plexsphere-leader-tests --bin bench -- shards \
//!     [--mechanism advisory|lease] [--shards 1024] [--replicas 8] [--check-interval 1s] \
//!     [--rounds 3] [--cost-seconds 30] [--only cost|changes|sigkill]
//! ```
//!
//! Replicas are OS processes: this binary re-run as `bench replica --shards K …`
//! (`plexsphere_leader_tests::replica_child`), one `ShardedElector` each, printing every shard
//! term's begin and end with a `CLOCK_MONOTONIC` stamp, so that every figure comes from one
//! merged timeline. Each section runs on a throwaway cluster (`Cluster`), one database per
//! round. `--mechanism` says what the replicas hold: advisory locks (the default) or lease
//! rows (`ShardConfig::lease`, TTL 3·I), whose tables each database gets first; the server's
//! view that the records are checked against is then the lease survey instead of `pg_locks`.
//!
//! 1. **Cost** (`cost`), advisory: `R` sharded replicas against the same work done by `K` single
//!    `Elector`s (one per key `(class, s)`, `K/R` per process, each with its own pool,
//!    connected before they start, their starts spread over one interval), and by `K/4` of
//!    them, on one cluster whose `max_connections` is raised for the single elections; and the sharded
//!    replicas once more on a cluster with the template's `max_connections` (60), since every
//!    read of `pg_locks` walks every backend slot. Over a steady window: the cluster's CPU
//!    (postmaster and backends, `/proc`) per interval, the replica processes' CPU per check
//!    and per interval and process, WAL bytes per interval, transactions per replica per
//!    interval, sessions, lock sessions, memory of the replicas and of the backends. With the
//!    lease: the lease space at `K` and at a smaller `K` (1,024, or `K/16` when `K` ≤ 1,024)
//!    with the same `R`, beside the advisory space at the largest `K` the same cluster holds;
//!    no single elections (`K` of them need `K` sessions).
//! 2. **Membership changes** (`changes`): per round, a start of `R` at once, a join, a
//!    graceful leave (SIGTERM) and a SIGKILL: the time until the space is balanced (every live
//!    replica owns `⌊K/R⌋` or `⌈K/R⌉`, every shard owned once) and stays so, and the shards
//!    that changed owner.
//! 3. **SIGKILL** (`sigkill`): per round, from the SIGKILL of one of `R` balanced replicas
//!    (started `I/R` apart, so that their surveys fall at different phases) to the last of its
//!    shards owned again, against `I +` the measured grant time of one take statement of `K/R`
//!    shards (with the lease `TTL + I +` one lease take's round trip); then a replacement joins.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use clap::ValueEnum;
use plexsphere_leader::lease::DEFAULT_SCHEMA;
use plexsphere_leader::shard_sql::{self, lease};
use plexsphere_leader::sharded::{DEFAULT_SHARD_CLASS, LockTableTooSmall, Shard};
use plexsphere_leader_core::LEASE_TTL_INTERVALS;
use plexsphere_leader_tests::replica_child::DEFAULT_POOL_SIZE;
use plexsphere_leader_tests::replica_process::dsn;
use plexsphere_leader_tests::replica_process::shards::{self as fleet, ShardEvent};
use plexsphere_leader_tests::{
    ChildArgs, Cluster, CpuSample, Launcher, Mechanism, ReplicaProcess, StopMode, TestDb, procfs,
};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_postgres::Client;

use crate::common::{
    BoxError, duration, fine_ms, median, ms, percentile, print_machine, random_phase, seconds,
};

/// The class id of the single elections' keys `(SINGLE_CLASS, s)`: "plsi".
const SINGLE_CLASS: i32 = 0x706c_7369;
/// A class id of no election, for the harness's own take statements: "plsx".
const SCRATCH_CLASS: i32 = 0x706c_7378;
/// The longest any one wait for a balanced space may take, at the least (see
/// [`Options::settle_timeout`]).
const SETTLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Samples of a statement's round trip.
const STATEMENT_SAMPLES: usize = 10;
/// Sessions the harness may hold on a cluster besides the replicas' pools (its admin
/// sessions, the statement samples, the cost's counters), in the connections a cluster needs.
const HARNESS_SESSIONS: usize = 10;
/// The largest space whose cost the lease compares with `K` (the smaller `K`, when `K` is
/// larger); a smaller `K` is compared with `K/16`.
const LEASE_SMALL_SPACE: u32 = 1024;

/// The command line of `bench shards`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct Options {
    /// Shards K of the space.
    #[arg(long, default_value_t = 1024)]
    shards: u32,
    /// Sharded replica processes R (at least 2, at most K).
    #[arg(long, default_value_t = 8)]
    replicas: usize,
    /// The check interval I.
    #[arg(long = "check-interval", value_name = "DURATION")]
    #[arg(default_value = "1s", value_parser = duration)]
    interval: Duration,
    /// Rounds of the membership changes and of SIGKILL.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// The cost table's steady window, in seconds.
    #[arg(long = "cost-seconds", value_name = "SECONDS")]
    #[arg(default_value = "30", value_parser = seconds)]
    cost_window: Duration,
    /// Run only this section (default: all).
    #[arg(long, value_enum)]
    only: Option<Section>,
    /// What the sharded replicas hold: advisory locks, or lease rows (TTL 3·I).
    #[arg(
        long,
        value_enum,
        value_name = "advisory|lease",
        default_value = "advisory"
    )]
    mechanism: Mechanism,
}

/// The sections of `bench shards`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Section {
    Cost,
    Changes,
    Sigkill,
}

impl Options {
    /// What clap cannot say alone: at least 2 replicas and a shard per replica.
    pub(crate) fn check(&self) -> Result<(), String> {
        if self.replicas < 2 || self.shards < self.replicas as u32 {
            return Err("need at least 2 replicas and a shard per replica".into());
        }
        Ok(())
    }

    fn runs(&self, section: Section) -> bool {
        self.only.is_none_or(|only| only == section)
    }

    /// `K/R`, rounded down: the share of one replica, and the size of the measured take.
    fn share(&self) -> u32 {
        self.shards / self.replicas as u32
    }

    /// The space of the command line.
    fn space(&self) -> Space {
        Space {
            mechanism: self.mechanism,
            shards: self.shards,
        }
    }

    /// The connections the replicas may open: a pool for each of `R + 1` (a join), and the
    /// harness's.
    fn connections(&self) -> u64 {
        ((self.replicas + 1) * DEFAULT_POOL_SIZE + HARNESS_SESSIONS) as u64
    }

    /// The longest wait for a balanced space: [`SETTLE_TIMEOUT`] or 30 intervals, whichever is
    /// longer, and a second more per replica process (64 processes starting at once on two
    /// cores register, survey and take one after the other).
    fn settle_timeout(&self) -> Duration {
        SETTLE_TIMEOUT.max(30 * self.interval) + Duration::from_secs(self.replicas as u64)
    }

    /// From a SIGKILL to the survivors' take of the dead replica's shards, before the take's
    /// own time, and its formula: with advisory locks the survivors' next survey (`I`); with
    /// leases, its lease's expiry and then the survivors' next renewal (`TTL + I`).
    fn reowned_within(&self) -> (Duration, String) {
        match self.mechanism {
            Mechanism::Advisory => (self.interval, "I".into()),
            Mechanism::Lease => (
                (LEASE_TTL_INTERVALS + 1) * self.interval,
                format!("TTL + I = {}·I", LEASE_TTL_INTERVALS + 1),
            ),
        }
    }
}

/// A shard space: what its replicas hold, and how many shards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Space {
    mechanism: Mechanism,
    shards: u32,
}

impl Space {
    /// A new database of `cluster` for this space: with leases, its tables created
    /// ([`lease::setup`] in [`DEFAULT_SCHEMA`]).
    async fn database(self, cluster: &Cluster, name: &str) -> Result<TestDb, BoxError> {
        let db = TestDb::create_on(cluster.config("postgres"), name).await?;
        if self.mechanism == Mechanism::Lease {
            db.admin()
                .batch_execute(&lease::setup(DEFAULT_SCHEMA))
                .await?;
        }
        Ok(db)
    }

    /// The advisory locks the space holds with `replicas` members: each shard and each
    /// member's, and the harness's take of one more; none with leases.
    fn locks(self, replicas: usize) -> u64 {
        match self.mechanism {
            Mechanism::Advisory => u64::from(self.shards) + replicas as u64 + 1,
            Mechanism::Lease => 0,
        }
    }

    /// The survey statement of the space (from a session that is no member).
    fn survey(self) -> String {
        match self.mechanism {
            Mechanism::Advisory => shard_sql::survey(
                DEFAULT_SHARD_CLASS,
                self.shards,
                plexsphere_leader::rank::FloorStep::Off,
            ),
            Mechanism::Lease => lease::survey(
                DEFAULT_SCHEMA,
                DEFAULT_SHARD_CLASS,
                self.shards,
                plexsphere_leader::rank::FloorStep::Off,
            ),
        }
    }

    fn held(self) -> &'static str {
        match self.mechanism {
            Mechanism::Advisory => "advisory locks",
            Mechanism::Lease => "leases",
        }
    }
}

pub(crate) async fn run(options: Options) -> Result<(), BoxError> {
    print_machine("plexsphere-leader sharded leadership benchmark").await?;
    println!(
        "K = {} shards held by {}, R = {} replicas, I = {:?}, {} rounds, cost window {:?}",
        options.shards,
        options.space().held(),
        options.replicas,
        options.interval,
        options.rounds,
        options.cost_window
    );
    if options.runs(Section::Cost) {
        cost(&options).await?;
    }
    if options.runs(Section::Changes) || options.runs(Section::Sigkill) {
        let cluster = sharded_cluster(&options).await?;
        if options.runs(Section::Changes) {
            changes(&options, &cluster).await?;
        }
        if options.runs(Section::Sigkill) {
            sigkill(&options, &cluster).await?;
        }
    }
    Ok(())
}

/// A throwaway cluster that holds the deployment of `options`: the template's (60 connections
/// × 64 locks = 3,840 lock slots) unless
/// - the pools of `R + 1` replica processes and the harness's sessions
///   ([`Options::connections`]) need more connections: then `max_connections` is raised to
///   that;
/// - the advisory space's `K + R` locks (and the harness's one) need more than half of the lock
///   table, the most the advisory sharded mode accepts ([`LockTableTooSmall::usable`]): then
///   `max_locks_per_transaction` is raised to hold twice that (without it, every replica of
///   K = 2,048 refused to join, and the harness saw no term at all);
///
/// and then the cluster is restarted once.
async fn sharded_cluster(options: &Options) -> Result<Cluster, BoxError> {
    let cluster = Cluster::start().await?;
    let admin = cluster.connect("postgres").await?;
    let template = Capacity::read(&admin).await?;
    let wanted = template.holding(
        options.connections(),
        options.space().locks(options.replicas),
    );
    if wanted == template {
        return Ok(cluster);
    }
    let mut raised = Vec::new();
    for (setting, from, to) in [
        ("max_connections", template.connections, wanted.connections),
        (
            "max_locks_per_transaction",
            template.per_transaction,
            wanted.per_transaction,
        ),
    ] {
        if to != from {
            admin
                .batch_execute(&format!("ALTER SYSTEM SET {setting} = {to}"))
                .await?;
            raised.push(format!("{setting} raised to {to}"));
        }
    }
    drop(admin);
    cluster.restart(StopMode::Fast).await?;
    println!(
        "(throwaway cluster: {}; the deployment may open {} connections and hold {} advisory \
         locks)",
        raised.join(", "),
        options.connections(),
        options.space().locks(options.replicas)
    );
    Ok(cluster)
}

/// A cluster's connections and lock table, as configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Capacity {
    connections: u64,
    per_transaction: u64,
    prepared: u64,
}

impl Capacity {
    async fn read(admin: &Client) -> Result<Self, BoxError> {
        let row = admin
            .query_one(
                "SELECT current_setting('max_connections')::int8, \
                 current_setting('max_locks_per_transaction')::int8, \
                 current_setting('max_prepared_transactions')::int8",
                &[],
            )
            .await?;
        Ok(Self {
            connections: u64::try_from(row.get::<_, i64>(0))?,
            per_transaction: u64::try_from(row.get::<_, i64>(1))?,
            prepared: u64::try_from(row.get::<_, i64>(2))?,
        })
    }

    /// The locks the advisory sharded mode may hold: half the lock table.
    fn usable_locks(self) -> u64 {
        LockTableTooSmall::usable(self.per_transaction * (self.connections + self.prepared))
    }

    /// This capacity, raised where it holds fewer than `connections` or than `locks`.
    fn holding(self, connections: u64, locks: u64) -> Self {
        let mut wanted = Self {
            connections: self.connections.max(connections),
            ..self
        };
        if locks > wanted.usable_locks() {
            wanted.per_transaction = (2 * locks).div_ceil(wanted.connections);
        }
        wanted
    }

    /// The largest advisory space of at most `k` shards that `replicas` members may hold.
    fn largest_advisory_space(self, k: u32, replicas: usize) -> u32 {
        let room = self.usable_locks().saturating_sub(replicas as u64 + 1);
        u32::try_from(room).unwrap_or(u32::MAX).min(k)
    }
}

// ---------------------------------------------------------------------------------------------
// Replica processes

fn launcher() -> Result<Launcher, BoxError> {
    let me = std::env::current_exe()?;
    Ok(Launcher::with_prefix(me, &["replica"]))
}

/// The replica processes of one database, and the space they share.
struct Deployment {
    launcher: Launcher,
    dsn: String,
    space: Space,
    interval: Duration,
    settle_timeout: Duration,
    processes: Vec<ReplicaProcess>,
    /// The number the next replica's name gets.
    next: usize,
}

impl Deployment {
    fn new(dsn: String, options: &Options, space: Space) -> Result<Self, BoxError> {
        Ok(Self {
            launcher: launcher()?,
            dsn,
            space,
            interval: options.interval,
            settle_timeout: options.settle_timeout(),
            processes: Vec::new(),
            next: 0,
        })
    }

    fn sharded_args(&mut self) -> ChildArgs {
        let name = format!("plx-shard-{:02}", self.next);
        self.next += 1;
        ChildArgs {
            mechanism: self.space.mechanism,
            ..ChildArgs::sharded(name, self.dsn.clone(), self.interval, self.space.shards)
        }
    }

    /// Starts every replica of `args` at once; returns when all printed `ready`.
    async fn spawn_all(&mut self, args: Vec<ChildArgs>) -> Result<(), BoxError> {
        let mut set = JoinSet::new();
        for (i, args) in args.into_iter().enumerate() {
            let launcher = self.launcher.clone();
            set.spawn(async move { (i, launcher.spawn(args).await) });
        }
        let mut started = Vec::new();
        while let Some(joined) = set.join_next().await {
            let (i, process) = joined?;
            started.push((i, process?));
        }
        started.sort_by_key(|(i, _)| *i);
        self.processes.extend(started.into_iter().map(|(_, p)| p));
        Ok(())
    }

    /// Starts `n` sharded replicas at once.
    async fn spawn_sharded(&mut self, n: usize) -> Result<(), BoxError> {
        let args = (0..n).map(|_| self.sharded_args()).collect();
        self.spawn_all(args).await
    }

    /// The names of the replicas still running.
    fn live(&self) -> Vec<String> {
        self.processes
            .iter()
            .filter(|p| !p.exited())
            .map(|p| p.name().to_owned())
            .collect()
    }

    fn events(&self) -> Vec<ShardEvent> {
        let refs: Vec<&ReplicaProcess> = self.processes.iter().collect();
        fleet::shard_events(&refs)
    }

    /// Waits until the live replicas' ownership is balanced and no term began or ended for two
    /// intervals; returns the instant it last became balanced (at or after `from`).
    async fn settle(&self, from: Instant) -> Result<Instant, BoxError> {
        let deadline = Instant::now() + self.settle_timeout;
        let quiet = 2 * self.interval;
        let k = self.space.shards;
        loop {
            let now = Instant::now();
            let events = self.events();
            let last = events.last().map_or(from, |e| e.at);
            if now.saturating_duration_since(last) >= quiet
                && let Some(at) = fleet::settled_at(&events, &self.live(), k, from, now)
            {
                return Ok(at);
            }
            if now >= deadline {
                let owned = fleet::owned_at(&events, now);
                let counts: Vec<(String, usize)> =
                    owned.iter().map(|(n, s)| (n.clone(), s.len())).collect();
                return Err(format!(
                    "not balanced within {:?}: {counts:?}, live {:?}",
                    self.settle_timeout,
                    self.live()
                )
                .into());
            }
            tokio::time::sleep(self.poll()).await;
        }
    }

    /// How often a wait re-reads the merged records: every 20 ms per 1,024 shards begun, since
    /// each reading clones and sorts every record (at K = 16,384, on two cores shared with 64
    /// replicas and the server). The figures come from the records' stamps, not from when the
    /// harness looked.
    fn poll(&self) -> Duration {
        Duration::from_millis(20) * self.space.shards.div_ceil(1024).max(1)
    }

    fn find(&self, name: &str) -> Option<usize> {
        self.processes.iter().position(|p| p.name() == name)
    }

    /// Graceful stop of every replica still running; the errors their runs reported.
    async fn stop_all(&mut self) -> Vec<String> {
        let mut errors = Vec::new();
        for p in &mut self.processes {
            if p.exited() {
                continue;
            }
            match p.stop().await.map(|report| report.run_error) {
                Ok(None) => {}
                Ok(Some(run)) => errors.push(format!("{}: {run}", p.name())),
                Err(e) => errors.push(format!("{}: {e}", p.name())),
            }
        }
        errors
    }
}

/// Whether the server shows every shard of the space held by the live replicas, in the shares
/// their own records show, with one member lock (or live member row) each.
async fn server_agrees(client: &Client, deployment: &Deployment) -> Result<bool, BoxError> {
    let Space { mechanism, shards } = deployment.space;
    let rows = fleet::owners(client, mechanism, DEFAULT_SHARD_CLASS, shards).await?;
    let believed = fleet::owned_at(&deployment.events(), Instant::now());
    let live = deployment.live();
    let mut matched = 0;
    for row in &rows {
        let Some(name) = row.name.as_deref() else {
            return Ok(false);
        };
        let shards: BTreeSet<u32> = row.shards.iter().map(|s| s.get()).collect();
        if !row.member || !live.iter().any(|l| l == name) || believed.get(name) != Some(&shards) {
            return Ok(false);
        }
        matched += 1;
    }
    Ok(matched == live.len())
}

// ---------------------------------------------------------------------------------------------
// Statements: the grant time of a take, the survey's round trip

/// Round trips of `statement` on a fresh session of `db`, each followed by `cleanup`:
/// `STATEMENT_SAMPLES` samples, sorted.
async fn round_trips(
    db: &TestDb,
    statement: &str,
    cleanup: Option<&str>,
) -> Result<Vec<Duration>, BoxError> {
    let client = db.connect("plx-harness-statements").await?;
    let mut samples = Vec::with_capacity(STATEMENT_SAMPLES);
    for _ in 0..STATEMENT_SAMPLES {
        let start = Instant::now();
        client.simple_query(statement).await?;
        samples.push(start.elapsed());
        if let Some(cleanup) = cleanup {
            client.simple_query(cleanup).await?;
        }
    }
    samples.sort();
    Ok(samples)
}

/// One take statement of `n` free shards of a class nobody else uses, on `db`, each given back
/// after it: advisory locks then `pg_advisory_unlock_all()`; with leases a lease take by a
/// member of that class registered for it, then the release of the shards.
async fn grant_times(db: &TestDb, options: &Options, n: u32) -> Result<Vec<Duration>, BoxError> {
    let shards: Vec<Shard> = (0..n).map(Shard::new).collect();
    match options.mechanism {
        Mechanism::Advisory => {
            let take = shard_sql::take(SCRATCH_CLASS, &shards);
            round_trips(db, &take, Some(&shard_sql::unlock_all())).await
        }
        Mechanism::Lease => {
            let ttl_ms = u32::try_from(SETTLE_TIMEOUT.as_millis())?;
            let register = lease::register(
                DEFAULT_SCHEMA,
                SCRATCH_CLASS,
                "plx-harness 0",
                ttl_ms,
                plexsphere_leader::rank::FloorStep::Off,
            );
            let rows = plexsphere_leader_tests::simple_rows(db.admin(), &register).await?;
            let member = lease::parse_registered(&rows)?.member;
            let timeout_ms = u32::try_from(options.interval.as_millis())?;
            let take = lease::take(DEFAULT_SCHEMA, SCRATCH_CLASS, member, &shards, timeout_ms);
            let release = lease::release(DEFAULT_SCHEMA, SCRATCH_CLASS, member, &shards);
            round_trips(db, &take, Some(&release)).await
        }
    }
}

/// One survey statement of the space (from a session that is no member).
async fn survey_times(db: &TestDb, space: Space) -> Result<Vec<Duration>, BoxError> {
    round_trips(db, &space.survey(), None).await
}

/// `d` in intervals, to a hundredth.
fn intervals(d: Duration, interval: Duration) -> String {
    format!("{:.2}·I", d.as_secs_f64() / interval.as_secs_f64())
}

// ---------------------------------------------------------------------------------------------
// Cost

/// What one deployment cost over the steady window.
struct Cost {
    what: String,
    /// Shards of the space (keys of the single elections).
    shards: u32,
    processes: usize,
    /// Checks per interval: one survey per sharded replica, one check per single elector.
    checks_per_interval: u64,
    window: Duration,
    intervals: f64,
    server: Duration,
    client: Duration,
    /// WAL the cluster wrote in the window, in bytes.
    wal_bytes: u64,
    /// Transactions committed in the database in the window (the harness's own kept out).
    commits: u64,
    sessions: BTreeMap<String, usize>,
    /// Sessions holding a lock of the space or keys; with leases, live member rows.
    holders: usize,
    rss_kb: Vec<u64>,
    backends: usize,
    backends_anon_kb: u64,
    moves: usize,
    /// Single electors: the pools connected before the electors started, and how long that
    /// took.
    warm: Option<(u64, Duration)>,
    /// Shards owned (leaderships held) at the window's start and end.
    held: (usize, usize),
    /// WARN lines of the electors in the window, and the most frequent message.
    warnings: (usize, Option<String>),
    survey: Option<Vec<Duration>>,
    max_connections: i64,
}

impl Cost {
    fn checks(&self) -> f64 {
        (self.checks_per_interval as f64 * self.intervals).max(1.0)
    }

    fn server_per_interval(&self) -> Duration {
        self.server.div_f64(self.intervals)
    }

    fn wal_per_interval(&self) -> f64 {
        self.wal_bytes as f64 / self.intervals
    }

    fn commits_per_replica(&self) -> f64 {
        self.commits as f64 / self.processes as f64 / self.intervals
    }

    fn rows(&self) -> Vec<(&'static str, String)> {
        let cores = std::thread::available_parallelism().map_or(1, usize::from) as f64;
        let share = self.server.as_secs_f64() / self.window.as_secs_f64();
        let per_process: Vec<usize> = self.sessions.values().copied().collect();
        let rss_max = self.rss_kb.iter().copied().max().unwrap_or(0);
        let rss_mean = self.rss_kb.iter().sum::<u64>() / self.rss_kb.len().max(1) as u64;
        vec![
            (
                "server CPU per interval (postmaster and backends)",
                format!(
                    "**{:.2} ms** ({:.2} % of one core, {:.2} % of the {cores} cores)",
                    self.server.as_secs_f64() * 1e3 / self.intervals,
                    share * 100.0,
                    share / cores * 100.0
                ),
            ),
            (
                "server CPU per check",
                format!("{:.1} µs", self.server.as_secs_f64() * 1e6 / self.checks()),
            ),
            (
                "WAL bytes per interval (pg_current_wal_lsn, whole cluster)",
                format!("**{:.0}**", self.wal_per_interval()),
            ),
            (
                "transactions per replica per interval (pg_stat_database.xact_commit)",
                format!("**{:.2}**", self.commits_per_replica()),
            ),
            (
                "client CPU per check (replica processes)",
                format!(
                    "**{:.1} µs**",
                    self.client.as_secs_f64() * 1e6 / self.checks()
                ),
            ),
            (
                "client CPU per interval per process",
                format!(
                    "{:.2} ms",
                    self.client.as_secs_f64() * 1e3 / self.intervals / self.processes as f64
                ),
            ),
            (
                "client CPU per interval, all processes",
                format!("{:.2} ms", self.client.as_secs_f64() * 1e3 / self.intervals),
            ),
            (
                "checks per interval (one survey or renewal per replica, one check per elector)",
                self.checks_per_interval.to_string(),
            ),
            (
                "sessions per process (pg_stat_activity)",
                format!(
                    "min {}, max {}; {} in all",
                    per_process.iter().min().unwrap_or(&0),
                    per_process.iter().max().unwrap_or(&0),
                    per_process.iter().sum::<usize>()
                ),
            ),
            (
                "sessions holding a lock of the space or keys (leases: live member rows)",
                self.holders.to_string(),
            ),
            (
                "RSS per replica process",
                format!("mean {:.1} MiB, max {:.1} MiB", mib(rss_mean), mib(rss_max)),
            ),
            (
                "backends of the database / their anonymous memory (Pss_Anon)",
                format!("{} / {:.1} MiB", self.backends, mib(self.backends_anon_kb)),
            ),
            (
                "survey statement round trip (harness session), median / max",
                self.survey.as_ref().map_or("—".into(), |s| {
                    format!("{} / {}", fine_ms(median(s)), fine_ms(percentile(s, 100)))
                }),
            ),
            (
                "pools connected before the electors started / in",
                self.warm
                    .map_or("—".into(), |(n, took)| format!("{n} / {took:.1?}")),
            ),
            (
                "shards owned (leaderships held) at the window's start / end",
                format!("{} / {}", self.held.0, self.held.1),
            ),
            (
                "shard terms begun or ended in the window",
                self.moves.to_string(),
            ),
            (
                "WARN lines of the electors in the window (most frequent)",
                match &self.warnings {
                    (0, _) => "0".into(),
                    (n, message) => format!("{n} (`{}`)", message.as_deref().unwrap_or("")),
                },
            ),
            ("cluster max_connections", self.max_connections.to_string()),
        ]
    }
}

fn mib(kb: u64) -> f64 {
    kb as f64 / 1024.0
}

/// The deployments the cost table compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// `R` sharded replicas of this space.
    Sharded(Space),
    /// This many single electors over `R` processes.
    Singles(u32),
}

async fn cost(options: &Options) -> Result<(), BoxError> {
    let columns = match options.mechanism {
        Mechanism::Advisory => advisory_costs(options).await?,
        Mechanism::Lease => lease_costs(options).await?,
    };
    println!(
        "\n## Cost: K = {} shards held by {} over R = {} replica processes, I = {:?}, steady \
         window {:?}\n",
        options.shards,
        options.space().held(),
        options.replicas,
        options.interval,
        options.cost_window
    );
    print_costs(&columns);
    let ratio = |a: f64, b: f64| b / a.max(1e-9);
    let [first, second, ..] = &columns[..] else {
        return Ok(());
    };
    match options.mechanism {
        Mechanism::Advisory => println!(
            "\nSingle elections against sharded, same cluster: server CPU ×{:.1}, client CPU \
             ×{:.1} (per interval, all processes).",
            ratio(
                first.server_per_interval().as_secs_f64(),
                second.server_per_interval().as_secs_f64()
            ),
            ratio(
                first.client.as_secs_f64() / first.intervals,
                second.client.as_secs_f64() / second.intervals
            )
        ),
        Mechanism::Lease => println!(
            "\nThe lease space, K = {} against K = {} (same R = {}), steady state per interval \
             (issue 40's target: within 1.2×): WAL bytes ×{:.2}, server CPU ×{:.2}, \
             transactions per replica ×{:.2}.",
            first.shards,
            second.shards,
            options.replicas,
            ratio(second.wal_per_interval(), first.wal_per_interval()),
            ratio(
                second.server_per_interval().as_secs_f64(),
                first.server_per_interval().as_secs_f64()
            ),
            ratio(second.commits_per_replica(), first.commits_per_replica())
        ),
    }
    Ok(())
}

/// The advisory space against single elections for the same work: sharded, `K` singles and
/// `K/4` singles on one cluster whose `max_connections` is raised for the singles, and the
/// sharded replicas once more on a cluster of the template's `max_connections`.
async fn advisory_costs(options: &Options) -> Result<Vec<Cost>, BoxError> {
    let k = options.shards;
    let big = Cluster::start().await?;
    let admin = big.connect("postgres").await?;
    let max_connections = k as usize * 5 / 4 + 100;
    admin
        .batch_execute(&format!(
            "ALTER SYSTEM SET max_connections = {max_connections}"
        ))
        .await?;
    drop(admin);
    big.restart(StopMode::Fast).await?;
    let space = Kind::Sharded(options.space());
    let sharded = measure(options, &big, space).await?;
    let singles = measure(options, &big, Kind::Singles(k)).await?;
    // A quarter of the keys: single elections where this machine holds them steadily.
    let quarter = measure(options, &big, Kind::Singles(k / 4)).await?;
    drop(big);
    let small = sharded_cluster(options).await?;
    let sharded_small = measure(options, &small, space).await?;
    Ok(vec![sharded, singles, quarter, sharded_small])
}

/// The lease space at `K` and at a smaller `K` with the same `R`, and the advisory space at
/// the largest `K` (at most the command line's) that the same cluster's lock table holds.
async fn lease_costs(options: &Options) -> Result<Vec<Cost>, BoxError> {
    let (k, r) = (options.shards, options.replicas);
    let cluster = sharded_cluster(options).await?;
    let capacity = Capacity::read(&cluster.connect("postgres").await?).await?;
    let large = options.space();
    let small = Space {
        shards: if k > LEASE_SMALL_SPACE {
            LEASE_SMALL_SPACE
        } else {
            (k / 16).max(r as u32)
        },
        ..large
    };
    let advisory = Space {
        mechanism: Mechanism::Advisory,
        shards: capacity.largest_advisory_space(k, r),
    };
    println!(
        "\n(cost: no single elections beside the lease: K = {k} single electors need K sessions \
         and K·5/4 + 100 connections, out of reach at K = 16,384; the smaller lease space has \
         K = {} ({}); the advisory space is the largest of at most K shards that half the lock \
         table of this cluster holds with R + 1 member locks: K = {})",
        small.shards,
        if k > LEASE_SMALL_SPACE {
            "1,024"
        } else {
            "K/16, at least R"
        },
        advisory.shards
    );
    let mut columns = vec![
        measure(options, &cluster, Kind::Sharded(large)).await?,
        measure(options, &cluster, Kind::Sharded(small)).await?,
    ];
    if advisory.shards >= r as u32 {
        columns.push(measure(options, &cluster, Kind::Sharded(advisory)).await?);
    } else {
        println!("(cost: no advisory column: its lock table holds fewer shards than R)");
    }
    Ok(columns)
}

fn print_costs(columns: &[Cost]) {
    println!(
        "| figure | {} |",
        columns
            .iter()
            .map(|c| c.what.as_str())
            .collect::<Vec<_>>()
            .join(" | ")
    );
    println!("|---|{}", "---|".repeat(columns.len()));
    let rows: Vec<Vec<(&str, String)>> = columns.iter().map(Cost::rows).collect();
    for i in 0..rows[0].len() {
        println!(
            "| {} | {} |",
            rows[0][i].0,
            rows.iter()
                .map(|r| r[i].1.clone())
                .collect::<Vec<_>>()
                .join(" | ")
        );
    }
}

/// Runs one deployment on `cluster` until it is steady, then measures it over the window.
async fn measure(options: &Options, cluster: &Cluster, kind: Kind) -> Result<Cost, BoxError> {
    let space = match kind {
        Kind::Sharded(space) => space,
        Kind::Singles(keys) => Space {
            mechanism: Mechanism::Advisory,
            shards: keys,
        },
    };
    let db = space.database(cluster, "shard_cost").await?;
    // The counters are read from another database, so that the harness's own queries do not
    // count among the deployment's transactions.
    let counters = cluster.connect("postgres").await?;
    let max_connections: i64 = counters
        .query_one("SELECT current_setting('max_connections')::int8", &[])
        .await?
        .get(0);
    let mut deployment = Deployment::new(dsn(&db.config()), options, space)?;
    let r = options.replicas;
    let mut warm = None;
    let class = match kind {
        Kind::Sharded(_) => {
            deployment.spawn_sharded(r).await?;
            deployment.settle(Instant::now()).await?;
            DEFAULT_SHARD_CLASS
        }
        Kind::Singles(keys) => {
            let args = singles_args(&deployment, options, keys);
            let spawned = Instant::now();
            deployment.spawn_all(args).await?;
            let connected: u64 = deployment
                .processes
                .iter()
                .filter_map(|p| p.events("warmed").first()?.u64("connected"))
                .sum();
            warm = Some((connected, spawned.elapsed()));
            for p in &mut deployment.processes {
                p.command("go").await?;
            }
            if let Err(e) = wait_all_lead(&deployment).await {
                eprintln!("cost: measuring anyway: {e}");
            }
            SINGLE_CLASS
        }
    };
    // A few intervals of steady state before the window.
    tokio::time::sleep(2 * options.interval).await;
    let before = Snapshot::take(&mut deployment, cluster, &counters, db.name()).await?;
    tokio::time::sleep(options.cost_window).await;
    let after = Snapshot::take(&mut deployment, cluster, &counters, db.name()).await?;
    let owned = |at| -> usize {
        fleet::owned_at(&deployment.events(), at)
            .values()
            .map(BTreeSet::len)
            .sum()
    };
    let held = (owned(before.at), owned(after.at));
    let window = after.at - before.at;
    let sessions = sessions_by_process(&db, &deployment).await?;
    let holders = holders(&db, space.mechanism, class, space.shards).await?;
    let backends = backend_pids(&db).await?;
    let backends_anon_kb = procfs::anonymous_kb(&backends);
    let moves = deployment
        .events()
        .iter()
        .filter(|e| e.at > before.at && e.at <= after.at)
        .count();
    let warnings = warnings_between(&deployment, before.at, after.at);
    let survey = match kind {
        Kind::Sharded(space) => Some(survey_times(&db, space).await?),
        Kind::Singles(_) => None,
    };
    let errors = deployment.stop_all().await;
    if !errors.is_empty() {
        eprintln!("cost: runs ended with errors: {errors:?}");
    }
    db.cleanup().await?;
    let client = after
        .cpu
        .iter()
        .zip(&before.cpu)
        .map(|(a, b)| a.cpu.saturating_sub(b.cpu))
        .sum();
    let what = match kind {
        Kind::Sharded(space) => format!(
            "sharded, {}, K = {}: {r} `ShardedElector`s",
            space.held(),
            space.shards
        ),
        Kind::Singles(keys) => format!(
            "single elections: {keys} `Elector`s, {} per process",
            keys / r as u32
        ),
    };
    Ok(Cost {
        what: format!("{what} (max_connections {max_connections})"),
        shards: space.shards,
        processes: r,
        checks_per_interval: match kind {
            Kind::Sharded(_) => r as u64,
            Kind::Singles(keys) => u64::from(keys),
        },
        window,
        intervals: window.as_secs_f64() / options.interval.as_secs_f64(),
        server: after.server.saturating_sub(before.server),
        client,
        wal_bytes: after.wal_bytes.saturating_sub(before.wal_bytes),
        commits: after.commits.saturating_sub(before.commits),
        sessions,
        holders,
        rss_kb: after.cpu.iter().map(|c| c.rss_kb).collect(),
        backends: backends.len(),
        backends_anon_kb,
        moves,
        held,
        warm,
        warnings,
        survey,
        max_connections,
    })
}

/// The electors' WARN lines stamped in `(from, to]`, and the most frequent message (its text up
/// to the first digit, so that durations and pids do not split it).
fn warnings_between(
    deployment: &Deployment,
    from: Instant,
    to: Instant,
) -> (usize, Option<String>) {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for p in &deployment.processes {
        for r in p.logs("WARN", "") {
            if r.at > from && r.at <= to {
                let message = r.str("message").unwrap_or_default();
                let head = message
                    .split(|c: char| c.is_ascii_digit())
                    .next()
                    .unwrap_or_default();
                *counts.entry(head.trim().to_owned()).or_default() += 1;
            }
        }
    }
    let total = counts.values().sum();
    let top = counts.into_iter().max_by_key(|(_, n)| *n).map(|(m, _)| m);
    (total, top)
}

/// `R` processes of single electors for `k` keys, process `i` running keys
/// `(SINGLE_CLASS, s)` for its `k/R` of them.
fn singles_args(deployment: &Deployment, options: &Options, k: u32) -> Vec<ChildArgs> {
    let r = options.replicas as u32;
    (0..r)
        .map(|i| ChildArgs {
            class: SINGLE_CLASS,
            singles: Some(i * k / r..(i + 1) * k / r),
            ..ChildArgs::sharded(
                format!("plx-single-{i:02}"),
                deployment.dsn.clone(),
                options.interval,
                k,
            )
        })
        .collect()
}

/// Waits until every single elector leads its key and nothing changed for two intervals.
async fn wait_all_lead(deployment: &Deployment) -> Result<(), BoxError> {
    let deadline = Instant::now() + SETTLE_TIMEOUT;
    loop {
        let all = deployment.processes.iter().all(|p| {
            let range = p.args().singles.clone().unwrap_or(0..0);
            p.owned().len() == range.len()
        });
        let quiet = deployment
            .events()
            .last()
            .is_none_or(|e| e.at.elapsed() >= 2 * deployment.interval);
        if all && quiet {
            return Ok(());
        }
        if Instant::now() >= deadline {
            let owned: Vec<usize> = deployment
                .processes
                .iter()
                .map(|p| p.owned().len())
                .collect();
            let (warned, top) = warnings_between(deployment, deadline - SETTLE_TIMEOUT, deadline);
            return Err(format!(
                "not every single elector led within {SETTLE_TIMEOUT:?}: leading per process \
                 {owned:?}; {warned} WARN lines, most often {top:?}"
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The counters at one instant.
struct Snapshot {
    at: Instant,
    server: Duration,
    /// The cluster's WAL position, in bytes from `0/0`.
    wal_bytes: u64,
    /// `pg_stat_database.xact_commit` of the deployment's database.
    commits: u64,
    cpu: Vec<CpuSample>,
}

impl Snapshot {
    /// The counters now; the server's through `counters`, a session of another database than
    /// `datname`, the deployment's.
    async fn take(
        deployment: &mut Deployment,
        cluster: &Cluster,
        counters: &Client,
        datname: &str,
    ) -> Result<Self, BoxError> {
        let at = Instant::now();
        let server = procfs::cluster_cpu(cluster);
        let row = counters
            .query_one(
                "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::int8, \
                 (SELECT xact_commit FROM pg_stat_database WHERE datname = $1)",
                &[&datname],
            )
            .await?;
        let mut cpu = Vec::new();
        for p in &mut deployment.processes {
            cpu.push(p.cpu().await?);
        }
        Ok(Self {
            at,
            server,
            wal_bytes: u64::try_from(row.get::<_, i64>(0))?,
            commits: u64::try_from(row.get::<_, i64>(1))?,
            cpu,
        })
    }
}

/// Sessions of the database per replica process (by `application_name`: its name, or its name
/// and ` since …` on a single elector's lock session).
async fn sessions_by_process(
    db: &TestDb,
    deployment: &Deployment,
) -> Result<BTreeMap<String, usize>, BoxError> {
    let rows = db
        .admin()
        .query(
            "SELECT coalesce(application_name, '') FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid()",
            &[],
        )
        .await?;
    let mut sessions: BTreeMap<String, usize> = deployment
        .processes
        .iter()
        .map(|p| (p.name().to_owned(), 0))
        .collect();
    for row in rows {
        let app: String = row.get(0);
        let name = app.split(' ').next().unwrap_or_default();
        if let Some(n) = sessions.get_mut(name) {
            *n += 1;
        }
    }
    Ok(sessions)
}

/// Backends holding an advisory lock of `class` in the database; with leases, the live member
/// rows of the space `class` of `shards`.
async fn holders(
    db: &TestDb,
    mechanism: Mechanism,
    class: i32,
    shards: u32,
) -> Result<usize, BoxError> {
    if mechanism == Mechanism::Lease {
        return Ok(fleet::owners(db.admin(), mechanism, class, shards)
            .await?
            .len());
    }
    let n: i64 = db
        .admin()
        .query_one(
            "SELECT count(DISTINCT pid) FROM pg_locks WHERE locktype = 'advisory' AND granted \
             AND classid = ($1::int8 & 4294967295)::oid AND objsubid = 2 \
             AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            &[&i64::from(class)],
        )
        .await?
        .get(0);
    Ok(usize::try_from(n).unwrap_or(0))
}

/// The backend pids of the database's sessions (the harness's own included).
async fn backend_pids(db: &TestDb) -> Result<Vec<u32>, BoxError> {
    let rows = db
        .admin()
        .query(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()",
            &[],
        )
        .await?;
    Ok(rows
        .iter()
        .filter_map(|r| u32::try_from(r.get::<_, i32>(0)).ok())
        .collect())
}

// ---------------------------------------------------------------------------------------------
// Membership changes

/// What one membership change measured.
#[derive(Debug, Clone, Copy)]
struct Change {
    /// From the change (the harness's command) to the instant the space last became balanced.
    balanced: Duration,
    /// The same from the instant the change took effect (the joiner's membership), when it
    /// differs.
    from_effect: Option<Duration>,
    /// Shard terms begun between the change and the balance.
    moves: usize,
    /// Shards whose owner differs between before and after.
    net: usize,
    /// The membership whose share bounds the moves.
    r: usize,
    /// The server (`pg_locks`, or the lease survey) showed the children's shares once balanced.
    agrees: bool,
}

/// The four changes of a round, in table order.
const CHANGES: [&str; 4] = [
    "start of R at once",
    "a join (R + 1)",
    "a graceful leave (SIGTERM)",
    "SIGKILL of one replica",
];

async fn changes(options: &Options, cluster: &Cluster) -> Result<(), BoxError> {
    let mut samples: Vec<Vec<Change>> = vec![Vec::new(); CHANGES.len()];
    let mut overlaps = Vec::new();
    let mut failures = Vec::new();
    for round in 0..options.rounds {
        match change_round(options, cluster).await {
            Ok((changes, overlap)) => {
                for (i, change) in changes.into_iter().enumerate() {
                    samples[i].push(change);
                }
                overlaps.push(overlap);
            }
            Err(e) => failures.push(format!("round {round}: {e}")),
        }
    }
    print_changes(options, &samples, &overlaps);
    for failure in failures {
        eprintln!("changes: a round failed: {failure}");
    }
    Ok(())
}

/// One round: a start of `R`, a join, a graceful leave, a SIGKILL; the longest per-shard
/// overlap of believed owners over the round.
async fn change_round(
    options: &Options,
    cluster: &Cluster,
) -> Result<(Vec<Change>, Option<(Duration, u32)>), BoxError> {
    let db = options.space().database(cluster, "shard_changes").await?;
    let mut d = Deployment::new(dsn(&db.config()), options, options.space())?;
    let (k, r) = (options.shards, options.replicas);
    let mut out = Vec::new();

    let start = Instant::now();
    d.spawn_sharded(r).await?;
    let settled = d.settle(start).await?;
    out.push(Change {
        balanced: settled - start,
        from_effect: None,
        moves: fleet::begins_between(&d.events(), start, settled),
        net: k as usize,
        r,
        agrees: server_agrees(db.admin(), &d).await?,
    });

    random_phase(options.interval).await;
    let join = Instant::now();
    d.spawn_sharded(1).await?;
    let joiner = d.processes.last().ok_or("no joiner")?;
    let joined = joiner
        .wait_for(d.settle_timeout, |rec| {
            rec.event == "member" && rec.fields.get("member").is_some_and(|m| !m.is_null())
        })
        .await
        .ok_or("the joiner never became a member")?
        .at;
    out.push(measure_change(&d, db.admin(), join, Some(joined), r + 1).await?);

    random_phase(options.interval).await;
    let leave = Instant::now();
    d.processes[0].stop().await?;
    out.push(measure_change(&d, db.admin(), leave, None, r + 1).await?);

    random_phase(options.interval).await;
    let killed = d.processes[1].kill().await?;
    out.push(measure_change(&d, db.admin(), killed, None, r).await?);

    let overlap = fleet::max_shard_overlap(&d.events(), Instant::now());
    let errors = d.stop_all().await;
    if !errors.is_empty() {
        eprintln!("changes: runs ended with errors: {errors:?}");
    }
    db.cleanup().await?;
    Ok((out, overlap))
}

async fn measure_change(
    d: &Deployment,
    admin: &Client,
    at: Instant,
    effect: Option<Instant>,
    r: usize,
) -> Result<Change, BoxError> {
    let settled = d.settle(at).await?;
    let events = d.events();
    Ok(Change {
        balanced: settled - at,
        from_effect: effect.map(|e| settled.saturating_duration_since(e)),
        moves: fleet::begins_between(&events, at, settled),
        net: fleet::owners_changed(&events, at, settled),
        r,
        agrees: server_agrees(admin, d).await?,
    })
}

fn print_changes(options: &Options, samples: &[Vec<Change>], overlaps: &[Option<(Duration, u32)>]) {
    let (k, i) = (options.shards, options.interval);
    println!(
        "\n## Membership changes: K = {k}, R = {}, I = {i:?}, {} rounds\n",
        options.replicas, options.rounds
    );
    println!(
        "| change | balanced: bound | median | max | from the joiner's membership: median / max | shards moved: bound | median | max | net owner changes: max | the server agreed (pg_locks, or the lease survey) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for (name, changes) in CHANGES.iter().zip(samples) {
        let times: Vec<Duration> = changes.iter().map(|c| c.balanced).collect();
        let effects: Vec<Duration> = changes.iter().filter_map(|c| c.from_effect).collect();
        let moves: Vec<usize> = changes.iter().map(|c| c.moves).collect();
        let r = changes.first().map_or(options.replicas, |c| c.r);
        let bound_moves = 1.5 * f64::from(k) / r as f64;
        // A killed lease member's shards wait for its lease to expire.
        let balance_bound = match options.mechanism {
            Mechanism::Lease if name.starts_with("SIGKILL") => {
                let (within, formula) = options.reowned_within();
                format!("{formula} = {}", ms(within))
            }
            _ => format!("3·I = {}", ms(3 * i)),
        };
        let move_bound = if name.starts_with("start") {
            format!("— (all {k} taken)")
        } else {
            format!("1.5·K/R = {bound_moves:.0} (R = {r})")
        };
        let mut sorted_moves = moves.clone();
        sorted_moves.sort_unstable();
        println!(
            "| {name} ({} rounds) | {balance_bound} | {} ({}) | {} ({}) | {} | {move_bound} | {} | {} | {} | {} of {} |",
            changes.len(),
            ms(median(&times)),
            intervals(median(&times), i),
            ms(percentile(&times, 100)),
            intervals(percentile(&times, 100), i),
            if effects.is_empty() {
                "—".to_owned()
            } else {
                format!(
                    "{} / {}",
                    ms(median(&effects)),
                    ms(percentile(&effects, 100))
                )
            },
            sorted_moves
                .get(sorted_moves.len() / 2)
                .copied()
                .unwrap_or(0),
            sorted_moves.last().copied().unwrap_or(0),
            changes.iter().map(|c| c.net).max().unwrap_or(0),
            changes.iter().filter(|c| c.agrees).count(),
            changes.len()
        );
    }
    let worst = overlaps.iter().flatten().max();
    println!(
        "\nBalanced: every live replica owns ⌊K/R⌋ or ⌈K/R⌉ shards and every shard is owned \
         once, by the replicas' own begin/end records on one clock, measured from the harness's \
         command (spawn, SIGTERM, SIGKILL) to the instant the space last became balanced (it \
         then stayed so for two quiet intervals). Shards moved: shard terms begun in that span \
         (a shard moved twice counts twice). Two believed owners of one shard at once, longest \
         over all rounds: {}.",
        worst.map_or("never".to_owned(), |(d, s)| format!(
            "{} (shard {s})",
            fine_ms(*d)
        ))
    );
}

// ---------------------------------------------------------------------------------------------
// SIGKILL: every shard of the dead replica re-owned

/// What one SIGKILL round measured.
struct Kill {
    /// From the SIGKILL to the first and to the last of its shards owned again.
    first: Duration,
    last: Duration,
    /// Its shards.
    lost: usize,
    /// Of them, those owned again only after `I +` the round's grant time.
    late: usize,
    /// The grant time of one take of `K/R` free shards, median of the round's samples.
    grant: Duration,
    /// From the SIGKILL to the balance of the survivors.
    balanced: Duration,
}

async fn sigkill(options: &Options, cluster: &Cluster) -> Result<(), BoxError> {
    let db = options.space().database(cluster, "shard_sigkill").await?;
    let mut d = Deployment::new(dsn(&db.config()), options, options.space())?;
    // One by one, `I/R` apart, so that the survivors' surveys fall at different phases of the
    // interval and the last of them comes up to an interval after a kill (replicas started at
    // once survey at nearly the same instants).
    let start = Instant::now();
    for _ in 0..options.replicas {
        d.spawn_sharded(1).await?;
        tokio::time::sleep(options.interval / options.replicas as u32).await;
    }
    d.settle(start).await?;
    let mut kills = Vec::new();
    let mut grants = Vec::new();
    for round in 0..options.rounds {
        match kill_round(options, &db, &mut d, round).await {
            Ok((kill, samples)) => {
                kills.push(kill);
                grants.extend(samples);
            }
            Err(e) => eprintln!("sigkill: round {round} failed: {e}"),
        }
    }
    let overlap = fleet::max_shard_overlap(&d.events(), Instant::now());
    let errors = d.stop_all().await;
    if !errors.is_empty() {
        eprintln!("sigkill: runs ended with errors: {errors:?}");
    }
    db.cleanup().await?;
    print_kills(options, &kills, &grants, overlap);
    Ok(())
}

/// Kills one replica of a balanced space, measures, then starts a replacement and waits for the
/// balance again.
async fn kill_round(
    options: &Options,
    db: &TestDb,
    d: &mut Deployment,
    round: usize,
) -> Result<(Kill, Vec<Duration>), BoxError> {
    let grants = grant_times(db, options, options.share()).await?;
    let live = d.live();
    let victim = d.find(&live[round % live.len()]).ok_or("no such replica")?;
    random_phase(options.interval).await;
    let lost = d.processes[victim].owned();
    let killed = d.processes[victim].kill().await?;
    let reowned = wait_reowned(d, &lost, killed).await?;
    let settled = d.settle(killed).await?;
    let first = reowned.values().min().copied().unwrap_or(killed);
    let last = reowned.values().max().copied().unwrap_or(killed);
    let bound = killed + options.reowned_within().0 + median(&grants);
    let late = reowned.values().filter(|at| **at > bound).count();
    d.spawn_sharded(1).await?;
    d.settle(Instant::now()).await?;
    Ok((
        Kill {
            first: first - killed,
            last: last - killed,
            lost: lost.len(),
            late,
            grant: median(&grants),
            balanced: settled - killed,
        },
        grants,
    ))
}

/// Waits until every shard of `lost` began a term on a live replica after `killed`; the first
/// such begin of each.
async fn wait_reowned(
    d: &Deployment,
    lost: &BTreeSet<u32>,
    killed: Instant,
) -> Result<BTreeMap<u32, Instant>, BoxError> {
    let deadline = Instant::now() + d.settle_timeout;
    loop {
        let live = d.live();
        let mut reowned = BTreeMap::new();
        for e in d.events() {
            if e.began && e.at >= killed && lost.contains(&e.shard) && live.contains(&e.replica) {
                reowned.entry(e.shard).or_insert(e.at);
            }
        }
        if reowned.len() == lost.len() {
            return Ok(reowned);
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "{} of {} shards re-owned within {:?}",
                reowned.len(),
                lost.len(),
                d.settle_timeout
            )
            .into());
        }
        tokio::time::sleep(d.poll()).await;
    }
}

fn print_kills(
    options: &Options,
    kills: &[Kill],
    grants: &[Duration],
    overlap: Option<(Duration, u32)>,
) {
    let (i, share) = (options.interval, options.share());
    let (within, formula) = options.reowned_within();
    let grant = percentile(grants, 100);
    println!(
        "\n## SIGKILL of one of R = {} replicas: its shards owned again (K = {} held by {}, I = {i:?}, {} rounds)\n",
        options.replicas,
        options.shards,
        options.space().held(),
        kills.len()
    );
    let take = match options.mechanism {
        Mechanism::Advisory => "one take statement",
        Mechanism::Lease => "one lease take (by a member of another class, then released)",
    };
    println!(
        "Grant time of {take} of K/R = {share} free shards (a harness session of the same \
         database, {} samples over the rounds): median {}, p99 {}, max {}.\n",
        grants.len(),
        fine_ms(percentile(grants, 50)),
        fine_ms(percentile(grants, 99)),
        fine_ms(grant)
    );
    println!(
        "| round | shards of the killed replica | first re-owned | last re-owned | bound: {formula} + grant (round's median) | re-owned after the bound | survivors balanced |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (n, kill) in kills.iter().enumerate() {
        println!(
            "| {n} | {} | {} | **{}** ({}) | {} | {} | {} ({}) |",
            kill.lost,
            ms(kill.first),
            ms(kill.last),
            intervals(kill.last, i),
            ms(within + kill.grant),
            kill.late,
            ms(kill.balanced),
            intervals(kill.balanced, i)
        );
    }
    let lasts: Vec<Duration> = kills.iter().map(|k| k.last).collect();
    println!(
        "\nLast shard re-owned: median {}, max {}; bound {formula} + max grant time = {}. Two \
         believed owners of one shard at once: {}.",
        ms(median(&lasts)),
        ms(percentile(&lasts, 100)),
        ms(within + grant),
        overlap.map_or("never".to_owned(), |(d, s)| format!(
            "{} (shard {s})",
            fine_ms(d)
        ))
    );
}
