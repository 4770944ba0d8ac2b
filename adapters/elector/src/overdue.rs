//! The hard deadline for leader work after its term ended ([`Config::work_deadline`]).
//!
//! [`Config::work_deadline`]: crate::Config::work_deadline

use std::time::Duration;

use plexsphere_leader_core::WorkDeadline;

use crate::term::TermShared;

/// The message of the WARN line for overdue work; scripts may match on it.
pub const OVERDUE_WORK_MESSAGE: &str =
    "leader: background work still running after the work deadline";

/// The work deadline of the ended `term` passed (the election's
/// [`Action::ReportOverdueWork`](plexsphere_leader_core::Action::ReportOverdueWork)): if any of
/// its work still holds a [`Term`](crate::Term), reports it (WARN, naming the work) and, when
/// `abort`, aborts what can be aborted. `run_finished`: the run finished before the deadline
/// (field `when` says `run finished` instead of `deadline`); `deadline` is the options' work
/// deadline, logged as field `deadline`. Returns `Some(aborted)` when something was reported.
pub(crate) fn report(
    term: &TermShared,
    deadline: Option<WorkDeadline>,
    abort: bool,
    run_finished: bool,
) -> Option<bool> {
    if term.live_handles() == 0 {
        return None;
    }
    let deadline = deadline.map_or(Duration::ZERO, |deadline| deadline.after);
    let work = term.running_work().join(", ");
    let aborted = abort && term.abort_work() > 0;
    let cause = term
        .ended()
        .map(|cause| cause.to_string())
        .unwrap_or_default();
    tracing::warn!(
        target: "plexsphere_leader",
        term = term.id().get(),
        cause,
        deadline = ?deadline,
        work,
        aborted,
        when = if run_finished { "run finished" } else { "deadline" },
        "{OVERDUE_WORK_MESSAGE}: {work}"
    );
    Some(aborted)
}
