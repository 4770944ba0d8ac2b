//! The election mode: one [`Elector`] on the leader lock, printing `lead` and `follow`, and the
//! commands that starve its pool (`hog`, `unhog`) or run work as its leader (`work`).

use std::any::Any;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use plexsphere_leader::Elector;
use plexsphere_leader::config::AcquireMode;
use plexsphere_leader::leadership::TermEvents;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::{ChildArgs, Controls, Mechanism, Out, TermRecords, commands, emit_terms, follow_terms};
use crate::BackendPool;

/// How long the exit probe waits for a pooled connection.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long `hog` waits for each connection.
const HOG_TIMEOUT: Duration = Duration::from_secs(5);

/// Runs the elector until `shutdown`, then prints the `exit` record with the pool's state.
pub(super) async fn run(
    args: &ChildArgs,
    out: &Arc<Out>,
    shutdown: CancellationToken,
) -> Result<(), String> {
    let (elector, pool) = build(args)?;
    let terms = Arc::new(Mutex::new(TermEvents::new()));
    tokio::spawn(follow_terms(
        elector.clone(),
        TermRecords::Election,
        Arc::clone(out),
        Arc::clone(&terms),
    ));
    tokio::spawn(commands(
        Arc::clone(out),
        shutdown.clone(),
        Controls::Election {
            elector: elector.clone(),
            pool: pool.clone(),
        },
    ));
    out.emit(
        "ready",
        json!({ "interval_ms": args.interval.as_millis() as u64 }),
    );
    let result = elector.run(shutdown).await;
    // The end of the last term before the exit record, whether or not the watcher woke yet.
    emit_terms(out, TermRecords::Election, &terms, &elector.leadership());
    report_exit(out, &pool, result.map_err(|e| e.to_string())).await;
    Ok(())
}

fn build(args: &ChildArgs) -> Result<(Elector, BackendPool), String> {
    let pool = args.pool(&args.session_config()?)?;
    let mode = if args.queued {
        AcquireMode::Queue
    } else {
        AcquireMode::Poll
    };
    let mut config = pool
        .config()
        .check_interval(args.interval)
        .acquire_mode(mode)
        .identity(&args.name);
    if args.mechanism == Mechanism::Lease {
        config = config.lease(Duration::ZERO);
    }
    if let Some(version) = &args.version {
        config = config.version(version);
    }
    if let Some(priority) = args.priority {
        config = config.priority(priority);
    }
    config = config
        .version_floor(args.version_floor)
        .below_version_floor(args.below_version_floor);
    let elector = Elector::new(config).map_err(|e| e.to_string())?;
    Ok((elector, pool))
}

/// The pool's state once `run` returned, then a probe that it still serves a connection.
async fn report_exit(out: &Out, pool: &BackendPool, run: Result<(), String>) {
    let (size, available, waiting) = (pool.size(), pool.idle(), pool.waiting());
    let probe = tokio::time::timeout(PROBE_TIMEOUT, pool.probe())
        .await
        .unwrap_or_else(|_| Err("timed out".into()));
    out.emit(
        "exit",
        json!({
            "run": run.err(),
            "pool_size": size,
            "pool_available": available,
            "pool_waiting": waiting,
            "pool_ok": probe.is_ok(),
            "pool_error": probe.err(),
        }),
    );
}

/// The pool connections the `hog` command holds.
#[derive(Default)]
pub(super) struct Hogged(Vec<Box<dyn Any + Send>>);

impl Hogged {
    /// Takes `n` more connections out of `pool`, each waited for up to `HOG_TIMEOUT`.
    pub(super) async fn take(&mut self, pool: &BackendPool, n: u64) {
        for _ in 0..n {
            match tokio::time::timeout(HOG_TIMEOUT, pool.hold()).await {
                Ok(Ok(object)) => self.0.push(object),
                Ok(Err(e)) => eprintln!("plx-replica: hog: {e}"),
                Err(_) => eprintln!("plx-replica: hog: no connection within {HOG_TIMEOUT:?}"),
            }
        }
    }

    /// How many are held.
    pub(super) fn len(&self) -> usize {
        self.0.len()
    }

    /// Gives every one back; how many that was.
    pub(super) fn release(&mut self) -> usize {
        let n = self.0.len();
        self.0.clear();
        n
    }
}

/// How long between two of [`believe`]'s samples counts as a pause of the process.
const PAUSE: Duration = Duration::from_millis(50);

/// Asks `is_leader()` every millisecond from a thread of its own, as a service's thread would,
/// and prints `believes` with the answer whenever it changes, and `resumed` with the first
/// answer after a pause of the process (no sample for longer than [`PAUSE`]: a SIGSTOP, a
/// frozen VM). Its own thread, so that it answers while the runtime the driver runs on is
/// stalled ([`stall`]) and right as a paused process resumes, before the driver ran: what
/// the service would have acted on. A measuring instrument of the harness, not a pattern for
/// services (which await `subscribe`).
pub(super) fn believe(elector: Elector, out: Arc<Out>) {
    std::thread::spawn(move || {
        let mut last: Option<(bool, std::time::Instant)> = None;
        loop {
            let leader = elector.is_leader();
            let now = std::time::Instant::now();
            if let Some((_, at)) = last
                && now.duration_since(at) > PAUSE
            {
                let gap_ms = now.duration_since(at).as_millis() as u64;
                out.emit("resumed", json!({ "leader": leader, "gap_ms": gap_ms }));
            }
            if last.is_none_or(|(was, _)| was != leader) {
                out.emit("believes", json!({ "leader": leader }));
            }
            last = Some((leader, now));
            std::thread::sleep(Duration::from_millis(1));
        }
    });
}

/// Blocks the child's runtime (one thread) for `ms`: nothing of the election runs meanwhile,
/// as in a runtime stalled by blocking work; prints `stalled` before and `unstalled` after.
pub(super) fn stall(out: &Out, ms: u64) {
    out.emit("stalled", json!({ "ms": ms }));
    std::thread::sleep(Duration::from_millis(ms));
    out.emit("unstalled", json!({ "ms": ms }));
}

/// One pass through `run_if_leader` that sleeps `ms` and ignores the term's cancellation.
pub(super) async fn work(elector: Elector, out: Arc<Out>, ms: u64) {
    let parent = CancellationToken::new();
    let ran = elector
        .run_if_leader(&parent, |_ignored| {
            let out = Arc::clone(&out);
            let term = elector.leadership().term().map(|t| t.id.get());
            async move {
                out.emit("work_start", json!({ "term": term }));
                tokio::time::sleep(Duration::from_millis(ms)).await;
                out.emit("work_end", json!({ "term": term }));
                Ok::<_, Infallible>(())
            }
        })
        .await;
    let ran = match ran {
        Ok(ran) => ran,
        Err(never) => match never {},
    };
    out.emit("work_result", json!({ "ran": ran }));
}
