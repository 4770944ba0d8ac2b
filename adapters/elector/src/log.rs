//! Log records of the election as `tracing` events (target `plexsphere_leader`).

use std::time::Duration;

use plexsphere_leader_core::{Level, LogRecord};

use crate::error::CheckError;

/// Emits `record`: the message (with `": <cause>"` appended when there is a cause, and
/// `": <work>"` when `work` names running work) and the fields `term`, `cause`, `interval`,
/// `work` and `database` (the database of the last grant statement that answered, once one
/// did). The election's span adds `key` and `identity`.
pub(crate) fn emit(
    record: &LogRecord<CheckError>,
    interval: Duration,
    work: Option<&str>,
    database: Option<&str>,
) {
    let term = record.term.map(|term| term.get());
    let cause = record.cause.as_ref().map(tracing::field::display);
    let interval = tracing::field::debug(interval);
    let database = database.map(tracing::field::display);
    let suffix = work.map(|work| format!(": {work}")).unwrap_or_default();
    match record.level() {
        Level::Info => {
            tracing::info!(
                target: "plexsphere_leader", term, cause, interval, work, database,
                "{record}{suffix}"
            );
        }
        Level::Warn => {
            tracing::warn!(
                target: "plexsphere_leader", term, cause, interval, work, database,
                "{record}{suffix}"
            );
        }
    }
}
