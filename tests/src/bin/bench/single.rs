//! `bench single`: the single election's failover, costs, scale and floor; prints tables,
//! asserts nothing.
//!
//! ```text
//! cargo run --release -p plexsphere-leader-tests --bin bench -- single \
//!     [--check-interval 200ms] [--rounds 5] [--scale-electors 100] [--scale-interval 50ms] \
//!     [--scale-seconds 10] [--only failover|costs|scale|floor] [--acquire poll|queue|both] \
//!     [--faults graceful,sigkill,...] [--explain-over 50ms]
//! ```
//!
//! `--faults` restricts the failover table to the named faults (see [`Fault`]), for runs
//! with many rounds of a few faults. `--explain-over D` prints to stderr, for every round
//! without a leader for longer than D, both replicas' records (terms and log lines) relative
//! to the fault.
//!
//! 1. **Failover**, one row per fault: the bound the design derives and the median, p99 and
//!    maximum over the rounds of (a) the time without a leader, (b) the time until the old
//!    leader knows it lost, (c) the overlap. Replicas are OS processes (this binary re-run as
//!    `bench replica …`, see `plexsphere_leader_tests::replica_child`); times come from one
//!    merged timeline on `CLOCK_MONOTONIC`.
//! 2. **Cost per check**: client CPU time and allocations per standby check and per leader
//!    check (one elector in this process, the binary's counting global allocator), and the
//!    backends opened over 1,000 refused checks.
//! 3. **Scale**: many electors in one database at a short interval: leaders at every instant,
//!    the server's CPU share, checks per second; for a cold start, the time to the first leader
//!    and until every elector had a connection, and what became of the connection setups a
//!    check gave up on (`PoolSessions::late_setups`).
//! 4. **Detection floor**: how soon a bare tokio-postgres connection in this process learns
//!    that `pg_terminate_backend` ended its session (no elector): the part of the failover
//!    table's detection figure no client can shave off.
//!
//! Needs the local PostgreSQL of the test suite (`PLEXSPHERE_TEST_DSN`) and, for the restart,
//! failover and scale runs, the server binaries for throwaway clusters. See
//! `docs/benchmarks.md`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use clap::ValueEnum;
use deadpool_postgres::{Hook, Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use plexsphere_leader::session::{LateSetups, PoolSessions};
use plexsphere_leader::{Config, Elector};
use plexsphere_leader_tests::clock::process_cpu;
use plexsphere_leader_tests::procfs::cluster_cpu;
use plexsphere_leader_tests::replica_process::{
    FOLLOW, LEAD, REPLICA_APP_PREFIX, dsn, lock_holders, wait_clean,
};
use plexsphere_leader_tests::timeline::{self, Span};
use plexsphere_leader_tests::{
    ChildArgs, Cluster, FaultProxy, Launcher, LockObserver, Mode, ReplicaProcess, StopMode, TestDb,
    Timeline,
};
use stats_alloc::Region;
use tokio::time::Instant;
use tokio_postgres::NoTls;
use tokio_util::sync::CancellationToken;

use crate::common::{
    BoxError, duration, fine_ms, ms, percentile, print_machine, random_phase, seconds,
};

/// How long any one wait of a round may take before the round counts as failed.
const ROUND_TIMEOUT: Duration = Duration::from_secs(20);

/// The command line of `bench single`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct Options {
    /// The replicas' check interval I in the failover table.
    #[arg(long = "check-interval", value_name = "DURATION")]
    #[arg(default_value = "200ms", value_parser = duration)]
    interval: Duration,
    /// Rounds per fault (failover) and of the detection floor.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Electors of the scale table.
    #[arg(long, default_value_t = 100)]
    scale_electors: usize,
    /// The check interval of the scale table.
    #[arg(long, value_name = "DURATION")]
    #[arg(default_value = "50ms", value_parser = duration)]
    scale_interval: Duration,
    /// The scale table's steady window, in seconds.
    #[arg(long = "scale-seconds", value_name = "SECONDS")]
    #[arg(default_value = "10", value_parser = seconds)]
    scale_window: Duration,
    /// Run only this section (default: all).
    #[arg(long, value_enum)]
    only: Option<Section>,
    /// The acquire modes of the failover table.
    #[arg(long, value_enum, default_value_t = Acquire::Poll)]
    acquire: Acquire,
    /// The faults of the failover table, comma-separated (default: all), in table order.
    #[arg(long, value_enum, value_delimiter = ',', value_name = "FAULT,...")]
    faults: Vec<Fault>,
    /// Print the replicas' records of every round whose time without a leader exceeds this.
    #[arg(long, value_name = "DURATION", value_parser = duration)]
    explain_over: Option<Duration>,
}

/// The sections of `bench single`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Section {
    Failover,
    Costs,
    Scale,
    Floor,
}

/// `--acquire`: the failover table's modes: the advisory lock polled or queued for, or the
/// lease mechanism.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Acquire {
    /// `AcquireMode::Poll`.
    Poll,
    /// `AcquireMode::Queue`.
    Queue,
    /// Poll, then queue.
    Both,
    /// The lease mechanism (`Config::lease`, default TTL of three intervals).
    Lease,
    /// Poll, queue, then the lease: the three side by side.
    All,
}

/// What the replicas of a failover round hold, and how a standby asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Held {
    Poll,
    Queue,
    Lease,
}

impl Held {
    fn name(self) -> &'static str {
        match self {
            Self::Poll => "AcquireMode::Poll",
            Self::Queue => "AcquireMode::Queue",
            Self::Lease => "lease mechanism, TTL = 3·I",
        }
    }
}

/// How the replicas of a failover round run.
#[derive(Debug, Clone, Copy)]
struct Setup {
    interval: Duration,
    held: Held,
    explain_over: Option<Duration>,
}

impl Options {
    fn runs(&self, section: Section) -> bool {
        self.only.is_none_or(|only| only == section)
    }

    /// The modes of the failover table, in table order.
    fn modes(&self) -> Vec<Held> {
        match self.acquire {
            Acquire::Poll => vec![Held::Poll],
            Acquire::Queue => vec![Held::Queue],
            Acquire::Both => vec![Held::Poll, Held::Queue],
            Acquire::Lease => vec![Held::Lease],
            Acquire::All => vec![Held::Poll, Held::Queue, Held::Lease],
        }
    }

    /// The faults of the failover table, in table order.
    fn faults(&self) -> Vec<Fault> {
        Fault::ALL
            .into_iter()
            .filter(|f| self.faults.is_empty() || self.faults.contains(f))
            .collect()
    }
}

pub(crate) async fn run(options: Options) -> Result<(), BoxError> {
    print_machine("plexsphere-leader failover benchmark").await?;
    println!(
        "check interval I = {:?}, {} rounds per fault; scale: {} electors at {:?} for {:?}",
        options.interval,
        options.rounds,
        options.scale_electors,
        options.scale_interval,
        options.scale_window
    );
    if options.runs(Section::Failover) {
        failover_table(&options).await?;
    }
    if options.runs(Section::Costs) {
        costs(&options).await?;
    }
    if options.runs(Section::Scale) {
        scale(&options).await?;
    }
    if options.runs(Section::Floor) {
        detection_floor(&options).await?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Detection floor

/// How fast any client can learn that `pg_terminate_backend` ended its session: a bare
/// tokio-postgres connection holding the lock in this process, no elector, no pool. The stamp
/// is taken as in the `terminate-direct` fault (before the admin session sends the statement);
/// the end is the connection future resolving. What the elector's figure (b) adds to this is
/// its own path.
async fn detection_floor(options: &Options) -> Result<(), BoxError> {
    let db = TestDb::create("bench_floor").await?;
    let key = plexsphere_leader::LockKey::DEFAULT;
    let mut ends = Vec::with_capacity(options.rounds);
    for _ in 0..options.rounds {
        let (client, connection) = db.config().connect(NoTls).await?;
        let ended = tokio::spawn(async move {
            let _closed = connection.await;
            Instant::now()
        });
        client
            .batch_execute(&format!(
                "SELECT pg_advisory_lock({}, {})",
                key.class_id, key.obj_id
            ))
            .await?;
        let pid: i32 = client
            .query_one("SELECT pg_backend_pid()", &[])
            .await?
            .get(0);
        let at = Instant::now();
        db.terminate(pid).await?;
        let end = tokio::time::timeout(ROUND_TIMEOUT, ended).await??;
        ends.push(end - at);
        drop(client);
    }
    db.cleanup().await?;
    println!(
        "\n## Detection floor ({} rounds)\n\n\
         | path | fault → session end known: median | p99 | max |\n|---|---|---|---|",
        options.rounds
    );
    println!(
        "| bare tokio-postgres connection, `pg_terminate_backend` | {} | {} | {} |",
        fine_ms(percentile(&ends, 50)),
        fine_ms(percentile(&ends, 99)),
        fine_ms(percentile(&ends, 100))
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Failover

/// The faults of the failover table; `--faults` names them in kebab case (`silent-death`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Fault {
    Graceful,
    Sigkill,
    SilentDeath,
    Partition,
    Terminate,
    /// `pg_terminate_backend` with the leader connected straight to the server (no harness
    /// proxy on its path): the detection figure without the proxy's forwarding hop.
    TerminateDirect,
    DropServerToClient,
    DropClientToServer,
    RestartFast,
    RestartImmediate,
    Failover,
}

impl Fault {
    const ALL: [Self; 11] = [
        Self::Graceful,
        Self::Sigkill,
        Self::SilentDeath,
        Self::Partition,
        Self::Terminate,
        Self::TerminateDirect,
        Self::DropServerToClient,
        Self::DropClientToServer,
        Self::RestartFast,
        Self::RestartImmediate,
        Self::Failover,
    ];

    fn name(self) -> &'static str {
        match self {
            Self::Graceful => "graceful stop (SIGTERM)",
            Self::Sigkill => "SIGKILL of the leader",
            Self::SilentDeath => "silent death (blackhole, SIGKILL)",
            Self::Partition => "partition of the leader (blackhole)",
            Self::Terminate => "pg_terminate_backend of the lock session",
            Self::TerminateDirect => "pg_terminate_backend, leader without the proxy",
            Self::DropServerToClient => "server→client drop",
            Self::DropClientToServer => "client→server drop",
            Self::RestartFast => "server restart -m fast",
            Self::RestartImmediate => "server restart -m immediate",
            Self::Failover => "failover to a promoted standby",
        }
    }

    /// The design's bounds (section 6) for (a) no leader, (b) detection, (c) overlap, in
    /// intervals, as text; in the queued mode, the handover target of issue 7 where the server
    /// releases the lock at once (a graceful release, a closed or terminated session).
    fn bounds(self, held: Held) -> [&'static str; 3] {
        let queued = held == Held::Queue;
        if held == Held::Lease {
            return self.lease_bounds();
        }
        match self {
            Self::Graceful if queued => ["10 ms p99 (target)", "0 (ends its term first)", "0"],
            Self::Sigkill if queued => ["10 ms p99 (target)", "— (dead)", "0"],
            Self::Terminate | Self::TerminateDirect if queued => {
                ["10 ms p99 (target)", "2·I", "2·I"]
            }
            Self::Graceful => ["I", "0 (ends its term first)", "0"],
            Self::Sigkill => ["I", "— (dead)", "0"],
            Self::SilentDeath => ["5·I (4·I idle timeout + I)", "— (dead)", "0"],
            Self::Partition => ["5·I", "2·I", "2·I"],
            Self::Terminate | Self::TerminateDirect => ["I", "2·I", "2·I"],
            Self::DropServerToClient => ["3·I (2·I + I)", "2·I", "2·I"],
            Self::DropClientToServer => ["5·I", "2·I", "2·I"],
            Self::RestartFast | Self::RestartImmediate => ["restart + I", "2·I", "2·I"],
            Self::Failover => ["promotion + 2·I", "2·I", "2·I"],
        }
    }
}

impl Fault {
    /// The lease mechanism's bounds (reference.md, Lease mechanism), TTL = 3·I: nothing frees
    /// a lease but its release or its expiry, and the leader stops trusting it 0.9·TTL after
    /// sending its last successful renewal, which is at most I before the fault.
    fn lease_bounds(self) -> [&'static str; 3] {
        match self {
            Self::Graceful => ["I", "0 (ends its term first)", "0"],
            Self::Sigkill | Self::SilentDeath => ["TTL + I (4·I)", "— (dead)", "0"],
            Self::Partition | Self::DropClientToServer => {
                ["TTL + I (4·I)", "I + 0.9·TTL (3.7·I)", "0"]
            }
            // Its renewals still reach the server: the lease lives on until it demotes and its
            // unanswered claim holds it off.
            Self::DropServerToClient => ["2·TTL + 2·I (8·I)", "I + 0.9·TTL (3.7·I)", "0"],
            Self::Terminate | Self::TerminateDirect => ["— (no lock session)", "—", "—"],
            Self::RestartFast | Self::RestartImmediate => {
                ["restart + TTL + I", "I + 0.9·TTL (3.7·I)", "0"]
            }
            Self::Failover => ["promotion + TTL + I", "I + 0.9·TTL (3.7·I)", "0"],
        }
    }

    /// Whether the fault applies to `held`: a lease has no lock session to terminate.
    fn applies(self, held: Held) -> bool {
        held != Held::Lease || !matches!(self, Self::Terminate | Self::TerminateDirect)
    }
}

/// One round's measurements.
#[derive(Debug, Clone, Copy)]
struct Sample {
    no_leader: Duration,
    detection: Option<Duration>,
    overlap: Duration,
    /// The restart or promotion time, for the faults whose bound includes it.
    server: Option<Duration>,
}

async fn failover_table(options: &Options) -> Result<(), BoxError> {
    for held in options.modes() {
        let setup = Setup {
            interval: options.interval,
            held,
            explain_over: options.explain_over,
        };
        failover_mode(options, setup).await?;
    }
    Ok(())
}

async fn failover_mode(options: &Options, setup: Setup) -> Result<(), BoxError> {
    let mode = setup.held.name();
    println!(
        "\n## Failover ({mode}, I = {:?}, {} rounds)\n",
        options.interval, options.rounds
    );
    println!(
        "| fault | (a) no leader: bound | median | p99 | max | (b) old leader knows: bound | median | p99 | max | (c) overlap: bound | median | p99 | max |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for fault in options.faults() {
        if !fault.applies(setup.held) {
            let [gap, detect, overlap] = fault.bounds(setup.held);
            println!(
                "| {} | {gap} | — | — | — | {detect} | — | — | — | {overlap} | — | — | — |",
                fault.name()
            );
            continue;
        }
        let mut samples = Vec::new();
        let mut failures = Vec::new();
        for _ in 0..options.rounds {
            match fault_round(fault, setup).await {
                Ok(sample) => samples.push(sample),
                Err(e) => failures.push(e.to_string()),
            }
        }
        print_row(fault, setup.held, &samples);
        for failure in failures {
            eprintln!("  {}: a round failed: {failure}", fault.name());
        }
    }
    println!(
        "\n(a) the longest span, from the fault to the first term that began after it, in which \
         no replica believed it led; (b) from the fault to the old leader's term end; (c) the \
         longest span two replicas believed they led at once. p99 is nearest-rank: with fewer \
         than 100 rounds it is the maximum."
    );
    Ok(())
}

fn print_row(fault: Fault, held: Held, samples: &[Sample]) {
    let [gap_bound, detect_bound, overlap_bound] = fault.bounds(held);
    let server: Vec<Duration> = samples.iter().filter_map(|s| s.server).collect();
    // Per round: how far (a) went beyond that round's restart or promotion time.
    let beyond: Vec<Duration> = samples
        .iter()
        .filter_map(|s| s.server.map(|t| s.no_leader.saturating_sub(t)))
        .collect();
    let gap_bound = match server.is_empty() {
        true => gap_bound.to_owned(),
        false => format!(
            "{gap_bound} (median {}; (a) minus it: max {})",
            ms(percentile(&server, 50)),
            ms(percentile(&beyond, 100))
        ),
    };
    let gaps: Vec<Duration> = samples.iter().map(|s| s.no_leader).collect();
    let detections: Vec<Duration> = samples.iter().filter_map(|s| s.detection).collect();
    let overlaps: Vec<Duration> = samples.iter().map(|s| s.overlap).collect();
    println!(
        "| {} ({} rounds) | {gap_bound} | {} | {detect_bound} | {} | {overlap_bound} | {} |",
        fault.name(),
        samples.len(),
        stats(&gaps),
        stats(&detections),
        stats(&overlaps)
    );
}

/// `median | p99 | max` in milliseconds, or dashes when there is nothing.
fn stats(values: &[Duration]) -> String {
    if values.is_empty() {
        return "— | — | —".into();
    }
    format!(
        "{} | {} | {}",
        ms(percentile(values, 50)),
        ms(percentile(values, 99)),
        ms(percentile(values, 100))
    )
}

/// Two replica processes, `a` (the leader, possibly behind a proxy) and `b` (a standby).
struct Pair {
    timeline: Timeline,
    /// Explain rounds whose time without a leader exceeds this.
    explain_over: Option<Duration>,
    interval: Duration,
    a: ReplicaProcess,
    b: ReplicaProcess,
}

/// How long after a fault (and the server's restart or promotion) a leader that is still in
/// its term, with nobody else leading, counts as having kept it: ten intervals.
const KEPT_AFTER_INTERVALS: u32 = 10;

impl Pair {
    async fn start(a_dsn: String, b_dsn: String, setup: Setup) -> Result<Self, BoxError> {
        let Setup {
            interval,
            held,
            explain_over,
        } = setup;
        let launcher = replica_launcher()?;
        let timeline = Timeline::new();
        let args = |name: &str, dsn: String| ChildArgs {
            queued: held == Held::Queue,
            lease: held == Held::Lease,
            ..ChildArgs::new(format!("{REPLICA_APP_PREFIX}{name}"), dsn, interval)
        };
        let a = launcher
            .spawn_with_timeline(args("a", a_dsn), &timeline)
            .await?;
        a.wait_for(ROUND_TIMEOUT, |r| r.event == LEAD)
            .await
            .ok_or("a never led")?;
        let b = launcher
            .spawn_with_timeline(args("b", b_dsn), &timeline)
            .await?;
        // b's first refused check leaves a pooled session; a pings at least once more. Then a
        // pseudo-random part of an interval, so that the fault falls at any phase of the
        // leader's checks.
        tokio::time::sleep(2 * interval).await;
        random_phase(interval).await;
        Ok(Self {
            timeline,
            explain_over,
            interval,
            a,
            b,
        })
    }

    /// Measures the round whose fault began at `fault`; `server` is the restart or promotion
    /// time when the fault has one.
    async fn measure(
        &self,
        fault: Instant,
        a_alive: bool,
        server: Option<Duration>,
    ) -> Result<Sample, BoxError> {
        let deadline = Instant::now() + ROUND_TIMEOUT;
        let kept_at = fault + server.unwrap_or_default() + self.interval * KEPT_AFTER_INTERVALS;
        let first_lead = loop {
            let leads: Vec<Instant> = [&self.a, &self.b]
                .iter()
                .flat_map(|r| r.events(LEAD))
                .map(|r| r.at)
                .filter(|at| *at >= fault)
                .collect();
            if let Some(first) = leads.iter().min() {
                break *first;
            }
            // The old leader never lost its term (a lease that outlived a short restart).
            let demoted = self.a.events(FOLLOW).iter().any(|r| r.at >= fault);
            if a_alive && !demoted && Instant::now() >= kept_at {
                let intervals = self.timeline.intervals(LEAD, FOLLOW, Instant::now());
                return Ok(Sample {
                    no_leader: Duration::ZERO,
                    detection: None,
                    overlap: timeline::max_overlap(&intervals),
                    server,
                });
            }
            if Instant::now() >= deadline {
                return Err("no replica led after the fault".into());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        let detection = match a_alive {
            true => Some(
                self.a
                    .wait_for_since(fault, ROUND_TIMEOUT, |r| r.event == FOLLOW)
                    .await
                    .ok_or("the old leader never demoted")?
                    .at
                    - fault,
            ),
            false => None,
        };
        let intervals = self.timeline.intervals(LEAD, FOLLOW, Instant::now());
        let window = Span {
            start: fault,
            end: first_lead,
        };
        let gap = timeline::max_gap(&intervals, window);
        if self.explain_over.is_some_and(|over| gap > over) {
            self.explain(fault, gap);
        }
        Ok(Sample {
            no_leader: gap,
            detection,
            overlap: timeline::max_overlap(&intervals),
            server,
        })
    }

    /// Prints, to stderr, every record of both replicas relative to the fault.
    fn explain(&self, fault: Instant, gap: Duration) {
        let mut records: Vec<_> = self
            .a
            .records()
            .into_iter()
            .chain(self.b.records())
            .collect();
        records.sort_by_key(|r| r.at);
        eprintln!("--- a round without a leader for {gap:?}; times from the fault:");
        for r in records {
            let at = match r.at.checked_duration_since(fault) {
                Some(after) => format!("+{after:?}"),
                None => format!("-{:?}", fault - r.at),
            };
            eprintln!("{at} {} {} {}", r.replica, r.event, r.fields);
        }
    }

    async fn stop(mut self) -> Result<(), BoxError> {
        self.a.stop().await.ok();
        self.b.stop().await?;
        Ok(())
    }
}

fn replica_launcher() -> Result<Launcher, BoxError> {
    let me = std::env::current_exe()?;
    Ok(Launcher::with_prefix(me, &["replica"]))
}

async fn fault_round(fault: Fault, setup: Setup) -> Result<Sample, BoxError> {
    match fault {
        Fault::RestartFast => restart_round(StopMode::Fast, setup).await,
        Fault::RestartImmediate => restart_round(StopMode::Immediate, setup).await,
        Fault::Failover => failover_round(setup).await,
        _ => local_round(fault, setup).await,
    }
}

/// A round on its own database of the local server, `a` behind a fault proxy.
async fn local_round(fault: Fault, setup: Setup) -> Result<Sample, BoxError> {
    let db = TestDb::create("bench").await?;
    if setup.held == Held::Lease {
        plexsphere_leader::lease::setup(db.admin()).await?;
    }
    let proxy = FaultProxy::in_front_of(&db.config()).await?;
    let a_config = match fault {
        Fault::TerminateDirect => db.config(),
        _ => proxy.pg_config(&db.config()),
    };
    let mut pair = Pair::start(dsn(&a_config), dsn(&db.config()), setup).await?;
    let holder = lock_holders(db.admin()).await?;
    let at = Instant::now();
    let alive = match fault {
        Fault::Graceful => {
            pair.a.stop().await?;
            true
        }
        Fault::Sigkill => {
            pair.a.kill().await?;
            false
        }
        Fault::SilentDeath => {
            proxy.set_both(Mode::Blackhole);
            pair.a.kill().await?;
            false
        }
        Fault::Partition => {
            proxy.set_both(Mode::Blackhole);
            true
        }
        Fault::Terminate | Fault::TerminateDirect => {
            let (pid, _) = holder.first().ok_or("no lock holder")?;
            db.terminate(*pid).await?;
            true
        }
        Fault::DropServerToClient => {
            proxy.set_mode(
                plexsphere_leader_tests::Direction::ServerToClient,
                Mode::Blackhole,
            );
            true
        }
        Fault::DropClientToServer => {
            proxy.set_mode(
                plexsphere_leader_tests::Direction::ClientToServer,
                Mode::Blackhole,
            );
            true
        }
        Fault::RestartFast | Fault::RestartImmediate | Fault::Failover => {
            return Err("not a local fault".into());
        }
    };
    let sample = pair.measure(at, alive, None).await;
    proxy.set_both(Mode::Forward);
    pair.stop().await?;
    wait_clean(db.admin(), REPLICA_APP_PREFIX, ROUND_TIMEOUT).await?;
    db.cleanup().await?;
    sample
}

async fn restart_round(mode: StopMode, setup: Setup) -> Result<Sample, BoxError> {
    let cluster = Cluster::start().await?;
    let config = cluster.config("postgres");
    if setup.held == Held::Lease {
        lease_setup(&config).await?;
    }
    let pair = Pair::start(dsn(&config), dsn(&config), setup).await?;
    let at = Instant::now();
    cluster.restart(mode).await?;
    let restart = at.elapsed();
    let sample = pair.measure(at, true, Some(restart)).await;
    pair.stop().await?;
    sample
}

async fn failover_round(setup: Setup) -> Result<Sample, BoxError> {
    let primary = Cluster::start().await?;
    if setup.held == Held::Lease {
        // On the primary before the standby is made from it: the tables replicate.
        lease_setup(&primary.config("postgres")).await?;
    }
    let standby = Cluster::start_standby_of(&primary).await?;
    let proxy = FaultProxy::in_front_of(&primary.config("postgres")).await?;
    let dsn = format!(
        "host=127.0.0.1,127.0.0.1 port={},{} user=postgres dbname=postgres \
         target_session_attrs=read-write connect_timeout=2",
        proxy.addr().port(),
        standby.port()
    );
    let pair = Pair::start(dsn.clone(), dsn, setup).await?;
    let at = Instant::now();
    proxy.set_refuse_new(true);
    proxy.set_both(Mode::Blackhole);
    standby.promote().await?;
    let promotion = at.elapsed();
    let sample = pair.measure(at, true, Some(promotion)).await;
    primary.stop(StopMode::Immediate).await?;
    pair.stop().await?;
    sample
}

/// The lease tables on the server of `config`.
async fn lease_setup(config: &tokio_postgres::Config) -> Result<(), BoxError> {
    let (client, connection) = config.connect(NoTls).await?;
    let driver = tokio::spawn(connection);
    plexsphere_leader::lease::setup(&client).await?;
    drop(client);
    let _ = driver.await;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Cost per check

/// Counts the pool's connection hand-outs (one per standby check) and the connections it opens.
#[derive(Debug, Default)]
struct PoolCounters {
    handed_out: AtomicU64,
    opened: AtomicU64,
}

fn counted_pool(
    config: tokio_postgres::Config,
    max_size: usize,
    counters: &Arc<PoolCounters>,
) -> Result<Pool, BoxError> {
    let manager = Manager::from_connect(
        config,
        plexsphere_leader::session::ObservedConnect::new(NoTls),
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    let (recycled, created) = (Arc::clone(counters), Arc::clone(counters));
    Ok(Pool::builder(manager)
        .max_size(max_size)
        .runtime(Runtime::Tokio1)
        .post_recycle(Hook::sync_fn(move |_, _| {
            recycled.handed_out.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }))
        .post_create(Hook::sync_fn(move |_, _| {
            created.handed_out.fetch_add(1, Ordering::Relaxed);
            created.opened.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }))
        .build()?)
}

/// CPU time and allocations over a window of `checks` checks.
struct Cost {
    checks: u64,
    cpu: Duration,
    bytes: usize,
    allocations: usize,
    net_bytes: i128,
}

impl Cost {
    fn row(&self, what: &str) -> String {
        let n = self.checks.max(1);
        format!(
            "| {what} | {} | {:.1} µs | {} B | {:.1} | {} B |",
            self.checks,
            self.cpu.as_secs_f64() * 1e6 / n as f64,
            self.bytes as u64 / n,
            self.allocations as f64 / n as f64,
            self.net_bytes
        )
    }
}

/// Measures from now until `done` says the window is over, on this process's counters.
/// Measures over a window of `target` checks counted by `checks`, expected one per `interval`.
/// The harness sleeps through the expected window at once, so its own wake-ups cost little.
async fn measure_window(mut checks: impl FnMut() -> u64, target: u64, interval: Duration) -> Cost {
    let region = Region::new(crate::GLOBAL);
    let cpu = process_cpu();
    let start = checks();
    tokio::time::sleep(interval * u32::try_from(target).unwrap_or(u32::MAX)).await;
    while checks() - start < target {
        tokio::time::sleep(interval).await;
    }
    let change = region.change();
    Cost {
        checks: checks() - start,
        cpu: process_cpu() - cpu,
        bytes: change.bytes_allocated,
        allocations: change.allocations,
        net_bytes: change.bytes_allocated as i128 - change.bytes_deallocated as i128,
    }
}

async fn sessions_started(db: &TestDb) -> Result<i64, BoxError> {
    // Backends report their statistics at most once a second.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    db.admin()
        .batch_execute("SELECT pg_stat_clear_snapshot()")
        .await?;
    Ok(db
        .admin()
        .query_one(
            "SELECT sessions FROM pg_stat_database WHERE datname = current_database()",
            &[],
        )
        .await?
        .get(0))
}

async fn costs(_options: &Options) -> Result<(), BoxError> {
    let interval = Duration::from_millis(50);
    let checks = 1_000;
    let warnings = WarnCounter::global();
    let db = TestDb::create("bench_costs").await?;
    let blocker = db.connect("plx-harness-blocker").await?;
    blocker
        .simple_query("SELECT pg_advisory_lock(1886156915, 1)")
        .await?;
    // The harness and an idle runtime alone, over as many intervals.
    let idle_start = Instant::now();
    let idle = measure_window(
        || (idle_start.elapsed().as_nanos() / interval.as_nanos()) as u64,
        checks,
        interval,
    )
    .await;
    let counters = Arc::new(PoolCounters::default());
    let pool = counted_pool(
        db.config_with_app_name(&format!("{REPLICA_APP_PREFIX}bench")),
        2,
        &counters,
    )?;
    let elector = Elector::new(
        Config::new(pool)
            .check_interval(interval)
            .identity(format!("{REPLICA_APP_PREFIX}bench")),
    )?;
    let shutdown = CancellationToken::new();
    let run = tokio::spawn({
        let (elector, shutdown) = (elector.clone(), shutdown.clone());
        async move { elector.run(shutdown).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;

    let sessions_before = sessions_started(&db).await?;
    let opened_before = counters.opened.load(Ordering::Relaxed);
    let warned = warnings.count();
    let standby = measure_window(
        || counters.handed_out.load(Ordering::Relaxed),
        checks,
        interval,
    )
    .await;
    let standby_failed = warnings.count() - warned;
    let opened = counters.opened.load(Ordering::Relaxed) - opened_before;
    let sessions = sessions_started(&db).await? - sessions_before;

    blocker
        .simple_query("SELECT pg_advisory_unlock(1886156915, 1)")
        .await?;
    let _ = tokio::time::timeout(
        ROUND_TIMEOUT,
        elector
            .subscribe()
            .wait_for(|leadership| leadership.is_leader()),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    // The leader's checks run on the grid: one per interval.
    let grid = Instant::now();
    let warned = warnings.count();
    let leader = measure_window(
        || (grid.elapsed().as_nanos() / interval.as_nanos()) as u64,
        checks,
        interval,
    )
    .await;
    let leader_failed = warnings.count() - warned;
    shutdown.cancel();
    run.await??;
    let lease = lease_cost(&db, interval, checks).await?;

    println!("\n## Cost per check (I = {interval:?}, one elector in this process)\n");
    println!(
        "| check | checks | client CPU per check | bytes allocated per check | allocations per check | net bytes over the window |"
    );
    println!("|---|---|---|---|---|---|");
    println!(
        "{}",
        idle.row("no elector: harness and idle runtime, per interval")
    );
    println!("{}", standby.row("standby (lock refused)"));
    println!("{}", leader.row("leader (the lock-verifying check)"));
    println!(
        "{}",
        lease
            .cost
            .row("lease leader (the renewal, one pooled statement)")
    );
    println!(
        "\nFailed checks (WARN lines) in the windows: standby {standby_failed}, leader {leader_failed}."
    );
    println!(
        "\nBackends opened over {} refused checks: {opened} by the pool, {sessions} sessions \
         started on the server (`pg_stat_database.sessions`); per 1,000: {}.",
        standby.checks,
        (sessions.max(0) as u64 * 1_000).div_ceil(standby.checks.max(1))
    );
    println!(
        "\nThe lease renewal on the server: {} WAL bytes per renewal ({} bytes over {} \
         renewals, `pg_wal_lsn_diff` of `pg_current_wal_lsn()`; one row update of \
         `plexsphere_leader_lease`, HOT when the fillfactor leaves room), {} failed renewals.",
        lease.wal_bytes / i128::from(u32::try_from(lease.cost.checks.max(1)).unwrap_or(u32::MAX)),
        lease.wal_bytes,
        lease.cost.checks,
        lease.failed
    );
    drop(blocker);
    db.cleanup().await?;
    wakeups().await
}

/// The server's WAL position in bytes.
async fn wal_position(db: &TestDb) -> Result<i128, BoxError> {
    let row = db
        .admin()
        .query_one(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::text",
            &[],
        )
        .await?;
    let text: String = row.get(0);
    Ok(text.split('.').next().unwrap_or("0").parse()?)
}

/// What a lease leader's renewals cost: the client per check, and the server's WAL.
struct LeaseCost {
    cost: Cost,
    wal_bytes: i128,
    failed: u64,
}

/// A lease elector leading alone on `db` at `interval`, over `checks` renewals (the check grid).
async fn lease_cost(db: &TestDb, interval: Duration, checks: u64) -> Result<LeaseCost, BoxError> {
    plexsphere_leader::lease::setup(db.admin()).await?;
    let pool = db.pool_with_app_name(&format!("{REPLICA_APP_PREFIX}lease"), 2)?;
    let elector = Elector::new(
        Config::new(pool)
            .check_interval(interval)
            .lease(Duration::ZERO)
            .identity(format!("{REPLICA_APP_PREFIX}lease")),
    )?;
    let shutdown = CancellationToken::new();
    let run = tokio::spawn({
        let (elector, shutdown) = (elector.clone(), shutdown.clone());
        async move { elector.run(shutdown).await }
    });
    tokio::time::timeout(
        ROUND_TIMEOUT,
        elector
            .subscribe()
            .wait_for(|leadership| leadership.is_leader()),
    )
    .await??;
    let warnings = WarnCounter::global();
    let warned = warnings.count();
    let wal_before = wal_position(db).await?;
    let grid = Instant::now();
    let cost = measure_window(
        || (grid.elapsed().as_nanos() / interval.as_nanos()) as u64,
        checks,
        interval,
    )
    .await;
    let wal_bytes = wal_position(db).await? - wal_before;
    let failed = warnings.count() - warned;
    shutdown.cancel();
    run.await??;
    Ok(LeaseCost {
        cost,
        wal_bytes,
        failed,
    })
}

/// How often an idle process wakes up (voluntary context switches of all its threads, from
/// `/proc/self/task/*/status`) over `intervals` check intervals while `leader` (if any) leads.
async fn wakeups_per_interval(interval: Duration, intervals: u32) -> f64 {
    let before = voluntary_switches();
    tokio::time::sleep(interval * intervals).await;
    (voluntary_switches() - before) as f64 / f64::from(intervals)
}

fn voluntary_switches() -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .filter_map(Result::ok)
        .filter_map(|task| std::fs::read_to_string(task.path().join("status")).ok())
        .filter_map(|status| {
            status.lines().find_map(|line| {
                line.strip_prefix("voluntary_ctxt_switches:")
                    .and_then(|n| n.trim().parse::<u64>().ok())
            })
        })
        .sum()
}

/// Timer wake-ups of an idle leader: one elector leading at I = 1 s, its pool built with
/// `ObservedConnect` (the session's end is awaited) or with deadpool's default connector (the
/// closed flag is looked at every 5 ms), against the same process with no elector.
async fn wakeups() -> Result<(), BoxError> {
    let interval = Duration::from_secs(1);
    let intervals = 10;
    let idle = wakeups_per_interval(interval, intervals).await;
    let mut rows = Vec::new();
    for observed in [true, false] {
        let db = TestDb::create(if observed {
            "bench_wake_observed"
        } else {
            "bench_wake_plain"
        })
        .await?;
        let config = db.config_with_app_name(&format!("{REPLICA_APP_PREFIX}bench"));
        let manager_config = ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        };
        let manager = if observed {
            Manager::from_connect(
                config,
                plexsphere_leader::session::ObservedConnect::new(NoTls),
                manager_config,
            )
        } else {
            Manager::from_config(config, NoTls, manager_config)
        };
        let pool = Pool::builder(manager)
            .max_size(2)
            .runtime(Runtime::Tokio1)
            .build()?;
        let elector = Elector::new(Config::new(pool).check_interval(interval))?;
        let shutdown = CancellationToken::new();
        let run = tokio::spawn({
            let (elector, shutdown) = (elector.clone(), shutdown.clone());
            async move { elector.run(shutdown).await }
        });
        tokio::time::timeout(
            ROUND_TIMEOUT,
            elector
                .subscribe()
                .wait_for(|leadership| leadership.is_leader()),
        )
        .await??;
        tokio::time::sleep(interval).await;
        let leading = wakeups_per_interval(interval, intervals).await;
        let led = elector.is_leader();
        shutdown.cancel();
        run.await??;
        db.cleanup().await?;
        rows.push((observed, leading, led));
    }
    println!("\n## Wake-ups of an idle leader (I = {interval:?}, {intervals} intervals)\n");
    println!("| process | voluntary context switches per interval, all threads | led throughout |");
    println!("|---|---|---|");
    println!("| no elector (harness and idle runtime) | {idle:.1} | — |");
    for (observed, leading, led) in rows {
        let pool = if observed {
            "pool with `ObservedConnect` (session end awaited)"
        } else {
            "pool with deadpool's default connector (closed flag every 5 ms)"
        };
        println!("| leader, {pool} | {leading:.1} | {led} |");
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Scale

/// One elector, its pool, its sessions (for their counts) and its `run` task.
type Member = (
    Elector,
    Pool,
    PoolSessions,
    tokio::task::JoinHandle<Result<(), plexsphere_leader::RunError>>,
);

/// Electors running in this process on one cluster.
struct Electors {
    members: Vec<Member>,
    shutdown: CancellationToken,
    /// When the first elector was started.
    started: Instant,
}

impl Electors {
    /// Starts `n` electors, each with its own pool of 2. With `warm`, each pool opens its
    /// connection (without a time limit) before its elector starts.
    async fn start(
        config: &tokio_postgres::Config,
        n: usize,
        interval: Duration,
        counters: &Arc<PoolCounters>,
        warm: bool,
    ) -> Result<Self, BoxError> {
        let shutdown = CancellationToken::new();
        let mut members = Vec::new();
        let mut started = None;
        for i in 0..n {
            let mut config = config.clone();
            config.application_name(format!("{REPLICA_APP_PREFIX}{i}"));
            let pool = counted_pool(config, 2, counters)?;
            if warm {
                drop(pool.get().await?);
            }
            let sessions = PoolSessions::new(pool.clone());
            let elector = Elector::new(
                Config::with_sessions(sessions.clone())
                    .check_interval(interval)
                    .identity(format!("{REPLICA_APP_PREFIX}{i}")),
            )?;
            started.get_or_insert_with(Instant::now);
            let task = tokio::spawn({
                let (elector, shutdown) = (elector.clone(), shutdown.clone());
                async move { elector.run(shutdown).await }
            });
            members.push((elector, pool, sessions, task));
        }
        Ok(Self {
            members,
            shutdown,
            started: started.unwrap_or_else(Instant::now),
        })
    }

    fn leaders(&self) -> usize {
        self.members.iter().filter(|(e, ..)| e.is_leader()).count()
    }

    /// Electors that lead or whose pool holds a connection.
    fn connected(&self) -> usize {
        self.members
            .iter()
            .filter(|(e, pool, ..)| e.is_leader() || pool.status().size > 0)
            .count()
    }

    /// The connection setups a check gave up on, summed over the electors.
    fn late_setups(&self) -> LateSetups {
        self.members
            .iter()
            .fold(LateSetups::default(), |mut sum, (_, _, sessions, _)| {
                let late = sessions.late_setups();
                sum.finished += late.finished;
                sum.given_up += late.given_up;
                sum
            })
    }

    async fn stop(self) -> Result<(), BoxError> {
        self.shutdown.cancel();
        for (.., task) in self.members {
            task.await??;
        }
        Ok(())
    }
}

async fn scale(options: &Options) -> Result<(), BoxError> {
    let (n, interval, window) = (
        options.scale_electors,
        options.scale_interval,
        options.scale_window,
    );
    let cluster = Cluster::start().await?;
    let admin = cluster.connect("postgres").await?;
    admin
        .batch_execute(&format!(
            "ALTER SYSTEM SET max_connections = {}",
            n * 2 + 20
        ))
        .await?;
    drop(admin);
    cluster.restart(StopMode::Fast).await?;
    let config = cluster.config("postgres");
    let observer = LockObserver::start(&config).await?;
    let counters = Arc::new(PoolCounters::default());
    WarnCounter::global();

    // Steady state: every pool holds its connection before its elector starts.
    let fleet = Electors::start(&config, n, interval, &counters, true).await?;
    tokio::time::sleep(2 * interval).await;
    let steady = observe(&fleet, &cluster, &counters, window, interval).await;
    fleet.stop().await?;
    tokio::time::sleep(Duration::from_secs(2)).await;

    // Cold start: all at once, every pool empty: each first check must connect within one
    // interval, or a later check finishes the connection that check gave up on.
    let fleet = Electors::start(&config, n, interval, &counters, false).await?;
    let cold = observe(&fleet, &cluster, &counters, COLD_WINDOW, interval).await;
    fleet.stop().await?;

    println!("\n## Scale: {n} electors in one database, I = {interval:?}\n");
    println!(
        "| figure | steady state: pools connected before start, {:.1} s | cold start: all at once, empty pools, first {:.1} s |",
        steady.secs, cold.secs
    );
    println!("|---|---|---|");
    for (figure, steady, cold) in [
        (
            "electors with a connection at the end",
            steady.connected(n),
            cold.connected(n),
        ),
        (
            "leaders at every instant (is_leader summed, sampled every 5 ms)",
            steady.leaders(),
            cold.leaders(),
        ),
        (
            "first sample with a leader / with every elector connected, from the first elector's start",
            "— (connected before)".into(),
            cold.convergence(),
        ),
        (
            "granted rows per observer poll (server)",
            format!("max {}", observer.max_granted()),
            "(same observer)".into(),
        ),
        (
            "checks per second (ideal {ideal})",
            steady.rate(),
            cold.rate(),
        ),
        (
            "failed checks (WARN lines) / connections opened",
            steady.failures(),
            cold.failures(),
        ),
        (
            "connection setups a check gave up on: finished for a later check / cancelled",
            steady.late(),
            cold.late(),
        ),
        (
            "server CPU (the cluster's postmaster and all its backends)",
            steady.server(),
            cold.server(),
        ),
        (
            "client CPU (all electors in this process)",
            steady.client(),
            cold.client(),
        ),
    ] {
        let ideal = format!("{:.0}", n as f64 / interval.as_secs_f64());
        println!(
            "| {} | {steady} | {cold} |",
            figure.replace("{ideal}", &ideal)
        );
    }
    if let Some(first) = WarnCounter::global().first() {
        println!("\nFirst WARN line: `{first}`");
    }
    Ok(())
}

/// How long the cold start is observed.
const COLD_WINDOW: Duration = Duration::from_secs(5);

/// What [`observe`] saw over its window.
struct Observation {
    secs: f64,
    connected: usize,
    min: usize,
    max: usize,
    off: u64,
    samples: u64,
    standby_checks: u64,
    leader_checks: u64,
    opened: u64,
    warned: u64,
    server: Duration,
    client: Duration,
    /// From the fleet's start to the first sample with a leader.
    first_leader: Option<Duration>,
    /// From the fleet's start to the first sample with every elector connected.
    all_connected: Option<Duration>,
    late: LateSetups,
}

impl Observation {
    fn checks(&self) -> f64 {
        (self.standby_checks + self.leader_checks).max(1) as f64
    }

    fn connected(&self, n: usize) -> String {
        format!("{} of {n}", self.connected)
    }

    fn leaders(&self) -> String {
        format!(
            "min {}, max {}; {} of {} samples not exactly 1",
            self.min, self.max, self.off, self.samples
        )
    }

    fn rate(&self) -> String {
        format!(
            "{:.0} ({:.0} standby, {:.0} leader)",
            (self.standby_checks + self.leader_checks) as f64 / self.secs,
            self.standby_checks as f64 / self.secs,
            self.leader_checks as f64 / self.secs
        )
    }

    fn failures(&self) -> String {
        format!("{} / {}", self.warned, self.opened)
    }

    fn convergence(&self) -> String {
        let at = |t: Option<Duration>| t.map_or("never".into(), |t| format!("{t:.0?}"));
        format!("{} / {}", at(self.first_leader), at(self.all_connected))
    }

    fn late(&self) -> String {
        format!("{} / {}", self.late.finished, self.late.given_up)
    }

    fn server(&self) -> String {
        let cores = std::thread::available_parallelism().map_or(1, usize::from) as f64;
        let share = self.server.as_secs_f64() / self.secs;
        format!(
            "{:.1} % of one core ({:.1} % of the machine's {cores} cores); {:.1} µs per check",
            share * 100.0,
            share / cores * 100.0,
            self.server.as_secs_f64() * 1e6 / self.checks()
        )
    }

    fn client(&self) -> String {
        format!(
            "{:.1} % of one core; {:.1} µs per check",
            self.client.as_secs_f64() / self.secs * 100.0,
            self.client.as_secs_f64() * 1e6 / self.checks()
        )
    }
}

/// Samples the number of leaders every 5 ms for `window` and counts checks, failures,
/// connections and CPU.
async fn observe(
    fleet: &Electors,
    cluster: &Cluster,
    counters: &PoolCounters,
    window: Duration,
    interval: Duration,
) -> Observation {
    let warnings = WarnCounter::global();
    let (server, client) = (cluster_cpu(cluster), process_cpu());
    let handed_out = counters.handed_out.load(Ordering::Relaxed);
    let (opened, warned) = (counters.opened.load(Ordering::Relaxed), warnings.count());
    let late = fleet.late_setups();
    let start = Instant::now();
    let (mut min, mut max, mut off, mut samples, mut with_leader) = (usize::MAX, 0, 0, 0, 0);
    let (mut first_leader, mut all_connected) = (None, None);
    while start.elapsed() < window {
        let leaders = fleet.leaders();
        if leaders > 0 {
            first_leader.get_or_insert_with(|| fleet.started.elapsed());
        }
        if all_connected.is_none() && fleet.connected() == fleet.members.len() {
            all_connected = Some(fleet.started.elapsed());
        }
        (min, max) = (min.min(leaders), max.max(leaders));
        off += u64::from(leaders != 1);
        with_leader += u64::from(leaders > 0);
        samples += 1;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let secs = start.elapsed().as_secs_f64();
    Observation {
        secs,
        connected: fleet.connected(),
        min,
        max,
        off,
        samples,
        standby_checks: counters.handed_out.load(Ordering::Relaxed) - handed_out,
        // One `SELECT 1` per interval while some elector leads.
        leader_checks: (secs / interval.as_secs_f64() * with_leader as f64 / samples.max(1) as f64)
            as u64,
        opened: counters.opened.load(Ordering::Relaxed) - opened,
        warned: warnings.count() - warned,
        server: cluster_cpu(cluster).saturating_sub(server),
        client: process_cpu() - client,
        first_leader,
        all_connected,
        late: {
            let now = fleet.late_setups();
            let mut delta = LateSetups::default();
            delta.finished = now.finished - late.finished;
            delta.given_up = now.given_up - late.given_up;
            delta
        },
    }
}

/// Counts the elector's WARN events (target `plexsphere_leader`) and keeps the first message.
#[derive(Clone, Default)]
struct WarnCounter {
    count: Arc<AtomicU64>,
    first: Arc<std::sync::Mutex<Option<String>>>,
}

impl WarnCounter {
    /// The counter, installed as the global subscriber on first use.
    fn global() -> &'static Self {
        static COUNTER: std::sync::OnceLock<WarnCounter> = std::sync::OnceLock::new();
        COUNTER.get_or_init(|| {
            use tracing_subscriber::layer::SubscriberExt;
            let counter = Self::default();
            let subscriber = tracing_subscriber::registry().with(counter.clone());
            let _ = tracing::subscriber::set_global_default(subscriber);
            counter
        })
    }

    fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    fn first(&self) -> Option<String> {
        self.first.lock().ok().and_then(|first| first.clone())
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for WarnCounter {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        let meta = event.metadata();
        if meta.target() != "plexsphere_leader" || *meta.level() != tracing::Level::WARN {
            return;
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut first) = self.first.lock()
            && first.is_none()
        {
            struct Message(String);
            impl tracing::field::Visit for Message {
                fn record_debug(&mut self, field: &tracing::field::Field, v: &dyn std::fmt::Debug) {
                    if field.name() == "message" {
                        self.0 = format!("{v:?}");
                    }
                }
            }
            let mut message = Message(String::new());
            event.record(&mut message);
            *first = Some(message.0);
        }
    }
}
