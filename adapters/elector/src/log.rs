//! Log records of the election as `tracing` events (target `plexsphere_leader`).

use std::time::Duration;

use plexsphere_leader_core::failures::FailureReport;
use plexsphere_leader_core::{Level, LogRecord};

use crate::error::CheckError;

/// Emits `record`: the message (with `": <cause>"` appended when there is a cause, and
/// `": <work>"` when `work` names running work) and the fields `term`, `cause`, `interval`,
/// `work` and `database` (the database of the last grant statement that answered, once one
/// did). The election's span adds `key`, `identity` and `pid`. An election that holds a
/// lease (`lease`) words the message for it ([`LogRecord::lease_text`]).
///
/// A failed check's `report` (the core's [`FailureReports`](plexsphere_leader_core::failures))
/// sets the level (ERROR for the first of a run of permanent failures, nothing for a repeat it
/// keeps quiet) and adds the fields `class`, `sqlstate` and `repeats` (the identical failures
/// kept quiet since the last line); the advice of a permanent failure is
/// also appended to the message (`"; advice: <what to do>"`).
pub(crate) fn emit(
    record: &LogRecord<CheckError>,
    interval: Duration,
    work: Option<&str>,
    database: Option<&str>,
    report: Option<&FailureReport>,
    lease: bool,
) {
    let Some(level) = crate::failure::level(report, record.level()) else {
        return;
    };
    let term = record.term.map(|term| term.get());
    let cause = record.cause.as_ref().map(tracing::field::display);
    let interval = tracing::field::debug(interval);
    let database = database.map(tracing::field::display);
    let class = report.map(|report| report.run.class.label());
    let sqlstate = record
        .cause
        .as_ref()
        .and_then(crate::failure::error_of)
        .and_then(CheckError::sqlstate);
    let repeats = report.map(|report| report.quiet).filter(|quiet| *quiet > 0);
    let text = if lease {
        record.lease_text()
    } else {
        record.to_string()
    };
    let mut suffix = work.map(|work| format!(": {work}")).unwrap_or_default();
    suffix.push_str(&crate::failure::suffix(record.cause.as_ref(), report));
    macro_rules! at {
        ($event:ident) => {
            tracing::$event!(
                target: "plexsphere_leader", term, cause, interval, work, database, class,
                sqlstate, repeats, "{text}{suffix}"
            )
        };
    }
    match level {
        Level::Info => at!(info),
        Level::Warn => at!(warn),
        Level::Error => at!(error),
    }
}
