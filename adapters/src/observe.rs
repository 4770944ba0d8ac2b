//! What the driver shows of a run: it turns the actions it performs, the completions it reports
//! and the log records of the core into metric observations and the leader's last-check time
//! (for liveness). It observes only; the core decides.

use std::sync::Arc;
use std::time::Instant;

use plexsphere_leader_core::{
    Action, Cause, ConnId, Event, LogKind, LogRecord, TermEndCause, TermId,
};

use crate::elector::Inner;
use crate::error::CheckError;
use crate::metrics::{AttemptOutcome, CheckRole, Transition};

/// The observer of one run, owned by its driver.
pub(crate) struct Observer {
    inner: Arc<Inner>,
    /// The check statement in flight.
    check: Option<InFlight>,
    /// A term that ended, whose transition waits for the log record that says why.
    ended: Option<(TermId, TermEndCause)>,
}

/// A check statement in flight.
struct InFlight {
    conn: ConnId,
    role: CheckRole,
    started: Instant,
    /// Whether its latency is observed: not for a queued wait, whose length is the wait.
    timed: bool,
}

impl Observer {
    pub(crate) fn new(inner: Arc<Inner>) -> Self {
        Self {
            inner,
            check: None,
            ended: None,
        }
    }

    /// An action is about to be performed.
    pub(crate) fn action(&mut self, action: &Action<CheckError>) {
        let now = crate::driver::now();
        match action {
            Action::TryLock { conn } => self.started(*conn, CheckRole::Standby, now, true),
            Action::WaitForLock { conn, .. } => {
                self.started(*conn, CheckRole::Standby, now, false);
            }
            Action::Ping { conn } => self.started(*conn, CheckRole::Leader, now, true),
            Action::BeginTerm { epoch, .. } => {
                self.inner.last_check().record(now);
                if let Some(metrics) = self.inner.metrics() {
                    metrics.term_began(*epoch);
                }
            }
            Action::EndTerm { term, cause } => {
                self.flush();
                self.ended = Some((*term, *cause));
                self.inner.last_check().clear();
                if let Some(metrics) = self.inner.metrics() {
                    metrics.term_ended();
                }
            }
            Action::Log(record) => self.log(record, now),
            // A standby check begins: whatever an earlier check left is moot.
            Action::AcquireConnection { .. } => self.check = None,
            Action::ReturnToPool { .. }
            | Action::CloseConnection { .. }
            | Action::Hijack { .. }
            | Action::AdvanceEpoch { .. }
            | Action::AwaitWork { .. }
            | Action::Unlock { .. }
            | Action::Finish => {}
        }
    }

    /// A completion is about to be reported to the core.
    pub(crate) fn completion(&mut self, event: &Event<CheckError>) {
        let now = crate::driver::now();
        let answered = match event {
            Event::LockGranted { conn } => Some((*conn, Some(AttemptOutcome::Granted), true)),
            Event::LockRefused { conn } => Some((*conn, Some(AttemptOutcome::Refused), true)),
            Event::LockQueryFailed { conn, cause } => {
                Some((*conn, Some(attempt_failure(cause)), false))
            }
            Event::PingOk { conn } => Some((*conn, None, true)),
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
        if succeeded {
            if check.role == CheckRole::Leader {
                self.inner.last_check().record(now);
            }
            if let Some(metrics) = self.inner.metrics() {
                metrics.check_succeeded();
            }
        }
    }

    /// Every action of one input was performed: a term end that no log record explained is
    /// counted now.
    pub(crate) fn flush(&mut self) {
        if let Some((_, cause)) = self.ended.take() {
            self.transition(transition(cause, None));
        }
    }

    fn started(&mut self, conn: ConnId, role: CheckRole, now: Instant, timed: bool) {
        self.check = Some(InFlight {
            conn,
            role,
            started: now,
            timed,
        });
    }

    fn log(&mut self, record: &LogRecord<CheckError>, now: Instant) {
        if let Some(Cause::TimedOut(_)) = record.cause {
            match record.kind {
                LogKind::AcquireFailed => self.timed_out(CheckRole::Standby, now),
                LogKind::LeadershipLost => self.timed_out(CheckRole::Leader, now),
                _ => {}
            }
        }
        if let Some((term, cause)) = self.ended
            && record.term == Some(term)
        {
            self.ended = None;
            self.transition(transition(cause, Some(record)));
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

    fn transition(&self, transition: Transition) {
        if let Some(metrics) = self.inner.metrics() {
            metrics.transition(transition);
        }
    }
}

/// Why a term ended, from the core's cause and the log record of that term that followed it in
/// the same batch of actions, if any. The one place that maps causes to transitions: a new
/// [`TermEndCause`] fails to compile here until it is given its label.
fn transition(cause: TermEndCause, record: Option<&LogRecord<CheckError>>) -> Transition {
    let logged = record.map(|record| (record.kind, record.cause.as_ref()));
    match cause {
        TermEndCause::Stopped => Transition::Stopped,
        TermEndCause::Resigned => Transition::Resigned,
        TermEndCause::LeadershipLost => match logged {
            Some((LogKind::AbandonedAfterPanic, _)) => Transition::Panicked,
            Some((LogKind::AbandonedAfterDrop, _)) => Transition::Dropped,
            Some((_, Some(Cause::TimedOut(_)))) => Transition::CheckTimedOut,
            Some((_, Some(Cause::Error(error)))) if error.ends_session() => {
                Transition::SessionEnded
            }
            _ => Transition::CheckFailed,
        },
    }
}

/// The outcome of a grant statement that failed.
fn attempt_failure(cause: &CheckError) -> AttemptOutcome {
    match cause {
        CheckError::InRecovery => AttemptOutcome::InRecovery,
        CheckError::SharedSession => AttemptOutcome::SharedSession,
        _ => AttemptOutcome::Error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(kind: LogKind, cause: Option<Cause<CheckError>>) -> LogRecord<CheckError> {
        LogRecord {
            kind,
            term: Some(TermId::new(1)),
            cause,
        }
    }

    #[test]
    fn each_term_end_maps_to_its_transition() {
        let lost = TermEndCause::LeadershipLost;
        let timed_out = Cause::TimedOut(std::time::Duration::from_secs(1));
        let cases = [
            (TermEndCause::Stopped, None, Transition::Stopped),
            (
                TermEndCause::Resigned,
                Some(record(LogKind::Resigned, None)),
                Transition::Resigned,
            ),
            (
                lost,
                Some(record(LogKind::LeadershipLost, Some(timed_out))),
                Transition::CheckTimedOut,
            ),
            (
                lost,
                Some(record(
                    LogKind::LeadershipLost,
                    Some(Cause::Error(CheckError::SessionEnded)),
                )),
                Transition::SessionEnded,
            ),
            (
                lost,
                Some(record(
                    LogKind::LeadershipLost,
                    Some(Cause::Error(CheckError::LockNotVerified(
                        crate::LockFinding::NotHeld,
                    ))),
                )),
                Transition::CheckFailed,
            ),
            (
                lost,
                Some(record(LogKind::AbandonedAfterPanic, None)),
                Transition::Panicked,
            ),
            (
                lost,
                Some(record(LogKind::AbandonedAfterDrop, None)),
                Transition::Dropped,
            ),
            (lost, None, Transition::CheckFailed),
        ];
        for (cause, record, expected) in cases {
            assert_eq!(transition(cause, record.as_ref()), expected, "{record:?}");
        }
    }
}
