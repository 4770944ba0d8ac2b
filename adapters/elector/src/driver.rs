//! The one thin async driver of the core's elections, whichever mode: performs the actions
//! the core queues on the one lock session, reports what happened, and sleeps until the core's
//! next deadline. It makes no decision of its own.
//!
//! The loop, the held session, the operation in flight, the drains of ended terms' work, the
//! counting of failed checks and the `Drop` that reports a panic or a dropped run are written
//! here once; a [`Mode`] says how its core machine is reached and how each of its actions
//! is performed ([`single`] for one election, [`crate::sharded`] for sharded leadership).

use std::future::Future;
use std::sync::{Arc, MutexGuard};

use futures_util::StreamExt as _;
use futures_util::stream::FuturesUnordered;
use plexsphere_leader_core::failures::FailureReport;
use plexsphere_leader_core::{Cause, ConnId, Control, Machine};
use tokio_util::sync::CancellationToken;

use crate::clock::{Clock, TokioClock};
use crate::connection::Held;
use crate::error::{CheckError, RunError};
use crate::failure::CheckFailures;
use crate::leadership::CheckFailure;
use crate::operation::{Completion, Operation};
use crate::operator::OperatorQueue;
use crate::session::{LockSession, SessionSource};

pub(crate) mod single;

/// One mode of the engine, as the driver reaches it: its core [`Machine`] (locked for
/// each call only, so that an action performed may call back into the elector), its operator
/// queue, and how its actions are performed.
pub(crate) trait Mode: Send + Sized + 'static {
    /// The core machine.
    type Machine: Machine<Error = CheckError, Event: Send + 'static>;
    /// What an answered operation carries beside its event, for [`Mode::arrived`].
    type Extra: Default + Send + 'static;

    /// The machine, locked.
    fn machine(&self) -> MutexGuard<'_, Self::Machine>;
    /// The operator's requests (resign, eligibility) for the running driver.
    fn controls(&self) -> &OperatorQueue<EventOf<Self>>;
    /// Publishes the current run of failed checks; `None`: a check worked.
    fn publish_check_failure(&self, failure: Option<CheckFailure>);

    /// Performs `action` with the driver's I/O.
    fn perform(&mut self, action: ActionOf<Self>, io: &mut Io<Self>);
    /// An answer arrived, before any deadline that passed while it was on its way fires.
    fn arrived(&mut self, _event: &EventOf<Self>, _extra: Self::Extra) {}
    /// An answer is about to be reported, after the deadlines that passed fired.
    fn answered(&mut self, _event: &EventOf<Self>) {}
    /// The queued actions were performed.
    fn performed(&mut self) {}
    /// The clock the machine runs on: every instant it is given, every deadline it asks for.
    fn clock(&self) -> &dyn Clock {
        &TokioClock
    }
    /// How the run ended, once the machine finished it.
    fn outcome(&mut self) -> Result<(), RunError> {
        Ok(())
    }
}

/// The events of mode `M`'s machine.
pub(crate) type EventOf<M> = <<M as Mode>::Machine as Machine>::Event;
/// The actions of mode `M`'s machine.
pub(crate) type ActionOf<M> = <<M as Mode>::Machine as Machine>::Action;

/// The operation type of mode `M`.
pub(crate) type OperationOf<M> = Operation<EventOf<M>, <M as Mode>::Extra>;

/// The driver's I/O, which a mode's [`Mode::perform`] works with: the held session,
/// the operation in flight, the drains and the run of failed checks.
pub(crate) struct Io<M: Mode> {
    held: Option<(ConnId, Held)>,
    in_flight: Option<OperationOf<M>>,
    drains: FuturesUnordered<OperationOf<M>>,
    /// The held connection whose end was already reported.
    watch_reported: Option<ConnId>,
    finished: bool,
    /// How the current run of failed checks is logged (the core's policy).
    failures: CheckFailures,
}

impl<M: Mode> Io<M> {
    /// Runs `operation` (an acquire or a wait that needs no session), replacing any operation
    /// in flight.
    pub(crate) fn run(&mut self, operation: OperationOf<M>) {
        self.in_flight = Some(operation);
    }

    /// Awaits `drain` beside the operation in flight.
    pub(crate) fn drain(&mut self, drain: OperationOf<M>) {
        self.drains.push(drain);
    }

    /// Starts `operation` on the held connection `conn`, replacing any operation in flight;
    /// logs a driver bug when `conn` is not the one held (the operation's deadline then
    /// passes).
    pub(crate) fn start_on(
        &mut self,
        conn: ConnId,
        operation: impl FnOnce(Held) -> OperationOf<M>,
    ) {
        self.in_flight = None;
        match &self.held {
            Some((held_conn, session)) if *held_conn == conn => {
                self.in_flight = Some(operation(Arc::clone(session)));
            }
            _ => tracing::error!(
                target: "plexsphere_leader",
                %conn,
                "driver bug: no connection to run the statement on; the check will time out"
            ),
        }
    }

    /// Takes the held connection `conn` out of the driver, dropping the operation in flight on
    /// it so that nothing else uses it; `None` for another connection.
    pub(crate) fn take(&mut self, conn: ConnId) -> Option<Box<dyn LockSession>> {
        match self.held.take() {
            Some((held_conn, session)) if held_conn == conn => {
                self.in_flight = None;
                Arc::try_unwrap(session).ok()
            }
            other => {
                self.held = other;
                None
            }
        }
    }

    /// Gives up the operation in flight (an acquire the source may keep for the next check)
    /// and returns the borrowed session `conn` to its pool.
    pub(crate) fn return_to_pool(&mut self, conn: ConnId) {
        self.in_flight = None;
        drop(self.take(conn));
    }

    /// Detaches the held session `conn` from its pool: it carries the lock of backend `pid`.
    pub(crate) fn detach(&mut self, conn: ConnId, backend_pid: i32) {
        if let Some(session) = self.take(conn) {
            self.held = Some((conn, Arc::new(session.detach(backend_pid))));
        }
    }

    /// Closes the session `conn` without returning it, and a connection `sessions` is still
    /// setting up.
    pub(crate) fn close(&mut self, conn: ConnId, sessions: &dyn SessionSource) {
        self.in_flight = None;
        sessions.cancel_kept();
        if let Some(session) = self.take(conn) {
            session.close();
        }
    }

    /// The machine finished the run.
    pub(crate) fn finish(&mut self) {
        self.finished = true;
    }

    /// A failed check (an acquire of the lock session, or a lease's renewal): how the core's
    /// policy reports `cause`, after it is published through `publish`.
    pub(crate) fn check_failed(
        &mut self,
        cause: &Cause<CheckError>,
        publish: impl FnOnce(Option<CheckFailure>),
    ) -> FailureReport {
        let (report, failure) = self.failures.failed(cause);
        publish(Some(failure));
        report
    }
}

#[allow(clippy::large_enum_variant)] // reason: a short-lived stack value, never stored
enum Wake<E, X> {
    Stop,
    Completed(Completion<E, X>),
    Drained(Completion<E, X>),
    SessionEnded(ConnId),
    Control,
    Deadline,
}

/// One run of an election. Dropping it before the run finished (a panic unwinding through
/// `run`, or the `run` future dropped) reports `Control::Panicked` or `Control::Dropped` to the
/// core and performs what it asks: every term ends and the session closes without an unlock.
pub(crate) struct Driver<M: Mode> {
    mode: M,
    io: Io<M>,
}

impl<M: Mode> Driver<M> {
    /// Starts a run: the first check begins at once.
    pub(crate) fn start(mode: M) -> Result<Self, RunError> {
        let now = mode.clock().now();
        mode.machine()
            .start(now)
            .map_err(|_| RunError::AlreadyRunning)?;
        let mut driver = Self {
            mode,
            io: Io {
                held: None,
                in_flight: None,
                drains: FuturesUnordered::new(),
                watch_reported: None,
                finished: false,
                failures: CheckFailures::default(),
            },
        };
        driver.perform_queued();
        Ok(driver)
    }

    /// Drives the run until the core finishes it, after `shutdown` is cancelled; the error the
    /// core failed the run with.
    pub(crate) async fn run(mut self, shutdown: CancellationToken) -> Result<(), RunError> {
        let mut stop_reported = false;
        let sleep = tokio::time::sleep_until(tokio::time::Instant::now());
        tokio::pin!(sleep);
        let mut armed = None;
        while !self.io.finished {
            let deadline = self.mode.machine().poll_timeout();
            if deadline != armed {
                if let Some(at) = deadline {
                    sleep.as_mut().reset(self.mode.clock().tokio_instant(at));
                }
                armed = deadline;
            }
            let io = &mut self.io;
            let wake = tokio::select! {
                biased;
                () = shutdown.cancelled(), if !stop_reported => Wake::Stop,
                completion = in_flight(&mut io.in_flight) => Wake::Completed(completion),
                Some(drained) = io.drains.next(), if !io.drains.is_empty() => Wake::Drained(drained),
                conn = watch_session(&io.held, io.watch_reported) => Wake::SessionEnded(conn),
                () = self.mode.controls().queued() => Wake::Control,
                () = &mut sleep, if armed.is_some() => Wake::Deadline,
            };
            match wake {
                Wake::Stop => {
                    stop_reported = true;
                    self.handle(M::Machine::control(Control::Cancelled));
                }
                Wake::Completed(completion) => {
                    self.io.in_flight = None;
                    self.complete(completion);
                }
                Wake::Drained(completion) => self.complete(completion),
                Wake::SessionEnded(conn) => {
                    self.io.watch_reported = Some(conn);
                    self.handle(M::Machine::session_ended(conn, CheckError::SessionEnded));
                }
                Wake::Control => self.apply_controls(),
                Wake::Deadline => self.fire_due_timers(),
            }
        }
        // Requests queued as the run finished: an eligibility setting still applies (the
        // election records it while not running); a resign finds nothing to do.
        self.apply_controls();
        self.mode.outcome()
    }

    /// Hands the queued operator requests (resign, eligibility) to the election, in order.
    fn apply_controls(&mut self) {
        for request in self.mode.controls().take() {
            self.handle(request);
        }
    }

    fn complete(&mut self, completion: Completion<EventOf<M>, M::Extra>) {
        let Completion {
            event,
            acquired,
            extra,
        } = completion;
        self.mode.arrived(&event, extra);
        if let (Some(session), Some(conn)) = (acquired, M::Machine::conn(&event)) {
            self.io.held = Some((conn, Arc::new(session)));
        }
        // A deadline that passed while the answer was on its way fires first (it may give back
        // or close the connection the answer came on, which then makes the answer stale).
        self.fire_due_timers();
        self.mode.answered(&event);
        if M::Machine::answers_check(&event) && self.io.failures.succeeded() {
            self.mode.publish_check_failure(None);
        }
        self.feed(event);
    }

    /// Reports `event` to the core, after any deadline that has passed (rule 3 of the
    /// `Election` contract: a late answer never extends a term).
    fn handle(&mut self, event: EventOf<M>) {
        self.fire_due_timers();
        self.feed(event);
    }

    fn fire_due_timers(&mut self) {
        let now = self.mode.clock().now();
        self.mode.machine().handle_timeout(now);
        self.perform_queued();
    }

    fn feed(&mut self, event: EventOf<M>) {
        let now = self.mode.clock().now();
        let _handled = self.mode.machine().handle_event(now, event);
        self.perform_queued();
    }

    fn perform_queued(&mut self) {
        loop {
            // The lock is released before the action runs: an action may call back into the
            // elector (a log subscriber, a term token's waiters).
            let next = self.mode.machine().poll_action();
            let Some(action) = next else { break };
            self.mode.perform(action, &mut self.io);
        }
        self.mode.performed();
    }
}

impl<M: Mode> Drop for Driver<M> {
    fn drop(&mut self) {
        if !self.io.finished {
            let control = if std::thread::panicking() {
                Control::Panicked
            } else {
                Control::Dropped
            };
            self.handle(M::Machine::control(control));
        }
        self.io.in_flight = None;
        // Whatever is still held is closed, never returned to the pool: it may carry a lock.
        if let Some((_, held)) = self.io.held.take()
            && let Ok(session) = Arc::try_unwrap(held)
        {
            session.close();
        }
    }
}

/// Resolves with the held connection once its session ended on its own (and that was not
/// reported yet): [`LockSession::ended`], which only a detached session ever resolves.
async fn watch_session(held: &Option<(ConnId, Held)>, reported: Option<ConnId>) -> ConnId {
    match held {
        Some((conn, session)) if reported != Some(*conn) => {
            session.ended().await;
            *conn
        }
        _ => std::future::pending().await,
    }
}

/// Waits for the operation in flight; never resolves when there is none.
async fn in_flight<F: Future + Unpin>(operation: &mut Option<F>) -> F::Output {
    match operation.as_mut() {
        Some(operation) => operation.await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests;
