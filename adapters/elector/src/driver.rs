//! The thin async driver of the core election: performs the actions the core queues, reports
//! what happened, and sleeps until the core's next deadline. It makes no decision of its own.

use std::collections::BTreeMap;
use std::sync::Arc;

use plexsphere_leader_core::failures::FailureReport;
use plexsphere_leader_core::{Action, ConnId, Event, LogKind, LogRecord, TermId};
use tokio_util::sync::CancellationToken;

use crate::clock::now;
use crate::connection::{self, Completion, Held, Operation};
use crate::error::{CheckError, RunError};
use crate::failure::CheckFailures;
use crate::log;
use crate::observe::Observer;
use crate::session::LockSession;
use crate::shared::Shared;
use crate::sql;
use crate::term::TermShared;

/// One run of the election. Dropping it before the run finished (a panic unwinding through
/// `run`, or the `run` future dropped) reports [`Event::Panicked`] or [`Event::Dropped`] to the
/// core and performs what it asks: the term ends and the connection closes without an unlock.
pub(crate) struct Driver {
    inner: Arc<Shared>,
    held: Option<(ConnId, Held)>,
    in_flight: Option<Operation>,
    /// The term a graceful stop ended, whose work it awaits.
    stopped_term: Option<Arc<TermShared>>,
    /// Ended terms whose work deadline the election may still report
    /// ([`Action::ReportOverdueWork`]); forgotten when reported or when their work drained.
    ended_terms: BTreeMap<TermId, Arc<TermShared>>,
    /// The lock connection whose end was already reported.
    watch_reported: Option<ConnId>,
    finished: bool,
    /// The database the last answered grant statement ran in: named in the log lines.
    database: Option<String>,
    observer: Observer,
    /// How the current run of failed checks is logged (the core's policy).
    failures: CheckFailures,
}

#[allow(clippy::large_enum_variant)] // reason: a short-lived stack value, never stored
enum Wake {
    Stop,
    Completed(Completion),
    SessionEnded(ConnId),
    Control,
    Deadline,
}

impl Driver {
    /// Starts a run: the first check begins at once.
    pub(crate) fn start(inner: Arc<Shared>) -> Result<Self, RunError> {
        inner
            .election()
            .start(now())
            .map_err(|_| RunError::AlreadyRunning)?;
        let mut driver = Self {
            observer: Observer::new(Arc::clone(&inner)),
            inner,
            held: None,
            in_flight: None,
            stopped_term: None,
            ended_terms: BTreeMap::new(),
            watch_reported: None,
            finished: false,
            database: None,
            failures: CheckFailures::default(),
        };
        driver.perform_queued();
        Ok(driver)
    }

    /// Drives the run until the core finishes it, after `shutdown` is cancelled.
    pub(crate) async fn run(mut self, shutdown: CancellationToken) {
        let mut stop_reported = false;
        let sleep = tokio::time::sleep_until(tokio::time::Instant::now());
        tokio::pin!(sleep);
        let mut armed = None;
        while !self.finished {
            let deadline = self.inner.election().poll_timeout();
            if deadline != armed {
                if let Some(at) = deadline {
                    sleep.as_mut().reset(tokio::time::Instant::from_std(at));
                }
                armed = deadline;
            }
            let wake = tokio::select! {
                biased;
                () = shutdown.cancelled(), if !stop_reported => Wake::Stop,
                completion = in_flight(&mut self.in_flight) => Wake::Completed(completion),
                conn = watch_session(&self.held, self.watch_reported) => Wake::SessionEnded(conn),
                () = self.inner.controls().queued() => Wake::Control,
                () = &mut sleep, if armed.is_some() => Wake::Deadline,
            };
            match wake {
                Wake::Stop => {
                    stop_reported = true;
                    self.handle(Event::Cancelled);
                }
                Wake::Completed(completion) => {
                    self.in_flight = None;
                    self.complete(completion);
                }
                Wake::SessionEnded(conn) => {
                    self.watch_reported = Some(conn);
                    self.handle(Event::SessionEnded {
                        conn,
                        cause: CheckError::SessionEnded,
                    });
                }
                Wake::Control => self.apply_controls(),
                Wake::Deadline => self.fire_due_timers(),
            }
        }
        // Requests queued as the run finished: an eligibility setting still applies (the
        // election records it while not running); a resign finds nothing to do.
        self.apply_controls();
    }

    /// Hands the queued operator requests (resign, eligibility) to the election, in order.
    fn apply_controls(&mut self) {
        for request in self.inner.controls().take() {
            self.handle(request);
        }
    }

    fn complete(&mut self, completion: Completion) {
        let Completion {
            event,
            acquired,
            database,
        } = completion;
        if database.is_some() {
            self.database = database;
        }
        if let Event::WorkDrained { term } = &event {
            self.ended_terms.remove(term);
        }
        if let (Some(session), Some(conn)) = (acquired, event.conn()) {
            self.held = Some((conn, Arc::new(session)));
        }
        // A deadline that passed while the answer was on its way fires first (it may give back
        // or close the connection the answer came on, which then makes the answer stale).
        self.fire_due_timers();
        self.observer.completion(&event);
        if succeeds_check(&event) && self.failures.succeeded() {
            self.inner.check_failed(None);
        }
        self.feed(event);
    }

    /// Reports `event` to the core, after any deadline that has passed (rule 3 of the
    /// `Election` contract: a late answer never extends a term).
    fn handle(&mut self, event: Event<crate::session::CheckError>) {
        self.fire_due_timers();
        self.feed(event);
    }

    fn fire_due_timers(&mut self) {
        self.inner.election().handle_timeout(now());
        self.perform_queued();
    }

    /// Reports `event` to the core and performs what it asks; an ignored input asks nothing.
    fn feed(&mut self, event: Event<crate::session::CheckError>) {
        let _handled = self.inner.election().handle_event(now(), event);
        self.perform_queued();
    }

    fn perform_queued(&mut self) {
        loop {
            // The lock is released before the action runs: an action may call back into the
            // elector (a log subscriber, a term token's waiters).
            let next = self.inner.election().poll_action();
            let Some(action) = next else { break };
            self.perform(action);
        }
    }

    fn perform(&mut self, action: Action<crate::session::CheckError>) {
        self.observer.action(&action);
        match action {
            Action::AcquireConnection { conn } => {
                self.in_flight = Some(connection::acquire(self.inner.sessions(), conn));
            }
            Action::TryLock { conn } => {
                let (key, identity) = (self.inner.key(), self.inner.identity());
                let idle_ms = self.inner.interval().idle_session_timeout_millis();
                let statement = sql::try_lock(key, identity, idle_ms);
                self.start_on(conn, |held| connection::try_lock(held, conn, statement));
            }
            Action::WaitForLock {
                conn,
                lock_timeout_ms,
            } => {
                let idle_ms = self.inner.interval().idle_session_timeout_millis();
                let (key, identity) = (self.inner.key(), self.inner.identity());
                let statement = sql::wait_for_lock(key, identity, lock_timeout_ms, idle_ms);
                let bound = sql::bound_idle_before_wait(idle_ms);
                self.start_on(conn, |held| {
                    connection::wait_for_lock(held, conn, bound, statement)
                });
            }
            Action::ReleaseIfHeld { conn } => {
                let key = self.inner.key();
                self.start_on(conn, |held| connection::release_if_held(held, conn, key));
            }
            Action::AdvanceEpoch {
                conn,
                lock_timeout_ms,
            } => {
                let statement = sql::advance_epoch_within(self.inner.key(), lock_timeout_ms);
                self.start_on(conn, |held| {
                    connection::advance_epoch(held, conn, statement)
                });
            }
            Action::AwaitWork { term } => {
                let stopped = self
                    .stopped_term
                    .clone()
                    .filter(|shared| shared.id() == term);
                self.in_flight = Some(match stopped {
                    Some(shared) => connection::await_work(shared),
                    None => Box::pin(std::future::ready(Completion::of(Event::WorkDrained {
                        term,
                    }))),
                });
            }
            Action::Ping { conn, .. } => {
                let key = self.inner.key();
                self.start_on(conn, |held| connection::verify(held, conn, key));
            }
            Action::Unlock { conn } => {
                let key = self.inner.key();
                self.start_on(conn, |held| connection::unlock(held, conn, key));
            }
            Action::ReturnToPool { conn } => {
                // Gives up an acquire still in flight (the source may keep a connection being
                // set up for the next check); a session already borrowed goes back.
                self.in_flight = None;
                if let Some(session) = self.take(conn) {
                    drop(session);
                }
            }
            Action::Hijack { conn, backend_pid } => {
                let Some(session) = self.take(conn) else {
                    return;
                };
                self.held = Some((conn, Arc::new(session.detach(backend_pid))));
            }
            Action::CloseConnection { conn } => {
                self.in_flight = None;
                // A connection still being set up goes too (`ReturnToPool` keeps it for the
                // next check).
                self.inner.sessions().cancel_kept();
                if let Some(session) = self.take(conn) {
                    session.close();
                }
            }
            Action::BeginTerm { term, epoch } => self.inner.begin_term(term, epoch),
            Action::EndTerm { term, cause } => {
                self.stopped_term = self.inner.end_term(cause);
                if let (Some(shared), true) = (&self.stopped_term, self.inner.has_work_deadline()) {
                    self.ended_terms.insert(term, Arc::clone(shared));
                }
            }
            Action::ReportOverdueWork {
                term,
                abort,
                run_finished,
            } => {
                if let Some(shared) = self.ended_terms.remove(&term) {
                    self.inner.report_overdue(&shared, abort, run_finished);
                }
            }
            Action::Log(record) => {
                let work = (record.kind == LogKind::WorkOutlivedStop)
                    .then(|| {
                        self.stopped_term
                            .as_ref()
                            .map(|t| t.running_work().join(", "))
                    })
                    .flatten();
                let report = self.failure_report(&record);
                log::emit(
                    &record,
                    self.inner.interval().get(),
                    work.as_deref(),
                    self.database.as_deref(),
                    report.as_ref(),
                );
                if let Some(release) = record.release() {
                    self.inner.released(release);
                }
            }
            Action::Finish => self.finished = true,
        }
    }

    /// For a standby's failed check: how the core's policy reports it, after recording it in
    /// the published value.
    fn failure_report(&mut self, record: &LogRecord<CheckError>) -> Option<FailureReport> {
        let (LogKind::AcquireFailed, Some(cause)) = (record.kind, &record.cause) else {
            return None;
        };
        let (report, failure) = self.failures.failed(cause);
        self.inner.check_failed(Some(failure));
        Some(report)
    }

    /// Starts `operation` on connection `conn`, replacing any operation in flight.
    fn start_on(&mut self, conn: ConnId, operation: impl FnOnce(Held) -> Operation) {
        start_on(&self.held, &mut self.in_flight, conn, operation);
    }

    /// Takes connection `conn` out of the driver, once nothing in flight uses it.
    fn take(&mut self, conn: ConnId) -> Option<Box<dyn LockSession>> {
        take_held(&mut self.held, &mut self.in_flight, conn)
    }
}

/// Whether `event` is the answer of a check that worked: the lock granted or refused, a queued
/// wait ended by its timeout, the leader's check answered.
fn succeeds_check(event: &Event<CheckError>) -> bool {
    matches!(
        event,
        Event::LockGranted { .. }
            | Event::LockRefused { .. }
            | Event::LockWaitTimedOut { .. }
            | Event::PingAnswered { .. }
    )
}

/// Starts `operation` on the held connection `conn`, replacing any operation in flight; logs a
/// driver bug when `conn` is not the one held (the operation's deadline then passes). Shared
/// with the sharded driver.
pub(crate) fn start_on<F>(
    held: &Option<(ConnId, Held)>,
    in_flight: &mut Option<F>,
    conn: ConnId,
    operation: impl FnOnce(Held) -> F,
) {
    *in_flight = None;
    match held {
        Some((held_conn, session)) if *held_conn == conn => {
            *in_flight = Some(operation(Arc::clone(session)));
        }
        _ => tracing::error!(
            target: "plexsphere_leader",
            %conn,
            "driver bug: no connection to run the statement on; the check will time out"
        ),
    }
}

/// Takes the held connection `conn` out of `held`, dropping the operation in flight on it so
/// that nothing else uses it; `None` (and `held` unchanged) for another connection. Shared
/// with the sharded driver.
pub(crate) fn take_held<F>(
    held: &mut Option<(ConnId, Held)>,
    in_flight: &mut Option<F>,
    conn: ConnId,
) -> Option<Box<dyn LockSession>> {
    match held.take() {
        Some((held_conn, session)) if held_conn == conn => {
            *in_flight = None;
            Arc::try_unwrap(session).ok()
        }
        other => {
            *held = other;
            None
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        if !self.finished {
            let event = if std::thread::panicking() {
                Event::Panicked
            } else {
                Event::Dropped
            };
            self.handle(event);
        }
        self.in_flight = None;
        // Whatever is still held is closed, never returned to the pool: it may carry the lock.
        if let Some((_, held)) = self.held.take()
            && let Ok(session) = Arc::try_unwrap(held)
        {
            session.close();
        }
    }
}

/// Resolves with the held connection once its session ended on its own (and that was not
/// reported yet): [`LockSession::ended`], which only a detached session ever resolves. Shared
/// with the sharded driver.
pub(crate) async fn watch_session(
    held: &Option<(ConnId, Held)>,
    reported: Option<ConnId>,
) -> ConnId {
    match held {
        Some((conn, session)) if reported != Some(*conn) => {
            session.ended().await;
            *conn
        }
        _ => std::future::pending().await,
    }
}

/// Waits for the operation in flight; never resolves when there is none. Shared with the
/// sharded driver.
pub(crate) async fn in_flight<F: std::future::Future + Unpin>(
    operation: &mut Option<F>,
) -> F::Output {
    match operation.as_mut() {
        Some(operation) => operation.await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests;
