//! A standby's failed check as the core's failure policy
//! ([`FailureReports`](plexsphere_leader_core::failures::FailureReports)) reports it: shared by
//! the single and the sharded driver, so both log a permanent mistake once at ERROR and keep
//! the latest failure for their elector's `check_failure`.

use plexsphere_leader_core::failures::{FailureClass, FailureReport, FailureReports};
use plexsphere_leader_core::{Cause, Level};

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
        let error = error_of(cause);
        let class = error.map_or(FailureClass::Transient, CheckError::class);
        let advice = error.and_then(CheckError::advice);
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

/// The level to log a record at: for a failed check, its `report`'s (`None`: a repeat kept
/// quiet); for any other record, its `own` level.
pub(crate) fn level(report: Option<&FailureReport>, own: Level) -> Option<Level> {
    match report {
        Some(report) => report.level,
        None => Some(own),
    }
}

/// What a failure adds to its message: `"; advice: <what to do>"` for a permanent failure,
/// and `" (N more since the last line)"` when `report` kept N identical ones quiet.
pub(crate) fn suffix(cause: Option<&Cause<CheckError>>, report: Option<&FailureReport>) -> String {
    let mut suffix = String::new();
    if let Some(advice) = cause.and_then(error_of).and_then(CheckError::advice) {
        suffix.push_str("; advice: ");
        suffix.push_str(&advice);
    }
    if let Some(quiet) = report.map(|report| report.quiet).filter(|quiet| *quiet > 0) {
        suffix.push_str(&format!(" ({quiet} more since the last line)"));
    }
    suffix
}

/// The driver's error a cause carries, if it is one.
pub(crate) fn error_of(cause: &Cause<CheckError>) -> Option<&CheckError> {
    match cause {
        Cause::Error(error) => Some(error),
        _ => None,
    }
}

/// A fingerprint of a failure's text: the same error, the same fingerprint.
fn fingerprint(text: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut hasher);
    hasher.finish()
}
