//! The hard deadline for leader work after its term ended ([`Config::work_deadline`]).
//!
//! [`Config::work_deadline`]: crate::Config::work_deadline

use std::sync::Arc;
use std::time::Duration;

use crate::config::OnOverdue;
use crate::term::TermShared;

/// The message of the WARN line for overdue work; scripts may match on it.
pub const OVERDUE_WORK_MESSAGE: &str =
    "leader: background work still running after the work deadline";

/// Watches the ended `term`: if any of its work still holds a [`Term`](crate::Term) `deadline`
/// later, reports it (WARN, naming the work; `on_report` is called with the number of live
/// handles and whether any was aborted) and, with [`OnOverdue::Abort`], aborts what can be
/// aborted. Spawned on the current tokio runtime; without one (a drop outside any runtime)
/// nothing is watched.
pub(crate) fn watch(
    term: Arc<TermShared>,
    deadline: Duration,
    on_overdue: OnOverdue,
    on_report: impl FnOnce(usize, bool) + Send + 'static,
) {
    if term.live_handles() == 0 {
        return;
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    runtime.spawn(async move {
        tokio::select! {
            () = term.drained() => {}
            () = tokio::time::sleep(deadline) => {
                let live = term.live_handles();
                if live == 0 {
                    return;
                }
                let work = term.running_work().join(", ");
                let aborted = on_overdue == OnOverdue::Abort && term.abort_work() > 0;
                let cause = term.ended().map(|cause| cause.to_string()).unwrap_or_default();
                tracing::warn!(
                    target: "plexsphere_leader",
                    term = term.id().get(),
                    cause,
                    deadline = ?deadline,
                    work,
                    aborted,
                    "{OVERDUE_WORK_MESSAGE}: {work}"
                );
                on_report(live, aborted);
            }
        }
    });
}
