//! Leader work: the outcome table of the spec's `Do`.
//!
//! | Situation                                         | work called | outcome                         |
//! |---------------------------------------------------|-------------|---------------------------------|
//! | standby                                           | no          | [`WorkOutcome::Skipped`]: `Ok(false)` |
//! | leader, leadership held until the work returns    | yes         | [`WorkOutcome::Completed`]: `Ok(true)` or the work's error |
//! | leader, term ended while the work ran             | yes         | [`WorkOutcome::Interrupted`]: `Ok(false)`, logged at INFO |
//!
//! A demotion never counts as a failed tick: only [`WorkOutcome::Completed`] with an error does.

use std::fmt;

use crate::action::LogKind;
use crate::cause::TermEndCause;

/// Why the term a unit of work ran under ended before the work returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Interruption {
    /// The election ended the term: lost, stopped, resigned or, for a shard, handed over.
    Term(TermEndCause),
    /// The caller's own cancellation token was cancelled (a shutdown of the caller).
    ParentCancelled,
}

impl fmt::Display for Interruption {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Term(cause) => cause.fmt(f),
            Self::ParentCancelled => f.write_str("parent cancelled"),
        }
    }
}

/// Where the term stood when the work returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TermStatus {
    /// The term was still open.
    Live,
    /// The term had ended, for this reason.
    Ended(Interruption),
}

/// The settled result of one unit of leader work.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkOutcome<T, E> {
    /// The replica was not leading: the work was not called.
    Skipped,
    /// The term held until the work returned: its own result.
    Completed(Result<T, E>),
    /// The term ended while the work ran: its result is discarded, and it is not a failure.
    Interrupted(Interruption),
}

impl<T, E> WorkOutcome<T, E> {
    /// Settles the result of work that ran, given where its term stood when it returned. The
    /// result is discarded whenever the term ended, whatever else happened.
    pub fn settle(status: TermStatus, result: Result<T, E>) -> Self {
        match status {
            TermStatus::Live => Self::Completed(result),
            TermStatus::Ended(why) => Self::Interrupted(why),
        }
    }

    /// Whether this outcome is a failed tick: only work that kept its term and returned an
    /// error is.
    pub fn is_failure(&self) -> bool {
        matches!(self, Self::Completed(Err(_)))
    }

    /// The log record this outcome calls for: INFO [`LogKind::WorkInterrupted`] when the election
    /// ended the term under the work; none otherwise (a caller that cancelled its own work knows).
    pub fn log_kind(&self) -> Option<LogKind> {
        match self {
            Self::Interrupted(Interruption::Term(_)) => Some(LogKind::WorkInterrupted),
            _ => None,
        }
    }

    /// The spec's `(bool, error)` pair as a `Result`: `Ok(true)` when the work ran and held its
    /// term, `Ok(false)` when it was skipped or interrupted, the work's error otherwise.
    pub fn into_result(self) -> Result<bool, E> {
        match self {
            Self::Completed(Ok(_)) => Ok(true),
            Self::Completed(Err(error)) => Err(error),
            Self::Skipped | Self::Interrupted(_) => Ok(false),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Outcome = WorkOutcome<(), &'static str>;

    #[test]
    fn a_standby_skips_the_work_with_false_and_no_error() {
        let outcome = Outcome::Skipped;
        assert!(!outcome.is_failure());
        assert_eq!(outcome.log_kind(), None);
        assert_eq!(outcome.into_result(), Ok(false));
    }

    #[test]
    fn work_that_keeps_its_term_returns_true_and_its_own_result() {
        let ok = Outcome::settle(TermStatus::Live, Ok(()));
        assert_eq!(ok, WorkOutcome::Completed(Ok(())));
        assert!(!ok.is_failure());
        assert_eq!(ok.into_result(), Ok(true));

        let failed = Outcome::settle(TermStatus::Live, Err("boom"));
        assert!(failed.is_failure());
        assert_eq!(failed.log_kind(), None);
        assert_eq!(failed.into_result(), Err("boom"));
    }

    #[test]
    fn leadership_lost_while_running_is_false_no_error_logged_at_info_and_not_a_failure() {
        let lost = TermStatus::Ended(Interruption::Term(TermEndCause::Lost(
            crate::LossReason::CheckFailed,
        )));
        for result in [Ok(()), Err("cancelled by the term")] {
            let outcome = Outcome::settle(lost, result);
            assert!(!outcome.is_failure());
            assert_eq!(outcome.log_kind(), Some(LogKind::WorkInterrupted));
            assert_eq!(LogKind::WorkInterrupted.level(), crate::Level::Info);
            assert_eq!(outcome.into_result(), Ok(false));
        }
    }

    #[test]
    fn a_stop_of_the_election_while_running_is_not_a_failure() {
        let stopped = TermStatus::Ended(Interruption::Term(TermEndCause::Stopped));
        let outcome = Outcome::settle(stopped, Err("cancelled"));
        assert!(!outcome.is_failure());
        assert_eq!(outcome.into_result(), Ok(false));
    }

    #[test]
    fn interruptions_render_their_cause() {
        let lost = Interruption::Term(TermEndCause::Lost(crate::LossReason::CheckFailed));
        assert_eq!(lost.to_string(), "leadership lost: the check failed");
        assert_eq!(
            Interruption::ParentCancelled.to_string(),
            "parent cancelled"
        );
    }

    #[test]
    fn a_cancelled_parent_during_shutdown_is_not_a_failure_and_not_logged() {
        let outcome = Outcome::settle(TermStatus::Ended(Interruption::ParentCancelled), Err("x"));
        assert!(!outcome.is_failure());
        assert_eq!(outcome.log_kind(), None);
        assert_eq!(outcome.into_result(), Ok(false));
    }
}
