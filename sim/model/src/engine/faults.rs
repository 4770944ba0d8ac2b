//! The faults and the operator's controls, as steps of the model.

use super::Mode;
use super::world::World;
use crate::flight::Stage;
use crate::server::{Locks, Sess};
use crate::trace::Input;

impl<M: Mode> World<'_, M> {
    /// Replica `r`'s process dies and starts again. With `fin` the server sees its sockets
    /// close and ends its sessions at once; without (the host vanished), they stay until the
    /// server's `idle_session_timeout` ends them. Its statements still on the wire may arrive
    /// where the mode lets stragglers in.
    pub(super) fn crash(&mut self, r: usize, fin: bool) {
        let index = u8::try_from(r).unwrap_or(u8::MAX);
        let run = self.s.replicas[r].run;
        let own = |sess: &Sess| sess.replica == index && sess.run == run;
        if self.model.mode.stragglers() {
            self.s
                .flights
                .retain(|f| !(own(&f.owner) && matches!(f.stage, Stage::Replied(_))));
            for flight in self.s.flights.iter_mut().filter(|f| own(&f.owner)) {
                flight.abandoned = true;
            }
        } else {
            self.s.flights.retain(|f| !own(&f.owner));
        }
        if fin {
            let sessions: Vec<Sess> = self
                .s
                .server
                .sessions
                .iter()
                .map(|s| s.owner)
                .filter(own)
                .collect();
            for sess in sessions {
                self.end_session(sess, false);
            }
        }
        let replica = &mut self.s.replicas[r];
        replica.machine = self.model.mode.restarted(&replica.machine);
        replica.run += 1;
        replica.paused = false;
        replica.lock_conn = None;
        replica.terms = M::Terms::default();
        M::crashed(self.s, index);
        self.feed(r, Input::Start);
    }

    /// `pg_terminate_backend` of replica `r`'s lock session (or the mode's choice).
    pub(super) fn terminate(&mut self, r: usize) {
        if let Some(sess) = M::terminable(self.s, r) {
            self.end_session(sess, true);
        }
    }

    /// The server restarts (`fin`: its clients see their connections reset) or fails over to a
    /// new primary (no client hears anything; the old primary's sessions are gone). Both end
    /// every session; the lock table loses what it does not keep.
    pub(super) fn restart(&mut self, fin: bool) {
        let sessions: Vec<Sess> = self.s.server.sessions.iter().map(|s| s.owner).collect();
        for sess in sessions {
            self.end_session(sess, fin);
        }
        self.s.server.locks.restart();
    }

    /// Replica `r` resumes: its driver fires what fell due while it was paused before anything
    /// else.
    pub(super) fn resume(&mut self, r: usize) {
        self.s.replicas[r].paused = false;
        self.feed(r, Input::Timeout);
    }
}
