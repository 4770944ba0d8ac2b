//! A single-lock model's paths explained: every step with the inputs each core machine received,
//! and the last state in one line.

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;

use stateright::Path;

use super::SingleModel;
use super::state::State;
use crate::check::Checked;
use crate::step::Step;
use crate::trace::ms;

impl Checked for SingleModel {
    fn explored(&self) -> &Arc<AtomicUsize> {
        &self.explored
    }

    fn explain(&self, path: &Path<State, Step>) -> Vec<String> {
        let recorder = self.record(path);
        let last = Some(path.last_state().clone());
        let mut lines: Vec<String> = recorder.lines().iter().map(ToString::to_string).collect();
        if let Some(state) = last {
            lines.push(format!(
                "end (server {}): {}",
                ms(state.now),
                summary(&state)
            ));
        }
        lines
    }
}

/// Who leads in `state`, and the environment's view of the lock and the lease.
fn summary(state: &State) -> String {
    let replicas: Vec<String> = state
        .replicas
        .iter()
        .map(|r| {
            let mut text = format!("r{}.{} {:?}", r.name, r.run, r.machine.phase());
            if r.machine.is_leader() {
                text.push_str(&format!(" leads (epoch {:?})", r.epoch));
            }
            if r.paused {
                text.push_str(" paused");
            }
            if r.lost.is_some() {
                text.push_str(&format!(" lost its lock {} ago", ms(r.stale)));
            }
            text
        })
        .collect();
    let name = |index: u8| {
        state
            .replicas
            .get(usize::from(index))
            .map_or(u8::MAX, |r| r.name)
    };
    let holder = state.server.holder.map_or_else(
        || "free".to_owned(),
        |h| format!("r{}.{} {:?}", name(h.replica), h.run, h.conn),
    );
    let lease = state.server.lease.committed.map_or_else(
        || "none".to_owned(),
        |row| {
            format!(
                "r{}.{} epoch {} expires {}",
                name(row.holder.0),
                row.holder.1,
                row.epoch,
                ms(row.expires)
            )
        },
    );
    format!(
        "{}; lock {holder}; lease {lease}; broken {:?}",
        replicas.join(", "),
        state.broken
    )
}
