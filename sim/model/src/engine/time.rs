//! Time passing: the replicas' clocks at their rates, the server's own deadlines, every
//! replica's deadlines fired, each owner's fenced write; and the next instant anything is due.

use plexsphere_leader_core::Machine;

use super::state::{Broken, State};
use super::world::World;
use super::{ElectionModel, Mode, PauseClock};
use crate::clock::{Micros, Rate, local_delta, micros, server_delta};
use crate::server::Locks;
use crate::trace::Input;

impl<M: Mode> World<'_, M> {
    /// Time passes to `to`: the clocks run, the server's timeouts, then every replica's
    /// deadlines, then each owner's fenced write.
    pub(super) fn advance(&mut self, to: Micros) {
        let delta = to - self.s.now;
        self.s.now = to;
        M::age(self.s, delta);
        let stops = self.model.pause_clock == PauseClock::Stops;
        for replica in &mut self.s.replicas {
            if !(replica.paused && stops) {
                replica.local += local_delta(delta, replica.rate.ppm());
            }
        }
        M::lock_timeouts(self);
        let idle = self.model.idle_timeout();
        while let Some((at, sess)) = self.s.server.next_idle_end(idle)
            && at <= to
        {
            // `idle_session_timeout`: FATAL 57P05.
            self.end_session(sess, true);
        }
        for r in 0..self.s.replicas.len() {
            if !self.s.replicas[r].paused && self.s.replicas[r].machine.is_running() {
                self.feed(r, Input::Timeout);
            }
        }
        if M::stale_write_accepted(self.model, self.s) {
            self.s.broken = Some(Broken::StaleWriteAccepted);
        }
    }
}

/// The next instant anything is due, on the server's clock: a replica's deadline (through its
/// clock's rate), the lock table's timeouts, an idle session's end, and the mode's bounds.
pub fn next_instant<M: Mode>(model: &ElectionModel<M>, s: &State<M>) -> Option<Micros> {
    let replicas = s.replicas.iter().filter_map(|replica| {
        if replica.paused || M::skips_deadline(model.sabotage, &replica.machine) {
            return None;
        }
        let due = replica.machine.poll_timeout().map(micros)?;
        let ahead = due.saturating_sub(replica.local);
        Some(s.now + server_delta(ahead, replica.rate.ppm()).max(1))
    });
    let server = [
        s.server.locks.next_wait_timeout().map(|(at, _)| at),
        s.server
            .next_idle_end(model.idle_timeout())
            .map(|(at, _)| at),
        M::bound_instant(model, s),
    ];
    replicas
        .chain(server.into_iter().flatten())
        .map(|at| at.max(s.now + 1))
        .min()
}
