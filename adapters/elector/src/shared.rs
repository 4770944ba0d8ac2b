//! What an elector's handles and its running driver share, in either mode: the core machine
//! behind a mutex, the queue of operator requests, the current run of failed checks, the
//! metrics, and the mode's own publication ([`Mode`]): one election's leadership
//! ([`OneLeader`]: one `watch`, the `is_leader` flag and the gauge derived from it, the open
//! term), or a shard space's ownership (`ShardSpace`, in `sharded/shared.rs`). The driver owns
//! everything else of a run (the operation in flight, the held lock session, the ended terms
//! whose work deadline may still pass); the handles own nothing.
//!
//! Module graph: the handles (`elector`, `sharded`) and the drivers (`driver`, `sharded/driver`)
//! use this module; the driver does not use the handles, and this module uses neither.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use plexsphere_leader_core::{
    CheckInterval, Election, Machine, Options, Release, StuckLeader, TermEndCause, TermId,
    WorkDeadline,
};
use tokio::sync::watch;

use crate::clock::Clock;
use crate::error::CheckError;
use crate::key::LockKey;
use crate::leadership::{CheckFailing, CheckFailure, Leadership, Resignation};
use crate::metrics::ElectionMetrics;
use crate::operator::OperatorQueue;
use crate::session::SessionSource;
use crate::term::TermShared;
use crate::trust::Trust;

/// How an election is named on the server: its lock key (the lease's row), its identity
/// (`application_name`, the lease holder), the schema of the lease's tables, and the fitness
/// probe it runs there.
#[derive(Debug, Clone)]
pub(crate) struct Naming {
    pub(crate) key: LockKey,
    pub(crate) identity: String,
    pub(crate) lease_schema: String,
    pub(crate) fitness_probe: Option<Arc<str>>,
}

/// What one mode keeps in the shared state beside the common part: its machine and options,
/// its metrics, and what it publishes.
pub(crate) trait Mode: Sized + Send + Sync + 'static {
    /// The core machine.
    type Machine: Machine<Error = CheckError>;
    /// The options the machine is built from.
    type Options: Copy;
    /// The mode's metrics.
    type Metrics: CountsOverdue;

    /// Publishes that a run of failed checks began or changed class (`Some`), or ended.
    fn publish_failing(&self, failing: Option<CheckFailing>);
    /// The work deadline of `options`, if any.
    fn work_deadline_of(options: &Self::Options) -> Option<WorkDeadline>;
    /// The machine's clock reading now.
    fn now(&self) -> Instant {
        crate::clock::now()
    }
}

/// Metrics that count work found past its deadline.
pub(crate) trait CountsOverdue: Send + Sync {
    /// Work was found running past the work deadline; `aborted` when it was aborted.
    fn overdue_work(&self, aborted: bool);
}

impl CountsOverdue for ElectionMetrics {
    fn overdue_work(&self, aborted: bool) {
        ElectionMetrics::overdue_work(self, aborted);
    }
}

/// The state an elector's handles and its running driver share (see the module docs).
pub(crate) struct Shared<M: Mode> {
    /// Where lock sessions come from: the pool, through the [`SessionSource`] seam.
    sessions: Arc<dyn SessionSource>,
    identity: String,
    options: M::Options,
    /// The options' work deadline, if any.
    work_deadline: Option<WorkDeadline>,
    election: Mutex<M::Machine>,
    /// Operator requests (resign, eligibility) for the running driver, in order.
    controls: OperatorQueue<<M::Machine as Machine>::Event>,
    /// The current run of failed checks, in full (the published value has its class).
    failure: Mutex<Option<CheckFailure>>,
    metrics: Option<M::Metrics>,
    /// The core's trust deadline (a lease's: the open term's, or the shards'), which every
    /// reader compares with the clock at its call.
    trust: Arc<Trust>,
    /// The mode's own state and publication.
    mode: M,
}

/// Locks `mutex`, whether or not a panic poisoned it (the state stays consistent: every
/// writer finishes its change before it can panic).
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<M: Mode> Shared<M> {
    /// The shared state of a new elector running `machine` (not running yet, nothing
    /// queued), built from `options`.
    pub(crate) fn with_mode(
        sessions: Arc<dyn SessionSource>,
        identity: String,
        options: M::Options,
        machine: M::Machine,
        metrics: Option<M::Metrics>,
        trust: Arc<Trust>,
        mode: M,
    ) -> Self {
        Self {
            sessions,
            identity,
            options,
            work_deadline: M::work_deadline_of(&options),
            election: Mutex::new(machine),
            controls: OperatorQueue::new(),
            failure: Mutex::new(None),
            metrics,
            trust,
            mode,
        }
    }

    /// Whether the trust deadline, if any, lies ahead on the election's clock at this moment,
    /// whether or not the driver has run since (a process resumed after a pause answers no at
    /// once).
    pub(crate) fn trusted_now(&self) -> bool {
        self.trust.holds_now()
    }

    /// Records the core's trust deadline (`trust_deadline` of the machine) after each input.
    pub(crate) fn set_trust(&self, deadline: Option<Instant>) {
        self.trust.set(deadline);
    }

    /// The core machine, locked.
    pub(crate) fn election(&self) -> MutexGuard<'_, M::Machine> {
        lock(&self.election)
    }

    /// Where lock sessions come from.
    pub(crate) fn sessions(&self) -> Arc<dyn SessionSource> {
        Arc::clone(&self.sessions)
    }

    /// The operator's requests for the running driver.
    pub(crate) fn controls(&self) -> &OperatorQueue<<M::Machine as Machine>::Event> {
        &self.controls
    }

    /// This replica's identity.
    pub(crate) fn identity(&self) -> &str {
        &self.identity
    }

    /// The validated options.
    pub(crate) fn options(&self) -> M::Options {
        self.options
    }

    /// The metrics, when any were configured.
    pub(crate) fn metrics(&self) -> Option<&M::Metrics> {
        self.metrics.as_ref()
    }

    /// The mode's own state.
    pub(crate) fn mode(&self) -> &M {
        &self.mode
    }

    /// Asks the running election to resign for `hold_off` (the handles' `resign_for`).
    pub(crate) fn resign(&self, hold_off: Duration) -> Resignation {
        self.controls.resign(self.election(), hold_off)
    }

    /// Makes this replica eligible or not: queued for a running election, applied at once to
    /// one that is not running.
    pub(crate) fn set_eligible(&self, eligible: bool) {
        self.controls.set_eligible(self.election(), eligible);
    }

    /// The liveness verdict of the machine at this moment.
    pub(crate) fn liveness(&self) -> Result<(), StuckLeader> {
        let now = self.mode.now();
        self.election().stuck(now)
    }

    /// Performs the machine's `ReportOverdueWork`: reports (and, when `abort`, aborts) the work
    /// of the ended `term` still running, and counts it.
    pub(crate) fn report_overdue(&self, term: &TermShared, abort: bool, run_finished: bool) {
        let deadline = self.work_deadline;
        if let (Some(aborted), Some(metrics)) = (
            crate::overdue::report(term, deadline, abort, run_finished),
            &self.metrics,
        ) {
            metrics.overdue_work(aborted);
        }
    }

    /// Records the latest failed check (`None`: a check succeeded) and publishes its class
    /// when a run of failures began, changed class or ended.
    pub(crate) fn check_failed(&self, failure: Option<CheckFailure>) {
        let failing = failure.as_ref().map(|failure| CheckFailing {
            class: failure.class,
            since: failure.since,
        });
        *lock(&self.failure) = failure;
        self.mode.publish_failing(failing);
    }

    /// The latest failed check of the current run of failures.
    pub(crate) fn check_failure(&self) -> Option<CheckFailure> {
        lock(&self.failure).clone()
    }
}

/// One election's own shared state: its naming, the resign hold-off, and the published
/// leadership with what is derived from it.
pub(crate) struct OneLeader {
    naming: Naming,
    hold_off: Duration,
    /// [`Leadership::is_leader`] of the published value, for the spec's atomic `IsLeader`;
    /// written only by [`Shared::publish`], together with the value.
    leading: AtomicBool,
    /// The published leadership: the one source every consumer reads.
    leadership: watch::Sender<Leadership>,
    current: Mutex<Option<Arc<TermShared>>>,
    /// The clock the election runs on ([`Config::clock`](crate::Config::clock)).
    clock: Arc<dyn Clock>,
}

impl Mode for OneLeader {
    type Machine = Election<CheckError>;
    type Options = Options;
    type Metrics = ElectionMetrics;

    fn now(&self) -> Instant {
        self.clock.now()
    }

    fn work_deadline_of(options: &Options) -> Option<WorkDeadline> {
        options.work_deadline_of()
    }

    fn publish_failing(&self, failing: Option<CheckFailing>) {
        self.leadership.send_if_modified(|leadership| {
            let changed = leadership.check_failing() != failing;
            *leadership = leadership.failing(failing);
            changed
        });
    }
}

impl Shared<OneLeader> {
    /// The shared state of a new elector: standby, not running, nothing queued.
    pub(crate) fn new(
        sessions: Arc<dyn SessionSource>,
        options: Options,
        naming: Naming,
        clock: Arc<dyn Clock>,
        metrics: Option<ElectionMetrics>,
        hold_off: Duration,
    ) -> Self {
        let trust = Arc::new(Trust::new(Arc::clone(&clock)));
        if let Some(metrics) = &metrics {
            metrics.watch_trust(&trust);
        }
        let identity = naming.identity.clone();
        let mode = OneLeader {
            naming,
            hold_off,
            leading: AtomicBool::new(false),
            leadership: watch::Sender::new(Leadership::default()),
            current: Mutex::new(None),
            clock,
        };
        let election = Election::with_options(options);
        Self::with_mode(sessions, identity, options, election, metrics, trust, mode)
    }

    /// Whether the published leadership is leading (the spec's atomic `IsLeader`) and, for a
    /// lease, its trust has not run out on the election's clock at this moment, whether or
    /// not the driver has run since (a process resumed after a pause answers no at once).
    pub(crate) fn is_leader(&self) -> bool {
        self.mode.leading.load(Ordering::Acquire) && self.trusted_now()
    }

    /// The published leadership.
    pub(crate) fn leadership(&self) -> Leadership {
        *self.mode.leadership.borrow()
    }

    /// A receiver of every published leadership.
    pub(crate) fn subscribe(&self) -> watch::Receiver<Leadership> {
        self.mode.leadership.subscribe()
    }

    /// The open term, while leading and trusted ([`is_leader`](Self::is_leader)).
    pub(crate) fn current_term(&self) -> Option<Arc<TermShared>> {
        if !self.trusted_now() {
            return None;
        }
        lock(&self.mode.current).clone()
    }

    /// The longest a graceful stop of a leader takes (the core's arithmetic).
    pub(crate) fn stop_budget(&self) -> Duration {
        self.options.stop_budget()
    }

    /// The resign hold-off of [`Elector::resign`](crate::Elector::resign).
    pub(crate) fn hold_off(&self) -> Duration {
        self.mode.hold_off
    }

    pub(crate) fn interval(&self) -> CheckInterval {
        self.options.interval()
    }

    /// Whether the election holds a lease instead of the advisory lock.
    pub(crate) fn holds_a_lease(&self) -> bool {
        self.options.lease_of().is_some()
    }

    pub(crate) fn key(&self) -> LockKey {
        self.mode.naming.key
    }

    /// The schema of the lease's tables.
    pub(crate) fn lease_schema(&self) -> &str {
        &self.mode.naming.lease_schema
    }

    /// The fitness probe ([`Config::fitness_probe`](crate::Config::fitness_probe)), if any.
    pub(crate) fn fitness_probe(&self) -> Option<&Arc<str>> {
        self.mode.naming.fitness_probe.as_ref()
    }

    /// The clock the election runs on.
    pub(crate) fn clock(&self) -> &dyn Clock {
        &*self.mode.clock
    }

    /// A term begins: its handles can be taken, then is-leader, the gauge and the published
    /// leadership turn on.
    pub(crate) fn begin_term(&self, id: TermId, epoch: Option<u64>) {
        *lock(&self.mode.current) = Some(TermShared::new(id, epoch));
        let now = crate::clock::now();
        self.publish(|leadership| leadership.began(id, epoch, now));
    }

    /// The term ends: is-leader, the gauge and the published leadership turn off, then every
    /// handle's token is cancelled. Returns the ended term, whose work a graceful stop then
    /// awaits.
    pub(crate) fn end_term(&self, cause: TermEndCause) -> Option<Arc<TermShared>> {
        let now = crate::clock::now();
        self.publish(|leadership| leadership.ended(cause, now));
        let current = lock(&self.mode.current).take();
        if let Some(term) = &current {
            term.end(cause);
        }
        current
    }

    /// A term's hold on the lock ended as `release` says: published beside the leadership.
    pub(crate) fn released(&self, release: Release) {
        self.publish(|leadership| leadership.released(release));
    }

    /// A run began (`None`) or ended with `error`: published beside the leadership.
    pub(crate) fn run_ended(&self, error: Option<crate::error::RunError>) {
        self.mode.leadership.send_if_modified(|leadership| {
            let changed = leadership.run_failed() != error;
            *leadership = leadership.run_ended(error);
            changed
        });
    }

    /// Whether a work deadline is set ([`Config::work_deadline`](crate::Config::work_deadline)).
    pub(crate) fn has_work_deadline(&self) -> bool {
        self.work_deadline.is_some()
    }

    /// Publishes a new leadership value, and the is-leader flag and gauge derived from it.
    fn publish(&self, change: impl FnOnce(Leadership) -> Leadership) {
        self.mode
            .leadership
            .send_modify(|leadership| *leadership = change(*leadership));
        let leading = self.mode.leadership.borrow().is_leader();
        self.mode.leading.store(leading, Ordering::Release);
        if let Some(metrics) = &self.metrics {
            metrics.leading(leading);
        }
    }
}

impl std::fmt::Debug for Shared<OneLeader> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Elector")
            .field("options", &self.options)
            .field("key", &self.key())
            .field("identity", &self.identity)
            .field("is_leader", &self.mode.leading.load(Ordering::Relaxed))
            .field("election", &*self.election())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // reason: tests fail loudly on the unexpected

    use std::sync::Mutex;

    use plexsphere_leader_core::TermId;

    use super::*;

    /// A clock the test moves by hand, as a paused process sees it on resuming: its readings
    /// jump, and nothing else ran.
    #[derive(Debug)]
    struct Manual(Mutex<Instant>);

    impl Clock for Manual {
        fn now(&self) -> Instant {
            *self.0.lock().unwrap()
        }

        fn tokio_instant(&self, reading: Instant) -> tokio::time::Instant {
            tokio::time::Instant::from_std(reading)
        }
    }

    #[test]
    fn a_lease_term_past_its_trust_deadline_is_no_leadership_at_the_moment_of_the_call() {
        let t0 = Instant::now();
        let clock = Arc::new(Manual(Mutex::new(t0)));
        let interval = CheckInterval::new(Duration::from_secs(1)).unwrap();
        let shared = Shared::<OneLeader>::new(
            Arc::new(crate::session::NoSessions),
            Options::new(interval),
            Naming {
                key: LockKey::DEFAULT,
                identity: "test".into(),
                lease_schema: "public".into(),
                fitness_probe: None,
            },
            Arc::clone(&clock) as Arc<dyn Clock>,
            None,
            Duration::ZERO,
        );
        shared.set_trust(Some(t0 + Duration::from_millis(2700)));
        shared.begin_term(TermId::new(1), Some(7));
        assert!(shared.is_leader());
        assert!(shared.current_term().is_some());
        // The process is paused past the deadline; on resuming, before the driver (or any
        // timer) runs, the published term is still open, and yet nobody may act on it.
        *clock.0.lock().unwrap() = t0 + Duration::from_millis(2700);
        assert!(
            shared.leadership().is_leader(),
            "the published value is stale"
        );
        assert!(!shared.is_leader(), "is_leader answers from the clock");
        assert!(shared.current_term().is_none(), "no term for new work");
        // A renewal that extended the trust makes it leadership again.
        shared.set_trust(Some(t0 + Duration::from_secs(5)));
        assert!(shared.is_leader());
        // The advisory lock has no such deadline.
        shared.set_trust(None);
        *clock.0.lock().unwrap() = t0 + Duration::from_secs(3600);
        assert!(shared.is_leader());
    }
}
