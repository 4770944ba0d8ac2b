//! A standby's failed check as the core's failure policy
//! ([`FailureReports`](plexsphere_leader_core::failures::FailureReports)) reports it: shared by
//! the single and the sharded driver, so both log a permanent mistake once at ERROR and keep
//! the latest failure for their elector's `check_failure`.

use plexsphere_leader_core::Cause;
use plexsphere_leader_core::failures::{FailureClass, FailureReport, FailureReports};

use crate::clock::now;
use crate::error::CheckError;
use crate::leadership::CheckFailure;

/// The current run of failed checks of one run of an election.
#[derive(Debug, Default)]
pub(crate) struct CheckFailures {
    reports: FailureReports,
}

impl CheckFailures {
    /// A check failed with `cause`: how to log it, and the failure in full. The election's own
    /// verdicts (no answer in time, a shared session) are transient failures.
    pub(crate) fn failed(&mut self, cause: &Cause<CheckError>) -> (FailureReport, CheckFailure) {
        let (class, advice) = match cause {
            Cause::Error(error) => (error.class(), error.advice()),
            _ => (FailureClass::Transient, None),
        };
        let text = cause.to_string();
        let report = self.reports.failed(now(), class, fingerprint(&text));
        let failure = CheckFailure {
            class: report.run.class,
            since: report.run.since,
            failures: report.run.failures,
            error: text,
            advice,
        };
        (report, failure)
    }

    /// A check worked: whether that ended a run of failures.
    pub(crate) fn succeeded(&mut self) -> bool {
        self.reports.succeeded().is_some()
    }
}

/// A fingerprint of a failure's text: the same error, the same fingerprint.
fn fingerprint(text: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut hasher);
    hasher.finish()
}
