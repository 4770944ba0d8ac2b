//! Time passing: the replicas' clocks at their rates, the server's own deadlines, every
//! replica's deadlines fired, each owner's fenced write; and the next instant anything is due.

use plexsphere_leader_core::Machine;

use super::state::Broken;
use super::world::World;
use super::{Mode, PauseClock};
use crate::clock::{Micros, Rate, local_delta};
use crate::trace::Input;

impl<M: Mode> World<'_, M> {
    /// Time passes to `to`: the clocks run, the server's timeouts, then every replica's
    /// deadlines, then each owner's fenced write.
    pub(super) fn advance(&mut self, to: Micros) {
        let delta = to - self.s.now;
        self.s.now = to;
        M::age(self.model, self.s, delta);
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
