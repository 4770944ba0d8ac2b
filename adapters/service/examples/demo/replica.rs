//! One replica of the demo service: boots like the spec says, serves its health routes and
//! `/status`, and prints one line per leadership change.

use std::future::Future;
use std::io::Write as _;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use plexsphere_leader::{
    Config, Elector, Leadership, TermEndCause,
    config::OnOverdue,
    leadership::{Release, ReleaseOutcome, Resignation, TermEnd, TermEvent, TermEvents, TermId},
};
use plexsphere_leader_service::loops::{
    BoxError, ELECTION_WORKER, PassFn, Placement, TickMetrics, Wired, pass_fn,
};
use plexsphere_leader_service::{
    Background, DEFAULT_SHUTDOWN_BOUND, ElectorLiveness, EveryReplica, Gate, LeaderTicker,
    Liveness, Readiness, WhileLeader, shutdown_bound, wire_background,
};
use prometheus::Registry;
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

#[path = "replica/events.rs"]
mod events;
#[path = "replica/loops.rs"]
mod loops;
#[path = "replica/status.rs"]
mod status;

use self::events::{init_logs, line, print_leadership};
use self::loops::wire_loops;
use self::status::{Probes, serve};
use crate::cli::{Args, DSN_ENV, Mechanism, VERSION_ENV, sse_nonce_ttl_from_env};
use crate::passes;

type Error = Box<dyn std::error::Error + Send + Sync>;

/// The spec's fifteen leader-ticked loops, in its order, with the probe of the seven that have
/// one (`access-session-sweeper` is the probe of `access-session-sweep`).
pub(crate) const TICKED: [(&str, Option<&str>); 15] = [
    ("invitations-expire", Some("invitations-expire")),
    ("approvals-expire", Some("approvals-expire")),
    ("actions-timeout", Some("actions-timeout")),
    ("access-session-sweep", Some("access-session-sweeper")),
    ("auth-state-sweep", None),
    ("rate-budget-sweep", None),
    ("sse-nonce-sweep", None),
    ("credentials-sweeper", None),
    ("cloud-credentials-sweeper", None),
    (
        "management-fleet-reconcile",
        Some("management-fleet-reconcile"),
    ),
    (
        "provisioning-broker-reconcile",
        Some("provisioning-broker-reconcile"),
    ),
    ("artifacts-refresh", Some("artifacts-refresh")),
    ("blueprint-catalogs-tracking", None),
    ("peers-endpoint-sweeper", None),
    ("reachability-evaluator", None),
];

/// The observability routing consume loops: one worker each, under suffixed names.
pub(crate) const DURABLES: [&str; 3] = ["alerts", "logs", "traces"];

/// What a replica needs to know about itself.
#[derive(Clone)]
struct Me {
    index: u16,
    pid: u32,
    actor: String,
    application_name: String,
    interval: Duration,
    /// `$PLEXSPHERE_SSE_NONCE_TTL`: the period and freshness window of `sse-nonce-sweep`.
    nonce_ttl: Duration,
    /// What the replica waits for before its election starts, for `/status`.
    waiting: Waiting,
    /// The release number it ranks itself by (`--rollout`), printed with each acquisition.
    version: Option<String>,
}

/// What a replica waits for before its election starts (`None` once it runs).
type Waiting = Arc<Mutex<Option<String>>>;

/// Runs replica `index` until Ctrl-C, SIGTERM, or its standard input closes (the demo that
/// started it is gone).
pub(crate) async fn run(args: Args, index: u16) -> Result<(), Error> {
    let pid = std::process::id();
    let me = Me {
        index,
        pid,
        actor: format!("replica-{index}/pid-{pid}"),
        application_name: format!("plexsphere-demo-r{index}-{pid}"),
        interval: args.check_interval,
        nonce_ttl: sse_nonce_ttl_from_env()?,
        waiting: Arc::new(Mutex::new(Some(
            "the demo schema, before the election starts".into(),
        ))),
        version: std::env::var(VERSION_ENV)
            .ok()
            .filter(|version| !version.trim().is_empty()),
    };
    init_logs(index);
    let shutdown = CancellationToken::new();
    tokio::spawn(stop_on_signal(shutdown.clone()));

    let registry = Registry::new();
    let readiness = Readiness::new();
    let liveness = Liveness::new();
    let dsn = std::env::var(DSN_ENV)
        .ok()
        .filter(|dsn| !dsn.trim().is_empty());

    // Surface index 0: the Elector, built first, on the worker tier's pool.
    let (elector, pool) = match &dsn {
        Some(dsn) => {
            let pool = pool(dsn, &me.application_name)?;
            // Leader work still running two intervals after its term ended is reported.
            let config = Config::new(pool.clone())
                .check_interval(me.interval)
                .registry(&registry)
                .work_deadline(2 * me.interval, OnOverdue::Report)
                .identity(&me.application_name)
                .key(args.key)
                .acquire_mode(args.acquire.into())
                .fencing(args.fencing);
            let config = match args.mechanism {
                Mechanism::Advisory => config,
                Mechanism::Lease => config.lease(Duration::ZERO),
            };
            // `--rollout`: ranked, so that the newest version leads once it is up.
            let config = match &me.version {
                Some(version) => config.version(version),
                None => config,
            };
            let elector = Elector::new(config)?;
            // Liveness, never readiness: a leader whose election stopped being driven.
            liveness.register(
                ELECTION_WORKER,
                Arc::new(ElectorLiveness::new(elector.clone())),
            )?;
            (Some(elector), Some(pool))
        }
        None => (None, None),
    };

    // `--shards K`: a sharded elector beside the Elector, on the same pool.
    let sharded = match (&pool, args.shards) {
        (Some(pool), Some(count)) => Some(crate::shards::build(
            pool,
            count,
            &me.application_name,
            me.interval,
            &registry,
            args.mechanism,
        )?),
        _ => None,
    };
    if let Some(sharded) = &sharded {
        // The sharded elector's stuck-owner verdict, beside the Elector's.
        liveness.register(
            "sharded-election",
            Arc::new(ElectorLiveness::sharded(sharded.clone())),
        )?;
    }

    // Every later surface reads the Elector and gates its loops on it.
    let metrics = TickMetrics::register(&registry)?;
    let mut background = Background::new(&readiness)?;
    let wired = wire_background(elector.clone(), &mut background, |elector, background| {
        match &pool {
            Some(pool) => {
                wire_loops(elector, background, pool, &me, &metrics, sharded.is_some())?;
                match &sharded {
                    Some(sharded) => {
                        crate::shards::wire(background, sharded, pool, &me.actor, me.interval)
                    }
                    None => Ok(()),
                }
            }
            None => Ok(()), // the Elector is built only with a pool
        }
    })
    .map_err(|e| format!("wiring: {e}"))?;
    let workers: Arc<[(String, Placement)]> = match &wired {
        Wired::Nothing => {
            tracing::warn!("no database: no Elector and no background loop");
            Arc::new([])
        }
        Wired::Loops(names) => {
            tracing::info!(workers = names.len(), "background loops wired");
            background.placements().into()
        }
    };

    // Served before the database answers: /livez passes, /readyz fails (no boot pass yet) and
    // /status says no replica of this process leads, while the schema waits for the server.
    let probes = Probes {
        readiness: readiness.clone(),
        liveness: liveness.clone(),
        registry: registry.clone(),
        workers,
    };
    let server = serve(
        &args,
        &me,
        probes,
        elector.clone(),
        sharded.clone(),
        &shutdown,
    )
    .await;
    if let Err(error) = &server {
        let error = chain(error.as_ref());
        tracing::error!(%error, "cannot serve HTTP");
        shutdown.cancel();
    }
    if let Some(pool) = &pool
        && !create_schema(pool, &shutdown, me.interval, &args, &me.waiting).await
    {
        return stop_serving(server).await;
    }

    // The boot passes run on every replica, ungated, before it reports ready.
    let boot = background.boot(&shutdown).await;
    for failed in boot.failures() {
        tracing::warn!(r#loop = %failed.name, "boot pass failed; the probe reports it until the first tick");
    }

    // The supervisor starts every worker just before the replica serves its routes.
    let running = background.start(&shutdown);
    let watch = CancellationToken::new();
    let watcher = elector
        .clone()
        .map(|elector| tokio::spawn(print_leadership(elector, me.clone(), watch.clone())));
    let shard_watcher = sharded.clone().map(|sharded| {
        let me = me.clone();
        tokio::spawn(crate::shards::print_changes(
            sharded,
            move |event| line(&me, event),
            watch.clone(),
        ))
    });

    // An election that ended for good (a transaction-mode pooler under the advisory lock)
    // stops the replica: one line says why, and the process exits non-zero.
    let failed = elector
        .clone()
        .map(|elector| tokio::spawn(election_failure(elector, shutdown.clone())));

    shutdown.cancelled().await;
    // Long enough for a leader's graceful stop (its stop grace, then the unlock).
    let bound = elector
        .as_ref()
        .map_or(DEFAULT_SHUTDOWN_BOUND, shutdown_bound);
    let report = running.shutdown(bound).await;
    if !report.aborted.is_empty() {
        tracing::warn!(aborted = ?report.aborted, "workers aborted at the shutdown bound");
    }
    watch.cancel();
    if let Some(watcher) = watcher {
        let _ = watcher.await;
    }
    if let Some(watcher) = shard_watcher {
        let _ = watcher.await;
    }
    if let Some(pool) = pool {
        pool.close();
    }
    let failure = match failed {
        Some(task) => task.await.ok().flatten(),
        None => None,
    };
    stop_serving(server).await?;
    match failure {
        Some(error) => Err(error.into()),
        None => Ok(()),
    }
}

/// Waits for the election's run to end with an error (published as
/// `Leadership::run_failed`), prints it as one line naming the flag to use, and stops the
/// replica; `None` once `shutdown` is cancelled first.
async fn election_failure(elector: Elector, shutdown: CancellationToken) -> Option<String> {
    let mut published = elector.subscribe();
    loop {
        if let Some(error) = published.borrow_and_update().run_failed() {
            let hint = match error {
                plexsphere_leader::RunError::SessionsMultiplexed(_)
                | plexsphere_leader::RunError::LockNotExclusive(_) => {
                    "; this endpoint needs --mechanism lease"
                }
                _ => "",
            };
            // The election logged it at ERROR already; the demo's own error line ends the
            // replica with the flag to use.
            let text = format!("the election stopped for good: {error}{hint}");
            shutdown.cancel();
            return Some(text);
        }
        tokio::select! {
            () = shutdown.cancelled() => return None,
            changed = published.changed() => if changed.is_err() { return None },
        }
    }
}

/// Waits (at most 2 s) for the HTTP server, whose graceful shutdown `shutdown` started; a
/// server that never started fails the replica (its process exits non-zero).
async fn stop_serving(server: Result<tokio::task::JoinHandle<()>, Error>) -> Result<(), Error> {
    match server {
        Ok(server) => {
            let _ = tokio::time::timeout(Duration::from_secs(2), server).await;
            Ok(())
        }
        Err(error) => Err(format!("cannot serve HTTP: {}", chain(error.as_ref())).into()),
    }
}

fn pool(dsn: &str, application_name: &str) -> Result<Pool, Error> {
    let mut config = tokio_postgres::Config::from_str(dsn)?;
    config
        .application_name(application_name)
        .connect_timeout(Duration::from_secs(5));
    // ObservedConnect: the end of the lock session wakes the elector at once.
    let manager = Manager::from_connect(
        config,
        plexsphere_leader::session::ObservedConnect::new(tokio_postgres::NoTls),
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Ok(Pool::builder(manager)
        .max_size(12)
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(Duration::from_secs(10)))
        .create_timeout(Some(Duration::from_secs(5)))
        .build()?)
}

/// `error` and its sources (the service kit's [`report`](plexsphere_leader_service::report)):
/// the driver's `db error` alone says nothing of a wrong password or a missing role.
fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    plexsphere_leader_service::report(error).text
}

/// Creates the demo schema, retrying every interval until it works; `false` when the shutdown
/// came first.
/// Creates the demo's tables (and the fence table with `--fencing`, the lease tables with
/// `--mechanism lease`), retrying every interval (at least 500 ms) until the database answers;
/// `false` when `shutdown` came first.
async fn create_schema(
    pool: &Pool,
    shutdown: &CancellationToken,
    interval: Duration,
    args: &Args,
    waiting: &Waiting,
) -> bool {
    loop {
        let attempt = async {
            let mut client = pool.get().await?;
            passes::create_schema(&mut client).await?;
            if args.fencing {
                plexsphere_leader::fencing::setup(&**client).await?;
            }
            if args.mechanism == Mechanism::Lease {
                plexsphere_leader::lease::setup(&**client).await?;
                if args.shards.is_some() {
                    plexsphere_leader::lease::setup_shards(
                        &**client,
                        plexsphere_leader::lease::DEFAULT_SCHEMA,
                    )
                    .await?;
                }
            }
            Ok::<(), Error>(())
        };
        match attempt.await {
            Ok(()) => {
                *waiting.lock().unwrap_or_else(PoisonError::into_inner) = None;
                return true;
            }
            Err(error) => {
                let error = chain(error.as_ref());
                tracing::warn!(%error, "create the demo schema; retrying");
                *waiting.lock().unwrap_or_else(PoisonError::into_inner) = Some(format!(
                    "the demo schema, before the election starts; it fails, retried every \
                     interval: {error}"
                ));
            }
        }
        tokio::select! {
            () = shutdown.cancelled() => return false,
            () = tokio::time::sleep(interval.max(Duration::from_millis(500))) => {}
        }
    }
}

/// Cancels `shutdown` on Ctrl-C, SIGTERM, or end of standard input.
async fn stop_on_signal(shutdown: CancellationToken) {
    use tokio::io::AsyncReadExt as _;
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = match signal(SignalKind::terminate()) {
        Ok(terminate) => terminate,
        Err(error) => {
            tracing::error!(%error, "cannot listen for SIGTERM");
            return;
        }
    };
    let stdin_closed = async {
        let mut stdin = tokio::io::stdin();
        let mut buf = [0_u8; 64];
        while let Ok(n) = stdin.read(&mut buf).await {
            if n == 0 {
                break;
            }
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
        () = stdin_closed => {}
    }
    shutdown.cancel();
}
