//! What the driver shows of a run: it turns the actions it performs, the completions it reports
//! and the log records of the core into metric observations and the leader's last-check time
//! (for liveness). It observes only; the core decides.

use std::sync::Arc;
use std::time::Instant;

use plexsphere_leader_core::{Action, Cause, ConnId, Event, LogKind, LogRecord};

use crate::error::CheckError;
use crate::metrics::{AttemptOutcome, CheckRole, Transition};
use crate::shared::{OneLeader, Shared};

/// The observer of one run, owned by its driver.
pub(crate) struct Observer {
    inner: Arc<Shared<OneLeader>>,
    /// The check statement in flight.
    check: Option<InFlight>,
}

/// A check statement in flight.
struct InFlight {
    conn: ConnId,
    role: CheckRole,
    /// For the leader's check: the backend granted the lock, against which the core judges
    /// the answer.
    granted: Option<i32>,
    started: Instant,
    /// Whether its latency is observed: not for a queued wait, whose length is the wait.
    timed: bool,
}

impl Observer {
    pub(crate) fn new(inner: Arc<Shared<OneLeader>>) -> Self {
        Self { inner, check: None }
    }

    /// An action is about to be performed.
    pub(crate) fn action(&mut self, action: &Action<CheckError>) {
        let now = crate::clock::now();
        match action {
            Action::TryLock { conn } => self.started(*conn, CheckRole::Standby, None, now, true),
            Action::WaitForLock { conn, .. } => {
                self.started(*conn, CheckRole::Standby, None, now, false);
            }
            Action::ClaimLease { conn, .. } => {
                self.started(*conn, CheckRole::Standby, None, now, true);
            }
            Action::RenewLease { conn, .. } => {
                self.started(*conn, CheckRole::Leader, None, now, true);
            }
            Action::Ping { conn, backend_pid } => {
                self.started(*conn, CheckRole::Leader, Some(*backend_pid), now, true);
            }
            Action::BeginTerm { epoch, .. } => {
                if let Some(metrics) = self.inner.metrics() {
                    metrics.term_began(*epoch);
                }
            }
            Action::EndTerm { cause, .. } => {
                if let Some(metrics) = self.inner.metrics() {
                    metrics.term_ended();
                    metrics.transition(Transition::Ended(*cause));
                }
            }
            Action::Log(record) => self.log(record, now),
            // A standby check begins: whatever an earlier check left is moot.
            Action::AcquireConnection { .. } | Action::ProbePool { .. } => self.check = None,
            Action::ProbeFitness { .. } | Action::SurveyCandidates { .. } => {}
            Action::ReturnToPool { .. }
            | Action::ReleaseIfHeld { .. }
            | Action::ReportOverdueWork { .. }
            | Action::CloseConnection { .. }
            | Action::Hijack { .. }
            | Action::AdvanceEpoch { .. }
            | Action::AwaitWork { .. }
            | Action::Unlock { .. }
            | Action::ReleaseLease { .. }
            | Action::Fail(_)
            | Action::Finish => {}
        }
    }

    /// A completion is about to be reported to the core.
    pub(crate) fn completion(&mut self, event: &Event<CheckError>) {
        let now = crate::clock::now();
        let answered = match event {
            Event::LockGranted { conn, .. } | Event::LeaseClaimed { conn, .. } => {
                Some((*conn, Some(AttemptOutcome::Granted), true))
            }
            Event::LeaseRenewed { conn } => Some((*conn, None, true)),
            Event::LeaseLost { conn } => Some((*conn, None, false)),
            // A queued wait that the server's lock_timeout ended: refused for this check.
            Event::LockRefused { conn } | Event::LockWaitTimedOut { conn } => {
                Some((*conn, Some(AttemptOutcome::Refused), true))
            }
            Event::LockQueryFailed { conn, cause } => {
                Some((*conn, Some(attempt_failure(cause)), false))
            }
            Event::LockHeldBySession { conn, .. } => {
                Some((*conn, Some(AttemptOutcome::SharedSession), false))
            }
            Event::PingAnswered { conn, found } => {
                // The core's own verdict, on the backend the check was sent for.
                let proves = self
                    .check
                    .as_ref()
                    .and_then(|check| check.granted)
                    .is_some_and(|granted| found.verdict(granted).is_ok());
                Some((*conn, None, proves))
            }
            Event::PingFailed { conn, .. } => Some((*conn, None, false)),
            Event::AcquireFailed { .. } => {
                self.attempt(AttemptOutcome::NoConnection);
                None
            }
            _ => None,
        };
        let Some((conn, outcome, succeeded)) = answered else {
            return;
        };
        let Some(check) = self.check.take_if(|check| check.conn == conn) else {
            return;
        };
        self.answered(&check, now);
        if let Some(outcome) = outcome {
            self.attempt(outcome);
        }
        if succeeded && let Some(metrics) = self.inner.metrics() {
            metrics.check_succeeded();
        }
    }

    fn started(
        &mut self,
        conn: ConnId,
        role: CheckRole,
        granted: Option<i32>,
        now: Instant,
        timed: bool,
    ) {
        self.check = Some(InFlight {
            conn,
            role,
            granted,
            started: now,
            timed,
        });
    }

    fn log(&mut self, record: &LogRecord<CheckError>, now: Instant) {
        match record.kind {
            // Unfit: kept out of the election as an ineligible replica is, until a probe passes.
            LogKind::Unfit => {
                self.attempt(AttemptOutcome::Unfit);
                if let Some(metrics) = self.inner.metrics() {
                    metrics.set_eligible(false);
                }
            }
            LogKind::FitAgain => {
                if let Some(metrics) = self.inner.metrics() {
                    metrics.set_eligible(self.inner.election().is_eligible());
                }
            }
            _ => {}
        }
        if let Some(Cause::TimedOut(_)) = record.cause {
            match record.kind {
                LogKind::AcquireFailed => self.timed_out(CheckRole::Standby, now),
                LogKind::LeadershipLost => self.timed_out(CheckRole::Leader, now),
                _ => {}
            }
        }
    }

    /// A check's deadline passed: its statement, if one ran, is given up.
    fn timed_out(&mut self, role: CheckRole, now: Instant) {
        match self.check.take_if(|check| check.role == role) {
            Some(check) => {
                self.answered(&check, now);
                if role == CheckRole::Standby {
                    self.attempt(AttemptOutcome::TimedOut);
                }
            }
            // No statement ran: the pool did not hand out a connection in time.
            None if role == CheckRole::Standby => self.attempt(AttemptOutcome::NoConnection),
            None => {}
        }
    }

    /// The check's statement answered (or timed out) at `now`.
    fn answered(&self, check: &InFlight, now: Instant) {
        if let (true, Some(metrics)) = (check.timed, self.inner.metrics()) {
            metrics.check_latency(check.role, now.saturating_duration_since(check.started));
        }
    }

    fn attempt(&self, outcome: AttemptOutcome) {
        if let Some(metrics) = self.inner.metrics() {
            metrics.attempt(outcome);
        }
    }
}

/// The outcome of a grant statement that failed.
fn attempt_failure(cause: &CheckError) -> AttemptOutcome {
    match cause {
        CheckError::InRecovery => AttemptOutcome::InRecovery,
        CheckError::ReadOnly => AttemptOutcome::Unfit,
        _ => AttemptOutcome::Error,
    }
}
