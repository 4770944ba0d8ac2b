//! `bench single`: the single election's failover, costs, scale and floor; prints tables,
//! asserts nothing.
//!
//! ```text
//! cargo run --release -p plexsphere-leader-tests --bin bench -- single \
//!     [--check-interval 200ms] [--rounds 5] [--scale-electors 100] [--scale-interval 50ms] \
//!     [--scale-seconds 10] [--only failover|costs|scale|floor|rollout] [--acquire poll|queue|both] \
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
//! 5. **Rollout** (issue 41, ranked replicas): the handover when a replica of a newer version
//!    preempts the leader (queued advisory lock and lease), and rolling deploys of three
//!    replica processes one at a time, ranked beside unranked, and a rollback: leadership
//!    moves, by version, and the time without a leader.
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
    ChildArgs, Cluster, FaultProxy, Launcher, LockObserver, Mechanism, Mode, ReplicaProcess,
    StopMode, TestDb, Timeline,
};
use stats_alloc::Region;
use tokio::time::Instant;
use tokio_postgres::NoTls;
use tokio_util::sync::CancellationToken;

use crate::common::{
    BoxError, duration, fine_ms, ms, percentile, print_machine, random_phase, seconds,
};

/// How long any one wait of a round may take before the round counts as failed.
mod costs;
mod failover;
mod floor;
mod rollout;
mod scale;

use self::costs::costs;
use self::failover::{Fault, failover_table};
use self::floor::detection_floor;
use self::rollout::rollout;
use self::scale::scale;

const ROUND_TIMEOUT: Duration = Duration::from_secs(20);

/// The command line of `bench single`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct Options {
    /// The replicas' check interval I in the failover table.
    #[arg(long = "check-interval", value_name = "DURATION")]
    #[arg(default_value = "200ms", value_parser = duration)]
    interval: Duration,
    /// Rounds per fault (failover), of the detection floor and of the rollout's handover (its
    /// rolling deploys: one per 5 rounds).
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
    Rollout,
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

    /// What the replica child holds.
    fn mechanism(self) -> Mechanism {
        match self {
            Self::Poll | Self::Queue => Mechanism::Advisory,
            Self::Lease => Mechanism::Lease,
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
    if options.runs(Section::Rollout) {
        rollout(&options).await?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// What the sections share

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
