//! Log records of the election as `tracing` events (target `plexsphere_leader`).

use std::time::Duration;

use plexsphere_leader_core::{Level, LogRecord};

use crate::error::CheckError;

/// Emits `record`: the message (with `": <cause>"` appended when there is a cause) and the
/// fields `term`, `cause` and `interval`.
pub(crate) fn emit(record: &LogRecord<CheckError>, interval: Duration) {
    let term = record.term.map(|term| term.get());
    let cause = record.cause.as_ref().map(tracing::field::display);
    let interval = tracing::field::debug(interval);
    match record.level() {
        Level::Info => {
            tracing::info!(target: "plexsphere_leader", term, cause, interval, "{record}");
        }
        Level::Warn => {
            tracing::warn!(target: "plexsphere_leader", term, cause, interval, "{record}");
        }
    }
}
