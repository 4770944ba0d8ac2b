//! How a term's lock was given back: what the graceful stop's unlock (or its absence) left on
//! the server, read out of the election's own log records so that an operator's tool can say
//! what happened instead of assuming a release.

use std::fmt;
use std::time::Duration;

use crate::action::{LogKind, LogRecord};
use crate::cause::Cause;
use crate::ids::TermId;

/// The end of a term's hold on the lock. Produced once per term that was stopped, resigned,
/// abandoned, or whose session ended while it stopped; a term lost to a failed check has none
/// (its lock is already gone or unproven, and nothing is sent).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Release {
    /// The term whose lock it was.
    pub term: TermId,
    /// What happened to the lock.
    pub outcome: ReleaseOutcome,
}

/// What happened to the lock when its term gave it up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ReleaseOutcome {
    /// `pg_advisory_unlock` answered `true`: the lock is free at once.
    Released,
    /// `pg_advisory_unlock` answered `false`: the session no longer held the lock.
    NotHeld,
    /// The unlock got no answer within this budget; the connection was closed. The server frees
    /// the lock when it notices the session ended: at once when the close reaches it, else when
    /// `idle_session_timeout` (or TCP keepalive) ends the session.
    Unanswered(Duration),
    /// The unlock failed with an error; the connection was closed, and the server frees the
    /// lock with the session as for [`Unanswered`](Self::Unanswered).
    Failed,
    /// The lock session ended while the stop waited for work or unlocked: the server freed the
    /// lock with the session.
    SessionEnded,
    /// A panic or a drop closed the connection without unlocking: the server frees the lock with
    /// the session.
    Abandoned,
}

impl ReleaseOutcome {
    /// Whether the server confirmed the lock free (or not held) before the run went on.
    pub const fn is_confirmed(self) -> bool {
        matches!(self, Self::Released | Self::NotHeld)
    }

    /// A stable `snake_case` label, for metrics and scripts.
    pub const fn label(self) -> &'static str {
        match self {
            Self::Released => "released",
            Self::NotHeld => "not_held",
            Self::Unanswered(_) => "unanswered",
            Self::Failed => "failed",
            Self::SessionEnded => "session_ended",
            Self::Abandoned => "abandoned",
        }
    }
}

impl fmt::Display for ReleaseOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Released => f.write_str("lock released"),
            Self::NotHeld => f.write_str("the session no longer held the lock"),
            Self::Unanswered(budget) => write!(
                f,
                "the unlock got no answer within {budget:?}; the connection was closed and the \
                 server frees the lock when the session ends (at the latest by \
                 idle_session_timeout)"
            ),
            Self::Failed => f.write_str(
                "the unlock failed; the connection was closed and the server frees the lock \
                 when the session ends (at the latest by idle_session_timeout)",
            ),
            Self::SessionEnded => {
                f.write_str("the lock session ended while stopping: the server freed the lock")
            }
            Self::Abandoned => f.write_str(
                "closed without unlocking (panic or drop): the server frees the lock when the \
                 session ends",
            ),
        }
    }
}

impl<C> LogRecord<C> {
    /// The release this record reports, for the records that end a term's hold on the lock
    /// (`LockReleased`, `ResignReleased`, `YieldReleased`, `ReleaseFailed`, `SessionEndedWhileStopping`,
    /// `AbandonedAfterPanic`, `AbandonedAfterDrop` with a term); `None` for every other record.
    pub fn release(&self) -> Option<Release> {
        let term = self.term?;
        let outcome = match (self.kind, &self.cause) {
            (LogKind::LockReleased | LogKind::ResignReleased | LogKind::YieldReleased, _) => {
                ReleaseOutcome::Released
            }
            (LogKind::ReleaseFailed, Some(Cause::LockNotHeld | Cause::LeaseNotHeld)) => {
                ReleaseOutcome::NotHeld
            }
            (LogKind::ReleaseFailed, Some(Cause::TimedOut(budget))) => {
                ReleaseOutcome::Unanswered(*budget)
            }
            (LogKind::ReleaseFailed, _) => ReleaseOutcome::Failed,
            (LogKind::SessionEndedWhileStopping, _) => ReleaseOutcome::SessionEnded,
            (LogKind::AbandonedAfterPanic | LogKind::AbandonedAfterDrop, _) => {
                ReleaseOutcome::Abandoned
            }
            (
                LogKind::AcquireFailed
                | LogKind::LeadershipAcquired
                | LogKind::LeadershipLost
                | LogKind::WorkInterrupted
                | LogKind::WorkOutlivedStop
                | LogKind::FencingFailed
                | LogKind::Resigned
                | LogKind::GrantReleasedAfterWaitTimeout
                | LogKind::StrandedLockReleased
                | LogKind::LeaseRenewalFailed
                | LogKind::PoolMultiplexes
                | LogKind::LockNotExclusive
                | LogKind::ProofInconclusive
                | LogKind::Unfit
                | LogKind::FitAgain
                | LogKind::ProbeFailed
                | LogKind::Yielded
                | LogKind::Deferring
                | LogKind::DeferLimitReached
                | LogKind::SurveyFailed
                | LogKind::BelowFloor
                | LogKind::AboveFloorAgain,
                _,
            ) => return None,
        };
        Some(Release { term, outcome })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TERM: TermId = TermId::new(3);

    fn record(kind: LogKind, cause: Option<Cause<&'static str>>) -> LogRecord<&'static str> {
        LogRecord {
            kind,
            term: Some(TERM),
            cause,
        }
    }

    #[test]
    fn each_way_a_hold_ends_is_its_outcome() {
        let budget = Duration::from_secs(2);
        let cases = [
            (
                record(LogKind::LockReleased, None),
                ReleaseOutcome::Released,
            ),
            (
                record(LogKind::ResignReleased, None),
                ReleaseOutcome::Released,
            ),
            (
                record(LogKind::YieldReleased, None),
                ReleaseOutcome::Released,
            ),
            (
                record(LogKind::ReleaseFailed, Some(Cause::LockNotHeld)),
                ReleaseOutcome::NotHeld,
            ),
            (
                record(LogKind::ReleaseFailed, Some(Cause::TimedOut(budget))),
                ReleaseOutcome::Unanswered(budget),
            ),
            (
                record(LogKind::ReleaseFailed, Some(Cause::Error("reset"))),
                ReleaseOutcome::Failed,
            ),
            (
                record(
                    LogKind::SessionEndedWhileStopping,
                    Some(Cause::Error("gone")),
                ),
                ReleaseOutcome::SessionEnded,
            ),
            (
                record(LogKind::AbandonedAfterPanic, None),
                ReleaseOutcome::Abandoned,
            ),
            (
                record(LogKind::AbandonedAfterDrop, None),
                ReleaseOutcome::Abandoned,
            ),
        ];
        for (record, outcome) in cases {
            assert_eq!(
                record.release(),
                Some(Release {
                    term: TERM,
                    outcome
                }),
                "{:?}",
                record.kind
            );
        }
    }

    #[test]
    fn records_that_do_not_end_a_hold_have_no_release() {
        for kind in [
            LogKind::AcquireFailed,
            LogKind::LeadershipAcquired,
            LogKind::LeadershipLost,
            LogKind::WorkInterrupted,
            LogKind::WorkOutlivedStop,
            LogKind::FencingFailed,
            LogKind::Resigned,
            LogKind::GrantReleasedAfterWaitTimeout,
        ] {
            assert_eq!(record(kind, None).release(), None, "{kind:?}");
        }
        let without_term = LogRecord::<&str> {
            kind: LogKind::LockReleased,
            term: None,
            cause: None,
        };
        assert_eq!(without_term.release(), None);
    }

    #[test]
    fn only_an_answered_unlock_is_confirmed_and_each_outcome_says_what_frees_the_lock() {
        let all = [
            ReleaseOutcome::Released,
            ReleaseOutcome::NotHeld,
            ReleaseOutcome::Unanswered(Duration::from_secs(2)),
            ReleaseOutcome::Failed,
            ReleaseOutcome::SessionEnded,
            ReleaseOutcome::Abandoned,
        ];
        let confirmed: Vec<_> = all.iter().map(|o| o.is_confirmed()).collect();
        assert_eq!(confirmed, [true, true, false, false, false, false]);
        let labels: Vec<_> = all.iter().map(|o| o.label()).collect();
        assert_eq!(
            labels,
            [
                "released",
                "not_held",
                "unanswered",
                "failed",
                "session_ended",
                "abandoned"
            ]
        );
        assert_eq!(ReleaseOutcome::Released.to_string(), "lock released");
        assert!(
            ReleaseOutcome::Unanswered(Duration::from_secs(2))
                .to_string()
                .contains("no answer within 2s"),
        );
        for unconfirmed in &all[2..] {
            assert!(
                unconfirmed.to_string().contains("server"),
                "{unconfirmed:?}"
            );
        }
    }
}
