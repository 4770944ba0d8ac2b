//! The supervisor: runs the service's background workers, restarts a failed one within its
//! restart budget, and stops them all on shutdown.
//!
//! Workers are registered by unique name (the election is the worker `background-leader`) and
//! started together by [`Supervisor::start`], just before the service serves. A worker that
//! returns an error or panics is restarted after a backoff, within the budget of
//! [`RestartPolicy`] (by default at most 5 restarts within any 60 s, backing off from 100 ms,
//! doubling, capped at 10 s). One that exhausts its budget stays stopped and fails the
//! [`WorkersProbe`] (`workers` on `/readyz`); so does, at once, one whose error is marked
//! [`Permanent`](crate::Permanent) (the election's run ending with a permanent
//! `RunError`: a pool that multiplexes sessions, a lock table too small for a shard space).
//! A failure caused by a lost or refused connection ([`is_unavailable`](crate::is_unavailable))
//! spends no budget: the worker is restarted after a backoff capped at
//! [`UNAVAILABLE_MAX_BACKOFF`] for as long as the outage lasts, so no database outage, pooler
//! restart or failover stops a worker for good. A worker that returns `Ok` has finished and is
//! not restarted. [`RunningWorkers::shutdown`] cancels every worker and waits for them, with a
//! bound; a worker still running at the bound is aborted (its future dropped).

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use plexsphere_leader::Elector;
use plexsphere_leader_core::supervision::{
    Decision, Exit, RestartBudget, RestartPolicy, WorkerState, workers_probe,
};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::panic::CatchPanic;
use crate::readiness::Probe;
use crate::task::{BoxError, BoxFuture};

/// How long [`RunningWorkers::shutdown`] waits by default: more than the election's 2-second
/// unlock budget. A supervisor that runs an elector waits [`shutdown_bound`] instead, which also
/// covers the elector's stop grace.
pub const DEFAULT_SHUTDOWN_BOUND: Duration = Duration::from_secs(5);

/// Slack of [`shutdown_bound`] beyond the elector's own stop budget: scheduling, and the close
/// after the unlock.
pub const SHUTDOWN_SLACK: Duration = Duration::from_secs(1);

/// The shutdown bound for a supervisor that runs `elector`: [`DEFAULT_SHUTDOWN_BOUND`], or the
/// elector's [`stop_budget`](Elector::stop_budget) (its stop grace, then the unlock) plus
/// [`SHUTDOWN_SLACK`], whichever is longer, so that a graceful stop of a leader whose work is
/// slow to drain still unlocks before the supervisor aborts it (with the defaults, 5 s of grace
/// and 2 s of unlock: 8 s, where the fixed 5 s aborted the unlock and left the lock to
/// `idle_session_timeout`).
pub fn shutdown_bound(elector: &Elector) -> Duration {
    DEFAULT_SHUTDOWN_BOUND.max(elector.stop_budget() + SHUTDOWN_SLACK)
}

/// The name of the supervisor's readiness probe.
pub const WORKERS_PROBE: &str = "workers";

/// The longest backoff before restarting a worker whose run failed for a lost or refused
/// connection ([`is_unavailable`](crate::is_unavailable)): such restarts spend no restart
/// budget, and the backoff (from the policy's first backoff, doubling) stops growing here so
/// that a worker resumes within about a second of the database's return.
pub const UNAVAILABLE_MAX_BACKOFF: Duration = Duration::from_secs(1);

/// How often, at most, a worker that keeps failing for a lost or refused connection logs a WARN
/// line after the first one.
const UNAVAILABLE_LOG_INTERVAL: Duration = Duration::from_secs(60);

type WorkerFn = Box<dyn FnMut(CancellationToken) -> BoxFuture<Result<(), BoxError>> + Send>;

/// Called with the cause when a worker stops for good (budget exhausted, or a permanent error).
pub(crate) type StopHook = Arc<dyn Fn(&str) + Send + Sync>;

struct Worker {
    name: String,
    start: WorkerFn,
    on_stopped_for_good: Option<StopHook>,
}
type States = Arc<Mutex<BTreeMap<String, WorkerState<String>>>>;

/// Two workers may not share a name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a background worker named {0:?} is already registered")]
pub struct DuplicateWorker(pub String);

/// The background workers of a service, before they start.
pub struct Supervisor {
    policy: RestartPolicy,
    workers: Vec<Worker>,
    states: States,
}

impl Default for Supervisor {
    fn default() -> Self {
        Self::new(RestartPolicy::default())
    }
}

impl Supervisor {
    /// A supervisor with the restart budget `policy`.
    pub fn new(policy: RestartPolicy) -> Self {
        Self {
            policy,
            workers: Vec::new(),
            states: Arc::default(),
        }
    }

    /// Registers a worker: `start` is called with a cancellation token each time the worker
    /// (re)starts, and the future it returns is the worker's run. The run should return `Ok(())`
    /// soon after the token is cancelled.
    ///
    /// # Errors
    /// [`DuplicateWorker`] when the name is taken.
    pub fn add<F, Fut, E>(
        &mut self,
        name: impl Into<String>,
        mut start: F,
    ) -> Result<(), DuplicateWorker>
    where
        F: FnMut(CancellationToken) -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: Into<BoxError> + 'static,
    {
        let name = name.into();
        if self.contains(&name) {
            return Err(DuplicateWorker(name));
        }
        let start: WorkerFn = Box::new(move |token| {
            let run = start(token);
            Box::pin(async move { run.await.map_err(Into::into) })
        });
        self.lock().insert(name.clone(), WorkerState::Registered);
        self.workers.push(Worker {
            name,
            start,
            on_stopped_for_good: None,
        });
        Ok(())
    }

    /// Calls `hook` with the cause when the worker `name` stops for good (its budget exhausted,
    /// or a permanent error): what makes a leader whose while-leader loop stopped resign.
    pub(crate) fn on_stopped_for_good(&mut self, name: &str, hook: StopHook) {
        if let Some(worker) = self.workers.iter_mut().find(|w| w.name == name) {
            worker.on_stopped_for_good = Some(hook);
        }
    }

    /// Whether a worker is registered under `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.workers.iter().any(|worker| worker.name == name)
    }

    /// The registered names, in registration order.
    pub fn names(&self) -> Vec<String> {
        self.workers
            .iter()
            .map(|worker| worker.name.clone())
            .collect()
    }

    /// How many workers are registered.
    pub fn len(&self) -> usize {
        self.workers.len()
    }

    /// Whether no worker is registered.
    pub fn is_empty(&self) -> bool {
        self.workers.is_empty()
    }

    /// The `workers` readiness probe of this supervisor's workers.
    pub fn probe(&self) -> WorkersProbe {
        WorkersProbe {
            states: Arc::clone(&self.states),
        }
    }

    /// Starts every worker, each in its own task. `shutdown` cancelled, or
    /// [`RunningWorkers::shutdown`], stops them.
    pub fn start(self, shutdown: &CancellationToken) -> RunningWorkers {
        let token = shutdown.child_token();
        let mut tasks = JoinSet::new();
        for worker in self.workers {
            tasks.spawn(supervise(
                worker,
                token.clone(),
                self.policy,
                Arc::clone(&self.states),
            ));
        }
        RunningWorkers {
            tasks,
            token,
            states: self.states,
        }
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, WorkerState<String>>> {
        lock(&self.states)
    }
}

impl fmt::Debug for Supervisor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Supervisor")
            .field("policy", &self.policy)
            .field("workers", &self.names())
            .finish()
    }
}

/// The started workers.
#[derive(Debug)]
pub struct RunningWorkers {
    tasks: JoinSet<()>,
    token: CancellationToken,
    states: States,
}

/// What a shutdown left behind.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ShutdownReport {
    /// The workers still running at the bound, which were aborted.
    pub aborted: Vec<String>,
}

impl RunningWorkers {
    /// The `workers` readiness probe.
    pub fn probe(&self) -> WorkersProbe {
        WorkersProbe {
            states: Arc::clone(&self.states),
        }
    }

    /// The state of every worker, by name.
    pub fn states(&self) -> BTreeMap<String, WorkerState<String>> {
        lock(&self.states).clone()
    }

    /// Waits until every worker has stopped for good (finished, exhausted, or stopped by the
    /// shutdown). Cancel-safe.
    pub async fn stopped(&mut self) {
        while self.tasks.join_next().await.is_some() {}
    }

    /// Cancels every worker and waits for them, at most `bound`; those still running then are
    /// aborted and named in the report.
    pub async fn shutdown(mut self, bound: Duration) -> ShutdownReport {
        self.token.cancel();
        let all = async { while self.tasks.join_next().await.is_some() {} };
        if tokio::time::timeout(bound, all).await.is_ok() {
            return ShutdownReport::default();
        }
        self.tasks.abort_all();
        let aborted: Vec<String> = lock(&self.states)
            .iter()
            .filter(|(_, state)| matches!(state, WorkerState::Running { .. }))
            .map(|(name, _)| name.clone())
            .collect();
        tracing::warn!(
            target: "plexsphere_leader",
            workers = ?aborted,
            bound = ?bound,
            "background workers did not stop within the shutdown bound; aborted"
        );
        ShutdownReport { aborted }
    }
}

/// The `workers` readiness probe: fails while any worker has exhausted its restart budget,
/// with the text `background workers stopped after exhausting their restart budget: <names>`
/// (a worker given up after a permanent failure, [`Permanent`](crate::Permanent), is named
/// there too).
#[derive(Clone)]
pub struct WorkersProbe {
    states: States,
}

impl Probe for WorkersProbe {
    fn check(&self) -> Result<(), String> {
        let states = lock(&self.states);
        workers_probe(states.iter().map(|(name, state)| (name.as_str(), state))).map_err(|names| {
            format!(
                "background workers stopped after exhausting their restart budget: {}",
                names.join(", ")
            )
        })
    }
}

impl fmt::Debug for WorkersProbe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("WorkersProbe")
            .field(&*lock(&self.states))
            .finish()
    }
}

fn lock(states: &States) -> MutexGuard<'_, BTreeMap<String, WorkerState<String>>> {
    states.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Runs one worker until it finishes, exhausts its budget, or the token is cancelled.
async fn supervise(
    worker: Worker,
    token: CancellationToken,
    policy: RestartPolicy,
    states: States,
) {
    let Worker {
        name,
        mut start,
        on_stopped_for_good,
    } = worker;
    let mut budget = RestartBudget::new(policy);
    let mut outage = Outage::default();
    let mut restarts = 0_u32;
    let set = |state| {
        lock(&states).insert(name.clone(), state);
    };
    let stopped_for_good = |exit: &Exit<String>| {
        if let Some(hook) = &on_stopped_for_good {
            hook(&describe(exit));
        }
    };
    loop {
        set(WorkerState::Running { restarts });
        let began = tokio::time::Instant::now();
        let Ended { exit, unavailable } = run_once(&name, &mut start, &token).await;
        let now = tokio::time::Instant::now();
        if unavailable {
            // A lost or refused connection: restarted for as long as the outage lasts, and
            // never counted against the budget.
            let after = outage.failed(&name, &exit, policy, now, now - began);
            set(WorkerState::BackingOff { last: exit });
            if !back_off(&token, after).await {
                set(WorkerState::Stopped);
                return;
            }
            restarts += 1;
            continue;
        }
        outage = Outage::default();
        match budget.on_exit(now.into_std(), &exit) {
            Decision::Restart { after, restart } => {
                tracing::warn!(
                    target: "plexsphere_leader",
                    worker = %name,
                    cause = %describe(&exit),
                    restart,
                    backoff = ?after,
                    "background worker failed, restarting: {}",
                    describe(&exit)
                );
                set(WorkerState::BackingOff { last: exit });
                if !back_off(&token, after).await {
                    set(WorkerState::Stopped);
                    return;
                }
                restarts += 1;
            }
            Decision::Stop => {
                set(WorkerState::Stopped);
                return;
            }
            Decision::GiveUp => {
                tracing::error!(
                    target: "plexsphere_leader",
                    worker = %name,
                    cause = %describe(&exit),
                    "background worker failed for good and stays stopped (not restarted: its \
                     error is permanent): {}",
                    describe(&exit)
                );
                stopped_for_good(&exit);
                set(WorkerState::GaveUp { last: exit });
                return;
            }
            Decision::Exhausted => {
                tracing::error!(
                    target: "plexsphere_leader",
                    worker = %name,
                    cause = %describe(&exit),
                    max_restarts = policy.max_restarts,
                    window = ?policy.window,
                    "background worker exhausted its restart budget and stays stopped: {}",
                    describe(&exit)
                );
                stopped_for_good(&exit);
                set(WorkerState::Exhausted { last: exit });
                return;
            }
        }
    }
}

/// Waits `after`; `false` when `token` is cancelled first.
async fn back_off(token: &CancellationToken, after: Duration) -> bool {
    tokio::select! {
        () = token.cancelled() => false,
        () = tokio::time::sleep(after) => true,
    }
}

/// A run of failures of one worker caused by lost or refused connections: its backoff and its
/// rate-limited log.
#[derive(Debug, Default)]
struct Outage {
    /// Failures in a row.
    failures: u32,
    /// When the last WARN line was written, and how many failures went unlogged since.
    logged: Option<tokio::time::Instant>,
    unlogged: u32,
}

impl Outage {
    /// Counts a failure of a run that lasted `ran` and returns the backoff before the restart:
    /// the policy's first backoff doubling per failure in a row, at most
    /// [`UNAVAILABLE_MAX_BACKOFF`]. A run that lasted longer than that had its database: its
    /// failure begins a new outage (the doubling and the log start over).
    fn failed(
        &mut self,
        name: &str,
        exit: &Exit<String>,
        policy: RestartPolicy,
        now: tokio::time::Instant,
        ran: Duration,
    ) -> Duration {
        if ran > UNAVAILABLE_MAX_BACKOFF {
            *self = Self::default();
        }
        let capped = RestartPolicy {
            max_backoff: policy.max_backoff.min(UNAVAILABLE_MAX_BACKOFF),
            ..policy
        };
        let after = capped.backoff(self.failures);
        self.failures = self.failures.saturating_add(1);
        let cause = describe(exit);
        match self.logged {
            None => {
                tracing::warn!(
                    target: "plexsphere_leader",
                    worker = %name,
                    cause = %cause,
                    backoff = ?after,
                    "background worker lost its database connection, restarting (not counted \
                     against its restart budget): {cause}"
                );
                self.logged = Some(now);
            }
            Some(at) if now - at >= UNAVAILABLE_LOG_INTERVAL => {
                tracing::warn!(
                    target: "plexsphere_leader",
                    worker = %name,
                    cause = %cause,
                    failures = self.failures,
                    not_logged = self.unlogged,
                    "background worker still cannot reach its database, restarting: {cause}"
                );
                self.logged = Some(now);
                self.unlogged = 0;
            }
            Some(_) => {
                self.unlogged += 1;
                tracing::debug!(
                    target: "plexsphere_leader",
                    worker = %name,
                    cause = %cause,
                    "background worker lost its database connection again, restarting: {cause}"
                );
            }
        }
        after
    }
}

/// How one run ended, and whether a lost or refused connection caused it.
struct Ended {
    exit: Exit<String>,
    unavailable: bool,
}

async fn run_once(name: &str, start: &mut WorkerFn, token: &CancellationToken) -> Ended {
    let run = start(token.child_token());
    let budgeted = |exit| Ended {
        exit,
        unavailable: false,
    };
    match CatchPanic::new(run).await {
        Ok(Ok(())) if token.is_cancelled() => budgeted(Exit::Cancelled),
        Ok(Ok(())) => budgeted(Exit::Finished),
        Ok(Err(error)) if token.is_cancelled() => {
            tracing::warn!(
                target: "plexsphere_leader",
                worker = %name,
                cause = %error,
                "background worker failed while stopping: {error}"
            );
            budgeted(Exit::Cancelled)
        }
        Ok(Err(error)) => {
            let reported = crate::failure::report(error.as_ref());
            let text = match &reported.sqlstate {
                Some(code) => format!("{} (SQLSTATE {code})", reported.text),
                None => reported.text,
            };
            if crate::failure::Permanent::is(error.as_ref()) {
                budgeted(Exit::FailedForGood(text))
            } else {
                Ended {
                    exit: Exit::Failed(text),
                    unavailable: crate::failure::is_unavailable(error.as_ref()),
                }
            }
        }
        Err(caught) => {
            tracing::error!(
                target: "plexsphere_leader",
                worker = %name,
                panic = %caught.value,
                stack = %caught.stack,
                "background worker panicked"
            );
            budgeted(Exit::Panicked(caught.value))
        }
    }
}

fn describe(exit: &Exit<String>) -> String {
    match exit {
        Exit::Failed(error) | Exit::FailedForGood(error) => error.clone(),
        Exit::Panicked(value) => format!("panicked: {value}"),
        Exit::Finished => "finished".to_owned(),
        Exit::Cancelled => "cancelled".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    fn failing(
        counter: Arc<AtomicU32>,
    ) -> impl FnMut(CancellationToken) -> BoxFuture<Result<(), BoxError>> {
        move |_token| {
            let counter = Arc::clone(&counter);
            Box::pin(async move {
                counter.fetch_add(1, Ordering::SeqCst);
                Err::<(), BoxError>("connection refused".into())
            })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_worker_that_keeps_failing_exhausts_its_budget_and_fails_the_workers_probe() {
        let mut supervisor = Supervisor::default();
        let runs = Arc::new(AtomicU32::new(0));
        supervisor
            .add("sweeper", failing(Arc::clone(&runs)))
            .unwrap();
        let probe = supervisor.probe();
        assert_eq!(probe.check(), Ok(()));
        let started = tokio::time::Instant::now();
        let mut running = supervisor.start(&CancellationToken::new());
        running.stopped().await;
        // One first run plus five restarts, after 100+200+400+800+1600 ms of backoff.
        assert_eq!(runs.load(Ordering::SeqCst), 6);
        assert_eq!(started.elapsed(), Duration::from_millis(3100));
        assert_eq!(
            probe.check(),
            Err("background workers stopped after exhausting their restart budget: sweeper".into())
        );
        assert!(matches!(
            running.states()["sweeper"],
            WorkerState::Exhausted {
                last: Exit::Failed(_)
            }
        ));
    }

    /// Issue 49 §7: an outage longer than the budget's backoffs (0.1 + 0.2 + 0.4 + 0.8 + 1.6 s)
    /// exhausted a worker that failed on every connection attempt, for good.
    #[tokio::test(start_paused = true)]
    async fn a_worker_failing_for_a_refused_connection_is_restarted_for_as_long_as_the_outage_lasts()
     {
        let mut supervisor = Supervisor::default();
        let runs = Arc::new(AtomicU32::new(0));
        let up = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (counter, server) = (Arc::clone(&runs), Arc::clone(&up));
        supervisor
            .add("audit-archiver", move |token: CancellationToken| {
                counter.fetch_add(1, Ordering::SeqCst);
                let up = server.load(Ordering::SeqCst);
                async move {
                    if !up {
                        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
                        return Err(BoxError::from(refused));
                    }
                    token.cancelled().await;
                    Ok::<(), BoxError>(())
                }
            })
            .unwrap();
        let probe = supervisor.probe();
        let running = supervisor.start(&CancellationToken::new());
        // Five minutes of outage: restarted all along, backing off 0.1, 0.2, 0.4, 0.8, then 1 s.
        tokio::time::sleep(Duration::from_secs(300)).await;
        // Runs at 0, 0.1, 0.3, 0.7, 1.5 s, then every second until 299.5 s.
        let restarts = runs.load(Ordering::SeqCst);
        assert_eq!(restarts, 5 + 298);
        assert_eq!(probe.check(), Ok(()), "no budget spent");
        // The server is back: the next restart, at most a second later, runs for good.
        up.store(true, Ordering::SeqCst);
        tokio::time::sleep(UNAVAILABLE_MAX_BACKOFF).await;
        let resumed = runs.load(Ordering::SeqCst);
        assert_eq!(resumed, restarts + 1);
        assert!(matches!(
            running.states()["audit-archiver"],
            WorkerState::Running { .. }
        ));
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(runs.load(Ordering::SeqCst), resumed);
        assert_eq!(
            running.shutdown(DEFAULT_SHUTDOWN_BOUND).await,
            ShutdownReport::default()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_worker_that_exhausts_its_budget_calls_its_stop_hook_with_the_cause() {
        let mut supervisor = Supervisor::default();
        supervisor
            .add("sweeper", failing(Arc::new(AtomicU32::new(0))))
            .unwrap();
        let causes = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&causes);
        supervisor.on_stopped_for_good(
            "sweeper",
            Arc::new(move |cause: &str| seen.lock().unwrap().push(cause.to_owned())),
        );
        let mut running = supervisor.start(&CancellationToken::new());
        running.stopped().await;
        assert_eq!(*causes.lock().unwrap(), ["connection refused"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_worker_that_fails_for_good_is_not_restarted_and_fails_the_workers_probe() {
        let mut supervisor = Supervisor::default();
        let runs = Arc::new(AtomicU32::new(0));
        let counter = Arc::clone(&runs);
        supervisor
            .add("background-leader", move |_token| {
                counter.fetch_add(1, Ordering::SeqCst);
                async {
                    Err::<(), BoxError>(crate::Permanent::boxed(std::io::Error::other(
                        "the pool multiplexes server sessions",
                    )))
                }
            })
            .unwrap();
        let probe = supervisor.probe();
        let mut running = supervisor.start(&CancellationToken::new());
        running.stopped().await;
        assert_eq!(runs.load(Ordering::SeqCst), 1, "never restarted");
        assert!(matches!(
            &running.states()["background-leader"],
            WorkerState::GaveUp {
                last: Exit::FailedForGood(text)
            } if text == "the pool multiplexes server sessions"
        ));
        assert!(probe.check().unwrap_err().ends_with(": background-leader"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_panicking_worker_is_restarted_like_a_failed_one() {
        let mut supervisor = Supervisor::default();
        let runs = Arc::new(AtomicU32::new(0));
        let counter = Arc::clone(&runs);
        supervisor
            .add("panicky", move |token: CancellationToken| {
                let n = counter.fetch_add(1, Ordering::SeqCst);
                async move {
                    assert!(n >= 2, "run {n} panics");
                    token.cancelled().await;
                    Ok::<(), BoxError>(())
                }
            })
            .unwrap();
        let probe = supervisor.probe();
        let running = supervisor.start(&CancellationToken::new());
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(runs.load(Ordering::SeqCst), 3);
        assert_eq!(
            running.states()["panicky"],
            WorkerState::Running { restarts: 2 }
        );
        assert_eq!(probe.check(), Ok(()));
        assert_eq!(
            running.shutdown(DEFAULT_SHUTDOWN_BOUND).await,
            ShutdownReport::default()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_finished_worker_is_not_restarted() {
        let mut supervisor = Supervisor::default();
        let runs = Arc::new(AtomicU32::new(0));
        let counter = Arc::clone(&runs);
        supervisor
            .add("once", move |_token| {
                counter.fetch_add(1, Ordering::SeqCst);
                async { Ok::<(), BoxError>(()) }
            })
            .unwrap();
        let mut running = supervisor.start(&CancellationToken::new());
        running.stopped().await;
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        assert_eq!(running.states()["once"], WorkerState::Stopped);
        assert_eq!(running.probe().check(), Ok(()));
    }

    #[test]
    fn worker_names_are_unique() {
        let mut supervisor = Supervisor::default();
        supervisor
            .add("a", |_token| async { Ok::<(), BoxError>(()) })
            .unwrap();
        assert_eq!(
            supervisor.add("a", |_token| async { Ok::<(), BoxError>(()) }),
            Err(DuplicateWorker("a".into()))
        );
        assert_eq!(supervisor.names(), ["a"]);
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_cancels_every_worker_and_aborts_one_that_ignores_it_at_the_bound() {
        let mut supervisor = Supervisor::default();
        supervisor
            .add("polite", |token: CancellationToken| async move {
                token.cancelled().await;
                Ok::<(), BoxError>(())
            })
            .unwrap();
        supervisor
            .add("stubborn", |_token| async {
                std::future::pending::<()>().await;
                Ok::<(), BoxError>(())
            })
            .unwrap();
        let running = supervisor.start(&CancellationToken::new());
        tokio::time::sleep(Duration::from_millis(10)).await;
        let started = tokio::time::Instant::now();
        let report = running.shutdown(Duration::from_secs(2)).await;
        assert_eq!(report.aborted, ["stubborn"]);
        assert_eq!(started.elapsed(), Duration::from_secs(2));
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancelled_parent_stops_the_workers_without_restarts() {
        let mut supervisor = Supervisor::default();
        supervisor
            .add("w", |token: CancellationToken| async move {
                token.cancelled().await;
                Err::<(), BoxError>("stopping".into())
            })
            .unwrap();
        let shutdown = CancellationToken::new();
        let mut running = supervisor.start(&shutdown);
        shutdown.cancel();
        running.stopped().await;
        assert_eq!(running.states()["w"], WorkerState::Stopped);
    }
}
