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

use crate::cli::{Args, DSN_ENV, Mechanism, sse_nonce_ttl_from_env};
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
                plexsphere_leader::RunError::SessionsMultiplexed(_) => {
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

/// Wires every loop of the spec's three tables under its own name and placement. Every ticked
/// loop ticks once per check interval, except `sse-nonce-sweep`: once per nonce TTL.
fn wire_loops(
    elector: &Elector,
    background: &mut Background,
    pool: &Pool,
    me: &Me,
    metrics: &TickMetrics,
    sharded: bool,
) -> Result<(), plexsphere_leader_service::loops::WiringError> {
    for (name, probe) in TICKED {
        let period = if name == passes::SSE_NONCE_SWEEP {
            me.nonce_ttl
        } else {
            me.interval
        };
        let pass = ticked_pass(pool.clone(), name, me.actor.clone(), period, sharded);
        let mut ticker = LeaderTicker::new(name, elector.clone(), period, pass)
            .at_boot()
            .metrics(metrics);
        if let Some(probe) = probe {
            ticker = ticker.probe(probe);
        }
        background.ticker(ticker)?;
    }

    background.while_leader(WhileLeader::new(
        "audit-archiver",
        elector.clone(),
        self_paced(pool.clone(), me.interval, |client| {
            Box::pin(async move { passes::archive_audit(&**client).await })
        }),
    ))?;
    background.while_leader(WhileLeader::new(
        "authz-outbox-consumer",
        elector.clone(),
        self_paced(pool.clone(), me.interval / 2, |client| {
            Box::pin(async move { passes::mirror_outbox(&**client).await })
        }),
    ))?;

    let period = me.interval;
    background.every_replica(EveryReplica::new(
        "capacity-collector",
        period,
        capacity_collector(pool.clone(), me.actor.clone(), Gate::leader(elector)),
    ))?;
    let deletion_gate = Gate::leader(elector);
    for durable in DURABLES {
        let name = format!("observability-routing-consume/{durable}");
        let pass = consume_loop(pool.clone(), durable, deletion_gate.clone());
        background.every_replica(EveryReplica::new(&name, period, pass))?;
    }
    // Each step also spends from this replica's rate budget (its bucket is its
    // application_name, so a restarted replica leaves its old bucket to `rate-budget-sweep`).
    let relay = {
        let pool = pool.clone();
        let bucket: Arc<str> = me.application_name.as_str().into();
        pass_fn(move |_shutdown: CancellationToken| {
            let (pool, bucket) = (pool.clone(), Arc::clone(&bucket));
            async move {
                let mut client = pool.get().await?;
                passes::spend_rate_budget(&**client, &bucket).await?;
                passes::relay(&mut client).await?;
                Ok::<(), BoxError>(())
            }
        })
    };
    background.every_replica(EveryReplica::new("sse-relay", period, relay))?;
    background.every_replica(EveryReplica::new(
        "sse-signing-key-rotation-watcher",
        period,
        key_watcher(pool.clone()),
    ))?;
    let ready = Arc::new(AtomicBool::new(false));
    let heartbeat = pass_fn(move |_shutdown: CancellationToken| {
        // It re-flips a local readiness flag and takes no write.
        ready.store(true, Ordering::Relaxed);
        async { Ok::<(), BoxError>(()) }
    });
    background.every_replica(EveryReplica::new("peers-relay-assigner", period, heartbeat))?;
    Ok(())
}

/// The pass of a ticked loop: seed, sweep (compare-and-set), prune; stops with its term. With
/// `--shards` the shard owners sweep instead ([`crate::shards`]).
fn ticked_pass(
    pool: Pool,
    name: &'static str,
    actor: String,
    period: Duration,
    sharded: bool,
) -> plexsphere_leader_service::loops::PassFn {
    pass_fn(move |token: CancellationToken| {
        let (pool, actor) = (pool.clone(), actor.clone());
        async move {
            let work = async {
                let client = pool.get().await?;
                if sharded {
                    passes::ticked_pass_sharded(&**client, name, period).await?;
                } else {
                    passes::ticked_pass(&**client, name, &actor, period).await?;
                }
                Ok::<(), BoxError>(())
            };
            tokio::select! {
                () = token.cancelled() => Ok(()),
                result = work => result,
            }
        }
    })
}

type Step =
    fn(
        deadpool_postgres::Object,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<u64, tokio_postgres::Error>> + Send>>;

/// A self-paced while-leader loop: runs `step` until it moves nothing, then waits `pause`; ends
/// when the term's token is cancelled.
fn self_paced(pool: Pool, pause: Duration, step: Step) -> plexsphere_leader_service::loops::PassFn {
    pass_fn(move |token: CancellationToken| {
        let pool = pool.clone();
        async move {
            loop {
                let client = tokio::select! {
                    () = token.cancelled() => return Ok(()),
                    client = pool.get() => client?,
                };
                let moved = tokio::select! {
                    () = token.cancelled() => return Ok(()),
                    moved = step(client) => moved?,
                };
                if moved == 0 {
                    tokio::select! {
                        () = token.cancelled() => return Ok::<(), BoxError>(()),
                        () = tokio::time::sleep(pause) => {}
                    }
                }
            }
        }
    })
}

/// Every replica samples and tracks the same hysteresis; only the audit row of a crossing is
/// gated. One pass per tick of its [`EveryReplica`].
fn capacity_collector(pool: Pool, actor: String, gate: Gate) -> PassFn {
    const HIGH: i64 = 30;
    const LOW: i64 = 15;
    let above = Arc::new(Mutex::new(false));
    pass_fn(move |_shutdown: CancellationToken| {
        let (pool, actor, gate, above) = (
            pool.clone(),
            actor.clone(),
            gate.clone(),
            Arc::clone(&above),
        );
        async move {
            let client = pool.get().await?;
            let pending = passes::pending(&**client).await?;
            let crossed = {
                let mut above = above.lock().unwrap_or_else(PoisonError::into_inner);
                let next = if *above {
                    pending > LOW
                } else {
                    pending >= HIGH
                };
                let crossed = next != *above;
                *above = next;
                crossed.then_some(next)
            };
            if let Some(now_above) = crossed
                && gate.allows()
            {
                passes::record_crossing(&**client, &actor, now_above, pending).await?;
            }
            Ok::<(), BoxError>(())
        }
    })
}

/// Each replica drains its share of a durable; only the durable removals are gated.
fn consume_loop(pool: Pool, durable: &'static str, gate: Gate) -> PassFn {
    pass_fn(move |_shutdown: CancellationToken| {
        let (pool, gate) = (pool.clone(), gate.clone());
        async move {
            let client = pool.get().await?;
            passes::consume(&**client, durable).await?;
            if gate.allows() {
                passes::remove_orphaned_durables(&**client).await?;
            }
            Ok::<(), BoxError>(())
        }
    })
}

/// Every replica keeps its own in-memory key cache and invalidates it when the key generation
/// (here: the relay cursor's row, read only) changes.
fn key_watcher(pool: Pool) -> PassFn {
    let cached = Arc::new(Mutex::new(None::<i64>));
    pass_fn(move |_shutdown: CancellationToken| {
        let (pool, cached) = (pool.clone(), Arc::clone(&cached));
        async move {
            let client = pool.get().await?;
            let row = client
                .query_typed_one(
                    "SELECT position FROM plexsphere_demo.cursors WHERE name = 'sse-relay'",
                    &[],
                )
                .await?;
            let generation: i64 = row.try_get(0)?;
            let mut cached = cached.lock().unwrap_or_else(PoisonError::into_inner);
            if *cached != Some(generation) {
                *cached = Some(generation);
            }
            Ok::<(), BoxError>(())
        }
    })
}

/// Prints one line per leadership change of this replica (stdout, one `write` per line), from
/// the elector's published leadership: no polling, and the typed cause of each term's end.
async fn print_leadership(elector: Elector, me: Me, watch: CancellationToken) {
    let mut published = elector.subscribe();
    let mut events = Printed::default();
    loop {
        let leadership = *published.borrow_and_update();
        print_events(&me, &mut events, &leadership);
        tokio::select! {
            () = watch.cancelled() => break,
            changed = published.changed() => if changed.is_err() { break },
        }
    }
    // What the stop published before the watch ended (the release).
    print_events(&me, &mut events, &elector.leadership());
}

/// What [`print_events`] already printed.
#[derive(Default)]
struct Printed {
    terms: TermEvents,
    release: Option<TermId>,
}

/// Prints the term begins and ends `leadership` implies, then the release of a stopped term
/// once the elector knows what the unlock did: `event=released` when the server released it,
/// else `event=release-failed` with the outcome (the lock may be left for the server to free).
fn print_events(me: &Me, printed: &mut Printed, leadership: &Leadership) {
    for event in printed.terms.read(leadership) {
        let text = match event {
            TermEvent::Began(term) => format!("event=acquired term={}", term.id),
            // The stop's line waits for its release below.
            TermEvent::Ended(TermEnd {
                cause: TermEndCause::Stopped,
                ..
            }) => continue,
            TermEvent::Ended(end) => match end.cause {
                TermEndCause::Resigned => {
                    format!(
                        "event=resigned term={} cause=\"leadership resigned\"",
                        end.id
                    )
                }
                TermEndCause::Lost(reason) => format!(
                    "event=lost term={} reason={} cause={:?}",
                    end.id,
                    reason.label(),
                    end.cause.to_string()
                ),
                other => format!("event=ended term={} cause={:?}", end.id, other.to_string()),
            },
            TermEvent::EndMissed(id) => format!("event=ended term={id} cause=\"not seen\""),
            other => format!("event=term-event detail={other:?}"),
        };
        line(me, &text);
    }
    let stopped = leadership
        .last_end()
        .filter(|end| end.cause == TermEndCause::Stopped);
    let release = leadership
        .last_release()
        .filter(|release| stopped.is_some_and(|end| end.id == release.term))
        .filter(|release| printed.release != Some(release.term));
    if let Some(release) = release {
        printed.release = Some(release.term);
        line(me, &release_line(release));
    }
}

/// The line of a stopped term's release.
fn release_line(release: Release) -> String {
    if release.outcome == ReleaseOutcome::Released {
        return format!(
            "event=released term={} cause=\"election stopped: {}\"",
            release.term, release.outcome
        );
    }
    format!(
        "event=release-failed term={} outcome={} cause=\"election stopped: {}\"",
        release.term,
        release.outcome.label(),
        release.outcome
    )
}

fn line(me: &Me, event: &str) {
    let text = format!("[demo] replica={} pid={} {event}\n", me.index, me.pid);
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes());
    let _ = out.flush();
}

#[derive(Clone)]
struct StatusState {
    me: Me,
    elector: Option<Elector>,
    readiness: Readiness,
    workers: Arc<[(String, Placement)]>,
}

/// What `/readyz`, `/livez` and `/metrics` report, and the workers `/status` lists.
struct Probes {
    readiness: Readiness,
    liveness: Liveness,
    registry: Registry,
    /// The supervisor's workers with where each runs, in registration order (empty without a
    /// database).
    workers: Arc<[(String, Placement)]>,
}

async fn serve(
    args: &Args,
    me: &Me,
    probes: Probes,
    elector: Option<Elector>,
    sharded: Option<plexsphere_leader::sharded::ShardedElector>,
    shutdown: &CancellationToken,
) -> Result<tokio::task::JoinHandle<()>, Error> {
    let port = args
        .http_port
        .checked_add(me.index)
        .ok_or("--http-port plus the replica index exceeds 65535")?;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .map_err(|e| format!("bind 127.0.0.1:{port}: {e}"))?;
    let status = Router::new()
        .route("/status", get(status))
        .route("/resign", post(resign))
        .route("/eligible", post(eligible))
        .route("/ineligible", post(ineligible))
        .with_state(StatusState {
            me: me.clone(),
            elector,
            readiness: probes.readiness.clone(),
            workers: probes.workers,
        });
    let app =
        plexsphere_leader_service::http::router(probes.readiness, probes.liveness, probes.registry)
            .merge(status)
            .merge(crate::shards::router(sharded, me.application_name.clone()));
    let stop = shutdown.clone();
    Ok(tokio::spawn(async move {
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await;
        if let Err(error) = served {
            tracing::error!(%error, "HTTP server failed");
        }
    }))
}

async fn status(State(state): State<StatusState>) -> impl IntoResponse {
    let is_leader = state.elector.as_ref().is_some_and(Elector::is_leader);
    let term = state
        .elector
        .as_ref()
        .and_then(|elector| elector.leadership().term())
        .map(|t| t.id)
        .map(|t| t.get());
    // Who leads, asked of the server from whichever replica answers (any replica can tell).
    let leader = match &state.elector {
        Some(elector) => tokio::time::timeout(Duration::from_secs(2), elector.who_leads())
            .await
            .ok()
            .and_then(Result::ok)
            .flatten(),
        None => None,
    };
    let lock_backend_pid = leader
        .as_ref()
        .filter(|leader| {
            is_leader && leader.identity.as_deref() == Some(&state.me.application_name)
        })
        .map(|leader| leader.pid);
    let leader = leader.map(|leader| {
        json!({
            "identity": leader.identity,
            "pid": leader.pid,
            "since": leader.since.at().map(plexsphere_leader_cli::format_utc),
            "leading_for_seconds": leader.leading_for().map(|d| d.as_secs()),
            "client_addr": leader.client_addr,
            "client_port": leader.client_port,
        })
    });
    // Who holds the lease, and until when (the lease mechanism: pg_locks shows no lock).
    let lease = match &state.elector {
        Some(elector) if elector.holds_a_lease() => {
            tokio::time::timeout(Duration::from_secs(2), elector.lease_holder())
                .await
                .ok()
                .and_then(Result::ok)
                .flatten()
        }
        _ => None,
    };
    let lease = lease.map(|lease| {
        json!({
            "holder": lease.holder,
            "identity": lease.identity,
            "epoch": lease.epoch,
            "expires_at": plexsphere_leader_cli::format_utc(lease.expires_at),
            "held": lease.held,
        })
    });
    let live = state
        .elector
        .as_ref()
        .map(|elector| elector.liveness().map_err(|stuck| stuck.to_string()));
    let body = json!({
        "replica": state.me.index,
        "pid": state.me.pid,
        "key": state.elector.as_ref().map(|elector| elector.key().to_string()),
        "is_leader": is_leader,
        "eligible": state.elector.as_ref().map(Elector::is_eligible),
        "fit": state.elector.as_ref().map(Elector::is_fit),
        "term": term,
        "epoch": state
            .elector
            .as_ref()
            .and_then(|elector| elector.leadership().term())
            .and_then(|term| term.epoch),
        "lock_backend_pid": lock_backend_pid,
        "leader": leader,
        "lease": lease,
        "live": live.as_ref().map(Result::is_ok),
        "stuck": live.and_then(Result::err),
        "check_failure": state.elector.as_ref().and_then(Elector::check_failure).map(|failure| {
            json!({
                "class": failure.class.label(),
                "failures": failure.failures,
                "failing_for_seconds": failure.since.elapsed().as_secs(),
                "error": failure.error,
                "advice": failure.advice,
            })
        }),
        // What the replica waits for before its election starts (`null` once it runs).
        "waiting_for": state
            .me
            .waiting
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone(),
        "application_name": state.me.application_name,
        "check_interval_ms": u64::try_from(state.me.interval.as_millis()).unwrap_or(u64::MAX),
        "ready": state.readiness.report().is_ready(),
        "database": state.elector.is_some(),
        "workers": state.workers.iter().map(|(name, _)| name).collect::<Vec<_>>(),
        "placement": state
            .workers
            .iter()
            .map(|(name, placement)| (name.clone(), json!(placement.label())))
            .collect::<serde_json::Map<_, _>>(),
        "probes": state.readiness.names(),
        "sse_nonce_ttl_ms": u64::try_from(state.me.nonce_ttl.as_millis()).unwrap_or(u64::MAX),
    });
    (
        [(header::CONTENT_TYPE, "application/json")],
        format!("{body}\n"),
    )
}

/// `POST /resign`: the operator control; the leader releases the lock and sits its hold-off out.
async fn resign(State(state): State<StatusState>) -> impl IntoResponse {
    let outcome = state.elector.as_ref().map(Elector::resign);
    let text = match outcome {
        Some(Resignation::Requested) => "resign requested\n",
        Some(Resignation::NotRunning) => "the election is not running\n",
        Some(_) => "resign: an outcome this demo does not know\n",
        None => "no elector: no database\n",
    };
    line(
        &state.me,
        &format!("event=resign-requested outcome={:?}", text.trim_end()),
    );
    ([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], text)
}

/// `POST /eligible`: this replica may lead again.
async fn eligible(State(state): State<StatusState>) -> impl IntoResponse {
    set_eligibility(&state, true)
}

/// `POST /ineligible`: this replica never leads (a leader resigns) until made eligible.
async fn ineligible(State(state): State<StatusState>) -> impl IntoResponse {
    set_eligibility(&state, false)
}

fn set_eligibility(state: &StatusState, eligible: bool) -> impl IntoResponse + use<> {
    if let Some(elector) = &state.elector {
        elector.set_eligible(eligible);
    }
    line(&state.me, &format!("event=eligibility eligible={eligible}"));
    (
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        format!("eligible={eligible}\n"),
    )
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

/// Logs to stderr, each line prefixed with `replica <i> | `; `RUST_LOG` overrides the default
/// filter (`warn`).
fn init_logs(index: u16) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"));
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(Prefixed(format!("replica {index} | ")))
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_filter(filter);
    let _ = tracing_subscriber::registry().with(fmt).try_init();
}

struct Prefixed(String);

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Prefixed {
    type Writer = PrefixedWriter;

    fn make_writer(&'a self) -> Self::Writer {
        PrefixedWriter {
            buf: self.0.clone().into_bytes(),
        }
    }
}

/// Collects one event, then writes it to stderr with one `write` when dropped.
struct PrefixedWriter {
    buf: Vec<u8>,
}

impl std::io::Write for PrefixedWriter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for PrefixedWriter {
    fn drop(&mut self) {
        let _ = std::io::stderr().lock().write_all(&self.buf);
    }
}
